"""Draining a node for maintenance (``tandem node drain NAME`` / ``undrain``): the group's
set of drained members.

The set is the group's state, like the users (:mod:`broker.security.security`): a change is an
entry of the catalogue's replicated log (:class:`~storage.base.SetDrained`), checked and
proposed by the catalogue's active (a member forwards it there, ``DrainFwd``) and
applied by every member once committed, which stores it (``Recovered.meta``,
``drained.<node>``) and reconfigures its logs at once.  So every member sees the same
set, and it survives restarts and the loss of any node.

What a drained member is to elections (:mod:`ha.failback`, ``ReplicaConfig.drained``):
never a partition's preferred node while a voter is not drained, ranked below every node
that can stand, and an active on it hands its partition over (failback's hand-over:
writes held while the new active catches up, then ``TimeoutNow``; durable clients resend
what was refused on the way).  It stays a replica and a voter: it keeps its copy and
quorum is unchanged, and where no other node with the data can be elected it still is.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Protocol

from broker.messaging.forward import DrainFwd, pack_reply
from broker.security.security import CatalogueHost, catalogue_change
from client.errors import InvalidArgumentError
from storage.base import PutMeta, SetDrained, WriteOp

log = logging.getLogger("tandem.broker")

#: ``Recovered.meta`` key of a member's flag: "drained.<node>" -> "1" (drained) or "0"
DRAINED_KEY = "drained."


class DrainGroup(Protocol):
    """The group as drains see it: its members, whether drains apply, what a change sets off."""

    def group_members(self) -> tuple[str, ...]:
        """The group's members (this node included), in placement order; () outside a group."""
        ...

    def drain_refusal(self) -> str | None:
        """Why drains do not apply to this node's group ("" -> allowed): a single node,
        shared mode, a LockFile arbiter."""
        ...

    def drained_changed(self) -> None:
        """The set changed: reconfigure every log."""
        ...


class Drains:
    """The group's drained members as this member applied them, and the changes asked here."""

    def __init__(self, catalogue: CatalogueHost, group: DrainGroup) -> None:
        self.catalogue = catalogue  # where a change is decided and committed
        self.group = group
        self.drained: frozenset[str] = frozenset()

    def load(self, meta: Mapping[str, str]) -> None:
        """The set as the store recovered it."""
        self.drained = frozenset(k[len(DRAINED_KEY):] for k, v in meta.items()
                                 if k.startswith(DRAINED_KEY) and v == "1")

    # -- committed changes (every member applies them) ------------------------------------------

    def apply(self, op: SetDrained) -> list[WriteOp]:
        """Apply a committed change here; the ops to store."""
        self._set(op.node, op.drained)
        return [PutMeta(DRAINED_KEY + op.node, "1" if op.drained else "0")]

    def _set(self, name: str, drained: bool) -> None:
        new = self.drained | {name} if drained else self.drained - {name}
        if new == self.drained:
            return
        self.drained = new
        log.warning("node %s %s (group state): %s", name, "drained" if drained else "undrained",
                    "its partitions move to other nodes once they are caught up" if drained else
                    "failback brings back the partitions it is placed first for")
        self.group.drained_changed()

    def snapshot(self) -> list[str]:
        """The set, for the catalogue's snapshot."""
        return sorted(self.drained)

    def install(self, names: list[str]) -> list[WriteOp]:
        """Replace the set with a snapshot's; the ops to store."""
        new = frozenset(names)
        ops: list[WriteOp] = [PutMeta(DRAINED_KEY + n, "1" if n in new else "0") for n in sorted(new ^ self.drained)]
        if new != self.drained:
            self.drained = new
            self.group.drained_changed()
        return ops

    # -- changes asked for on this member -----------------------------------------------------------

    async def set(self, name: str, drained: bool, by: str, hops: int = 0) -> None:
        """Drain member ``name`` (or undrain it), for the whole group: returns once the change
        is committed and applied here.  InvalidArgumentError for a node that is not a member,
        one already drained (or not drained), the last member not drained, or a group where
        drains do not apply."""
        refusal = self.group.drain_refusal()
        if refusal:
            raise InvalidArgumentError(refusal)
        members = self.group.group_members()
        if name not in members:
            raise InvalidArgumentError(f"no node {name!r} in this group (members: {', '.join(members)})")
        verb = "drain" if drained else "undrain"

        def check() -> WriteOp:
            if drained and name in self.drained:
                raise InvalidArgumentError(f"node {name} is already drained")
            if not drained and name not in self.drained:
                raise InvalidArgumentError(f"node {name} is not drained")
            if drained and not set(members) - self.drained - {name}:
                raise InvalidArgumentError(f"cannot drain {name}: every other member is drained (its partitions "
                                           f"would have nowhere to go)")
            return SetDrained(name, drained)

        await catalogue_change(self.catalogue, f"{verb} node {name}", check, DrainFwd(hops + 1, name, int(drained), by),
                               hops, local=lambda _op: None)
        log.warning("NODE %s by %s: %s", verb.upper(), by, name)

    async def forwarded(self, req: DrainFwd) -> bytes:
        """A member forwarded a drain here (this node is the catalogue's active)."""
        if req.drained not in (0, 1):
            raise InvalidArgumentError(f"forwarded drain: drained is {req.drained}, not 0 or 1")
        await self.set(req.node, bool(req.drained), req.by, max(1, req.hops))
        return pack_reply(self.catalogue.catalogue_commit())
