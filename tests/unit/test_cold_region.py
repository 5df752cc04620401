"""The memory budget and a partition's cold region (broker.messaging.queues), and loading a store
with a budget (storage.sqlite): counters exact, offset order kept, nothing read twice."""

from __future__ import annotations

from pathlib import Path

import msgpack

from broker.messaging.message import MemoryBudget, Msg
from broker.messaging.queues import Queue
from storage.base import Append, MarkDelivered, PutQueue, QueueMeta, SetDeliveryCount, Settle, StoredMessage
from storage.budget import MIN_SHARE, MSG_MEMORY
from storage.sqlite import SqliteEngine

BODY = 1000
COST = BODY + 1 + MSG_MEMORY  # body, headers blob (b"\x80"), object


def meta(partitions: int = 1) -> QueueMeta:
    return QueueMeta(id=1, name="q", partitions=partitions, mapper="round_robin", ring_size=partitions,
                     max_deliveries=0, dead_letter_queue=None, max_length=0)


def msg(o: int, pidx: int = 0) -> Msg:
    return Msg(pidx, o, None, {}, b"\x80", bytes([o % 256]) * BODY, None, None, 0.0)


def stored(o: int, dc: int = 0) -> StoredMessage:
    return StoredMessage(o, None, b"\x80", bytes([o % 256]) * BODY, None, None, 0.0, dc)


def queue(limit: int = MIN_SHARE) -> Queue:
    return Queue(meta(), MemoryBudget(limit))


def test_past_the_share_messages_go_cold_and_counters_stay_exact() -> None:
    q = queue()
    part = q.partitions[0]
    fits = MIN_SHARE // COST
    q.add_ready(part, [msg(o) for o in range(1000)])
    assert len(part.ready) == fits
    assert (part.cold_start, part.cold_end, part.cold_count) == (fits, 1000, 1000 - fits)
    assert q.ready_count == 1000 and q.depth == 1000
    assert q.budget.held == part.held == fits * COST <= MIN_SHARE
    assert q.budget.cold == 1000 - fits
    # while the region exists, what comes next extends it, even once memory is free
    taken = q.take(100, 1 << 30)
    assert [m.offset for m in taken] == list(range(100))
    q.add_ready(part, [msg(1000)])
    assert part.cold_end == 1001 and part.cold_count == 1001 - fits
    assert q.ready_count == 901
    assert q.budget.held == (fits - 100) * COST


def test_refill_reads_the_region_in_order_and_ends_it() -> None:
    q = queue()
    part = q.partitions[0]
    q.add_ready(part, [msg(o) for o in range(1000)])
    seen: list[int] = [m.offset for m in q.take(10_000, 1 << 40)]
    while part.cold_count:
        assert q.wants_refill(part)
        epoch, offset, limit = q.begin_refill(part)
        assert offset == part.cold_start and not q.wants_refill(part)  # one read at a time
        batch = [stored(o) for o in range(offset, min(offset + limit, 1000))]
        assert q.end_refill(part, epoch, batch, limit, stored_end=1000)
        seen += [m.offset for m in q.take(10_000, 1 << 40)]
    assert seen == list(range(1000))
    assert q.ready_count == 0 and q.budget.cold == 0 and q.budget.held == 0
    assert (part.cold_start, part.cold_end) == (0, 0)
    q.add_ready(part, [msg(1000)])  # no region: hot again
    assert len(part.ready) == 1 and not part.cold_count


def test_refill_never_reads_past_what_the_store_has() -> None:
    q = queue()
    part = q.partitions[0]
    q.add_ready(part, [msg(o) for o in range(1000)])
    q.take(10_000, 1 << 40)
    start = part.cold_start
    epoch, offset, limit = q.begin_refill(part)
    # the store has not written the region yet: nothing moves, the read is tried again
    assert not q.end_refill(part, epoch, [], limit, stored_end=start)
    assert part.cold_start == start and part.cold_count == 1000 - start
    epoch, offset, limit = q.begin_refill(part)
    got = [stored(o) for o in range(offset, offset + 5)]  # (a racing writer: past stored_end)
    assert q.end_refill(part, epoch, got, limit, stored_end=offset + 3)
    assert [m.offset for m in part.ready] == [offset, offset + 1, offset + 2]
    assert part.cold_start == offset + 3


def test_a_stale_read_is_dropped_after_purge_or_clear() -> None:
    q = queue()
    part = q.partitions[0]
    q.add_ready(part, [msg(o) for o in range(1000)])
    epoch, offset, limit = q.begin_refill(part)
    removed = q.purge_ready()
    assert sum(len(v) for v in removed.values()) + 0 == MIN_SHARE // COST
    assert q.ready_count == 0 and q.budget.cold == 0 and q.budget.held == 0 and q.cold_count == 0
    assert not q.end_refill(part, epoch, [stored(o) for o in range(offset, offset + 10)], limit, 1000)
    assert not part.ready


def test_delivery_counts_of_loaded_cold_messages() -> None:
    q = queue()
    part = q.partitions[0]
    part.cold_mark = 500  # the delivered mark when it was loaded
    q.add_ready(part, [msg(o) for o in range(1000)])
    q.take(10_000, 1 << 40)
    epoch, offset, limit = q.begin_refill(part)
    q.end_refill(part, epoch, [stored(offset, dc=2), stored(600, dc=1)], 2, 1000)
    got = {m.offset: m.dc for m in part.ready}
    assert got == {offset: 3 if offset < 500 else 2, 600: 1}


def test_requeue_lands_below_the_region_and_purge_restores_on_failure() -> None:
    q = queue()
    part = q.partitions[0]
    q.add_ready(part, [msg(o) for o in range(1000)])
    out = q.take(5, 1 << 40)
    q.requeue(out)
    assert [m.offset for m in list(part.ready)[:5]] == list(range(5))
    assert part.ready[-1].offset < part.cold_start
    held, cold = q.budget.held, q.budget.cold
    hot = q.take_hot(part)
    was = q.take_cold(part)
    assert q.ready_count == 0
    q.add_ready(part, [msg(1000), msg(1001)])  # arrived during the purge
    q.requeue(hot)
    q.restore_cold(part, was)
    assert q.ready_count == 1002
    assert part.cold_count == was[2] + 2 and part.cold_end == 1002
    assert q.budget.held == held and q.budget.cold == cold + 2


def test_share_is_split_over_partitions_and_released_with_the_queue() -> None:
    budget = MemoryBudget(8 * MIN_SHARE)
    q = Queue(meta(4), budget)
    assert budget.share() == 2 * MIN_SHARE
    q2 = Queue(QueueMeta(id=2, name="r", partitions=4, mapper="round_robin", ring_size=4, max_deliveries=0,
                         dead_letter_queue=None, max_length=0), budget)
    assert budget.share() == MIN_SHARE
    for p in q.partitions:
        q.add_ready(p, [msg(o, p.index) for o in range(1000)])
    assert budget.held <= 4 * MIN_SHARE
    q.release()
    assert budget.held == 0 and budget.cold == 0 and budget.partitions == 4
    assert q2.ready_count == 0


def test_no_budget_keeps_everything_in_memory() -> None:
    q = queue(0)
    part = q.partitions[0]
    q.add_ready(part, [msg(o) for o in range(3000)])
    assert len(part.ready) == 3000 and not part.cold_count


def test_sqlite_load_with_a_budget_counts_the_rest(tmp_path: Path) -> None:
    eng = SqliteEngine(tmp_path / "store.db")
    eng.open()
    eng.apply([PutQueue(meta())], sync=True)
    for start in range(0, 3000, 100):
        eng.apply([Append(1, 0, [msg(o) for o in range(start, start + 100)], start + 100)], sync=True)
    eng.apply([Settle(1, 0, list(range(0, 50)) + list(range(2000, 2100))),
               SetDeliveryCount(1, 0, [(2500, 4)]), MarkDelivered(1, 0, 2600)], sync=True)
    eng.close()

    eng = SqliteEngine(tmp_path / "store.db")
    eng.load_budget = MIN_SHARE
    rec = eng.open()
    st = rec.partitions[(1, 0)]
    fits = MIN_SHARE // (BODY + 1 + MSG_MEMORY)
    assert [m.offset for m in st.messages] == list(range(50, 50 + fits))
    assert st.cold_start == 50 + fits and st.cold_end == st.next_offset == 3000
    assert st.cold_count == 3000 - 50 - fits - 100
    assert 0.9 < st.cold_bytes / (st.cold_count * (BODY + 1)) < 1.1
    # the broker reads the region back: counts from the store, the mark's one added
    q = queue()
    q.load_partition(0, st)
    part = q.partitions[0]
    assert q.ready_count == 3000 - 150
    got: list[Msg] = q.take(100_000, 1 << 40)
    while part.cold_count:
        epoch, offset, limit = q.begin_refill(part)
        end = eng.stored_end(1, 0)
        assert q.end_refill(part, epoch, eng.read(1, 0, offset, limit), limit, end)
        got += q.take(100_000, 1 << 40)
    assert [m.offset for m in got] == [o for o in range(50, 3000) if not 2000 <= o < 2100]
    dcs = {m.offset: m.dc for m in got}
    assert dcs[2500] == 5 and dcs[2599] == 1 and dcs[2600] == 0
    assert q.ready_count == 0
    # and the same through load_partition (a node becoming a partition's active)
    st2 = eng.load_partition(1, 0, MIN_SHARE)
    assert (st2.cold_start, st2.cold_end, st2.cold_count) == (st.cold_start, st.cold_end, st.cold_count)
    eng.close()


def test_a_delayed_message_that_goes_cold_is_held_aside_once_when_read_back() -> None:
    """Published while the partition has a cold region, a delayed message is counted cold like the
    others and held aside (once) when the refill reads it back; due later, it is ready once."""
    q = queue()
    q.now = lambda: 100.0
    part = q.partitions[0]
    q.add_ready(part, [msg(o) for o in range(1000)])  # a cold region from `fits` on
    late = Msg(0, 1000, None, {"x-delay": "5000"}, b"\x80", b"d" * BODY, None, None, 100.0)
    q.add_ready(part, [late, msg(1001)])
    assert not part.delayed and q.delayed_count == 0 and q.ready_count == 1002  # (cold: not read yet)
    seen = [m.offset for m in q.take(10_000, 1 << 40)]
    while part.cold_count:
        epoch, offset, limit = q.begin_refill(part)
        batch = [StoredMessage(o, None, stored_headers(o), bytes([o % 256]) * BODY, None, None, 100.0, 0)
                 for o in range(offset, min(offset + limit, 1002))]
        assert q.end_refill(part, epoch, batch, limit, stored_end=1002)
        seen += [m.offset for m in q.take(10_000, 1 << 40)]
    assert 1000 not in seen and seen == [o for o in range(1002) if o != 1000]
    assert [o for _due, o, _m in part.delayed] == [1000] and q.delayed_count == 1
    assert q.ready_count == 0 and q.depth == 1
    q.now = lambda: 106.0
    assert q.promote(106.0) and [m.offset for m in q.take(10, 1 << 40)] == [1000]
    assert q.delayed_count == 0 and q.ready_count == 0 and not part.delayed


def stored_headers(offset: int) -> bytes:
    """The stored headers of the test's messages: offset 1000 is the delayed one."""
    return msgpack.packb({"x-delay": "5000"}) if offset == 1000 else b"\x80"


def test_delayed_messages_taken_with_the_hot_head_go_back_aside() -> None:
    """A re-partitioning takes a partition's messages in memory, delayed ones too, and puts those
    that stay back: a delayed one waits aside again, not ready early."""
    q = queue()
    q.now = lambda: 100.0
    part = q.partitions[0]
    late = Msg(0, 1, None, {"x-delay": "5000"}, b"\x80", b"d", None, None, 100.0)
    q.add_ready(part, [msg(0), late, msg(2)])
    assert q.delayed_count == 1 and q.ready_count == 2
    taken = q.take_hot(part)
    assert sorted(m.offset for m in taken) == [0, 1, 2] and q.depth == 0
    q.requeue(taken)
    assert [m.offset for m in part.ready] == [0, 2] and q.delayed_count == 1 and q.ready_count == 2
