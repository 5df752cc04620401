"""Frames of the peer port, node to node: the link's handshake, replication, forwarding.

The handshake is hello, the group secret's challenge and proof, and welcome; replication
travels in batches; a client request is forwarded to the node active for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from client.protocol.base import Frame, Op


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerHello(Frame):
    """The dialing node introduces itself on a peer link."""

    OP: ClassVar[Op] = Op.PEER_HELLO
    min_version: int
    max_version: int
    node: str
    store_stamp: str
    priority: int
    votes: int
    client_address: str = ""  # host:port clients reach this node at
    epoch: int = 0  # the latest LockFile epoch the node has seen (see Heartbeat)
    nonce: bytes = b""  # the dialer's challenge-response nonce (ha.peerauth); empty: no group secret
    #: the settings every member must share for partitions to be placed alike (members, replicas,
    #: sync_replicas, zones; broker.config.NodeConfig.placement_settings); "": not said (a witness)
    placement: str = ""
    #: the dialer wants the member addresses of the PeerWelcome, not a link: the acceptor
    #: closes once it has sent it (broker.peers.discovery)
    discover: bool = False
    #: the port the dialer takes peer links on (0: not said); with the link's source address,
    #: where it says it is, for members that find nothing at the address they have for it
    peer_port: int = 0
    #: the dialer's build (ha.upgrade): its product version, the feature levels it supports
    #: ([min, max]) and the group's level as it applied it; "", [], 0: a first-release build
    build: str = ""
    levels: list[int] = field(default_factory=list)
    level: int = 0
    #: the dialer's record types, name -> "version:crc" (ha.recordtypes; {}: a first-release build)
    types: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerWelcome(Frame):
    OP: ClassVar[Op] = Op.PEER_WELCOME
    version: int
    node: str
    store_stamp: str
    priority: int
    votes: int
    client_address: str = ""
    epoch: int = 0  # as PeerHello's
    placement: str = ""  # as PeerHello's
    #: "name=host:port" of the other members whose peer address the acceptor knows (the dialer
    #: proved the group secret first; broker.peers.discovery)
    members: list[str] = field(default_factory=list)
    build: str = ""  # as PeerHello's
    levels: list[int] = field(default_factory=list)
    level: int = 0
    protocol: list[int] = field(default_factory=list)  # the versions the acceptor speaks, [min, max]
    types: dict[str, str] = field(default_factory=dict)  # as PeerHello's


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerChallenge(Frame):
    """The accepting node's answer to PeerHello when the group has a secret: its name and its
    nonce.  Nothing but PeerProof is accepted from the dialer until it proves the secret."""

    OP: ClassVar[Op] = Op.PEER_CHALLENGE
    node: str
    nonce: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerProof(Frame):
    """Peer link handshake: HMAC-SHA256 under the group secret over both nonces, the
    direction, the prover's name and store stamp and the other end's name (ha.peerauth).
    The dialer sends its proof after PeerChallenge; the acceptor sends its own just before
    PeerWelcome."""

    OP: ClassVar[Op] = Op.PEER_PROOF
    proof: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerTypes(Frame):
    """Peer link, once open: this node's definitions of the record types whose stamps differ
    from those the other end's hello or welcome said (ha.recordtypes).  Protocol version 2."""

    OP: ClassVar[Op] = Op.PEER_TYPES
    definitions: dict[str, str]


@dataclass(frozen=True, slots=True, kw_only=True)
class Replicate(Frame):
    """Peer link: the replication messages of any number of partitions, batched per
    link (encoded by :mod:`broker.modes.replicated`)."""

    OP: ClassVar[Op] = Op.REPLICATE
    payload: bytes
    epoch: int = 0  # the sender's LockFile epoch (see Heartbeat): a later one fences the receiver


@dataclass(frozen=True, slots=True, kw_only=True)
class Forward(Frame):
    """Peer link: a client request for a partition (or the queue catalogue) that is
    active on the receiving node.  Answered by ForwardOk or Error with the same rid."""

    OP: ClassVar[Op] = Op.FORWARD
    rid: int
    kind: int  # broker.messaging.forward.ForwardKind
    payload: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class ForwardOk(Frame):
    OP: ClassVar[Op] = Op.FORWARD_OK
    rid: int
    payload: bytes
