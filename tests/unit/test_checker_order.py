"""The checker's per-producer order rule and its transactions' atomicity, and the jepsen drill's
schedule."""

from __future__ import annotations

import pytest

from broker.tools.checker import Delivery, atomicity, classify, reordered
from broker.tools.drill.families import families
from broker.tools.drill.jepsen import GAP, HOLD, make_schedule
from client.errors import InvalidArgumentError

# payload -> (producer, place in its send order)
ORIGIN = {f"a{i}".encode(): ("a", i) for i in range(10)} | {f"b{i}".encode(): ("b", i) for i in range(10)}


def d(body: str, consumer: int = 0, partition: int = 0, redelivered: bool = False) -> Delivery:
    return Delivery(body.encode(), consumer, partition, redelivered)


def test_first_deliveries_in_send_order_pass() -> None:
    got = [d("a0"), d("b0"), d("a1"), d("b1"), d("a2")]
    assert reordered(got, ORIGIN) == 0


def test_a_first_delivery_behind_a_later_send_is_one_violation() -> None:
    got = [d("a0"), d("a2"), d("a1"), d("a3")]
    assert reordered(got, ORIGIN) == 1


def test_order_is_per_partition_and_per_consumer() -> None:
    # a1 on another partition, a0 to another consumer: no order between them and a2
    got = [d("a2"), d("a1", partition=1), d("a0", consumer=1)]
    assert reordered(got, ORIGIN) == 0


def test_redeliveries_are_exempt() -> None:
    # a0 delivered to consumer 0, its link failed; after the failover a0 comes again to
    # consumer 1, behind a newer a1: the broker flags it, or the payload was seen before
    flagged = [d("a1", consumer=1), d("a0", consumer=1, redelivered=True), d("a2", consumer=1)]
    assert reordered(flagged, ORIGIN) == 0
    seen_before = [d("a0"), d("a1", consumer=1), d("a0", consumer=1), d("a2", consumer=1)]
    assert reordered(seen_before, ORIGIN) == 0


def test_unsent_payloads_are_left_to_unexpected() -> None:
    assert reordered([d("a3"), d("zz"), d("a4")], ORIGIN) == 0


def test_classify_names_recovered_and_counts_reordered() -> None:
    v = classify([b"a0", b"a1", b"a2"], [b"a0", b"a1"], [(b"a0", "0-1"), (b"a2", "0-2"), (b"a0", "0-1")], 2)
    assert (v.ok, v.lost, v.recovered, v.redelivered, v.reordered) == (1, 1, 1, 1, 2)
    assert v.unconfirmed_delivered == v.recovered
    assert not v.passed
    assert v.as_dict()["recovered"] == 1 and "reordered" in v.as_dict()


def test_the_same_seed_gives_the_same_schedule() -> None:
    fams = ["kill", "pause", "clock"]
    a, b = make_schedule(fams, 7, 300), make_schedule(fams, 7, 300)
    assert a == b and len(a) > 5
    assert make_schedule(fams, 8, 300) != a
    assert make_schedule(fams, 7, 120) == a[:len(make_schedule(fams, 7, 120))]  # longer: same beginning


def test_the_schedule_stays_within_its_ranges_and_time() -> None:
    s = make_schedule(["kill", "pause"], 3, 200)
    assert {f.family for f in s} == {"kill", "pause"}
    assert all(HOLD[0] <= f.hold <= HOLD[1] and GAP[0] <= f.gap <= GAP[1] for f in s)
    assert sum(f.hold + f.gap for f in s) <= 200
    assert [f.index for f in s] == list(range(1, len(s) + 1))


def test_no_family_or_an_unknown_one_is_one_clear_error() -> None:
    with pytest.raises(InvalidArgumentError):
        make_schedule([], 1, 10)
    with pytest.raises(InvalidArgumentError, match=r"unknown fault family 'nosuch' \(known: .*kill"):
        families(["kill", "nosuch"])


TXS = {"t1": (True, frozenset({b"a", b"b"})), "t2": (False, frozenset({b"c"})), "t3": (True, frozenset({b"c"}))}


def test_transactions_all_or_nothing_pass() -> None:
    a = atomicity(TXS, [(b"a", "t1"), (b"b", "t1"), (b"c", "t3")])
    assert (a.transactions, a.committed, a.aborted, a.partial, a.acked_twice) == (3, 2, 1, 0, 0)


def test_a_committed_transaction_missing_an_output_or_an_aborted_one_with_one_is_partial() -> None:
    a = atomicity(TXS, [(b"a", "t1"), (b"c", "t3")])  # t1 lost b
    assert a.partial == 1 and a.examples[0].startswith("t1: committed")
    assert atomicity(TXS, [(b"a", "t1"), (b"b", "t1"), (b"c", "t2"), (b"c", "t3")]).partial == 1  # t2 aborted


def test_an_input_two_committed_transactions_acked_is_counted() -> None:
    txs = {**TXS, "t4": (True, frozenset({b"a"})), "t5": (False, frozenset({b"b"}))}  # (t5 aborted: not counted)
    outputs = [(b"a", "t1"), (b"b", "t1"), (b"c", "t3"), (b"a", "t4")]
    assert atomicity(txs, outputs).acked_twice == 1
