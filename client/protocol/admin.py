"""Frames of management: a node's status, the operator's changes, users and grants.

The status is a node's view of the group, its partitions and zones; the operator's
changes are the quorum override, settings, drains, moves, and group and partition
changes; users and grants are the group's (docs/security.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from client.protocol.base import Frame, Op, Record


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


@dataclass(frozen=True, slots=True)
class MemberBuild(Record):
    """Another member's build, as it said on its latest link to the answering node
    (``tandem upgrade status``).  A first-release build says nothing: build "", protocol
    1..1, levels 1..1."""

    name: str
    build: str  # its product version ("" a first-release build)
    protocol_min: int
    protocol_max: int
    level_min: int  # the feature levels it supports
    level_max: int
    level: int  # the group's feature level as it applied it
    linked: bool  # linked to the answering node now (else: as it said when it was)


@dataclass(frozen=True, slots=True)
class TypeMismatch(Record):
    """A record type the answering node and another member define differently (ha.recordtypes)."""

    member: str
    name: str  # the type: "log.PUT_QUEUE", "store.queues", ...
    ours: int  # the answering node's version (0: it has no such type)
    theirs: int  # the member's (0: it has none)
    converts: str  # here (the answering node, the newer), there (the member), none
    convertible: bool  # the newer side has a converter for every step between the two


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
    #: the protocol versions this node's build speaks, [min, max] (empty: a first-release build, 1..1)
    protocol: list[int] = field(default_factory=list)
    #: the feature levels this node's build supports, [min, max] (empty: a first-release build, 1..1)
    feature_levels: list[int] = field(default_factory=list)
    #: the group's feature level as this node applied it (0: a first-release build, level 1)
    feature_level: int = 0
    #: the other members' builds as they said on their links (tandem upgrade status)
    builds: list[MemberBuild] = field(default_factory=list)
    #: the record types another member defines differently, as the links exchanged them
    type_mismatches: list[TypeMismatch] = field(default_factory=list)
    #: records and definitions from members this node could not read or convert, since it started
    type_errors: int = 0


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
class FinalizeUpgrade(Frame):
    """Operator: raise the group's feature level to ``level`` (0: the highest this node's
    build supports) once every member supports it (``tandem upgrade finalize``).  Group state,
    decided by the catalogue's active; the admin permission.  Answered with StatusOk once
    applied here.  Protocol version 2."""

    OP: ClassVar[Op] = Op.FINALIZE_UPGRADE
    rid: int
    level: int = 0


# -- users and grants ------------------------------------------------------------


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
