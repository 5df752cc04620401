"""Snapshots: a partition's state (whole, or streamed in SNAPSHOT_CHUNKs) and the
catalogue's, as an ``INSTALL_SNAPSHOT`` carries them, and what installing one writes.

Snapshot (``INSTALL_SNAPSHOT`` data; QueueMeta, UserFields and the rest: codec.records)::

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
                                 updates under way: the partitions still to re-map),
                     "level": int (the group's feature level, ha.upgrade; sent only
                              once above 1, so a first-release build reads the rest),
                     "exchanges": array of Exchange, "bindings": array of Binding (the
                                  routing topology; sent only while there is an exchange)}
                (a build without users in the log sent the array of QueueMeta alone;
                one without the drain sends no "drained": the set stays as it is; one
                without moves no "placed")
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import msgpack

from broker.peers.codec.base import (
    CATALOGUE,
    Key,
    MalformedReplicationError,
    _array,
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
    exchange_in,
)
from storage.base import (
    Append,
    MarkDelivered,
    PartitionState,
    PutProducer,
    QueueMeta,
    ResetPartition,
    SetDeliveryCount,
    StoredMessage,
    WriteOp,
    user_fields,
)


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
    if "level" in snap:
        out["level"] = _uint(snap["level"], "catalogue snapshot feature level")
    if "exchanges" in snap:
        out["exchanges"] = [exchange_in(a) for a in _list(snap["exchanges"], "catalogue snapshot exchanges")]
        out["bindings"] = [binding_in(a) for a in _list(snap.get("bindings", []), "catalogue snapshot bindings")]
    return metas, out
