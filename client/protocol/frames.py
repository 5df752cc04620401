"""Frame types of the Tandem wire protocol, one frozen dataclass per opcode.

On the wire a frame is a msgpack map ``{"op": <Op>, <field>: <value>, ...}``
(see :mod:`client.protocol.codec` for the byte layout).  Fields named here are
the whole vocabulary: the decoder checks every field's type against the
annotations below and builds these objects, so nothing past the decoder sees a
free-form dict.  *Records* (messages inside a batch) travel as msgpack arrays,
positional in the order their fields are declared, to keep batches small.

Requests carry ``rid`` (request id, > 0, chosen by the sender, unique among its
outstanding requests); the reply carries the same ``rid``.  ``rid == 0`` means
"no reply expected / not a reply".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import ClassVar, TypeVar


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
    # node <-> node (peer port)
    PEER_HELLO = 60
    PEER_WELCOME = 61
    REPLICATE = 62
    FORWARD = 63
    FORWARD_OK = 64
    PEER_CHALLENGE = 65
    PEER_PROOF = 66
    # users and grants (the group's; see docs/security.md)
    USER_PUT = 70
    USER_DELETE = 71
    USER_LIST = 72
    USERS = 73
    ACL_GRANT = 74
    ACL_REVOKE = 75
    ACL_LIST = 76
    ACLS = 77


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


# -- records -------------------------------------------------------------------


@dataclass(slots=True)
class PublishMessage(Record):
    """One message in a publish batch: ``[key, headers, body, seq]``."""

    key: str | None
    headers: dict[str, str]
    body: bytes
    seq: int | None = None


@dataclass(slots=True)
class Delivery(Record):
    """One delivered message.  ``tag`` is unique on its connection."""

    tag: int
    partition: int
    offset: int
    key: str | None
    headers: dict[str, str]
    body: bytes
    redelivered: bool
    delivery_count: int
    timestamp: float
    id: str


@dataclass(slots=True)
class StreamMessage(Record):
    """A message read by offset (not consumed)."""

    partition: int
    offset: int
    key: str | None
    headers: dict[str, str]
    body: bytes
    timestamp: float
    id: str


@dataclass(frozen=True, slots=True)
class QueueInfo(Record):
    name: str
    partitions: int
    mapper: str
    ring_size: int
    max_deliveries: int
    dead_letter_queue: str | None
    max_length: int
    ready: int
    unacked: int
    consumers: int
    published: int
    delivered: int
    acked: int


# -- session -------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Hello(Frame):
    """The client introduces itself and starts authenticating: ``mechanism`` names how
    (``SCRAM-SHA-256``, the only one) and ``auth`` carries its first message (SCRAM's
    client-first-message, :mod:`client.scram`).  No password travels on the wire."""

    OP: ClassVar[Op] = Op.HELLO
    min_version: int
    max_version: int
    client_name: str
    user: str
    mechanism: str = ""
    auth: str = ""
    heartbeat: float = 10.0
    #: a monitoring session (``tandem status``): a node that serves nothing (a shared-mode
    #: passive) accepts it for Status alone instead of refusing the connection
    observe: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class AuthChallenge(Frame):
    """Node -> client after Hello: SCRAM's server-first-message (nonce, salt, iterations)."""

    OP: ClassVar[Op] = Op.AUTH_CHALLENGE
    data: str


@dataclass(frozen=True, slots=True, kw_only=True)
class AuthResponse(Frame):
    """Client -> node: SCRAM's client-final-message (with the client's proof)."""

    OP: ClassVar[Op] = Op.AUTH_RESPONSE
    data: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Welcome(Frame):
    """The handshake succeeded.  ``auth``: SCRAM's server-final-message (the node's
    signature), which the client checks before it trusts the node."""

    OP: ClassVar[Op] = Op.WELCOME
    version: int
    node: str
    heartbeat: float
    max_frame_size: int
    max_message_size: int
    auth: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Error(Frame):
    """An error, for request ``rid`` (0: for the connection)."""

    OP: ClassVar[Op] = Op.ERROR
    rid: int
    code: int
    message: str
    active_hint: str | None = None
    next_seq: int | None = None  # OutOfOrderSequence: the seq the partition expects next


@dataclass(frozen=True, slots=True, kw_only=True)
class Close(Frame):
    OP: ClassVar[Op] = Op.CLOSE
    code: int = 0
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat(Frame):
    """A keep-alive.  On a peer link of a LockFile pair it also carries the sender's lock
    epoch and HA state, and is sent at once on every change of that state (with the state
    before it); elsewhere the fields keep their defaults."""

    OP: ClassVar[Op] = Op.HEARTBEAT
    epoch: int = 0  # the latest lock epoch the sender has seen (0: none, or no LockFile)
    ha_state: str = ""  # the sender's HA state (ha.lockfile.HaState), "" without one
    ha_previous: str = ""  # its state before the change this frame reports ("" if none)
    #: the partitions the sender serves, [queue id, partition, term, ...], in a group with more
    #: members than copies (broker.peers.foreign); empty elsewhere
    actives: list[int] = field(default_factory=list)
    #: the availability zone whose lost quorum keeps the sender's HA services off ("" none):
    #: its peers rank it as drained while it is (broker.peers.peers)
    ha_off: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Ok(Frame):
    OP: ClassVar[Op] = Op.OK
    rid: int


# -- queues --------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Declare(Frame):
    OP: ClassVar[Op] = Op.DECLARE
    rid: int
    queue: str
    partitions: int = 1
    mapper: str = ""  # "": the default (a new queue) or the queue's own (an existing one)
    ring_size: int = 1024
    max_deliveries: int = 0
    dead_letter_queue: str | None = None
    max_length: int = 0
    #: ``static`` distribution: one node list per partition, separated by ";" (nodes by ",",
    #: each ``name``, ``name:sync`` or ``name:async``); "": ``dynamic``, the group's policy
    placement: str = ""


#: a declare's explicit node lists: one sequence of nodes per partition, or their text form
Placement = Sequence[Sequence[str]] | str | None


def placement_text(placement: Placement) -> str:
    """``Declare.placement`` for a client's ``placement`` argument: lists joined by ";",
    nodes by "," (a str as it is; None: "")."""
    if placement is None or isinstance(placement, str):
        return placement or ""
    return ";".join(",".join(nodes) if not isinstance(nodes, str) else nodes for nodes in placement)


@dataclass(frozen=True, slots=True, kw_only=True)
class DeclareOk(Frame):
    OP: ClassVar[Op] = Op.DECLARE_OK
    rid: int
    queue: QueueInfo
    created: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Delete(Frame):
    OP: ClassVar[Op] = Op.DELETE
    rid: int
    queue: str
    if_empty: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Purge(Frame):
    OP: ClassVar[Op] = Op.PURGE
    rid: int
    queue: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PurgeOk(Frame):
    OP: ClassVar[Op] = Op.PURGE_OK
    rid: int
    purged: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ListQueues(Frame):
    OP: ClassVar[Op] = Op.LIST_QUEUES
    rid: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Queues(Frame):
    OP: ClassVar[Op] = Op.QUEUES
    rid: int
    queues: list[QueueInfo] = field(default_factory=list)


# -- publish -------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Publish(Frame):
    """A batch of messages for one queue; confirmed as a whole by PublishOk."""

    OP: ClassVar[Op] = Op.PUBLISH
    rid: int
    queue: str
    messages: list[PublishMessage]
    producer_id: str | None = None
    #: All messages go to this partition, and their ``seq`` count 0, 1, 2, ... per
    #: (producer, partition) with no gap: a batch that would leave one is refused with
    #: OutOfOrderSequence (and the partition's next expected sequence), never stored.  An empty
    #: batch asks for that next sequence.  None: the node maps each message, and a
    #: producer's sequences need only increase.
    partition: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PublishOk(Frame):
    """Every message of batch ``rid`` is stored per the durability policy.

    ``duplicates`` counts messages whose (producer_id, seq) was already stored:
    confirmed again, not stored twice.
    """

    OP: ClassVar[Op] = Op.PUBLISH_OK
    rid: int
    stored: int
    duplicates: int = 0
    next_seq: int = 0  # with ``partition``: the producer's next sequence there (0: it holds none)


@dataclass(frozen=True, slots=True)
class PartitionMap(Record):
    """Where a queue's partitions are served: ``actives[p]`` names the node active for
    partition p ("" while none is), ``addresses`` maps node names to client host:port."""

    queue: QueueInfo
    actives: list[str]
    addresses: dict[str, str]


@dataclass(frozen=True, slots=True, kw_only=True)
class Metadata(Frame):
    """Ask for the partition map of ``queue``.  The session then sends MapChanged
    (no rid) whenever a partition of any queue gets a new active or loses it."""

    OP: ClassVar[Op] = Op.METADATA
    rid: int
    queue: str


@dataclass(frozen=True, slots=True, kw_only=True)
class MetadataOk(Frame):
    """``quorum``: the answering node has node quorum.  False: its partitions are
    Unavailable there and its actives are not to be trusted over a node with quorum
    (a client asks another node)."""

    OP: ClassVar[Op] = Op.METADATA_OK
    rid: int
    map: PartitionMap
    quorum: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class MapChanged(Frame):
    """Pushed to sessions that asked for a partition map: ask again."""

    OP: ClassVar[Op] = Op.MAP_CHANGED
    node: str


# -- consume -------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Subscribe(Frame):
    OP: ClassVar[Op] = Op.SUBSCRIBE
    rid: int
    queue: str
    prefetch: int = 256


@dataclass(frozen=True, slots=True, kw_only=True)
class SubscribeOk(Frame):
    OP: ClassVar[Op] = Op.SUBSCRIBE_OK
    rid: int
    consumer: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Cancel(Frame):
    OP: ClassVar[Op] = Op.CANCEL
    rid: int
    consumer: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Deliver(Frame):
    OP: ClassVar[Op] = Op.DELIVER
    consumer: int
    messages: list[Delivery]


@dataclass(frozen=True, slots=True, kw_only=True)
class Ack(Frame):
    """Settle deliveries.  ``multiple``: every outstanding tag <= max(tags)."""

    OP: ClassVar[Op] = Op.ACK
    rid: int
    tags: list[int]
    multiple: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Nack(Frame):
    OP: ClassVar[Op] = Op.NACK
    rid: int
    tags: list[int]
    multiple: bool = False
    requeue: bool = True
    #: false: the application never saw these (buffered in the client when it
    #: cancelled or closed): requeue without counting the delivery
    delivered: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class Reject(Frame):
    """Settle deliveries as failed: dead-letter them (or drop, without a DLQ)."""

    OP: ClassVar[Op] = Op.REJECT
    rid: int
    tags: list[int]
    multiple: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Get(Frame):
    OP: ClassVar[Op] = Op.GET
    rid: int
    queue: str
    auto_ack: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class GetOk(Frame):
    OP: ClassVar[Op] = Op.GET_OK
    rid: int
    message: Delivery | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Read(Frame):
    """Read partition ``partition`` of ``queue`` from ``offset`` without consuming."""

    OP: ClassVar[Op] = Op.READ
    rid: int
    queue: str
    partition: int
    offset: int = 0
    max_messages: int = 1000


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadOk(Frame):
    """``next_offset``: where the next read continues; ``end_offset``: the log's end."""

    OP: ClassVar[Op] = Op.READ_OK
    rid: int
    messages: list[StreamMessage]
    next_offset: int
    end_offset: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Produced(Frame):
    """Which of ``producer``'s messages partition ``partition`` of ``queue`` stores from
    ``offset`` on (a restore's look for a producer's resends)."""

    OP: ClassVar[Op] = Op.PRODUCED
    rid: int
    queue: str
    partition: int
    producer: str
    offset: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ProducedOk(Frame):
    """``last``: the producer's last sequence number the partition committed (nil: none);
    ``seqs``: its sequence numbers stored from the offset on; ``covered``: every message from
    the offset on is still stored (settled ones are not), so a seq not in ``seqs`` is not there."""

    OP: ClassVar[Op] = Op.PRODUCED_OK
    rid: int
    last: int | None
    covered: bool
    seqs: list[int]


@dataclass(frozen=True, slots=True)
class RemoteNode(Record):
    """What a node knows of another member of its group."""

    name: str
    state: str  # Undiscovered, Discovered, Up, Down, DuplicateLocation, DuplicateTimestamp, UnsupportedProtocol,
    #        MismatchedSettings
    address: str
    priority: int
    votes: int
    store_stamp: str
    client_address: str = ""  # host:port its clients use ("" until its link came up)


@dataclass(frozen=True, slots=True)
class ZoneInfo(Record):
    """An availability zone the answering node is in, and its quorum as that node counts it."""

    name: str
    state: str  # Active, Partial, Disabled (Disabled: the node's HA services are off)
    up_votes: int
    total_votes: int
    policy: str  # majority, percentage:P, min_votes:N, disabled
    members: list[str]  # those of the group now


@dataclass(frozen=True, slots=True)
class ReplicaInfo(Record):
    """One replica of a partition, as the partition's active sees it."""

    node: str
    kind: str  # sync (votes) or async (learner)
    match: int  # last log index known to be on it
    lag: int  # entries behind the active
    lag_seconds: float = 0.0  # how long ago the active wrote the first entry it lacks


@dataclass(frozen=True, slots=True)
class PartitionInfo(Record):
    """A partition as one node sees it (``tandem status``)."""

    queue: str  # "" for the group's queue catalogue
    partition: int
    state: str  # the partition's state as this node knows it: Active (it has an active) or Unavailable
    role: str  # this node's role: active, follower, candidate, learner
    active: str  # the active this node knows of ("" none)
    term: int
    commit: int
    applied: int
    last_index: int
    replicas: list[ReplicaInfo]
    #: where its definition stands here (ha.partition): LocalEnabled (a copy here), or, for a
    #: partition held elsewhere, RemoteEnabled (its active known) or RemoteDefined
    status: str = ""
    #: its queue was declared with explicit node lists (``static`` distribution)
    static: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Status(Frame):
    OP: ClassVar[Op] = Op.STATUS
    rid: int


@dataclass(frozen=True, slots=True, kw_only=True)
class StatusOk(Frame):
    """The answering node and its view of the group."""

    OP: ClassVar[Op] = Op.STATUS_OK
    rid: int
    node: str
    version: str
    store_stamp: str
    priority: int
    votes: int
    quorum_state: str  # Active, Partial, Disabled
    quorum_policy: str
    quorum_override: int | None
    remotes: list[RemoteNode]
    partitions: list[PartitionInfo] = field(default_factory=list)
    events: list[str] = field(default_factory=list)  # recent HA events, oldest first
    discarded: int = 0  # HA-1014: log entries this node has discarded since it started
    designated_primary: bool = False
    discarded_messages: int = 0  # HA-1014: messages in those entries
    console: str = ""  # the node's management console (http[s]://host:port/), "" if it serves none
    mode: str = "replicated"  # replicated | shared | single
    arbiter: str = "majority"  # majority | lockfile | witness (who decides the active of two nodes)
    ha_state: str = ""  # shared mode and the LockFile arbiter: this node's HA state ("" otherwise)
    epoch: int = 0  # the activation (shared) or lock (lockfile) epoch this node last served or saw
    lock_holder: str = ""  # the node holding the lock or lease as this node knows it ("" none/unknown)
    drained: list[str] = field(default_factory=list)  # the group's members drained for maintenance
    zones: list[str] = field(default_factory=list)  # "name=zone" of every member (the node's zones setting)
    #: the partitions this node holds no copy of, as it knows them (broker.peers.foreign): status
    #: RemoteEnabled (an active is known) or RemoteDefined, replicas are the nodes holding it
    foreign: list[PartitionInfo] = field(default_factory=list)
    #: the moves under way (tandem partition move): "queue/partition node,node,..." (the new list)
    moving: list[str] = field(default_factory=list)
    #: every member of the group, this node included (tandem group add / remove change it)
    members: list[str] = field(default_factory=list)
    #: the group change under way ("" none): "node4 joining" or "node1 leaving", partitions re-spreading
    group_change: str = ""
    #: the updates under way (tandem partition update): "queue p,p,..." (the partitions still to re-map)
    updating: list[str] = field(default_factory=list)
    #: the availability zones this node is in (the node is Disabled while any of them is)
    availability_zones: list[ZoneInfo] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class SetQuorumOverride(Frame):
    """Operator override of the node quorum: at least ``nodes`` members up (None: back to the
    policy).  Temporary, logged loudly; answered with StatusOk."""

    OP: ClassVar[Op] = Op.SET_QUORUM_OVERRIDE
    rid: int
    nodes: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SetOption(Frame):
    """Operator change of a node setting at runtime: ``priority`` (0-3) or
    ``designated_primary`` (1 on, 0 off).  Logged loudly; answered with StatusOk."""

    OP: ClassVar[Op] = Op.SET_OPTION
    rid: int
    name: str
    value: int


@dataclass(frozen=True, slots=True, kw_only=True)
class MovePartition(Frame):
    """Operator: place partition ``partition`` of ``queue`` on ``nodes`` (priority order,
    group members): its copies move there while it runs.  Group state, applied by every
    member; the admin permission.  Answered with StatusOk once the move is applied here
    (the copies move after: its status shows Replicating, then Migrating, then Active)."""

    OP: ClassVar[Op] = Op.MOVE_PARTITION
    rid: int
    queue: str
    partition: int
    nodes: list[str]
    #: once there, copy every replica of the list afresh from the active, one at a time (also
    #: on the list it is on already); ``moving`` in StatusOk names it until done
    force_replication: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ChangePartitions(Frame):
    """Operator: ``action`` "add" gives ``queue`` ``count`` partitions more (``placement``:
    their node lists, as a declare's, for a queue declared with lists); "update" re-maps
    every message of it by its data mapper (``mapper``: installed first; "" keeps its own).
    Group state, applied by every member; the admin permission.  Answered with StatusOk once
    the change is applied here (``updating`` lists the updates under way)."""

    OP: ClassVar[Op] = Op.CHANGE_PARTITIONS
    rid: int
    queue: str
    action: str
    count: int = 0
    mapper: str = ""
    placement: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ChangeGroup(Frame):
    """Operator: ``action`` "add" puts ``node`` (its peer port at ``address``, host:port; in
    ``zone`` where the group has zones) among the group's members, "remove" takes it out;
    either way the partitions re-spread over the members.  Group state, applied by every
    member; the admin permission.  Answered with StatusOk once the change is applied here
    (its ``group_change`` says while partitions re-spread)."""

    OP: ClassVar[Op] = Op.CHANGE_GROUP
    rid: int
    action: str
    node: str
    address: str = ""
    zone: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class DrainNode(Frame):
    """Operator: drain group member ``node`` for maintenance (``drained`` true: its
    partitions' actives move to other members) or undrain it (false).  Group state, applied
    by every member; the admin permission.  Answered with StatusOk once applied here."""

    OP: ClassVar[Op] = Op.DRAIN_NODE
    rid: int
    node: str
    drained: bool


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
    #: sync_replicas, zones; broker.peers.peers.placement_settings); "": not said (a witness)
    placement: str = ""
    #: the dialer wants the member addresses of the PeerWelcome, not a link: the acceptor
    #: closes once it has sent it (broker.peers.discovery)
    discover: bool = False
    #: the port the dialer takes peer links on (0: not said); with the link's source address,
    #: where it says it is, for members that find nothing at the address they have for it
    peer_port: int = 0


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


@dataclass(frozen=True, slots=True)
class UserInfo(Record):
    name: str
    role: str  # admin, monitor, user


@dataclass(frozen=True, slots=True)
class AclInfo(Record):
    user: str
    pattern: str  # a queue name glob: orders.*, *
    permissions: list[str]  # produce, consume, browse, configure, admin


@dataclass(frozen=True, slots=True, kw_only=True)
class UserPut(Frame):
    """Create a user (``mode`` "create": refused if it exists), change its password
    (``mode`` "password": the role stays; refused if it does not exist) or store it as given
    (``mode`` "put").  Needs the ``admin`` permission; answered with Ok."""

    OP: ClassVar[Op] = Op.USER_PUT
    rid: int
    name: str
    password: str
    role: str = "user"
    mode: str = "create"


@dataclass(frozen=True, slots=True, kw_only=True)
class UserDelete(Frame):
    """Delete a user and its grants (its sessions end).  Answered with Ok."""

    OP: ClassVar[Op] = Op.USER_DELETE
    rid: int
    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class UserList(Frame):
    """The group's users.  Answered with Users."""

    OP: ClassVar[Op] = Op.USER_LIST
    rid: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Users(Frame):
    OP: ClassVar[Op] = Op.USERS
    rid: int
    users: list[UserInfo]


@dataclass(frozen=True, slots=True, kw_only=True)
class AclGrant(Frame):
    """Grant ``permissions`` on the queues matching ``pattern`` to ``user`` (added to what it
    holds there).  Answered with Ok."""

    OP: ClassVar[Op] = Op.ACL_GRANT
    rid: int
    user: str
    pattern: str
    permissions: list[str]


@dataclass(frozen=True, slots=True, kw_only=True)
class AclRevoke(Frame):
    """Take ``permissions`` on ``pattern`` from ``user``.  Answered with Ok."""

    OP: ClassVar[Op] = Op.ACL_REVOKE
    rid: int
    user: str
    pattern: str
    permissions: list[str]


@dataclass(frozen=True, slots=True, kw_only=True)
class AclList(Frame):
    """The grants (of ``user``; of every user when None).  Answered with Acls."""

    OP: ClassVar[Op] = Op.ACL_LIST
    rid: int
    user: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Acls(Frame):
    OP: ClassVar[Op] = Op.ACLS
    rid: int
    acls: list[AclInfo]


_ALL: list[type[Frame]] = [
        Hello, AuthChallenge, AuthResponse, Welcome, Error, Close, Heartbeat, Ok, Declare, DeclareOk, Delete, Purge, PurgeOk,
        ListQueues, Queues, Publish, PublishOk, Metadata, MetadataOk, MapChanged, Subscribe, SubscribeOk, Cancel, Deliver, Ack,
        Nack, Reject, Get, GetOk, Read, ReadOk, Status, StatusOk, SetQuorumOverride, SetOption, DrainNode, MovePartition,
        ChangeGroup, ChangePartitions, Produced, ProducedOk,
        PeerHello, PeerWelcome,
        Replicate, Forward, ForwardOk, PeerChallenge, PeerProof, UserPut, UserDelete, UserList, Users, AclGrant,
        AclRevoke, AclList, Acls,
]
FRAME_TYPES: dict[Op, type[Frame]] = {cls.OP: cls for cls in _ALL}

F = TypeVar("F", bound=Frame)


def expect(frame: object, cls: type[F]) -> F:
    """``frame`` if it is a ``cls``; else the peer answered out of turn (RemoteProtocolError)."""
    if not isinstance(frame, cls):
        from client.errors import RemoteProtocolError

        raise RemoteProtocolError(f"expected {cls.__name__}, got {type(frame).__name__}")
    return frame
