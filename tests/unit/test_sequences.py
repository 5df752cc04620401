"""Idempotent producers' sequences (broker.messaging.sequences, broker.messaging.window): a
batch that reaches a partition after a later one of its producer is stored, a resend is not,
and the window that tells them apart travels with the log."""

from __future__ import annotations

import pytest

from broker.messaging import sequences
from broker.messaging.message import Partition
from broker.messaging.queues import Queue
from broker.messaging.window import WINDOW, Window, learn
from client.errors import UnavailableError
from client.protocol.frames import PublishMessage
from storage.base import DropProducers, PartitionState, PutProducer, QueueMeta


def one_partition() -> Queue:
    return Queue(QueueMeta(id=1, name="q", partitions=1, mapper="jump_hash", ring_size=1024, max_deliveries=0,
                           dead_letter_queue=None, max_length=0))


def taken(part: Partition, pid: str, seqs: list[int], *, commit: bool = True) -> None:
    for s in seqs:
        sequences.take(part, pid, s)
    if commit:
        sequences.committed(part, pid, seqs)


def test_a_window_tracks_the_seqs_above_its_floor() -> None:
    w = Window(9)
    assert w.has(0) and w.has(9) and not w.has(10)
    w.update([12, 15, 11])
    assert [s for s in range(8, 18) if w.has(s)] == [8, 9, 11, 12, 15]
    w.discard(12)
    w.discard(3)  # (below the floor: stays taken)
    assert not w.has(12) and w.has(3)


def test_a_window_slides_past_its_size_and_counts_what_it_dropped_as_taken() -> None:
    w = Window(-1)
    w.update(range(0, 100, 3))
    w.add(WINDOW + 50)
    assert w.floor >= 50 and w.has(1)  # (dropped: taken)
    assert not w.has(WINDOW + 49) and w.has(WINDOW + 50)
    w.add(10 * WINDOW)  # a jump: everything below half a window under it is taken
    assert w.has(10 * WINDOW - WINDOW) and not w.has(10 * WINDOW - 1)
    assert len(w.bits) <= WINDOW // 8


def test_a_window_learned_from_the_log_counts_half_a_window_below_its_first_seqs_as_not_taken() -> None:
    w = Window.learned([9, 10])
    assert not any(w.has(s) for s in range(9)) and w.has(9) and w.has(10)
    assert w.has(9 - WINDOW)
    big = Window.learned([1_700_000_000_000_000])
    assert len(big.bits) == 1  # (bits from its first seq on, not from the floor)


def test_learning_from_committed_ops_keeps_a_window_per_producer_and_forgets_a_dropped_one() -> None:
    windows: dict[str, Window] = {}
    learn(windows, [PutProducer(1, 0, "p", 10, (9, 10)), PutProducer(1, 0, "d", 4)])
    learn(windows, [PutProducer(1, 0, "p", 17, (16, 17))])
    assert set(windows) == {"p"}  # (a batch numbered per partition carries no seqs)
    assert [s for s in range(0, 18) if windows["p"].has(s)] == [9, 10, 16, 17]
    learn(windows, [DropProducers(1, 0, ["p"])])
    assert windows == {}


def test_a_late_batch_is_stored_and_a_resend_is_not() -> None:
    part = Partition(0)
    taken(part, "p", [10, 11, 12])  # the later batch got here first
    assert not any(sequences.held(part, "p", s) for s in range(10))
    taken(part, "p", [3, 4])  # the earlier one, late
    assert sequences.held(part, "p", 3) and sequences.held(part, "p", 11)
    assert not sequences.held(part, "p", 5)


def test_a_late_batch_on_its_way_to_commit_is_refused_as_a_resend_until_it_commits() -> None:
    q = one_partition()
    part = q.partitions[0]
    taken(part, "p", [10, 11])
    taken(part, "p", [3], commit=False)
    with pytest.raises(UnavailableError, match="still being stored"):
        sequences.check_resends(q, "p", [PublishMessage(None, {}, b"", 3)], [0])
    sequences.committed(part, "p", [3])
    sequences.check_resends(q, "p", [PublishMessage(None, {}, b"", 3)], [0])  # (a duplicate now)


def test_a_late_batch_that_fails_to_commit_may_be_stored_again() -> None:
    q = one_partition()
    part = q.partitions[0]
    taken(part, "p", [10, 11])
    taken(part, "p", [3, 4], commit=False)
    sequences.release(q, {(0, "p"): [3, 4]})
    assert not sequences.held(part, "p", 3) and sequences.held(part, "p", 10)
    assert part.filling == {}


def test_a_new_active_starts_from_the_window_the_log_gave_it() -> None:
    """What it learned as a replica: the old active took 9 and 10, the batch of 0..8 never got
    there; here it is stored.  Without a learned window everything up to the last seq counts."""
    q = one_partition()
    windows: dict[str, Window] = {}
    learn(windows, [PutProducer(1, 0, "p", 10, (9, 10))])
    q.load_partition(0, PartitionState(next_offset=2, producers={"p": 10}), windows=windows)
    part = q.partitions[0]
    assert not sequences.held(part, "p", 4) and sequences.held(part, "p", 10)
    sequences.take(part, "p", 4)
    assert not windows["p"].has(4)  # (the active's copy: the replica's learns at commit)
    q.load_partition(0, PartitionState(next_offset=2, producers={"p": 10}))
    assert sequences.held(q.partitions[0], "p", 4)


def test_a_producer_that_numbers_per_partition_gets_no_window_and_its_resends_stay_duplicates() -> None:
    part = Partition(0)
    for s in range(5):
        sequences.take(part, "d", s, track=False)
    sequences.committed(part, "d", list(range(5)))
    assert part.seen == {} and all(sequences.held(part, "d", s) for s in range(5))
