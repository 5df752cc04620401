"""Log entry payloads: the write ops of one partition (or of the catalogue), each led by
its :class:`OpCode`.

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
    "Y" SET_UPDATING        queue_id int, pending array of int, finished array of int
                            (catalogue only: tandem partition update, the partitions to
                            re-map as it starts, or those done)
    "F" SET_FEATURE_LEVEL   level int (catalogue only: tandem upgrade finalize; written
                            only once every member's build reads it: feature level 2)
    "E" PUT_EXCHANGE        name str, type str, alternate nil|str (catalogue only: feature level 4)
    "I" DROP_EXCHANGE       name str (catalogue only; its bindings go with it)
    "J" SET_BINDING         source str, destination str, to_exchange bool, routing_key str,
                            arguments array of [str, str], bound bool (catalogue only)
    "Z" TRIM                below int (a stream's retention: its chunks that end at or below
                            ``below`` go; feature level 5)

    (QueueMeta, UserFields and the messages' items: codec.records)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Any

import msgpack

from broker.peers.codec.base import (
    Key,
    MalformedReplicationError,
    _array,
    _bin,
    _bool,
    _int,
    _list,
    _str,
    _uint,
    _unpack,
)
from broker.peers.codec.records import (
    _acl_in,
    _group_in,
    _message_in,
    _meta_in,
    _meta_out,
    _placement_in,
    _updating_in,
    _user_in,
    binding_in,
    binding_out,
    exchange_in,
    group_out,
    placement_out,
    updating_out,
)
from storage.base import (
    Append,
    DropProducers,
    DropQueue,
    DropUser,
    GrantAcl,
    MarkDelivered,
    MessageRecord,
    PackedRun,
    PutProducer,
    PutQueue,
    PutUser,
    RevokeAcl,
    SeedAdmin,
    SetDeliveryCount,
    SetDrained,
    SetFeatureLevel,
    SetGroup,
    SetPlacement,
    SetUpdating,
    Settle,
    Trim,
    WriteOp,
    user_fields,
)
from storage.topology import DropExchange, PutExchange, SetBinding


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
    SET_FEATURE_LEVEL = "F"
    PUT_EXCHANGE = "E"
    DROP_EXCHANGE = "I"
    SET_BINDING = "J"
    TRIM = "Z"


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
            item = [OpCode.PUT_PRODUCER, op.producer_id, op.last_seq]
            if op.seqs:
                item.append(_seqs_out(op.seqs))
            out.append(item)
        elif isinstance(op, DropProducers):
            out.append([OpCode.DROP_PRODUCERS, op.producer_ids])
        elif isinstance(op, Trim):
            out.append([OpCode.TRIM, op.below])
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
        elif isinstance(op, SetFeatureLevel):
            out.append([OpCode.SET_FEATURE_LEVEL, op.level])
        elif isinstance(op, PutExchange):
            out.append([OpCode.PUT_EXCHANGE, op.exchange.name, op.exchange.type, op.exchange.alternate])
        elif isinstance(op, DropExchange):
            out.append([OpCode.DROP_EXCHANGE, op.name])
        elif isinstance(op, SetBinding):
            out.append([OpCode.SET_BINDING, *binding_out(op.binding), op.bound])
        else:
            raise TypeError(f"{type(op).__name__} is not a replicated op")
    return msgpack.packb(out, use_bin_type=True), applied


def _seqs_out(seqs: tuple[int, ...]) -> list[int]:
    """A batch's seqs, ascending: the first, then each one's distance from the one before (a
    byte each, mostly)."""
    ordered = sorted(seqs)
    return [ordered[0], *(b - a for a, b in zip(ordered, ordered[1:]))]


def _seqs_in(v: Any) -> tuple[int, ...]:
    items = _list(v, "seqs")
    if not items:
        return ()
    seq = _int(items[0], "seq")
    out = [seq]
    for d in items[1:]:
        seq += _uint(d, "seq step")
        out.append(seq)
    return tuple(out)


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
    OpCode.PUT_PRODUCER: (3, lambda qid, p, a: PutProducer(qid, p, _str(a[1], "producer_id"), _int(a[2], "last_seq"),
                                                           _seqs_in(a[3]) if len(a) > 3 else ())),
    OpCode.DROP_PRODUCERS: (2, lambda qid, p, a: DropProducers(qid, p, [_str(x, "producer_id")
                                                                       for x in _list(a[1], "producer_ids")])),
    OpCode.TRIM: (2, lambda qid, p, a: Trim(qid, p, _uint(a[1], "below"))),
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
    OpCode.SET_FEATURE_LEVEL: (2, lambda _qid, _p, a: SetFeatureLevel(_uint(a[1], "feature level"))),
    OpCode.PUT_EXCHANGE: (4, lambda _qid, _p, a: PutExchange(exchange_in(a[1:4]))),
    OpCode.DROP_EXCHANGE: (2, lambda _qid, _p, a: DropExchange(_str(a[1], "exchange name"))),
    OpCode.SET_BINDING: (7, lambda _qid, _p, a: SetBinding(binding_in(a[1:6]), _bool(a[6], "bound"))),
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
