"""Durable consumers: the whole queue, every member's partitions, resubscribed after
failures.

A consumer subscribes on every member (each delivers the partitions it is active for:
``Subscribe.local``, the direct route; a member relays nothing to it) and resubscribes
after a link fails; the messages held on a failed link come again,
marked ``redelivered``, and settling one of the old deliveries raises
:class:`~client.errors.StaleDeliveryError` (safe to ignore), never touching another
message.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import weakref
from collections import deque
from types import TracebackType
from typing import Any

from client.clock import Backoff
from client.connection import Connection
from client.consumer import Consumer
from client.durable.links import DurableLinks
from client.errors import ConnectionClosedError, InvalidArgumentError, StaleDeliveryError, TandemError
from client.protocol.frames import Ack, Delivery, Nack, Reject

log = logging.getLogger("tandem.client")


class _SharedSettlement(asyncio.Future[None]):
    """The future of the settlements of one ack frame, shared by all of them: it cannot be
    cancelled, so a task cancelled while it awaits its ack (a timeout, a shutdown) leaves
    the others awaiting theirs alone (the task itself still gets CancelledError)."""

    def cancel(self, msg: Any = None) -> bool:
        return False


#: the settlement future handed out for each shared frame future of a link (one per ack
#: frame); weak: a frame that never completes (its loop stopped) leaves nothing behind
_settle_outs: weakref.WeakKeyDictionary[asyncio.Future[None], asyncio.Future[None]] = weakref.WeakKeyDictionary()


def _stale_translated(inner: asyncio.Future[None], node: str | None) -> asyncio.Future[None]:
    """The future of an ack frame as its settlements see it: a failure that means "it comes
    again" becomes StaleDeliveryError.  One per frame, shared like the frame's own."""
    out: asyncio.Future[None] = _SharedSettlement(loop=asyncio.get_running_loop())
    _settle_outs[inner] = out

    def done(f: asyncio.Future[None]) -> None:
        _settle_outs.pop(f, None)
        if out.done():
            return
        exc = f.exception() if not f.cancelled() else ConnectionClosedError("cancelled")
        if exc is None:
            out.set_result(None)
        elif isinstance(exc, TandemError) and exc.redelivers:
            out.set_exception(StaleDeliveryError(f"settling on {node} failed ({exc}); the messages will be "
                                                 "delivered again"))
            out.exception()  # safe to ignore: no "never retrieved" noise for a fire-and-forget ack
        else:
            out.set_exception(exc)

    inner.add_done_callback(done)
    return out


class DurableMessage:
    """A delivered message of a durable consumer; settle it once.  If its link failed
    meanwhile, settling raises StaleDeliveryError: it will come again, redelivered.

    ``ack``/``nack``/``reject`` return the future of the frame that carries the settlement;
    the settlements of one loop turn share it, and it refuses ``cancel()``: a task cancelled
    while awaiting it gets CancelledError once the frame is answered, the others their
    result."""

    __slots__ = ("_link", "_d", "_settled", "queue")

    def __init__(self, link: Connection, d: Delivery, queue: str = "") -> None:
        self._link = link
        self._d = d
        self._settled = False
        self.queue = queue  # the queue it came from

    body = property(lambda self: self._d.body, doc="the payload, bytes")
    key = property(lambda self: self._d.key)
    headers = property(lambda self: self._d.headers)
    id = property(lambda self: self._d.id, doc="'<partition>-<offset>', unique within the queue")
    partition = property(lambda self: self._d.partition)
    offset = property(lambda self: self._d.offset)
    redelivered = property(lambda self: self._d.redelivered)
    delivery_count = property(lambda self: self._d.delivery_count)
    timestamp = property(lambda self: self._d.timestamp)
    node = property(lambda self: self._link.node, doc="the node that delivered it")
    tag = property(lambda self: self._d.tag, doc="delivery tag on the link it came on")
    settled = property(lambda self: self._settled, doc="acked, nacked or rejected (in a transaction too)")

    def __repr__(self) -> str:
        return f"<DurableMessage id={self.id} node={self.node} dc={self.delivery_count}>"

    def _mark_settled(self) -> Connection:
        """Settled from now on (by the caller); the link it came on."""
        if self._settled:
            raise InvalidArgumentError(f"message {self.id} is already settled")
        if self._link.is_closed:
            raise StaleDeliveryError(f"message {self.id} came on a link to {self._link.node} that has failed; "
                                     "it will be delivered again")
        self._settled = True
        return self._link

    def _settle(self, kind: type, requeue: bool = True) -> asyncio.Future[None]:
        self._mark_settled()
        inner = self._link.settle(kind, self._d.tag, requeue)
        out = _settle_outs.get(inner)
        return out if out is not None else _stale_translated(inner, self._link.node)

    def ack(self) -> asyncio.Future[None]:
        return self._settle(Ack)

    def nack(self, *, requeue: bool = True) -> asyncio.Future[None]:
        return self._settle(Nack, requeue)

    def reject(self) -> asyncio.Future[None]:
        return self._settle(Reject)


async def _cancel_quietly(c: Consumer) -> None:
    try:
        await c.cancel()
    except TandemError:
        pass  # its link is gone: nothing to cancel there


class DurableConsumer:
    """Consumes the whole queue: one subscription per member of the group, each kept
    (re-dialed, resubscribed) while the consumer runs."""

    def __init__(self, conn: DurableLinks, queue: str, *, prefetch: int = 256) -> None:
        if not 1 <= prefetch <= 65535:
            raise InvalidArgumentError("prefetch must be 1..65535")
        self.conn = conn
        self.queue = queue
        self.prefetch = prefetch
        self.received = 0
        self._buffer: deque[tuple[Connection, Delivery]] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._members: dict[str, asyncio.Task[None]] = {}
        self._subs: dict[str, Consumer] = {}
        self._watch: asyncio.Task[None] | None = None
        self._started = False
        self._closed = False
        self._error: TandemError | None = None

    def _sink(self, link: Connection, deliveries: list[Delivery]) -> None:
        if self._closed:  # a subscription that outlived close(): give them back, uncounted
            for d in deliveries:
                try:
                    link.settle(Nack, d.tag, delivered=False)
                except TandemError:
                    pass  # the link is gone: the node requeues them
            return
        self._buffer.extend((link, d) for d in deliveries)
        self.received += len(deliveries)
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def start(self) -> DurableConsumer:
        if self._started:
            return self
        self._started = True
        m = await self.conn.partition_map(self.queue)  # the queue must exist; learns the members
        for name in m.addresses:
            self._member_task(name)
        self._watch = asyncio.create_task(self._watch_members(), name=f"tandem-consumer-{self.queue}")
        # Wait (a little) for every member's subscription, not for a member that refused the
        # connection since: its task goes on retrying it, and subscribes once it is back.
        began = self.conn.clock.monotonic()
        deadline = began + 5.0
        while self.conn.clock.monotonic() < deadline and not all(
                n in self._subs or self.conn.failed_since(n, began) for n in m.addresses):
            await self.conn.wait_changed(0.1)
        return self

    def _ended(self, exc: TandemError) -> None:
        """A subscription ended for good (its queue was deleted): so does this consumer."""
        if exc.ends_subscription and self._error is None:
            self._error = exc
            w = self._waiter
            if w is not None and not w.done():
                w.set_result(None)

    def _member_task(self, name: str) -> None:
        if name not in self._members and not self._closed:
            self._members[name] = asyncio.create_task(self._member(name), name=f"tandem-consumer-{name}")

    async def _watch_members(self) -> None:
        epoch = self.conn.map_epoch
        while not self._closed:
            if self.conn.map_epoch != epoch and self.conn.connected:
                epoch = self.conn.map_epoch
                try:  # learns members that were unknown (down, not yet peered) at start
                    await self.conn.partition_map(self.queue, timeout=2.0)
                except TandemError:
                    pass  # asked again on the next change
            for name in list(self.conn.addresses):
                self._member_task(name)
            await self.conn.wait_changed(1.0)

    async def _member(self, name: str) -> None:
        backoff = Backoff(0.05, 1.0, self.conn._rng)
        while not self._closed and not self.conn.is_closed:
            try:
                link = await self.conn.link(name, self.conn.clock.monotonic() + 5.0)
                c = Consumer(link, self.queue, prefetch=self.prefetch, local=True)
                c.sink = functools.partial(self._sink, link)
                c.on_end = self._ended
                try:
                    await c.start()
                except asyncio.CancelledError:
                    # closing while it subscribes: the subscription may still come up; end it
                    await asyncio.shield(_cancel_quietly(c))
                    raise
                self._subs[name] = c
                self.conn._changed()
                backoff.reset()
                await link.closed_event.wait()
            except TandemError as exc:
                if exc.ends_subscription:
                    self._ended(exc)
                    return
                log.debug("consumer of %s on %s: %s", self.queue, name, exc)
            self._subs.pop(name, None)
            if not self._closed:
                await self.conn.clock.sleep(backoff.next())

    def __aiter__(self) -> DurableConsumer:
        return self

    async def __anext__(self) -> DurableMessage:
        if not self._started:
            await self.start()
        while True:
            while self._buffer:
                link, d = self._buffer.popleft()
                if link.is_closed:
                    continue  # it comes again through the partition's next active
                return DurableMessage(link, d, self.queue)
            if self._error is not None:
                raise self._error
            if self._closed or self.conn.is_closed:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                async with self.conn.clock.timeout(0.5):
                    await self._waiter
            except TimeoutError:
                pass
            self._waiter = None

    async def next(self, timeout: float | None = None) -> DurableMessage | None:
        """The next message, or None after ``timeout`` seconds without one."""
        try:
            async with self.conn.clock.timeout(timeout):
                return await self.__anext__()
        except (TimeoutError, StopAsyncIteration):
            return None

    async def close(self) -> None:
        """Cancel every member's subscription; what arrived but was never handed out goes back."""
        await asyncio.shield(self._close())

    async def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        tasks = list(self._members.values()) + ([self._watch] if self._watch else [])
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        subs = list(self._subs.values())
        self._subs.clear()
        await asyncio.gather(*(c.cancel() for c in subs), return_exceptions=True)
        while self._buffer:
            link, d = self._buffer.popleft()
            if not link.is_closed:
                try:
                    link.settle(Nack, d.tag, delivered=False)
                except TandemError:
                    pass  # the link closed meanwhile: the node requeues it
        self.conn._consumers.discard(self)

    cancel = close

    async def __aenter__(self) -> DurableConsumer:
        return await self.start()

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()
