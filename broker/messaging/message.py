"""One message and one partition as a node holds them in memory: the message's headers and
times, a partition's ready messages, delayed ones, cold region and producer sequences, and the
node's bound on the bytes of ready messages it holds (:class:`MemoryBudget`).  The queue that
holds the partitions is :class:`broker.messaging.queues.Queue`."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Mapping

import msgpack

from broker.messaging.window import Window
from storage.base import StoredMessage
from storage.budget import MSG_MEMORY, memory_share


#: bytes of framing per message in a Deliver/ReadOk frame, beyond body and headers (an upper bound)
MESSAGE_OVERHEAD = 128

EMPTY_HEADERS = msgpack.packb({})


def encode_headers(headers: dict[str, str]) -> bytes:
    return msgpack.packb(headers) if headers else EMPTY_HEADERS


def decode_headers(blob: bytes) -> dict[str, str]:
    return msgpack.unpackb(blob, raw=False) if blob != EMPTY_HEADERS else {}


#: a message's headers that time it (milliseconds, as decimal text): ready ``x-delay`` after its
#: publish, or at ``x-deliver-at`` (since the epoch); gone ``expiration`` after its publish
DELAY_HEADER, DELIVER_AT_HEADER, EXPIRATION_HEADER = "x-delay", "x-deliver-at", "expiration"
TIMING_HEADERS = (DELAY_HEADER, DELIVER_AT_HEADER, EXPIRATION_HEADER)


def _ms(headers: dict[str, str], name: str) -> int | None:
    v = headers.get(name)
    return int(v) if v is not None and v.isascii() and v.isdigit() and len(v) <= 16 else None


def message_times(headers: dict[str, str], ts: float) -> tuple[float, float]:
    """When a message with these headers, published at ``ts``, is due (ready) and when it
    expires (seconds since the epoch; 0.0: at once, never).  A value that is not decimal
    milliseconds counts as absent (the publish path refuses one)."""
    if not headers:
        return 0.0, 0.0
    delay, at, ttl = _ms(headers, DELAY_HEADER), _ms(headers, DELIVER_AT_HEADER), _ms(headers, EXPIRATION_HEADER)
    due = max(ts + delay / 1000 if delay else 0.0, at / 1000 if at else 0.0)
    return due, (ts + ttl / 1000 if ttl is not None else 0.0)


class Msg:
    """One stored message while it lives in the broker."""

    __slots__ = ("partition", "offset", "key", "headers", "headers_blob", "body", "producer_id", "seq",
                 "ts", "dc", "due", "expires")

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
        #: when it may be delivered, when it expires (broker.messaging.timing; 0.0: at once, never)
        self.due, self.expires = message_times(headers, ts)

    @property
    def id(self) -> str:
        """'<partition>-<offset>' where it was first stored (a re-mapped message keeps its own,
        broker.partitions.remap)."""
        return self.headers.get(ID_HEADER) or f"{self.partition}-{self.offset}"


#: the header that keeps a re-mapped message's id (broker.partitions.remap): where it was first stored
ID_HEADER = "x-tandem-id"

#: the exchange and routing key a message was published with, where that was not the default
#: exchange and its queue's name (kept by the AMQP front door, and by dead-lettering through an
#: exchange: broker.messaging.deadletter)
EXCHANGE_HEADER, ROUTING_KEY_HEADER = "amqp-exchange", "amqp-routing-key"


class MemoryBudget:
    """A node's bound on the bytes of ready messages it holds in memory (``max_memory``),
    split evenly over its partitions, and what is held and cold now (metrics)."""

    __slots__ = ("limit", "partitions", "held", "cold", "cold_bytes")

    def __init__(self, limit: int = 0) -> None:
        self.limit = limit  # bytes; 0: no bound
        self.partitions = 0  # partitions of the node's queues
        self.held = 0  # bytes of ready messages in memory (bodies, headers, MSG_MEMORY each)
        self.cold = 0  # ready messages in cold regions (in the store only)
        self.cold_bytes = 0

    def share(self) -> int:
        """Each partition's share (bytes; 0: no bound)."""
        return memory_share(self.limit, self.partitions)


def held_cost(m: Msg) -> int:
    return len(m.body) + len(m.headers_blob) + MSG_MEMORY


class PreparedTx:
    """One transaction's part in one partition, on the partition's active (broker.messaging.prepared)."""

    __slots__ = ("since", "msgs", "acked")

    def __init__(self, since: float) -> None:
        #: since when (monotonic): a transaction in doubt for long asks its coordinator
        self.since = since
        self.msgs: list[Msg] = []  # the messages it published here
        self.acked: list[Msg] = []  # the deliveries it acked here


class Partition:
    __slots__ = ("index", "ready", "next_offset", "committed_end", "marked_upto", "producers",
                 "committed_producers", "gaps", "producer_used", "seen", "filling", "held", "cold_start", "cold_end",
                 "cold_count", "cold_bytes", "cold_mark", "reading", "epoch", "generation", "delayed", "offsets",
                 "registers", "txs", "tx_offsets")

    def __init__(self, index: int, next_offset: int = 0) -> None:
        self.index = index
        self.ready: deque[Msg] = deque()  # the hot head: ready messages in memory
        #: messages not due yet, a heap by (due, offset): ready when due (broker.messaging.timing)
        self.delayed: list[tuple[float, int, Msg]] = []
        self.held = 0  # their bytes (held_cost)
        # The cold region: offsets [cold_start, cold_end) in the store, not in memory, of which
        # cold_count are ready (cold_bytes of bodies and headers); none while cold_count is 0.
        self.cold_start = 0
        self.cold_end = 0
        self.cold_count = 0
        self.cold_bytes = 0
        #: the delivered mark when the partition was loaded: a cold message below it counts
        #: a delivery more, as one loaded in memory does (storage.base.Recovered)
        self.cold_mark = 0
        self.reading = False  # a read of the cold region is under way
        self.epoch = 0  # moves when the cold region is dropped: a read under way is stale
        #: moves whenever the partition's messages are forgotten or loaded again (another node
        #: serves it, or this one again): what a task took from memory before is not this
        #: memory's to give back
        self.generation = 0
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
        #: producer id -> the seqs taken since this node serves the partition (broker.messaging.sequences)
        self.seen: dict[str, Window] = {}
        #: producer id -> seqs taken at or below its last committed one, not committed yet
        self.filling: dict[str, set[int]] = {}
        #: a stream's named consumers -> the offset each stored (committed; broker.messaging.offsets)
        self.offsets: dict[str, int] = {}
        #: the other registers of its producer table (committed): a transaction coordinator's
        #: epochs and decisions, the writes transactions prepared here (broker.transactions.ids)
        self.registers: dict[str, int] = {}
        #: the transactions in doubt here (on its active), by id (broker.messaging.prepared)
        self.txs: dict[str, PreparedTx] = {}
        #: offsets of messages not loaded yet that a transaction in doubt holds -> its id ("!" + id:
        #: a delivery it acked)
        self.tx_offsets: dict[int, str] = {}

    def requeue(self, msgs: list[Msg]) -> None:
        """Put ``msgs`` back at their offset positions (usually all before the ready ones).

        Linear in the messages moved in the common case, a single merge otherwise.
        """
        msgs.sort(key=_offset)
        self.held += sum(len(m.body) + len(m.headers_blob) for m in msgs) + MSG_MEMORY * len(msgs)
        ready = self.ready
        if not ready or msgs[-1].offset < ready[0].offset:
            ready.extendleft(reversed(msgs))
        elif msgs[0].offset > ready[-1].offset:
            ready.extend(msgs)
        else:
            self.ready = deque(heapq.merge(ready, msgs, key=_offset))


#: a producer-table entry whose id starts with this is a *register*, not a producer: state the
#: partition's log keeps (replicated, stored and snapshotted with the producers), which a publish
#: may not use as its producer id and producer expiry never drops
REGISTERS = "~"
#: a stream's named consumer keeps its offset under this prefix and its name
#: (broker.messaging.offsets)
REGISTER = "~offset:"


def split_registers(stored: Mapping[str, int]) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """A partition's stored producer table as (producers, named consumers' offsets, other registers)."""
    producers: dict[str, int] = {}
    offsets: dict[str, int] = {}
    registers: dict[str, int] = {}
    for pid, value in stored.items():
        if not pid.startswith(REGISTERS):
            producers[pid] = value
        elif pid.startswith(REGISTER):
            offsets[pid[len(REGISTER):]] = value
        else:
            registers[pid] = value
    return producers, offsets, registers


def _offset(m: Msg) -> int:
    return m.offset


def frame_cost(m: Msg) -> int:
    """Bytes a message takes in a Deliver or ReadOk frame, at most."""
    return len(m.body) + len(m.headers_blob) + len(m.key or "") + MESSAGE_OVERHEAD


def msg_from_store(partition: int, m: StoredMessage) -> Msg:
    return Msg(partition, m.offset, m.key, decode_headers(m.headers_blob), m.headers_blob, m.body,
               m.producer_id, m.seq, m.ts, m.dc)
