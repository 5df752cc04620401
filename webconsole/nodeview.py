"""What the console needs from the node it serves: :class:`NodeView`.

The console reads the node's state, asks the other members over the node's
peer links, and calls the node's operations (declare, delete, purge, write a
user).  ``broker.node.node.Node`` satisfies these protocols; the console names no
concrete broker class.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Protocol

from aiohttp import web

from broker.messaging.queues import MemoryBudget
from broker.messaging.forward import ForwardRequest
from broker.sessions.status import PeersState, ReplicationState, StatusSource
from broker.security.auth import ClientGuard
from broker.security.acl import AclTable
from broker.partitions.drain import Drains
from broker.partitions.members import GroupMembers
from broker.partitions.moves import Moves
from broker.partitions.remap import Remaps
from broker.partitions.restore_run import Restores
from broker.security.security import Security
from broker.security.users import UserRegistry
from client.clock import Clock
from client.protocol.frames import Declare, PartitionInfo, QueueInfo
from ha.membership import Membership
from storage.base import QueueMeta, WriteOp

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


class NodeView(StatusSource, Protocol):
    """A node as its console sees it."""

    @property
    def clock(self) -> Clock: ...

    @property
    def stopping(self) -> bool: ...

    @property
    def users(self) -> UserRegistry: ...

    @property
    def guard(self) -> ClientGuard:
        """The limits of the client port, and the failed-login throttle the console shares."""

    @property
    def acls(self) -> AclTable: ...

    @property
    def security(self) -> Security: ...

    @property
    def drains(self) -> Drains: ...  # the group's drained members (tandem node drain)

    @property
    def moves(self) -> Moves: ...  # the group's placements (tandem partition move)

    @property
    def remaps(self) -> Remaps: ...  # partitions added, messages re-mapped (tandem partition add / update)

    @property
    def restores(self) -> Restores: ...  # the quarantine merged back (tandem restore)

    @property
    def group(self) -> GroupMembers: ...  # the group's members (tandem group add / remove)

    def group_view(self) -> tuple[list[str], dict[str, str], str]: ...

    def queue_meta(self, name: str) -> QueueMeta | None: ...

    def group_members(self) -> tuple[str, ...]: ...

    @property
    def peers(self) -> PeersView | None:
        """None on a node that is not in a replication group."""

    @property
    def replication(self) -> ReplicationView | None: ...

    @property
    def client_address(self) -> str: ...

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


    def write(self, ops: list[WriteOp], *, sync: bool) -> asyncio.Future[None]: ...

    async def catch_up_catalogue(self) -> bool: ...

    async def declare(self, frame: Declare, owner: str | None = None) -> tuple[QueueInfo, bool]: ...

    async def delete(self, name: str, if_empty: bool) -> None: ...

    async def purge(self, name: str) -> int: ...


#: the node an application serves
NODE: web.AppKey[NodeView] = web.AppKey("node")
