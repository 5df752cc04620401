"""The pieces of a restore that are plain data (broker.partitions.restore): which quarantined messages a
filter takes, the message that puts one back, and the report summed over members, checked
when it comes from another member."""

from __future__ import annotations

import pytest

from broker.messaging.forward import RestoreFwd, pack_reply
from broker.partitions.restore import RESTORED_ID, Filter, Report, Seen, republished, resent
from broker.messaging.streams import Produced
from client.errors import InvalidArgumentError, UnknownOpError

H = {"x-quarantine-queue": "orders", "x-quarantine-partition": "2", "x-quarantine-offset": "17",
     "x-quarantine-id": "2-17", "x-quarantine-producer": "p1", "x-quarantine-seq": "4",
     "x-quarantine-node": "node3", "x-quarantine-term": "5", "x-quarantine-confirmed": "true",
     "x-quarantine-reason": "HA-1014", "x-tandem-id": "2-17", "app": "kept"}


def test_a_filter_takes_what_every_given_field_names() -> None:
    assert Filter().wants(H) and not Filter().narrowed
    assert Filter("node3", "orders", 2).wants(H) and Filter("node3", "orders", 2).narrowed
    assert not Filter(origin="node1").wants(H)
    assert not Filter(queue="other").wants(H)
    assert not Filter(partition=0).wants(H)
    with pytest.raises(InvalidArgumentError, match="partition -1"):
        Filter(partition=-1)


def test_a_filter_crosses_to_another_member_and_back() -> None:
    for f in (Filter(), Filter("node3", None, 0), Filter(None, "orders", 12)):
        assert Filter.of(f.forward(1)) == f
    with pytest.raises(InvalidArgumentError, match="not a number"):
        Filter.of(RestoreFwd(1, "", "", "-3"))


def test_the_message_put_back_has_its_own_headers_and_its_old_id_apart() -> None:
    queue, pid, msg = republished(H, "k", b"body")
    assert (queue, pid) == ("orders", "restore.node3.5.orders.2")
    assert (msg.key, msg.body, msg.seq) == ("k", b"body", 17)  # (a restore run again stores it once)
    assert msg.headers == {"app": "kept", RESTORED_ID: "2-17"}
    # the copies that two nodes of the losing side kept of one write go back as one
    mine = {**H, "x-quarantine-written": "node4.3"}
    theirs = {**mine, "x-quarantine-node": "node5", "x-quarantine-term": "9"}
    assert republished(mine, "k", b"body")[:2] == republished(theirs, "k", b"body")[:2] == (
        "orders", "restore.node4.3.orders.2")
    assert "x-quarantine-written" not in republished(mine, "k", b"body")[2].headers


def test_reports_sum_and_print_one_line_per_queue() -> None:
    a, b = Report(), Report()
    a.restored["q"] += 3
    a.conflicts["q"] += 1
    b.restored["q"] += 2
    b.already["q"] += 1
    b.left["gone"] += 4
    a.add(b)
    assert a.json() == {"restored": {"q": 5}, "already": {"q": 1}, "conflicts": {"q": 1}, "left": {"gone": 4},
                        "dropped": {}, "merged": {}, "failed": {}, "held": {}, "resent": {}, "unsure": {}}
    assert Report.from_json(a.json()) == a
    lines = a.lines(narrowed=False)
    assert lines[0].startswith("5 message(s) restored to q (1 were there already); 1 of their ids name")
    assert lines[1] == "4 message(s) of gone left in tandem.quarantine (their queue is gone)"
    assert Report().lines(narrowed=True) == ["nothing to restore: tandem.quarantine holds no message that matches"]
    assert "more" not in a.json()
    cut = Report(more=True)
    a.add(cut)
    assert a.json()["more"] is True and Report.from_json(a.json()).more
    assert a.lines(narrowed=False)[-1] == "stopped after 20 s: tandem.quarantine may hold more; run it again"


@pytest.mark.parametrize("value", [[], {"restored": []}, {"left": {"q": -1}}, {"already": {"q": "3"}},
                                   {"conflicts": {1: 2}}, {"more": "yes"}, {"moved": 1}, {"dropped": {"q": True}},
                                   {"failed": []}])
def test_a_report_from_another_member_that_does_not_fit_is_refused(value: object) -> None:
    with pytest.raises(InvalidArgumentError):
        Report.from_json(value)


@pytest.mark.asyncio
async def test_a_producers_resend_held_by_the_source_is_found_and_a_doubt_is_told_apart() -> None:
    """``resent``: True where the source stored the same producer id and seq since the logs
    parted; False (unsure) where it may have and no longer stores it; None otherwise.  One
    look per (queue, partition, producer, offset) in a run."""
    asked: list[tuple[str, int, str, int]] = []
    answers = {"p1": Produced(9, True, frozenset({4, 5, 9})), "p2": Produced(9, False, frozenset({8, 9})),
               "p3": Produced(-1, True, frozenset())}

    async def produced(queue: str, partition: int, producer: str, offset: int) -> Produced:
        asked.append((queue, partition, producer, offset))
        return answers[producer]

    seen: Seen = {}

    def h(producer: str, seq: int) -> dict[str, str]:
        return {**H, "x-quarantine-producer": producer, "x-quarantine-seq": str(seq), "x-quarantine-from": "11"}

    assert await resent(h("p1", 4), seen, produced) is True        # the source holds its resend
    assert await resent(h("p1", 3), seen, produced) is None        # all is stored there: it is not
    assert await resent(h("p2", 8), seen, produced) is True
    assert await resent(h("p2", 7), seen, produced) is False       # below the last seq, settled ones gone: unsure
    assert await resent(h("p2", 10), seen, produced) is None       # past the last seq: never there
    assert await resent(h("p3", 1), seen, produced) is None        # a producer the source never saw
    assert await resent({**H, "x-quarantine-producer": ""}, seen, produced) is None  # no producer id: no look
    assert asked == [("orders", 2, "p1", 11), ("orders", 2, "p2", 11), ("orders", 2, "p3", 11)]
    old = {k: v for k, v in h("p1", 4).items() if k != "x-quarantine-from"}  # kept before the header existed
    assert await resent(old, seen, produced) is True and asked[-1] == ("orders", 2, "p1", 0)


@pytest.mark.asyncio
@pytest.mark.parametrize("refusal", [UnknownOpError("unknown op 47"),
                                     InvalidArgumentError("unknown forwarded request kind 23")], ids=["op", "kind"])
async def test_a_source_on_a_build_without_the_look_makes_each_message_unsure(refusal: Exception) -> None:
    """An older build refuses the look (the client op, or the forwarded kind): every message
    of that producer there is restored and counted unsure, asked once; another refusal fails
    the run as before."""
    asked: list[str] = []

    async def produced(queue: str, partition: int, producer: str, offset: int) -> Produced:
        asked.append(producer)
        if producer == "bad":
            raise InvalidArgumentError("queue 'orders' has no partition 2")
        raise refusal

    seen: Seen = {}
    for seq in (3, 4):
        assert await resent({**H, "x-quarantine-producer": "p", "x-quarantine-seq": str(seq)}, seen, produced) \
            is False
    assert asked == ["p"]
    with pytest.raises(InvalidArgumentError, match="no partition"):
        await resent({**H, "x-quarantine-producer": "bad", "x-quarantine-seq": "1"}, seen, produced)


def test_a_members_answer_about_a_producer_crosses_and_a_bad_one_is_refused() -> None:
    got = Produced(7, False, frozenset({1, 7}))
    assert Produced.unpack(got.pack()) == got
    for bad in ([7, "yes", [1]], [7, True], [7, True, ["1"]], {"last": 7}):
        with pytest.raises(InvalidArgumentError, match="PRODUCED"):
            Produced.unpack(pack_reply(bad))
