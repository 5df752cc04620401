"""Protocol versions: the range this code speaks, what each version added, and the choice of
one for a link.

Every link (client to node, node to node, node to witness) starts with the dialer's range
(``Hello`` / ``PeerHello``: ``min_version``, ``max_version``); the acceptor answers with the
highest version both speak (``Welcome`` / ``PeerWelcome``: ``version``) or refuses the link
with one line naming both ranges and what to do.  On an open link a frame whose opcode a
later version added is neither sent nor taken at an older one (:func:`since`,
:class:`client.protocol.connection.ProtocolConnection`): an older client or node keeps
working at its version, and a request it cannot make is refused on this side, in words.

Optional fields a later version adds to an existing frame travel at any version: a reader
ignores map keys it does not know (:mod:`client.protocol.codec`), and a missing one takes its
default.  Records (positional arrays) never grow: a new field means a new record.

Versions::

    1   the first release (builds 0.1.x): every opcode but those below
    2   FinalizeUpgrade (raise the group's feature level: ``tandem upgrade finalize``);
        PeerTypes (the definitions of the record types two members define differently:
        ha.recordtypes); build, feature levels, the group's level and the record types'
        stamps in PeerHello / PeerWelcome, and the builds and type mismatches in StatusOk
        (optional fields, read by 0.2 and later)
    3   Declare.max_length_bytes, Declare.overflow, Declare.message_ttl and Declare.expires (a
        queue's overflow, its messages' time to live and its own when unused).  Optional fields, but a node of an older build would ignore
        them and make a queue without them: a ``Declare`` that sets one is not sent at version 2
        or below (:func:`field_since`)
    4   exchanges and bindings: DeclareExchange, DeclareExchangeOk, DeleteExchange, Bind,
        Unbind, ListExchanges, Exchanges; Publish.exchange, Publish.routing_key,
        Publish.routing_keys and Publish.mandatory (a publish to an exchange: not sent at version 3 or below) and
        PublishOk.unroutable
    5   streams: Declare.type, Declare.max_age and Declare.max_bytes (not sent at version 4 or
        below: an older node would make a classic queue); Read.start and Read.timestamp (not sent
        at version 4 or below: an older node would read from offset 0); StoreOffset,
        FetchOffset and OffsetOk (named consumers' offsets)
    6   transactions: TxInit, TxInitOk, TxEnd, TxEndOk; Publish.tx and Ack.tx (not sent at
        version 5 or below: an older node would publish and settle at once)
    7   Declare.dead_letter_exchange and Declare.dead_letter_routing_key (not sent at version 6
        or below: an older node would make a queue that drops its dead letters), Subscribe.exclusive
        (an older node would take a plain consumer) and Delete.ready_only (an older node counts
        unsettled messages too)
"""

from __future__ import annotations

from client.errors import UnsupportedProtocolError
from client.protocol.base import Op

#: Protocol versions this code speaks (inclusive range).
MIN_VERSION = 1
MAX_VERSION = 7

#: the version that added an opcode, for those added after version 1
ADDED: dict[Op, int] = {
    Op.FINALIZE_UPGRADE: 2,
    Op.PEER_TYPES: 2,
    Op.DECLARE_EXCHANGE: 4,
    Op.DECLARE_EXCHANGE_OK: 4,
    Op.DELETE_EXCHANGE: 4,
    Op.BIND: 4,
    Op.UNBIND: 4,
    Op.LIST_EXCHANGES: 4,
    Op.EXCHANGES: 4,
    Op.STORE_OFFSET: 5,
    Op.FETCH_OFFSET: 5,
    Op.OFFSET_OK: 5,
    Op.TX_INIT: 6,
    Op.TX_INIT_OK: 6,
    Op.TX_END: 6,
    Op.TX_END_OK: 6,
}
#: optional fields an older build would ignore where it must not: (opcode, field) -> (the version
#: that added it, its default); a frame with such a field off its default needs that version
FIELDS_ADDED: dict[tuple[Op, str], tuple[int, object]] = {
    (Op.DECLARE, "max_length_bytes"): (3, 0),
    (Op.DECLARE, "overflow"): (3, "reject-publish"),
    (Op.DECLARE, "message_ttl"): (3, 0),
    (Op.DECLARE, "expires"): (3, 0),
    (Op.PUBLISH, "exchange"): (4, None),
    (Op.PUBLISH, "routing_key"): (4, ""),
    (Op.PUBLISH, "routing_keys"): (4, []),
    (Op.PUBLISH, "mandatory"): (4, False),
    (Op.DECLARE, "type"): (5, "classic"),
    (Op.DECLARE, "max_age"): (5, 0),
    (Op.DECLARE, "max_bytes"): (5, 0),
    (Op.READ, "start"): (5, ""),
    (Op.READ, "timestamp"): (5, 0),
    (Op.PUBLISH, "tx"): (6, ""),
    (Op.ACK, "tx"): (6, ""),
    (Op.DECLARE, "dead_letter_exchange"): (7, None),
    (Op.DECLARE, "dead_letter_routing_key"): (7, None),
    (Op.SUBSCRIBE, "exclusive"): (7, False),
    (Op.DELETE, "ready_only"): (7, False),
}


def since(op: Op) -> int:
    """The protocol version that added ``op``."""
    return ADDED.get(op, 1)


def field_since(op: Op, frame: object) -> tuple[int, str]:
    """The protocol version ``frame`` needs for the fields it sets, and the first such field
    ("" if none needs more than its opcode)."""
    need, which = 1, ""
    for (fop, name), (version, default) in FIELDS_ADDED.items():
        if fop is op and version > need and getattr(frame, name, default) != default:
            need, which = version, name
    return need, which


def choose_version(peer_min: int, peer_max: int, ours: tuple[int, int] = (MIN_VERSION, MAX_VERSION),
                   *, peer: str = "the peer", me: str = "this node") -> int:
    """The highest version both ranges contain; UnsupportedProtocolError naming both ranges
    and which side to upgrade if there is none."""
    hi = min(peer_max, ours[1])
    lo = max(peer_min, ours[0])
    if hi < lo:
        if peer_max < ours[0]:
            todo = f"{peer} is too old: upgrade it to a build that speaks version {ours[0]} or later"
        else:
            todo = f"{me} is too old: upgrade it to a build that speaks version {peer_min} or later"
        raise UnsupportedProtocolError(
            f"unsupported protocol version: {peer} speaks {peer_min}..{peer_max}, {me} {ours[0]}..{ours[1]}; "
            f"{todo} (see docs/upgrades.md)")
    return hi
