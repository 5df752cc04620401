"""A client session's group administration requests: node settings, drains, partition moves and changes, members,
the group's feature level.

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
from broker.partitions.upgrade import FeatureLevels
from broker.security.acl import AclTable
from broker.sessions.requests import Handler, Requester
from broker.sessions.status import GroupChanges, NodeReport, Options, status_of
from client.errors import InvalidArgumentError
from client.protocol.frames import ChangeGroup, ChangePartitions, DrainNode, FinalizeUpgrade, Frame, MovePartition, \
    SetOption, SetQuorumOverride, StatusOk
from storage.base import UserRecord


class AdminHost(Options, Protocol):
    """What the group administration requests use of their node: its settings, who may change
    them, and the group's members (tandem group add / remove)."""

    @property
    def acls(self) -> AclTable: ...

    @property
    def group(self) -> GroupMembers: ...  # (the node makes it anew when it joins by seeds alone)


class Admin:
    """The handlers of the group administration requests: each answers with the node's status
    (``report`` and ``changes``, broker.sessions.status) once its change is made."""

    def __init__(self, node: AdminHost, *, report: NodeReport, changes: GroupChanges, drains: Drains, moves: Moves,
                 remaps: Remaps, levels: FeatureLevels) -> None:
        self.node, self.report, self.changes = node, report, changes
        self.drains, self.moves, self.remaps, self.levels = drains, moves, remaps, levels

    def handlers(self) -> Mapping[type[Frame], Handler[Requester]]:
        return {SetQuorumOverride: self.set_quorum_override, SetOption: self.set_option, DrainNode: self.drain_node,
                MovePartition: self.move_partition, ChangePartitions: self.change_partitions,
                ChangeGroup: self.change_group, FinalizeUpgrade: self.finalize_upgrade}

    def _group_admin(self, user: UserRecord, what: str) -> None:
        """A group operation: the user needs the ``admin`` permission (role admin or granted)."""
        self.node.acls.check_group(user, what)

    def _status(self, rid: int) -> StatusOk:
        return status_of(self.report, self.changes, rid)

    async def set_quorum_override(self, s: Requester, user: UserRecord, f: SetQuorumOverride) -> None:
        self._group_admin(user, "set quorum_override")  # allowed without quorum: that is its point
        self.node.set_quorum_override(f.nodes, by=s.client_name)
        s.send(self._status(f.rid))

    async def set_option(self, s: Requester, user: UserRecord, f: SetOption) -> None:
        self._group_admin(user, f"set {f.name}")  # allowed without quorum, like the override
        self.node.set_option(f.name, f.value, by=s.client_name)
        s.send(self._status(f.rid))

    async def drain_node(self, s: Requester, user: UserRecord, f: DrainNode) -> None:
        verb = "drain" if f.drained else "undrain"
        self._group_admin(user, f"{verb} a node")
        await self.drains.set(f.node, f.drained, f"{user.name} ({s.client_name})")
        s.send(self._status(f.rid))

    async def move_partition(self, s: Requester, user: UserRecord, f: MovePartition) -> None:
        self._group_admin(user, "move a partition")
        await self.moves.move(f.queue, f.partition, tuple(f.nodes), f"{user.name} ({s.client_name})",
                                   force=f.force_replication)
        s.send(self._status(f.rid))

    async def change_partitions(self, s: Requester, user: UserRecord, f: ChangePartitions) -> None:
        self._group_admin(user, f"{f.action} partitions")
        by = f"{user.name} ({s.client_name})"
        if f.action == "add":
            await self.remaps.add(f.queue, f.count, f.placement, by)
        elif f.action == "update":
            await self.remaps.update(f.queue, f.mapper, by)
        else:
            raise InvalidArgumentError(f"partition change: action {f.action!r} is not add or update")
        s.send(self._status(f.rid))

    async def change_group(self, s: Requester, user: UserRecord, f: ChangeGroup) -> None:
        self._group_admin(user, f"{f.action} a member")
        by = f"{user.name} ({s.client_name})"
        if f.action == "add":
            await self.node.group.add(f.node, f.address, f.zone, by)
        elif f.action == "remove":
            await self.node.group.remove(f.node, by)
        else:
            raise InvalidArgumentError(f"group change: action {f.action!r} is not add or remove")
        s.send(self._status(f.rid))

    async def finalize_upgrade(self, s: Requester, user: UserRecord, f: FinalizeUpgrade) -> None:
        self._group_admin(user, "finalize an upgrade")
        await self.levels.finalize(f.level, f"{user.name} ({s.client_name})")
        s.send(self._status(f.rid))
