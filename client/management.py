"""The management calls of the asyncio client: status, operator changes, users and grants.

The node's status, the operator's changes to the group (quorum override, settings,
drains, moves, partitions, members) and the group's users and grants: each is one request
and its reply.

:class:`Management` is a mixin of :class:`client.connection.Connection` (``conn.status()``,
``conn.grant(...)``): :meth:`request` is the connection's.
"""

from __future__ import annotations

from collections.abc import Callable

from client.protocol.frames import (
    AclGrant,
    AclInfo,
    AclList,
    AclRevoke,
    Acls,
    ChangeGroup,
    ChangePartitions,
    DrainNode,
    FinalizeUpgrade,
    Frame,
    MovePartition,
    Placement,
    SetOption,
    SetQuorumOverride,
    Status,
    StatusOk,
    UserDelete,
    UserInfo,
    UserList,
    UserPut,
    Users,
    expect,
    placement_text,
)


class Management:
    """Status, operator changes, users and grants (the admin permission for changes)."""

    async def request(self, make: Callable[[int], Frame]) -> Frame:
        raise NotImplementedError

    # -- status and the operator's changes ---------------------------------------------------------

    async def status(self) -> StatusOk:
        """The node's view of itself and its replication group."""
        return expect(await self.request(lambda rid: Status(rid=rid)), StatusOk)

    async def set_quorum_override(self, nodes: int | None) -> StatusOk:
        """Operator override: the node keeps quorum with at least ``nodes`` members up (None clears it)."""
        return expect(await self.request(lambda rid: SetQuorumOverride(rid=rid, nodes=nodes)), StatusOk)

    async def set_priority(self, priority: int) -> StatusOk:
        """Operator change of this node's election priority (0 never active .. 3 highest)."""
        return expect(await self.request(lambda rid: SetOption(rid=rid, name="priority", value=priority)), StatusOk)

    async def drain_node(self, node: str, drained: bool = True) -> StatusOk:
        """Operator: drain group member ``node`` for maintenance (its actives move to other
        members), or undrain it (``drained`` false).  Returns once the change is applied on
        the node this connection is to; the actives move afterwards."""
        return expect(await self.request(lambda rid: DrainNode(rid=rid, node=node, drained=drained)), StatusOk)

    async def finalize_upgrade(self, level: int = 0) -> StatusOk:
        """Operator: raise the group's feature level to ``level`` (0: the highest the node's build
        supports) once every member's build supports it (docs/upgrades.md).  Returns once applied
        on the node this connection is to.  InvalidArgumentError naming the members that do not
        support it; UnsupportedProtocolError from a node whose build has no feature levels."""
        return expect(await self.request(lambda rid: FinalizeUpgrade(rid=rid, level=level)), StatusOk)

    async def move_partition(self, queue: str, partition: int, nodes: list[str], *,
                             force_replication: bool = False) -> StatusOk:
        """Operator: place ``queue``'s partition ``partition`` on ``nodes`` (priority order): its
        copies move there while producers and consumers run.  Returns once the move is
        applied on this node; the status's partition state says when it is done.
        ``force_replication``: then copy each replica of the list afresh from the active, one
        at a time (also where the partition is on ``nodes`` already)."""
        return expect(await self.request(lambda rid: MovePartition(
            rid=rid, queue=queue, partition=partition, nodes=list(nodes), force_replication=force_replication)),
            StatusOk)

    async def add_partitions(self, queue: str, count: int, *, placement: Placement = None) -> StatusOk:
        """Operator: give ``queue`` ``count`` partitions more (``placement``: their node lists,
        for a queue declared with lists).  What is sent from now on is mapped over every
        partition; nothing stored moves until :meth:`update_partitions`."""
        return expect(await self.request(lambda rid: ChangePartitions(
            rid=rid, queue=queue, action="add", count=count, placement=placement_text(placement))), StatusOk)

    async def update_partitions(self, queue: str, *, mapper: str = "") -> StatusOk:
        """Operator: re-map every message of ``queue`` by its data mapper (``mapper``: install
        that one first).  Returns once the update is under way; ``StatusOk.updating`` lists
        it until every partition is done."""
        return expect(await self.request(lambda rid: ChangePartitions(
            rid=rid, queue=queue, action="update", mapper=mapper)), StatusOk)

    async def add_member(self, node: str, address: str, zone: str = "") -> StatusOk:
        """Operator: add ``node`` (its peer port at ``address``, host:port) to the group; the
        partitions re-spread over the members afterwards (``StatusOk.group_change`` says
        while).  ``zone``: the new member's, in a group with zones."""
        return expect(await self.request(lambda rid: ChangeGroup(rid=rid, action="add", node=node, address=address,
                                                                 zone=zone)), StatusOk)

    async def remove_member(self, node: str) -> StatusOk:
        """Operator: take ``node`` out of the group: its partitions move to the other members,
        then it leaves the list (``StatusOk.group_change`` says while)."""
        return expect(await self.request(lambda rid: ChangeGroup(rid=rid, action="remove", node=node)), StatusOk)

    async def set_designated_primary(self, on: bool) -> StatusOk:
        """Two-node group: let this node go on alone when its peer is gone (or stop that)."""
        return expect(await self.request(lambda rid: SetOption(rid=rid, name="designated_primary", value=int(on))),
                      StatusOk)

    # -- users and grants (the group's; the admin permission) -------------------------------------

    async def create_user(self, name: str, password: str, role: str = "user") -> None:
        """A new user of the group: ``role`` admin, monitor or user (refused if it exists)."""
        await self.request(lambda rid: UserPut(rid=rid, name=name, password=password, role=role, mode="create"))

    async def change_password(self, name: str, password: str) -> None:
        """A new password for an existing user (its role stays)."""
        await self.request(lambda rid: UserPut(rid=rid, name=name, password=password, mode="password"))

    async def delete_user(self, name: str) -> None:
        """Delete a user and its grants; its sessions end."""
        await self.request(lambda rid: UserDelete(rid=rid, name=name))

    async def list_users(self) -> list[UserInfo]:
        return expect(await self.request(lambda rid: UserList(rid=rid)), Users).users

    async def grant(self, user: str, pattern: str, permissions: list[str]) -> None:
        """Grant ``permissions`` (produce, consume, browse, configure, admin) on the queues
        matching ``pattern`` (``orders.*``, ``*``) to ``user``."""
        await self.request(lambda rid: AclGrant(rid=rid, user=user, pattern=pattern, permissions=list(permissions)))

    async def revoke(self, user: str, pattern: str, permissions: list[str]) -> None:
        await self.request(lambda rid: AclRevoke(rid=rid, user=user, pattern=pattern, permissions=list(permissions)))

    async def list_acls(self, user: str | None = None) -> list[AclInfo]:
        """The grants of ``user`` (None: of every user)."""
        return expect(await self.request(lambda rid: AclList(rid=rid, user=user)), Acls).acls
