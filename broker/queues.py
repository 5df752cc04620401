"""In-memory queue state: partitions of ready messages, consumers, counters.

A :class:`Queue` is split into :class:`Partition` objects by its data mapper.
Each partition keeps its *ready* messages in offset order; a message handed to
a consumer leaves ``ready`` and is held by the consumer's session until it is
settled (ack / reject -> gone; nack(requeue) or a dead session -> back into
``ready`` at its offset position).  Nothing here does I/O: :mod:`broker.node`
turns these changes into store write ops and frames.
"""

from __future__ import annotations

import heapq
import re
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Protocol

import msgpack

from broker.mapper import MAPPERS, DataMapper, make_mapper
from client.errors import InvalidArgumentError
from client.protocol.frames import Declare, QueueInfo
from storage.base import PartitionState, QueueMeta, StoredMessage


class Recipient(Protocol):
    """A client session as consumers and delivery see it."""
    client_name: str
    consumers: dict[int, Consumer]
    deliveries: dict[int, tuple[Consumer, Msg]]

    @property
    def writable(self) -> bool: ...

    def deliver(self, c: Consumer, msgs: list[Msg]) -> None: ...

    def cancelled_by_broker(self, c: Consumer, reason: str) -> None: ...

#: bytes of framing per message in a Deliver/ReadOk frame, beyond body and headers (an upper bound)
MESSAGE_OVERHEAD = 128

QUEUE_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,255}$")
MAX_PARTITIONS = 1024
MAX_RING_SIZE = 1 << 20


EMPTY_HEADERS = msgpack.packb({})


def encode_headers(headers: dict[str, str]) -> bytes:
    return msgpack.packb(headers) if headers else EMPTY_HEADERS


def decode_headers(blob: bytes) -> dict[str, str]:
    return msgpack.unpackb(blob, raw=False) if blob != EMPTY_HEADERS else {}


class Msg:
    """One stored message while it lives in the broker."""

    __slots__ = ("partition", "offset", "key", "headers", "headers_blob", "body", "producer_id", "seq",
                 "ts", "dc")

    def __init__(self, partition: int, offset: int, key: str | None, headers: dict[str, str],
                 headers_blob: bytes, body: bytes, producer_id: str | None, seq: int | None,
                 ts: float, dc: int = 0) -> None:
        self.partition = partition
        self.offset = offset
        self.key = key
        self.headers = headers
        self.headers_blob = headers_blob
        self.body = body
        self.producer_id = producer_id
        self.seq = seq
        self.ts = ts
        self.dc = dc  # delivery count: deliveries so far, including one in flight

    @property
    def id(self) -> str:
        return f"{self.partition}-{self.offset}"


class Partition:
    __slots__ = ("index", "ready", "next_offset", "committed_end", "marked_upto", "producers",
                 "committed_producers", "gaps", "producer_used")

    def __init__(self, index: int, next_offset: int = 0) -> None:
        self.index = index
        self.ready: deque[Msg] = deque()
        self.next_offset = next_offset  # offset the next appended message gets
        self.committed_end = next_offset  # end of what the store has committed
        # The committed delivered mark: offsets below it count as delivered once more
        # on recovery (docs/architecture.md, "Delivery counts").
        self.marked_upto = 0
        self.producers: dict[str, int] = {}  # producer id -> last seq accepted (maybe in flight)
        self.committed_producers: dict[str, int] = {}  # producer id -> last seq committed
        #: producer id -> seqs below its last accepted one whose batch failed to commit while a
        #: later batch went on (single node: separate commits); they may be stored again
        self.gaps: dict[str, set[int]] = {}
        self.producer_used: dict[str, float] = {}  # producer id -> when it last published here (monotonic)

    def requeue(self, msgs: list[Msg]) -> None:
        """Put ``msgs`` back at their offset positions (usually all before the ready ones).

        Linear in the messages moved in the common case, a single merge otherwise.
        """
        msgs.sort(key=_offset)
        ready = self.ready
        if not ready or msgs[-1].offset < ready[0].offset:
            ready.extendleft(reversed(msgs))
        elif msgs[0].offset > ready[-1].offset:
            ready.extend(msgs)
        else:
            self.ready = deque(heapq.merge(ready, msgs, key=_offset))


def _offset(m: Msg) -> int:
    return m.offset


def frame_cost(m: Msg) -> int:
    """Bytes a message takes in a Deliver or ReadOk frame, at most."""
    return len(m.body) + len(m.headers_blob) + len(m.key or "") + MESSAGE_OVERHEAD


class Consumer:
    __slots__ = ("id", "queue", "session", "prefetch", "unacked")

    def __init__(self, id: int, queue: Queue, session: Recipient, prefetch: int) -> None:
        self.id = id
        self.queue = queue
        self.session = session
        self.prefetch = prefetch
        self.unacked = 0

    @property
    def credit(self) -> int:
        return self.prefetch - self.unacked


MAX_INT64 = 2**63 - 1


def validate_declare(frame: Declare) -> None:
    """Raise InvalidArgumentError naming the first bad field of a declare."""
    if not QUEUE_NAME.match(frame.queue):
        raise InvalidArgumentError(
            f"queue name {frame.queue!r}: 1-255 characters from A-Z a-z 0-9 _ . : -"
        )
    if not 1 <= frame.partitions <= MAX_PARTITIONS:
        raise InvalidArgumentError(f"partitions {frame.partitions}: must be 1..{MAX_PARTITIONS}")
    if frame.mapper not in MAPPERS:
        raise InvalidArgumentError(f"mapper {frame.mapper!r}: choose {', '.join(MAPPERS)}")
    if not frame.partitions <= frame.ring_size <= MAX_RING_SIZE:
        raise InvalidArgumentError(f"ring_size {frame.ring_size}: must be partitions..{MAX_RING_SIZE}")
    # (the stores keep them as signed 64-bit integers)
    if not 0 <= frame.max_deliveries <= MAX_INT64:
        raise InvalidArgumentError(f"max_deliveries: must be 0..{MAX_INT64} (0 = unlimited)")
    if not 0 <= frame.max_length <= MAX_INT64:
        raise InvalidArgumentError(f"max_length: must be 0..{MAX_INT64} (0 = unlimited)")
    dlq = frame.dead_letter_queue
    if dlq is not None:
        if not QUEUE_NAME.match(dlq):
            raise InvalidArgumentError(f"dead_letter_queue {dlq!r}: not a valid queue name")
        if dlq == frame.queue:
            raise InvalidArgumentError("dead_letter_queue: a queue cannot dead-letter into itself")



class Queue:
    def __init__(self, meta: QueueMeta) -> None:
        self.meta = meta
        self.partitions = [Partition(i) for i in range(meta.partitions)]
        self.mapper: DataMapper = make_mapper(meta.mapper, meta.partitions, meta.ring_size)
        self.consumers: list[Consumer] = []
        self.ready_count = 0
        self.unacked_count = 0
        self.pending_count = 0  # appended, not yet committed (SYNC / WRITE_NO_SYNC)
        self.published = 0
        self.delivered = 0
        self.acked = 0
        self._next_partition = 0
        self._next_consumer = 0
        self.deleted = False

    @property
    def name(self) -> str:
        return self.meta.name

    def load_partition(self, pidx: int, st: PartitionState, *, messages: bool = True) -> None:
        """The partition as the store has it (at start, or when this node becomes its active):
        offsets, producer sequences and, with ``messages``, its ready messages."""
        part = self.partitions[pidx]
        self.clear_partition(pidx)
        part.next_offset = part.committed_end = st.next_offset
        part.marked_upto = st.delivered_upto
        part.producers = dict(st.producers)
        part.committed_producers = dict(st.producers)
        if messages:
            self.add_ready(part, (msg_from_store(pidx, m) for m in st.messages))

    def clear_partition(self, pidx: int) -> None:
        """Forget the partition's ready messages and producers (another node serves it now)."""
        part = self.partitions[pidx]
        self.ready_count -= len(part.ready)
        part.ready.clear()
        part.producers = {}
        part.committed_producers = {}
        part.gaps = {}
        part.producer_used = {}

    def mark_committed(self, by_part: dict[int, list[Msg]]) -> None:
        """These messages are in the store: stream reads may see them."""
        for pidx, msgs in by_part.items():
            part = self.partitions[pidx]
            end = msgs[-1].offset + 1
            if end > part.committed_end:
                part.committed_end = end

    @property
    def depth(self) -> int:
        return self.ready_count + self.unacked_count + self.pending_count

    def info(self) -> QueueInfo:
        m = self.meta
        return QueueInfo(
            m.name, m.partitions, m.mapper, m.ring_size, m.max_deliveries, m.dead_letter_queue,
            m.max_length, self.ready_count, self.unacked_count + self.pending_count,
            len(self.consumers), self.published, self.delivered, self.acked,
        )

    # -- ready messages -------------------------------------------------------------------

    def add_ready(self, partition: Partition, msgs: Iterable[Msg]) -> None:
        before = len(partition.ready)
        partition.ready.extend(msgs)
        self.ready_count += len(partition.ready) - before

    def take(self, n: int, max_bytes: int) -> list[Msg]:
        """Up to ``n`` ready messages whose bodies total at most ``max_bytes`` (but at
        least one message), taken round-robin over partitions in batches."""
        out: list[Msg] = []
        parts = self.partitions
        count = len(parts)
        empty_seen = 0
        i = self._next_partition
        share = max(1, n // count) if count > 1 else n
        size = 0
        while len(out) < n and empty_seen < count:
            ready = parts[i].ready
            if ready:
                empty_seen = 0
                for _ in range(min(share, n - len(out), len(ready))):
                    cost = frame_cost(ready[0])
                    if out and size + cost > max_bytes:
                        n = len(out)  # full: stop here
                        break
                    size += cost
                    out.append(ready.popleft())
            else:
                empty_seen += 1
            i = (i + 1) % count
        self._next_partition = i
        self.ready_count -= len(out)
        return out

    def requeue(self, msgs: list[Msg]) -> None:
        by_part: dict[int, list[Msg]] = {}
        for m in msgs:
            by_part.setdefault(m.partition, []).append(m)
        for p, lst in by_part.items():
            self.partitions[p].requeue(lst)
        self.ready_count += len(msgs)

    def purge_ready(self) -> dict[int, list[Msg]]:
        """Drop every ready message; returns them per partition."""
        removed: dict[int, list[Msg]] = {}
        for p in self.partitions:
            if p.ready:
                removed[p.index] = list(p.ready)
                p.ready.clear()
        self.ready_count = 0
        return removed

    # -- consumers ------------------------------------------------------------------------

    def consumers_in_turn(self) -> list[Consumer]:
        cs = self.consumers
        if len(cs) <= 1:
            return list(cs)
        k = self._next_consumer % len(cs)
        self._next_consumer = k + 1
        return cs[k:] + cs[:k]


class Holder(Protocol):
    """A session holding deliveries (delivered, not yet settled)."""

    @property
    def deliveries(self) -> Mapping[int, tuple[Consumer, Msg]]: ...


def partition_depth(holders: Iterable[Holder], q: Queue, pidx: int) -> int:
    """Ready and delivered-but-unsettled messages of one partition served here."""
    held = sum(1 for h in holders for c, m in h.deliveries.values() if c.queue is q and m.partition == pidx)
    return len(q.partitions[pidx].ready) + held


def msg_from_store(partition: int, m: StoredMessage) -> Msg:
    return Msg(partition, m.offset, m.key, decode_headers(m.headers_blob), m.headers_blob, m.body,
               m.producer_id, m.seq, m.ts, m.dc)


def revoke_deliveries(holders: Iterable[Recipient], q: Queue, pidx: int) -> int:
    """Drop the unsettled deliveries of a partition this node no longer serves (the new active
    delivers them again); how many."""
    revoked = 0
    for h in holders:
        gone = [t for t, (c, m) in h.deliveries.items() if c.queue is q and m.partition == pidx]
        for t in gone:
            c, _m = h.deliveries.pop(t)
            c.unacked -= 1
            q.unacked_count -= 1
        revoked += len(gone)
    return revoked
