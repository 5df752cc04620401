"""The Store interface: what a storage engine does for a node, and nothing more.

A store keeps, per node: queue definitions, each partition's log of messages
(by offset) and which of them are settled, delivery counts, the last sequence
of every idempotent producer per partition, users and their per-queue grants (ACLs).  The broker keeps the live
state in memory and tells the store what changed as a list of *write ops*; the
store applies each list atomically (group commit, see
:mod:`storage.writer`).  On start, :meth:`Store.load` returns everything that
was committed.

Engines implement :class:`Engine`; every engine runs the conformance suite in
``tests/storage/``.  Capability flags say what an engine can do.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import Enum
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import msgpack

from client.errors import InvalidArgumentError
from storage.topology import DropExchange, PutExchange, SetBinding


class DurabilityPolicy(str, Enum):
    """When a write counts as done (docs/architecture.md, "Vocabulary")."""

    SYNC = "SYNC"  # written and fsynced before the confirm
    WRITE_NO_SYNC = "WRITE_NO_SYNC"  # written to the OS before the confirm; fsync later
    NO_SYNC = "NO_SYNC"  # confirmed at once; written soon after

    @classmethod
    def parse(cls, text: str) -> DurabilityPolicy:
        try:
            return cls(text.upper().replace("-", "_"))
        except ValueError:
            choices = ", ".join(p.value for p in cls)
            raise InvalidArgumentError(f"unknown durability policy {text!r} (choose {choices})") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueMeta:
    id: int
    name: str
    partitions: int
    mapper: str
    ring_size: int
    max_deliveries: int
    dead_letter_queue: str | None
    max_length: int
    #: the user who declared the queue: dead-lettering into ``dead_letter_queue`` needs that
    #: user's ``produce`` on it (broker.security.acl); None for the node's own queues and for a queue
    #: whose record was written without one
    owner: str | None = None
    #: bytes of ready messages (bodies and headers) past which a publish overflows (0: no bound)
    max_length_bytes: int = 0
    #: what a publish past ``max_length`` or ``max_length_bytes`` does: "reject-publish" (refused,
    #: QUEUE_FULL) or "drop-head" (the oldest ready messages go: dead-lettered, or dropped)
    overflow: str = "reject-publish"
    #: milliseconds a message may wait in the queue before it expires (0: for ever)
    message_ttl: int = 0
    #: milliseconds the queue may go unused (no consumer, get or declare) before it is deleted (0: never)
    expires: int = 0
    #: "classic", or "stream": its messages stay, read by offset, until its retention drops them
    #: (whole chunks, broker.messaging.retention): ``max_age`` ms, ``max_bytes`` a partition (0: no bound)
    type: str = "classic"
    max_age: int = 0
    max_bytes: int = 0
    #: the exchange its dead-lettered messages are published to (None: ``dead_letter_queue``, or
    #: none), with ``dead_letter_routing_key`` (None: the routing key each was published with)
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None


class MessageRecord(Protocol):
    """What the store needs of a message to append it (the broker's Msg has these)."""

    offset: int
    key: str | None
    headers_blob: bytes  # msgpack-encoded headers
    body: bytes
    producer_id: str | None
    seq: int | None
    ts: float


@dataclass(slots=True)
class StoredMessage:
    """One message as the store gives it back (``headers_blob`` is msgpack-encoded)."""

    offset: int
    key: str | None
    headers_blob: bytes
    body: bytes
    producer_id: str | None
    seq: int | None
    ts: float
    dc: int = 0  # delivery count, see Recovered


@dataclass(frozen=True, slots=True, kw_only=True)
class UserRecord:
    name: str
    salt: bytes
    hash: bytes
    role: str
    params: str  # hash scheme and parameters: "scram-sha-256:i=100000" (hash = StoredKey + ServerKey; broker.security.users)


@dataclass(frozen=True, slots=True, kw_only=True)
class AclRecord:
    """Permissions (``produce``, ``consume``, ...; see :mod:`broker.security.acl`) granted to ``user``
    on the queues whose names match ``pattern`` (a glob: ``orders.*``, ``*``)."""

    user: str
    pattern: str
    permissions: tuple[str, ...]


def user_fields(user: UserRecord) -> dict[str, Any]:
    """A user record as a msgpack map, field by field (replication, forwarded requests):
    a field added to :class:`UserRecord` travels without a format change."""
    return {f.name: getattr(user, f.name) for f in fields(UserRecord)}


def user_from_fields(data: Any) -> UserRecord:
    """The record :func:`user_fields` made; InvalidArgumentError if it is not one (keys this
    build does not know are left out)."""
    if not isinstance(data, dict):
        raise InvalidArgumentError("a user record must be a map")
    known = {f.name for f in fields(UserRecord)}
    try:
        return UserRecord(**{k: v for k, v in data.items() if k in known})
    except TypeError as exc:
        raise InvalidArgumentError(f"not a user record: {exc}") from None


# -- write ops ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PutQueue:
    queue: QueueMeta


@dataclass(frozen=True, slots=True)
class DropQueue:
    queue_id: int


def pack_run(run: Sequence[MessageRecord]) -> bytes:
    """Messages of consecutive offsets in the stores' chunk format (offsets implied)."""
    return msgpack.packb([[m.key, m.headers_blob, m.body, m.producer_id, m.seq, m.ts] for m in run],
                         use_bin_type=True)


def unpack_run(start: int, payload: bytes) -> list[StoredMessage]:
    items = msgpack.unpackb(payload, raw=False)
    return [StoredMessage(start + i, *item) for i, item in enumerate(items)]


class PackedRun(Sequence[StoredMessage]):
    """Messages of offsets ``start`` .. ``start + length - 1``, still packed by
    :func:`pack_run`.  An :class:`Append` of a replicated log entry carries one: a
    store that keeps chunks writes ``payload`` as it is, and nobody decodes the
    messages unless they look at them."""

    __slots__ = ("start", "length", "payload", "_decoded")

    def __init__(self, start: int, length: int, payload: bytes) -> None:
        self.start = start
        self.length = length
        self.payload = payload
        self._decoded: list[StoredMessage] | None = None

    @classmethod
    def of(cls, run: Sequence[MessageRecord]) -> PackedRun:
        return cls(run[0].offset, len(run), pack_run(run))

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: Any) -> Any:
        if self._decoded is None:
            self._decoded = unpack_run(self.start, self.payload)
            if len(self._decoded) != self.length:
                raise ValueError(f"packed run at {self.start} holds {len(self._decoded)} messages, "
                                 f"not {self.length}")
        return self._decoded[i]


@dataclass(frozen=True, slots=True)
class Append:
    """Append messages (consecutive offsets) to a partition's log; ``next_offset``
    is the log end after it.  ``messages`` may be a :class:`PackedRun`."""

    queue_id: int
    partition: int
    messages: Sequence[MessageRecord]
    next_offset: int


@dataclass(frozen=True, slots=True)
class Settle:
    """These messages are done with (acked, rejected, dead-lettered, purged)."""

    queue_id: int
    partition: int
    offsets: list[int]


@dataclass(frozen=True, slots=True)
class MarkDelivered:
    """Every offset below ``upto`` in the partition has been delivered at least once."""

    queue_id: int
    partition: int
    upto: int


@dataclass(frozen=True, slots=True)
class SetDeliveryCount:
    """Deliveries that ended without a settlement (nack, requeue): ``items`` are
    (offset, delivery_count) pairs."""

    queue_id: int
    partition: int
    items: list[tuple[int, int]]


@dataclass(frozen=True, slots=True)
class PutProducer:
    """A producer's last sequence number in a partition.  ``seqs``: the ones its batch took, for
    a producer whose batches may reach the partition out of order (the replicas keep them to
    tell a late batch from a resend: broker.messaging.sequences); empty for one that numbers
    per partition.  The stores keep only ``last_seq``."""

    queue_id: int
    partition: int
    producer_id: str
    last_seq: int
    seqs: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class DropProducers:
    """Forget idle producers of a partition (their sequences expire: ``producer_expiry``)."""

    queue_id: int
    partition: int
    producer_ids: list[str]


@dataclass(frozen=True, slots=True)
class Trim:
    """A stream's retention: the chunks that end at or below ``below`` go (one across it stays)."""

    queue_id: int
    partition: int
    below: int


@dataclass(frozen=True, slots=True)
class PutUser:
    user: UserRecord


@dataclass(frozen=True, slots=True)
class DropUser:
    """Drop the user and every grant it has."""

    name: str


@dataclass(frozen=True, slots=True)
class GrantAcl:
    """Add ``acl.permissions`` to what ``acl.user`` holds on ``acl.pattern`` (kept ones stay)."""

    acl: AclRecord


@dataclass(frozen=True, slots=True)
class RevokeAcl:
    """Take ``acl.permissions`` from what ``acl.user`` holds on ``acl.pattern``."""

    acl: AclRecord


@dataclass(frozen=True, slots=True)
class PutMeta:
    """Store one node-level setting (``Recovered.meta``) with the other ops."""

    key: str
    value: str


@dataclass(frozen=True, slots=True)
class DropMeta:
    """Remove one node-level setting (``Recovered.meta``)."""

    key: str


@dataclass(frozen=True, slots=True)
class SeedAdmin:
    """Replicated mode, catalogue log only: the group's first admin (see broker.security.security).
    Each member turns it into :class:`PutUser` + :class:`PutMeta` (or nothing); stores never see it."""

    user: UserRecord
    origin: str


@dataclass(frozen=True, slots=True)
class SetDrained:
    """Replicated mode, catalogue log only: member ``node`` drained for maintenance, or not (``tandem
    node drain``, see broker.partitions.drain).  Each member turns it into a :class:`PutMeta`; stores never see it."""

    node: str
    drained: bool


@dataclass(frozen=True, slots=True)
class SetPlacement:
    """Replicated mode, catalogue log only: partition ``partition`` of queue ``queue_id`` is placed on
    ``nodes`` (in priority order) instead of where the distribution policy puts it (``tandem partition
    move``, see broker.partitions.moves).  ``moving``: its active is moving the copies there; False once it
    has.  ``static``: the queue was declared with explicit node lists (``static`` distribution): a re-spread
    of the group's partitions leaves it where it is, but for a member that leaves.  Each member turns it
    into a :class:`PutMeta`; stores never see it."""

    queue_id: int
    partition: int
    nodes: tuple[str, ...]
    moving: bool
    static: bool = False


@dataclass(frozen=True, slots=True)
class SetUpdating:
    """Catalogue log only: an update of queue ``queue_id`` (``tandem partition update``, see
    broker.partitions.remap) starts with ``pending`` its partitions whose messages are to be re-mapped
    by its data mapper; or, with ``finished``, those partitions are done (the rest stay
    pending; none left: the update is done).  Each member turns it into a :class:`PutMeta`;
    stores never see it."""

    queue_id: int
    pending: tuple[int, ...]
    finished: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class SetGroup:
    """Replicated mode, catalogue log only: the group's members (``tandem group add`` /
    ``remove``, see broker.partitions.members).  ``members``: every member's name, sorted (those
    ``leaving`` included until their copies are elsewhere); ``addresses``: "name=host:port"
    of the members added while the group ran (the others' are in the settings);
    ``zones``: "name=zone" of every member, in a group with zones; ``respread``: the
    partitions are moving to where the distribution policy places them over the members
    not leaving; ``pins``: (queue id, partition, nodes) of the partitions the policy
    placed until now, placed there explicitly so the new members do not move them
    by themselves.  Each member turns it into :class:`PutMeta`; stores never see it."""

    members: tuple[str, ...]
    addresses: tuple[str, ...]
    zones: tuple[str, ...]
    leaving: tuple[str, ...]
    respread: bool
    pins: tuple[tuple[int, int, tuple[str, ...]], ...] = ()


@dataclass(frozen=True, slots=True)
class SetFeatureLevel:
    """Replicated mode, catalogue log only: the group's feature level is raised to ``level``
    (``tandem upgrade finalize``, see broker.partitions.upgrade and ha.upgrade).  Each member
    turns it into :class:`PutMeta` (the level, and the store's schema version it implies);
    stores never see it."""

    level: int


# -- the replication log of a partition (replicated mode, see docs/replication.md) ------------------
#
# Key (0, 0) is the group's metadata log (queue definitions); queue ids start at 1.


@dataclass(frozen=True, slots=True)
class LogRecord:
    index: int
    term: int
    origin: str
    weak: bool
    data: bytes  # the entry's commands, msgpack (broker.modes.replicated)


@dataclass(frozen=True, slots=True)
class LogAppend:
    queue_id: int
    partition: int
    entries: list[LogRecord]
    #: the writer's commit index as it writes them (0: not said): entries up to it are
    #: committed, so a node that restarts knows what it had confirmed (HA-1014 counts it)
    commit: int = 0


@dataclass(frozen=True, slots=True)
class LogTruncate:
    """Delete entries from ``from_index`` on (never committed by the group)."""

    queue_id: int
    partition: int
    from_index: int


@dataclass(frozen=True, slots=True)
class LogCompact:
    """Delete entries up to ``upto`` (the applied state has them); (upto, term, origin)
    is the position a restarted replica's log starts after.  ``weak``: the snapshot ends in
    entries a weak active wrote that no majority is known to hold, and ``recency`` is
    (term, index) of its last entry written under a real quorum (what elections compare; a
    strong snapshot's is its own position)."""

    queue_id: int
    partition: int
    upto: int
    term: int
    origin: str
    weak: bool = False
    recency: tuple[int, int] = (0, 0)


@dataclass(frozen=True, slots=True)
class PutHardState:
    queue_id: int
    partition: int
    term: int
    voted_for: str | None
    commit: int


@dataclass(frozen=True, slots=True)
class PutApplied:
    """The partition's state includes every entry up to ``index`` (written with them)."""

    queue_id: int
    partition: int
    index: int
    term: int
    origin: str


@dataclass(frozen=True, slots=True)
class ResetPartition:
    """Forget the partition's messages, marks, counts and producers: a snapshot follows."""

    queue_id: int
    partition: int


WriteOp = (
    PutQueue | DropQueue | Append | Settle | MarkDelivered | SetDeliveryCount | PutProducer | DropProducers | Trim
    | PutUser | DropUser | GrantAcl | RevokeAcl | PutMeta | DropMeta | SeedAdmin | SetDrained | SetPlacement | SetGroup
    | SetUpdating | SetFeatureLevel | PutExchange | DropExchange | SetBinding
    | LogAppend
    | LogTruncate | LogCompact | PutHardState | PutApplied | ResetPartition
)


# -- recovered state ------------------------------------------------------------------


@dataclass(slots=True)
class PartitionState:
    """A partition as loaded.  ``messages`` are its first unsettled messages; with a memory
    budget the rest (beyond the budget's share) are not loaded but counted: the *cold
    region* [cold_start, cold_end) holds ``cold_count`` unsettled messages of ``cold_bytes``
    (bodies and headers, about) that the broker reads back when it delivers them."""

    next_offset: int = 0
    delivered_upto: int = 0
    messages: list[StoredMessage] = field(default_factory=list)
    cold_start: int = 0
    cold_end: int = 0
    cold_count: int = 0
    cold_bytes: int = 0
    producers: dict[str, int] = field(default_factory=dict)
    #: replicated mode: (index, term, origin) of the last log entry this state includes
    applied: tuple[int, int, str] = (0, 0, "")


@dataclass(slots=True)
class LogState:
    """A partition's replication state as stored (hard state, log, applied position)."""

    term: int = 0
    voted_for: str | None = None
    commit: int = 0
    snapshot: tuple[int, int, str] = (0, 0, "")
    applied: tuple[int, int, str] = (0, 0, "")
    entries: list[LogRecord] = field(default_factory=list)
    #: the snapshot's weak mark and recency, as ``LogCompact`` stored them
    snap_weak: bool = False
    snap_recency: tuple[int, int] = (0, 0)
    #: the node's log was found damaged (``Recovered.log_damage``): it catches up from an active
    #: before it votes or stands
    damaged: bool = False
    marked: bool = False  #: the store marks it under repair, since an earlier start (storage.segments.REPAIR_KEY)
    #: the partition's stored messages failed their checksum (``Recovered.store_damage``): where
    store_damage: str = ""


@dataclass(slots=True)
class Recovered:
    """Everything committed, as found by :meth:`Engine.open`.

    Recovered messages are the unsettled ones.  A message's ``dc`` is its
    last recorded delivery count, plus one if it lies below the partition's
    delivered mark (it may have been out with a consumer when the node
    stopped): a count can come back one too high, never too low.
    """

    queues: list[QueueMeta] = field(default_factory=list)
    partitions: dict[tuple[int, int], PartitionState] = field(default_factory=dict)
    users: list[UserRecord] = field(default_factory=list)
    acls: list[AclRecord] = field(default_factory=list)
    meta: dict[str, str] = field(default_factory=dict)
    logs: dict[tuple[int, int], LogState] = field(default_factory=dict)
    #: the store was not closed when it was last open (the process was killed, or the
    #: machine went down): what was written without an fsync may be gone
    unclean_stop: bool = False
    #: where the replication log was found damaged (storage.segments): none of it was read
    log_damage: list[str] = field(default_factory=list)
    #: the partitions whose stored copy (messages, settlements, counts, positions) failed a
    #: checksum, and where (storage.sqlite): repaired from the group
    store_damage: dict[tuple[int, int], str] = field(default_factory=dict)
    #: rows the group cannot repair that failed their checksum (the catalogue's, a hard state)
    row_damage: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Capabilities:
    shared: bool = False  # several nodes may open the same store
    fsync: bool = True  # SYNC really reaches the disk
    #: keeps the replication log (replicated mode: REPLICATION_OPS); without it those ops
    #: are refused (shared mode: one database, no log)
    replication_log: bool = True


#: the replication log's own ops (an engine may keep the log apart from the store)
LOG_OPS: frozenset[type] = frozenset({LogAppend, LogTruncate})
#: the ops of replicated mode alone: the log, its compaction point, hard state and applied
#: position (an engine without ``capabilities.replication_log`` refuses them)
REPLICATION_OPS: frozenset[type] = frozenset({LogAppend, LogTruncate, LogCompact, PutHardState, PutApplied})


@runtime_checkable
class Engine(Protocol):
    """A storage engine.  Methods are blocking; the broker calls them from the
    writer thread (:mod:`storage.writer`) or a reader thread, never the loop."""

    capabilities: Capabilities
    #: bytes of messages :meth:`open` loads, node-wide (0: all), split over the partitions by
    #: :func:`storage.budget.memory_share`; the rest of each partition is a cold region (PartitionState)
    load_budget: int

    def open(self) -> Recovered:
        """Create or open the store and return what it holds."""

    def apply(self, ops: list[WriteOp], *, sync: bool, store_sync: bool | None = None) -> None:
        """Apply ``ops`` in one transaction; with ``sync``, durable on return.

        ``store_sync``: for an engine that keeps the replication log (:data:`LOG_OPS`) in
        files of its own, whether the other ops need a synced commit as well (default:
        ``sync``); the writer passes False when only log ops asked for ``sync``."""

    def read(self, queue_id: int, partition: int, offset: int, limit: int) -> list[StoredMessage]:
        """Up to ``limit`` unsettled messages of a partition with offset >= ``offset``; each
        ``dc`` is its recorded delivery count (without the delivered mark's one)."""

    def stored_end(self, queue_id: int, partition: int) -> int:
        """The partition's log end as committed in the store (0 if it has none): every
        offset below it is in the store or settled.  (In a group the log may be committed
        ahead of the store, whose writes follow lazily.)"""

    def chunks(self, queue_id: int, partition: int) -> list[tuple[int, int, int]]:
        """The partition's chunks in offset order, each (start, count, payload bytes): reader thread."""

    def load_partition(self, queue_id: int, partition: int, budget: int = 0) -> PartitionState:
        """Everything committed of one partition, as :meth:`open` returns it (reader thread).
        ``budget`` (bytes, 0: none): load messages up to it, count the rest as a cold region
        (an engine may load them all; the broker then keeps what fits)."""

    def set_meta(self, key: str, value: str) -> None:
        """Store one node-level setting (e.g. ``store_stamp``) durably."""

    def close(self) -> None: ...
