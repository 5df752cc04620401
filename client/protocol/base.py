"""The opcodes of the Tandem wire protocol and the base classes of its frames and records.

:class:`Op` is the one table of opcodes; the frames themselves are in the family modules
beside this one, and :mod:`client.protocol.frames` maps each opcode to its frame.
"""

from __future__ import annotations

from enum import IntEnum
from typing import ClassVar


class Op(IntEnum):
    # session
    HELLO = 1
    WELCOME = 2
    ERROR = 3
    CLOSE = 4
    HEARTBEAT = 5
    OK = 6
    AUTH_CHALLENGE = 7
    AUTH_RESPONSE = 8
    # queues
    DECLARE = 10
    DECLARE_OK = 11
    DELETE = 12
    PURGE = 13
    PURGE_OK = 14
    LIST_QUEUES = 15
    QUEUES = 16
    # exchanges and bindings (protocol version 4)
    DECLARE_EXCHANGE = 17
    DECLARE_EXCHANGE_OK = 18
    DELETE_EXCHANGE = 19
    BIND = 25
    UNBIND = 26
    LIST_EXCHANGES = 27
    EXCHANGES = 28
    # publish
    PUBLISH = 20
    PUBLISH_OK = 21
    # partition map (durable connections)
    METADATA = 22
    METADATA_OK = 23
    MAP_CHANGED = 24
    # consume
    SUBSCRIBE = 30
    SUBSCRIBE_OK = 31
    CANCEL = 32
    DELIVER = 33
    ACK = 40
    NACK = 41
    REJECT = 42
    GET = 43
    GET_OK = 44
    READ = 45
    READ_OK = 46
    PRODUCED = 47
    PRODUCED_OK = 48
    # node status (any user)
    STATUS = 50
    STATUS_OK = 51
    SET_QUORUM_OVERRIDE = 52
    SET_OPTION = 53
    DRAIN_NODE = 54
    MOVE_PARTITION = 55
    CHANGE_GROUP = 56
    CHANGE_PARTITIONS = 57
    FINALIZE_UPGRADE = 58  # protocol version 2
    # node <-> node (peer port)
    PEER_HELLO = 60
    PEER_WELCOME = 61
    REPLICATE = 62
    FORWARD = 63
    FORWARD_OK = 64
    PEER_CHALLENGE = 65
    PEER_PROOF = 66
    PEER_TYPES = 67  # protocol version 2
    # users and grants (the group's; see docs/security.md)
    USER_PUT = 70
    USER_DELETE = 71
    USER_LIST = 72
    USERS = 73
    ACL_GRANT = 74
    ACL_REVOKE = 75
    ACL_LIST = 76
    ACLS = 77
    # named stream offsets (protocol version 5)
    STORE_OFFSET = 80
    FETCH_OFFSET = 81
    OFFSET_OK = 82
    # transactions (protocol version 6)
    TX_INIT = 83
    TX_INIT_OK = 84
    TX_END = 85
    TX_END_OK = 86


class Record:
    """A value inside a frame encoded as a positional msgpack array.

    The per-message records (PublishMessage, Delivery, StreamMessage) are not
    frozen: a batch builds thousands of them and a frozen dataclass's
    ``__init__`` costs a ``object.__setattr__`` per field.  Treat them as
    values all the same.
    """

    __slots__ = ()


class Frame:
    """Base of every frame; ``OP`` is the opcode it travels under."""

    __slots__ = ()
    OP: ClassVar[Op]
