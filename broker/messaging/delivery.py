"""Deliveries and settlements: who gets which ready message, and what happens after.

Dispatch hands ready messages to consumers with credit, fairly, in batches
that fit a frame.  A first delivery of a message moves the partition's
*delivered mark*, which is committed (written to the OS, not fsynced) before
the ``Deliver`` frame leaves, so after a crash a message that reached a
consumer comes back marked redelivered (docs/architecture.md, "Delivery
counts").  Settlements change memory at once and are written lazily.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from broker.messaging.commit import CommitPath
from broker.config import NodeConfig
from broker.messaging.limits import make_room
from broker.messaging.deadletter import Routing, destination
from broker.messaging.mapper import dead_letter_partition
from broker.messaging.message import Msg, Partition, encode_headers
from broker.messaging.queues import Consumer, Queue, Recipient
from client.clock import Clock
from client.errors import AccessRefusedError, InvalidArgumentError, ShuttingDownError, TandemError
from client.protocol.frames import Delivery as DeliveryRecord
from storage.base import Append, MarkDelivered, SetDeliveryCount, Settle, StoredMessage, WriteOp
from storage.writer import Callback

class PrefetchGuard(Protocol):
    """The node's limit on a subscriber's prefetch (broker.security.auth.ClientGuard)."""
    def check_prefetch(self, prefetch: int) -> None: ...


class DeadLetterRule(Protocol):
    """Who may dead-letter where (broker.security.acl.AclTable)."""
    def dead_letter_refusal(self, users: Any, owner: str | None, target: str) -> str | None: ...


class Tagging(Recipient, Protocol):
    """A recipient that hands out its own delivery tags (a client session, a relay)."""

    def tag(self, c: Consumer, m: Msg) -> DeliveryRecord: ...


class DeliveryRules(Protocol):
    """The node's settings and grants deliveries follow: frame size, prefetch limit, who may
    dead-letter where."""

    @property
    def config(self) -> NodeConfig: ...

    users: Any  # (with acls: who may dead-letter where)

    @property
    def guard(self) -> PrefetchGuard: ...

    @property
    def acls(self) -> DeadLetterRule: ...


class DeliveryHost(Routing, Protocol):
    """The node's queues, exchanges and the partitions it serves: what delivery reads, writes and
    hands on."""

    @property
    def commit(self) -> CommitPath: ...

    @property
    def has_quorum(self) -> bool: ...

    def queue(self, name: str) -> Queue: ...

    def serves(self, q: Queue, pidx: int) -> bool: ...

    def write_later(self, ops: list[WriteOp], callback: Callback | None = None, *, lazy: bool = True) -> None: ...

    def dead_letter_remote(self, src: Queue, m: Msg, targets: list[Queue], headers: dict[str, str]) -> None: ...

    async def read_cold(self, q: Queue, pidx: int, offset: int, limit: int) -> tuple[int, list[StoredMessage]]:
        """The store's log end of the partition, then up to ``limit`` unsettled messages from
        ``offset`` on (on a reader thread)."""
        ...


class Tasks(Protocol):
    """The node's tasks and clock (a cold region's refill runs as a task of the node's)."""

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...

    @property
    def clock(self) -> Clock: ...


log = logging.getLogger("tandem.broker")

MAX_DELIVER_BATCH = 1024
#: seconds before a cold region is read again when the store did not have it yet
COLD_RETRY = 0.05
Held = tuple[Consumer, Msg]


class Delivery:
    def __init__(self, node: DeliveryHost, rules: DeliveryRules, tasks: Tasks) -> None:
        self.node = node
        self.rules = rules
        self.tasks = tasks
        self._next_consumer_id = 1
        self._dirty: set[Queue] = set()
        self._scheduled = False

    # -- ready messages and dispatch ---------------------------------------------------------

    def make_ready(self, q: Queue, by_part: dict[int, list[Msg]]) -> None:
        for pidx, msgs in by_part.items():
            q.add_ready(q.partitions[pidx], msgs)
        self.schedule(q)

    def schedule(self, q: Queue) -> None:
        self._dirty.add(q)
        if not self._scheduled:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # not started: the node's start dispatches what is ready
            self._scheduled = True
            loop.call_soon(self._dispatch)

    def _dispatch(self) -> None:
        self._scheduled = False
        dirty, self._dirty = self._dirty, set()
        for q in sorted(dirty, key=lambda q: q.meta.id):  # (in id order: the same order on every run)
            if not q.deleted:
                self.dispatch_queue(q)

    def dispatch_queue(self, q: Queue) -> None:
        """Hand ready messages to consumers with credit, fairly, in frame-sized batches;
        read cold regions back as their partitions' hot heads run low."""
        if not self.node.has_quorum:
            return  # no quorum: partitions Unavailable here; dispatch resumes when it returns
        self._hand_out(q)
        if q.cold_count and q.consumers:
            for part in q.partitions:
                if q.wants_refill(part):
                    self.tasks.spawn(self._refill(q, part))

    async def _refill(self, q: Queue, part: Partition) -> None:
        """Read the next batch of a partition's cold region from the store into memory."""
        epoch, offset, limit = q.begin_refill(part)
        wait = COLD_RETRY
        try:
            stored_end, stored = await self.node.read_cold(q, part.index, offset, limit)
        except ShuttingDownError:
            return  # (the node stops: its store could not be read, or it was stopping anyway)
        except (TandemError, OSError) as exc:
            log.warning("reading the backlog of %s/%d failed (%s): retrying in 1 s", q.name, part.index, exc)
            stored_end, stored, wait = 0, [], 1.0
        if q.deleted:
            return
        if not q.end_refill(part, epoch, stored, limit, stored_end) and epoch == part.epoch:
            # the store has not written them yet (its writes follow the commit): again soon
            part.reading = True
            await self.tasks.clock.sleep(wait)
            if epoch == part.epoch:
                part.reading = False
        self.schedule(q)

    def _hand_out(self, q: Queue) -> None:
        budget = self.rules.config.max_frame_size - 4096
        while q.ready_count and q.consumers:
            eligible = [c for c in q.consumers_in_turn() if c.credit > 0 and c.session.writable]
            if not eligible:
                return
            share = max(1, -(-q.ready_count // len(eligible)))
            for c in eligible:
                msgs = self.take_live(q, min(c.credit, share, MAX_DELIVER_BATCH), budget)
                if not msgs:
                    return
                c.session.deliver(c, msgs)

    def hold_got(self, r: Tagging, q: Queue, m: Msg) -> tuple[DeliveryRecord, list[WriteOp], Callable[[], None]]:
        """``m``, taken by a get, held by ``r`` under a tag of its own until settled: its delivery,
        the delivered-mark ops to commit before it leaves, and what to call once they are."""
        marks, marked = self.record_deliveries(q, [m])
        holder = Consumer(0, q, r, 1)
        holder.unacked = 1
        return r.tag(holder, m), marks, marked

    def record_deliveries(self, q: Queue, msgs: list[Msg]) -> tuple[list[WriteOp], Callable[[], None]]:
        """Count a delivery on each message.  Returns the delivered-mark ops to commit
        before the messages leave (none if the mark already covers them) and what to
        call once they are committed."""
        need: dict[int, int] = {}
        parts = q.partitions
        for m in msgs:
            m.dc += 1
            if m.offset >= parts[m.partition].marked_upto and m.offset >= need.get(m.partition, 0):
                need[m.partition] = m.offset + 1
        q.unacked_count += len(msgs)
        q.delivered += len(msgs)

        def marked() -> None:
            for p, upto in need.items():
                parts[p].marked_upto = max(parts[p].marked_upto, upto)

        return [MarkDelivered(q.meta.id, p, upto) for p, upto in need.items()], marked

    # -- consumers -------------------------------------------------------------------------------

    def add_consumer(self, session: Recipient, queue_name: str, prefetch: int, exclusive: bool = False) -> Consumer:
        """A consumer of ``queue_name``; AccessRefusedError if the queue has an exclusive consumer
        here, or has any and this one is to be ``exclusive`` (relayed consumers of other members
        count: broker.sessions.relay)."""
        if not 1 <= prefetch <= 65535:
            raise InvalidArgumentError(f"prefetch {prefetch}: must be 1..65535")
        self.rules.guard.check_prefetch(prefetch)
        q = self.node.queue(queue_name)
        if q.consumers and (exclusive or any(o.exclusive for o in q.consumers)):
            raise AccessRefusedError(f"queue {queue_name!r} in exclusive use")
        c = Consumer(self._next_consumer_id, q, session, prefetch, exclusive)
        self._next_consumer_id += 1
        q.consumers.append(c)
        q.touch()
        self.schedule(q)
        return c

    @staticmethod
    def remove_consumer(c: Consumer) -> None:
        if c in c.queue.consumers:
            c.queue.consumers.remove(c)
            c.queue.touch()

    # -- settlement -------------------------------------------------------------------------------

    def _release_one(self, c: Consumer) -> None:
        c.unacked -= 1
        c.queue.unacked_count -= 1
        self.schedule(c.queue)

    def release_slots(self, settled: list[Held]) -> None:
        """The consumers no longer hold these deliveries, a transaction does (broker.messaging.prepared):
        their prefetch slots are free, and the queue counts them unacked until its outcome."""
        for c, _m in settled:
            c.unacked -= 1
            self.schedule(c.queue)

    def ack(self, settled: list[Held]) -> None:
        offsets: dict[tuple[Queue, int], list[int]] = {}
        for c, m in settled:
            self._release_one(c)
            c.queue.acked += 1
            offsets.setdefault((c.queue, m.partition), []).append(m.offset)
        self.node.write_later([Settle(q.meta.id, p, offs) for (q, p), offs in offsets.items() if not q.deleted])

    def requeue(self, settled: list[Held], *, counted: bool = True) -> None:
        """Back to ready; past ``max_deliveries`` to the dead-letter queue instead.

        ``counted=False``: the client says the messages were never shown to the
        application (buffered when it cancelled), so the delivery is not counted.
        """
        expired: list[Held] = []
        back: dict[Queue, list[Msg]] = {}
        counts: dict[tuple[Queue, int], list[tuple[int, int]]] = {}
        for c, m in settled:
            if not counted:
                m.dc = max(0, m.dc - 1)
            limit = c.queue.meta.max_deliveries
            if limit and m.dc >= limit:
                expired.append((c, m))
                continue
            self._release_one(c)
            if not c.queue.deleted and self.node.serves(c.queue, m.partition):
                back.setdefault(c.queue, []).append(m)
                counts.setdefault((c.queue, m.partition), []).append((m.offset, m.dc))
        for q, msgs in back.items():
            q.requeue(msgs)
        self.node.write_later([SetDeliveryCount(q.meta.id, p, items) for (q, p), items in counts.items()],
                              lazy=False)
        if expired:
            self.dead_letter(expired, "delivery_limit")

    def dead_letter(self, settled: list[Held], reason: str) -> None:
        """Move delivered messages to their queue's dead-letter queue (or drop them without one,
        or when the queue's owner may not write there: docs/security.md)."""
        for c, _m in settled:
            self._release_one(c)
        self._dead_letter([(c.queue, m) for c, m in settled], reason)

    def expire(self, q: Queue, msgs: list[Msg]) -> None:
        """Ready messages of ``q`` expired (broker.messaging.timing): to its dead-letter queue, or
        dropped; counted."""
        q.expired += len(msgs)
        self._dead_letter([(q, m) for m in msgs], "expired")

    def take_live(self, q: Queue, n: int, max_bytes: int) -> list[Msg]:
        """:meth:`Queue.take`, the expired messages among them expired instead of delivered."""
        while True:
            msgs = q.take(n, max_bytes)
            if not msgs or not (q.meta.message_ttl or q.expiring):
                return msgs
            now = self.tasks.clock.time()
            dead = [m for m in msgs if 0 < q.expires_at(m) <= now]
            if not dead:
                return msgs
            self.expire(q, dead)
            if len(dead) < len(msgs):
                gone = {id(m) for m in dead}
                return [m for m in msgs if id(m) not in gone]

    def shed(self, q: Queue, msgs: list[Msg]) -> None:
        """Ready messages of ``q`` leave it to make room (``overflow`` drop-head,
        broker.messaging.limits): to its dead-letter queue, or dropped."""
        self._dead_letter([(q, m) for m in msgs], "maxlen")

    def _dead_letter(self, leaving: list[tuple[Queue, Msg]], reason: str) -> None:
        """Each message leaves its queue for where broker.messaging.deadletter says (dropped if
        nowhere): in the same write as its settle where every target partition is served here
        with it, else published there and settled once stored."""
        ops: list[WriteOp] = []
        moved: dict[Queue, dict[int, list[Msg]]] = {}
        commit = self.node.commit
        for src, m in leaving:
            if src.deleted or not self.node.serves(src, m.partition):
                continue
            to = destination(src, m, reason, self.node,
                             lambda target: self.rules.acls.dead_letter_refusal(self.rules.users, src.meta.owner,
                                                                                target))
            headers = to.headers
            if to.queues and not commit.serves_together(
                    {(q.meta.id, dead_letter_partition(q.name, q.mapper, q.meta.partitions, m.key)) for q in to.queues}):
                # a target partition is active elsewhere: settle here once it is stored there
                self.node.dead_letter_remote(src, m, to.queues, headers)
                continue
            ops.append(Settle(src.meta.id, m.partition, [m.offset]))
            if to.why is not None:
                log.warning("%s: dropped message queue=%s id=%s reason=%s", to.why, src.name, m.id, reason)
            for dlq in to.queues:
                full = make_room(dlq, 1, len(m.body) + len(encode_headers(headers)), self.shed)
                if full is not None:
                    log.warning("dead-letter queue %s %s: dropped message queue=%s id=%s reason=%s", dlq.name, full,
                                src.name, m.id, reason)
                    continue
                pidx = dead_letter_partition(dlq.name, dlq.mapper, dlq.meta.partitions, m.key)
                part = dlq.partitions[pidx]
                new = Msg(pidx, part.next_offset, m.key, headers, encode_headers(headers), m.body, None, None, m.ts)
                part.next_offset += 1
                ops.append(Append(dlq.meta.id, pidx, [new], part.next_offset))
                moved.setdefault(dlq, {}).setdefault(pidx, []).append(new)
                dlq.published += 1
        for dlq, by_part in moved.items():
            self.make_ready(dlq, by_part)

        def committed(err: BaseException | None) -> None:
            for dlq, by_part in moved.items():
                dlq.mark_committed(by_part)

        self.node.write_later(ops, committed, lazy=False)

    def undeliver(self, holder: Recipient, tags: list[int]) -> None:
        """The delivered mark of these deliveries did not commit: they never leave.  A
        message a consumer saw must come again counted, so none is shown before its mark
        is in the log; ready again here, or the new active's if the partition moved."""
        held = [holder.deliveries.pop(t) for t in tags if t in holder.deliveries]
        if held:
            self.requeue(held, counted=False)

    def release(self, session: Recipient) -> None:
        """A session ended: its consumers go, its unacked deliveries become ready again."""
        for c in list(session.consumers.values()):
            self.remove_consumer(c)
        held = list(session.deliveries.values())
        session.deliveries.clear()
        if held:
            self.requeue(held)
            log.info("session released name=%s requeued=%d", session.client_name, len(held))

