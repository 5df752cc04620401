"""What the console needs from the node it serves: :class:`NodeView`, the node's parts the console is handed.

The console reads the node's state, asks the other members over the node's peer links, and
calls the node's operations (declare, delete, purge, write a user, drain, move, ...).  The
entry point (``broker.cli``) hands it the node as a few small views (typing Protocols the node
satisfies: :class:`ConsoleHost`, :class:`Meters`, :class:`GroupReport` and the status
helpers' own, broker.sessions.status) and the parts of the node that do the operations; the
console names no concrete broker class.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

from broker.config import NodeConfig
from broker.messaging.catalogue import Catalogue
from broker.messaging.forward import ForwardRequest
from broker.messaging.message import MemoryBudget
from broker.partitions.drain import Drains
from broker.partitions.members import GroupMembers
from broker.partitions.moves import Moves
from broker.partitions.remap import Remaps
from broker.partitions.restore_run import Restores
from broker.partitions.topology import Topology
from broker.partitions.upgrade import FeatureLevels
from broker.security.acl import AclTable
from broker.security.auth import ClientGuard
from broker.security.security import Security
from broker.security.users import UserRegistry
from broker.sessions.status import GroupChanges, NodeReport, NodeState, Options, PeersState, ReplicationState
from client.clock import Clock
from client.protocol.frames import PartitionInfo
from ha.membership import Membership

#: a partition: (queue id, partition index)
Key = tuple[int, int]


class PeersView(PeersState, Protocol):
    """The node's links to the other members of its group."""

    @property
    def addresses(self) -> Mapping[str, tuple[str, int]]:
        """Every other member's name and peer address."""

    @property
    def links(self) -> Mapping[str, object]:
        """The members connected now."""

    @property
    def membership(self) -> Membership: ...

    async def forward(self, name: str, request: ForwardRequest) -> bytes:
        """Ask member ``name`` to do ``request``; its reply, or the error it raised."""


class ReplicationView(ReplicationState, Protocol):
    """The node's replicated partitions."""

    @property
    def elections(self) -> int: ...

    @property
    def discarded_total(self) -> int: ...

    @property
    def discarded_messages(self) -> int: ...

    @property
    def confirmed_lost(self) -> int: ...

    @property
    def confirmed_lost_messages(self) -> int: ...

    def active_of(self, key: Key) -> str | None: ...

    def partition_infos(self) -> list[PartitionInfo]: ...


class GroupReport(NodeReport, Protocol):
    """What the node reports of itself (broker.sessions.status), with the links and partitions
    as the console reads them."""

    @property
    def peers(self) -> PeersView | None:
        """None on a node that is not in a replication group."""

    @property
    def replication(self) -> ReplicationView | None: ...


class ConsoleHost(Protocol):
    """The node itself as the console reads it.  The users, grants and catalogue are read at
    each use: a shared-mode node makes them anew when it takes the lock."""

    @property
    def config(self) -> NodeConfig: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def stopping(self) -> bool: ...

    @property
    def users(self) -> UserRegistry: ...

    @property
    def acls(self) -> AclTable: ...

    @property
    def catalogue(self) -> Catalogue:
        """The queues: declare, delete, purge, look up (broker.messaging.catalogue)."""

    @property
    def client_address(self) -> str: ...


class Meters(Protocol):
    """What the node counts for its metrics beside its state."""

    @property
    def confirms(self) -> int:
        """Messages confirmed to publishers."""

    @property
    def engine(self) -> object:
        """The store (the metrics read its replication log's files, when it has one)."""

    @property
    def memory(self) -> MemoryBudget:
        """Bytes of ready messages held in memory against ``max_memory``, messages cold."""

    @property
    def commit_observers(self) -> list[Callable[[float, bool], None]]:
        """Called on the writer thread with each commit's duration and sync flag, whichever
        writer the node has open (none on a shared-mode passive; a new one per activation)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeView:
    """A node as its console is handed it: its state in small views, and the parts that do
    the operations (each the node's own, made when it started)."""

    node: ConsoleHost
    report: GroupReport  # its status (status_of), its links and partitions
    changes: GroupChanges  # the group's changes under way
    state: NodeState  # the queues it serves (partition stats, counters)
    options: Options  # the settings it applies
    meters: Meters
    guard: ClientGuard  # the limits of the client port, and the failed-login throttle the console shares
    security: Security  # the group's users and grants: writes, and whether a login is current
    drains: Drains  # the group's drained members (tandem node drain)
    moves: Moves  # the group's placements (tandem partition move)
    remaps: Remaps  # partitions added, messages re-mapped (tandem partition add / update)
    restores: Restores  # the quarantine merged back (tandem restore)
    group: GroupMembers  # the group's members (tandem group add / remove)
    levels: FeatureLevels  # the group's feature level (tandem upgrade finalize)
    topology: Topology  # the group's exchanges and bindings (tandem exchanges, bind)


#: the node an application serves
NODE: web.AppKey[NodeView] = web.AppKey("node")
