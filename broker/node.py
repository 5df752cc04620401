"""A Tandem node: its store, its queues, its client listener, its lifecycle.

Data path of one publish batch (see DESIGN.md "Data path" and docs/architecture.md)::

    Session reads Publish  ->  Node.publish: map each message to a partition,
    drop duplicates (producer id, seq), assign offsets, build Append ops  ->
    GroupCommitWriter (one transaction + at most one fsync for everything
    waiting)  ->  callback on the loop: messages become ready, PublishOk sent,
    dispatch scheduled (broker.delivery).

With ``NO_SYNC`` the messages are ready and confirmed at once and the write
follows.  Deliveries and settlements live in :mod:`broker.delivery`.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgpack

from broker.config import NodeConfig
from broker.delivery import Delivery
from broker.queues import MESSAGE_OVERHEAD, Msg, Partition, Queue, decode_headers, encode_headers, validate_declare
from broker.users import UserRegistry, bootstrap_admin
from ha.membership import QuorumState
from client.clock import SYSTEM_CLOCK, Clock
from client.errors import (
    InvalidArgumentError,
    MessageTooLargeError,
    NotActiveError,
    OutOfOrderSequenceError,
    PartitionNotFoundError,
    QueueExistsError,
    QueueFullError,
    QueueNotFoundError,
    ShuttingDownError,
    TandemError,
    UnavailableError,
)
from broker import __version__
from client.protocol.frames import (Declare, PartitionMap, PublishMessage, QueueInfo, ReadOk, RemoteNode, StatusOk,
                                    StreamMessage, expect)
from storage.base import (
    Append,
    DropQueue,
    DurabilityPolicy,
    Engine,
    MarkDelivered,
    PartitionState,
    DropProducers,
    PutProducer,
    PutQueue,
    QueueMeta,
    Recovered,
    Settle,
    StoredMessage,
    WriteOp,
)
from storage.sqlite import SqliteEngine
from storage.writer import Callback, GroupCommitWriter

if TYPE_CHECKING:
    from broker.peers import PeerManager
    from broker.replication import Replication
    from broker.session import Session

log = logging.getLogger("tandem.broker")

MAX_READ_BATCH = 10000  # messages in one stream read

# stored, duplicates, error, the producer's last sequence in the partition (-1: none or not asked)
PublishDone = Callable[[int, int, BaseException | None, int], None]
EngineFactory = Callable[[NodeConfig], Engine]


def sqlite_engine(config: NodeConfig) -> Engine:
    return SqliteEngine(config.db_path, log_segment_bytes=config.log_segment_size)


class Node:
    def __init__(self, config: NodeConfig, *, clock: Clock = SYSTEM_CLOCK,
                 engine: EngineFactory = sqlite_engine) -> None:
        self.config = config
        self.clock = clock
        self.queues: dict[str, Queue] = {}
        self.users = UserRegistry([])
        self.sessions: set[Session] = set()
        self.map_watchers: set[Session] = set()  # sessions told MapChanged (they asked for a map)
        self._map_push_scheduled = False
        self.store_stamp = ""
        self.engine = engine(config)
        self._writer: GroupCommitWriter | None = None
        self._server: asyncio.Server | None = None
        self._next_queue_id = 1
        self._loop: asyncio.AbstractEventLoop | None = None
        self.delivery = Delivery(self)
        self.peers: PeerManager | None = None
        self.replication: Replication | None = None
        self._peer_task: asyncio.Task[None] | None = None
        self._replication_task: asyncio.Task[None] | None = None
        self.stopping = False
        self.stopped = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self.console: Any = None  # webconsole.server.Console when http_port is set
        self._expiry_task: asyncio.Task[None] | None = None
        self.confirms = 0  # messages confirmed to publishers (metrics)
        self.address: tuple[str, int] = (config.host, config.port)
        self.priority = config.priority  # changeable at runtime (tandem admin set-priority)
        self.data_path = config.data_dir

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        cfg = self.config
        self._loop = asyncio.get_running_loop()
        log.info("node start started name=%s data_dir=%s sync=%s", cfg.name, cfg.data_dir, cfg.sync.value)
        try:
            await self._start()
        except BaseException as exc:
            log.error("node start failed name=%s error=%s", cfg.name, exc)
            await self._stop_peers()
            await self._close_store()
            raise
        total = sum(q.depth for q in self.queues.values())
        log.info(
            "node start complete name=%s url=tandem://%s:%d data_dir=%s sync=%s queues=%d messages=%d",
            cfg.name, self.address[0], self.address[1], self.data_path, cfg.sync.value,
            len(self.queues), total,
        )

    async def _start(self) -> None:
        cfg = self.config
        assert self._loop is not None  # set by start(), which is the only caller
        await asyncio.to_thread(cfg.data_dir.mkdir, parents=True, exist_ok=True)
        self.data_path = await asyncio.to_thread(cfg.data_dir.resolve)
        recovered = await asyncio.to_thread(self.engine.open)
        self._writer = GroupCommitWriter(self.engine, self._loop.call_soon_threadsafe, clock=self.clock)
        self._restore(recovered, group=cfg.peer_port is not None)
        if "store_stamp" not in recovered.meta:
            self.store_stamp = f"{int(self.clock.time() * 1000):x}-{secrets.token_hex(4)}"
            await asyncio.to_thread(self.engine.set_meta, "store_stamp", self.store_stamp)
        else:
            self.store_stamp = recovered.meta["store_stamp"]
        if not len(self.users):
            op, how = await asyncio.to_thread(bootstrap_admin, cfg.data_dir)
            await self.write([op], sync=True)
            self.users.put(op.user)
            log.warning("created user admin: password %s", how)
        # bound now (peers learn the address in the handshake), serving once all is set up
        self._server = await asyncio.start_server(self._on_client, cfg.host, cfg.port, limit=1 << 20,
                                                  start_serving=False)
        sock = self._server.sockets[0].getsockname()
        self.address = (sock[0], sock[1])
        if cfg.peer_port is not None:
            from broker.peers import PeerManager
            from broker.replication import Replication

            self.peers = PeerManager(self)
            self.replication = Replication(self, recovered.logs)
            self.replication.start()
            await self.peers.start()
            self._peer_task = asyncio.create_task(self.peers.run(), name="tandem-peers")
            self._replication_task = asyncio.create_task(self.replication.run(), name="tandem-replication")
        await self._server.start_serving()
        self._expiry_task = asyncio.create_task(self._expire_producers(), name="tandem-producer-expiry")
        if cfg.http_port is not None:
            from webconsole.server import Console

            self.console = Console(self)
            await self.console.start(cfg.host, cfg.http_port)

    def _restore(self, rec: Recovered, *, group: bool = False) -> None:
        """Queues, partitions and users from the store.  In a group a partition's messages
        are loaded only when this node becomes its active (:meth:`partition_loaded`)."""
        for meta in rec.queues:
            self.queues[meta.name] = Queue(meta)
            self._next_queue_id = max(self._next_queue_id, meta.id + 1)
        self._next_queue_id = max(self._next_queue_id, int(rec.meta.get("queue_id_hwm", "0")) + 1)
        by_id = {q.meta.id: q for q in self.queues.values()}
        for (qid, pidx), st in rec.partitions.items():
            q = by_id.get(qid)
            if q is None or pidx >= len(q.partitions):
                log.warning("recovery ignored rows of unknown queue_id=%d partition=%d", qid, pidx)
                continue
            part = q.partitions[pidx]
            part.next_offset = part.committed_end = st.next_offset
            part.marked_upto = st.delivered_upto
            part.producers = dict(st.producers)
            part.committed_producers = dict(st.producers)
            part.gaps = {}
            part.producer_used = {}
            if not group:
                q.add_ready(part, (self._msg_from_store(pidx, m) for m in st.messages))
        for u in rec.users:
            self.users.put(u)

    @staticmethod
    def _msg_from_store(partition: int, m: StoredMessage) -> Msg:
        return Msg(partition, m.offset, m.key, decode_headers(m.headers_blob), m.headers_blob, m.body,
                   m.producer_id, m.seq, m.ts, m.dc)

    async def stop(self) -> None:
        """Stop accepting, close sessions, commit what is pending, close the store."""
        if self.stopping:
            await self.stopped.wait()
            return
        self.stopping = True
        log.info("node stop started name=%s sessions=%d", self.config.name, len(self.sessions))
        if self.console is not None:
            await self.console.stop()
        if self._expiry_task is not None:
            self._expiry_task.cancel()
            await asyncio.gather(self._expiry_task, return_exceptions=True)
        if self._server is not None:
            self._server.close()
        for s in list(self.sessions):
            s.shutdown(ShuttingDownError(f"node {self.config.name} is shutting down"))
        if self.sessions:
            await asyncio.gather(*(s.finished.wait() for s in list(self.sessions)))
        if self._server is not None:
            await self._server.wait_closed()
        if self.replication is not None:
            # the acks still waiting for a partition's next entry: out while the links are up
            await self.replication.flush_lazy(timeout=self.config.non_response_timeout)
        await self._stop_peers()
        await self._close_store()
        log.info("node stop complete name=%s", self.config.name)
        self.stopped.set()

    async def _stop_peers(self) -> None:
        if self._replication_task is not None:
            self._replication_task.cancel()
            try:
                await self._replication_task
            except asyncio.CancelledError:
                pass  # we cancelled it
            self._replication_task = None
        if self.replication is not None:
            self.replication.stop()
        if self._peer_task is not None:
            self._peer_task.cancel()
            try:
                await self._peer_task
            except asyncio.CancelledError:
                pass  # we cancelled it: the expected end of the peer tasks
            self._peer_task = None
        if self.peers is not None:
            await self.peers.stop()

    async def _close_store(self) -> None:
        if self._writer is not None:
            await asyncio.to_thread(self._writer.close)
            st = self._writer.stats
            log.info("store writer stats commits=%d synced=%d failed=%d retried_ops=%d ops=%d "
                     "max_batch_ops=%d busy_s=%.2f", st.commits, st.synced_commits, st.failed_commits,
                     st.retried_ops, st.ops, st.max_batch_ops, st.commit_seconds_total)
            self._writer = None
        await asyncio.to_thread(self.engine.close)

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        from broker.session import Session

        if self.stopping or len(self.sessions) >= self.config.max_connections:
            Session.refuse(writer, self.stopping, self.config.max_connections)
            return
        session = Session(self, reader, writer)
        self.sessions.add(session)
        try:
            await session.run()
        finally:
            self.sessions.discard(session)
            self.map_watchers.discard(session)
            self.delivery.release(session)

    def set_quorum_override(self, nodes: int | None, *, by: str) -> None:
        if self.peers is None:
            raise InvalidArgumentError("this node is not in a replication group: there is no quorum to override")
        try:
            changes = self.peers.membership.set_quorum_override(nodes)
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from None
        log.warning("QUORUM OVERRIDE %s by %s on node %s: %s", "SET" if nodes is not None else "CLEARED", by,
                    self.config.name, f"at least {nodes} node(s) up" if nodes is not None else
                    f"back to policy {self.config.quorum_policy}")
        self.peers.report(changes)
        if self.replication is not None:
            self.replication.quorum_override = nodes
            self.replication.reconfigure()

    def set_option(self, name: str, value: int, *, by: str) -> None:
        """Runtime ``priority`` or ``designated_primary``: effective at once, logged loudly."""
        rep, peers = self._group(f"{name} has no effect")
        if name == "priority":
            if not 0 <= value <= 3:
                raise InvalidArgumentError(f"priority {value}: 0 (never active), 1, 2 or 3 (highest)")
            old, self.priority = self.priority, value
            rep.priority = value
            log.warning("PRIORITY SET by %s on node %s: %d -> %d", by, self.config.name, old, value)
        elif name == "designated_primary":
            if value not in (0, 1):
                raise InvalidArgumentError("designated_primary: 1 (on) or 0 (off)")
            if value and len(rep.members) != 2:
                raise InvalidArgumentError(f"designated_primary: only in a two-node group (this one has "
                                           f"{len(rep.members)} members)")
            rep.designated_primary = self.config.name if value else None
            peers.report(peers.membership.set_designated_primary(bool(value)))
            log.warning("DESIGNATED PRIMARY %s by %s on node %s", "SET" if value else "CLEARED", by,
                        self.config.name)
        else:
            raise InvalidArgumentError(f"unknown setting {name!r}: priority or designated_primary")
        rep.reconfigure()

    def require_quorum(self, what: str) -> None:
        """Refuse ``what`` while this node has no node quorum: its partitions are Unavailable."""
        if self.peers is None:
            return
        m = self.peers.membership
        if m.quorum_state is QuorumState.DISABLED:
            up = 1 + len(m.up())
            raise UnavailableError(
                f"node {self.config.name} has no quorum ({up} of {1 + len(self.peers.addresses)} nodes up, policy "
                f"{self.config.quorum_policy}): partitions are Unavailable here, cannot {what}")

    # -- store ----------------------------------------------------------------------------

    @property
    def writer(self) -> GroupCommitWriter:
        if self._writer is None:
            raise ShuttingDownError("the node's store is not open")
        return self._writer

    def write(self, ops: list[WriteOp], *, sync: bool) -> asyncio.Future[None]:
        """Commit ``ops`` now; the future resolves when they are committed."""
        if self._loop is None:
            raise ShuttingDownError("the node is not started")
        fut: asyncio.Future[None] = self._loop.create_future()

        def done(err: BaseException | None) -> None:
            if not fut.done():
                fut.set_exception(err) if err else fut.set_result(None)

        self.writer.submit(ops, sync=sync, callback=done)
        return fut

    def write_later(self, ops: list[WriteOp], callback: Callback | None = None, *, lazy: bool = True) -> None:
        """Write ops nobody waits for: retried until committed; ``callback`` runs then.

        In a group these are partition ops (settlements, marks, counts): they are
        replicated, and fail (callback gets the error) for partitions this node no
        longer serves; the new active redelivers those messages."""
        if not ops:
            return
        if self.replication is not None:
            self.replication.propose(ops, callback, lazy=lazy)
        else:
            self.writer.submit(ops, sync=False, callback=callback, retry=True, lazy=lazy)

    def _submit_partition_ops(self, ops: list[WriteOp], *, sync: bool, callback: Callback, retry: bool = False) -> None:
        if self.replication is not None:
            self.replication.propose(ops, callback)
        else:
            self.writer.submit(ops, sync=sync, callback=callback, retry=retry)

    # -- replicated mode: what the replication driver tells the node -------------------------------

    def queue_by_id(self, queue_id: int) -> Queue | None:
        for q in self.queues.values():
            if q.meta.id == queue_id:
                return q
        return None

    def catalogue_put(self, meta: QueueMeta) -> bool:
        """A committed declare: the queue exists on every node.  False if the name is taken
        by an earlier declare (two raced; the first committed wins)."""
        self._next_queue_id = max(self._next_queue_id, meta.id + 1)
        existing = self.queues.get(meta.name)
        if existing is not None:
            return existing.meta.id == meta.id
        self.queues[meta.name] = Queue(meta)
        log.info("queue declared name=%s id=%d partitions=%d (catalogue)", meta.name, meta.id, meta.partitions)
        return True

    def catalogue_drop(self, queue_id: int) -> None:
        q = self.queue_by_id(queue_id)
        if q is None:
            return
        q.deleted = True
        del self.queues[q.name]
        for c in list(q.consumers):
            c.session.cancelled_by_broker(c, f"queue {q.name!r} was deleted")
        log.info("queue deleted name=%s (catalogue)", q.name)

    def partition_loaded(self, key: tuple[int, int], st: PartitionState) -> None:
        """This node is now the partition's active: its messages come from the store."""
        q = self.queue_by_id(key[0])
        if q is None or key[1] >= len(q.partitions):
            return
        part = q.partitions[key[1]]
        self._clear_partition(q, part)
        part.next_offset = part.committed_end = st.next_offset
        part.marked_upto = st.delivered_upto
        part.producers = dict(st.producers)
        part.committed_producers = dict(st.producers)
        part.gaps = {}
        part.producer_used = {}
        q.add_ready(part, (self._msg_from_store(key[1], m) for m in st.messages))
        self.delivery.schedule(q)

    def partition_unloaded(self, key: tuple[int, int]) -> None:
        """No longer the active: its messages and its deliveries are the new active's.  A
        consumer's later ack of one of them gets an unknown-tag error, never a wrong message."""
        q = self.queue_by_id(key[0])
        if q is None or key[1] >= len(q.partitions):
            return
        self._clear_partition(q, q.partitions[key[1]])
        revoked = 0
        for sess in self.sessions:
            gone = [t for t, (c, m) in sess.deliveries.items() if c.queue is q and m.partition == key[1]]
            for t in gone:
                c, _m = sess.deliveries.pop(t)
                c.unacked -= 1
                q.unacked_count -= 1
            revoked += len(gone)
        if revoked:
            log.warning("partition %d/%d: %d unacked deliveries revoked (the new active redelivers them)",
                        key[0], key[1], revoked)
            self.delivery.schedule(q)

    @property
    def client_address(self) -> str:
        """host:port clients reach this node at (``advertise``, else where it listens)."""
        if self.config.advertise:
            return self.config.advertise
        host, port = self.address
        return f"{host}:{port}"

    def serves(self, q: Queue, pidx: int) -> bool:
        """Whether this node holds the partition's messages (always, on a single node)."""
        return self.replication is None or self.replication.serving((q.meta.id, pidx))

    def dead_letter_remote(self, src: Queue, m: Msg, dlq: Queue, headers: dict[str, str]) -> None:
        """Dead-letter ``m`` into a partition active on another member; settle it here once
        stored there, put it back if that fails."""
        pidx = dlq.mapper.partition(m.key)

        def done(stored: int, _dup: int, err: BaseException | None, _last: int) -> None:
            if err is None:
                # eager: until it commits, a failover here would deliver the message again
                # while its copy sits in the dead-letter queue
                self.write_later([Settle(src.meta.id, m.partition, [m.offset])], lazy=False)
                return
            log.error("dead-lettering %s of %s into %s failed (%s): back to the queue", m.id, src.name, dlq.name, err)
            if not src.deleted and self.serves(src, m.partition):
                src.requeue([m])
                self.delivery.schedule(src)

        msg = PublishMessage(m.key, headers, m.body, None)
        self._spawn(self._publish_remote(dlq, pidx, None, [msg], done, 0))

    @staticmethod
    def _clear_partition(q: Queue, part: Partition) -> None:
        q.ready_count -= len(part.ready)
        part.ready.clear()
        part.producers = {}
        part.committed_producers = {}
        part.gaps = {}
        part.producer_used = {}

    # -- partition maps (durable connections send straight to each partition's active) --------

    def partition_map(self, name: str, session: Session | None = None) -> PartitionMap:
        """Where ``name``'s partitions are active, as this node knows it; ``session`` is
        told MapChanged from now on whenever that may have changed."""
        q = self.queue(name)
        me = self.config.name
        addresses = {me: self.client_address}
        if self.replication is None:
            actives = [me] * q.meta.partitions
        else:
            rep, peers = self._group()
            actives = [rep.active_of((q.meta.id, p)) or "" for p in range(q.meta.partitions)]
            addresses.update((n, a) for n, a in peers.client_addresses.items() if a)
        if session is not None:
            self.map_watchers.add(session)
        return PartitionMap(q.info(), actives, addresses)

    def map_changed(self) -> None:
        """A partition got or lost an active: tell the watching sessions, once per loop turn."""
        if self._map_push_scheduled or not self.map_watchers:
            return
        self._map_push_scheduled = True
        asyncio.get_running_loop().call_soon(self._push_map)

    def _push_map(self) -> None:
        from client.protocol.frames import MapChanged

        self._map_push_scheduled = False
        frame = MapChanged(node=self.config.name)
        for s in list(self.map_watchers):
            s.send(frame)

    # -- queues -------------------------------------------------------------------------

    def queue(self, name: str) -> Queue:
        q = self.queues.get(name)
        if q is None:
            raise QueueNotFoundError(f"queue {name!r} does not exist")
        return q

    async def declare(self, frame: Declare) -> tuple[QueueInfo, bool]:
        validate_declare(frame)
        if self.replication is not None:
            return await self._group_declare(frame)
        meta, existing = self._declared(frame)
        if existing is not None:
            return existing.info(), False
        self._next_queue_id += 1
        q = Queue(meta)
        self.queues[meta.name] = q
        try:
            await self.write([PutQueue(meta)], sync=True)
        except TandemError:
            self.queues.pop(meta.name, None)
            raise
        log.info("queue declared name=%s partitions=%d mapper=%s", meta.name, meta.partitions, meta.mapper)
        return q.info(), True

    def _declared(self, frame: Declare) -> tuple[QueueMeta, Queue | None]:
        """The queue a declare asks for, and the existing one of that name (same settings,
        or QueueExistsError naming what differs)."""
        meta = QueueMeta(
            id=self._next_queue_id, name=frame.queue, partitions=frame.partitions, mapper=frame.mapper,
            ring_size=frame.ring_size, max_deliveries=frame.max_deliveries,
            dead_letter_queue=frame.dead_letter_queue, max_length=frame.max_length,
        )
        existing = self.queues.get(frame.queue)
        if existing is not None:
            wanted, have = _settings(meta), _settings(existing.meta)
            diff = [f"{k}: have {have[k]!r}, asked {wanted[k]!r}" for k in have if have[k] != wanted[k]]
            if diff:
                raise QueueExistsError(f"queue {frame.queue!r} exists with other settings ({'; '.join(diff)})")
        return meta, existing

    async def delete(self, name: str, if_empty: bool) -> None:
        if self.replication is not None:
            await self._group_delete(name, if_empty)
            return
        q = self.queue(name)
        if if_empty and q.depth:
            raise InvalidArgumentError(f"queue {name!r} is not empty ({q.depth} messages)")
        q.deleted = True
        del self.queues[name]
        for c in list(q.consumers):
            c.session.cancelled_by_broker(c, f"queue {name!r} was deleted")
        await self.write([DropQueue(q.meta.id)], sync=True)
        log.info("queue deleted name=%s messages=%d", name, q.depth)

    async def purge(self, name: str) -> int:
        """Drop the ready messages (delivered ones stay with their consumers)."""
        q = self.queue(name)
        if self.replication is not None:
            return await self._group_purge(q)
        removed = q.purge_ready()
        ops: list[WriteOp] = [Settle(q.meta.id, p, [m.offset for m in msgs]) for p, msgs in removed.items()]
        count = sum(len(msgs) for msgs in removed.values())
        if ops:
            try:
                await self.write(ops, sync=self.config.sync is DurabilityPolicy.SYNC)
            except TandemError:
                if not q.deleted:
                    q.requeue([m for msgs in removed.values() for m in msgs])
                raise
        log.info("queue purged name=%s messages=%d", name, count)
        return count

    # -- publish -----------------------------------------------------------------------

    def publish(self, queue_name: str, producer_id: str | None, messages: list[PublishMessage],
                done: PublishDone, *, hops: int = 0, partition: int | None = None, dense: bool = False) -> None:
        """Store a batch; ``done(stored, duplicates, error, last_seq)`` runs once it is confirmed.

        ``partition``: all of them go there (a part another member mapped already: a
        mapper may be stateful, e.g. round robin for messages without a key).
        ``dense``: the client addressed the partition and numbers its messages there
        0, 1, 2, ... with no gap (see :class:`~client.protocol.frames.Publish`)."""
        if self.stopping:
            raise ShuttingDownError("node is shutting down")
        q = self.queue(queue_name)
        if dense and (partition is None or producer_id is None
                      or any(not isinstance(m.seq, int) for m in messages)):
            raise InvalidArgumentError("a publish addressed to a partition needs a producer_id and a seq "
                                       "on every message")
        if partition is not None:
            if not 0 <= partition < q.meta.partitions:
                raise InvalidArgumentError(f"queue {queue_name!r} has no partition {partition}")
            pidxs = [partition] * len(messages)
        else:
            mapper = q.mapper.partition
            pidxs = [mapper(m.key) for m in messages]
        rep = self.replication
        if rep is not None:
            qid = q.meta.id
            touched = set(pidxs)
            target = partition if partition is not None else pidxs[0] if pidxs else 0
            # One partition per proposal: each commits (or fails over) on its own, so a
            # failover never leaves half a batch committed and half to be resent.
            if len(touched) > 1 or not rep.serving((qid, target)):
                if dense:
                    self._spawn(self._publish_remote(q, target, producer_id, messages, done, hops, dense=True))
                else:
                    self._publish_split(q, producer_id, messages, pidxs, done, hops)
                return
            if producer_id is not None and hops < 3:
                # The active changed before the entry committed: it may still commit (the new
                # active has it) or not.  With a producer id a resend is safe, the new active
                # drops what it already stored: send it there instead of failing the client.
                first_done = done

                def done(stored: int, duplicates: int, err: BaseException | None, last: int) -> None:
                    if not isinstance(err, NotActiveError):
                        first_done(stored, duplicates, err, last)
                    elif dense:
                        self._spawn(self._publish_remote(q, target, producer_id, messages, first_done, hops + 1,
                                                         dense=True))
                    else:
                        self._publish_split(q, producer_id, messages, pidxs, first_done, hops + 1)
        limit = self.config.max_message_size
        for m in messages:
            if len(m.body) > limit:
                raise MessageTooLargeError(f"message of {len(m.body)} bytes exceeds max_message_size {limit}")
        parts = q.partitions
        if q.meta.max_length:
            fresh = len(messages) if producer_id is None else sum(
                1 for m, p in zip(messages, pidxs) if not self._held(parts[p], producer_id, m.seq))
            if fresh and q.depth + fresh > q.meta.max_length:  # (a resend of what it holds is not refused)
                raise QueueFullError(f"queue {queue_name!r} is full: {q.depth} of max_length {q.meta.max_length}")
        if dense:
            assert partition is not None and producer_id is not None
            last = self._check_sequence(q, partition, producer_id, messages)
            if not messages:  # a producer asks where its sequence stands
                done(0, 0, None, last)
                return
        if producer_id is not None and not dense:
            for m, pidx in zip(messages, pidxs):
                held = parts[pidx].producers.get(producer_id)
                if held is not None and m.seq is not None and \
                        parts[pidx].committed_producers.get(producer_id, -1) < m.seq <= held:
                    # a resend of what is still being stored: confirming it now could confirm
                    # what then fails to commit
                    raise UnavailableError(f"producer {producer_id}'s seq {m.seq} on {q.name}/{pidx} is still "
                                           "being stored: retry")
        ts = self.clock.time()
        if producer_id is not None:
            used = self.clock.monotonic()
            for pidx in set(pidxs) if partition is None else (partition,):
                parts[pidx].producer_used[producer_id] = used
        by_part: dict[int, list[Msg]] = {}
        last_seq: dict[tuple[int, str], int] = {}
        seqs_of: dict[tuple[int, str], list[int]] = {}
        duplicates = 0
        for m, pidx in zip(messages, pidxs):
            part = parts[pidx]
            if producer_id is not None and m.seq is not None:
                if self._held(part, producer_id, m.seq):
                    duplicates += 1
                    continue
                held = part.producers.get(producer_id, -1)
                if m.seq > held:
                    part.producers[producer_id] = m.seq
                else:  # it fills a gap a failed commit left
                    gaps = part.gaps[producer_id]
                    gaps.discard(m.seq)
                    if not gaps:
                        del part.gaps[producer_id]
                key = (pidx, producer_id)
                if m.seq > last_seq.get(key, -1):
                    last_seq[key] = m.seq
                seqs_of.setdefault(key, []).append(m.seq)
            offset = part.next_offset
            part.next_offset = offset + 1
            msg = Msg(pidx, offset, m.key, m.headers, encode_headers(m.headers), m.body, producer_id, m.seq, ts)
            lst = by_part.get(pidx)
            if lst is None:
                by_part[pidx] = [msg]
            else:
                lst.append(msg)
        stored = len(messages) - duplicates

        def last_of() -> int:
            if partition is None or producer_id is None:
                return -1
            return parts[partition].producers.get(producer_id, -1)

        if not by_part:
            done(0, duplicates, None, last_of())
            return
        ops: list[WriteOp] = [Append(q.meta.id, pidx, msgs, parts[pidx].next_offset) for pidx, msgs in by_part.items()]
        ops.extend(PutProducer(q.meta.id, pidx, pid, seq) for (pidx, pid), seq in last_seq.items())
        # With consumers waiting these messages are about to go out: mark them delivered in
        # this same commit, so the delivery needs no commit of its own.  (If they wait
        # instead, a crash counts one delivery too many: the safe direction.)
        premark = {pidx: parts[pidx].next_offset for pidx in by_part} if q.consumers else {}
        ops.extend(MarkDelivered(q.meta.id, pidx, upto) for pidx, upto in premark.items())
        q.published += stored
        # in a group, a confirm waits for the quorum whatever the local policy
        policy = self.config.sync if self.replication is None else DurabilityPolicy.SYNC

        def committed(err: BaseException | None) -> None:
            if err is not None:
                self._publish_failed(q, seqs_of, stored)
                done(0, 0, err, -1)
                return
            for (pidx, pid), seq in last_seq.items():
                cp = parts[pidx].committed_producers
                if seq > cp.get(pid, -1):
                    cp[pid] = seq
            for pidx, upto in premark.items():
                parts[pidx].marked_upto = max(parts[pidx].marked_upto, upto)
            if policy is not DurabilityPolicy.NO_SYNC:
                q.pending_count -= stored
                if not q.deleted:
                    self.delivery.make_ready(q, by_part)
            self._committed(q, by_part)
            if policy is not DurabilityPolicy.NO_SYNC:
                done(stored, duplicates, None, last_of())

        if policy is DurabilityPolicy.NO_SYNC:
            self.delivery.make_ready(q, by_part)
            self.writer.submit(ops, sync=False, callback=committed, retry=True)
            done(stored, duplicates, None, last_of())
            return
        q.pending_count += stored
        self._submit_partition_ops(ops, sync=policy is DurabilityPolicy.SYNC, callback=committed)

    async def _expire_producers(self) -> None:
        """Forget producers idle longer than ``producer_expiry`` in the partitions served here
        (a replicated op: every copy forgets them), so short-lived producer ids (a Spark task,
        a process that restarts) do not pile up for ever."""
        expiry = self.config.producer_expiry
        while not self.stopping:
            await self.clock.sleep(min(60.0, expiry / 4))
            now = self.clock.monotonic()
            for q in list(self.queues.values()):
                for pidx, part in enumerate(q.partitions):
                    if not self.serves(q, pidx):
                        continue
                    for pid in list(part.producers):
                        part.producer_used.setdefault(pid, now)  # loaded from the store: idle from now
                    idle = [pid for pid, used in part.producer_used.items()
                            if now - used > expiry and pid in part.producers and pid not in part.gaps
                            and part.producers.get(pid) == part.committed_producers.get(pid)]
                    if idle:
                        self._drop_producers(q, pidx, idle[:1000], now)

    def _drop_producers(self, q: Queue, pidx: int, pids: list[str], decided: float) -> None:
        part = q.partitions[pidx]

        def done(err: BaseException | None) -> None:
            if err is not None:
                log.warning("expiring %d producers of %s/%d failed: %s", len(pids), q.name, pidx, err)
                return
            for pid in pids:
                if part.producer_used.get(pid, 0.0) <= decided - self.config.producer_expiry:
                    part.producers.pop(pid, None)  # (one that published meanwhile is written again)
                    part.committed_producers.pop(pid, None)
                    part.producer_used.pop(pid, None)
            log.info("forgot %d producer(s) of %s/%d idle for over %.0f s", len(pids), q.name, pidx,
                     self.config.producer_expiry)

        self._submit_partition_ops([DropProducers(q.meta.id, pidx, pids)], sync=False, callback=done)

    @staticmethod
    def _check_sequence(q: Queue, pidx: int, producer_id: str, messages: list[PublishMessage]) -> int:
        """A dense batch must continue the producer's sequence in the partition: every
        seq up to the last one held is a duplicate (or fills a gap a failed commit left),
        the rest must follow on with no gap.  Returns the last seq held (-1 none); raises
        OutOfOrderSequence, storing nothing, or Unavailable for a resend of a sequence not
        yet committed."""
        part = q.partitions[pidx]
        last = part.producers.get(producer_id, -1)
        committed = part.committed_producers.get(producer_id, -1)
        gaps = part.gaps.get(producer_id, ())
        expect_seq = last + 1
        for m in messages:
            seq = m.seq
            assert seq is not None
            if seq <= last:
                if seq in gaps:
                    continue  # stored again
                if seq > committed:
                    # confirming this copy now would confirm what may yet fail to commit
                    raise UnavailableError(f"producer {producer_id}'s seq {seq} on {q.name}/{pidx} is still being "
                                           "stored: retry")
                continue
            if seq != expect_seq:
                raise OutOfOrderSequenceError(
                    f"producer {producer_id} sent seq {seq} to {q.name}/{pidx}, which holds its seqs up to "
                    f"{last}: resend from {last + 1}", next_seq=last + 1)
            expect_seq += 1
        return last

    @staticmethod
    def _held(part: Partition, producer_id: str, seq: int | None) -> bool:
        """Whether the partition holds (or is storing) this producer's ``seq``."""
        if seq is None:
            return False
        held = part.producers.get(producer_id)
        if held is None or seq > held:
            return False
        gaps = part.gaps.get(producer_id)
        return gaps is None or seq not in gaps

    def _publish_failed(self, q: Queue, seqs_of: dict[tuple[int, str], list[int]], stored: int) -> None:
        """The batch is not stored: let its producers' sequences be stored again.  A later
        batch of the same producer may be on its way to commit (single node: a separate
        commit): then the failed seqs become gaps below its last, which a resend fills."""
        q.pending_count -= stored
        q.published -= stored
        for (pidx, pid), seqs in seqs_of.items():
            part = q.partitions[pidx]
            gaps = part.gaps.setdefault(pid, set())
            gaps.update(seqs)
            held = part.producers.get(pid, -1)
            committed = part.committed_producers.get(pid, -1)
            while held > committed and held in gaps:  # the top failed: the last held moves down
                gaps.discard(held)
                held -= 1
            gaps.difference_update([s for s in gaps if s > held])
            if not gaps:
                del part.gaps[pid]
            if held < 0 and committed < 0:
                part.producers.pop(pid, None)
            else:
                part.producers[pid] = held

    @staticmethod
    def _committed(q: Queue, by_part: dict[int, list[Msg]]) -> None:
        """These messages are in the store: stream reads may see them."""
        for pidx, msgs in by_part.items():
            part: Partition = q.partitions[pidx]
            end = msgs[-1].offset + 1
            if end > part.committed_end:
                part.committed_end = end


    # -- replicated mode: requests for partitions active elsewhere -----------------------------------

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @property
    def election_wait(self) -> float:
        """How long a request waits for a partition to get an active."""
        return max(5.0, 4 * self.config.non_response_timeout)

    def _group(self, why: str = "") -> tuple[Replication, PeerManager]:
        """This node's replication and peer links (a group member has both)."""
        if self.replication is None or self.peers is None:
            raise InvalidArgumentError(f"this node is not in a replication group{': ' + why if why else ''}")
        return self.replication, self.peers

    async def _forward(self, who: str, kind: str, payload: bytes) -> bytes:
        _rep, peers = self._group()
        return await peers.forward(who, kind, payload)

    # -- stream reads --------------------------------------------------------------------------

    async def read_stream(self, queue: str, partition: int, offset: int, max_messages: int,
                          *, hops: int = 0) -> tuple[list[StreamMessage], int, int]:
        """Messages of one partition from ``offset`` without consuming them: (messages, next
        offset, end offset).  In a group the partition's active answers: a read made on
        another member is forwarded there (another member's store may lag, and only the
        active knows the committed end)."""
        q = self.queue(queue)
        if not 0 <= partition < len(q.partitions):
            raise PartitionNotFoundError(f"queue {queue!r} has no partition {partition}")
        if offset < 0 or not 1 <= max_messages <= MAX_READ_BATCH:
            raise InvalidArgumentError(f"offset must be >= 0 and max_messages 1..{MAX_READ_BATCH}")
        rep = self.replication
        if rep is not None and not rep.serving((q.meta.id, partition)):
            who = await rep.wait_active((q.meta.id, partition), self.election_wait)
            if who != self.config.name:
                if hops >= 3:
                    raise UnavailableError(f"partition {q.meta.id}/{partition}: its active keeps moving; retry")
                from client.protocol.codec import decode_payload

                out = await self._forward(who, f"read:{hops + 1}",
                                          msgpack.packb([queue, partition, offset, max_messages]))
                ok = expect(decode_payload(out), ReadOk)
                return ok.messages, ok.next_offset, ok.end_offset
        part = q.partitions[partition]
        engine = self.engine

        def read() -> tuple[int, list[StoredMessage]]:
            # the store's end first: below it every message is in the store or settled.  In a
            # group the log commits before the store is written (held back a little), and a
            # read that trusted committed_end alone would step over messages not yet there.
            stored = engine.stored_end(q.meta.id, partition)
            return stored, engine.read(q.meta.id, partition, offset, max_messages)

        stored, rows = await asyncio.to_thread(read)
        end = min(part.committed_end, stored)
        full = len(rows) == max_messages
        budget = self.config.max_frame_size - 4096
        msgs: list[StreamMessage] = []
        for r in rows:
            if r.offset >= end:
                break
            budget -= len(r.body) + len(r.headers_blob) + len(r.key or "") + MESSAGE_OVERHEAD
            if msgs and budget < 0:
                full = True  # the frame is full: the reader continues after the last one sent
                break
            msgs.append(StreamMessage(partition, r.offset, r.key, decode_headers(r.headers_blob), r.body,
                                      r.ts, f"{partition}-{r.offset}"))
        nxt = msgs[-1].offset + 1 if msgs and full else max(end, offset)
        return msgs, nxt, end

    def _publish_split(self, q: Queue, producer_id: str | None, messages: list[PublishMessage], pidxs: list[int],
                       done: PublishDone, hops: int) -> None:
        """Some messages belong to partitions active elsewhere (or electing): each part goes
        to its active; ``done`` sums the results.  Parts served here are stored at once, so
        a producer's sequences reach every partition in the order it sent them."""
        rep, _peers = self._group()
        by_part: dict[int, list[PublishMessage]] = {}
        for m, p in zip(messages, pidxs):
            by_part.setdefault(p, []).append(m)
        totals = [0, 0, len(by_part)]
        errors: list[BaseException] = []

        def part_done(stored: int, duplicates: int, err: BaseException | None, _last: int) -> None:
            totals[0] += stored
            totals[1] += duplicates
            totals[2] -= 1
            if err is not None:
                errors.append(err)
            if totals[2] == 0:
                done(totals[0], totals[1], errors[0] if errors else None, -1)

        for pidx, msgs in by_part.items():
            if rep.serving((q.meta.id, pidx)):
                try:
                    self.publish(q.name, producer_id, msgs, part_done, hops=hops, partition=pidx)
                except TandemError as exc:
                    part_done(0, 0, exc, -1)
            else:
                self._spawn(self._publish_remote(q, pidx, producer_id, msgs, part_done, hops))

    async def _publish_remote(self, q: Queue, pidx: int, producer_id: str | None, msgs: list[PublishMessage],
                              done: PublishDone, hops: int, *, dense: bool = False) -> None:
        from client.protocol.codec import encode
        from client.protocol.frames import Publish

        rep, _peers = self._group()
        deadline = self.clock.monotonic() + self.election_wait
        frame = Publish(rid=0, queue=q.name, messages=msgs, producer_id=producer_id,
                        partition=pidx if dense else None)
        while True:
            try:
                if hops >= 3:
                    raise UnavailableError("publish forwarded too many times while the group elects: retry")
                who = await rep.wait_active((q.meta.id, pidx), max(0.1, deadline - self.clock.monotonic()))
                if who == self.config.name:
                    self.publish(q.name, producer_id, msgs, done, hops=hops + 1, partition=pidx, dense=dense)
                    return
                out = await self._forward(who, f"publish:{hops + 1}:{pidx}", encode(frame)[4:])
                stored, duplicates, last = msgpack.unpackb(out)
            except (UnavailableError, NotActiveError) as exc:
                # The active went away mid-request.  With a producer id a resend is safe (the
                # next active drops what it already has): try again until the deadline.
                if producer_id is None or self.clock.monotonic() >= deadline or self.stopping:
                    done(0, 0, exc, -1)
                    return
                await rep.wait_change(0.2)
                continue
            except TandemError as exc:
                done(0, 0, exc, -1)
                return
            done(stored, duplicates, None, last)
            return

    async def _group_declare(self, frame: Declare, hops: int = 0) -> tuple[QueueInfo, bool]:
        from broker.replication import CATALOGUE
        from client.protocol.codec import encode

        rep, _peers = self._group()
        who = await rep.wait_active(CATALOGUE, self.election_wait)
        if who != self.config.name:
            if hops >= 3:
                raise UnavailableError("declare forwarded too many times while the group elects: retry")
            out = await self._forward(who, f"declare:{hops + 1}", encode(frame)[4:])
            created = bool(msgpack.unpackb(out))
        else:
            meta, existing = self._declared(frame)
            if existing is not None:
                return existing.info(), False
            self._next_queue_id += 1
            await self._catalogue(PutQueue(meta))
            q = self.queues.get(frame.queue)
            created = q is not None and q.meta.id == meta.id
            if q is not None and not created and _settings(q.meta) != _settings(meta):
                raise QueueExistsError(f"queue {frame.queue!r} was declared concurrently with other settings")
        await self._wait_queue(frame.queue, present=True)
        q = self.queue(frame.queue)
        return q.info(), created

    async def _group_delete(self, name: str, if_empty: bool, hops: int = 0) -> None:
        from broker.replication import CATALOGUE

        rep, _peers = self._group()
        q = self.queue(name)
        who = await rep.wait_active(CATALOGUE, self.election_wait)
        if who != self.config.name:
            if hops >= 3:
                raise UnavailableError("delete forwarded too many times while the group elects: retry")
            await self._forward(who, f"delete:{hops + 1}", msgpack.packb([name, if_empty]))
        else:
            if if_empty:
                depth = await self._group_depth(q)
                if depth:
                    raise InvalidArgumentError(f"queue {name!r} is not empty ({depth} messages)")
            await self._catalogue(DropQueue(q.meta.id))
        await self._wait_queue(name, present=False)

    async def _group_depth(self, q: Queue) -> int:
        """Messages in the queue, asked of each partition's active."""

        async def here(pidx: int) -> int:
            return self._partition_depth(q, pidx)

        return await self._sum_over_actives(q, "depth", here)

    async def _sum_over_actives(self, q: Queue, kind: str, here: Callable[[int], Any]) -> int:
        """For each partition: ``await here(p)`` on its active if that is this node, else the
        forwarded request ``kind``; the sum of the answers."""
        rep, _peers = self._group()
        total = 0
        for pidx in range(q.meta.partitions):
            who = await rep.wait_active((q.meta.id, pidx), self.election_wait)
            if who == self.config.name:
                total += await here(pidx)
            else:
                total += int(msgpack.unpackb(await self._forward(who, kind, msgpack.packb([q.name, pidx]))))
        return total

    def _partition_depth(self, q: Queue, pidx: int) -> int:
        """Ready and delivered-but-unsettled messages of one partition served here."""
        held = sum(1 for sess in self.sessions for c, m in sess.deliveries.values()
                   if c.queue is q and m.partition == pidx)
        return len(q.partitions[pidx].ready) + held

    async def _catalogue(self, op: WriteOp) -> None:
        rep, _peers = self._group()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def done(err: BaseException | None) -> None:
            if not fut.done():
                fut.set_exception(err) if err else fut.set_result(None)

        rep.propose_catalogue(op, done)
        await fut

    async def catch_up_catalogue(self) -> bool:
        """In a group: apply every catalogue change the catalogue's active holds before
        answering that a queue does not exist.  A declare confirmed through another member
        may not have reached this one yet (its entry commits with a majority that need not
        include this member), so a client that declares and then consumes here would be told
        the queue is missing.  True if this member applied catalogue changes meanwhile: a
        lookup that failed is worth one more try.  False if it had nothing to catch up (or
        cannot tell: no active, or it does not answer), so "not found" stands."""
        from broker.replication import CATALOGUE

        rep = self.replication
        if rep is None:
            return False
        before = rep.catalogue_applied()
        who = rep.active_of(CATALOGUE)
        if who is None or who == self.config.name:
            return False  # the active applies what it commits at once
        try:
            upto = int(msgpack.unpackb(await self._forward(who, "catalogue", b"")))
        except (TandemError, ValueError, TypeError):
            return False
        try:
            async with asyncio.timeout(self.election_wait):
                while rep.catalogue_applied() < upto:
                    await rep.changed.wait()
        except TimeoutError:
            raise UnavailableError(f"{self.config.name} is catching up with the group's queue catalogue: "
                                   "retry") from None
        return rep.catalogue_applied() > before

    async def _wait_queue(self, name: str, *, present: bool) -> None:
        """Until this node has applied the catalogue change (forwarded requests)."""
        rep, _peers = self._group()
        try:
            async with asyncio.timeout(self.election_wait):
                while (name in self.queues) != present:
                    await rep.changed.wait()
        except TimeoutError:
            raise UnavailableError(f"queue {name!r}: the change is committed but not yet applied on "
                                   f"{self.config.name}") from None

    async def _group_purge(self, q: Queue) -> int:
        total = await self._sum_over_actives(q, "purge", lambda pidx: self.purge_partition(q, pidx))
        log.info("queue purged name=%s messages=%d", q.name, total)
        return total

    async def purge_partition(self, q: Queue, pidx: int) -> int:
        part = q.partitions[pidx]
        msgs = list(part.ready)
        if not msgs:
            return 0
        part.ready.clear()
        q.ready_count -= len(msgs)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def done(err: BaseException | None) -> None:
            if not fut.done():
                fut.set_exception(err) if err else fut.set_result(None)

        self._submit_partition_ops([Settle(q.meta.id, pidx, [m.offset for m in msgs])], sync=True, callback=done)
        try:
            await fut
        except TandemError:
            if not q.deleted and (self.replication is None or self.replication.serving((q.meta.id, pidx))):
                q.requeue(msgs)
            raise
        return len(msgs)

    async def handle_forward(self, kind: str, payload: bytes) -> bytes:
        """A request another member forwarded here because this node is active for it."""
        from client.protocol.codec import decode_payload
        from client.protocol.frames import Publish

        name, _, arg = kind.partition(":")
        if name == "publish":
            hops, _, pidx = arg.partition(":")
            frame = expect(decode_payload(payload), Publish)
            fut: asyncio.Future[tuple[int, int, int]] = asyncio.get_running_loop().create_future()

            def done(st: int, dup: int, err: BaseException | None, last: int) -> None:
                if not fut.done():
                    fut.set_exception(err) if err else fut.set_result((st, dup, last))

            self.publish(frame.queue, frame.producer_id, frame.messages, done, hops=int(hops or 1),
                         partition=int(pidx) if pidx else None, dense=frame.partition is not None)
            return msgpack.packb(list(await fut))
        if name == "declare":
            decl = expect(decode_payload(payload), Declare)
            validate_declare(decl)
            _info, created = await self._group_declare(decl, int(arg or 1))
            return msgpack.packb(created)
        if name == "delete":
            qname, if_empty = msgpack.unpackb(payload)
            await self._group_delete(qname, bool(if_empty), int(arg or 1))
            return b""
        if name == "catalogue":  # how far the catalogue goes here (catch_up_catalogue)
            return msgpack.packb(self._group()[0].catalogue_commit())
        if name == "status":
            from client.protocol.codec import encode

            return encode(status_of(self, 0))[4:]
        if name == "pstats":
            from webconsole.server import pstats_payload

            qname, pidx = msgpack.unpackb(payload)
            return pstats_payload(self, qname, int(pidx))
        if name == "qstats":
            from webconsole.server import queue_counters

            return msgpack.packb(queue_counters(self))
        if name == "option":
            from webconsole.server import apply_option

            option, value, by = msgpack.unpackb(payload)
            apply_option(self, str(option), int(value), f"{by} via a member")
            return b""
        if name == "read":
            from client.protocol.codec import encode

            qname, pidx, offset, max_messages = msgpack.unpackb(payload)
            msgs, nxt, end = await self.read_stream(qname, int(pidx), int(offset), int(max_messages),
                                                    hops=int(arg or 1))
            return encode(ReadOk(rid=0, messages=msgs, next_offset=nxt, end_offset=end))[4:]
        if name == "depth":
            qname, pidx = msgpack.unpackb(payload)
            q = self.queue(qname)
            if self.replication is None or not self.replication.serving((q.meta.id, pidx)):
                raise UnavailableError(f"partition {q.meta.id}/{pidx} is not active on {self.config.name}")
            return msgpack.packb(self._partition_depth(q, pidx))
        if name == "purge":
            qname, pidx = msgpack.unpackb(payload)
            q = self.queue(qname)
            if not 0 <= pidx < q.meta.partitions:
                raise InvalidArgumentError(f"queue {qname!r} has no partition {pidx}")
            if self.replication is None or not self.replication.serving((q.meta.id, pidx)):
                raise UnavailableError(f"partition {q.meta.id}/{pidx} is not active on {self.config.name}")
            return msgpack.packb(await self.purge_partition(q, pidx))
        raise InvalidArgumentError(f"unknown forwarded request {kind!r}")


def status_of(node: Node, rid: int) -> StatusOk:
    """The node's view of itself and its group, for ``tandem status``."""
    cfg = node.config
    remotes: list[RemoteNode] = []
    if node.peers is None:
        quorum, override = "Active", None
    else:
        m = node.peers.membership
        quorum, override = m.quorum_state.value, m.quorum_override
        for name, (host, port) in sorted(node.peers.addresses.items()):
            ident = m.identity(name)
            remotes.append(RemoteNode(name, m.state(name).value, f"{host}:{port}",
                                      ident.priority if ident else 0, ident.votes if ident else 0,
                                      ident.store_stamp if ident else "",
                                      node.peers.client_addresses.get(name, "")))
    partitions, events, discarded, dp, dmsgs = [], [], 0, False, 0
    rep = node.replication
    if rep is not None:
        partitions = rep.partition_infos()
        events = [f"{e.kind} {e.partition}: {e.text}" for e in rep.events]
        discarded, dp = rep.discarded_total, rep.designated_primary is not None
        dmsgs = rep.discarded_messages
    return StatusOk(rid=rid, node=cfg.name, version=__version__, store_stamp=node.store_stamp,
                    priority=node.priority, votes=cfg.votes, quorum_state=quorum, quorum_policy=cfg.quorum_policy,
                    quorum_override=override, remotes=remotes, partitions=partitions, events=events,
                    discarded=discarded, designated_primary=dp, discarded_messages=dmsgs,
                    console=node.console.url if node.console is not None else "")


def _settings(meta: QueueMeta) -> dict[str, object]:
    return {
        "partitions": meta.partitions, "mapper": meta.mapper, "ring_size": meta.ring_size,
        "max_deliveries": meta.max_deliveries, "dead_letter_queue": meta.dead_letter_queue,
        "max_length": meta.max_length,
    }
