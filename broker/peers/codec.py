"""The replication wire format: messages between replicas, log entry payloads, snapshots.

Everything is msgpack (``use_bin_type=True``; decoded with ``raw=False``).  Arrays
are positional; a field marked *bin* is a msgpack bin, *str* a msgpack str, *nil|x*
may be nil.  Nodes of different builds talk to each other, so no field moves and no
code changes meaning; a new message kind or op code is added at the end, and a
receiver drops a kind it does not know (:class:`UnknownMessageKind`).  Every decoder
checks what it reads against the layouts below (an array of at least the listed items,
each of the listed type; *int* items fit a signed 64-bit integer, and are never negative in
a message, or in an op where they name a position) and refuses anything else with :class:`MalformedReplicationError`,
whoever sent the bytes.

``Replicate`` frame payload (one per peer per turn of the event loop)::

    array of items, each
      [0] queue_id    int   the partition's queue (0 with partition 0: the catalogue)
      [1] partition   int
      [2] message     array  [kind, field...], kind a :class:`MessageKind`:

    kind                    fields after the kind
    0 REQUEST_VOTE          term int, candidate str, last_index int, last_term int, priority int
    1 VOTE_REPLY            term int, voter str, granted bool
    2 APPEND_ENTRIES        term int, leader str, prev_index int, prev_term int,
                            prev_origin str, entries array of Entry, commit int
    3 APPEND_REPLY          term int, replica str, success bool, match_index int
    4 INSTALL_SNAPSHOT      term int, leader str, index int, last_term int,
                            last_origin str, data bin (a snapshot, below),
                            [members: [[voter str, ...], [learner str, ...]] | nil]
                            (the partition's members as of index, ha.members),
                            [weak bool] (the state ends in entries of a weak active no
                            majority is known to hold: ha.messages.InstallSnapshot.weak;
                            SNAPSHOT_CHUNK carries it too, after its data)
    5 TIMEOUT_NOW           term int, leader str, rank int
    6 ALIVE                 term int, replica str
    7 PRE_VOTE              as REQUEST_VOTE: would the voter vote for the candidate in
                            term (it raises its own term only with a quorum of yeses)
    8 PRE_VOTE_REPLY        as VOTE_REPLY: the answer to a PRE_VOTE (granted: term is
                            the one asked about; refused: the voter's own)
    9 SNAPSHOT_CHUNK        term int, leader str, index int, seq int, data bin (an array of
                            snapshot messages, below): part seq of a streamed snapshot
                            as of index, ended by an INSTALL_SNAPSHOT whose data is the
                            streamed form (drivers only: the core never sees a part)
    10 SNAPSHOT_ACK         term int, replica str, index int, seq int: part seq of the
                            snapshot as of index is written (drivers only)

    Entry:  [term int, index int, data nil|bin (a log entry payload; nil: an
            active's no-op), origin str, weak bool]

Log entry payload (``Entry.data``; also what the log on disk holds)::

    array of ops, each [code, field...], code an :class:`OpCode` (a one-letter str);
    the queue and partition are the entry's own, so no op carries them

    code                    fields after the code
    "C" PACKED_APPEND       next_offset int, start int, count int,
                            chunk bin (messages start..start+count-1 in the stores'
                            chunk format, storage.base.pack_run: written as it is)
    "A" APPEND              next_offset int, messages array of
                            [offset int, key nil|str, headers bin, body bin,
                             producer_id nil|str, seq nil|int, ts float]
    "S" SETTLE              offsets array of int
    "M" MARK_DELIVERED      upto int
    "D" DELIVERY_COUNTS     items array of [offset int, count int]
    "P" PUT_PRODUCER        producer_id str, last_seq int
    "R" DROP_PRODUCERS      producer_ids array of str
    "Q" PUT_QUEUE           queue QueueMeta (catalogue only)
    "X" DROP_QUEUE          queue_id int (catalogue only)
    "U" PUT_USER            user UserFields (catalogue only)
    "V" DROP_USER           name str (catalogue only; its grants go with it)
    "G" GRANT_ACL           user str, pattern str, permissions array of str (catalogue only)
    "K" REVOKE_ACL          user str, pattern str, permissions array of str (catalogue only)
    "B" SEED_ADMIN          user UserFields, origin str (catalogue only: the group's first admin)
    "N" SET_DRAINED         node str, drained bool (catalogue only: tandem node drain / undrain)
    "L" SET_PLACEMENT       queue_id int, partition int, nodes array of str, moving bool
                            (catalogue only: tandem partition move)
    "W" SET_GROUP           members array of str, addresses array of str, zones array of str,
                            leaving array of str, respread bool, pins array of
                            [queue_id int, partition int, nodes array of str]
                            (catalogue only: tandem group add / remove)

    QueueMeta: [id int, name str, partitions int, mapper str, ring_size int,
                max_deliveries int, dead_letter_queue nil|str, max_length int,
                owner nil|str]
               owner: the user who declared the queue (dead-lettering needs its
               ``produce`` on dead_letter_queue, broker.security.acl); left out when there is
               none (the node's own queues): 8 items, as a build without owners sends
               them, and reads as none
    UserFields: map str -> value, one key per field of storage.base.UserRecord
                (name str, salt bin, hash bin, role str, params str, ...)

Snapshot (``INSTALL_SNAPSHOT`` data)::

    partition:  [next_offset int, delivered_upto int, producers map str -> int,
                 messages array of [offset int, key nil|str, headers bin, body bin,
                                    producer_id nil|str, seq nil|int, ts float,
                                    delivery_count int]]
                streamed: [next_offset int, delivered_upto int, producers, [], parts int]:
                the messages came before, in ``parts`` SNAPSHOT_CHUNKs (each message as
                above, its delivery count as stored: without the delivered mark's one)
    catalogue:  map {"queues": array of QueueMeta (every queue the catalogue declares),
                     "users": array of UserFields, "acls": array of
                     [user str, pattern str, permissions array of str],
                     "seeded": bool (the group's first admin is applied),
                     "drained": array of str (the members drained for maintenance),
                     "placed": array of [queue_id int, partition int, nodes array of
                               str, moving bool(, static bool)] (the partitions moved off the
                               policy's placement, and those of static queues),
                     "group": the member list (as a SET_GROUP op's items), once changed,
                     "updating": array of [queue_id int, partitions array of int] (the
                                 updates under way: the partitions still to re-map)}
                (a build without users in the log sent the array of QueueMeta alone;
                one without the drain sends no "drained": the set stays as it is; one
                without moves no "placed")
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from enum import IntEnum, StrEnum
from typing import Any

import msgpack

from client.errors import InvalidArgumentError, MalformedFrameError
from client.protocol.codec import MAX_INT
from ha.members import Members
from ha.messages import (
    Alive,
    AppendEntries,
    AppendReply,
    Entry,
    InstallSnapshot,
    Message,
    RequestVote,
    SnapshotAck,
    SnapshotChunk,
    TimeoutNow,
    VoteReply,
)
from storage.base import (
    Append,
    DropProducers,
    DropQueue,
    MarkDelivered,
    MessageRecord,
    PackedRun,
    PartitionState,
    PutProducer,
    PutQueue,
    PutUser,
    QueueMeta,
    AclRecord,
    DropUser,
    GrantAcl,
    RevokeAcl,
    SeedAdmin,
    SetDrained,
    SetGroup,
    SetPlacement,
    SetUpdating,
    UserRecord,
    user_fields,
    user_from_fields,
    ResetPartition,
    SetDeliveryCount,
    Settle,
    StoredMessage,
    WriteOp,
)

Key = tuple[int, int]  # (queue id, partition)
CATALOGUE: Key = (0, 0)


class MessageKind(IntEnum):
    """The first element of a replication message."""

    REQUEST_VOTE = 0
    VOTE_REPLY = 1
    APPEND_ENTRIES = 2
    APPEND_REPLY = 3
    INSTALL_SNAPSHOT = 4
    TIMEOUT_NOW = 5
    ALIVE = 6
    PRE_VOTE = 7
    PRE_VOTE_REPLY = 8
    SNAPSHOT_CHUNK = 9
    SNAPSHOT_ACK = 10


class OpCode(StrEnum):
    """The first element of an op in a log entry payload."""

    PACKED_APPEND = "C"
    APPEND = "A"
    SETTLE = "S"
    MARK_DELIVERED = "M"
    DELIVERY_COUNTS = "D"
    PUT_PRODUCER = "P"
    DROP_PRODUCERS = "R"
    PUT_QUEUE = "Q"
    DROP_QUEUE = "X"
    PUT_USER = "U"
    DROP_USER = "V"
    GRANT_ACL = "G"
    REVOKE_ACL = "K"
    SEED_ADMIN = "B"
    SET_DRAINED = "N"
    SET_PLACEMENT = "L"
    SET_GROUP = "W"
    SET_UPDATING = "Y"


class MalformedReplicationError(MalformedFrameError, ValueError):
    """Replication bytes that do not fit the layouts above: a ``Replicate`` payload, a
    message, a log entry payload or a snapshot.  (A ValueError too, for callers that
    treat every undecodable value alike.)"""

    def __init__(self, message: str) -> None:
        super().__init__(message)


class UnknownMessageKind(MalformedReplicationError):
    """A replication message of a kind this build does not know (a newer build's)."""

    def __init__(self, kind: Any) -> None:
        super().__init__(f"unknown replication message kind {kind!r}")
        self.kind = kind


def _unpack(data: Any, what: str) -> Any:
    if type(data) is not bytes:
        raise MalformedReplicationError(f"{what}: expected bin, got {type(data).__name__}")
    try:
        return msgpack.unpackb(data, raw=False)
    except Exception as exc:  # msgpack raises several types (ValueError, ExtraData, UnicodeDecodeError, ...)
        raise MalformedReplicationError(f"{what} is not msgpack: {exc}") from None


def _array(v: Any, n: int, what: str) -> list[Any]:
    """``v`` if it is an array of at least ``n`` items (a newer build may append some)."""
    if type(v) is not list or len(v) < n:
        raise MalformedReplicationError(f"{what}: expected an array of {n} items")
    return v


def _uint(v: Any, what: str) -> int:
    if type(v) is not int or not 0 <= v <= MAX_INT:
        raise MalformedReplicationError(f"{what}: expected an int in 0 .. 2**63-1, got {v!r:.40}")
    return v


def _int(v: Any, what: str) -> int:
    if type(v) is not int or not -MAX_INT - 1 <= v <= MAX_INT:
        raise MalformedReplicationError(f"{what}: expected a signed 64-bit int, got {v!r:.40}")
    return v


def _str(v: Any, what: str) -> str:
    if type(v) is not str:
        raise MalformedReplicationError(f"{what}: expected a str, got {type(v).__name__}")
    return v


def _opt_str(v: Any, what: str) -> str | None:
    return None if v is None else _str(v, what)


def _bool(v: Any, what: str) -> bool:
    if type(v) is not bool:
        raise MalformedReplicationError(f"{what}: expected a bool, got {type(v).__name__}")
    return v


def _bin(v: Any, what: str) -> bytes:
    if type(v) is not bytes:
        raise MalformedReplicationError(f"{what}: expected bin, got {type(v).__name__}")
    return v


def _opt_bin(v: Any, what: str) -> bytes | None:
    return None if v is None else _bin(v, what)


def _float(v: Any, what: str) -> float:
    if type(v) is float:
        return v
    if type(v) is int:
        return float(v)
    raise MalformedReplicationError(f"{what}: expected a float, got {type(v).__name__}")


# -- messages --------------------------------------------------------------------------------------


def _entry_out(e: Entry) -> list[Any]:
    return [e.term, e.index, e.data, e.origin, e.weak]


def _entry_in(a: Any) -> Entry:
    a = _array(a, 5, "log entry")
    return Entry(_uint(a[0], "entry term"), _uint(a[1], "entry index"), _opt_bin(a[2], "entry data"),
                 _str(a[3], "entry origin"), _bool(a[4], "entry weak"))


def _snapshot_tail(m: InstallSnapshot) -> list[Any]:
    """A snapshot's optional fields: its members (nil: none), then whether it is weak."""
    members = None if m.members is None else [list(m.members.voters), list(m.members.learners)]
    if m.weak:
        return [members, True]
    return [] if members is None else [members]


def _members_in(v: Any) -> Members | None:
    """A snapshot's members (ha.members): [[voter, ...], [learner, ...]], or nil."""
    if v is None:
        return None
    a = _array(v, 2, "snapshot members")
    voters, learners = a[0], a[1]
    if type(voters) is not list or type(learners) is not list:
        raise MalformedReplicationError("snapshot members: expected two arrays of names")
    try:
        return Members(tuple(_str(n, "member") for n in voters), tuple(_str(n, "member") for n in learners))
    except ValueError as exc:
        raise MalformedReplicationError(f"snapshot members: {exc}") from None


def _entries_in(v: Any) -> tuple[Entry, ...]:
    if type(v) is not list:
        raise MalformedReplicationError("AppendEntries: entries are not an array")
    return tuple(_entry_in(e) for e in v)


_ENCODERS: dict[type[Any], Callable[[Any], list[Any]]] = {
    RequestVote: lambda m: [MessageKind.PRE_VOTE if m.pre else MessageKind.REQUEST_VOTE, m.term, m.candidate,
                            m.last_index, m.last_term, m.priority],
    VoteReply: lambda m: [MessageKind.PRE_VOTE_REPLY if m.pre else MessageKind.VOTE_REPLY, m.term, m.voter,
                          m.granted],
    AppendEntries: lambda m: [MessageKind.APPEND_ENTRIES, m.term, m.leader, m.prev_index, m.prev_term,
                              m.prev_origin, [_entry_out(e) for e in m.entries], m.commit],
    AppendReply: lambda m: [MessageKind.APPEND_REPLY, m.term, m.replica, m.success, m.match_index],
    InstallSnapshot: lambda m: [MessageKind.INSTALL_SNAPSHOT, m.term, m.leader, m.index, m.last_term,
                                m.last_origin, m.data, *_snapshot_tail(m)],
    TimeoutNow: lambda m: [MessageKind.TIMEOUT_NOW, m.term, m.leader, m.rank],
    Alive: lambda m: [MessageKind.ALIVE, m.term, m.replica],
    SnapshotChunk: lambda m: [MessageKind.SNAPSHOT_CHUNK, m.term, m.leader, m.index, m.seq, m.data,
                              *((True,) if m.weak else ())],
    SnapshotAck: lambda m: [MessageKind.SNAPSHOT_ACK, m.term, m.replica, m.index, m.seq],
}

_DECODERS: dict[MessageKind, Callable[[list[Any]], Message | SnapshotChunk | SnapshotAck]] = {
    MessageKind.REQUEST_VOTE: lambda a: RequestVote(_uint(a[1], "term"), _str(a[2], "candidate"),
                                                    _uint(a[3], "last_index"), _uint(a[4], "last_term"),
                                                    _uint(a[5], "priority")),
    MessageKind.VOTE_REPLY: lambda a: VoteReply(_uint(a[1], "term"), _str(a[2], "voter"), _bool(a[3], "granted")),
    MessageKind.APPEND_ENTRIES: lambda a: AppendEntries(_uint(a[1], "term"), _str(a[2], "leader"),
                                                        _uint(a[3], "prev_index"), _uint(a[4], "prev_term"),
                                                        _str(a[5], "prev_origin"), _entries_in(a[6]),
                                                        _uint(a[7], "commit")),
    MessageKind.APPEND_REPLY: lambda a: AppendReply(_uint(a[1], "term"), _str(a[2], "replica"),
                                                    _bool(a[3], "success"), _uint(a[4], "match_index")),
    MessageKind.INSTALL_SNAPSHOT: lambda a: InstallSnapshot(_uint(a[1], "term"), _str(a[2], "leader"),
                                                            _uint(a[3], "index"), _uint(a[4], "last_term"),
                                                            _str(a[5], "last_origin"), _opt_bin(a[6], "data"),
                                                            _members_in(a[7]) if len(a) > 7 else None,
                                                            _bool(a[8], "weak") if len(a) > 8 else False),
    MessageKind.TIMEOUT_NOW: lambda a: TimeoutNow(_uint(a[1], "term"), _str(a[2], "leader"), _uint(a[3], "rank")),
    MessageKind.ALIVE: lambda a: Alive(_uint(a[1], "term"), _str(a[2], "replica")),
    MessageKind.PRE_VOTE: lambda a: RequestVote(_uint(a[1], "term"), _str(a[2], "candidate"),
                                                _uint(a[3], "last_index"), _uint(a[4], "last_term"),
                                                _uint(a[5], "priority"), pre=True),
    MessageKind.PRE_VOTE_REPLY: lambda a: VoteReply(_uint(a[1], "term"), _str(a[2], "voter"),
                                                    _bool(a[3], "granted"), pre=True),
    MessageKind.SNAPSHOT_CHUNK: lambda a: SnapshotChunk(_uint(a[1], "term"), _str(a[2], "leader"),
                                                        _uint(a[3], "index"), _uint(a[4], "seq"), _bin(a[5], "data"),
                                                        _bool(a[6], "weak") if len(a) > 6 else False),
    MessageKind.SNAPSHOT_ACK: lambda a: SnapshotAck(_uint(a[1], "term"), _str(a[2], "replica"), _uint(a[3], "index"),
                                                    _uint(a[4], "seq")),
}

#: items per message kind, the kind included
_LENGTHS: dict[MessageKind, int] = {
    MessageKind.REQUEST_VOTE: 6, MessageKind.VOTE_REPLY: 4, MessageKind.APPEND_ENTRIES: 8,
    MessageKind.APPEND_REPLY: 5, MessageKind.INSTALL_SNAPSHOT: 7, MessageKind.TIMEOUT_NOW: 4, MessageKind.ALIVE: 3,
    MessageKind.PRE_VOTE: 6, MessageKind.PRE_VOTE_REPLY: 4, MessageKind.SNAPSHOT_CHUNK: 6,
    MessageKind.SNAPSHOT_ACK: 5,
}


def encode_message(m: Message | SnapshotChunk | SnapshotAck) -> list[Any]:
    """``m`` as the array a ``Replicate`` item carries (packed with the whole payload)."""
    encode = _ENCODERS.get(type(m))
    if encode is None:
        raise TypeError(f"{type(m).__name__} is not a replication message")
    return encode(m)


def decode_message(a: Any) -> Message | SnapshotChunk | SnapshotAck:
    """The message of a ``Replicate`` item; UnknownMessageKind for a kind this build lacks,
    MalformedReplicationError for one that does not fit its layout."""
    a = _array(a, 1, "replication message")
    if type(a[0]) is not int:
        raise MalformedReplicationError(f"replication message: kind is a {type(a[0]).__name__}, not an int")
    try:
        kind = MessageKind(a[0])
    except ValueError:
        raise UnknownMessageKind(a[0]) from None
    _array(a, _LENGTHS[kind], kind.name)
    return _DECODERS[kind](a)


def encode_replicate(items: list[list[Any]]) -> bytes:
    """A ``Replicate`` payload: ``[queue_id, partition, encode_message(m)]`` items."""
    return msgpack.packb(items, use_bin_type=True)


def decode_replicate(payload: bytes) -> list[tuple[int, int, Any]]:
    """The items of a ``Replicate`` payload, messages still undecoded (decode_message);
    MalformedReplicationError if the payload is not an array of such items."""
    items = _unpack(payload, "Replicate payload")
    if type(items) is not list:
        raise MalformedReplicationError("Replicate payload: expected an array")
    out = []
    for item in items:
        if type(item) is not list or len(item) != 3:
            raise MalformedReplicationError("Replicate payload: an item is not [queue_id, partition, message]")
        out.append((_uint(item[0], "queue_id"), _uint(item[1], "partition"), item[2]))
    return out


# -- log entry payloads ------------------------------------------------------------------------------


def _meta_out(q: QueueMeta) -> list[Any]:
    out = [q.id, q.name, q.partitions, q.mapper, q.ring_size, q.max_deliveries, q.dead_letter_queue, q.max_length]
    return out if q.owner is None else [*out, q.owner]


def _meta_in(a: Any) -> QueueMeta:
    a = _array(a, 8, "QueueMeta")
    return QueueMeta(id=_uint(a[0], "queue id"), name=_str(a[1], "queue name"),
                     partitions=_uint(a[2], "partitions"), mapper=_str(a[3], "mapper"),
                     ring_size=_uint(a[4], "ring_size"), max_deliveries=_uint(a[5], "max_deliveries"),
                     dead_letter_queue=_opt_str(a[6], "dead_letter_queue"), max_length=_uint(a[7], "max_length"),
                     owner=_opt_str(a[8], "owner") if len(a) > 8 else None)


def _message_in(m: Any, n: int = 7) -> StoredMessage:
    """A message of an ``APPEND`` op (7 items) or of a snapshot (8: its delivery count too)."""
    m = _array(m, n, "message")
    seq = m[5]
    return StoredMessage(_uint(m[0], "offset"), _opt_str(m[1], "key"), _bin(m[2], "headers"), _bin(m[3], "body"),
                         _opt_str(m[4], "producer_id"), None if seq is None else _int(seq, "seq"),
                         _float(m[6], "ts"), _uint(m[7], "delivery count") if n > 7 else 0)


def _list(v: Any, what: str) -> list[Any]:
    if type(v) is not list:
        raise MalformedReplicationError(f"{what}: expected an array")
    return v


def _pair(v: Any) -> tuple[int, int]:
    v = _array(v, 2, "delivery count")
    return _uint(v[0], "offset"), _uint(v[1], "delivery count")


def _contiguous(messages: Sequence[MessageRecord]) -> bool:
    first = messages[0].offset
    return all(m.offset == first + i for i, m in enumerate(messages))


def encode_ops(ops: list[WriteOp]) -> tuple[bytes, list[WriteOp]]:
    """A log entry's payload: the ops of one partition (or of the catalogue); and the same
    ops with their appends packed (:class:`PackedRun`), to apply here without packing twice.

    An append of consecutive offsets travels as ``PACKED_APPEND``: its chunk is already
    the stores' chunk format, so a replica writes it as it comes, without decoding a
    message.  An append with a gap travels message by message (``APPEND``)."""
    out: list[Any] = []
    applied: list[WriteOp] = []
    for op in ops:
        if isinstance(op, Append):
            msgs = op.messages
            if type(msgs) is not PackedRun and msgs and _contiguous(msgs):
                msgs = PackedRun.of(msgs)
                op = Append(op.queue_id, op.partition, msgs, op.next_offset)
            if type(msgs) is PackedRun:
                out.append([OpCode.PACKED_APPEND, op.next_offset, msgs.start, msgs.length, msgs.payload])
            else:
                out.append([OpCode.APPEND, op.next_offset, [[m.offset, m.key, m.headers_blob, m.body, m.producer_id,
                                                             m.seq, m.ts] for m in msgs]])
            applied.append(op)
            continue
        applied.append(op)
        if isinstance(op, Settle):
            out.append([OpCode.SETTLE, op.offsets])
        elif isinstance(op, MarkDelivered):
            out.append([OpCode.MARK_DELIVERED, op.upto])
        elif isinstance(op, SetDeliveryCount):
            out.append([OpCode.DELIVERY_COUNTS, op.items])
        elif isinstance(op, PutProducer):
            out.append([OpCode.PUT_PRODUCER, op.producer_id, op.last_seq])
        elif isinstance(op, DropProducers):
            out.append([OpCode.DROP_PRODUCERS, op.producer_ids])
        elif isinstance(op, PutQueue):
            out.append([OpCode.PUT_QUEUE, _meta_out(op.queue)])
        elif isinstance(op, DropQueue):
            out.append([OpCode.DROP_QUEUE, op.queue_id])
        elif isinstance(op, PutUser):
            out.append([OpCode.PUT_USER, user_fields(op.user)])
        elif isinstance(op, DropUser):
            out.append([OpCode.DROP_USER, op.name])
        elif isinstance(op, GrantAcl):
            out.append([OpCode.GRANT_ACL, op.acl.user, op.acl.pattern, list(op.acl.permissions)])
        elif isinstance(op, RevokeAcl):
            out.append([OpCode.REVOKE_ACL, op.acl.user, op.acl.pattern, list(op.acl.permissions)])
        elif isinstance(op, SeedAdmin):
            out.append([OpCode.SEED_ADMIN, user_fields(op.user), op.origin])
        elif isinstance(op, SetDrained):
            out.append([OpCode.SET_DRAINED, op.node, op.drained])
        elif isinstance(op, SetPlacement):
            out.append([OpCode.SET_PLACEMENT, *placement_out(op)])
        elif isinstance(op, SetGroup):
            out.append([OpCode.SET_GROUP, *group_out(op)])
        elif isinstance(op, SetUpdating):
            out.append([OpCode.SET_UPDATING, *updating_out(op)])
        else:
            raise TypeError(f"{type(op).__name__} is not a replicated op")
    return msgpack.packb(out, use_bin_type=True), applied


_OP_DECODERS: dict[OpCode, tuple[int, Callable[[int, int, list[Any]], WriteOp]]] = {
    # code -> (items, the code included; the decoder)
    OpCode.PACKED_APPEND: (5, lambda qid, p, a: Append(qid, p, PackedRun(_uint(a[2], "start"), _uint(a[3], "count"),
                                                                         _bin(a[4], "chunk")),
                                                       _uint(a[1], "next_offset"))),
    OpCode.APPEND: (3, lambda qid, p, a: Append(qid, p, [_message_in(m) for m in _list(a[2], "messages")],
                                                _uint(a[1], "next_offset"))),
    OpCode.SETTLE: (2, lambda qid, p, a: Settle(qid, p, [_uint(o, "offset") for o in _list(a[1], "offsets")])),
    OpCode.MARK_DELIVERED: (2, lambda qid, p, a: MarkDelivered(qid, p, _uint(a[1], "upto"))),
    OpCode.DELIVERY_COUNTS: (2, lambda qid, p, a: SetDeliveryCount(qid, p, [_pair(i) for i in _list(a[1], "items")])),
    OpCode.PUT_PRODUCER: (3, lambda qid, p, a: PutProducer(qid, p, _str(a[1], "producer_id"), _int(a[2], "last_seq"))),
    OpCode.DROP_PRODUCERS: (2, lambda qid, p, a: DropProducers(qid, p, [_str(x, "producer_id")
                                                                       for x in _list(a[1], "producer_ids")])),
    OpCode.PUT_QUEUE: (2, lambda _qid, _p, a: PutQueue(_meta_in(a[1]))),
    OpCode.DROP_QUEUE: (2, lambda _qid, _p, a: DropQueue(_uint(a[1], "queue_id"))),
    OpCode.PUT_USER: (2, lambda _qid, _p, a: PutUser(_user_in(a[1]))),
    OpCode.DROP_USER: (2, lambda _qid, _p, a: DropUser(_str(a[1], "user name"))),
    OpCode.GRANT_ACL: (4, lambda _qid, _p, a: GrantAcl(_acl_in(a[1:4]))),
    OpCode.REVOKE_ACL: (4, lambda _qid, _p, a: RevokeAcl(_acl_in(a[1:4]))),
    OpCode.SEED_ADMIN: (3, lambda _qid, _p, a: SeedAdmin(_user_in(a[1]), _str(a[2], "origin"))),
    OpCode.SET_DRAINED: (3, lambda _qid, _p, a: SetDrained(_str(a[1], "node"), _bool(a[2], "drained"))),
    OpCode.SET_PLACEMENT: (5, lambda _qid, _p, a: _placement_in(a[1:])),
    OpCode.SET_GROUP: (7, lambda _qid, _p, a: _group_in(a[1:7])),
    OpCode.SET_UPDATING: (4, lambda _qid, _p, a: _updating_in(a[1:4])),
}


def decode_ops(key: Key, data: bytes) -> list[WriteOp]:
    """The ops of a log entry payload of partition ``key``; MalformedReplicationError if it
    does not fit the layout."""
    qid, p = key
    ops: list[WriteOp] = []
    for item in _list(_unpack(data, "log entry"), "log entry"):
        item = _array(item, 1, "log op")
        try:
            code = OpCode(item[0])
        except (ValueError, TypeError):
            raise MalformedReplicationError(f"unknown log op {item[0]!r:.40}") from None
        n, decode = _OP_DECODERS[code]
        ops.append(decode(qid, p, _array(item, n, f"log op {code.value}")))
    return ops


# -- snapshots ---------------------------------------------------------------------------------------


def encode_snapshot(st: PartitionState) -> bytes:
    """A partition's snapshot: its state as loaded from the store."""
    return msgpack.packb([st.next_offset, st.delivered_upto, st.producers,
                          [[m.offset, m.key, m.headers_blob, m.body, m.producer_id, m.seq, m.ts, m.dc]
                           for m in st.messages]], use_bin_type=True)


def snapshot_ops(key: Key, data: bytes) -> list[WriteOp]:
    """What installing a partition's snapshot writes: the partition replaced by its state
    (streamed: its messages are written already, part by part, :func:`chunk_ops`)."""
    qid, p = key
    snap = _array(_unpack(data, "snapshot"), 4, "snapshot")
    nxt, delivered = _uint(snap[0], "next_offset"), _uint(snap[1], "delivered_upto")
    producers, msgs = snap[2], _list(snap[3], "snapshot messages")
    if type(producers) is not dict or any(type(k) is not str or type(v) is not int for k, v in producers.items()):
        raise MalformedReplicationError("snapshot: producers are not a map of str to int")
    if len(snap) > 4:
        streamed_parts(data)  # (checks the form)
        ops: list[WriteOp] = [Append(qid, p, [], nxt)]
        if delivered:
            ops.append(MarkDelivered(qid, p, delivered))
        ops.extend(PutProducer(qid, p, pid, seq) for pid, seq in producers.items())
        return ops
    full = [_message_in(m, 8) for m in msgs]
    stored = [StoredMessage(m.offset, m.key, m.headers_blob, m.body, m.producer_id, m.seq, m.ts) for m in full]
    ops = [ResetPartition(qid, p)]
    if stored or nxt:
        ops.append(Append(qid, p, stored, nxt))
    if delivered:
        ops.append(MarkDelivered(qid, p, delivered))
    # the stored count excludes the one the delivered mark adds back on load
    counts = [(m.offset, m.dc - (1 if m.offset < delivered else 0)) for m in full]
    if any(dc for _o, dc in counts):
        ops.append(SetDeliveryCount(qid, p, [(o, dc) for o, dc in counts if dc]))
    ops.extend(PutProducer(qid, p, pid, seq) for pid, seq in producers.items())
    return ops


def encode_streamed(st: PartitionState, parts: int) -> bytes:
    """The snapshot that ends a stream of ``parts`` SNAPSHOT_CHUNKs: the partition's state
    without its messages."""
    return msgpack.packb([st.next_offset, st.delivered_upto, st.producers, [], parts], use_bin_type=True)


def streamed_parts(data: bytes) -> int:
    """How many parts came before a snapshot (0: not streamed, it holds its messages)."""
    snap = _list(_unpack(data, "snapshot"), "snapshot")
    if len(snap) <= 4:
        return 0
    if len(snap) != 5 or snap[3] != []:
        raise MalformedReplicationError("streamed snapshot: [next_offset, delivered_upto, producers, [], parts]")
    return _uint(snap[4], "parts")


def encode_chunk(messages: Sequence[StoredMessage]) -> bytes:
    """A SNAPSHOT_CHUNK's data: messages as the store has them (delivery counts as stored)."""
    return msgpack.packb([[m.offset, m.key, m.headers_blob, m.body, m.producer_id, m.seq, m.ts, m.dc]
                          for m in messages], use_bin_type=True)


def chunk_ops(key: Key, data: bytes) -> list[WriteOp]:
    """What writing a SNAPSHOT_CHUNK's messages takes (MalformedReplicationError if it does
    not fit the layout)."""
    qid, p = key
    full = [_message_in(m, 8) for m in _list(_unpack(data, "snapshot part"), "snapshot part")]
    if not full:
        return []
    stored = [StoredMessage(m.offset, m.key, m.headers_blob, m.body, m.producer_id, m.seq, m.ts) for m in full]
    ops: list[WriteOp] = [Append(qid, p, stored, max(m.offset for m in full) + 1)]
    counts = [(m.offset, m.dc) for m in full if m.dc]
    if counts:
        ops.append(SetDeliveryCount(qid, p, counts))
    return ops


def encode_catalogue_snapshot(metas: Iterable[QueueMeta], security: dict[str, Any]) -> bytes:
    """The catalogue's snapshot: every queue it declares, and the users and grants
    (``security``: "users", "acls", "seeded", "drained" as above)."""
    return msgpack.packb({"queues": [_meta_out(m) for m in metas], **security}, use_bin_type=True)


def check_snapshot(key: Key, data: bytes) -> None:
    """MalformedReplicationError unless ``data`` is a snapshot of ``key``'s kind.  Run on a
    snapshot as it arrives: once the core has taken it, the partition's log is gone, and a
    snapshot that then failed to install would leave the node no choice but to stop."""
    if key == CATALOGUE:
        decode_catalogue_snapshot(data)
    else:
        snapshot_ops(key, data)


def decode_catalogue_snapshot(data: bytes) -> tuple[list[QueueMeta], dict[str, Any] | None]:
    """The queues, and the users, grants and seed mark (None from a build that sent queues
    alone), each checked: MalformedReplicationError if anything does not fit."""
    snap = _unpack(data, "catalogue snapshot")
    if type(snap) is list:
        return [_meta_in(a) for a in snap], None
    if type(snap) is not dict:
        raise MalformedReplicationError("catalogue snapshot: expected a map or an array")
    metas = [_meta_in(a) for a in _list(snap.get("queues"), "catalogue snapshot queues")]
    users = [user_fields(_user_in(u)) for u in _list(snap.get("users", []), "catalogue snapshot users")]
    acls = [_acl_in(a) for a in _list(snap.get("acls", []), "catalogue snapshot grants")]
    seeded = snap.get("seeded", False)
    if type(seeded) is not bool:
        raise MalformedReplicationError("catalogue snapshot: seeded is not a bool")
    out = {"users": users, "acls": [[a.user, a.pattern, list(a.permissions)] for a in acls], "seeded": seeded}
    if "drained" in snap:  # (absent from a build without the drain: the drained set stays as it is)
        out["drained"] = [_str(n, "drained node") for n in _list(snap["drained"], "catalogue snapshot drained")]
    if "placed" in snap:
        out["placed"] = [_placement_in(_array(a, 4, "placement")) for a in _list(snap["placed"], "placements")]
    if "group" in snap:
        out["group"] = _group_in(_array(snap["group"], 6, "group"))
    if "updating" in snap:
        out["updating"] = [_updating_in(_array(a, 3, "update")) for a in _list(snap["updating"], "updates")]
    return metas, out


def placement_out(op: SetPlacement) -> list[Any]:
    """A placement as a log entry and the catalogue's snapshot carry it (``static`` only
    when set: the four items of a placement that is not)."""
    out = [op.queue_id, op.partition, list(op.nodes), op.moving]
    return out + [True] if op.static else out


def _placement_in(a: list[Any]) -> SetPlacement:
    """[queue_id, partition, [node, ...], moving(, static)]: a partition's placement, checked."""
    nodes = tuple(_str(n, "placement node") for n in _list(a[2], "placement nodes"))
    names = {n.partition(":")[0] for n in nodes}
    if not nodes or len(names) != len(nodes) or "" in names:
        raise MalformedReplicationError("placement: nodes must be distinct and at least one")
    return SetPlacement(_uint(a[0], "queue_id"), _uint(a[1], "partition"), nodes, _bool(a[3], "moving"),
                        _bool(a[4], "static") if len(a) > 4 else False)


def updating_out(op: SetUpdating) -> list[Any]:
    """A queue's update under way as a log entry and the catalogue's snapshot carry it."""
    return [op.queue_id, list(op.pending), list(op.finished)]


def _updating_in(a: list[Any]) -> SetUpdating:
    """[queue_id, [partition, ...], [finished partition, ...]]: an update's start (the
    partitions to re-map) or partitions done, checked."""
    pending = tuple(_uint(p, "update partition") for p in _list(a[1], "update partitions"))
    finished = tuple(_uint(p, "update partition") for p in _list(a[2], "updated partitions"))
    if len(set(pending)) != len(pending) or len(set(finished)) != len(finished):
        raise MalformedReplicationError("update: a partition is named twice")
    return SetUpdating(_uint(a[0], "queue_id"), pending, finished)


def group_out(op: SetGroup) -> list[Any]:
    """The group's members as a log entry and the catalogue's snapshot carry them."""
    return [list(op.members), list(op.addresses), list(op.zones), list(op.leaving), op.respread,
            [[q, p, list(nodes)] for q, p, nodes in op.pins]]


def _group_in(a: list[Any]) -> SetGroup:
    """[members, addresses, zones, leaving, respread, pins]: the group's members, checked."""
    members = tuple(_str(n, "group member") for n in _list(a[0], "group members"))
    if not members or len(set(members)) != len(members):
        raise MalformedReplicationError("group: members must be distinct and at least one")
    leaving = tuple(_str(n, "leaving member") for n in _list(a[3], "group leaving"))
    if not set(leaving) <= set(members):
        raise MalformedReplicationError("group: a leaving node is not a member")
    addresses = tuple(_str(x, "member address") for x in _list(a[1], "group addresses"))
    for spec in addresses:
        name, _, addr = spec.partition("=")
        host, colon, port = addr.rpartition(":")
        if name not in members or not host or not colon or not port.isdigit() or not 0 < int(port) < 65536:
            raise MalformedReplicationError(f"group: address {spec!r} is not member=host:port")
    zones = tuple(_str(x, "member zone") for x in _list(a[2], "group zones"))
    if any(z.partition("=")[0] not in members or not z.partition("=")[2] for z in zones):
        raise MalformedReplicationError("group: a zone is not member=zone")
    pins = []
    for pin in _list(a[5], "group pins"):
        q, p, nodes = _array(pin, 3, "group pin")
        pins.append(_placement_in([q, p, nodes, False]))
    return SetGroup(members, addresses, zones, leaving, _bool(a[4], "respread"),
                    tuple((x.queue_id, x.partition, x.nodes) for x in pins))


def _user_in(v: Any) -> UserRecord:
    """A user record as :func:`storage.base.user_fields` made it, its fields' types checked."""
    if type(v) is not dict:
        raise MalformedReplicationError("user record: expected a map")
    try:
        user = user_from_fields(v)
    except InvalidArgumentError as exc:
        raise MalformedReplicationError(f"user record: {exc.message}") from None
    _str(user.name, "user name"), _bin(user.salt, "user salt"), _bin(user.hash, "user hash")
    _str(user.role, "user role"), _str(user.params, "user params")
    return user


def _acl_in(v: Any) -> AclRecord:
    """[user, pattern, [permission, ...]]."""
    v = _array(v, 3, "grant")
    return AclRecord(user=_str(v[0], "grant user"), pattern=_str(v[1], "grant pattern"),
                     permissions=tuple(_str(x, "permission") for x in _list(v[2], "grant permissions")))
