"""The frame vocabulary of the Tandem wire protocol, and the one table from opcode to frame.

Every frame and record type is named here, and :data:`FRAME_TYPES` maps each opcode to
its frame class: the codec decodes by it.

The frames are defined by family, one frozen dataclass per opcode, each beside the
comments on its fields: :mod:`client.protocol.session` (handshake, errors, keep-alives),
:mod:`client.protocol.messaging` (queues, publish, partition map, consume, read),
:mod:`client.protocol.admin` (status, operator changes, users and grants),
:mod:`client.protocol.peer` (node to node); the opcodes and the bases are in
:mod:`client.protocol.base`.  This module names them all: ``from client.protocol.frames
import X`` is how the broker and the SDK take them.

On the wire a frame is a msgpack map ``{"op": <Op>, <field>: <value>, ...}``
(see :mod:`client.protocol.codec` for the byte layout).  The fields of the frame classes
are the whole vocabulary: the decoder checks every field's type against their
annotations and builds these objects, so nothing past the decoder sees a free-form dict.
*Records* (messages inside a batch) travel as msgpack arrays, positional in the order
their fields are declared, to keep batches small.

Requests carry ``rid`` (request id, > 0, chosen by the sender, unique among its
outstanding requests); the reply carries the same ``rid``.  ``rid == 0`` means
"no reply expected / not a reply".
"""

from __future__ import annotations

from typing import TypeVar

from client.protocol.admin import (
    AclGrant, AclInfo, AclList, AclRevoke, Acls, ChangeGroup, ChangePartitions, DrainNode, FinalizeUpgrade,
    MemberBuild, MovePartition, PartitionInfo, RemoteNode, ReplicaInfo, SetOption, SetQuorumOverride, Status, StatusOk,
    TypeMismatch, UserDelete, UserInfo, UserList, UserPut, Users, ZoneInfo,
)
from client.protocol.base import Frame, Op, Record
from client.protocol.messaging import (
    Ack, Cancel, Declare, DeclareOk, Delete, Deliver, Delivery, Get, GetOk, ListQueues, MapChanged, Metadata,
    MetadataOk, Nack, PartitionMap, Placement, Produced, ProducedOk, Publish, PublishMessage, PublishOk, Purge,
    PurgeOk, QueueInfo, Queues, Read, ReadOk, Reject, StreamMessage, Subscribe, SubscribeOk, placement_text,
    StoreOffset, FetchOffset, OffsetOk,
)
from client.protocol.exchanges import (Bind, BindingInfo, DeclareExchange, DeclareExchangeOk, DeleteExchange,
                                       ExchangeInfo, Exchanges, ListExchanges, Unbind)
from client.protocol.peer import Forward, ForwardOk, PeerChallenge, PeerHello, PeerProof, PeerTypes, PeerWelcome, \
    Replicate
from client.protocol.transactions import TxEnd, TxEndOk, TxInit, TxInitOk, TxPart
from client.protocol.session import AuthChallenge, AuthResponse, Close, Error, Heartbeat, Hello, Ok, Welcome

__all__ = [
    "FRAME_TYPES", "Frame", "Op", "Record", "expect", "Hello", "AuthChallenge", "AuthResponse", "Welcome", "Error",
    "Close", "Heartbeat", "Ok", "PublishMessage", "Delivery", "StreamMessage", "QueueInfo", "Declare", "DeclareOk",
    "Delete", "Purge", "PurgeOk", "ListQueues", "Queues", "Publish", "PublishOk", "PartitionMap", "Metadata",
    "MetadataOk", "MapChanged", "Subscribe", "SubscribeOk", "Cancel", "Deliver", "Ack", "Nack", "Reject", "Get",
    "GetOk", "Read", "ReadOk", "Produced", "ProducedOk", "Placement", "placement_text", "RemoteNode", "ZoneInfo",
    "ReplicaInfo", "PartitionInfo", "Status", "StatusOk", "SetQuorumOverride", "SetOption", "MovePartition",
    "ChangePartitions", "ChangeGroup", "DrainNode", "FinalizeUpgrade", "MemberBuild", "TypeMismatch", "UserInfo",
    "AclInfo", "UserPut", "UserDelete", "UserList", "Users", "AclGrant", "AclRevoke", "AclList", "Acls", "PeerHello",
    "PeerWelcome", "PeerChallenge", "PeerProof", "PeerTypes", "Replicate", "Forward", "ForwardOk", "BindingInfo",
    "ExchangeInfo", "DeclareExchange", "DeclareExchangeOk", "DeleteExchange", "Bind", "Unbind", "ListExchanges",
    "Exchanges", "StoreOffset", "FetchOffset", "OffsetOk", "TxPart", "TxInit", "TxInitOk", "TxEnd", "TxEndOk",
]

_ALL: list[type[Frame]] = [
        Hello, AuthChallenge, AuthResponse, Welcome, Error, Close, Heartbeat, Ok, Declare, DeclareOk, Delete, Purge, PurgeOk,
        ListQueues, Queues, Publish, PublishOk, Metadata, MetadataOk, MapChanged, Subscribe, SubscribeOk, Cancel, Deliver, Ack,
        Nack, Reject, Get, GetOk, Read, ReadOk, Status, StatusOk, SetQuorumOverride, SetOption, DrainNode, MovePartition,
        ChangeGroup, ChangePartitions, Produced, ProducedOk, FinalizeUpgrade,
        PeerHello, PeerWelcome,
        Replicate, Forward, ForwardOk, PeerChallenge, PeerProof, PeerTypes, UserPut, UserDelete, UserList, Users, AclGrant,
        AclRevoke, AclList, Acls, DeclareExchange, DeclareExchangeOk, DeleteExchange, Bind, Unbind, ListExchanges,
        Exchanges, StoreOffset, FetchOffset, OffsetOk, TxInit, TxInitOk, TxEnd, TxEndOk,
]
FRAME_TYPES: dict[Op, type[Frame]] = {cls.OP: cls for cls in _ALL}
if len(FRAME_TYPES) != len(_ALL):  # (two classes under one opcode: the decoder would know only one)
    raise RuntimeError("two frame classes share an opcode")

F = TypeVar("F", bound=Frame)


def expect(frame: object, cls: type[F]) -> F:
    """``frame`` if it is a ``cls``; else the peer answered out of turn (RemoteProtocolError)."""
    if not isinstance(frame, cls):
        from client.errors import RemoteProtocolError

        raise RemoteProtocolError(f"expected {cls.__name__}, got {type(frame).__name__}")
    return frame
