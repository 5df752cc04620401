"""Forwarded requests: what one group member asks of another (location transparency).

A client may send any request to any member.  One that needs a partition's active (a
publish, a stream read, a partition's depth or purge) or the queue catalogue's active (a
declare, a delete, a change of the users or their grants, a drain) is forwarded there over the peer
link as a ``Forward`` frame, answered by ``ForwardOk`` or ``Error`` with the same rid.  The console also asks every member for
its status and counters this way.

A ``Forward`` frame carries ``kind`` (a :class:`ForwardKind`) and ``payload``: the msgpack
array of the request's fields, in the order its dataclass declares them (ints 0 .. 2**63-1,
as in client frames; no ext types).  A field added to a kind later has a default and comes
last: it is left out while it has its default, and a payload without it (an older build's)
reads as the default; a member whose build lacks it refuses the longer array
(:func:`refused_as_longer`: the sender may ask again without it).  Each request type
below is one kind; its ``Reply`` is what ``ForwardOk.payload`` holds, decoded by
:func:`decode_reply`.  A payload that does not fit its kind is refused with
``InvalidArgumentError`` (the peer gets an error frame; the link and the node carry on).

``hops`` counts how often a request was forwarded already: a member that is no longer the
active forwards it on, at most :data:`MAX_HOPS` times, so a group in the middle of an
election answers "retry" instead of bouncing a request around.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, ClassVar, Protocol, TypeVar, get_type_hints

import msgpack

from broker.messaging.commit import CommitPath
from broker.config import NodeConfig
from broker.messaging.queues import Queue
from client.errors import InvalidArgumentError, TandemError
from client.protocol.codec import MAX_INT

MAX_HOPS = 3
#: how a member refuses a kind its build does not know (the start of the error's message)
UNKNOWN_KIND = "unknown forwarded request kind"


class ForwardKind(IntEnum):
    PUBLISH = 1
    DECLARE = 2
    DELETE = 3
    CATALOGUE = 4
    STATUS = 5
    PARTITION_STATS = 6
    QUEUE_STATS = 7
    OPTION = 8
    READ = 9
    DEPTH = 10
    PURGE = 11
    USER_PUT = 12
    USER_DROP = 13
    ACL_GRANT = 14
    ACL_REVOKE = 15
    DRAIN = 16
    MOVE = 17
    GROUP = 18
    REMAP = 19
    AUDIT = 20
    MEMBERS = 21
    RESTORE = 22
    PRODUCED = 23
    UPGRADE = 24
    RELAY_SUBSCRIBE = 25
    RELAY_DELIVER = 26
    RELAY_SETTLE = 27
    RELAY_CANCEL = 28
    RELAY_RELEASE = 29
    RELAY_GET = 30
    TOPOLOGY = 31
    PUBLISH_ROUTED = 32
    OFFSET = 33
    TX = 34
    TX_RESOLVE = 35
    RELAY_TX_ACK = 36


@dataclass(frozen=True, slots=True)
class ForwardRequest:
    KIND: ClassVar[ForwardKind]

    def pack(self) -> bytes:
        values = [getattr(self, f.name) for f in dataclasses.fields(self)]
        # trailing fields at their defaults are left out: an older build reads what it knows
        fields = dataclasses.fields(self)
        while len(values) > _required(type(self)) and values[-1] == fields[len(values) - 1].default:
            values.pop()
        return msgpack.packb(values, use_bin_type=True)


def _required(cls: type[ForwardRequest]) -> int:
    """How many of the kind's fields a payload must carry (those without a default)."""
    return sum(f.default is dataclasses.MISSING for f in dataclasses.fields(cls))


@dataclass(frozen=True, slots=True)
class PublishFwd(ForwardRequest):
    """A publish for one partition's active; ``frame`` is the client's ``Publish`` payload.
    Reply: ``[stored, duplicates, last_seq]``."""
    KIND = ForwardKind.PUBLISH
    hops: int
    partition: int
    frame: bytes


@dataclass(frozen=True, slots=True)
class DeclareFwd(ForwardRequest):
    """A declare for the catalogue's active; ``frame`` is the ``Declare`` payload, ``owner``
    the user who asked ("": the node itself; the queue's ``QueueMeta.owner``).  Reply:
    whether this declare created the queue."""
    KIND = ForwardKind.DECLARE
    hops: int
    frame: bytes
    owner: str = ""


@dataclass(frozen=True, slots=True)
class DeleteFwd(ForwardRequest):
    """A delete for the catalogue's active.  Reply: empty."""
    KIND = ForwardKind.DELETE
    hops: int
    queue: str
    if_empty: bool
    ready_only: bool = False  # (with if_empty: unsettled deliveries do not count)


@dataclass(frozen=True, slots=True)
class CatalogueFwd(ForwardRequest):
    """How far the catalogue's log is committed on its active.  Reply: the index."""
    KIND = ForwardKind.CATALOGUE


@dataclass(frozen=True, slots=True)
class StatusFwd(ForwardRequest):
    """The member's ``StatusOk`` (its frame payload).  Reply: that payload."""
    KIND = ForwardKind.STATUS


@dataclass(frozen=True, slots=True)
class PartitionStatsFwd(ForwardRequest):
    """A partition's figures from its active (the console's partition view)."""
    KIND = ForwardKind.PARTITION_STATS
    queue: str
    partition: int


@dataclass(frozen=True, slots=True)
class QueueStatsFwd(ForwardRequest):
    """The member's per-queue counters for the partitions it is active for:
    ``{queue: [ready, unacked, published, ...]}``."""
    KIND = ForwardKind.QUEUE_STATS


@dataclass(frozen=True, slots=True)
class OptionFwd(ForwardRequest):
    """Set a runtime option (priority, designated_primary) on the member.  Reply: empty."""
    KIND = ForwardKind.OPTION
    option: str
    value: int
    by: str


@dataclass(frozen=True, slots=True)
class ReadFwd(ForwardRequest):
    """A stream read for a partition's active.  Reply: a ``ReadOk`` frame's payload."""
    KIND = ForwardKind.READ
    hops: int
    queue: str
    partition: int
    offset: int
    max_messages: int
    start: str = ""
    timestamp: int = 0


@dataclass(frozen=True, slots=True)
class DepthFwd(ForwardRequest):
    """Ready and (unless ``ready_only``) unsettled messages of a partition, from its active.
    Reply: the count."""
    KIND = ForwardKind.DEPTH
    queue: str
    partition: int
    ready_only: bool = False


@dataclass(frozen=True, slots=True)
class PurgeFwd(ForwardRequest):
    """Drop a partition's ready messages on its active.  Reply: how many."""
    KIND = ForwardKind.PURGE
    queue: str
    partition: int


@dataclass(frozen=True, slots=True)
class UserPutFwd(ForwardRequest):
    """Create or change a user, on the catalogue's active.  ``user``: the record as a msgpack
    map (``storage.base.user_fields``: the password is hashed where it was given, never sent);
    ``mode``: ``create`` (refused if the user exists), ``password`` (refused if it does not;
    the role stays) or ``put``.  Reply: the catalogue's commit index once it is committed."""
    KIND = ForwardKind.USER_PUT
    hops: int
    user: bytes
    mode: str


@dataclass(frozen=True, slots=True)
class UserDropFwd(ForwardRequest):
    """Delete a user and its grants, on the catalogue's active.  Reply: as UserPutFwd's."""
    KIND = ForwardKind.USER_DROP
    hops: int
    name: str


@dataclass(frozen=True, slots=True)
class AclGrantFwd(ForwardRequest):
    """Grant ``permissions`` (comma-separated) on ``pattern`` to ``user``, on the catalogue's
    active.  Reply: as UserPutFwd's."""
    KIND = ForwardKind.ACL_GRANT
    hops: int
    user: str
    pattern: str
    permissions: str


@dataclass(frozen=True, slots=True)
class AclRevokeFwd(ForwardRequest):
    """Revoke them, on the catalogue's active.  Reply: as UserPutFwd's."""
    KIND = ForwardKind.ACL_REVOKE
    hops: int
    user: str
    pattern: str
    permissions: str


@dataclass(frozen=True, slots=True)
class DrainFwd(ForwardRequest):
    """Drain member ``node`` (``drained`` 1) or undrain it (0), on the catalogue's active;
    ``by``: the operator who asked.  Reply: as UserPutFwd's."""
    KIND = ForwardKind.DRAIN
    hops: int
    node: str
    drained: int
    by: str


@dataclass(frozen=True, slots=True)
class MoveFwd(ForwardRequest):
    """Place partition ``partition`` of queue ``queue_id`` on ``nodes`` (comma-separated, in
    priority order), on the catalogue's active: ``moving`` 1 starts a move there, 0 says the
    partition's active has finished it, 2 sends a move under way there instead (a group
    change's re-spread); ``by``: who asked.  Reply: as UserPutFwd's."""
    KIND = ForwardKind.MOVE
    hops: int
    queue_id: int
    partition: int
    nodes: str
    moving: int
    by: str


@dataclass(frozen=True, slots=True)
class GroupFwd(ForwardRequest):
    """A change of the group's members, on the catalogue's active: ``action`` "add" (member
    ``node`` at peer ``address``, in ``zone`` or ""), "remove" (``node``) or "settle" (the
    change under way is done); ``by``: who asked.  Reply: as UserPutFwd's."""
    KIND = ForwardKind.GROUP
    hops: int
    action: str
    node: str
    address: str
    zone: str
    by: str


@dataclass(frozen=True, slots=True)
class RemapFwd(ForwardRequest):
    """A change of a queue's partitioning, on the catalogue's active: ``action`` "add"
    (``count`` partitions more, ``placement`` their node lists or ""), "update" (re-map its
    messages, with ``mapper`` installed first unless ""), or "done" (``partition`` is
    re-mapped, said by its active); ``by``: who asked.  Reply: as UserPutFwd's."""
    KIND = ForwardKind.REMAP
    hops: int
    action: str
    queue_id: int
    count: int
    mapper: str
    placement: str
    partition: int
    by: str


@dataclass(frozen=True, slots=True)
class AuditFwd(ForwardRequest):
    """How the member sees queue ``queue`` (before an update: every member must agree).
    Reply: the text of :meth:`broker.partitions.remap.Remaps.view`."""
    KIND = ForwardKind.AUDIT
    queue: str


@dataclass(frozen=True, slots=True)
class MembersFwd(ForwardRequest):
    """The member addresses the peer knows (broker.peers.discovery's gossip).  Reply: a list of
    "name=host:port"."""
    KIND = ForwardKind.MEMBERS


@dataclass(frozen=True, slots=True)
class RestoreFwd(ForwardRequest):
    """Restore what the quarantine's partitions served here hold (broker.partitions.restore), taking
    only what the discarding node ``origin``, ``queue`` and ``partition`` (a number) name
    ("": any).  Reply: the report, a map of counts per queue."""
    KIND = ForwardKind.RESTORE
    hops: int
    origin: str
    queue: str
    partition: str


@dataclass(frozen=True, slots=True)
class ProducedFwd(ForwardRequest):
    """What a partition's active holds of one producer's messages from ``offset`` on (a
    restore's look for resends, broker.partitions.restore).  Reply: ``[last, covered, seqs]``
    (broker.messaging.streams.Produced)."""
    KIND = ForwardKind.PRODUCED
    hops: int
    queue: str
    partition: int
    producer: str
    offset: int


@dataclass(frozen=True, slots=True)
class UpgradeFwd(ForwardRequest):
    """Raise the group's feature level to ``level``, on the catalogue's active (sent only once
    every member's build supports it: broker.partitions.upgrade); ``by``: the operator who
    asked.  Reply: as UserPutFwd's."""
    KIND = ForwardKind.UPGRADE
    hops: int
    level: int
    by: str


# -- consuming from any node (broker.sessions.relay, broker.sessions.relayed) -------------------------
# A client session on one member consumes the partitions active on another through a *relay*:
# its member subscribes there on its behalf (``session`` numbers the client session on the
# asking member), deliveries come back over the same link, and settlements follow them.  The
# relay lives as long as the link it was made on.


@dataclass(frozen=True, slots=True)
class RelaySubscribeFwd(ForwardRequest):
    """Subscribe for client session ``session`` of the asking member: its consumer ``consumer``
    of ``queue`` with ``prefetch``; the partitions active here deliver to it as RELAY_DELIVER
    over the same link.  Reply: empty."""
    KIND = ForwardKind.RELAY_SUBSCRIBE
    session: int
    consumer: int
    queue: str
    prefetch: int
    exclusive: bool = False  # (refused with ACCESS_REFUSED where the queue has consumers)


@dataclass(frozen=True, slots=True)
class RelayDeliverFwd(ForwardRequest):
    """Deliveries for consumer ``consumer`` of session ``session``: ``frame`` is a ``Deliver``
    frame's payload, its tags the sender's.  Reply: empty; refused (ConsumerNotFoundError) when
    the consumer or its session is gone: the sender takes the messages back, uncounted."""
    KIND = ForwardKind.RELAY_DELIVER
    session: int
    consumer: int
    frame: bytes


@dataclass(frozen=True, slots=True)
class RelaySettleFwd(ForwardRequest):
    """Settle deliveries session ``session`` holds: ``tags`` a msgpack list of the serving member's
    tags; ``action`` ``ack``, ``requeue``, ``unseen`` (requeue, the delivery not counted) or
    ``reject`` (dead-letter).  Reply: empty (a tag no longer held is skipped: its partition moved,
    and its new active delivers it again)."""
    KIND = ForwardKind.RELAY_SETTLE
    session: int
    action: str
    tags: bytes


@dataclass(frozen=True, slots=True)
class RelayTxAckFwd(ForwardRequest):
    """Ack deliveries session ``session`` holds in transaction ``tx``: ``tags`` a msgpack list of
    the serving member's tags, held by the transaction until its outcome (as an ack in it made
    here: broker.transactions.participant).  Reply: a msgpack list of the [queue, partition]
    pairs they belong to, for the transaction's outcome to reach; an error if they could not be
    held (a member of a build without it: unknown kind)."""
    KIND = ForwardKind.RELAY_TX_ACK
    session: int
    tx: str
    tags: bytes


@dataclass(frozen=True, slots=True)
class RelayCancelFwd(ForwardRequest):
    """End consumer ``consumer`` of session ``session`` (what it holds stays held until settled
    or released).  Reply: empty."""
    KIND = ForwardKind.RELAY_CANCEL
    session: int
    consumer: int


@dataclass(frozen=True, slots=True)
class RelayReleaseFwd(ForwardRequest):
    """Session ``session`` ended: its consumers end, what it holds is ready again.  Reply: empty."""
    KIND = ForwardKind.RELAY_RELEASE
    session: int


@dataclass(frozen=True, slots=True)
class RelayGetFwd(ForwardRequest):
    """Take one ready message of ``queue`` from the partitions active here for session
    ``session`` (held for it unless ``auto_ack``).  Reply: a ``GetOk`` frame's payload."""
    KIND = ForwardKind.RELAY_GET
    session: int
    queue: str
    auto_ack: bool


@dataclass(frozen=True, slots=True)
class TopologyFwd(ForwardRequest):
    """A change of the exchanges or bindings, on the catalogue's active: ``change`` one of
    ``declare``, ``delete``, ``bind``, ``unbind``; ``record``: the msgpack array of the change's
    fields (broker.messaging.topology).  Reply: ``[catalogue commit index, created]``."""
    KIND = ForwardKind.TOPOLOGY
    hops: int
    change: str
    record: bytes


@dataclass(frozen=True, slots=True)
class OffsetFwd(ForwardRequest):
    """A named consumer's offset in a stream's partition, for its active: stored (``store``)
    or fetched (broker.messaging.offsets).  Reply: ``[found, offset]``."""
    KIND = ForwardKind.OFFSET
    hops: int
    queue: str
    partition: int
    consumer: str
    store: bool
    offset: int


@dataclass(frozen=True, slots=True)
class RoutedFwd(ForwardRequest):
    """The messages an exchange routed on the member that took them, for the partitions
    active here, one request for all of them (broker.messaging.routed): ``frame`` a ``Publish``
    payload holding each message once, ``parts`` the msgpack array of ``[queue, partition,
    [message index, ...]]``; ``producer_id`` "" for none.  Reply: ``[stored, duplicates]``."""
    KIND = ForwardKind.PUBLISH_ROUTED
    hops: int
    producer_id: str
    frame: bytes
    parts: bytes


RELAY_KINDS = frozenset({ForwardKind.RELAY_SUBSCRIBE, ForwardKind.RELAY_DELIVER, ForwardKind.RELAY_SETTLE,
                         ForwardKind.RELAY_CANCEL, ForwardKind.RELAY_RELEASE, ForwardKind.RELAY_GET,
                         ForwardKind.RELAY_TX_ACK})


class TxOp(IntEnum):
    INIT = 1
    DECIDE = 2
    STATUS = 3


@dataclass(frozen=True, slots=True)
class TxFwd(ForwardRequest):
    """A request for a transactional producer's coordinator partition's active
    (broker.transactions.coordinator): ``op`` INIT (``name``: the transactional id; reply
    ``[epoch, last batch + 1]``), DECIDE (``name``: the transaction id, ``commit`` 0 or 1,
    ``batch`` + 1; reply ``[committed, written]``) or STATUS (reply: 0, 1 commit, 2 abort)."""
    KIND = ForwardKind.TX
    hops: int
    op: int
    name: str
    commit: int = 0
    batch: int = 0


@dataclass(frozen=True, slots=True)
class TxResolveFwd(ForwardRequest):
    """A transaction's outcome (1 commit, 2 abort) for a partition's active that holds what it
    prepared (broker.transactions.resolve).  Reply: nil."""
    KIND = ForwardKind.TX_RESOLVE
    hops: int
    queue: str
    partition: int
    txid: str
    outcome: int


REQUESTS: dict[ForwardKind, type[ForwardRequest]] = {
    cls.KIND: cls for cls in (PublishFwd, DeclareFwd, DeleteFwd, CatalogueFwd, StatusFwd, PartitionStatsFwd,
                              QueueStatsFwd, OptionFwd, ReadFwd, DepthFwd, PurgeFwd, UserPutFwd, UserDropFwd,
                              AclGrantFwd, AclRevokeFwd, DrainFwd, MoveFwd, GroupFwd, RemapFwd, AuditFwd,
                              MembersFwd, RestoreFwd, ProducedFwd, UpgradeFwd, RelaySubscribeFwd, RelayDeliverFwd,
                              RelaySettleFwd, RelayCancelFwd, RelayReleaseFwd, RelayGetFwd, TopologyFwd,
                              RoutedFwd, OffsetFwd, TxFwd, TxResolveFwd, RelayTxAckFwd)
}

R = TypeVar("R", bound=ForwardRequest)


def _check(value: Any, tp: Any) -> bool:
    if tp is int:  # counts, partitions, offsets, option values: 0 .. 2**63-1, as in client frames
        return type(value) is int and 0 <= value <= MAX_INT
    return type(value) is tp


_FIELD_TYPES: dict[ForwardKind, list[tuple[str, Any]]] = {
    kind: [(f.name, get_type_hints(cls)[f.name]) for f in dataclasses.fields(cls)]
    for kind, cls in REQUESTS.items()
}


def decode_request(kind: int, payload: bytes) -> ForwardRequest:
    """The typed request a ``Forward`` frame carries; InvalidArgumentError if it does not fit."""
    try:
        k = ForwardKind(kind)
    except ValueError:
        raise InvalidArgumentError(f"{UNKNOWN_KIND} {kind!r}") from None
    try:
        values = msgpack.unpackb(payload, raw=False, use_list=True) if payload else []
    except Exception as exc:  # msgpack raises several types
        raise InvalidArgumentError(f"forwarded {k.name}: payload is not msgpack ({exc})") from None
    fields = _FIELD_TYPES[k]
    if type(values) is not list or not _required(REQUESTS[k]) <= len(values) <= len(fields):
        raise InvalidArgumentError(_field_count(k, len(fields)))
    for (name, tp), v in zip(fields, values):
        if not _check(v, tp):
            what = "an int in 0 .. 2**63-1" if tp is int else tp.__name__
            raise InvalidArgumentError(f"forwarded {k.name}: field {name} is not {what}")
    return REQUESTS[k](*values)


def _field_count(kind: ForwardKind, n: int) -> str:
    return f"forwarded {kind.name}: expected {n} fields"


def refused_as_longer(exc: TandemError, req: ForwardRequest) -> bool:
    """Whether ``exc`` is how a member whose build lacks ``req``'s later fields refuses it
    (it expects only the fields without a default)."""
    return isinstance(exc, InvalidArgumentError) and exc.message == _field_count(req.KIND, _required(type(req)))


def decode_reply(payload: bytes) -> Any:
    """A ``ForwardOk`` payload of a kind whose reply is a msgpack value."""
    try:
        return msgpack.unpackb(payload, raw=False) if payload else None
    except Exception as exc:  # msgpack raises several types
        raise InvalidArgumentError(f"a forwarded request's reply is not msgpack ({exc})") from None


def pack_reply(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


class Forwarding(Protocol):
    """A node that serves requests for partitions it is active for and forwards the others:
    what the publish path, stream reads and the catalogue route with."""

    @property
    def config(self) -> NodeConfig: ...

    @property
    def commit(self) -> CommitPath: ...

    @property
    def election_wait(self) -> float:
        """How long a request waits for a partition to get an active."""
        ...

    def queue(self, name: str) -> Queue: ...

    async def forward(self, who: str, request: ForwardRequest) -> bytes: ...
