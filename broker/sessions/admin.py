"""A client session's group administration requests: node settings, drains, partition moves and changes, members.

Each needs the ``admin`` permission (role admin, or granted: broker.security.acl) and answers
with the node's status once the change is made.  The settings (quorum override, priority,
designated primary) are allowed without quorum: restoring service to a minority is their point.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from broker.partitions.drain import Drains
from broker.partitions.members import GroupMembers
from broker.partitions.moves import Moves
from broker.partitions.remap import Remaps
from broker.security.acl import AclTable
from broker.sessions.requests import Handler, Requester
from broker.sessions.status import StatusSource, status_of
from client.errors import InvalidArgumentError
from client.protocol.frames import ChangeGroup, ChangePartitions, DrainNode, Frame, MovePartition, SetOption, \
    SetQuorumOverride
from storage.base import UserRecord


class AdminHost(StatusSource, Protocol):
    """What the group administration requests use of their node."""
    acls: AclTable
    drains: Drains
    moves: Moves
    remaps: Remaps
    group: GroupMembers


class Admin:
    """The handlers of the group administration requests."""

    def __init__(self, node: AdminHost) -> None:
        self.node = node

    def handlers(self) -> Mapping[type[Frame], Handler[Requester]]:
        return {SetQuorumOverride: self.set_quorum_override, SetOption: self.set_option, DrainNode: self.drain_node,
                MovePartition: self.move_partition, ChangePartitions: self.change_partitions,
                ChangeGroup: self.change_group}

    def _group_admin(self, user: UserRecord, what: str) -> None:
        """A group operation: the user needs the ``admin`` permission (role admin or granted)."""
        self.node.acls.check_group(user, what)

    async def set_quorum_override(self, s: Requester, user: UserRecord, f: SetQuorumOverride) -> None:
        self._group_admin(user, "set quorum_override")  # allowed without quorum: that is its point
        self.node.set_quorum_override(f.nodes, by=s.client_name)
        s.send(status_of(self.node, f.rid))

    async def set_option(self, s: Requester, user: UserRecord, f: SetOption) -> None:
        self._group_admin(user, f"set {f.name}")  # allowed without quorum, like the override
        self.node.set_option(f.name, f.value, by=s.client_name)
        s.send(status_of(self.node, f.rid))

    async def drain_node(self, s: Requester, user: UserRecord, f: DrainNode) -> None:
        verb = "drain" if f.drained else "undrain"
        self._group_admin(user, f"{verb} a node")
        await self.node.drains.set(f.node, f.drained, f"{user.name} ({s.client_name})")
        s.send(status_of(self.node, f.rid))

    async def move_partition(self, s: Requester, user: UserRecord, f: MovePartition) -> None:
        self._group_admin(user, "move a partition")
        await self.node.moves.move(f.queue, f.partition, tuple(f.nodes), f"{user.name} ({s.client_name})",
                                   force=f.force_replication)
        s.send(status_of(self.node, f.rid))

    async def change_partitions(self, s: Requester, user: UserRecord, f: ChangePartitions) -> None:
        self._group_admin(user, f"{f.action} partitions")
        by = f"{user.name} ({s.client_name})"
        if f.action == "add":
            await self.node.remaps.add(f.queue, f.count, f.placement, by)
        elif f.action == "update":
            await self.node.remaps.update(f.queue, f.mapper, by)
        else:
            raise InvalidArgumentError(f"partition change: action {f.action!r} is not add or update")
        s.send(status_of(self.node, f.rid))

    async def change_group(self, s: Requester, user: UserRecord, f: ChangeGroup) -> None:
        self._group_admin(user, f"{f.action} a member")
        by = f"{user.name} ({s.client_name})"
        if f.action == "add":
            await self.node.group.add(f.node, f.address, f.zone, by)
        elif f.action == "remove":
            await self.node.group.remove(f.node, by)
        else:
            raise InvalidArgumentError(f"group change: action {f.action!r} is not add or remove")
        s.send(status_of(self.node, f.rid))
