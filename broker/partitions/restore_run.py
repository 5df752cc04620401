"""A restore run in the group itself, for the admin API and the console (``POST /api/v1/restore``).

The procedure is :mod:`broker.partitions.restore`'s.  The node asked finds the active of the
quarantine's partitions and has each run it there (:class:`~broker.messaging.forward.RestoreFwd`):
an in-process consumer of the partitions it serves (:class:`_Taker`), which delivery, failover
and revocation treat like a client session's.  Every run is logged and kept in the node's
events with who asked and what it did.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Collection
from typing import Protocol

from broker.config import NodeConfig
from broker.messaging.delivery import Delivery
from broker.messaging.forward import RestoreFwd, decode_reply, pack_reply
from broker.messaging.publish import PublishRequest
from broker.messaging.message import Msg
from broker.messaging.queues import Consumer, Queue, Recipient
from broker.messaging.streams import Produced
from broker.partitions.quarantine import QUEUE
from broker.partitions.remap import BATCH, BATCH_BYTES, Publishing
from broker.partitions.restore import (BUDGET, WAIT, Filter, Report, Seen, compensated, republished, resent,
                                       taken)
from broker.partitions.compensation import load
from client.clock import Clock
from client.errors import QueueNotFoundError
from client.protocol.frames import PublishMessage, StreamMessage
from storage.base import WriteOp
from storage.writer import Callback

log = logging.getLogger("tandem.broker")

#: node events kept of restores (``tandem status``, the console's events)
MAX_EVENTS = 20


Held = tuple[Consumer, Msg]


class RestoreNode(Protocol):
    """The node a restore runs on: its settings, its queues, the deliveries it holds itself,
    their commits, and its events."""

    clock: Clock

    @property
    def config(self) -> NodeConfig: ...

    @property
    def name(self) -> str: ...

    @property
    def queues(self) -> dict[str, Queue]: ...

    @property
    def local_holders(self) -> set[Recipient]:
        """Deliveries held in the node itself (a restore's consumer), revoked like a session's."""
        ...

    def serves(self, q: Queue, pidx: int) -> bool: ...

    def write_later(self, ops: list[WriteOp], callback: Callback | None = None, *, lazy: bool = True) -> None: ...

    def restore_event(self, text: str) -> None: ...


class RestoreGroup(Protocol):
    """The group a restore reaches: the members serving the quarantine's partitions, and the
    source's partitions wherever they are served."""

    async def read_stream(self, queue: str, partition: int, offset: int, max_messages: int,
                          *, hops: int = 0) -> tuple[list[StreamMessage], int, int]: ...

    async def produced(self, queue: str, partition: int, producer: str, offset: int,
                       *, hops: int = 0) -> Produced: ...

    async def quarantine_actives(self) -> Collection[str]:
        """The members serving a partition of the quarantine queue (none if it does not exist)."""
        ...

    async def forward(self, who: str, request: RestoreFwd) -> bytes: ...


class _Taker:
    """An in-process consumer of the quarantine (a :class:`~broker.messaging.queues.Recipient`):
    deliveries are marked, counted and revoked on failover as a client session's are; each
    is handed to :meth:`Restores.here` once its mark is committed."""

    def __init__(self, node: RestoreNode, delivery: Delivery, name: str) -> None:
        self.node = node
        self.delivery = delivery
        self.client_name = name
        self.consumers: dict[int, Consumer] = {}
        self.deliveries: dict[int, Held] = {}
        self._next_tag = 1
        self._ready: deque[int] = deque()
        self._changed = asyncio.Event()
        self.cancelled = ""

    @property
    def writable(self) -> bool:
        return True

    def deliver(self, c: Consumer, msgs: list[Msg]) -> None:
        marks, marked = self.delivery.record_deliveries(c.queue, msgs)
        c.unacked += len(msgs)
        tags = list(range(self._next_tag, self._next_tag + len(msgs)))
        self._next_tag += len(msgs)
        self.deliveries.update(zip(tags, ((c, m) for m in msgs)))

        def committed(err: BaseException | None) -> None:
            if err is None:
                marked()
                self._ready.extend(tags)
            else:  # (the partition moved: its new active has them)
                gone = [self.deliveries.pop(t) for t in tags if t in self.deliveries]
                self.delivery.requeue(gone, counted=False)
            self._changed.set()

        if marks:
            self.node.write_later(marks, committed, lazy=False)
        else:
            committed(None)

    def cancelled_by_broker(self, c: Consumer, reason: str) -> None:
        self.consumers.pop(c.id, None)
        self.delivery.remove_consumer(c)
        self.cancelled = reason
        self._changed.set()

    async def next(self, wait: float) -> tuple[int, Msg] | None:
        """The next delivery (its tag and message), None after ``wait`` s without one."""
        while True:
            while self._ready:
                tag = self._ready.popleft()
                held = self.deliveries.get(tag)
                if held is not None:  # (else revoked: the partition's new active has it)
                    return tag, held[1]
            if self.cancelled:
                return None
            self._changed.clear()
            try:
                async with self.node.clock.timeout(wait):
                    await self._changed.wait()
            except TimeoutError:
                return None

    def ready(self, n: int, size: int) -> list[tuple[int, Msg]]:
        """Up to ``n`` more deliveries that are here already (no wait), of at most ``size``
        bytes."""
        out: list[tuple[int, Msg]] = []
        while self._ready and len(out) < n:
            held = self.deliveries.get(self._ready[0])
            if held is not None:
                size -= len(held[1].body) + len(held[1].headers_blob)
                if size < 0:
                    break
                out.append((self._ready[0], held[1]))
            self._ready.popleft()
        return out

    def settle(self, tag: int) -> None:
        held = self.deliveries.pop(tag, None)
        if held is not None:
            self.delivery.ack([held])

    def release(self) -> None:
        """Its consumers go; what it still holds is ready again, uncounted (never taken)."""
        for c in list(self.consumers.values()):
            self.delivery.remove_consumer(c)
        self.consumers.clear()
        held = list(self.deliveries.values())
        self.deliveries.clear()
        if held:
            self.delivery.requeue(held, counted=False)


class Restores:
    def __init__(self, node: RestoreNode, group: RestoreGroup, delivery: Delivery, publisher: Publishing) -> None:
        self.node = node
        self.group = group
        self.delivery = delivery
        self.publisher = publisher
        #: asked about each key conflict (the node's --compensation; checked when it started)
        self.hook = load(node.config.compensation) if node.config.compensation else None

    async def run(self, f: Filter, by: str) -> Report:
        """Restore what ``f`` takes, on every member serving a partition of the quarantine;
        the sum of what they did."""
        node = self.node
        whos = sorted(await self.group.quarantine_actives())
        report = Report()
        for part in await asyncio.gather(*(self._on(who, f) for who in whos)):
            report.add(part)
        text = "; ".join(report.lines(f.narrowed))
        log.warning("restore by %s%s: %s", by, _shown(f), text)
        node.restore_event(f"restore by {by}{_shown(f)}: {text}")
        return report

    async def _on(self, who: str, f: Filter) -> Report:
        if who == self.node.name:
            return await self.here(f)
        return Report.from_json(decode_reply(await self.group.forward(who, f.forward(1))))

    async def forwarded(self, req: RestoreFwd) -> bytes:
        return pack_reply((await self.here(Filter.of(req))).json())

    async def here(self, f: Filter) -> Report:
        """Restore what ``f`` takes of the quarantine's partitions this node serves (what they
        hold when it begins: :data:`~broker.partitions.restore.WAIT`), for at most BUDGET s
        (then ``more``: what is left waits for the next run).  A partition that
        moves to another member meanwhile ends the run (``moved``): its deliveries are that
        member's now, and nothing more of it comes here."""
        node = self.node
        report = Report()
        q = node.queues.get(QUEUE)
        if q is None:
            return report
        served = _served(node, q)
        if not served:  # (its active when the member asked looked, no longer)
            report.more = report.moved = True
            return report
        held = q.depth  # (of the partitions it serves: the run is done once it has looked at as many)
        taker = _Taker(node, self.delivery, "restore")
        node.local_holders.add(taker)
        try:
            c = self.delivery.add_consumer(taker, QUEUE, node.config.max_prefetch)
            taker.consumers[c.id] = c
            skipped: list[Msg] = []
            ends: dict[tuple[str, int], int] = {}
            seen: Seen = {}
            deadline = node.clock.monotonic() + BUDGET
            looked = 0
            while looked < held and (got := await taker.next(WAIT)) is not None:
                if _moved(node, q, served):
                    break
                if node.clock.monotonic() >= deadline:
                    report.more = True
                    break
                first = got[1]
                more = taker.ready(BATCH - 1, BATCH_BYTES - len(first.body) - len(first.headers_blob))
                looked += 1 + len(more)
                await self._batch(f, [got, *more], taker, report, skipped, ends, seen)
            if _moved(node, q, served):
                report.more = report.moved = True
            for m in skipped:
                report.left[m.headers.get("x-quarantine-queue", "")] += 1
        finally:
            taker.release()  # (what it skipped or left is ready again)
            node.local_holders.discard(taker)
        return report

    async def _batch(self, f: Filter, batch: list[tuple[int, Msg]], taker: _Taker, report: Report,
                     skipped: list[Msg], ends: dict[tuple[str, int], int], seen: Seen) -> None:
        """Put back what ``f`` takes of ``batch``: a publish per producer id (the queue and
        partition it was discarded from), each message settled in the quarantine once its
        queue has it."""
        groups: dict[tuple[str, str], list[tuple[int, PublishMessage, bool]]] = {}
        for tag, m in batch:
            h = m.headers
            if not f.wants(h):
                skipped.append(m)
                continue
            try:
                queue, pid, msg = republished(h, m.key, m.body)
                if report.holds(queue, pid):  # (not settled: back in the quarantine when the run ends)
                    continue
                there = await resent(h, seen, self._produced)
                if there is not None:
                    if there:
                        report.resent[queue] += 1
                        taker.settle(tag)
                        continue
                    report.unsure[queue] += 1
                conflict = await taken(h, ends, self._end)
                if conflict:
                    res, put = await compensated(self.hook, h, msg, self._read)
                    report.resolved(queue, pid, msg, res, log)
                    if put is None:
                        if res.outcome == "dropped":
                            taker.settle(tag)
                        continue  # (failed: not settled, back in the quarantine when the run ends)
                    msg = put
            except (QueueNotFoundError, KeyError, ValueError):
                # its queue is gone, or it is no quarantined message (headers missing or bad)
                report.left[h.get("x-quarantine-queue", "")] += 1
                continue
            groups.setdefault((queue, pid), []).append((tag, msg, conflict))
        for (queue, pid), items in groups.items():
            try:
                r = await self.publisher.publish(PublishRequest(queue, pid, [msg for _tag, msg, _c in items]))
            except QueueNotFoundError:  # (deleted a moment ago)
                report.left[queue] += len(items)
                continue
            report.restored[queue] += r.stored
            report.already[queue] += r.duplicates  # (a run cut short had published them)
            report.conflicts[queue] += sum(conflict for _tag, _msg, conflict in items)
            for tag, _msg, _conflict in items:
                taker.settle(tag)

    async def _read(self, queue: str, partition: int, offset: int) -> list[StreamMessage]:
        return (await self.group.read_stream(queue, partition, offset, 1))[0]

    async def _produced(self, queue: str, partition: int, producer: str, offset: int) -> Produced:
        return await self.group.produced(queue, partition, producer, offset)

    async def _end(self, queue: str, partition: int) -> int:
        return (await self.group.read_stream(queue, partition, 0, 1))[2]


def _served(node: RestoreNode, q: Queue) -> dict[int, int]:
    """The partitions of ``q`` this node serves, each with its generation (which moves when
    the node stops serving it, and when it serves it again)."""
    return {p.index: p.generation for p in q.partitions if node.serves(q, p.index)}


def _moved(node: RestoreNode, q: Queue, served: dict[int, int]) -> bool:
    """Whether a partition of ``served`` (:func:`_served` when the run began) has moved away
    since, even if it came back: what the run held of it is another member's, or new."""
    return not served.items() <= _served(node, q).items()


def _shown(f: Filter) -> str:
    parts = [f"{k} {v}" for k, v in (("from", f.origin), ("queue", f.queue), ("partition", f.partition))
             if v is not None]
    return f" ({', '.join(parts)})" if parts else ""
