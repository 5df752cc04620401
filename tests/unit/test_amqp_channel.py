"""An AMQP channel's bookkeeping (broker.amqp.channel) and the session's batching of publishes
(broker.amqp.publishing.batches): confirms go out in order whatever order the publishes are stored
in, each publish answered once; a run of publishes becomes one request only where it may."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, strategies as st
from pamqp import commands

from broker.amqp.channel import Channel
from broker.amqp.publishing import MAX_BATCH, batches
from broker.amqp.wire import Beat, Publish


def _answered(ch: Channel, batches_: list[tuple[int, int]], order: list[int], nacked: set[int]) -> dict[int, str]:
    """Settle ``batches_`` in ``order``, as the node stores them; each publish number -> how the
    client learnt its fate ("ack" or "nack"), by the acks and nacks the channel sends."""
    told: dict[int, str] = {}
    for i in order:
        first, last = batches_[i]
        if i in nacked:
            for tag in range(first, last + 1):  # (publishing nacks each at once)
                assert tag not in told
                told[tag] = "nack"
        before = ch.acked
        top = ch.settled(first, last, stored=i not in nacked)
        if top:  # (as publishing.Publishing._confirm acks)
            covered = range(before + 1, top + 1)  # (multiple: every outstanding one up to top)
            for tag in covered:
                if tag not in told:
                    told[tag] = "ack"
    return told


@given(st.lists(st.integers(1, 5), min_size=1, max_size=12), st.randoms(), st.data())
def test_every_publish_is_answered_once_and_rightly_in_any_order(sizes: list[int], rnd: random.Random,
                                                                   data: st.DataObject) -> None:
    ch = Channel(1, confirming=True)
    spans, n = [], 0
    for size in sizes:
        spans.append((n + 1, n + size))
        n += size
    ch.published = n
    order = list(range(len(spans)))
    rnd.shuffle(order)
    nacked = data.draw(st.sets(st.sampled_from(order)))
    told = _answered(ch, spans, order, nacked)
    assert sorted(told) == list(range(1, n + 1))  # (each publish answered)
    for i, (first, last) in enumerate(spans):
        want = "nack" if i in nacked else "ack"
        assert all(told[t] == want for t in range(first, last + 1))
    assert ch.acked == n


def test_a_later_batch_stored_first_waits_for_the_earlier_one() -> None:
    ch = Channel(1, confirming=True, published=4)
    assert ch.settled(3, 4, stored=True) == 0  # (1-2 not stored yet: nothing acked)
    assert ch.settled(1, 2, stored=True) == 4  # (then both, with multiple)


def _publish(channel: int, key: str, mandatory: bool = False) -> Publish:
    return Publish(channel, commands.Basic.Publish(exchange="", routing_key=key, mandatory=mandatory),
                   commands.Basic.Properties(), b"x")


def test_a_run_of_publishes_to_one_place_is_one_batch_and_the_rest_breaks_it() -> None:
    a, b = _publish(1, "a"), _publish(1, "a")
    other_key, other_channel, mandatory = _publish(1, "b"), _publish(2, "a"), _publish(1, "a", True)
    beat = Beat()
    out = batches([a, b, other_key, other_channel, mandatory, _publish(1, "a"), beat, _publish(1, "a")])
    assert [len(x) if isinstance(x, list) else x for x in out] == [2, 1, 1, 1, 1, beat, 1]
    assert out[0] == [a, b]


@pytest.mark.parametrize("n", [MAX_BATCH, MAX_BATCH + 1])
def test_a_batch_holds_at_most_max_batch(n: int) -> None:
    out = batches([_publish(1, "q") for _ in range(n)])
    assert [len(x) for x in out] == ([MAX_BATCH] if n == MAX_BATCH else [MAX_BATCH, 1])
