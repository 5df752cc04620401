"""Re-partitioning a queue while it runs: partitions added (``tandem partition add``),
another data mapper installed, and ``tandem partition update`` re-mapping every message by
calling the queue's mapper again.

Both are the group's state, changed through the catalogue like a move (:mod:`broker.partitions.moves`):

* **add**: the queue's definition with more partitions (a ``PutQueue`` of the same id, and
  for a ``static`` queue the new partitions' node lists, in one entry).  Every member opens
  the new partitions' logs; clients learn the new map (``MapChanged``) and their mappers
  place what they send from then on over every partition.  Nothing already stored moves.
* **update**: after an audit (every member must see the queue alike: partitions, mapper,
  node lists), ``SetUpdating`` names every partition as pending (and a ``PutQueue`` installs
  the new mapper first, if one is given).  Each partition's active, and only it, sweeps its
  partition (its state ``Updating``): the partition delivers nothing meanwhile (its
  outstanding deliveries are taken back and made ready again), and every ready message
  whose key the mapper now places elsewhere is published to that partition and then
  settled here, in offset order.  Then the active says the partition is done; the update
  ends when every one is.

A message is republished under the producer id ``remap.<queue id>.<partition>`` with its
offset as the sequence number, in increasing offsets for each target partition, so the
target's idempotent-producer check drops what a sweep cut short (a failover) had sent
already; a new active of the partition sweeps again from the start.  The message keeps its
id (``x-tandem-id``, the partition and offset it was first stored at), its key, headers
and body.  Messages without a key stay where they are (no key's order to keep).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Collection, Coroutine, Iterable, Mapping
from typing import Any, Protocol

from broker.messaging.forward import AuditFwd, RemapFwd, decode_reply, pack_reply
from broker.messaging.mapper import parse_static
from broker.messaging.outcome import Outcome
from broker.messaging.publish import PublishRequest, PublishResult
from broker.messaging.declare import MAX_PARTITIONS
from broker.messaging.message import DELAY_HEADER, DELIVER_AT_HEADER, ID_HEADER, Msg, msg_from_store
from broker.messaging.queues import Queue
from broker.security.security import CatalogueHost, catalogue_change, commit_catalogue
from client.clock import Clock
from client.errors import InvalidArgumentError, NotActiveError, TandemError, UnavailableError
from client.mapper import make_mapper
from client.protocol.frames import PublishMessage
from storage.base import PutMeta, PutQueue, QueueMeta, SetUpdating, Settle, WriteOp

log = logging.getLogger("tandem.broker")

#: ``Recovered.meta`` key of an update under way: "updating.<qid>" -> "0,2,3" (the partitions
#: still to re-map; "" none)
UPDATING_KEY = "updating."

#: messages per republished batch, and its bytes at most (one message at least)
BATCH = 500
BATCH_BYTES = 4 * 1024 * 1024

#: seconds before a sweep that failed (a target partition without an active, say) starts again
RETRY = 1.0



Key = tuple[int, int]


class RemapQueues(Protocol):
    """The queues as re-partitioning sees them: their definitions, where their partitions are
    placed, and what a changed definition or an update sets off."""

    def remap_refusal(self) -> str | None:
        """Why re-partitioning does not apply to this node's group (None: allowed)."""
        ...

    def catalogue_put(self, meta: QueueMeta) -> bool:
        """Apply a queue's changed definition here (more partitions, another mapper)."""
        ...

    def queue_meta(self, name: str) -> QueueMeta | None: ...

    def queue_by_id(self, queue_id: int) -> Queue | None: ...

    def group_members(self) -> tuple[str, ...]: ...

    def nodes_of(self, key: Key) -> tuple[str, ...]: ...

    def static_lists(self, queue_id: int) -> tuple[tuple[str, ...], ...] | None: ...

    def static_placement(self, meta: QueueMeta, lists: tuple[tuple[str, ...], ...],
                         first: int = 0) -> list[WriteOp]: ...

    def updating_changed(self, queue_id: int) -> None:
        """An update started or ended for the queue: pause or resume its partitions."""
        ...


class Sweeping(Protocol):
    """What a sweep does on a partition's active: its messages, in memory and in the store,
    their commits, the partition's state, and the sweep's own task and time."""

    clock: Clock

    def serves(self, q: Queue, pidx: int) -> bool:
        """Whether this node is the partition's active and serves it now."""
        ...

    async def commit_ops(self, key: Key, ops: list[WriteOp]) -> None:
        """Commit ``ops`` of partition ``key`` (served here); raise on failure."""
        ...

    async def read_cold(self, q: Queue, pidx: int, offset: int, limit: int) -> tuple[int, list[Any]]: ...

    def take_back(self, q: Queue, pidx: int) -> int:
        """Take back the partition's unsettled deliveries: ready again; how many."""
        ...

    def partition_event(self, key: Key, event: str, why: str) -> None:
        """The partition's state machine (ha.partition): "update" or "done"."""
        ...

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...


class Publishing(Protocol):
    """The publish path (:class:`broker.messaging.publish.Publisher`)."""

    def publish(self, req: PublishRequest) -> Outcome[PublishResult]: ...


class Remaps:
    """The updates under way as this member applied them, and the sweeps it runs."""

    def __init__(self, catalogue: CatalogueHost, queues: RemapQueues, here: Sweeping,
                 publisher: Publishing) -> None:
        self.catalogue = catalogue  # where a change is decided and committed
        self.queues = queues
        self.here = here  # this node as a partition's active: what a sweep reads, commits and runs
        self.publisher = publisher
        #: queue id -> the partitions still to re-map
        self.pending: dict[int, frozenset[int]] = {}
        self._sweeping: set[Key] = set()
        #: messages a sweep found in their target partition already (a cut sweep's), since start
        self.already = 0

    def load(self, meta: Mapping[str, str], queue_ids: Collection[int]) -> None:
        self.pending = {}  # (shared mode: what an earlier term here knew is the store's now)
        for k, v in meta.items():
            if not k.startswith(UPDATING_KEY) or not v:
                continue
            try:
                qid = int(k[len(UPDATING_KEY):])
                parts = frozenset(int(x) for x in v.split(","))
            except ValueError:
                log.error("store: ignoring a malformed update %s=%r", k, v)
                continue
            if qid in queue_ids:
                self.pending[qid] = parts

    # -- committed changes (every member applies them) ------------------------------------------

    def apply(self, op: SetUpdating) -> list[WriteOp]:
        was = self.pending.get(op.queue_id)
        now = (was or frozenset()) - set(op.finished) if op.finished else frozenset(op.pending)
        if now:
            self.pending[op.queue_id] = now
        else:
            self.pending.pop(op.queue_id, None)
        if was != (now or None):
            if not was:
                log.warning("queue #%d: update started: partitions %s re-map their messages", op.queue_id,
                            ",".join(map(str, sorted(now))))
            elif not now:
                log.warning("queue #%d: update done: every message is where the mapper places it", op.queue_id)
            self.queues.updating_changed(op.queue_id)
            for p in sorted(now):
                self.served((op.queue_id, p))
        return [PutMeta(f"{UPDATING_KEY}{op.queue_id}", ",".join(map(str, sorted(now))))]

    def forget(self, queue_id: int) -> None:
        self.pending.pop(queue_id, None)

    def snapshot(self) -> list[SetUpdating]:
        return [SetUpdating(qid, tuple(sorted(parts))) for qid, parts in sorted(self.pending.items())]

    def install(self, ops: list[SetUpdating]) -> list[WriteOp]:
        out: list[WriteOp] = []
        for qid in [q for q in self.pending if q not in {op.queue_id for op in ops}]:
            out.extend(self.apply(SetUpdating(qid, ())))
        for op in ops:
            out.extend(self.apply(op))
        return out

    def paused(self, queue_id: int) -> frozenset[int]:
        return self.pending.get(queue_id, frozenset())

    def under_way(self, names: Mapping[int, str]) -> list[str]:
        """"queue p,p,..." of every update under way (StatusOk.updating)."""
        return [f"{names.get(qid, f'#{qid}')} {','.join(map(str, sorted(parts)))}"
                for qid, parts in sorted(self.pending.items())]

    def view(self, name: str) -> str:
        """How this member sees queue ``name``: partitions, mapper, each partition's nodes."""
        meta = self.queues.queue_meta(name)
        if meta is None:
            return "no such queue"
        lists = ";".join(",".join(self.queues.nodes_of((meta.id, p))) for p in range(meta.partitions))
        return f"partitions={meta.partitions} mapper={meta.mapper} nodes={lists}"

    # -- changes asked for on this member -----------------------------------------------------------

    def _queue(self, what: str, name: str) -> QueueMeta:
        refusal = self.queues.remap_refusal()
        if refusal:
            raise InvalidArgumentError(f"{what}: {refusal}")
        meta = self.queues.queue_meta(name)
        if meta is None:
            raise InvalidArgumentError(f"{what}: no queue {name!r}")
        return meta

    def _busy(self, what: str, meta: QueueMeta) -> None:
        left = self.pending.get(meta.id)
        if left:
            raise InvalidArgumentError(f"{what}: queue {meta.name} is being updated (partitions "
                                       f"{','.join(map(str, sorted(left)))} left): wait until it is done")

    async def add(self, queue: str, count: int, placement: str, by: str, hops: int = 0) -> QueueMeta:
        """Give ``queue`` ``count`` partitions more (``placement``: their node lists, for a
        static queue); returns its definition once the change is applied here."""
        meta = self._queue("partition add", queue)
        if count < 1:
            raise InvalidArgumentError(f"partition add: {count}: add one partition at least")
        total = meta.partitions + count
        if total > MAX_PARTITIONS:
            raise InvalidArgumentError(f"partition add: {meta.partitions} + {count} partitions: at most "
                                       f"{MAX_PARTITIONS}")
        if total > meta.ring_size:
            raise InvalidArgumentError(f"partition add: {total} partitions exceed the queue's ring_size "
                                       f"{meta.ring_size}")
        static = self.queues.static_lists(meta.id) is not None
        lists = parse_static(placement, count) if placement else ()
        if static and not lists:
            raise InvalidArgumentError(f"partition add: queue {queue} places its partitions on explicit node "
                                       f"lists: give the new ones' (--placement)")

        def check() -> list[WriteOp]:
            now = self.queues.queue_meta(queue)
            if now is None or now.id != meta.id:
                raise InvalidArgumentError(f"partition add: no queue {queue!r}")
            self._busy("partition add", now)
            if now.partitions != meta.partitions:
                raise InvalidArgumentError(f"partition add: queue {queue} has {now.partitions} partitions now, "
                                           f"not {meta.partitions}: ask again")
            new = dataclasses.replace(now, partitions=total)
            return [PutQueue(new), *self.queues.static_placement(new, lists, meta.partitions)] if lists \
                else [PutQueue(new)]

        await self._change(f"add partitions to {queue}", check,
                           RemapFwd(hops + 1, "add", meta.id, count, "", placement, 0, by), hops)
        log.warning("PARTITION ADD by %s: %s now has %d partitions", by, queue, total)
        return self.queues.queue_meta(queue) or meta

    async def update(self, queue: str, mapper: str, by: str, hops: int = 0) -> QueueMeta:
        """Re-map every message of ``queue`` by its mapper (``mapper``: installed first, if
        given); returns once the update is under way (applied here)."""
        meta = self._queue("partition update", queue)
        if mapper:
            make_mapper(mapper, meta.partitions, meta.ring_size)  # (InvalidArgumentError if it does not load)
        if (mapper or meta.mapper) == "round_robin":
            raise InvalidArgumentError("partition update: the mapper round_robin places messages in turn, not by "
                                       "key: there is nothing to re-map (name a keyed mapper with --mapper)")
        if meta.type == "stream":
            raise InvalidArgumentError(f"partition update: {meta.name} is a stream: its messages keep their "
                                       f"partitions and offsets (readers and their stored offsets count on them); "
                                       f"partitions added to it take what is published from then on")
        if hops == 0:
            await self._audit(meta)

        def check() -> list[WriteOp]:
            now = self.queues.queue_meta(queue)
            if now is None or now.id != meta.id:
                raise InvalidArgumentError(f"partition update: no queue {queue!r}")
            self._busy("partition update", now)
            ops: list[WriteOp] = []
            if mapper and mapper != now.mapper:
                ops.append(PutQueue(dataclasses.replace(now, mapper=mapper)))
            ops.append(SetUpdating(now.id, tuple(range(now.partitions))))
            return ops

        await self._change(f"update {queue}", check,
                           RemapFwd(hops + 1, "update", meta.id, 0, mapper, "", 0, by), hops)
        log.warning("PARTITION UPDATE by %s: %s re-maps its messages%s", by, queue,
                    f" with mapper {mapper}" if mapper else "")
        return self.queues.queue_meta(queue) or meta

    async def _audit(self, meta: QueueMeta) -> None:
        """Every member sees the queue alike, or InvalidArgumentError naming who differs."""
        mine = self.view(meta.name)
        differ = []
        for member in self.queues.group_members():
            if member == self.catalogue.config.name:
                continue
            try:
                theirs = str(decode_reply(await self.catalogue.forward(member, AuditFwd(meta.name))))
            except TandemError as exc:
                # (unreachable for now, a lost link say: UNAVAILABLE, which a client asks again)
                kind = UnavailableError if isinstance(exc, UnavailableError) else InvalidArgumentError
                raise kind(f"partition update: {member} did not answer the audit ({exc.message}): every member must "
                           f"agree on the queue's partitions first") from None
            if theirs != mine:
                differ.append(f"{member} has {theirs}")
        if differ:
            raise InvalidArgumentError(f"partition update: the members do not agree on queue {meta.name} "
                                       f"({self.catalogue.config.name} has {mine}; {'; '.join(differ)}): wait until "
                                       f"they have caught up")

    async def done(self, key: Key, hops: int = 0) -> None:
        """The partition's active: partition ``key`` is re-mapped."""

        def check() -> WriteOp:
            if key[1] not in self.pending.get(key[0], frozenset()):
                raise InvalidArgumentError(f"partition {key[0]}/{key[1]} is not being updated")
            return SetUpdating(key[0], (), (key[1],))

        await self._change(f"end the update of partition {key[0]}/{key[1]}", check,
                           RemapFwd(hops + 1, "done", key[0], 0, "", "", key[1], "the partition's active"), hops)

    async def _change(self, what: str, check: Callable[[], WriteOp | list[WriteOp]], fwd: RemapFwd,
                      hops: int) -> None:
        """Commit a change of the queue's partitioning: through the catalogue's log where every
        member applies it (``CommitPath.catalogue_log``: a replication group); else straight to
        the one store (a single node, the shared-mode lock holder), then applied here."""
        if self.catalogue.commit.catalogue_log:
            await catalogue_change(self.catalogue, what, check, fwd, hops, local=lambda _op: None)
            return
        refusal = self.catalogue.refusal()
        if refusal is not None:
            raise refusal
        made = check()
        ops = made if isinstance(made, list) else [made]
        stored: list[WriteOp] = []
        for op in ops:
            if isinstance(op, SetUpdating):
                was = self.pending.get(op.queue_id, frozenset())
                now = was - set(op.finished) if op.finished else frozenset(op.pending)
                stored.append(PutMeta(f"{UPDATING_KEY}{op.queue_id}", ",".join(map(str, sorted(now)))))
            else:
                stored.append(op)
        await commit_catalogue(self.catalogue, stored)
        for op in ops:
            if isinstance(op, PutQueue):
                self.queues.catalogue_put(op.queue)
            elif isinstance(op, SetUpdating):
                self.apply(op)

    def start(self) -> None:
        """At a start where this node serves every partition (a single node, or shared mode):
        the sweeps of an update a stop cut short."""
        for qid, parts in list(self.pending.items()):
            for p in sorted(parts):
                self.served((qid, p))

    async def forwarded(self, req: RemapFwd) -> bytes:
        """A member forwarded a change here (this node is the catalogue's active)."""
        hops = max(1, req.hops)
        q = self.queues.queue_by_id(req.queue_id)
        if q is None:
            raise InvalidArgumentError(f"forwarded re-partitioning: no queue #{req.queue_id}")
        if req.action == "add":
            await self.add(q.name, req.count, req.placement, req.by, hops)
        elif req.action == "update":
            await self.update(q.name, req.mapper, req.by, hops)
        elif req.action == "done":
            await self.done((req.queue_id, req.partition), hops)
        else:
            raise InvalidArgumentError(f"forwarded re-partitioning: action {req.action!r} is not add, update or "
                                       f"done")
        return pack_reply(self.catalogue.catalogue_commit())

    # -- the sweep, on a partition's active ---------------------------------------------------------

    def served(self, key: Key) -> None:
        """Partition ``key`` may need a sweep here: start one if it is pending and this node
        serves it (called as updates apply and as this node becomes an active)."""
        q = self.queues.queue_by_id(key[0])
        if q is not None and key[1] in self.pending.get(key[0], ()) and key not in self._sweeping \
                and self.here.serves(q, key[1]):
            self._sweeping.add(key)
            self.here.spawn(self._sweep(key))

    async def _sweep(self, key: Key) -> None:
        here = self.here
        q = self.queues.queue_by_id(key[0])
        label = f"{q.name if q is not None else f'#{key[0]}'}/{key[1]}"
        try:
            while q is not None and not q.deleted and key[1] in self.pending.get(key[0], ()) and here.serves(q, key[1]):
                here.partition_event(key, "update", "re-mapping its messages (tandem partition update)")
                try:
                    back = here.take_back(q, key[1])
                    moved, already = 0, self.already
                    while True:
                        n = await self._pass(q, key[1])
                        moved += n
                        if not n:
                            break
                    await self.done(key)
                    there = self.already - already
                    log.warning("partition %s: update: %d message(s) re-mapped to other partitions%s%s", label,
                                moved, f" ({back} delivery(ies) taken back first)" if back else "",
                                f"; {there} of them were there already (sent by a sweep cut short)" if there else "")
                    return
                except TandemError as exc:
                    log.warning("partition %s: update interrupted (%s): again in %.0f s", label, exc.message, RETRY)
                    await here.clock.sleep(RETRY)
        finally:
            self._sweeping.discard(key)
            here.partition_event(key, "done", "re-mapped")
        # (this node may serve the partition again already, its messages loaded anew, while this
        # sweep had the old ones: the new ones are swept now)
        self.served(key)

    async def _pass(self, q: Queue, pidx: int) -> int:
        """One pass over the partition's ready messages, in offset order: the in-memory head,
        then the backlog in the store.  How many moved elsewhere.

        The messages are this node's only while it serves the partition: once it stops
        (another node is elected, or this one again, with the messages loaded anew) nothing
        taken from memory goes back there, nothing is counted off it, and nothing more is
        sent; the pass ends with NotActiveError."""
        part = q.partitions[pidx]
        gen = part.generation
        hot = q.take_hot(part)
        try:
            away = await self._targets(q, pidx, gen, hot)
        except TandemError:
            if part.generation == gen:
                q.requeue(hot)
            raise
        keep = away.pop(pidx, None)
        if keep:
            q.requeue(keep)
        settled: list[Msg] = []
        try:
            moved = await self._relocate(q, pidx, gen, away, settled.extend)
        except TandemError:
            if part.generation == gen:
                gone = {m.offset for m in settled}
                q.requeue([m for lst in away.values() for m in lst if m.offset not in gone])  # (ready again here)
            raise
        if not part.cold_count:
            return moved
        while part.reading:  # (a refill under way: its messages join the head first)
            await self.here.clock.sleep(0.01)
            self._check(q, pidx, gen)
        part.reading = True  # (no refill meanwhile: the sweep reads the backlog itself)
        try:
            offset = part.cold_start
            while part.cold_count and offset < part.cold_end:
                stored_end, stored = await self.here.read_cold(q, pidx, offset, BATCH)
                self._check(q, pidx, gen)
                msgs = [msg_from_store(pidx, m) for m in stored if m.offset < min(stored_end, part.cold_end)]
                if not msgs:
                    if stored_end >= part.cold_end:
                        break  # (the rest of the region is settled)
                    await self.here.clock.sleep(0.05)  # (the store has not written them yet)
                    self._check(q, pidx, gen)
                    continue
                offset = msgs[-1].offset + 1
                away = await self._targets(q, pidx, gen, msgs)
                away.pop(pidx, None)
                moved += await self._relocate(q, pidx, gen, away, lambda batch: q.forget_cold(part, batch))
        finally:
            if part.generation == gen:
                part.reading = False
        return moved

    def _check(self, q: Queue, pidx: int, gen: int) -> None:
        """NotActiveError unless this node still serves the partition with the messages a
        pass started from (generation ``gen``)."""
        if q.partitions[pidx].generation != gen or not self.here.serves(q, pidx):
            raise NotActiveError(f"partition {q.name}/{pidx} is no longer served here as it was when the "
                                 f"pass started", active_hint=None)

    async def _targets(self, q: Queue, pidx: int, gen: int, msgs: list[Msg]) -> dict[int, list[Msg]]:
        """``msgs`` (in offset order) by the partition the mapper places each in (``pidx``:
        those without a key), a slice of BATCH at a time: the node's other work (its peer
        links' keep-alives above all) runs between slices, as a mapper call for each of a
        large in-memory head holds the loop for longer than a peer waits for an answer."""
        out: dict[int, list[Msg]] = {}
        where: Callable[[str], int] = q.mapper.partition
        for i in range(0, len(msgs), BATCH):
            if i:
                await self.here.clock.sleep(0)
                self._check(q, pidx, gen)
            for m in msgs[i:i + BATCH]:
                out.setdefault(pidx if m.key is None else where(m.key), []).append(m)
        return out

    async def _relocate(self, q: Queue, pidx: int, gen: int, by_target: Mapping[int, list[Msg]],
                        settled: Callable[[list[Msg]], object]) -> int:
        """Publish ``by_target``'s messages (in offset order) to their target partitions, a
        batch at a time, each settled here once its target has it (``settled(batch)`` then),
        while the partition is served here as it was at generation ``gen`` (:meth:`_check`)."""
        pid = f"remap.{q.meta.id}.{pidx}"
        for target, lst in sorted(by_target.items()):
            for batch in _batches(lst):
                self._check(q, pidx, gen)
                r = await self.publisher.publish(PublishRequest(
                    q.name, pid, [PublishMessage(m.key, _moved_headers(m), m.body, m.offset) for m in batch],
                    partition=target))
                self.already += r.duplicates  # (a sweep cut short sent them: the target kept its copy)
                await self.here.commit_ops((q.meta.id, pidx), [Settle(q.meta.id, pidx, [m.offset for m in batch])])
                self._check(q, pidx, gen)
                settled(batch)
        return sum(map(len, by_target.values()))


def _batches(msgs: list[Msg]) -> Iterable[list[Msg]]:
    """``msgs`` in order, in batches of at most BATCH messages and BATCH_BYTES."""
    batch: list[Msg] = []
    size = 0
    for m in msgs:
        n = len(m.body) + len(m.headers_blob)
        if batch and (len(batch) >= BATCH or size + n > BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(m)
        size += n
    if batch:
        yield batch


def _moved_headers(m: Msg) -> dict[str, str]:
    """A re-mapped message's headers: its first id kept, and a delay as the time it is due (its
    publish time here is new; an ``expiration`` counts from it again)."""
    headers = {**m.headers, ID_HEADER: m.headers.get(ID_HEADER, m.id)}
    if m.due and DELAY_HEADER in headers:
        del headers[DELAY_HEADER]
        headers[DELIVER_AT_HEADER] = str(int(m.due * 1000) + 1)
    return headers
