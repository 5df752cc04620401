"""The queue catalogue: declare, delete and purge, on one node or across a group.

On a single node a declare or delete is one store commit.  In a group the catalogue is a
replicated log of its own (the partition key :data:`~broker.messaging.commit.CATALOGUE`) with an
elected active: a member forwards declares and deletes to it, and every member applies a
committed change (``apply_put`` / ``apply_drop``), so a queue exists on every member once
its declare is confirmed.  A purge and a queue's depth are asked of each partition's active.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection
from typing import Protocol

from broker.messaging.commit import CATALOGUE
from broker.messaging.forward import (MAX_HOPS, CatalogueFwd, DeclareFwd, DeleteFwd, DepthFwd, Forwarding,
                                      ForwardRequest, PurgeFwd, decode_reply, refused_as_longer)
from broker.messaging import holders
from broker.messaging.mapper import DEFAULT_MAPPER
from broker.messaging.mapper import parse_static
from broker.messaging.declare import validate_declare
from broker.messaging.holders import Holder
from broker.messaging.message import MemoryBudget
from broker.messaging.queues import Queue
from client.clock import Clock
from client.errors import InvalidArgumentError, QueueExistsError, QueueNotFoundError, TandemError, UnavailableError
from client.protocol.codec import encode
from client.protocol.frames import Declare, QueueInfo
from storage.base import DropQueue, PutQueue, QueueMeta, SetFeatureLevel, Settle, WriteOp

log = logging.getLogger("tandem.broker")


class CatalogueHost(Forwarding, Protocol):
    @property
    def holders(self) -> Collection[Holder]: ...

    @property
    def clock(self) -> Clock: ...

    async def applied(self, what: str, done: Callable[[], bool]) -> None:
        """Until ``done()``: a committed catalogue change is applied here."""
        ...

    def catalogue_applied(self) -> int: ...

    def check_disk(self, what: str) -> None:
        """Raise UnavailableError while this node's disk alarm is raised."""
        ...


class Placing(Protocol):
    """Where a queue declared with node lists (``static`` distribution) is placed."""

    def static_lists(self, queue_id: int) -> tuple[tuple[str, ...], ...] | None:
        """The node lists of a queue declared with them (``static`` distribution), as
        ``name:sync`` / ``name:async`` entries; None for a ``dynamic`` queue."""
        ...

    def static_placement(self, meta: QueueMeta, lists: tuple[tuple[str, ...], ...]) -> list[WriteOp]:
        """The ops that place a new queue's partitions on ``lists``, checked against the
        group's members (InvalidArgumentError naming what is wrong)."""
        ...

    def feature_level(self) -> int:
        """The group's feature level as this member applied it (broker.partitions.upgrade)."""
        ...

    def level_apply(self, op: SetFeatureLevel) -> list[WriteOp]:
        """Raise the level here (a committed finalize, or a single node's own); the ops to store."""
        ...

    def unbinding(self, queue: str) -> list[WriteOp]:
        """What deleting ``queue`` removes with it, its bindings (broker.partitions.topology):
        catalogue ops in a group, else the store's (applied here at once)."""
        ...


def settings(meta: QueueMeta) -> dict[str, object]:
    return {
        "partitions": meta.partitions, "mapper": meta.mapper, "ring_size": meta.ring_size,
        "max_deliveries": meta.max_deliveries, "dead_letter_queue": meta.dead_letter_queue,
        "max_length": meta.max_length, "max_length_bytes": meta.max_length_bytes, "overflow": meta.overflow,
        "message_ttl": meta.message_ttl, "expires": meta.expires, "type": meta.type, "max_age": meta.max_age,
        "max_bytes": meta.max_bytes, "dead_letter_exchange": meta.dead_letter_exchange,
        "dead_letter_routing_key": meta.dead_letter_routing_key,
    }


#: the feature level a queue's overflow (max_length_bytes, drop-head) and message_ttl need (ha.upgrade.LEVELS)
OVERFLOW_LEVEL = 3


#: the feature level a stream (type, max_age, max_bytes) needs
STREAM_LEVEL = 5
#: transactions: registers in the partitions they write to, held messages (broker.messaging.prepared)
TX_LEVEL = 6
#: a transaction's publish through an exchange: its parts forwarded to other members with its id
TX_ROUTED_LEVEL = 7
#: a queue's dead letters published through an exchange (dead_letter_exchange: version 4 of its record and row)
DLX_LEVEL = 8
#: the queue whose partitions coordinate transactions (broker.transactions.coordinator)
COORDINATOR_QUEUE = "tandem.transactions"


def needs_overflow_level(meta: QueueMeta | Declare) -> bool:
    return meta.max_length_bytes != 0 or meta.overflow != "reject-publish" or meta.message_ttl != 0 \
        or meta.expires != 0


class Catalogue:
    def __init__(self, node: CatalogueHost, placing: Placing | None = None) -> None:
        self.node = node
        #: (None: a catalogue without node lists, e.g. a tool's or a test's)
        self.placing = placing
        self.queues: dict[str, Queue] = {}
        self.next_id = 1
        #: bytes of ready messages held in memory, bounded by ``max_memory`` (broker.messaging.queues)
        self.budget = MemoryBudget(node.config.max_memory)

    def _placing(self) -> Placing:
        if self.placing is None:
            raise InvalidArgumentError("placement: this catalogue places no node lists")
        return self.placing

    def reset(self) -> None:
        """Forget every queue (shared mode: the store that holds them was closed, or is
        about to be read anew)."""
        self.queues = {}
        self.next_id = 1
        self.budget = MemoryBudget(self.node.config.max_memory)

    # -- lookups ---------------------------------------------------------------------------------

    def queue(self, name: str) -> Queue:
        q = self.queues.get(name)
        if q is None:
            raise QueueNotFoundError(f"queue {name!r} does not exist")
        return q

    def by_id(self, queue_id: int) -> Queue | None:
        for q in self.queues.values():
            if q.meta.id == queue_id:
                return q
        return None

    def add(self, meta: QueueMeta) -> Queue:
        q = self.queues[meta.name] = self._new(meta)
        self.next_id = max(self.next_id, meta.id + 1)
        return q

    def _new(self, meta: QueueMeta) -> Queue:
        q = Queue(meta, self.budget)
        q.now, q.monotonic = self.node.clock.time, self.node.clock.monotonic  # (timed by the node's clock)
        q.touch()
        return q

    # -- committed changes (every member applies them) ------------------------------------------

    def apply_put(self, meta: QueueMeta) -> bool:
        """A committed declare.  False if the name is taken by an earlier declare (two raced;
        the first committed wins)."""
        self.next_id = max(self.next_id, meta.id + 1)
        existing = self.queues.get(meta.name)
        if existing is not None:
            if existing.meta.id != meta.id:
                return False
            if existing.meta != meta:  # more partitions or another mapper (broker.partitions.remap)
                existing.alter(meta)
                log.warning("queue %s now has %d partitions, mapper %s (catalogue)", meta.name, meta.partitions,
                            meta.mapper)
            return True
        self.queues[meta.name] = self._new(meta)
        log.info("queue declared name=%s id=%d partitions=%d (catalogue)", meta.name, meta.id, meta.partitions)
        return True

    def apply_drop(self, queue_id: int) -> None:
        q = self.by_id(queue_id)
        if q is not None:
            self._drop(q)
            log.info("queue deleted name=%s (catalogue)", q.name)

    def _drop(self, q: Queue) -> None:
        q.deleted = True
        del self.queues[q.name]
        q.release()
        for c in list(q.consumers):
            c.session.cancelled_by_broker(c, f"queue {q.name!r} was deleted")

    # -- declare / delete -----------------------------------------------------------------------

    def _declared(self, frame: Declare, owner: str | None) -> tuple[QueueMeta, Queue | None]:
        """The queue a declare asks for, and the existing one of that name (same settings,
        or QueueExistsError naming what differs; its owner stays the one who declared it
        first)."""
        existing = self.queues.get(frame.queue)
        # a declare that names no mapper: the default for a new queue, the queue's own otherwise
        mapper = frame.mapper or (existing.meta.mapper if existing is not None else DEFAULT_MAPPER)
        meta = QueueMeta(
            id=self.next_id, name=frame.queue, partitions=frame.partitions, mapper=mapper,
            ring_size=frame.ring_size, max_deliveries=frame.max_deliveries,
            dead_letter_queue=frame.dead_letter_queue, max_length=frame.max_length, owner=owner,
            max_length_bytes=frame.max_length_bytes, overflow=frame.overflow, message_ttl=frame.message_ttl,
            expires=frame.expires, type=frame.type, max_age=frame.max_age, max_bytes=frame.max_bytes,
            dead_letter_exchange=frame.dead_letter_exchange, dead_letter_routing_key=frame.dead_letter_routing_key,
        )
        if existing is not None:
            wanted, have = settings(meta), settings(existing.meta)
            diff = [f"{k}: have {have[k]!r}, asked {wanted[k]!r}" for k in have if have[k] != wanted[k]]
            if frame.placement:
                # (a placement's kinds may be left out: compare the lists' nodes in order)
                static = self.placing.static_lists(existing.meta.id) if self.placing is not None else None
                asked = parse_static(frame.placement, frame.partitions)
                names = [[n.partition(":")[0] for n in nodes] for nodes in static or ()]
                if names != [[n.partition(":")[0] for n in nodes] for nodes in asked]:
                    have_text = ";".join(",".join(nodes) for nodes in static) if static else "dynamic"
                    diff.append(f"placement: have {have_text}, asked {frame.placement} (tandem partition move "
                                f"changes a partition's nodes)")
            if diff:
                raise QueueExistsError(f"queue {frame.queue!r} exists with other settings ({'; '.join(diff)})")
        return meta, existing

    async def declare(self, frame: Declare, hops: int = 0, *, owner: str | None = None) -> tuple[QueueInfo, bool]:
        """Declare the queue (``owner``: the user who asks, checked by its front end with
        ``AclTable.check_declare``; None: the node itself)."""
        validate_declare(frame)
        node = self.node
        commit = node.commit
        self._check_level(frame)
        who = await commit.wait_active(CATALOGUE, node.election_wait)
        if who != node.config.name:
            if hops >= MAX_HOPS:
                raise UnavailableError("declare forwarded too many times while the group elects: retry")
            req = DeclareFwd(hops + 1, encode(frame)[4:], owner or "")
            created = bool(decode_reply(await self._forward(who, req, frame.queue)))
        else:
            meta, existing = self._declared(frame, owner)
            if existing is not None:
                existing.touch()  # (declared again: in use)
                return existing.info(), False
            dlq = meta.dead_letter_queue
            if dlq and dlq not in self.queues:
                raise InvalidArgumentError(f"dead_letter_queue {dlq!r}: no such queue (declare it first: a message "
                                           f"dead-lettered there would have nowhere to go)")
            node.check_disk("declaring queues")
            placing: list[WriteOp] = []
            if frame.placement:
                if not commit.catalogue_log:
                    raise InvalidArgumentError("placement: explicit node lists need a replication group (this node "
                                               "runs alone, or in shared mode, where one node serves every "
                                               "partition)")
                placing = self._placing().static_placement(meta, parse_static(frame.placement, frame.partitions))
            self.next_id += 1
            if not commit.catalogue_log:
                need = STREAM_LEVEL if meta.type != "classic" else OVERFLOW_LEVEL if needs_overflow_level(meta) else 0
                need = TX_LEVEL if meta.name == COORDINATOR_QUEUE else need
                need = DLX_LEVEL if meta.dead_letter_exchange is not None else need
                if need and self.placing is not None and node.config.mode != "shared":
                    # a single node raises its own level (it has no member to wait for): an older build
                    # then refuses its store instead of reading its queues without their overflow or type
                    placing = self.placing.level_apply(SetFeatureLevel(need))
                q = self.add(meta)
                try:
                    await self._commit(PutQueue(meta), *placing)
                except TandemError:
                    if self.queues.pop(meta.name, None) is not None:
                        q.release()
                    raise
                log.info("queue declared name=%s partitions=%d mapper=%s", meta.name, meta.partitions, meta.mapper)
                return q.info(), True
            await self._commit(PutQueue(meta), *placing)  # (one entry: applied together everywhere)
            had = self.queues.get(frame.queue)
            created = had is not None and had.meta.id == meta.id
            if had is not None and not created and settings(had.meta) != settings(meta):
                raise QueueExistsError(f"queue {frame.queue!r} was declared concurrently with other settings")
        await node.applied(f"queue {frame.queue!r}", lambda: frame.queue in self.queues)
        return self.queue(frame.queue).info(), created

    def _check_level(self, frame: Declare) -> None:
        """A queue's overflow needs the group at feature level 3 (InvalidArgumentError saying what to do)."""
        if needs_overflow_level(frame):
            self.require_level(OVERFLOW_LEVEL, "max_length_bytes, overflow, message_ttl and expires need")
        if frame.type != "classic":
            self.require_level(STREAM_LEVEL, "streams need")
        if frame.dead_letter_exchange is not None:
            self.require_level(DLX_LEVEL, "a dead_letter_exchange needs")

    def require_level(self, level: int, what: str) -> None:
        """In a group, InvalidArgumentError unless it is at feature ``level`` (``what``: "<what> need")."""
        if self.placing is None or not self.node.commit.catalogue_log:
            return  # (a single node: see declare)
        have = self.placing.feature_level()
        if have < level:
            raise InvalidArgumentError(
                f"{what} the group at feature level {level} (it is at {have}): run `tandem upgrade finalize` "
                f"once every member runs a build that supports it (docs/upgrades.md)")

    async def _forward(self, who: str, req: DeclareFwd, queue: str) -> bytes:
        try:
            return await self.node.forward(who, req)
        except InvalidArgumentError as exc:
            if not req.owner or not refused_as_longer(exc, req):
                raise
        # the catalogue's active runs a build that keeps no owners (a rolling upgrade): its
        # queues have none, and dead-lettering from them is not checked against one
        log.warning("queue %s: the catalogue's active %s keeps no queue owners (an older build): declared "
                    "without one", queue, who)
        return await self.node.forward(who, DeclareFwd(req.hops, req.frame))

    async def delete(self, name: str, if_empty: bool, hops: int = 0, ready_only: bool = False) -> None:
        """``if_empty``: only if it holds no message (``ready_only``: no ready one, AMQP's reading)."""
        node = self.node
        q = self.queue(name)
        who = await node.commit.wait_active(CATALOGUE, node.election_wait)
        if who != node.config.name:
            if hops >= MAX_HOPS:
                raise UnavailableError("delete forwarded too many times while the group elects: retry")
            await self._forward_as_known(who, DeleteFwd(hops + 1, name, if_empty, ready_only),
                                         DeleteFwd(hops + 1, name, if_empty))
        else:
            users = sorted(o.name for o in self.queues.values() if o.meta.dead_letter_queue == name and o is not q)
            if users:
                raise InvalidArgumentError(f"queue {name!r} is the dead_letter_queue of {', '.join(users)}: delete "
                                           f"{'those' if len(users) > 1 else 'it'} first")
            if if_empty:
                if node.commit.catalogue_log:
                    depth = await self.depth(q, ready_only)
                else:
                    depth = q.ready_count + q.delayed_count if ready_only else q.depth
                if depth:
                    raise InvalidArgumentError(f"queue {name!r} is not empty ({depth} messages)")
            unbind = self.placing.unbinding(name) if self.placing is not None else []
            if not node.commit.catalogue_log:
                self._drop(q)
                await self._commit(DropQueue(q.meta.id), *unbind)
                log.info("queue deleted name=%s messages=%d", name, q.depth)
                return
            await self._commit(DropQueue(q.meta.id), *unbind)  # (one entry: applied together everywhere)
        await node.applied(f"queue {name!r}", lambda: name not in self.queues)

    async def _commit(self, op: DropQueue | PutQueue, *placing: WriteOp) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.node.commit.propose_catalogue([op, *placing], _resolver(fut))
        await fut

    async def catch_up(self) -> bool:
        """Apply every catalogue change the catalogue's active holds before answering that a
        queue does not exist.  A declare confirmed through another member may not have reached
        this one yet (its entry commits with a majority that need not include this member), so
        a client that declares and then consumes here would be told the queue is missing.
        True if this member applied catalogue changes meanwhile: a lookup that failed is worth
        one more try.  False if it had nothing to catch up, so "not found" stands.
        UnavailableError if it cannot tell: no active within the election wait, or the active
        cannot be asked (a link cut, or not yet back after this member was paused).  A member
        that has missed changes must not call a queue missing: a durable consumer would end for
        good on a queue that exists."""
        node = self.node
        if not node.commit.catalogue_log:
            return False
        before = node.catalogue_applied()
        try:
            who = await node.commit.wait_active(CATALOGUE, node.election_wait)
            if who == node.config.name:
                return False  # the active applies what it commits at once
            upto = int(decode_reply(await node.forward(who, CatalogueFwd())))
        except (TandemError, ValueError, TypeError) as exc:
            reason = exc.message if isinstance(exc, TandemError) else repr(exc)
            raise UnavailableError(f"{node.config.name} cannot tell whether the queue exists: it could not "
                                   f"ask the catalogue's active ({reason}); retry") from None
        await node.applied("the group's queue catalogue", lambda: node.catalogue_applied() >= upto)
        return node.catalogue_applied() > before

    # -- per partition: depth and purge -----------------------------------------------------------

    async def depth(self, q: Queue, ready_only: bool = False) -> int:
        """Messages in the queue (``ready_only``: those not delivered), asked of each partition's active."""

        async def here(pidx: int) -> int:
            return self.partition_depth(q, pidx, ready_only)

        return await self._sum_over_actives(q, lambda name, pidx: DepthFwd(name, pidx, ready_only), here)

    async def purge(self, name: str) -> int:
        """Drop the ready messages (delivered ones stay with their consumers)."""
        q = self.queue(name)
        total = await self._sum_over_actives(q, PurgeFwd, lambda pidx: self.purge_partition(q, pidx))
        log.info("queue purged name=%s messages=%d", q.name, total)
        return total

    async def _sum_over_actives(self, q: Queue, request: Callable[[str, int], DepthFwd | PurgeFwd],
                                here: Callable[[int], Awaitable[int]]) -> int:
        """For each partition: ``await here(p)`` on its active if that is this node, else the
        forwarded request; the sum of the answers."""
        node = self.node
        total = 0
        for pidx in range(q.meta.partitions):
            who = await node.commit.wait_active((q.meta.id, pidx), node.election_wait)
            if who == node.config.name:
                total += await here(pidx)
            else:
                req = request(q.name, pidx)
                older = DepthFwd(q.name, pidx) if isinstance(req, DepthFwd) else req
                total += int(decode_reply(await self._forward_as_known(who, req, older)))
        return total

    async def _forward_as_known(self, who: str, req: ForwardRequest, older: ForwardRequest) -> bytes:
        """``req`` to ``who``; to a member whose build lacks its later fields, ``older`` (the same
        without them, stricter: ready_only left out, unsettled messages count)."""
        try:
            return await self.node.forward(who, req)
        except InvalidArgumentError as exc:
            if older == req or not refused_as_longer(exc, req):
                raise
        log.info("%s to %s: its build is older, asked without its later fields", req.KIND.name.lower(), who)
        return await self.node.forward(who, older)

    def served(self, name: str, pidx: int) -> Queue:
        """The queue, if this node is its partition's active; else the error a forwarder gets."""
        q = self.queue(name)
        if not 0 <= pidx < q.meta.partitions:
            raise InvalidArgumentError(f"queue {name!r} has no partition {pidx}")
        if not self.node.commit.serving((q.meta.id, pidx)):
            raise UnavailableError(f"partition {q.meta.id}/{pidx} is not active on {self.node.config.name}")
        return q

    def partition_depth(self, q: Queue, pidx: int, ready_only: bool = False) -> int:
        """Ready and (unless ``ready_only``) delivered-but-unsettled messages of one partition served here."""
        return holders.partition_depth(self.node.holders, q, pidx, ready_only)

    async def purge_partition(self, q: Queue, pidx: int) -> int:
        part = q.partitions[pidx]
        generation = part.generation  # (loaded anew meanwhile: the store's copies are there)
        msgs = q.take_hot(part)
        cold = q.take_cold(part)
        count = len(msgs) + cold[2]
        if not count:
            return 0
        offsets = [m.offset for m in msgs]
        ops: list[WriteOp] = [Settle(q.meta.id, pidx, offsets)] if offsets else []
        # the cold region's offsets, in slices (some may be settled already: settling again is a no-op)
        ops += [Settle(q.meta.id, pidx, list(range(s, min(s + SETTLE_SLICE, cold[1]))))
                for s in range(cold[0], cold[1], SETTLE_SLICE)] if cold[2] else []
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.node.commit.propose(ops, _resolver(fut), durable=True)
        try:
            await fut
        except TandemError:
            if not q.deleted and self.node.commit.serving((q.meta.id, pidx)) and part.generation == generation:
                if msgs:
                    q.requeue(msgs)
                q.restore_cold(part, cold)
            raise
        return count


#: offsets per Settle op when a purge settles a cold region
SETTLE_SLICE = 65536


def _resolver(fut: asyncio.Future[None]) -> Callable[[BaseException | None], None]:
    def done(err: BaseException | None) -> None:
        if not fut.done():
            if err is not None:
                fut.set_exception(err)
            else:
                fut.set_result(None)

    return done
