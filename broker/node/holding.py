"""What this node holds: the partitions it serves, their deliveries, and the users its sessions stand on.

:class:`Holding` is what the node's parts read of the partitions served here: the replication
driver tells it a partition is loaded or unloaded (:class:`broker.modes.replicated.host.NodeEvents`),
delivery reads and dead-letters through it (:mod:`broker.messaging.delivery`), an update's sweep
takes a partition's deliveries back (:mod:`broker.partitions.remap`), the quarantine and a restore
run reach the queues and the group through it (:mod:`broker.partitions.quarantine`,
:mod:`broker.partitions.restore_run`), and the security's changes end the sessions that no longer
stand (:mod:`broker.security.security`).  The node's settings, its replication and its shared
mode are made during the start: the facet reads them through what it is given, never a copy.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Coroutine, Mapping
from pathlib import Path
from typing import Any

from broker.config import NodeConfig
from broker.messaging.catalogue import Catalogue
from broker.messaging.commit import CommitPath
from broker.messaging.delivery import Delivery
from broker.messaging.forward import ForwardRequest
from broker.messaging.mapper import dead_letter_partition
from broker.messaging.outcome import Outcome
from broker.messaging.publish import Publisher, PublishRequest, PublishResult, sum_parts
from broker.messaging.holders import revoke_deliveries, take_back_deliveries
from broker.messaging.message import Msg
from broker.messaging.queues import Queue, Recipient
from broker.messaging.streams import Produced, StreamHost, produced, read_stream
from broker.messaging.window import Window
from broker.modes.replicated import Replication
from broker.modes.shared.mode import SharedMode
from broker.node.store import NodeStore
from broker.partitions.quarantine import QUEUE as QUARANTINE
from broker.partitions.remap import Remaps
from broker.partitions.topology import Topology
from broker.partitions.restore_run import MAX_EVENTS as RESTORE_EVENTS
from broker.security.acl import AclTable
from broker.security.auth import ClientGuard
from broker.security.users import UserRegistry
from broker.sessions.session import Session
from broker.sessions.status import NodeEvent
from client.clock import Clock
from client.protocol.frames import Declare, PublishMessage, QueueInfo, StreamMessage
from storage.base import PartitionState, Settle, StoredMessage, WriteOp
from storage.writer import Callback

log = logging.getLogger("tandem.broker")

#: bytes of ready messages a new active loads before it serves a partition (of its share of
#: max_memory): reading 256 MiB of a 1 GiB backlog held its writes for about 0.9 s
TAKEOVER_HEAD = 16 * 1024 * 1024


class Holding:
    """The partitions this node serves, the deliveries of them its holders have, its users and grants.

    ``node`` is the node as the path to the group (forwards, stream reads, the commit path);
    ``data_dir``, ``replication``, ``shared``, ``has_quorum`` and ``map_changed`` are read when
    called (made during the start); ``failed`` stops the node (replication failed)."""

    #: (set by :meth:`bind`: they are made with this facet)
    delivery: Delivery
    publisher: Publisher
    remaps: Remaps
    _store: NodeStore
    _topology: Topology

    def __init__(self, node: StreamHost, clock: Clock, *, catalogue: Catalogue, data_dir: Callable[[], Path],
                 replication: Callable[[], Replication | None], shared: Callable[[], SharedMode | None],
                 has_quorum: Callable[[], bool], map_changed: Callable[[], None], failed: Callable[[], None],
                 spawn: Callable[[Coroutine[Any, Any, Any]], None], sessions: Collection[Session],
                 users: UserRegistry, acls: AclTable, guard: ClientGuard, events: list[NodeEvent]) -> None:
        self._node, self.clock, self.catalogue = node, clock, catalogue
        self._data_dir, self._replication, self._shared = data_dir, replication, shared
        self._has_quorum, self._map_changed, self._failed, self._spawn = has_quorum, map_changed, failed, spawn
        self.sessions = sessions
        self.users, self.acls, self.guard = users, acls, guard
        self._events = events  # (the node's, in ``tandem status`` events)
        #: holders of deliveries inside the node (a restore's consumer): revoked like a session's
        self.local_holders: set[Recipient] = set()

    def bind(self, *, delivery: Delivery, publisher: Publisher, remaps: Remaps, store: NodeStore,
             topology: Topology) -> None:
        """The node's parts this one reads (made after it: some of them read it in turn)."""
        self.delivery, self.publisher, self.remaps, self._store = delivery, publisher, remaps, store
        self._topology = topology

    # -- the node's, as its parts read them ------------------------------------------------

    @property
    def config(self) -> NodeConfig:
        return self._node.config

    @property
    def name(self) -> str:
        return self._node.config.name

    @property
    def data_dir(self) -> Path:
        return self._data_dir()

    @property
    def queues(self) -> dict[str, Queue]:
        return self.catalogue.queues

    def queue(self, name: str) -> Queue:
        return self.catalogue.queue(name)

    def queue_name(self, queue_id: int) -> str | None:
        q = self.catalogue.by_id(queue_id)
        return q.name if q is not None else None

    @property
    def holders(self) -> Collection[Recipient]:
        return [*self.sessions, *self.local_holders] if self.local_holders else self.sessions

    @property
    def commit(self) -> CommitPath:
        return self._store.commit

    @property
    def has_quorum(self) -> bool:
        return self._has_quorum()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        self._spawn(coro)

    def write_later(self, ops: list[WriteOp], callback: Callback | None = None, *, lazy: bool = True) -> None:
        self._store.write_later(ops, callback, lazy=lazy)

    async def commit_ops(self, key: tuple[int, int], ops: list[WriteOp]) -> None:
        await self._store.commit_ops(key, ops)

    async def read_cold(self, q: Queue, pidx: int, offset: int, limit: int) -> tuple[int, list[StoredMessage]]:
        return await self._store.read_cold(q, pidx, offset, limit)

    async def declare(self, frame: Declare) -> tuple[QueueInfo, bool]:
        return await self.catalogue.declare(frame)

    def publish(self, req: PublishRequest) -> Outcome[PublishResult]:
        return self.publisher.publish(req)

    # -- serving a partition (what the replication driver tells) -----------------------------

    def serves(self, q: Queue, pidx: int) -> bool:
        """Whether this node holds the partition's messages (always, on a single node)."""
        shared, rep = self._shared(), self._replication()
        if shared is not None:
            return shared.serving() and self.catalogue.by_id(q.meta.id) is q  # (not one of an earlier term)
        return rep is None or rep.serving((q.meta.id, pidx))

    def load_budget(self, queue_id: int = 0) -> int:
        """Bytes of messages a partition loads when this node becomes its active: its share of
        ``max_memory``, at most :data:`TAKEOVER_HEAD` (0: all, where memory is not bounded).
        The rest is a cold region, read as consumers reach it, so a takeover (a failover, a
        drain's or a move's hand-over) does not wait for a large backlog to be read."""
        q = self.catalogue.by_id(queue_id) if queue_id else None
        if q is not None and q.stream:
            return 1  # (a stream holds no messages: they are read from the store)
        share = self.catalogue.budget.share()
        return min(share, TAKEOVER_HEAD) if share else 0

    def partition_loaded(self, key: tuple[int, int], st: PartitionState, windows: Mapping[str, Window],
                         ready: list[Msg] | None = None) -> None:
        """This node is now the partition's active: its messages come from the store."""
        q = self.catalogue.by_id(key[0])
        if q is None or key[1] >= len(q.partitions):
            return
        # deliveries this node made in an earlier term of its own and still holds (it lost the
        # partition and won it again with no unload between): the store may have settled their
        # messages since, another active having had them; they come again from the store
        stale = revoke_deliveries(self.holders, q, key[1])
        if stale:
            log.warning("partition %d/%d: %d deliveries of an earlier term revoked (delivered again from the store)",
                        key[0], key[1], stale)
        q.load_partition(key[1], st, windows=windows, ready=ready)
        self.delivery.schedule(q)
        # (once it serves, right after this: a partition of a queue being updated is swept)
        asyncio.get_running_loop().call_soon(self.remaps.served, key)

    def partition_unloaded(self, key: tuple[int, int]) -> None:
        """No longer the active: its messages and its deliveries are the new active's.  A
        consumer's later ack of one of them gets an unknown-tag error, never a wrong message."""
        q = self.catalogue.by_id(key[0])
        if q is None or key[1] >= len(q.partitions):
            return
        q.clear_partition(key[1])
        revoked = revoke_deliveries(self.holders, q, key[1])
        if revoked:
            log.warning("partition %d/%d: %d unacked deliveries revoked (the new active redelivers them)",
                        key[0], key[1], revoked)
            self.delivery.schedule(q)

    def map_changed(self) -> None:
        self._map_changed()

    def replication_failed(self) -> None:
        self._failed()

    # -- re-partitioning (broker.partitions.remap) ----------------------------------------------

    def take_back(self, q: Queue, pidx: int) -> int:
        msgs = take_back_deliveries(self.holders, q, pidx)
        if msgs:
            q.requeue(msgs)
        return len(msgs)

    def partition_event(self, key: tuple[int, int], event: str, why: str) -> None:
        rep = self._replication()
        if rep is not None:
            rep.partition_event(key, event, why)

    # -- dead-lettering (broker.messaging.delivery) ------------------------------------------------

    def route(self, exchange: str, routing_key: str, headers: Mapping[str, str]) -> tuple[str, ...]:
        return self._topology.table.route(exchange, routing_key, headers, self.catalogue.queues.__contains__)

    def has_exchange(self, name: str) -> bool:
        return name in self._topology.table.exchanges

    def dead_letter_remote(self, src: Queue, m: Msg, targets: list[Queue], headers: dict[str, str]) -> None:
        """Dead-letter ``m`` into ``targets``, some partition of which is active on another
        member; settle it here once every one stored it, put it back if one failed (a copy the
        others stored stays: dead-lettering is at least once)."""
        generation = src.partitions[m.partition].generation  # (loaded anew since: the store's copy is there)
        parts: list[Outcome[PublishResult] | Coroutine[Any, Any, PublishResult]] = []
        for dlq in targets:
            req = PublishRequest(dlq.name, None, [PublishMessage(m.key, headers, m.body, None)],
                                 partition=dead_letter_partition(dlq.name, dlq.mapper, dlq.meta.partitions, m.key))
            try:
                parts.append(self.publisher.publish(req))
            except Exception as exc:
                parts.append(Outcome.failed(exc))
        stored: Outcome[PublishResult] = Outcome()

        def done(fut: Outcome[PublishResult]) -> None:
            err = fut.exception()
            if err is None:
                # eager: until it commits, a failover here would deliver the message again
                # while its copy sits in the dead-letter queue
                self.write_later([Settle(src.meta.id, m.partition, [m.offset])], lazy=False)
                return
            where = ", ".join(q.name for q in targets)
            log.error("dead-lettering %s of %s into %s failed (%s): back to the queue", m.id, src.name, where, err)
            if not src.deleted and self.serves(src, m.partition) \
                    and src.partitions[m.partition].generation == generation:
                src.requeue([m])
                self.delivery.schedule(src)

        stored.add_done_callback(done)
        self._spawn(sum_parts(parts, stored))

    # -- the quarantine and its restores (broker.partitions.quarantine, restore_run) ----------------

    async def quarantine_actives(self) -> list[str]:
        """The members serving a partition of the quarantine queue (broker.partitions.restore_run)."""
        if QUARANTINE not in self.queues:
            await self.catalogue.catch_up()  # (discarded on another member a moment ago?)
        q = self.queues.get(QUARANTINE)
        if q is None:
            return []
        return sorted({await self.commit.wait_active((q.meta.id, p), self._node.election_wait)
                       for p in range(q.meta.partitions)})

    def restore_event(self, text: str) -> None:
        """A restore run here, in ``tandem status`` events (the last RESTORE_EVENTS)."""
        self._events.append(NodeEvent(self.clock.time(), "restore", "-", text))
        runs = [e for e in self._events if e.kind == "restore"]
        if len(runs) > RESTORE_EVENTS:
            self._events.remove(runs[0])

    async def read_stream(self, queue: str, partition: int, offset: int, max_messages: int,
                          *, hops: int = 0) -> tuple[list[StreamMessage], int, int]:
        return await read_stream(self._node, queue, partition, offset, max_messages, hops=hops)

    async def produced(self, queue: str, partition: int, producer: str, offset: int,
                       *, hops: int = 0) -> Produced:
        return await produced(self._node, queue, partition, producer, offset, hops=hops)

    async def forward(self, who: str, request: ForwardRequest) -> bytes:
        return await self._node.forward(who, request)

    # -- users and grants (broker.security.security) -------------------------------------------------

    def user_changed(self, name: str, *, seeded: bool = False) -> None:
        """A change of user ``name`` was applied here: recheck its sessions (broker.security.standing)."""
        for s in list(self.sessions):
            if s.user is not None and s.user.name == name:
                if seeded:
                    s.renew_standing()
                else:
                    s.recheck_standing()
