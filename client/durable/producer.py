"""Durable producers: each partition's messages go straight to its active, and what a
failover leaves unconfirmed goes again.

A producer learns the queue's partition map (a Metadata frame; the node pushes
MapChanged when an active moves) and numbers each partition's messages 0, 1, 2, ...
per (producer, partition).  The node refuses a batch that would leave a gap
(OutOfOrderSequence) and confirms again, without storing, a sequence it holds.  So
after any failure of a partition's batches the producer waits for all of them to come
back, asks the partition where its sequence stands (an empty publish), reports
confirmed messages the partition no longer holds (``messages_lost``, only possible
under weak durability policies), and resends every unconfirmed message in order.  That
is each partition's :class:`~client.durable.pipeline.PartitionPipeline`; this module is
the asyncio shell that drives them.  ``send`` raises only when ``send_timeout`` passes.

With the connection's ``buffer_path``, a send made while no node is reachable goes to
a local SQLite file (:mod:`client.buffer`) and returns at once, marked ``buffered``;
the buffer drains in order before later sends, and a new process with the same path
and producer id drains what an earlier one left (:mod:`client.durable.draining`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from collections import deque
from collections.abc import Awaitable, Iterable, Mapping
from types import TracebackType
from typing import Any

from client.buffer import SendBuffer
from client.clock import Backoff
from client.connection import Connection
from client.durable.draining import BufferDrain
from client.durable.events import ConnectionEvent, SendResult
from client.durable.links import DurableLinks
from client.durable.pipeline import Item, PartitionPipeline, SendState, Step
from client.errors import (
    ConfirmedMessagesLost,
    ConnectionClosedError,
    InvalidArgumentError,
    MessageTooLargeError,
    TandemError,
    TimeoutError_,
)
from client.mapper import DataMapper, make_mapper
from client.producer import Body, _as_bytes
from client.protocol.frames import PartitionMap, Publish, PublishMessage, PublishOk, expect
from client.timing import timed_headers

log = logging.getLogger("tandem.client")

STALL = 1.0  # seconds a batch may go unanswered before the producer asks who is active


def _transient(exc: BaseException) -> bool:
    """A failure the producer rides through (another node or a later try may succeed)."""
    return isinstance(exc, TandemError) and exc.should_retry


def _check_key_headers(key: str | None, headers: Mapping[str, str] | None) -> None:
    """What msgpack cannot encode must fail in ``send``, not in the pump."""
    if headers and not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        raise InvalidArgumentError("headers must map str to str")
    if key is not None and not isinstance(key, str):
        raise InvalidArgumentError("key must be a str")
    try:
        for text in (key or "", *(headers or {}).keys(), *(headers or {}).values()):
            text.encode()
    except UnicodeEncodeError as exc:
        raise InvalidArgumentError(f"key and headers must be valid UTF-8 text: {exc}") from None


class DurableProducer(BufferDrain):
    def __init__(self, conn: DurableLinks, queue: str, *, producer_id: str | None, max_batch: int,
                 max_in_flight: int, send_timeout: float) -> None:
        if max_batch < 1 or max_in_flight < 1:
            raise InvalidArgumentError("max_batch and max_in_flight must be >= 1")
        self.conn = conn
        self.queue = queue
        self.producer_id = producer_id or uuid.uuid4().hex
        self._continues = producer_id is not None  # may hold sequences already: probe first
        self.max_batch = max_batch
        self.max_in_flight = max_in_flight
        self.send_timeout = send_timeout
        self._pending: deque[Item] = deque()  # not yet given a partition
        self._parts: list[PartitionPipeline] = []
        self._map: PartitionMap | None = None
        self._map_epoch = -1
        self._mapper: DataMapper | None = None
        self._mapper_name = ""
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._drained = asyncio.Event()
        self._stopped: TandemError | None = None
        self._unconfirmed = 0  # futures not yet resolved
        self.buffer: SendBuffer | None = None
        if conn.buffer_path is not None:
            self.buffer = SendBuffer(conn.buffer_path, self.producer_id, queue, conn.buffer_max_bytes)
        self._draining = self.buffer is not None and self.buffer.count > 0
        self._loaded_upto = 0  # buffer rows up to this id are in the pipelines
        self._appending = 0  # buffer appends under way
        self._tasks: set[asyncio.Future[Any]] = set()
        self._batch_ids = 0
        self._stall_checked = 0.0
        self.sent = self.confirmed = self.duplicates = self.buffered = self.resent = 0
        self.lost = 0  # confirmed messages the group no longer holds (ConfirmedMessagesLost)
        self._task = asyncio.create_task(self._run(), name=f"tandem-producer-{queue}")

    # -- the application's side -----------------------------------------------------------------

    async def send(self, body: Body, *, key: str | None = None, headers: Mapping[str, str] | None = None,
                   delay: float | None = None, deliver_at: float | None = None,
                   ttl: float | None = None) -> SendResult:
        """Publish one message; returns once it is confirmed (or written to the local buffer).
        Raises only after ``send_timeout`` (TimeoutError_), or for a message no node could take.
        ``delay``, ``deliver_at`` and ``ttl`` time it (:mod:`client.timing`)."""
        return await self.send_nowait(body, key=key, headers=headers, delay=delay, deliver_at=deliver_at, ttl=ttl)

    def send_nowait(self, body: Body, *, key: str | None = None, headers: Mapping[str, str] | None = None,
                    delay: float | None = None, deliver_at: float | None = None,
                    ttl: float | None = None) -> asyncio.Future[SendResult]:
        """Queue one message and return the future of its :class:`SendResult` (for callers
        that keep many in flight without a task each)."""
        item = self._item(body, key, timed_headers(headers, delay=delay, deliver_at=deliver_at, ttl=ttl))
        if not self.conn.connected and self.buffer is not None:
            if not self._draining:
                self._draining = True
                self.conn._emit(ConnectionEvent("buffering", "", f"{self.queue}: sends go to {self.conn.buffer_path}"))
            self._appending += 1  # later sends wait behind it, even if a node answers meanwhile
            return asyncio.ensure_future(self._to_buffer(item))
        self._pending.append(item)
        self._unconfirmed += 1
        self._wake.set()
        assert item.fut is not None
        return item.fut

    async def send_many(self, messages: Iterable[Body | tuple[Body, str | None] |
                                                 tuple[Body, str | None, Mapping[str, str] | None]]
                        ) -> list[SendResult]:
        """Publish many, pipelined; results in order once all are confirmed."""
        futs = []
        for m in messages:
            if isinstance(m, tuple):
                body, key, *rest = m
                futs.append(self.send(body, key=key, headers=rest[0] if rest else None))
            else:
                futs.append(self.send(m))
        return list(await asyncio.gather(*futs))

    def _item(self, body: Body, key: str | None, headers: Mapping[str, str] | None) -> Item:
        if self._stopped is not None:
            raise self._stopped
        data = _as_bytes(body)
        primary = self.conn._primary
        limit = primary.max_message_size if primary is not None else 5 * 1024 * 1024
        if len(data) > limit:
            raise MessageTooLargeError(f"message of {len(data)} bytes exceeds the node's max_message_size {limit}")
        if key is not None or headers:
            _check_key_headers(key, headers)
        frame_limit = (primary.max_frame_size if primary is not None else 8 * 1024 * 1024) - 4096
        fut: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()
        item = Item(PublishMessage(key, dict(headers) if headers else {}, data, None), fut,
                    self.conn.clock.monotonic() + self.send_timeout)
        if item.size > frame_limit:
            raise MessageTooLargeError(f"message with its key and headers ({item.size} bytes) does not fit in "
                                       f"a frame ({frame_limit} bytes)")
        self._idle.clear()
        return item

    def _resolve(self, it: Item, result: SendResult | None, exc: BaseException | None = None) -> None:
        fut, it.fut = it.fut, None
        if fut is None:
            return
        if not fut.done():  # (done: its sender cancelled the wait)
            fut.set_exception(exc) if exc is not None else fut.set_result(result)  # type: ignore[arg-type]
        self._unconfirmed -= 1
        self._maybe_idle()

    def _maybe_idle(self) -> None:
        if self._unconfirmed <= 0:
            self._idle.set()
        if not self._draining:
            self._drained.set()

    async def flush(self) -> None:
        """Until every message sent so far is confirmed or failed (messages in the local
        buffer are safe on disk: see :meth:`wait_drained`)."""
        while self._unconfirmed > 0 and self._stopped is None:
            self._idle.clear()
            try:
                async with self.conn.clock.timeout(0.5):
                    await self._idle.wait()
            except TimeoutError:
                pass

    async def close(self) -> None:
        """Flush (what is in the local buffer stays there for the next run), then stop."""
        try:
            await self.flush()
        finally:
            await self._stop(ConnectionClosedError("producer closed"))

    async def _stop(self, exc: TandemError) -> None:
        if self._stopped is not None:
            return
        self._stopped = exc
        tasks = [self._task, *self._tasks]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        items = list(self._pending)
        for part in self._parts:
            items += list(part.items())
        for it in items:
            self._resolve(it, None, exc)
        if self.buffer is not None:
            self.buffer.close()
        self.conn._producers.discard(self)

    async def __aenter__(self) -> DurableProducer:
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)

        def done(t: asyncio.Future[Any]) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("producer %s: %s", self.producer_id, t.exception())
            self._wake.set()

        task.add_done_callback(done)

    # -- the pump -----------------------------------------------------------------------------------

    async def _run(self) -> None:
        conn = self.conn
        backoff = Backoff(rng=conn._rng)
        while True:
            self._wake.clear()
            try:
                if self._map is None or self._map_epoch != conn.map_epoch:
                    await self._load_map()
                if self._draining and conn.connected and all(p.state is SendState.READY for p in self._parts):
                    await self._drain()
                if not self._draining:  # the buffer goes first
                    self._assign()
                for part in self._parts:
                    self._drive(part)
                self._expire()
                backoff.reset()
            except TandemError as exc:
                log.debug("producer %s: %s", self.producer_id, exc)
                if not _transient(exc):  # say, the queue is gone, or this user may not publish
                    while self._pending:
                        self._resolve(self._pending.popleft(), None, exc)
                self._expire()
                await conn.wait_changed(backoff.next())
                continue
            except Exception:  # a bug, or the buffer's file failing: log it, the pump goes on
                log.exception("producer %s of %s: pump step failed", self.producer_id, self.queue)
                self._expire()
                await conn.wait_changed(backoff.next())
                continue
            await self._wait_wake(0.1)

    async def _wait_wake(self, timeout: float) -> None:
        """Until a send, an answer or a change of the connection, or ``timeout`` seconds."""
        wake = asyncio.ensure_future(self._wake.wait())
        changed = asyncio.ensure_future(self.conn.changed.wait())
        try:
            async with self.conn.clock.timeout(timeout):
                await asyncio.wait([wake, changed], return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError:
            pass
        finally:
            wake.cancel()
            changed.cancel()

    async def _load_map(self) -> None:
        conn = self.conn
        epoch = conn.map_epoch
        m = await conn.partition_map(self.queue, timeout=1.0)
        info = m.queue
        if self._parts and len(self._parts) > info.partitions:
            raise InvalidArgumentError(f"queue {self.queue!r} has fewer partitions than this producer knew")
        mapper = self._mapper
        if mapper is None or len(self._parts) != info.partitions or self._mapper_name != info.mapper:
            # a new queue, or one that got partitions or another mapper (tandem partition add /
            # update): what is sent from now on goes where the queue's mapper says; what is
            # assigned to a partition already stays there
            self._mapper = make_mapper(info.mapper, info.partitions, info.ring_size)
            self._mapper_name = info.mapper
            self._parts += [PartitionPipeline(i, conn._rng, probe_first=self._continues)
                            for i in range(len(self._parts), info.partitions)]
            if mapper is not None:
                log.info("producer %s: queue %s now has %d partitions (mapper %s)", self.producer_id, self.queue,
                         info.partitions, info.mapper)
        self._map = m
        self._map_epoch = epoch
        for part in self._parts:
            active = m.actives[part.index] if part.index < len(m.actives) else ""
            gone = part.map_loaded(active)
            if gone:
                log.info("producer %s: partition %d of %s moved to %s: %d batch(es) in flight elsewhere are "
                         "resent", self.producer_id, part.index, self.queue, active, gone)

    def _assign(self) -> None:
        if self._mapper is None:
            return
        mapper, parts = self._mapper, self._parts
        while self._pending:
            it = self._pending.popleft()
            parts[mapper.partition(it.msg.key)].assign(it)

    def _link_for(self, part: PartitionPipeline) -> Connection | None:
        assert self._map is not None
        active = self._map.actives[part.index] if part.index < len(self._map.actives) else ""
        if active:
            link = self.conn.link_now(active)
            if link is not None:
                return link
            if active in self.conn.addresses:
                return None  # being dialed
        p = self.conn._primary  # no active known: that node forwards it (and waits for one)
        return p if p is not None and not p.is_closed else None

    def _drive(self, part: PartitionPipeline) -> None:
        clock = self.conn.clock
        window = self.max_batch * self.max_in_flight
        step = part.next_step(clock.monotonic(), window)
        if step is Step.WAIT:
            return
        if step is Step.RECORD:  # buffered messages: their numbering goes to disk before they go out
            self._spawn(self._record(part, part.start_record(window)))
            return
        link = self._link_for(part)
        if link is None:
            return
        if step is Step.PROBE:
            part.start_probe()
            self._spawn(self._probe(part, link))
            return
        limit = link.max_frame_size - 4096
        while part.unsent and part.inflight < self.max_in_flight:
            items = part.take_batch(self.max_batch, limit)
            if not items:
                return
            rid = link.next_rid()
            try:
                reply = link.request_nowait(Publish(rid=rid, queue=self.queue, messages=[it.msg for it in items],
                                                    producer_id=self.producer_id, partition=part.index))
            except TandemError as exc:
                if _transient(exc):  # the link failed as the batch was written: it waits its turn again
                    part.requeue(items)
                    self._failed(part, exc, [])
                else:  # say, a key msgpack cannot encode: it never goes out
                    self._failed(part, exc, items)
                return
            bid = self._batch_ids = self._batch_ids + 1
            self.resent += part.sent(bid, link.node or "", items, clock.monotonic())
            self.sent += len(items)
            reply.add_done_callback(functools.partial(self._reply, part, bid))

    def _reply(self, part: PartitionPipeline, bid: int, reply: asyncio.Future[Any]) -> None:
        self._wake.set()
        items = part.reply(bid)
        exc = reply.exception() if not reply.cancelled() else ConnectionClosedError("publish cancelled")
        if items is None:  # abandoned (its node lost the partition): it is being resent
            return
        if exc is None:
            ok = expect(reply.result(), PublishOk)
            part.confirm(items)
            for it in items:
                self._resolve(it, SendResult(part.index, it.msg.seq or 0))
            self.confirmed += len(items)
            self.duplicates += ok.duplicates
            self._forget_buffered(items)
            return
        if self._stopped is not None:  # closing: nothing is resent
            for it in items:
                self._resolve(it, None, self._stopped)
            return
        self._failed(part, exc, items)

    def _failed(self, part: PartitionPipeline, exc: BaseException, items: list[Item]) -> None:
        """The batch ``items`` failed: the partition settles (probe) and resends, except
        what can never be stored, which fails; a buffered message is never dropped."""
        if isinstance(exc, TandemError) and exc.reroutes:
            self.conn.map_epoch += 1  # ask again who is active
        if _transient(exc):
            back = items
        else:
            # this batch can never be stored as it is (a full queue, a deleted queue): its
            # senders hear it; the probe renumbers what follows over the gap it leaves
            back = [it for it in items if it.buf_id is not None]
            for it in items:
                if it.buf_id is None:
                    self._resolve(it, None, exc)
            if back:
                log.error("producer %s: %d buffered message(s) of %s refused (%s); they stay in %s and are "
                          "tried again", self.producer_id, len(back), self.queue, exc, self.conn.buffer_path)
                self.conn._emit(ConnectionEvent("buffer_blocked", "", f"{self.queue}: {exc}",
                                                exc if isinstance(exc, TandemError) else None))
        part.fail(self.conn.clock.monotonic(), back)
        log.info("producer %s: partition %d of %s: %s", self.producer_id, part.index, self.queue, exc)

    async def _probe(self, part: PartitionPipeline, link: Connection) -> None:
        """Ask the partition where this producer's sequence stands, report confirmed messages
        it no longer holds, renumber what it does not hold, and resume sending."""
        try:
            reply = expect(await link.request(lambda rid: Publish(
                rid=rid, queue=self.queue, messages=[], producer_id=self.producer_id, partition=part.index)),
                PublishOk)
        except BaseException as exc:
            part.probe_failed(self.conn.clock.monotonic())
            if isinstance(exc, TandemError) and exc.reroutes:
                self.conn.map_epoch += 1
            if not _transient(exc):
                raise
            return
        n = reply.next_seq
        confirmed = part.confirmed
        lost = part.probed(n)
        if lost:
            self.lost += lost
            err = ConfirmedMessagesLost(
                f"partition {part.index} of {self.queue} holds producer {self.producer_id}'s messages only "
                f"up to seq {n - 1}, but {confirmed} was confirmed: {lost} confirmed messages lost",
                queue=self.queue, partition=part.index, producer_id=self.producer_id, first_seq=n, count=lost)
            log.error("%s", err.message)
            self.conn._emit(ConnectionEvent("messages_lost", link.node or "", err.message, err))

    async def _record(self, part: PartitionPipeline, items: list[Item]) -> None:
        """Write the (partition, seq) of buffered messages to their rows before sending them."""
        assert self.buffer is not None
        written: list[Item] | None = None
        try:
            rows = [(it.buf_id, part.index, it.msg.seq) for it in items
                    if it.buf_id is not None and it.msg.seq is not None]
            await asyncio.to_thread(self.buffer.assign, rows)
            written = items
        finally:
            part.recorded(written)

    def _expire(self) -> None:
        now = self.conn.clock.monotonic()
        timeout = self.send_timeout
        if now - self._stall_checked >= STALL and any(part.stalled(now, STALL) for part in self._parts):
            # a batch unanswered this long: its node may hang (SIGSTOP, a cut link that TCP
            # has not noticed): ask again who is active (and another node, if the primary hangs)
            self._stall_checked = now
            self.conn.map_epoch += 1
        while self._pending and self._pending[0].deadline <= now:
            self._resolve(self._pending.popleft(), None,
                          TimeoutError_(f"message to {self.queue}: no node took it within send_timeout={timeout}s"))
        for part in self._parts:
            overdue = part.overdue(now)
            for it in overdue:
                self._resolve(it, None, TimeoutError_(
                    f"message to {self.queue} not confirmed within send_timeout={timeout}s"
                    + ("; it may still be stored" if it.sent else "")))
            if overdue:
                part.drop_unsent()
