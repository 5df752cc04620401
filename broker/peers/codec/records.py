"""The records log entries and snapshots carry: queues (QueueMeta), users, grants,
placements, the group's members, queue updates, and messages.

::

    QueueMeta: [id int, name str, partitions int, mapper str, ring_size int,
                max_deliveries int, dead_letter_queue nil|str, max_length int,
                owner nil|str, max_length_bytes int, overflow str, message_ttl int, expires int,
                type str, max_age int, max_bytes int,
                dead_letter_exchange nil|str, dead_letter_routing_key nil|str]
               owner: the user who declared the queue (dead-lettering needs its
               ``produce`` on dead_letter_queue, broker.security.acl); max_length_bytes and
               overflow ("reject-publish" | "drop-head"): the queue's overflow; message_ttl:
               milliseconds its messages may wait; expires: milliseconds it may go unused;
               type ("classic" | "stream"), max_age and max_bytes: a stream and its retention;
               dead_letter_exchange and dead_letter_routing_key: where its dead letters are published.
               The last items are left out while they and all after them are at their
               defaults (none, 0, "reject-publish", 0, 0, "classic", 0, 0, none, none): 8 items for a queue with none of them, as a build without
               them sends it, and those left out read as their defaults
    UserFields: map str -> value, one key per field of storage.base.UserRecord
                (name str, salt bin, hash bin, role str, params str, ...)
    Message:   [offset int, key nil|str, headers bin, body bin, producer_id nil|str,
                seq nil|int, ts float(, delivery_count int)]
               the delivery count in a snapshot only (an APPEND op's messages have 7 items)
    Grant:     [user str, pattern str, permissions array of str]
    Placement: [queue_id int, partition int, nodes array of str, moving bool(, static bool)]
    Group:     [members array of str, addresses array of str (member=host:port),
                zones array of str (member=zone), leaving array of str, respread bool,
                pins array of [queue_id int, partition int, nodes array of str]]
    Update:    [queue_id int, partitions array of int, finished array of int]
    Exchange:  [name str, type str, alternate nil|str]
    Binding:   [source str, destination str, to_exchange bool, routing_key str,
                arguments array of [str, str]]
"""

from __future__ import annotations

from typing import Any

from broker.peers.codec.base import (
    MalformedReplicationError,
    _array,
    _bin,
    _bool,
    _float,
    _int,
    _list,
    _opt_str,
    _str,
    _uint,
)
from client.errors import InvalidArgumentError
from storage.base import (
    AclRecord,
    QueueMeta,
    SetGroup,
    SetPlacement,
    SetUpdating,
    StoredMessage,
    UserRecord,
    user_from_fields,
)
from storage.topology import BindingRecord, ExchangeRecord


#: what may follow a QueueMeta's first 8 items, each left out at its default when all after it are
_META_TAIL = (("owner", None), ("max_length_bytes", 0), ("overflow", "reject-publish"), ("message_ttl", 0),
              ("expires", 0), ("type", "classic"), ("max_age", 0), ("max_bytes", 0), ("dead_letter_exchange", None),
              ("dead_letter_routing_key", None))
OVERFLOWS = ("reject-publish", "drop-head")
QUEUE_TYPES = ("classic", "stream")


def _meta_out(q: QueueMeta) -> list[Any]:
    out = [q.id, q.name, q.partitions, q.mapper, q.ring_size, q.max_deliveries, q.dead_letter_queue, q.max_length]
    tail = [getattr(q, name) for name, _default in _META_TAIL]
    while tail and tail[-1] == _META_TAIL[len(tail) - 1][1]:
        tail.pop()
    return out + tail


def _meta_in(a: Any) -> QueueMeta:
    a = _array(a, 8, "QueueMeta")
    overflow = _str(a[10], "overflow") if len(a) > 10 else "reject-publish"
    if overflow not in OVERFLOWS:
        raise MalformedReplicationError(f"QueueMeta: overflow {overflow!r} is not one of {', '.join(OVERFLOWS)}")
    kind = _str(a[13], "type") if len(a) > 13 else "classic"
    if kind not in QUEUE_TYPES:
        raise MalformedReplicationError(f"QueueMeta: type {kind!r} is not one of {', '.join(QUEUE_TYPES)}")
    return QueueMeta(id=_uint(a[0], "queue id"), name=_str(a[1], "queue name"),
                     partitions=_uint(a[2], "partitions"), mapper=_str(a[3], "mapper"),
                     ring_size=_uint(a[4], "ring_size"), max_deliveries=_uint(a[5], "max_deliveries"),
                     dead_letter_queue=_opt_str(a[6], "dead_letter_queue"), max_length=_uint(a[7], "max_length"),
                     owner=_opt_str(a[8], "owner") if len(a) > 8 else None,
                     max_length_bytes=_uint(a[9], "max_length_bytes") if len(a) > 9 else 0, overflow=overflow,
                     message_ttl=_uint(a[11], "message_ttl") if len(a) > 11 else 0,
                     expires=_uint(a[12], "expires") if len(a) > 12 else 0, type=kind,
                     max_age=_uint(a[14], "max_age") if len(a) > 14 else 0,
                     max_bytes=_uint(a[15], "max_bytes") if len(a) > 15 else 0,
                     dead_letter_exchange=_opt_str(a[16], "dead_letter_exchange") if len(a) > 16 else None,
                     dead_letter_routing_key=_opt_str(a[17], "dead_letter_routing_key") if len(a) > 17 else None)


def _message_in(m: Any, n: int = 7) -> StoredMessage:
    """A message of an ``APPEND`` op (7 items) or of a snapshot (8: its delivery count too)."""
    m = _array(m, n, "message")
    seq = m[5]
    return StoredMessage(_uint(m[0], "offset"), _opt_str(m[1], "key"), _bin(m[2], "headers"), _bin(m[3], "body"),
                         _opt_str(m[4], "producer_id"), None if seq is None else _int(seq, "seq"),
                         _float(m[6], "ts"), _uint(m[7], "delivery count") if n > 7 else 0)



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


def exchange_in(a: Any) -> ExchangeRecord:
    a = _array(a, 3, "exchange")
    return ExchangeRecord(name=_str(a[0], "exchange name"), type=_str(a[1], "exchange type"),
                          alternate=_opt_str(a[2], "alternate exchange"))


def binding_out(b: BindingRecord) -> list[Any]:
    return b.fields()


def binding_in(a: Any) -> BindingRecord:
    a = _array(a, 5, "binding")
    args = tuple((_str(p[0], "binding argument"), _str(p[1], "binding argument"))
                 for p in (_array(x, 2, "binding argument") for x in _list(a[4], "binding arguments")))
    return BindingRecord(source=_str(a[0], "binding source"), destination=_str(a[1], "binding destination"),
                         to_exchange=_bool(a[2], "binding to_exchange"), routing_key=_str(a[3], "routing key"),
                         arguments=args)
