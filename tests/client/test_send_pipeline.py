"""One partition's send pipeline, driven synchronously (sans-IO): its state table and the
numbering it keeps across failures, probes and buffer writes."""

from __future__ import annotations

import random

import pytest

from client.durable.pipeline import (
    BUSY,
    TRANSITIONS,
    Item,
    PartitionPipeline,
    SendEvent,
    SendState,
    Step,
)
from client.errors import LocalProtocolError
from client.protocol.frames import PublishMessage

WINDOW = 1000
S = SendState


def _item(body: str = "m", *, buf_id: int | None = None, deadline: float = 100.0) -> Item:
    return Item(PublishMessage(None, {}, body.encode(), None), None, deadline, buf_id=buf_id)


def _pipeline(n: int = 0, *, probe_first: bool = False) -> PartitionPipeline:
    p = PartitionPipeline(0, random.Random(1), probe_first=probe_first)
    for i in range(n):
        p.assign(_item(f"m{i}"))
    return p


def _send(p: PartitionPipeline, bid: int, n: int, now: float = 0.0, node: str = "node1") -> list[Item]:
    assert p.next_step(now, WINDOW) is Step.SEND
    items = p.take_batch(n, 1 << 20)
    assert len(items) == n
    p.sent(bid, node, items, now)
    return items


def _seqs(items: object) -> list[int | None]:
    return [it.msg.seq for it in items]  # type: ignore[attr-defined]


# -- the table itself ------------------------------------------------------------------------


def test_every_state_is_reachable_and_every_target_is_a_state() -> None:
    reached = {S.READY, S.PROBE_DUE}  # the two initial states
    frontier = list(reached)
    while frontier:
        state = frontier.pop()
        for (src, _ev), dst in TRANSITIONS.items():
            if src is state and dst not in reached:
                reached.add(dst)
                frontier.append(dst)
    assert reached == set(SendState)


def test_no_busy_state_lets_a_batch_out() -> None:
    for state in BUSY | {S.FAILED, S.PROBE_DUE}:
        assert (state, SendEvent.SEND) not in TRANSITIONS


@pytest.mark.parametrize("state,event", [
    (S.READY, SendEvent.PROBED),
    (S.READY, SendEvent.RECORDED),
    (S.FAILED, SendEvent.RECORD),
    (S.PROBING, SendEvent.CONFIRMED),
    (S.PROBE_DUE, SendEvent.SEND),
    (S.RECORDING, SendEvent.PROBE),
])
def test_an_illegal_transition_raises_a_local_protocol_error(state: SendState, event: SendEvent) -> None:
    p = _pipeline()
    p.state = state
    with pytest.raises(LocalProtocolError, match=event.name):
        p._step(event)
    assert p.state is state


# -- the sequences the producer relies on -----------------------------------------------------


def test_a_new_producer_sends_at_once_numbered_from_zero() -> None:
    p = _pipeline(3)
    assert p.state is S.READY
    assert _seqs(p.unsent) == [0, 1, 2]
    items = _send(p, 1, 3)
    assert p.inflight == 1
    p.confirm(p.reply(1) or [])
    assert p.confirmed == 2 and p.state is S.READY and not p.flying
    assert _seqs(items) == [0, 1, 2]


def test_a_failed_batch_holds_sends_until_all_in_flight_are_back_then_probes() -> None:
    p = _pipeline(6)
    _send(p, 1, 2)
    _send(p, 2, 2)
    _send(p, 3, 2)
    p.confirm(p.reply(1) or [])  # seqs 0, 1 confirmed
    p.fail(0.0, p.reply(2) or [])  # seqs 2, 3 failed: the node refused or lost them
    assert p.state is S.FAILED
    p.assign(_item("late"))  # sent meanwhile: waits too (numbered, renumbered by the probe)
    assert p.next_step(1e9, WINDOW) is Step.WAIT  # batch 3 is still out
    with pytest.raises(LocalProtocolError):
        p.take_batch(10, 1 << 20)
    p.fail(0.0, p.reply(3) or [])  # out of order after 2: refused as well
    assert p.state is S.PROBE_DUE and not p.flying
    assert p.next_step(0.0, WINDOW) is Step.WAIT  # the backoff first
    assert p.next_step(p.retry_at, WINDOW) is Step.PROBE
    p.start_probe()
    assert p.state is S.PROBING and p.next_step(1e9, WINDOW) is Step.WAIT
    assert p.probed(2) == 0  # the partition holds 0, 1: the rest follows on from 2
    assert p.state is S.READY
    assert _seqs(p.unsent) == [2, 3, 4, 5, 6]
    assert [it.msg.body for it in p.unsent] == [b"m2", b"m3", b"m4", b"m5", b"late"]
    assert p.next_seq == 7 and not p.back


def test_a_probe_keeps_the_seqs_the_partition_holds_for_their_duplicates() -> None:
    p = _pipeline(4)
    _send(p, 1, 2)
    _send(p, 2, 2)
    p.fail(0.0, p.reply(1) or [])  # the reply was lost, but the node stored 0, 1
    p.fail(0.0, p.reply(2) or [])
    p.start_probe()
    p.probed(2)
    assert _seqs(p.unsent) == [0, 1, 2, 3]  # 0, 1 go again as they were: confirmed as duplicates


def test_a_probe_reports_confirmed_messages_the_partition_no_longer_holds() -> None:
    p = _pipeline(5)
    _send(p, 1, 3)
    p.confirm(p.reply(1) or [])
    _send(p, 2, 2)
    p.fail(0.0, p.reply(2) or [])
    p.start_probe()
    assert p.probed(1) == 2  # confirmed up to 2, the new active holds only 0
    assert p.confirmed == 0
    assert _seqs(p.unsent) == [1, 2]


def test_a_failed_probe_waits_a_backoff_and_probes_again() -> None:
    p = _pipeline(1, probe_first=True)
    p.start_probe()
    p.probe_failed(10.0)
    assert p.state is S.PROBE_DUE and p.retry_at > 10.0
    assert p.next_step(10.0, WINDOW) is Step.WAIT
    assert p.next_step(p.retry_at, WINDOW) is Step.PROBE


def test_a_producer_that_continues_a_producer_id_probes_first() -> None:
    p = _pipeline(3, probe_first=True)
    assert p.state is S.PROBE_DUE
    assert p.next_step(0.0, WINDOW) is Step.PROBE  # even with messages waiting
    with pytest.raises(LocalProtocolError):
        p.take_batch(10, 1 << 20)
    p.start_probe()
    p.probed(40)  # an earlier process sent 0..39
    assert _seqs(p.unsent) == [40, 41, 42]
    assert p.next_step(0.0, WINDOW) is Step.SEND


def test_a_probe_in_progress_blocks_sends() -> None:
    p = _pipeline(2, probe_first=True)
    p.start_probe()
    assert p.busy
    assert p.next_step(1e9, WINDOW) is Step.WAIT
    with pytest.raises(LocalProtocolError):
        p.sent(1, "node1", [], 0.0)


def test_a_buffer_write_in_progress_blocks_sends_and_a_failure_meanwhile_settles_after_it() -> None:
    p = _pipeline(2)
    in_flight = _send(p, 1, 2)
    p.assign(_item("buffered", buf_id=7))
    assert p.next_step(0.0, WINDOW) is Step.RECORD
    items = p.start_record(WINDOW)
    assert [it.buf_id for it in items] == [7] and p.state is S.RECORDING
    assert p.next_step(1e9, WINDOW) is Step.WAIT
    p.fail(0.0, p.reply(1) or [])  # the batch in flight fails while the row is written
    assert p.state is S.RECORDING_FAILED
    p.recorded(items)
    assert items[0].buf_at == (0, 2)
    assert p.state is S.PROBE_DUE  # nothing in flight: straight to the probe
    p.start_probe()
    p.probed(0)
    assert _seqs(p.unsent) == [0, 1, 2] and p.unsent[0] is in_flight[0]


def test_a_failed_buffer_write_is_tried_again() -> None:
    p = _pipeline()
    p.assign(_item("buffered", buf_id=3))
    p.start_record(WINDOW)
    p.recorded(None)
    assert p.state is S.READY
    assert p.next_step(0.0, WINDOW) is Step.RECORD


def test_an_unrecorded_buffered_message_ends_a_batch() -> None:
    p = _pipeline(2)
    p.assign(_item("buffered", buf_id=1))
    p.unsent[2].buf_at = (0, 2)  # written
    p.assign(_item("buffered-too", buf_id=2))  # not yet
    assert p.take_batch(10, 1 << 20) and _seqs(p.unsent) == [3]


def test_buffered_messages_an_earlier_run_numbered_are_settled_by_a_probe() -> None:
    p = _pipeline()
    old = _item("old", buf_id=1)
    old.msg.seq = 5
    old.buf_at = (0, 5)
    p.resume(old)
    assert p.state is S.PROBE_DUE and old.sent
    fresh = _item("fresh", buf_id=2)
    p.assign_buffered(fresh)
    assert fresh.msg.seq is None  # the probe numbers it, after the earlier ones
    p.start_probe()
    p.probed(6)  # 5 is held
    assert _seqs(p.unsent) == [5, 6]


def test_a_map_naming_a_new_active_abandons_batches_in_flight_elsewhere() -> None:
    p = _pipeline(4)
    p.map_loaded("node1")
    _send(p, 1, 2, node="node1")
    _send(p, 2, 2, node="node1")
    assert p.map_loaded("node1") == 0
    assert p.map_loaded("node2") == 2
    assert p.state is S.PROBE_DUE and p.retry_at == 0.0 and len(p.back) == 4
    assert p.reply(1) is None  # a late answer to an abandoned batch is ignored


def test_a_new_active_ends_the_backoff_of_an_unsettled_partition() -> None:
    p = _pipeline(2)
    p.map_loaded("node1")
    _send(p, 1, 2)
    p.fail(5.0, p.reply(1) or [])
    assert p.retry_at > 5.0
    p.map_loaded("node1")
    assert p.retry_at > 5.0  # the same active: the backoff stands
    p.map_loaded("node2")
    assert p.retry_at == 0.0


def test_dropping_unsent_messages_nobody_waits_for_closes_the_gap() -> None:
    p = PartitionPipeline(0, random.Random(1))
    waiting = _item("a")
    waiting.fut = object()  # type: ignore[assignment]
    gone = _item("b")  # its sender timed out
    after = _item("c")
    after.fut = object()  # type: ignore[assignment]
    for it in (waiting, gone, after):
        p.assign(it)
    p.drop_unsent()
    assert [it.msg.body for it in p.unsent] == [b"a", b"c"] and _seqs(p.unsent) == [0, 1]
    assert p.next_seq == 2


def test_overdue_lists_waiting_messages_past_their_deadline() -> None:
    p = _pipeline()
    early, late = _item("e", deadline=1.0), _item("l", deadline=9.0)
    early.fut = late.fut = object()  # type: ignore[assignment]
    p.assign(early)
    p.assign(late)
    assert p.overdue(5.0) == [early]
