"""A Tandem node: its store, its queues, its client listener, its lifecycle.

Data path of one publish batch (see DESIGN.md "Data path")::

    Session reads Publish  ->  Node.publish: map each message to a partition,
    drop duplicates (producer id, seq), assign offsets, build Append ops  ->
    GroupCommitWriter (one transaction + at most one fsync for everything
    waiting)  ->  callback on the loop: messages become ready, PublishOk sent,
    dispatch scheduled.

With ``NO_SYNC`` the messages are ready and confirmed at once and the write
follows.  Settlements (ack, nack, reject, dead-lettering) change memory at once
and are written with the next commit.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING

from broker.config import NodeConfig
from broker.queues import Consumer, Msg, Partition, Queue, decode_headers, encode_headers, validate_declare
from broker.users import UserRegistry, bootstrap_admin
from client.clock import SYSTEM_CLOCK, Clock
from client.errors import (
    InvalidArgumentError,
    MessageTooLargeError,
    QueueExistsError,
    QueueFullError,
    QueueNotFoundError,
    ShuttingDownError,
    TandemError,
)
from client.protocol.frames import Declare, PublishMessage, QueueInfo
from storage.base import (
    Append,
    DropQueue,
    DurabilityPolicy,
    PutProducer,
    PutQueue,
    QueueMeta,
    Recovered,
    MarkDelivered,
    SetDeliveryCount,
    Settle,
    StoredMessage,
    WriteOp,
)
from storage.sqlite import SqliteEngine
from storage.writer import GroupCommitWriter

if TYPE_CHECKING:
    from broker.session import Session

log = logging.getLogger("tandem.broker")

PublishDone = Callable[[int, int, BaseException | None], None]  # stored, duplicates, error


class Node:
    def __init__(self, config: NodeConfig, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.config = config
        self.clock = clock
        self.queues: dict[str, Queue] = {}
        self.users = UserRegistry([])
        self.sessions: set[Session] = set()
        self.store_stamp = ""
        self.engine = SqliteEngine(config.db_path)
        self.writer: GroupCommitWriter | None = None
        self._server: asyncio.Server | None = None
        self._next_queue_id = 1
        self._next_consumer_id = 1
        self._dirty: set[Queue] = set()
        self._dispatch_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.stopping = False
        self.stopped = asyncio.Event()
        self.address: tuple[str, int] = (config.host, config.port)
        self.data_path = config.data_dir

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        cfg = self.config
        self._loop = asyncio.get_running_loop()
        log.info("node start started name=%s data_dir=%s sync=%s", cfg.name, cfg.data_dir, cfg.sync.value)
        await asyncio.to_thread(cfg.data_dir.mkdir, parents=True, exist_ok=True)
        self.data_path = await asyncio.to_thread(cfg.data_dir.resolve)
        recovered = await asyncio.to_thread(self.engine.open)
        self.writer = GroupCommitWriter(self.engine, self._loop.call_soon_threadsafe, clock=self.clock)
        self._restore(recovered)
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
        self._server = await asyncio.start_server(self._on_client, cfg.host, cfg.port, limit=1 << 20)
        sock = self._server.sockets[0].getsockname()
        self.address = (sock[0], sock[1])
        total = sum(q.depth for q in self.queues.values())
        log.info(
            "node start complete name=%s url=tandem://%s:%d data_dir=%s sync=%s queues=%d messages=%d",
            cfg.name, self.address[0], self.address[1], self.data_path, cfg.sync.value,
            len(self.queues), total,
        )

    def _restore(self, rec: Recovered) -> None:
        for meta in rec.queues:
            q = Queue(meta)
            self.queues[meta.name] = q
            self._next_queue_id = max(self._next_queue_id, meta.id + 1)
        by_id = {q.meta.id: q for q in self.queues.values()}
        for (qid, pidx), st in rec.partitions.items():
            found = by_id.get(qid)
            if found is None or pidx >= len(found.partitions):
                log.warning("recovery ignored rows of unknown queue_id=%d partition=%d", qid, pidx)
                continue
            q = found
            part = q.partitions[pidx]
            part.next_offset = part.committed_end = st.next_offset
            part.delivered_upto = st.delivered_upto
            part.producers = st.producers
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
        if self._server is not None:
            self._server.close()
        for s in list(self.sessions):
            s.shutdown(ShuttingDownError(f"node {self.config.name} is shutting down"))
        if self.sessions:
            await asyncio.gather(*(s.finished.wait() for s in list(self.sessions)))
        if self._server is not None:
            await self._server.wait_closed()
        if self.writer is not None:
            await asyncio.to_thread(self.writer.close)
            st = self.writer.stats
            log.info("store writer stats commits=%d synced=%d failed=%d ops=%d max_batch_ops=%d busy_s=%.2f",
                     st.commits, st.synced_commits, st.failed_commits, st.ops, st.max_batch_ops,
                     st.commit_seconds_total)
        await asyncio.to_thread(self.engine.close)
        log.info("node stop complete name=%s", self.config.name)
        self.stopped.set()

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        from broker.session import Session

        if self.stopping or len(self.sessions) >= self.config.max_connections:
            writer.close()
            return
        session = Session(self, reader, writer)
        self.sessions.add(session)
        try:
            await session.run()
        finally:
            self.sessions.discard(session)
            self.release(session)

    # -- store ----------------------------------------------------------------------------

    def write(self, ops: list[WriteOp], *, sync: bool) -> asyncio.Future[None]:
        assert self._loop is not None and self.writer is not None
        fut: asyncio.Future[None] = self._loop.create_future()

        def done(err: BaseException | None) -> None:
            if not fut.done():
                fut.set_exception(err) if err else fut.set_result(None)

        self.writer.submit(ops, sync=sync, callback=done)
        return fut

    def write_later(self, ops: list[WriteOp]) -> None:
        """Write with the next commit; nobody waits for it."""
        if ops and self.writer is not None:
            self.writer.submit_lazy(ops)

    # -- queues -------------------------------------------------------------------------

    def queue(self, name: str) -> Queue:
        q = self.queues.get(name)
        if q is None:
            raise QueueNotFoundError(f"queue {name!r} does not exist")
        return q

    async def declare(self, frame: Declare) -> tuple[QueueInfo, bool]:
        validate_declare(frame)
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

    async def delete(self, name: str, if_empty: bool) -> None:
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
        q = self.queue(name)
        removed = q.purge_ready()
        ops: list[WriteOp] = [Settle(q.meta.id, p, offs) for p, offs in removed.items()]
        if ops:
            await self.write(ops, sync=self.config.sync is DurabilityPolicy.SYNC)
        count = sum(len(o) for o in removed.values())
        log.info("queue purged name=%s messages=%d", name, count)
        return count

    # -- publish -----------------------------------------------------------------------

    def publish(self, queue_name: str, producer_id: str | None, messages: list[PublishMessage],
                done: PublishDone) -> None:
        """Store a batch; ``done(stored, duplicates, error)`` runs once it is confirmed."""
        if self.stopping:
            raise ShuttingDownError("node is shutting down")
        q = self.queue(queue_name)
        limit = self.config.max_message_size
        for m in messages:
            if len(m.body) > limit:
                raise MessageTooLargeError(f"message of {len(m.body)} bytes exceeds max_message_size {limit}")
        if q.meta.max_length and q.depth + len(messages) > q.meta.max_length:
            raise QueueFullError(
                f"queue {queue_name!r} is full: {q.depth} of max_length {q.meta.max_length}"
            )
        ts = self.clock.time()
        by_part: dict[int, list[Msg]] = {}
        seen: list[tuple[Partition, str, int | None]] = []  # to undo producer seqs on failure
        duplicates = 0
        parts = q.partitions
        mapper = q.mapper.partition
        for m in messages:
            pidx = mapper(m.key)
            part = parts[pidx]
            if producer_id is not None and m.seq is not None:
                last = part.producers.get(producer_id)
                if last is not None and m.seq <= last:
                    duplicates += 1
                    continue
                seen.append((part, producer_id, last))
                part.producers[producer_id] = m.seq
            offset = part.next_offset
            part.next_offset = offset + 1
            headers = m.headers
            blob = encode_headers(headers)
            msg = Msg(pidx, offset, m.key, headers, blob, m.body, producer_id, m.seq, ts)
            lst = by_part.get(pidx)
            if lst is None:
                by_part[pidx] = [msg]
            else:
                lst.append(msg)
        stored = len(messages) - duplicates
        if not by_part:
            done(0, duplicates, None)
            return
        ops: list[WriteOp] = []
        for pidx, msgs in by_part.items():
            part = parts[pidx]
            ops.append(Append(q.meta.id, pidx, msgs, part.next_offset))
        if producer_id is not None:
            for part, pid, _prev in {(p.index, pid): (p, pid, prev) for p, pid, prev in seen}.values():
                ops.append(PutProducer(q.meta.id, part.index, pid, part.producers[pid]))
        q.published += stored
        policy = self.config.sync
        if policy is DurabilityPolicy.NO_SYNC:
            self._make_ready(q, by_part)
            self.write_later(ops)
            done(stored, duplicates, None)
            return
        q.pending_count += stored
        assert self.writer is not None

        def committed(err: BaseException | None) -> None:
            q.pending_count -= stored
            if err is not None:
                for part, pid, prev in reversed(seen):
                    if prev is None:
                        part.producers.pop(pid, None)
                    else:
                        part.producers[pid] = prev
                q.published -= stored
                done(0, 0, err)
                return
            if not q.deleted:
                self._make_ready(q, by_part)
            done(stored, duplicates, None)

        self.writer.submit(ops, sync=policy is DurabilityPolicy.SYNC, callback=committed)

    def _make_ready(self, q: Queue, by_part: dict[int, list[Msg]]) -> None:
        for pidx, msgs in by_part.items():
            part = q.partitions[pidx]
            q.add_ready(part, msgs)
            end = msgs[-1].offset + 1
            if end > part.committed_end:
                part.committed_end = end
        self.schedule_dispatch(q)

    # -- dispatch -----------------------------------------------------------------------

    def schedule_dispatch(self, q: Queue) -> None:
        self._dirty.add(q)
        if not self._dispatch_scheduled and self._loop is not None:
            self._dispatch_scheduled = True
            self._loop.call_soon(self._dispatch)

    def _dispatch(self) -> None:
        self._dispatch_scheduled = False
        dirty, self._dirty = self._dirty, set()
        for q in dirty:
            if not q.deleted:
                self.dispatch_queue(q)

    def dispatch_queue(self, q: Queue) -> None:
        """Hand ready messages to consumers with credit, fairly, in batches."""
        while q.ready_count and q.consumers:
            eligible = [c for c in q.consumers_in_turn() if c.credit > 0 and c.session.writable]
            if not eligible:
                return
            share = max(1, -(-q.ready_count // len(eligible)))
            for c in eligible:
                msgs = q.take(min(c.credit, share, 1024))
                if not msgs:
                    return
                c.session.deliver(c, msgs)

    def record_deliveries(self, q: Queue, msgs: list[Msg]) -> None:
        """Count a delivery on each message.

        In the store a delivery is one number per partition, the delivered
        mark (messages go out in offset order, requeues excepted); a delivery
        count is written per message only when a delivery ends unsettled
        (:meth:`requeue`).  See storage.base.Recovered for what comes back.
        """
        marks: dict[int, int] = {}
        parts = q.partitions
        for m in msgs:
            m.dc += 1
            if m.offset >= parts[m.partition].delivered_upto:
                parts[m.partition].delivered_upto = marks[m.partition] = m.offset + 1
        q.unacked_count += len(msgs)
        q.delivered += len(msgs)
        if marks:
            self.write_later([MarkDelivered(q.meta.id, p, upto) for p, upto in marks.items()])

    # -- consumers and settlement ------------------------------------------------------------

    def add_consumer(self, session: Session, queue_name: str, prefetch: int) -> Consumer:
        if not 1 <= prefetch <= 65535:
            raise InvalidArgumentError(f"prefetch {prefetch}: must be 1..65535")
        q = self.queue(queue_name)
        c = Consumer(self._next_consumer_id, q, session, prefetch)
        self._next_consumer_id += 1
        q.consumers.append(c)
        self.schedule_dispatch(q)
        return c

    def remove_consumer(self, c: Consumer) -> None:
        if c in c.queue.consumers:
            c.queue.consumers.remove(c)

    def ack(self, settled: list[tuple[Consumer, Msg]]) -> None:
        ops: dict[tuple[Queue, int], list[int]] = {}
        for c, m in settled:
            self._release_one(c)
            c.queue.acked += 1
            ops.setdefault((c.queue, m.partition), []).append(m.offset)
        self.write_later([Settle(q.meta.id, p, offs) for (q, p), offs in ops.items() if not q.deleted])

    def requeue(self, settled: list[tuple[Consumer, Msg]]) -> None:
        """Back to ready; past ``max_deliveries`` to the dead-letter queue instead."""
        expired: list[tuple[Consumer, Msg]] = []
        counts: dict[tuple[Queue, int], list[tuple[int, int]]] = {}
        for c, m in settled:
            limit = c.queue.meta.max_deliveries
            if limit and m.dc >= limit:
                expired.append((c, m))
                continue
            self._release_one(c)
            if not c.queue.deleted:
                c.queue.requeue(m)
                counts.setdefault((c.queue, m.partition), []).append((m.offset, m.dc))
        self.write_later([SetDeliveryCount(q.meta.id, p, items) for (q, p), items in counts.items()])
        if expired:
            self.dead_letter(expired, "delivery_limit")

    def dead_letter(self, settled: list[tuple[Consumer, Msg]], reason: str) -> None:
        """Move messages to their queue's dead-letter queue (or drop them without one)."""
        ops: list[WriteOp] = []
        moved: dict[Queue, dict[int, list[Msg]]] = {}
        for c, m in settled:
            src = c.queue
            self._release_one(c)
            if src.deleted:
                continue
            ops.append(Settle(src.meta.id, m.partition, [m.offset]))
            dlq = self.queues.get(src.meta.dead_letter_queue or "")
            if dlq is None:
                if src.meta.dead_letter_queue:
                    log.warning("dead-letter queue %s missing: dropped message queue=%s id=%s",
                                src.meta.dead_letter_queue, src.name, m.id)
                continue
            pidx = dlq.mapper.partition(m.key)
            part = dlq.partitions[pidx]
            headers = {**m.headers, "x-death-reason": reason, "x-death-queue": src.name,
                       "x-death-id": m.id}
            new = Msg(pidx, part.next_offset, m.key, headers, encode_headers(headers), m.body,
                      None, None, m.ts)
            part.next_offset += 1
            ops.append(Append(dlq.meta.id, pidx, [new], part.next_offset))
            moved.setdefault(dlq, {}).setdefault(pidx, []).append(new)
            dlq.published += 1
        self.write_later(ops)
        for dlq, by_part in moved.items():
            self._make_ready(dlq, by_part)

    def _release_one(self, c: Consumer) -> None:
        c.unacked -= 1
        c.queue.unacked_count -= 1
        self.schedule_dispatch(c.queue)

    def release(self, session: Session) -> None:
        """A session ended: its consumers go, its unacked deliveries become ready again."""
        for c in list(session.consumers.values()):
            self.remove_consumer(c)
        held = list(session.deliveries.values())
        session.deliveries.clear()
        if held:
            self.requeue(held)
            log.info("session released name=%s requeued=%d", session.client_name, len(held))


def _settings(meta: QueueMeta) -> dict[str, object]:
    return {
        "partitions": meta.partitions, "mapper": meta.mapper, "ring_size": meta.ring_size,
        "max_deliveries": meta.max_deliveries, "dead_letter_queue": meta.dead_letter_queue,
        "max_length": meta.max_length,
    }
