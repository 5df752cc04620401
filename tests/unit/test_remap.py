"""broker.partitions.remap's state: an update's pending partitions as every member applies them, what
pauses the queue's partitions, and how a partition's messages split between staying and
going, and a sweep's pass when the partition stops being served under it (the sweep end to
end runs in tests/integration/test_repartition.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from broker.messaging.publish import PublishResult
from broker.messaging.message import EMPTY_HEADERS, Msg
from broker.messaging.queues import Queue
from broker.partitions.remap import Remaps
from client.errors import NotActiveError
from client.mapper import JumpHashMapper
from storage.base import PartitionState, PutMeta, QueueMeta, SetUpdating, StoredMessage


class _Host:
    def __init__(self) -> None:
        self.changed: list[int] = []
        self.spawned: list[Any] = []

    def updating_changed(self, queue_id: int) -> None:
        self.changed.append(queue_id)

    def queue_by_id(self, queue_id: int) -> None:
        return None  # (no sweep here: served() needs the queue)


def test_an_update_starts_with_every_partition_and_ends_when_each_is_done() -> None:
    host = _Host()
    r = Remaps(None, host, None, None)  # type: ignore[arg-type]  # (no proposal, no sweep, no publish)
    assert r.apply(SetUpdating(4, (0, 1, 2))) == [PutMeta("updating.4", "0,1,2")]
    assert r.paused(4) == {0, 1, 2} and host.changed == [4]
    # two partitions done in either order: each entry takes its own out, none comes back
    assert r.apply(SetUpdating(4, (), (2,))) == [PutMeta("updating.4", "0,1")]
    assert r.apply(SetUpdating(4, (), (0,))) == [PutMeta("updating.4", "1")]
    assert r.apply(SetUpdating(4, (), (0,))) == [PutMeta("updating.4", "1")]  # (again: no change)
    assert r.under_way({4: "orders"}) == ["orders 1"]
    assert r.apply(SetUpdating(4, (), (1,))) == [PutMeta("updating.4", "")]
    assert r.pending == {} and r.paused(4) == frozenset() and host.changed == [4, 4, 4, 4]


def test_the_state_is_stored_and_read_back_and_a_snapshot_replaces_it() -> None:
    host = _Host()
    r = Remaps(None, host, None, None)  # type: ignore[arg-type]  # (no proposal, no sweep, no publish)
    r.load({"updating.4": "0,3", "updating.5": "", "updating.6": "1", "updating.x": "1", "updating.7": "a"}, {4, 5})
    assert r.pending == {4: {0, 3}}
    assert r.snapshot() == [SetUpdating(4, (0, 3))]
    out = r.install([SetUpdating(9, (1,))])
    assert r.pending == {9: {1}} and PutMeta("updating.4", "") in out and PutMeta("updating.9", "1") in out


@pytest.mark.asyncio
async def test_a_partition_keeps_its_keyless_messages_and_those_that_map_to_it() -> None:
    q = Queue(QueueMeta(id=1, name="q", partitions=4, mapper="jump_hash", ring_size=1024, max_deliveries=0,
                        dead_letter_queue=None, max_length=0))
    mapper = JumpHashMapper(4)
    msgs = [Msg(0, i, f"k{i}" if i % 5 else None, {}, b"", b"x", None, None, 0.0) for i in range(40)]
    by_target = await Remaps(None, None, None, None)._targets(q, 0, 0, msgs)  # type: ignore[arg-type]
    assert all(m.key is None or mapper.partition(m.key) == 0 for m in by_target[0])
    assert all(m.key is not None and mapper.partition(m.key) == p for p, lst in by_target.items() if p for m in lst)
    assert sorted(m.offset for lst in by_target.values() for m in lst) == list(range(40)) and len(by_target) > 1


def test_a_remapped_message_keeps_its_id() -> None:
    m = Msg(2, 7, "k", {"x-tandem-id": "0-123"}, b"", b"x", "remap.1.0", 123, 0.0)
    assert m.id == "0-123"
    assert Msg(2, 7, "k", {}, b"", b"x", None, None, 0.0).id == "2-7"


def test_republished_batches_hold_500_messages_or_4_mib_at_most() -> None:
    from broker.partitions.remap import _batches

    small = [Msg(0, i, "k", {}, b"", b"x", None, None, 0.0) for i in range(1201)]
    assert [len(b) for b in _batches(small)] == [500, 500, 201]
    big = [Msg(0, i, "k", {}, b"", b"x" * (1 << 20), None, None, 0.0) for i in range(9)]
    assert [len(b) for b in _batches(big)] == [4, 4, 1]
    huge = [Msg(0, 0, "k", {}, b"", b"x" * (5 << 20), None, None, 0.0)]
    assert [len(b) for b in _batches(huge)] == [1]
    assert [m.offset for b in _batches(small) for m in b] == list(range(1201))


class _SweepHost:
    """A partition's active as the sweep sees it: publishes wait until the test answers them."""

    def __init__(self, q: Queue) -> None:
        self.q = q
        self.serving = True
        self.published: list[list[int]] = []
        self.settled: list[list[int]] = []
        self.answer: asyncio.Future[Any] | None = None
        self.out = asyncio.Event()  # a batch is out, waiting for its answer

    def serves(self, q: Queue, pidx: int) -> bool:
        return self.serving

    def publish(self, req: Any) -> asyncio.Future[Any]:
        self.published.append([m.seq for m in req.messages])
        self.answer = asyncio.get_running_loop().create_future()
        self.out.set()
        return self.answer

    async def commit_ops(self, key: Any, ops: list[Any]) -> None:
        self.settled.append(list(ops[0].offsets))


def _queue_with(n: int) -> tuple[Queue, list[Msg]]:
    q = Queue(QueueMeta(id=1, name="q", partitions=4, mapper="jump_hash", ring_size=1024, max_deliveries=0,
                        dead_letter_queue=None, max_length=0))
    msgs = [Msg(0, i, f"k{i}", {}, EMPTY_HEADERS, b"x", None, None, 0.0) for i in range(n)]
    q.add_ready(q.partitions[0], list(msgs))  # (the head holds them all: no memory budget)
    return q, msgs


async def _batch_out() -> tuple[Queue, list[Msg], _SweepHost, asyncio.Future[int]]:
    """A pass over a partition of 40 messages, its first batch out and not yet answered."""
    q, msgs = _queue_with(40)
    host = _SweepHost(q)
    sweep = asyncio.ensure_future(Remaps(None, None, host, host)._pass(q, 0))  # type: ignore[arg-type]
    await host.out.wait()
    assert host.answer is not None
    return q, msgs, host, sweep


def _loaded(msgs: list[Msg]) -> PartitionState:
    return PartitionState(next_offset=len(msgs), messages=[
        StoredMessage(m.offset, m.key, m.headers_blob, m.body, None, None, 0.0) for m in msgs])


@pytest.mark.asyncio
@pytest.mark.parametrize("outcome", ["stored", "failed"])
async def test_a_sweep_whose_partition_was_loaded_anew_meanwhile_leaves_its_messages_alone(outcome: str) -> None:
    """The active's sweep is publishing a batch when the partition moves away and back (this
    node elected again: its messages loaded anew from the store).  Whatever the publish's
    outcome, the old pass puts nothing back and counts nothing off: the partition holds what
    was loaded, each message once; and it sends nothing more."""
    q, msgs, host, sweep = await _batch_out()
    q.clear_partition(0)  # another node serves it ...
    q.load_partition(0, _loaded(msgs))  # ... and this one again
    assert host.answer is not None
    if outcome == "stored":
        host.answer.set_result(PublishResult(stored=len(host.published[0]), duplicates=0))
    else:
        host.answer.set_exception(NotActiveError("partition 1/2 is not active here", active_hint=None))
    with pytest.raises(NotActiveError):
        await sweep
    assert [m.offset for m in q.partitions[0].ready] == list(range(40))
    assert q.ready_count == 40
    assert len(host.published) == 1 and host.settled == ([[*host.published[0]]] if outcome == "stored" else [])


@pytest.mark.asyncio
async def test_a_sweep_of_a_partition_no_longer_served_here_puts_nothing_back() -> None:
    """The partition moved away while a batch was out: its memory here stays empty (a node
    that does not serve a partition must never deliver from it)."""
    q, _msgs, host, sweep = await _batch_out()
    q.clear_partition(0)
    host.serving = False
    host.answer.set_exception(NotActiveError("partition 1/0 is not active here", active_hint=None))
    with pytest.raises(NotActiveError):
        await sweep
    assert not q.partitions[0].ready and q.ready_count == 0


@pytest.mark.asyncio
async def test_a_sweep_whose_target_refused_puts_the_batch_back_in_offset_order() -> None:
    """Still served as it was: a batch the target refused is ready here again, in place."""
    q, _msgs, host, sweep = await _batch_out()
    host.answer.set_exception(NotActiveError("partition 1/2 has no active", active_hint=None))
    with pytest.raises(NotActiveError):
        await sweep
    assert [m.offset for m in q.partitions[0].ready] == list(range(40)) and q.ready_count == 40
