"""Adding and removing members while the group runs (``tandem group add NAME=HOST:PORT``,
``tandem group remove NAME``): the group's member list.

The list is the group's state, like the placements (:mod:`broker.partitions.moves`): a change is an
entry of the catalogue's replicated log (:class:`~storage.base.SetGroup`), checked and
proposed by the catalogue's active (a member forwards it there, ``GroupFwd``) and
applied by every member once committed, which stores it (``Recovered.meta``, ``group``)
and acts on it at once: it dials a new member and admits its links, stops linking to a
removed one, counts the quorum over the new list, and places new queues over it.  Until
the first change the list is the settings' (the node and its ``peers``); from then on
the stored list is, and ``peers`` only says where the founding members are.

A change is one member at a time, in two steps each an entry of the catalogue's log:

* ``add`` (or ``remove``) pins every partition where the policy placed it (so nothing
  moves by itself), names the new member (or marks the member ``leaving``) and starts a
  *re-spread*: the catalogue's active moves the partitions, at most
  :data:`MAX_MOVES` at a time, to where the policy places them over the members not
  leaving (``tandem partition move``'s way: new copies first, the active handed over once
  its successor has caught up), and changes the catalogue's own log's members the same
  way (a new member votes once caught up; a leaving one stops voting, then leaves);
* once every partition is where the policy puts it and the catalogue's members are the
  list's, the catalogue's active ends the change (``respread`` false), dropping a leaving
  member from the list.

A leaving member ranks as drained (:mod:`broker.partitions.drain`) meanwhile, so its actives move off
it first.  Why one at a time, and the log's own members changed one voter at a time:
docs/replication.md ("adding and removing members").
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Collection, Mapping
from typing import Protocol

from broker.config import NodeConfig
from broker.messaging.forward import GroupFwd, pack_reply
from broker.security.security import CatalogueHost, catalogue_change
from client.errors import InvalidArgumentError
from storage.base import PutMeta, SetGroup, WriteOp

log = logging.getLogger("tandem.broker")

#: ``Recovered.meta`` key of the group's member list (JSON: SetGroup's fields but the pins)
GROUP_KEY = "group"

#: partitions a re-spread moves at once (each copies its log to a new member)
MAX_MOVES = 2

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_HOST = re.compile(r"^\[?[A-Za-z0-9_.:-]{1,253}\]?$")  # a host name, IPv4 or [IPv6] address

Key = tuple[int, int]


class MemberPlacement(Protocol):
    """The group as its member list sees it: the settings' members, the distribution policy,
    where partitions are and what a changed list sets off."""

    def group_refusal(self) -> str | None:
        """Why members cannot be added or removed in this node's group (None: they can)."""
        ...

    def founding_address(self, name: str) -> str | None:
        """host:port of member ``name`` as this node's settings give it (None: not there)."""
        ...

    def unplaced(self) -> list[tuple[int, int, tuple[str, ...]]]:
        """(queue id, partition, node list) of every partition the policy places (no move
        placed it), where it places it now."""
        ...

    def feasible(self, members: tuple[str, ...], zones: Mapping[str, str]) -> str | None:
        """Why the distribution policy cannot place partitions over ``members`` with
        ``zones`` (None: it can)."""
        ...

    def members_changed(self) -> None:
        """The list changed: peers, quorum, placement and every log follow it."""
        ...

    def policy_targets(self) -> dict[Key, tuple[str, ...]]:
        """Where the policy places every partition over the members not leaving."""
        ...

    def nodes_of(self, key: Key) -> tuple[str, ...]:
        """Where partition ``key`` is placed now."""
        ...


class Moving(Protocol):
    """The moves a re-spread starts and steers (:class:`broker.partitions.moves.Moves`)."""

    @property
    def moving(self) -> Collection[Key]:
        """The partitions whose move is under way."""
        ...

    async def start(self, key: Key, nodes: tuple[str, ...], by: str) -> None:
        """Move partition ``key`` to ``nodes``."""
        ...

    async def retarget(self, key: Key, nodes: tuple[str, ...]) -> None:
        """Send partition ``key``'s move under way to ``nodes`` instead."""
        ...


def parse_address(text: str) -> tuple[str, int]:
    """``host:port`` -> (host, port); InvalidArgumentError otherwise."""
    host, colon, port = text.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536 or not _HOST.match(host):
        raise InvalidArgumentError(f"group add: {text!r} is not host:port (the new member's peer address)")
    return host.strip("[]"), int(port)


class GroupMembers:
    """The group's member list as this member applied it, and the changes asked here."""

    def __init__(self, catalogue: CatalogueHost, placement: MemberPlacement, moves: Moving, founding: tuple[str, ...],
                 zones: Mapping[str, str]) -> None:
        self.catalogue = catalogue  # where a change is decided and committed
        self.placement = placement
        self.moves = moves
        self.founding = SetGroup(tuple(sorted(founding)), (), tuple(f"{n}={z}" for n, z in sorted(zones.items())),
                                 (), False)
        #: the last committed change (None: none yet, the settings' list holds)
        self.state: SetGroup | None = None

    # -- the list ------------------------------------------------------------------------------------


    @classmethod
    def founded(cls, catalogue: CatalogueHost, placement: MemberPlacement, moves: Moving,
                config: NodeConfig) -> GroupMembers:
        """The members named by ``config`` (its placement's founding members, in their zones),
        until the group's first change."""
        founding, _policy = config.placement()
        return cls(catalogue, placement, moves, tuple(founding),
                   {n: z for n, z in config.zone_map().items() if n in founding})
    @property
    def current(self) -> SetGroup:
        return self.state if self.state is not None else self.founding

    @property
    def members(self) -> tuple[str, ...]:
        """Every member, sorted (leaving ones included)."""
        return self.current.members

    @property
    def leaving(self) -> frozenset[str]:
        return frozenset(self.current.leaving)

    @property
    def placing(self) -> tuple[str, ...]:
        """The members partitions are placed on: the list but the leaving ones."""
        return tuple(n for n in self.members if n not in self.current.leaving)

    @property
    def respread(self) -> bool:
        """A change is under way: partitions are moving to where the policy places them."""
        return self.current.respread

    @property
    def addresses(self) -> dict[str, tuple[str, int]]:
        """host, port of each member added while the group ran."""
        out = {}
        for spec in self.current.addresses:
            name, _, addr = spec.partition("=")
            host, _, port = addr.rpartition(":")
            out[name] = (host, int(port))
        return out

    @property
    def zones(self) -> dict[str, str]:
        return dict(tuple(z.split("=", 1)) for z in self.current.zones)  # type: ignore[misc]

    def changed(self) -> bool:
        """Whether the group's list has ever changed (then it, not the settings, is the list)."""
        return self.state is not None

    # -- committed changes (every member applies them) ------------------------------------------

    def load(self, meta: Mapping[str, str]) -> None:
        """The list as the store recovered it."""
        raw = meta.get(GROUP_KEY)
        if not raw:
            return
        try:
            d = json.loads(raw)
            self.state = SetGroup(tuple(d["members"]), tuple(d["addresses"]), tuple(d["zones"]),
                                  tuple(d["leaving"]), bool(d["respread"]))
        except (ValueError, KeyError, TypeError):
            log.error("store: ignoring a malformed member list %r (the settings' holds)", raw)

    def apply(self, op: SetGroup) -> list[WriteOp]:
        """Apply a committed change here; the ops to store."""
        before = self.current
        self.state = SetGroup(op.members, op.addresses, op.zones, op.leaving, op.respread)
        if before != self.state:
            added = sorted(set(op.members) - set(before.members))
            removed = sorted(set(before.members) - set(op.members))
            leaving = sorted(set(op.leaving) - set(before.leaving))
            what = "; ".join(x for x in (
                f"added {', '.join(added)}" if added else "", f"removed {', '.join(removed)}" if removed else "",
                f"{', '.join(leaving)} leaving" if leaving else "",
                "partitions re-spreading" if op.respread else "change done" if before.respread else "") if x)
            log.warning("group members now %s (group state%s)", ", ".join(op.members), f": {what}" if what else "")
            self.placement.members_changed()
        return [PutMeta(GROUP_KEY, json.dumps({
            "members": list(op.members), "addresses": list(op.addresses), "zones": list(op.zones),
            "leaving": list(op.leaving), "respread": op.respread}))]

    def snapshot(self) -> SetGroup | None:
        """The list, for the catalogue's snapshot (None: the settings' holds)."""
        return self.state

    def install(self, op: SetGroup | None) -> list[WriteOp]:
        """Take a snapshot's list; the ops to store."""
        return self.apply(op) if op is not None else []

    # -- changes asked for on this member -----------------------------------------------------------

    def _refuse_busy(self, verb: str) -> None:
        cur = self.current
        if cur.respread:
            what = f"{', '.join(cur.leaving)} is leaving" if cur.leaving else "a member was added"
            raise InvalidArgumentError(f"group {verb}: a change is under way ({what}, partitions re-spreading): "
                                       f"wait until tandem status shows the group settled")

    async def add(self, name: str, address: str, zone: str, by: str, hops: int = 0) -> None:
        """Add member ``name`` at peer address ``address`` (in zone ``zone``, in a group with
        zones), for the whole group: returns once the change is committed and applied here
        (the partitions re-spread after)."""
        refusal = self.placement.group_refusal()
        if refusal:
            raise InvalidArgumentError(refusal)
        if not _NAME.match(name):
            raise InvalidArgumentError(f"group add: {name!r} is not a node name (letters, digits, '_', '.', '-')")
        host, port = parse_address(address)
        spec = f"{name}={host}:{port}"
        if zone and not _NAME.match(zone):
            raise InvalidArgumentError(f"group add: {zone!r} is not a zone name (letters, digits, '_', '.', '-')")

        def check() -> WriteOp:
            self._refuse_busy("add")
            cur = self.current
            if name in cur.members:
                raise InvalidArgumentError(f"group add: {name} is a member already")
            taken = {n: a for n in cur.members if (a := self.address_of(n)) is not None}
            clash = next((n for n, a in taken.items() if a == f"{host}:{port}"), None)
            if clash is not None:
                raise InvalidArgumentError(f"group add: {host}:{port} is {clash}'s peer address")
            zones = self.zones
            if zones and not zone:
                raise InvalidArgumentError(f"group add: this group places copies by zone: give {name}'s "
                                           f"(--zone)")
            if zone and not zones:
                raise InvalidArgumentError("group add: this group has no zones (--zone only where every member "
                                           "has one)")
            members = tuple(sorted((*cur.members, name)))
            if zone:
                zones[name] = zone
            why = self.placement.feasible(tuple(n for n in members if n not in cur.leaving), zones)
            if why is not None:
                raise InvalidArgumentError(f"group add: {why}")
            return SetGroup(members, tuple(sorted((*cur.addresses, spec))),
                            tuple(f"{n}={z}" for n, z in sorted(zones.items())), cur.leaving, True,
                            tuple(self.placement.unplaced()))

        await catalogue_change(self.catalogue, f"add member {name}", check,
                               GroupFwd(hops + 1, "add", name, f"{host}:{port}", zone, by), hops,
                               local=lambda _op: None)
        log.warning("GROUP ADD by %s: %s at %s:%d%s", by, name, host, port, f" in zone {zone}" if zone else "")

    async def remove(self, name: str, by: str, hops: int = 0) -> None:
        """Start removing member ``name``: its partitions move to the others, then it leaves
        the list.  Returns once the start is committed and applied here."""
        refusal = self.placement.group_refusal()
        if refusal:
            raise InvalidArgumentError(refusal)

        def check() -> WriteOp:
            cur = self.current
            if name not in cur.members:
                raise InvalidArgumentError(f"group remove: no member {name!r} (members: {', '.join(cur.members)})")
            if name in cur.leaving:
                raise InvalidArgumentError(f"group remove: {name} is leaving already (tandem status shows the "
                                           f"change until it is done)")
            # (also while a change is under way: a member added by mistake, or one that never came up,
            # is taken out again this way; the partitions moving onto it go elsewhere)
            rest = tuple(n for n in cur.members if n != name and n not in cur.leaving)
            if len(rest) < 2:
                raise InvalidArgumentError(f"group remove: a group keeps two members at least (it would be left "
                                           f"with {', '.join(rest) or 'none'})")
            zones = {n: z for n, z in self.zones.items() if n in rest}
            why = self.placement.feasible(rest, zones)
            if why is not None:
                raise InvalidArgumentError(f"group remove: {why}")
            return SetGroup(cur.members, cur.addresses, cur.zones, tuple(sorted((*cur.leaving, name))), True,
                            tuple(self.placement.unplaced()))

        await catalogue_change(self.catalogue, f"remove member {name}", check,
                               GroupFwd(hops + 1, "remove", name, "", "", by), hops, local=lambda _op: None)
        log.warning("GROUP REMOVE by %s: %s (its partitions move to the other members, then it leaves)", by, name)

    async def settle(self, hops: int = 0) -> None:
        """End the change under way (the catalogue's active, once every partition is where the
        policy places it): the leaving member leaves the list."""

        def check() -> WriteOp:
            cur = self.current
            if not cur.respread:
                raise InvalidArgumentError("group: no change under way")
            gone = set(cur.leaving)
            return SetGroup(tuple(n for n in cur.members if n not in gone),
                            tuple(a for a in cur.addresses if a.partition("=")[0] not in gone),
                            tuple(z for z in cur.zones if z.partition("=")[0] not in gone), (), False)

        await catalogue_change(self.catalogue, "settle the group change", check,
                               GroupFwd(hops + 1, "settle", "", "", "", "the catalogue's active"), hops,
                               local=lambda _op: None)

    async def step(self, settled: bool) -> None:
        """One round of the re-spread, on the catalogue's active: move the partitions that are
        not where the policy places them (at most :data:`MAX_MOVES` under way), or, once every
        one is and the catalogue's log has its members (``settled``), end the change."""
        targets = self.placement.policy_targets()
        moving = set(self.moves.moving)
        placing = set(self.placing)
        for key in sorted(moving & set(targets)):
            if any(n.partition(":")[0] not in placing for n in self.placement.nodes_of(key)):
                await self.moves.retarget(key, targets[key])  # (a move onto a member now leaving)
        differ = [k for k, nodes in sorted(targets.items()) if self.placement.nodes_of(k) != nodes]
        if not differ and not moving:
            if settled:
                await self.settle()
                log.warning("group change done: members %s, every partition where the policy places it",
                            ", ".join(self.placing))
            return
        busy = len(moving)
        for key in differ:
            if busy >= MAX_MOVES:
                break
            if key in moving:
                continue
            await self.moves.start(key, targets[key], "the group's re-spread")
            busy += 1

    def address_of(self, name: str) -> str | None:
        """host:port of member ``name``'s peer links: where the group added it, else the settings'."""
        added = self.addresses.get(name)
        if added is not None:
            return f"{added[0]}:{added[1]}"
        return self.placement.founding_address(name)

    async def forwarded(self, req: GroupFwd) -> bytes:
        """A member forwarded a change here (this node is the catalogue's active)."""
        hops = max(1, req.hops)
        if req.action == "add":
            await self.add(req.node, req.address, req.zone, req.by, hops)
        elif req.action == "remove":
            await self.remove(req.node, req.by, hops)
        elif req.action == "settle":
            await self.settle(hops)
        else:
            raise InvalidArgumentError(f"forwarded group change: action {req.action!r} is not add, remove or "
                                       f"settle")
        return pack_reply(self.catalogue.catalogue_commit())
