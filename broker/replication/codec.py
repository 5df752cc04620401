"""The replication wire format: messages between replicas, log entry payloads, snapshots.

Everything is msgpack (``use_bin_type=True``; decoded with ``raw=False``).  Arrays
are positional; a field marked *bin* is a msgpack bin, *str* a msgpack str, *nil|x*
may be nil.  Nodes of different builds talk to each other, so no field moves and no
code changes meaning; a new message kind or op code is added at the end, and a
receiver drops a kind it does not know (:class:`UnknownMessageKind`).

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
                            last_origin str, data bin (a snapshot, below)
    5 TIMEOUT_NOW           term int, leader str, rank int
    6 ALIVE                 term int, replica str

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

    QueueMeta: [id int, name str, partitions int, mapper str, ring_size int,
                max_deliveries int, dead_letter_queue nil|str, max_length int]
    UserFields: map str -> value, one key per field of storage.base.UserRecord
                (name str, salt bin, hash bin, role str, params str, ...)

Snapshot (``INSTALL_SNAPSHOT`` data)::

    partition:  [next_offset int, delivered_upto int, producers map str -> int,
                 messages array of [offset int, key nil|str, headers bin, body bin,
                                    producer_id nil|str, seq nil|int, ts float,
                                    delivery_count int]]
    catalogue:  map {"queues": array of QueueMeta (every queue the catalogue declares),
                     "users": array of UserFields, "acls": array of
                     [user str, pattern str, permissions array of str],
                     "seeded": bool (the group's first admin is applied)}
                (a build without users in the log sent the array of QueueMeta alone)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from enum import IntEnum, StrEnum
from typing import Any

import msgpack

from ha.messages import (
    Alive,
    AppendEntries,
    AppendReply,
    Entry,
    InstallSnapshot,
    Message,
    RequestVote,
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


class UnknownMessageKind(ValueError):
    """A replication message of a kind this build does not know (a newer build's)."""

    def __init__(self, kind: Any) -> None:
        super().__init__(f"unknown replication message kind {kind!r}")
        self.kind = kind


# -- messages --------------------------------------------------------------------------------------


def _entry_out(e: Entry) -> list[Any]:
    return [e.term, e.index, e.data, e.origin, e.weak]


def _entry_in(a: list[Any]) -> Entry:
    return Entry(a[0], a[1], a[2], a[3], a[4])


_ENCODERS: dict[type[Any], Callable[[Any], list[Any]]] = {
    RequestVote: lambda m: [MessageKind.REQUEST_VOTE, m.term, m.candidate, m.last_index, m.last_term, m.priority],
    VoteReply: lambda m: [MessageKind.VOTE_REPLY, m.term, m.voter, m.granted],
    AppendEntries: lambda m: [MessageKind.APPEND_ENTRIES, m.term, m.leader, m.prev_index, m.prev_term,
                              m.prev_origin, [_entry_out(e) for e in m.entries], m.commit],
    AppendReply: lambda m: [MessageKind.APPEND_REPLY, m.term, m.replica, m.success, m.match_index],
    InstallSnapshot: lambda m: [MessageKind.INSTALL_SNAPSHOT, m.term, m.leader, m.index, m.last_term,
                                m.last_origin, m.data],
    TimeoutNow: lambda m: [MessageKind.TIMEOUT_NOW, m.term, m.leader, m.rank],
    Alive: lambda m: [MessageKind.ALIVE, m.term, m.replica],
}

_DECODERS: dict[MessageKind, Callable[[list[Any]], Message]] = {
    MessageKind.REQUEST_VOTE: lambda a: RequestVote(a[1], a[2], a[3], a[4], a[5]),
    MessageKind.VOTE_REPLY: lambda a: VoteReply(a[1], a[2], a[3]),
    MessageKind.APPEND_ENTRIES: lambda a: AppendEntries(a[1], a[2], a[3], a[4], a[5],
                                                        tuple(_entry_in(e) for e in a[6]), a[7]),
    MessageKind.APPEND_REPLY: lambda a: AppendReply(a[1], a[2], a[3], a[4]),
    MessageKind.INSTALL_SNAPSHOT: lambda a: InstallSnapshot(a[1], a[2], a[3], a[4], a[5], a[6]),
    MessageKind.TIMEOUT_NOW: lambda a: TimeoutNow(a[1], a[2], a[3]),
    MessageKind.ALIVE: lambda a: Alive(a[1], a[2]),
}


def encode_message(m: Message) -> list[Any]:
    """``m`` as the array a ``Replicate`` item carries (packed with the whole payload)."""
    encode = _ENCODERS.get(type(m))
    if encode is None:
        raise TypeError(f"{type(m).__name__} is not a replication message")
    return encode(m)


def decode_message(a: list[Any]) -> Message:
    """The message of a ``Replicate`` item; UnknownMessageKind for a kind this build lacks."""
    try:
        kind = MessageKind(a[0])
    except ValueError:
        raise UnknownMessageKind(a[0]) from None
    return _DECODERS[kind](a)


def encode_replicate(items: list[list[Any]]) -> bytes:
    """A ``Replicate`` payload: ``[queue_id, partition, encode_message(m)]`` items."""
    return msgpack.packb(items, use_bin_type=True)


def decode_replicate(payload: bytes) -> list[tuple[int, int, Any]]:
    """The items of a ``Replicate`` payload, messages still undecoded (decode_message)."""
    return [(qid, p, raw) for qid, p, raw in msgpack.unpackb(payload, raw=False)]


# -- log entry payloads ------------------------------------------------------------------------------


def _meta_out(q: QueueMeta) -> list[Any]:
    return [q.id, q.name, q.partitions, q.mapper, q.ring_size, q.max_deliveries, q.dead_letter_queue, q.max_length]


def _meta_in(a: list[Any]) -> QueueMeta:
    return QueueMeta(id=a[0], name=a[1], partitions=a[2], mapper=a[3], ring_size=a[4], max_deliveries=a[5],
                     dead_letter_queue=a[6], max_length=a[7])


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
        else:
            raise TypeError(f"{type(op).__name__} is not a replicated op")
    return msgpack.packb(out, use_bin_type=True), applied


_OP_DECODERS: dict[OpCode, Callable[[int, int, list[Any]], WriteOp]] = {
    OpCode.PACKED_APPEND: lambda qid, p, a: Append(qid, p, PackedRun(a[2], a[3], a[4]), a[1]),
    OpCode.APPEND: lambda qid, p, a: Append(qid, p, [StoredMessage(*m) for m in a[2]], a[1]),
    OpCode.SETTLE: lambda qid, p, a: Settle(qid, p, a[1]),
    OpCode.MARK_DELIVERED: lambda qid, p, a: MarkDelivered(qid, p, a[1]),
    OpCode.DELIVERY_COUNTS: lambda qid, p, a: SetDeliveryCount(qid, p, [(o, dc) for o, dc in a[1]]),
    OpCode.PUT_PRODUCER: lambda qid, p, a: PutProducer(qid, p, a[1], a[2]),
    OpCode.DROP_PRODUCERS: lambda qid, p, a: DropProducers(qid, p, list(a[1])),
    OpCode.PUT_QUEUE: lambda _qid, _p, a: PutQueue(_meta_in(a[1])),
    OpCode.DROP_QUEUE: lambda _qid, _p, a: DropQueue(a[1]),
    OpCode.PUT_USER: lambda _qid, _p, a: PutUser(user_from_fields(a[1])),
    OpCode.DROP_USER: lambda _qid, _p, a: DropUser(a[1]),
    OpCode.GRANT_ACL: lambda _qid, _p, a: GrantAcl(AclRecord(user=a[1], pattern=a[2], permissions=tuple(a[3]))),
    OpCode.REVOKE_ACL: lambda _qid, _p, a: RevokeAcl(AclRecord(user=a[1], pattern=a[2], permissions=tuple(a[3]))),
    OpCode.SEED_ADMIN: lambda _qid, _p, a: SeedAdmin(user_from_fields(a[1]), a[2]),
}


def decode_ops(key: Key, data: bytes) -> list[WriteOp]:
    """The ops of a log entry payload of partition ``key``."""
    qid, p = key
    ops: list[WriteOp] = []
    for item in msgpack.unpackb(data, raw=False):
        try:
            code = OpCode(item[0])
        except ValueError:
            raise ValueError(f"unknown log op {item[0]!r}") from None
        ops.append(_OP_DECODERS[code](qid, p, item))
    return ops


# -- snapshots ---------------------------------------------------------------------------------------


def encode_snapshot(st: PartitionState) -> bytes:
    """A partition's snapshot: its state as loaded from the store."""
    return msgpack.packb([st.next_offset, st.delivered_upto, st.producers,
                          [[m.offset, m.key, m.headers_blob, m.body, m.producer_id, m.seq, m.ts, m.dc]
                           for m in st.messages]], use_bin_type=True)


def snapshot_ops(key: Key, data: bytes) -> list[WriteOp]:
    """What installing a partition's snapshot writes: the partition replaced by its state."""
    qid, p = key
    nxt, delivered, producers, msgs = msgpack.unpackb(data, raw=False)
    stored = [StoredMessage(*m[:7]) for m in msgs]
    ops: list[WriteOp] = [ResetPartition(qid, p)]
    if stored or nxt:
        ops.append(Append(qid, p, stored, nxt))
    if delivered:
        ops.append(MarkDelivered(qid, p, delivered))
    # the stored count excludes the one the delivered mark adds back on load
    counts = [(m[0], m[7] - (1 if m[0] < delivered else 0)) for m in msgs]
    if any(dc for _o, dc in counts):
        ops.append(SetDeliveryCount(qid, p, [(o, dc) for o, dc in counts if dc]))
    ops.extend(PutProducer(qid, p, pid, seq) for pid, seq in producers.items())
    return ops


def encode_catalogue_snapshot(metas: Iterable[QueueMeta], security: dict[str, Any]) -> bytes:
    """The catalogue's snapshot: every queue it declares, and the users and grants
    (``security``: "users", "acls", "seeded" as above)."""
    return msgpack.packb({"queues": [_meta_out(m) for m in metas], **security}, use_bin_type=True)


def decode_catalogue_snapshot(data: bytes) -> tuple[list[QueueMeta], dict[str, Any] | None]:
    """The queues, and the users and grants (None from a build that sent queues alone)."""
    snap = msgpack.unpackb(data, raw=False)
    if isinstance(snap, list):
        return [_meta_in(a) for a in snap], None
    security = {k: v for k, v in snap.items() if k != "queues"}
    return [_meta_in(a) for a in snap["queues"]], security
