"""Moving a partition while it runs (``tandem partition move QUEUE P --to NODES``): the
group's placements that override the distribution policy.

A placement is the group's state, like the drained members (:mod:`broker.partitions.drain`): a
change is an entry of the catalogue's replicated log (:class:`~storage.base.SetPlacement`),
checked and proposed by the catalogue's active (a member forwards it there, ``MoveFwd``)
and applied by every member once committed, which stores it (``Recovered.meta``,
``placed.<queue id>.<partition>``) and acts on it at once:

* a node the new list names and that holds no copy opens the partition's log as a
  learner, empty; the partition's active feeds it the log (or a snapshot);
* the partition's active changes the log's members toward the list one step at a time
  (:func:`ha.moves.next_members`: new copies as learners, each voter added once it is
  caught up, then the voters the list drops removed one at a time), and hands the
  partition to the list's first node if it is not a voter of the list itself (the
  drain's hand-over: writes held while that node catches up, then ``TimeoutNow``);
* once the log's committed members are the list's, the active says so (the same op,
  ``moving`` false), and the nodes the list does not name drop their copy.

So the copies move while producers and consumers run; the partition's state is
``Replicating`` while a new copy is behind, ``Migrating`` while the members change.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Collection, Coroutine, Mapping, Sequence
from typing import Any, Protocol

from broker.messaging.forward import MoveFwd, pack_reply
from broker.security.security import CatalogueHost, catalogue_change
from client.errors import InvalidArgumentError, TandemError
from storage.base import PutMeta, QueueMeta, SetPlacement, WriteOp

log = logging.getLogger("tandem.broker")

#: ``Recovered.meta`` key of a partition's placement: "placed.<qid>.<p>" -> "moving n3,n1" or "placed n3,n1",
#: with " static" after the list for a queue declared with explicit node lists
PLACED_KEY = "placed."

Key = tuple[int, int]


class MovePlacement(Protocol):
    """The group's members and queues, where partitions are placed, and what a placement sets off."""

    def group_members(self) -> tuple[str, ...]:
        """The group's members (this node included), in placement order; () outside a group."""
        ...

    def move_refusal(self) -> str | None:
        """Why moves do not apply to this node's group (None: allowed)."""
        ...

    def queue_meta(self, name: str) -> QueueMeta | None:
        """The queue called ``name``, if declared."""
        ...

    def queue_meta_of(self, queue_id: int) -> QueueMeta | None:
        """The queue whose id is ``queue_id``, if declared."""
        ...

    def nodes_of(self, key: Key) -> tuple[str, ...]:
        """Where partition ``key`` is placed now (a placement, else the policy's list), as
        ``name:sync`` / ``name:async`` entries."""
        ...

    def spec_of(self, nodes: tuple[str, ...]) -> tuple[str, ...]:
        """A move's list as ``name:sync`` / ``name:async`` entries (kinds by position where
        it gives none)."""
        ...

    def placement_changed(self, key: Key) -> None:
        """A placement changed: open, reconcile or drop the partition's log here."""
        ...


def check_nodes(what: str, nodes: tuple[str, ...], members: Collection[str]) -> None:
    """InvalidArgumentError, starting with ``what``, unless ``nodes`` is a node list a
    partition can be placed on: members of the group, each once, each ``name``,
    ``name:sync`` or ``name:async``, the first (the active) not async."""
    names = [n.partition(":")[0] for n in nodes]
    unknown = [n for n in names if n not in members]
    if not nodes or unknown:
        which = "no nodes given" if not nodes else "no member " + ", ".join(unknown)
        raise InvalidArgumentError(f"{what}: {which} (members: {', '.join(members)})")
    if len(set(names)) != len(names):
        raise InvalidArgumentError(f"{what}: a node appears twice in {','.join(nodes)}")
    kinds = [n.partition(":")[2] for n in nodes]
    bad = next((n for n, k in zip(nodes, kinds) if k not in ("", "sync", "async")), None)
    if bad is not None:
        raise InvalidArgumentError(f"{what}: {bad!r}: a node's kind is sync or async (name:sync, name:async)")
    if kinds[0] == "async":
        raise InvalidArgumentError(f"{what}: the first node, {names[0]}, is the active: it cannot be async")


def without_leaving(nodes: tuple[str, ...], members: Sequence[str], zones: Mapping[str, str]) -> tuple[str, ...]:
    """A ``static`` partition's list (``name:kind`` entries) once the nodes not among
    ``members`` (those leaving the group) are out of it: each replaced, in its place and
    kind, by the first member the list does not hold, in the leaving node's zone if one
    is there, else in the zone the list holds fewest copies in; dropped if every member
    is on the list already.  The list as it is if none is leaving."""
    names = [n.partition(":")[0] for n in nodes]
    if all(n in members for n in names):
        return nodes
    out: list[str] = []
    for spec, name in zip(nodes, names):
        if name in members:
            out.append(spec)
            continue
        held = {n.partition(":")[0] for n in out} | {n for n in names if n in members}
        spare = [m for m in members if m not in held]
        if not spare:
            continue
        copies = Counter(zones.get(n, n) for n in held)
        pick = min(spare, key=lambda m: (zones.get(m) != zones.get(name) or not zones, copies[zones.get(m, m)]))
        out.append(f"{pick}:{spec.partition(':')[2] or 'sync'}")
    if out and out[0].endswith(":async"):
        out[0] = out[0].rpartition(":")[0] + ":sync"  # (the active is a voter)
    return tuple(out)


def _meta_value(op: SetPlacement) -> str:
    return f"{'moving' if op.moving else 'placed'} {','.join(op.nodes)}{' static' if op.static else ''}"


class Moves:
    """The group's placements as this member applied them, and the moves asked here."""

    def __init__(self, catalogue: CatalogueHost, placement: MovePlacement,
                 spawn: Callable[[Coroutine[Any, Any, Any]], None]) -> None:
        self.catalogue = catalogue  # where a change is decided and committed
        self.placement = placement
        self.spawn = spawn  # runs a forced replication as a task of the node's (cancelled when it stops)
        self.placed: dict[Key, tuple[str, ...]] = {}
        self.moving: set[Key] = set()
        #: the partitions of queues declared with explicit node lists (``static`` distribution)
        self.static: set[Key] = set()
        #: forced replications run from this member: partition -> what it is doing
        self.forcing: dict[Key, str] = {}
        self._waiters: list[asyncio.Future[None]] = []

    def load(self, meta: Mapping[str, str], queue_ids: Collection[int]) -> None:
        """The placements of the queues ``queue_ids`` as the store recovered them."""
        for k, v in meta.items():
            if not k.startswith(PLACED_KEY):
                continue
            try:
                qid, p = (int(x) for x in k[len(PLACED_KEY):].split("."))
                state, nodes, *flags = v.split(" ")
            except ValueError:
                log.error("store: ignoring a malformed placement %s=%r", k, v)
                continue
            if qid not in queue_ids:
                continue  # (a deleted queue's)
            self.placed[(qid, p)] = tuple(nodes.split(","))
            if state == "moving":
                self.moving.add((qid, p))
            if "static" in flags:
                self.static.add((qid, p))

    # -- committed changes (every member applies them) ------------------------------------------

    def apply(self, op: SetPlacement) -> list[WriteOp]:
        """Apply a committed placement here; the ops to store."""
        key = (op.queue_id, op.partition)
        was = (self.placed.get(key), key in self.moving)
        self.placed[key] = op.nodes
        (self.moving.add if op.moving else self.moving.discard)(key)
        (self.static.add if op.static else self.static.discard)(key)
        self._wake()
        if was != (op.nodes, op.moving):
            log.warning("partition %d/%d %s %s (group state)", key[0], key[1],
                        "moving to" if op.moving else "now placed on", ", ".join(op.nodes))
            self.placement.placement_changed(key)
        return [PutMeta(f"{PLACED_KEY}{key[0]}.{key[1]}", _meta_value(op))]

    def forget(self, queue_id: int) -> None:
        """Queue ``queue_id`` was deleted: its placements go with it."""
        for key in [k for k in self.placed if k[0] == queue_id]:
            del self.placed[key]
            self.moving.discard(key)
            self.static.discard(key)
        self._wake()

    def snapshot(self) -> list[SetPlacement]:
        """The placements, for the catalogue's snapshot."""
        return [SetPlacement(k[0], k[1], nodes, k in self.moving, k in self.static)
                for k, nodes in sorted(self.placed.items())]

    def install(self, ops: list[SetPlacement]) -> list[WriteOp]:
        """Replace the placements with a snapshot's; the ops to store."""
        out: list[WriteOp] = []
        for op in ops:
            out.extend(self.apply(op))
        return out

    # -- moves asked for on this member -----------------------------------------------------------

    async def move(self, queue: str, partition: int, nodes: tuple[str, ...], by: str, hops: int = 0,
                   force: bool = False, forcing: bool = False) -> None:
        """Place ``queue``'s partition ``partition`` on ``nodes`` (priority order), for the
        whole group: returns once the move is committed and applied here (the copies move
        after).  InvalidArgumentError for an unknown queue, partition or member, a list
        that repeats a node, a partition already moving, or one already on that list.

        ``force`` (``force_replication``): once there, every replica of the list is copied
        afresh from the active, one at a time (:meth:`_force`), also where the partition is
        on that list already; ``forcing``: this move is one of its steps."""
        refusal = self.placement.move_refusal()
        if refusal:
            raise InvalidArgumentError(refusal)
        meta = self.placement.queue_meta(queue)
        if meta is None:
            raise InvalidArgumentError(f"partition move: no queue {queue!r}")
        if not 0 <= partition < meta.partitions:
            raise InvalidArgumentError(f"partition move: queue {queue} has partitions 0..{meta.partitions - 1}, "
                                       f"not {partition}")
        check_nodes("partition move", nodes, self.placement.group_members())
        key = (meta.id, partition)
        if key in self.forcing and not forcing:
            raise InvalidArgumentError(f"partition {queue}/{partition}: a forced replication is under way "
                                       f"({self.forcing[key]}): wait until it is done")
        if force and key not in self.moving and self.placement.nodes_of(key) == self.placement.spec_of(nodes):
            self._start_force(key, queue, self.placement.spec_of(nodes), by)
            return

        def check() -> WriteOp:
            if key in self.moving:
                raise InvalidArgumentError(f"partition {queue}/{partition} is already moving to "
                                           f"{','.join(self.placed[key])}: wait until it is there")
            if self.placement.nodes_of(key) == self.placement.spec_of(nodes):
                raise InvalidArgumentError(f"partition {queue}/{partition} is already on {','.join(nodes)}")
            return SetPlacement(meta.id, partition, nodes, True, key in self.static)

        await catalogue_change(self.catalogue, f"move partition {queue}/{partition}", check,
                               MoveFwd(hops + 1, meta.id, partition, ",".join(nodes), 1, by), hops,
                               local=lambda _op: None)
        log.warning("PARTITION MOVE by %s: %s/%d to %s%s", by, queue, partition, ",".join(nodes),
                    " (forced replication)" if force else "")
        if force:
            self._start_force(key, queue, self.placement.spec_of(nodes), by)

    async def start(self, key: Key, nodes: tuple[str, ...], by: str) -> None:
        """Move partition ``key`` to ``nodes`` (:meth:`move`; nothing if its queue is gone)."""
        meta = self.placement.queue_meta_of(key[0])
        if meta is not None:
            await self.move(meta.name, key[1], nodes, by)

    # -- forced replication (StreamBase's force_replication) --------------------------------------

    def _start_force(self, key: Key, queue: str, nodes: tuple[str, ...], by: str) -> None:
        self.forcing[key] = "waiting for the move" if key in self.moving else "starting"
        self.spawn(self._force(key, queue, nodes, by))

    async def _force(self, key: Key, queue: str, nodes: tuple[str, ...], by: str) -> None:
        """Copy every replica of ``nodes`` afresh: each in turn leaves the list (a move: it
        drops its copy) and comes back to its place (another: it gets a new copy from the
        active, the log or a streamed snapshot), so the partition never has fewer voters
        than a move leaves it.  Run by the member asked; should it stop meanwhile, the
        partition stays on the list of the step under way, and the operator asks again."""
        label = f"{queue}/{key[1]}"
        try:
            await self._settled(key)
            for spec in nodes[1:]:
                name = spec.partition(":")[0]
                self.forcing[key] = f"re-copying {name}"
                log.warning("partition %s: forced replication: %s drops its copy and gets a new one", label, name)
                await self.move(queue, key[1], tuple(n for n in nodes if n != spec), f"{by}, forced replication",
                                forcing=True)
                await self._settled(key)
                await self.move(queue, key[1], nodes, f"{by}, forced replication", forcing=True)
                await self._settled(key)
            log.warning("partition %s: forced replication done: %s copied afresh from the active", label,
                        ", ".join(n.partition(":")[0] for n in nodes[1:]) or "no replica")
        except TandemError as exc:
            log.error("partition %s: forced replication stopped (%s): it stays on %s; ask again to re-copy the "
                      "rest", label, exc.message, ",".join(self.placed.get(key, nodes)))
        finally:
            del self.forcing[key]

    async def _settled(self, key: Key) -> None:
        """Until partition ``key`` is not moving (or its queue is gone)."""
        while key in self.moving:
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            await fut

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def finished(self, key: Key, nodes: tuple[str, ...], hops: int = 0) -> None:
        """The partition's active: its log's members are ``nodes``' now (committed)."""

        def check() -> WriteOp:
            if key not in self.moving or self.placed.get(key) != nodes:
                raise InvalidArgumentError(f"partition {key[0]}/{key[1]} is not moving to {','.join(nodes)}")
            return SetPlacement(key[0], key[1], nodes, False, key in self.static)

        await catalogue_change(self.catalogue, f"finish the move of partition {key[0]}/{key[1]}", check,
                               MoveFwd(hops + 1, key[0], key[1], ",".join(nodes), 0, "the partition's active"),
                               hops, local=lambda _op: None)

    async def retarget(self, key: Key, nodes: tuple[str, ...], hops: int = 0) -> None:
        """A partition whose move is under way goes to ``nodes`` instead (a group change took
        a node of its list out, broker.partitions.members): its active changes the members toward the new
        list from where they are (a copy not made yet is dropped)."""

        def check() -> WriteOp:
            if key not in self.moving:
                raise InvalidArgumentError(f"partition {key[0]}/{key[1]} is not moving")
            return SetPlacement(key[0], key[1], nodes, True, key in self.static)

        await catalogue_change(self.catalogue, f"re-target the move of partition {key[0]}/{key[1]}", check,
                               MoveFwd(hops + 1, key[0], key[1], ",".join(nodes), 2, "the group's re-spread"),
                               hops, local=lambda _op: None)

    async def forwarded(self, req: MoveFwd) -> bytes:
        """A member forwarded a move here (this node is the catalogue's active)."""
        nodes = tuple(req.nodes.split(","))
        if req.moving == 1:
            q = self.placement.queue_meta_of(req.queue_id)
            if q is None:
                raise InvalidArgumentError(f"forwarded move: no queue #{req.queue_id}")
            await self.move(q.name, req.partition, nodes, req.by, max(1, req.hops))
        elif req.moving == 0:
            await self.finished((req.queue_id, req.partition), nodes, max(1, req.hops))
        elif req.moving == 2:
            await self.retarget((req.queue_id, req.partition), nodes, max(1, req.hops))
        else:
            raise InvalidArgumentError(f"forwarded move: moving is {req.moving}, not 0, 1 or 2")
        return pack_reply(self.catalogue.catalogue_commit())
