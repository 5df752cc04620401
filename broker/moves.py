"""Moving a partition while it runs (``tandem partition move QUEUE P --to NODES``): the
group's placements that override the distribution policy.

A placement is the group's state, like the drained members (:mod:`broker.drain`): a
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

import logging
from collections.abc import Collection, Mapping
from typing import Protocol

from broker.forward import MoveFwd, pack_reply
from broker.security import CatalogueHost, catalogue_change
from client.errors import InvalidArgumentError
from storage.base import PutMeta, QueueMeta, SetPlacement, WriteOp

log = logging.getLogger("tandem.broker")

#: ``Recovered.meta`` key of a partition's placement: "placed.<qid>.<p>" -> "moving n3,n1" or "placed n3,n1"
PLACED_KEY = "placed."

Key = tuple[int, int]


class MoveHost(CatalogueHost, Protocol):
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


def _meta_value(op: SetPlacement) -> str:
    return f"{'moving' if op.moving else 'placed'} {','.join(op.nodes)}"


class Moves:
    """The group's placements as this member applied them, and the moves asked here."""

    def __init__(self, node: MoveHost) -> None:
        self.node = node
        self.placed: dict[Key, tuple[str, ...]] = {}
        self.moving: set[Key] = set()

    def load(self, meta: Mapping[str, str], queue_ids: Collection[int]) -> None:
        """The placements of the queues ``queue_ids`` as the store recovered them."""
        for k, v in meta.items():
            if not k.startswith(PLACED_KEY):
                continue
            try:
                qid, p = (int(x) for x in k[len(PLACED_KEY):].split("."))
                state, nodes = v.split(" ", 1)
            except ValueError:
                log.error("store: ignoring a malformed placement %s=%r", k, v)
                continue
            if qid not in queue_ids:
                continue  # (a deleted queue's)
            self.placed[(qid, p)] = tuple(nodes.split(","))
            if state == "moving":
                self.moving.add((qid, p))

    # -- committed changes (every member applies them) ------------------------------------------

    def apply(self, op: SetPlacement) -> list[WriteOp]:
        """Apply a committed placement here; the ops to store."""
        key = (op.queue_id, op.partition)
        was = (self.placed.get(key), key in self.moving)
        self.placed[key] = op.nodes
        (self.moving.add if op.moving else self.moving.discard)(key)
        if was != (op.nodes, op.moving):
            log.warning("partition %d/%d %s %s (group state)", key[0], key[1],
                        "moving to" if op.moving else "now placed on", ", ".join(op.nodes))
            self.node.placement_changed(key)
        return [PutMeta(f"{PLACED_KEY}{key[0]}.{key[1]}", _meta_value(op))]

    def forget(self, queue_id: int) -> None:
        """Queue ``queue_id`` was deleted: its placements go with it."""
        for key in [k for k in self.placed if k[0] == queue_id]:
            del self.placed[key]
            self.moving.discard(key)

    def snapshot(self) -> list[SetPlacement]:
        """The placements, for the catalogue's snapshot."""
        return [SetPlacement(k[0], k[1], nodes, k in self.moving) for k, nodes in sorted(self.placed.items())]

    def install(self, ops: list[SetPlacement]) -> list[WriteOp]:
        """Replace the placements with a snapshot's; the ops to store."""
        out: list[WriteOp] = []
        for op in ops:
            out.extend(self.apply(op))
        return out

    # -- moves asked for on this member -----------------------------------------------------------

    async def move(self, queue: str, partition: int, nodes: tuple[str, ...], by: str, hops: int = 0) -> None:
        """Place ``queue``'s partition ``partition`` on ``nodes`` (priority order), for the
        whole group: returns once the move is committed and applied here (the copies move
        after).  InvalidArgumentError for an unknown queue, partition or member, a list
        that repeats a node, a partition already moving, or one already on that list."""
        refusal = self.node.move_refusal()
        if refusal:
            raise InvalidArgumentError(refusal)
        meta = self.node.queue_meta(queue)
        if meta is None:
            raise InvalidArgumentError(f"partition move: no queue {queue!r}")
        if not 0 <= partition < meta.partitions:
            raise InvalidArgumentError(f"partition move: queue {queue} has partitions 0..{meta.partitions - 1}, "
                                       f"not {partition}")
        members = self.node.group_members()
        names = [n.partition(":")[0] for n in nodes]
        unknown = [n for n in names if n not in members]
        if not nodes or unknown:
            what = "no nodes given" if not nodes else "no member " + ", ".join(unknown)
            raise InvalidArgumentError(f"partition move: {what} (members: {', '.join(members)})")
        if len(set(names)) != len(names):
            raise InvalidArgumentError(f"partition move: a node appears twice in {','.join(nodes)}")
        kinds = [n.partition(":")[2] for n in nodes]
        bad = next((n for n, k in zip(nodes, kinds) if k not in ("", "sync", "async")), None)
        if bad is not None:
            raise InvalidArgumentError(f"partition move: {bad!r}: a node's kind is sync or async (name:sync, "
                                       f"name:async)")
        if kinds[0] == "async":
            raise InvalidArgumentError(f"partition move: the first node, {names[0]}, is the active: it cannot "
                                       f"be async")
        key = (meta.id, partition)

        def check() -> WriteOp:
            if key in self.moving:
                raise InvalidArgumentError(f"partition {queue}/{partition} is already moving to "
                                           f"{','.join(self.placed[key])}: wait until it is there")
            if self.node.nodes_of(key) == self.node.spec_of(nodes):
                raise InvalidArgumentError(f"partition {queue}/{partition} is already on {','.join(nodes)}")
            return SetPlacement(meta.id, partition, nodes, True)

        await catalogue_change(self.node, f"move partition {queue}/{partition}", check,
                               MoveFwd(hops + 1, meta.id, partition, ",".join(nodes), 1, by), hops,
                               local=lambda _op: None)
        log.warning("PARTITION MOVE by %s: %s/%d to %s", by, queue, partition, ",".join(nodes))

    async def finished(self, key: Key, nodes: tuple[str, ...], hops: int = 0) -> None:
        """The partition's active: its log's members are ``nodes``' now (committed)."""

        def check() -> WriteOp:
            if key not in self.moving or self.placed.get(key) != nodes:
                raise InvalidArgumentError(f"partition {key[0]}/{key[1]} is not moving to {','.join(nodes)}")
            return SetPlacement(key[0], key[1], nodes, False)

        await catalogue_change(self.node, f"finish the move of partition {key[0]}/{key[1]}", check,
                               MoveFwd(hops + 1, key[0], key[1], ",".join(nodes), 0, "the partition's active"),
                               hops, local=lambda _op: None)

    async def retarget(self, key: Key, nodes: tuple[str, ...], hops: int = 0) -> None:
        """A partition whose move is under way goes to ``nodes`` instead (a group change took
        a node of its list out, broker.members): its active changes the members toward the new
        list from where they are (a copy not made yet is dropped)."""

        def check() -> WriteOp:
            if key not in self.moving:
                raise InvalidArgumentError(f"partition {key[0]}/{key[1]} is not moving")
            return SetPlacement(key[0], key[1], nodes, True)

        await catalogue_change(self.node, f"re-target the move of partition {key[0]}/{key[1]}", check,
                               MoveFwd(hops + 1, key[0], key[1], ",".join(nodes), 2, "the group's re-spread"),
                               hops, local=lambda _op: None)

    async def forwarded(self, req: MoveFwd) -> bytes:
        """A member forwarded a move here (this node is the catalogue's active)."""
        nodes = tuple(req.nodes.split(","))
        if req.moving == 1:
            q = self.node.queue_meta_of(req.queue_id)
            if q is None:
                raise InvalidArgumentError(f"forwarded move: no queue #{req.queue_id}")
            await self.move(q.name, req.partition, nodes, req.by, max(1, req.hops))
        elif req.moving == 0:
            await self.finished((req.queue_id, req.partition), nodes, max(1, req.hops))
        elif req.moving == 2:
            await self.retarget((req.queue_id, req.partition), nodes, max(1, req.hops))
        else:
            raise InvalidArgumentError(f"forwarded move: moving is {req.moving}, not 0, 1 or 2")
        return pack_reply(self.node.catalogue_commit())
