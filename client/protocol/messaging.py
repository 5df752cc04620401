"""Frames of messaging: queues, publishing, the partition map, consuming and reading.

Queues are declared, deleted, purged and listed; the partition map is what a durable
connection routes by; consuming is subscribe, deliveries, settlement and get; a partition
is read by offset.  The records they carry are here too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from client.protocol.base import Frame, Op, Record


# -- records -------------------------------------------------------------------


@dataclass(slots=True)
class PublishMessage(Record):
    """One message in a publish batch: ``[key, headers, body, seq]``."""

    key: str | None
    headers: dict[str, str]
    body: bytes
    seq: int | None = None


@dataclass(slots=True)
class Delivery(Record):
    """One delivered message.  ``tag`` is unique on its connection."""

    tag: int
    partition: int
    offset: int
    key: str | None
    headers: dict[str, str]
    body: bytes
    redelivered: bool
    delivery_count: int
    timestamp: float
    id: str


@dataclass(slots=True)
class StreamMessage(Record):
    """A message read by offset (not consumed)."""

    partition: int
    offset: int
    key: str | None
    headers: dict[str, str]
    body: bytes
    timestamp: float
    id: str


@dataclass(frozen=True, slots=True)
class QueueInfo(Record):
    name: str
    partitions: int
    mapper: str
    ring_size: int
    max_deliveries: int
    dead_letter_queue: str | None
    max_length: int
    ready: int
    unacked: int
    consumers: int
    published: int
    delivered: int
    acked: int


# -- queues --------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Declare(Frame):
    OP: ClassVar[Op] = Op.DECLARE
    rid: int
    queue: str
    partitions: int = 1
    mapper: str = ""  # "": the default (a new queue) or the queue's own (an existing one)
    ring_size: int = 1024
    max_deliveries: int = 0
    dead_letter_queue: str | None = None
    max_length: int = 0
    #: ``static`` distribution: one node list per partition, separated by ";" (nodes by ",",
    #: each ``name``, ``name:sync`` or ``name:async``); "": ``dynamic``, the group's policy
    placement: str = ""
    #: bytes of ready messages (bodies and headers) past which a publish overflows (0: no bound)
    max_length_bytes: int = 0
    #: past max_length or max_length_bytes: "reject-publish" (refused) or "drop-head" (the oldest
    #: ready messages go, to the dead-letter queue if there is one); protocol version 3
    overflow: str = "reject-publish"
    #: milliseconds a message may wait before it expires (0: for ever); protocol version 3
    message_ttl: int = 0
    #: milliseconds the queue may go unused (no consumer, get or declare on any member) before it is
    #: deleted (0: never); protocol version 3
    expires: int = 0
    #: "classic" (consumed and gone) or "stream" (kept and read by offset until its retention drops
    #: it); protocol version 5
    type: str = "classic"
    #: a stream's retention: milliseconds a message is kept, bytes each partition keeps (0: no
    #: bound); protocol version 5
    max_age: int = 0
    max_bytes: int = 0
    #: the exchange dead-lettered messages are published to, instead of a ``dead_letter_queue``,
    #: with ``dead_letter_routing_key`` (None: the routing key each was published with); protocol
    #: version 7
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None


#: a declare's explicit node lists: one sequence of nodes per partition, or their text form
Placement = Sequence[Sequence[str]] | str | None


def placement_text(placement: Placement) -> str:
    """``Declare.placement`` for a client's ``placement`` argument: lists joined by ";",
    nodes by "," (a str as it is; None: "")."""
    if placement is None or isinstance(placement, str):
        return placement or ""
    return ";".join(",".join(nodes) if not isinstance(nodes, str) else nodes for nodes in placement)


@dataclass(frozen=True, slots=True, kw_only=True)
class DeclareOk(Frame):
    OP: ClassVar[Op] = Op.DECLARE_OK
    rid: int
    queue: QueueInfo
    created: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Delete(Frame):
    OP: ClassVar[Op] = Op.DELETE
    rid: int
    queue: str
    if_empty: bool = False
    #: with ``if_empty``: only ready messages count, not delivered and unsettled ones (AMQP's if_empty)
    ready_only: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Purge(Frame):
    OP: ClassVar[Op] = Op.PURGE
    rid: int
    queue: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PurgeOk(Frame):
    OP: ClassVar[Op] = Op.PURGE_OK
    rid: int
    purged: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ListQueues(Frame):
    OP: ClassVar[Op] = Op.LIST_QUEUES
    rid: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Queues(Frame):
    OP: ClassVar[Op] = Op.QUEUES
    rid: int
    queues: list[QueueInfo] = field(default_factory=list)


# -- publish -------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Publish(Frame):
    """A batch of messages for one queue; confirmed as a whole by PublishOk."""

    OP: ClassVar[Op] = Op.PUBLISH
    rid: int
    queue: str
    messages: list[PublishMessage]
    producer_id: str | None = None
    #: All messages go to this partition, and their ``seq`` count 0, 1, 2, ... per
    #: (producer, partition) with no gap: a batch that would leave one is refused with
    #: OutOfOrderSequence (and the partition's next expected sequence), never stored.  An empty
    #: batch asks for that next sequence.  None: the node maps each message, and a
    #: producer's sequences need only increase.
    partition: int | None = None
    #: publish to this exchange instead of ``queue`` (protocol version 4): each message goes
    #: to every queue the exchange's bindings route ``routing_key`` (and its headers) to
    exchange: str | None = None
    routing_key: str = ""
    #: each message's own routing key, in order (empty: every message has ``routing_key``)
    routing_keys: list[str] = field(default_factory=list)
    #: a message routed to no queue refuses the whole batch (NO_ROUTE), nothing stored;
    #: without it such a message is dropped and counted (``PublishOk.unroutable``)
    mandatory: bool = False
    #: the id of the transaction the batch is part of (protocol version 6): stored, and held
    #: aside until the transaction commits (client.protocol.transactions)
    tx: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class PublishOk(Frame):
    """Every message of batch ``rid`` is stored per the durability policy.

    ``duplicates`` counts messages whose (producer_id, seq) was already stored:
    confirmed again, not stored twice.
    """

    OP: ClassVar[Op] = Op.PUBLISH_OK
    rid: int
    stored: int
    duplicates: int = 0
    next_seq: int = 0  # with ``partition``: the producer's next sequence there (0: it holds none)
    unroutable: int = 0  # a publish to an exchange: messages routed to no queue (dropped)
    #: a publish to an exchange in a transaction: the queues it routed to (their partitions hold
    #: the transaction's messages; the client names them when it ends the transaction)
    queues: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class PartitionMap(Record):
    """Where a queue's partitions are served: ``actives[p]`` names the node active for
    partition p ("" while none is), ``addresses`` maps node names to client host:port."""

    queue: QueueInfo
    actives: list[str]
    addresses: dict[str, str]


@dataclass(frozen=True, slots=True, kw_only=True)
class Metadata(Frame):
    """Ask for the partition map of ``queue``.  The session then sends MapChanged
    (no rid) whenever a partition of any queue gets a new active or loses it."""

    OP: ClassVar[Op] = Op.METADATA
    rid: int
    queue: str


@dataclass(frozen=True, slots=True, kw_only=True)
class MetadataOk(Frame):
    """``quorum``: the answering node has node quorum.  False: its partitions are
    Unavailable there and its actives are not to be trusted over a node with quorum
    (a client asks another node)."""

    OP: ClassVar[Op] = Op.METADATA_OK
    rid: int
    map: PartitionMap
    quorum: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class MapChanged(Frame):
    """Pushed to sessions that asked for a partition map: ask again."""

    OP: ClassVar[Op] = Op.MAP_CHANGED
    node: str


# -- consume -------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Subscribe(Frame):
    """Consume ``queue``: every partition, those active on other members relayed by this one.
    ``local``: only the partitions active on this node (a client that subscribes on every
    member itself: the SDK's group and durable consumers).  ``exclusive``: the queue's only
    consumer (refused with ACCESS_REFUSED while it has another; none is taken while it lasts)."""

    OP: ClassVar[Op] = Op.SUBSCRIBE
    rid: int
    queue: str
    prefetch: int = 256
    local: bool = False
    exclusive: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class SubscribeOk(Frame):
    OP: ClassVar[Op] = Op.SUBSCRIBE_OK
    rid: int
    consumer: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Cancel(Frame):
    OP: ClassVar[Op] = Op.CANCEL
    rid: int
    consumer: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Deliver(Frame):
    OP: ClassVar[Op] = Op.DELIVER
    consumer: int
    messages: list[Delivery]


@dataclass(frozen=True, slots=True, kw_only=True)
class Ack(Frame):
    """Settle deliveries.  ``multiple``: every outstanding tag <= max(tags)."""

    OP: ClassVar[Op] = Op.ACK
    rid: int
    tags: list[int]
    multiple: bool = False
    #: the id of the transaction the acks are part of (protocol version 6): the deliveries are
    #: held by it, and settled when it commits (ready again when it aborts); answered by ``Ok``
    #: once that is replicated
    tx: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Nack(Frame):
    OP: ClassVar[Op] = Op.NACK
    rid: int
    tags: list[int]
    multiple: bool = False
    requeue: bool = True
    #: false: the application never saw these (buffered in the client when it
    #: cancelled or closed): requeue without counting the delivery
    delivered: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class Reject(Frame):
    """Settle deliveries as failed: dead-letter them (or drop, without a DLQ)."""

    OP: ClassVar[Op] = Op.REJECT
    rid: int
    tags: list[int]
    multiple: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Get(Frame):
    OP: ClassVar[Op] = Op.GET
    rid: int
    queue: str
    auto_ack: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class GetOk(Frame):
    OP: ClassVar[Op] = Op.GET_OK
    rid: int
    message: Delivery | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Read(Frame):
    """Read partition ``partition`` of ``queue`` from ``offset`` without consuming."""

    OP: ClassVar[Op] = Op.READ
    rid: int
    queue: str
    partition: int
    offset: int = 0
    max_messages: int = 1000
    #: instead of ``offset``: "first" (the oldest message held), "last" (the newest one) or
    #: "next" (the end: only what comes later); protocol version 5
    start: str = ""
    #: instead of ``offset``: from the first message stored at or after this time (milliseconds
    #: since the epoch); protocol version 5
    timestamp: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadOk(Frame):
    """``next_offset``: where the next read continues; ``end_offset``: the log's end."""

    OP: ClassVar[Op] = Op.READ_OK
    rid: int
    messages: list[StreamMessage]
    next_offset: int
    end_offset: int


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreOffset(Frame):
    """Keep ``offset`` (the next one it reads) as consumer ``consumer``'s position in partition
    ``partition`` of stream ``queue``: group state, answered by ``Ok`` once committed.
    Protocol version 5."""

    OP: ClassVar[Op] = Op.STORE_OFFSET
    rid: int
    queue: str
    partition: int
    consumer: str
    offset: int


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchOffset(Frame):
    """The offset consumer ``consumer`` stored for a partition of stream ``queue``; answered by
    ``OffsetOk``.  Protocol version 5."""

    OP: ClassVar[Op] = Op.FETCH_OFFSET
    rid: int
    queue: str
    partition: int
    consumer: str


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetOk(Frame):
    """``offset`` as stored (``found`` False: none stored, ``offset`` 0)."""

    OP: ClassVar[Op] = Op.OFFSET_OK
    rid: int
    offset: int
    found: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Produced(Frame):
    """Which of ``producer``'s messages partition ``partition`` of ``queue`` stores from
    ``offset`` on (a restore's look for a producer's resends)."""

    OP: ClassVar[Op] = Op.PRODUCED
    rid: int
    queue: str
    partition: int
    producer: str
    offset: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ProducedOk(Frame):
    """``last``: the producer's last sequence number the partition committed (nil: none);
    ``seqs``: its sequence numbers stored from the offset on; ``covered``: every message from
    the offset on is still stored (settled ones are not), so a seq not in ``seqs`` is not there."""

    OP: ClassVar[Op] = Op.PRODUCED_OK
    rid: int
    last: int | None
    covered: bool
    seqs: list[int]
