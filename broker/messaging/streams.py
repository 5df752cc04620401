"""Stream reads: a partition's messages from an offset, without consuming them (Spark, replay).

A read starts at an offset, at "first" (the oldest message held), "last" (the newest) or
"next" (the end), or at a time: the first message stored at or after it, found by a binary
search over the offsets (:func:`offset_at`).
Timestamps are the active's clock as it stored each message: after a failover to a member
whose clock is behind, a time may fall a little early or late.

In a group the partition's active answers: a read made on another member is forwarded there
(another member's store may lag, and only the active knows the committed end).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

from broker.messaging import prepared
from broker.messaging.forward import MAX_HOPS, Forwarding, ProducedFwd, ReadFwd, decode_reply, pack_reply
from broker.messaging.message import ID_HEADER, MESSAGE_OVERHEAD, decode_headers
from broker.messaging.queues import Queue
from client.errors import InvalidArgumentError, PartitionNotFoundError, UnavailableError
from client.protocol.codec import decode_payload
from client.protocol.frames import ProducedOk, ReadOk, StreamMessage, expect
from storage.base import Engine, StoredMessage, WriteOp

MAX_READ_BATCH = 10000  # messages in one stream read
#: where a read may start instead of an offset ("": at its offset)
STARTS = ("", "first", "last", "next")


class StreamHost(Forwarding, Protocol):
    @property
    def engine(self) -> Engine: ...
    #: held while a look at a producer's messages reads the store (one at a time)
    scans: asyncio.Semaphore

    async def commit_ops(self, key: tuple[int, int], ops: list[WriteOp]) -> None:
        """Commit a partition's ops as a client's write, and wait for it (a named offset)."""
        ...


async def read_stream(node: StreamHost, queue: str, partition: int, offset: int, max_messages: int,
                      *, start: str = "", timestamp: int = 0, hops: int = 0) -> tuple[list[StreamMessage], int, int]:
    """(messages, next offset, end offset) of one partition from ``offset``, or from ``start``
    ("first", "last", "next") or ``timestamp`` (milliseconds since the epoch) if given.  The
    queue counts as used (``expires``)."""
    q = node.queue(queue)
    q.touch()  # (a read uses the queue: its ``expires`` counts from here)
    if not 0 <= partition < len(q.partitions):
        raise PartitionNotFoundError(f"queue {queue!r} has no partition {partition}")
    if offset < 0 or not 1 <= max_messages <= MAX_READ_BATCH:
        raise InvalidArgumentError(f"offset must be >= 0 and max_messages 1..{MAX_READ_BATCH}")
    if start not in STARTS or timestamp < 0:
        raise InvalidArgumentError(f"start {start!r}: one of first, last, next; timestamp: milliseconds >= 0")
    who = await active_elsewhere(node, q, partition, hops)
    if who is not None:
        out = await node.forward(who, ReadFwd(hops + 1, queue, partition, offset, max_messages, start, timestamp))
        ok = expect(decode_payload(out), ReadOk)
        return ok.messages, ok.next_offset, ok.end_offset
    part = q.partitions[partition]
    engine = node.engine
    if start or timestamp:
        offset = await asyncio.to_thread(_resolve, engine, q.meta.id, partition, part.committed_end, start,
                                         timestamp / 1000)

    def read() -> tuple[int, list[StoredMessage]]:
        # the store's end first: below it every message is in the store or settled.  In a
        # group the log commits before the store is written (held back a little), and a read
        # that trusted committed_end alone would step over messages not yet there.
        stored = engine.stored_end(q.meta.id, partition)
        return stored, engine.read(q.meta.id, partition, offset, max_messages)

    stored, rows = await asyncio.to_thread(read)
    end = min(part.committed_end, stored)
    full = len(rows) == max_messages
    budget = node.config.max_frame_size - 4096
    msgs: list[StreamMessage] = []
    hidden = prepared.in_doubt(part) if part.registers else frozenset()  # (read committed)
    for r in rows:
        if r.offset >= end:
            break
        if r.offset in hidden:
            continue
        budget -= len(r.body) + len(r.headers_blob) + len(r.key or "") + MESSAGE_OVERHEAD
        if msgs and budget < 0:
            full = True  # the frame is full: the reader continues after the last one sent
            break
        headers = decode_headers(r.headers_blob)
        msgs.append(StreamMessage(partition, r.offset, r.key, headers, r.body, r.ts,
                                  headers.get(ID_HEADER) or f"{partition}-{r.offset}"))
    nxt = msgs[-1].offset + 1 if msgs and full else max(end, offset)
    return msgs, nxt, end


def _resolve(engine: Engine, qid: int, partition: int, end: int, start: str, when: float) -> int:
    """The offset a read from ``start`` or time ``when`` begins at (reader thread)."""
    if start == "first":
        return 0  # (a read returns what is held from there: the oldest message)
    if start == "next":
        return end
    if start == "last":
        return max(0, end - 1)
    return offset_at(engine, qid, partition, end, when)


def offset_at(engine: Engine, qid: int, partition: int, end: int, when: float) -> int:
    """The offset of the partition's first message (below ``end``) stored at or after ``when``,
    or ``end`` if none is: a binary search over the offsets, each step one read of the first
    message held at or after an offset (reader thread)."""
    lo, hi, found = 0, end, end
    while lo < hi:
        mid = (lo + hi) // 2
        rows = engine.read(qid, partition, mid, 1)
        if rows and rows[0].offset < end and rows[0].ts < when:
            lo = rows[0].offset + 1  # (every message held below it is older too)
        else:
            if rows and rows[0].offset < found:
                found = rows[0].offset  # (nothing is held between mid and it)
            hi = mid
    return found


async def active_elsewhere(node: Forwarding, q: Queue, partition: int, hops: int) -> str | None:
    """The member a request for ``partition`` goes to (None: this node is its active)."""
    commit = node.commit
    if commit.serving((q.meta.id, partition)):
        return None
    who = await commit.wait_active((q.meta.id, partition), node.election_wait)
    if who == node.config.name:
        return None
    if hops >= MAX_HOPS:
        raise UnavailableError(f"partition {q.meta.id}/{partition}: its active keeps moving; retry")
    return who


#: sequence numbers one look for a producer's messages gives at most (then it is not covered)
MAX_PRODUCED = 100_000
#: messages read from the store at a time by that look (bodies included: large ones add up)
SCAN_BATCH = 500
#: messages one look reads at most (then it is not covered): one request's work stays bounded
MAX_SCANNED = 2_000_000


@dataclass(frozen=True, slots=True)
class Produced:
    """What a partition holds of one producer's messages from an offset on."""

    #: the last sequence number of the producer the partition committed (-1: none, or forgotten)
    last: int
    #: whether every message from the offset on is still stored, so that a seq not in
    #: ``seqs`` is not in the partition there (messages settled since are no longer stored)
    covered: bool
    #: the producer's sequence numbers stored from the offset on
    seqs: frozenset[int]

    def pack(self) -> bytes:
        return pack_reply([self.last, self.covered, sorted(self.seqs)])

    def ok(self, rid: int) -> ProducedOk:
        """The client's answer (``last`` nil for none)."""
        return ProducedOk(rid=rid, last=None if self.last < 0 else self.last, covered=self.covered,
                          seqs=sorted(self.seqs))

    @classmethod
    def of(cls, ok: ProducedOk) -> Produced:
        return cls(-1 if ok.last is None else ok.last, ok.covered, frozenset(ok.seqs))

    @classmethod
    def unpack(cls, reply: bytes) -> Produced:
        value = decode_reply(reply)
        if not (isinstance(value, list) and len(value) == 3 and type(value[0]) is int
                and type(value[1]) is bool and isinstance(value[2], list)
                and all(type(v) is int for v in value[2])):
            raise InvalidArgumentError("forwarded PRODUCED: the reply is not [last, covered, seqs]")
        return cls(value[0], value[1], frozenset(value[2]))


async def produced(node: StreamHost, queue: str, partition: int, producer: str, offset: int,
                   *, hops: int = 0) -> Produced:
    """What the partition's active holds of ``producer``'s messages from ``offset`` on: a
    scan of what it stores there (MAX_SCANNED messages, MAX_PRODUCED seqs at most; one scan
    at a time on a node, however many are asked for)."""
    q = node.queue(queue)
    if not 0 <= partition < len(q.partitions):
        raise PartitionNotFoundError(f"queue {queue!r} has no partition {partition}")
    who = await active_elsewhere(node, q, partition, hops)
    if who is not None:
        return Produced.unpack(await node.forward(who, ProducedFwd(hops + 1, queue, partition, producer, offset)))
    part = q.partitions[partition]
    last = part.committed_producers.get(producer, -1)
    engine, qid = node.engine, q.meta.id

    def scan() -> tuple[bool, frozenset[int]]:
        end = min(part.committed_end, engine.stored_end(qid, partition))
        seqs: set[int] = set()
        at, stored = offset, 0
        while at < end:
            if stored >= MAX_SCANNED:
                return False, frozenset(seqs)
            rows = engine.read(qid, partition, at, SCAN_BATCH)
            for r in rows:
                if r.offset >= end:
                    break
                stored += 1
                if r.producer_id == producer and r.seq is not None:
                    seqs.add(r.seq)
                    if len(seqs) > MAX_PRODUCED:
                        return False, frozenset(seqs)
            if len(rows) < SCAN_BATCH:
                break
            at = rows[-1].offset + 1
        return stored >= end - offset, frozenset(seqs)

    async with node.scans:
        covered, seqs = await asyncio.to_thread(scan)
    return Produced(last, covered, seqs)
