"""Idempotent producers: each partition knows which sequence numbers of each producer it holds.

A producer numbers its messages; a partition stores a ``(producer_id, seq)`` once and
confirms a resend again without storing it.  Per partition (:class:`broker.messaging.message.Partition`):

* ``producers``: the last seq held, committed or on its way to commit (replicated, stored);
* ``committed_producers``: the last seq committed;
* ``seen``: a :class:`~broker.messaging.window.Window` per producer, the seqs it holds, so a
  batch that arrives after a later one of the same producer is told apart from a resend (see
  below);
* ``gaps``: seqs below the last held whose commit failed (a resend stores them again);
* ``filling``: seqs taken at or below the last committed one (a batch that came late) whose
  commit is under way;
* ``producer_used``: when each producer last published here, for expiry.

Batches of one producer can reach a partition out of order: a node resends a batch that failed
on a partition's old active to the new one while a later batch got there first, a link that
broke is replaced while a batch waited to be resent, or the producer publishes through several
members.  A seq at or below the last held is held only if the window has it (or it lies below
the window's floor); the others are stored.  The window is replicated: ``PutProducer`` carries
the seqs a batch took, each member keeps them per partition as it applies the log
(``broker.modes.replicated.apply``), and a member that becomes the active starts from its copy.
A member knows the seqs it applied since it last started or installed a snapshot: below the
first it learned of a producer, half a window counts as not held (a late batch is stored; a
resend that old, after such a restart, is stored again) and the rest as held.  A producer
without a window here (a single node, shared mode, one that numbers per partition) gets one
when this node first takes a seq of it, with every seq up to the last held then counted as held.
A producer that numbers per partition (the durable connection) sends in order; its batches
carry no seqs.

A resend of a seq that is held but not yet committed is refused with ``UnavailableError``
(retry): confirming the copy could confirm what then fails to commit.
"""

from __future__ import annotations

from client.errors import OutOfOrderSequenceError, UnavailableError
from client.protocol.frames import PublishMessage
from broker.messaging.message import Partition
from broker.messaging.window import Window
from broker.messaging.queues import Queue


def held(part: Partition, producer_id: str, seq: int | None) -> bool:
    """Whether the partition holds (or is storing) this producer's ``seq``."""
    if seq is None:
        return False
    last = part.producers.get(producer_id)
    if last is None or seq > last:
        return False
    gaps = part.gaps.get(producer_id)
    if gaps is not None and seq in gaps:
        return False
    window = part.seen.get(producer_id)
    return window is None or window.has(seq)


def storing(part: Partition, producer_id: str, seq: int) -> bool:
    """Whether a held ``seq`` is still on its way to commit."""
    if seq > part.committed_producers.get(producer_id, -1):
        return True
    filling = part.filling.get(producer_id)
    return filling is not None and seq in filling


def check_dense(q: Queue, pidx: int, producer_id: str, messages: list[PublishMessage]) -> int:
    """A dense batch (addressed to the partition, numbered with no gap) must continue the
    producer's sequence there: every seq up to the last one held is a duplicate (or fills a
    gap a failed commit left), the rest follow on with no gap.  Returns the last seq held
    (-1: none); raises OutOfOrderSequenceError, storing nothing, or UnavailableError for a
    resend of a seq not yet committed."""
    part = q.partitions[pidx]
    last = part.producers.get(producer_id, -1)
    committed = part.committed_producers.get(producer_id, -1)
    gaps = part.gaps.get(producer_id, ())
    expect_seq = last + 1
    for m in messages:
        seq = m.seq
        assert seq is not None
        if seq <= last:
            if seq in gaps:
                continue  # stored again
            if seq > committed or seq in part.filling.get(producer_id, ()):
                raise UnavailableError(f"producer {producer_id}'s seq {seq} on {q.name}/{pidx} is still being "
                                       "stored: retry")
            continue
        if seq != expect_seq:
            raise OutOfOrderSequenceError(
                f"producer {producer_id} sent seq {seq} to {q.name}/{pidx}, which holds its seqs up to "
                f"{last}: resend from {last + 1}", next_seq=last + 1)
        expect_seq += 1
    return last


def check_resends(q: Queue, producer_id: str, messages: list[PublishMessage], pidxs: list[int]) -> None:
    """UnavailableError if a message resends a seq held but not yet committed."""
    parts = q.partitions
    for m, pidx in zip(messages, pidxs):
        part = parts[pidx]
        if m.seq is not None and held(part, producer_id, m.seq) and storing(part, producer_id, m.seq):
            raise UnavailableError(f"producer {producer_id}'s seq {m.seq} on {q.name}/{pidx} is still "
                                   "being stored: retry")


def take(part: Partition, producer_id: str, seq: int, track: bool = True) -> None:
    """Record ``seq`` as held (it is about to be stored); ``track``: in the producer's window too
    (a producer that numbers per partition needs none: it sends in order)."""
    last = part.producers.get(producer_id, -1)
    window = part.seen.get(producer_id)
    if window is None and track:  # (what this node holds of it is all it knows: broker.messaging.window)
        window = part.seen[producer_id] = Window(last)
    if window is not None:
        window.add(seq)
    if seq > last:
        part.producers[producer_id] = seq
        return
    gaps = part.gaps.get(producer_id)
    if gaps is not None and seq in gaps:  # it fills a gap a failed commit left
        gaps.discard(seq)
        if not gaps:
            del part.gaps[producer_id]
    if seq <= part.committed_producers.get(producer_id, -1):  # it came after a later batch
        part.filling.setdefault(producer_id, set()).add(seq)


def committed(part: Partition, producer_id: str, seqs: list[int]) -> None:
    """A batch's ``seqs`` of the producer are committed."""
    cp = part.committed_producers
    top = max(seqs)
    if top > cp.get(producer_id, -1):
        cp[producer_id] = top
    _unfill(part, producer_id, seqs)


def _unfill(part: Partition, producer_id: str, seqs: list[int]) -> None:
    filling = part.filling.get(producer_id)
    if filling is not None:
        filling.difference_update(seqs)
        if not filling:
            del part.filling[producer_id]


def release(q: Queue, seqs_of: dict[tuple[int, str], list[int]]) -> None:
    """A batch was not stored: its seqs may be stored again.  A later batch of the same
    producer may be on its way to commit: then the failed seqs become gaps below its last
    seq, which a resend fills."""
    for (pidx, pid), seqs in seqs_of.items():
        part = q.partitions[pidx]
        window = part.seen.get(pid)
        if window is not None:
            for seq in seqs:
                window.discard(seq)
        _unfill(part, pid, seqs)
        gaps = part.gaps.setdefault(pid, set())
        gaps.update(seqs)
        last = part.producers.get(pid, -1)
        done = part.committed_producers.get(pid, -1)
        while last > done and last in gaps:  # the top failed: the last held moves down
            gaps.discard(last)
            last -= 1
        gaps.difference_update([s for s in gaps if s > last])
        if not gaps:
            del part.gaps[pid]
        if last < 0 and done < 0:
            part.producers.pop(pid, None)
        else:
            part.producers[pid] = last


def idle_producers(part: Partition, now: float, expiry: float) -> list[str]:
    """Producers of the partition idle longer than ``expiry`` with nothing in flight."""
    for pid in list(part.producers):
        part.producer_used.setdefault(pid, now)  # loaded from the store: idle from now
    return [pid for pid, used in part.producer_used.items()
            if now - used > expiry and pid in part.producers and pid not in part.gaps and pid not in part.filling
            and part.producers.get(pid) == part.committed_producers.get(pid)]


def forget(part: Partition, pids: list[str], idle_before: float) -> None:
    """Drop the producers whose expiry committed, unless they published since ``idle_before``
    (one that did is written again with its next message)."""
    for pid in pids:
        if part.producer_used.get(pid, 0.0) <= idle_before:
            part.producers.pop(pid, None)
            part.committed_producers.pop(pid, None)
            part.producer_used.pop(pid, None)
            part.seen.pop(pid, None)
