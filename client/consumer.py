"""Consumers: deliveries pushed by the broker under credit-based flow control.

The broker sends at most ``prefetch`` unsettled messages to a consumer; each
ack, nack or reject frees credit for the next.  Deliveries arrive in batches
and wait in a local buffer that ``async for m in consumer`` drains.

``m.ack()``, ``m.nack(requeue=True)`` and ``m.reject()`` return awaitables;
all settlements made in one event-loop iteration travel in one frame.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import Callable
from types import TracebackType

from client.errors import InvalidArgumentError, TandemError
from client.link import Link
from client.protocol.frames import Ack, Cancel, Delivery, Nack, Reject


class DeliveredMessage:
    """What a delivered message shows, in the async and the blocking client alike."""

    __slots__ = ("_d", "_settled")

    def __init__(self, delivery: Delivery) -> None:
        self._d = delivery
        self._settled = False

    def _mark_settled(self) -> None:
        if self._settled:
            raise InvalidArgumentError(f"message {self.id} is already settled")
        self._settled = True

    body = property(lambda self: self._d.body, doc="the payload, bytes")
    key = property(lambda self: self._d.key, doc="the message key, or None")
    headers = property(lambda self: self._d.headers, doc="dict of str to str")
    id = property(lambda self: self._d.id, doc="'<partition>-<offset>', unique within the queue")
    partition = property(lambda self: self._d.partition)
    offset = property(lambda self: self._d.offset)
    redelivered = property(lambda self: self._d.redelivered, doc="delivered before (and not acked)")
    delivery_count = property(lambda self: self._d.delivery_count, doc="deliveries so far, this one included")
    timestamp = property(lambda self: self._d.timestamp, doc="when the broker stored it (epoch seconds)")
    tag = property(lambda self: self._d.tag, doc="delivery tag on this connection")

    def __repr__(self) -> str:
        return f"<Message id={self.id} key={self.key!r} bytes={len(self.body)} dc={self.delivery_count}>"


class Message(DeliveredMessage):
    """A delivered message.  Settle it exactly once with ack, nack or reject."""

    __slots__ = ("_conn",)

    def __init__(self, conn: Link, delivery: Delivery) -> None:
        super().__init__(delivery)
        self._conn = conn

    def _settle(self, kind: type, requeue: bool = True, multiple: bool = False) -> asyncio.Future[None]:
        self._mark_settled()
        return self._conn.settle(kind, self._d.tag, requeue, multiple=multiple)

    def ack(self, *, multiple: bool = False) -> asyncio.Future[None]:
        """Done with it: the broker forgets the message.

        ``multiple=True`` also acks every earlier delivery this connection holds
        (the messages must not be settled again).
        """
        return self._settle(Ack, multiple=multiple)

    def nack(self, *, requeue: bool = True) -> asyncio.Future[None]:
        """Not done: back to the queue (or, with requeue=False, to the dead-letter queue)."""
        return self._settle(Nack, requeue)

    def reject(self) -> asyncio.Future[None]:
        """Cannot be processed: dead-letter it (dropped if the queue has no dead-letter queue)."""
        return self._settle(Reject)


class Consumer:
    def __init__(self, conn: Link, queue: str, *, prefetch: int = 256, local: bool = False) -> None:
        if not 1 <= prefetch <= 65535:
            raise InvalidArgumentError("prefetch must be 1..65535")
        self.conn = conn
        self.queue = queue
        self.prefetch = prefetch
        #: only the partitions active on the connection's node (the group and durable consumers'
        #: direct routes); false: the whole queue, the node relaying what other members serve
        self.local = local
        self.consumer_id: int | None = None
        self._subscribing: asyncio.Future[int] | None = None
        self._buffer: deque[Delivery] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._error: TandemError | None = None
        self.received = 0
        #: set by a GroupConsumer: deliveries go there instead of this consumer's buffer
        self.sink: Callable[[list[Delivery]], None] | None = None
        #: set by a DurableConsumer: told when the subscription ends (link closed, queue deleted)
        self.on_end: Callable[[TandemError], None] | None = None

    async def start(self) -> Consumer:
        """Subscribe (once: a start interrupted by a timeout is resumed, not repeated)."""
        if self.consumer_id is None:
            if self._subscribing is None:
                self._subscribing = asyncio.ensure_future(self.conn.subscribe(self))
            self.consumer_id = await asyncio.shield(self._subscribing)
        return self

    def _return_unseen(self) -> None:
        """Give back what arrived but was never handed out, without counting a delivery."""
        while self._buffer:
            self.conn.settle(Nack, self._buffer.popleft().tag, delivered=False)

    def _deliver(self, deliveries: list[Delivery]) -> None:
        if self.sink is not None:
            self.received += len(deliveries)
            self.sink(deliveries)
            return
        self._buffer.extend(deliveries)
        self.received += len(deliveries)
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _closed(self, exc: TandemError) -> None:
        self._error = exc
        if self.on_end is not None:
            self.on_end(exc)
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> Message:
        if self.consumer_id is None:
            await self.start()
        while not self._buffer:
            if self._error is not None:
                if self.conn.closed_by_client:
                    raise StopAsyncIteration
                raise self._error
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
            self._waiter = None
        return Message(self.conn, self._buffer.popleft())

    async def next(self, timeout: float | None = None) -> Message | None:
        """The next message, or None after ``timeout`` seconds without one."""
        try:
            async with self.conn.clock.timeout(timeout):
                return await self.__anext__()
        except (TimeoutError, StopAsyncIteration):
            return None

    async def cancel(self) -> None:
        """Stop deliveries.  Messages handed out stay held until settled; those
        still buffered go back to the queue without counting a delivery."""
        if self._subscribing is not None and self.consumer_id is None and not self._subscribing.done():
            try:
                await asyncio.shield(self._subscribing)
            except TandemError:
                return  # the subscription failed: nothing to cancel
        if self.consumer_id is not None and not self.conn.is_closed:
            cid = self.consumer_id
            await self.conn.request(lambda rid: Cancel(rid=rid, consumer=cid))
            self.conn._unregister(cid)  # later deliveries for it are returned by the connection
            self._return_unseen()
        self.consumer_id = None
        self._subscribing = None

    async def close(self) -> None:
        await self.cancel()

    async def __aenter__(self) -> Consumer:
        return await self.start()

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()


class GroupConsumer:
    """Consumes a queue of a replication group over a direct route to each member: one
    subscription per member (the node of ``conn`` and every other member, at the client
    addresses the group reports), each delivering only the partitions it is active for
    (``local``), merged into one stream; each message settles on the connection it came from.
    A member that is down is tried again every ``retry`` seconds, so partitions that
    fail over to it keep flowing.  With a single node it is just a consumer."""

    def __init__(self, conn: Link, queue: str, *, prefetch: int = 256, retry: float = 1.0) -> None:
        self.conn = conn
        self.queue = queue
        self.prefetch = prefetch
        self.retry = retry
        self.received = 0
        self._buffer: deque[tuple[Link, Delivery]] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._parts: dict[str, Consumer] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._error: TandemError | None = None
        self._started = False

    def _sink(self, conn: Link, deliveries: list[Delivery]) -> None:
        self._buffer.extend((conn, d) for d in deliveries)
        self.received += len(deliveries)
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def start(self) -> GroupConsumer:
        if self._started:
            return self
        self._started = True
        main = Consumer(self.conn, self.queue, prefetch=self.prefetch, local=True)
        main.sink = functools.partial(self._sink, self.conn)
        await main.start()
        self._parts[self.conn.node or "?"] = main
        st = await self.conn.status()
        for r in st.remotes:
            self._tasks.append(asyncio.ensure_future(self._member(r.name)))
        return self

    async def _member(self, name: str) -> None:
        """Keep a subscription on member ``name`` while this consumer runs."""
        while True:
            try:
                st = await self.conn.status()
                addr = next((r.client_address for r in st.remotes if r.name == name), "")
                if addr:
                    sib = await self.conn.sibling(name, addr)
                    c = Consumer(sib, self.queue, prefetch=self.prefetch, local=True)
                    c.sink = functools.partial(self._sink, sib)
                    await c.start()
                    self._parts[name] = c
                    await sib.closed_event.wait()
                    self._parts.pop(name, None)
            except (TandemError, OSError, TimeoutError):
                pass  # that member is down or refusing: try again shortly
            if self.conn.is_closed:
                return
            await self.conn.clock.sleep(self.retry)

    def __aiter__(self) -> GroupConsumer:
        return self

    async def __anext__(self) -> Message:
        await self.start()
        while not self._buffer:
            if self.conn.is_closed:
                if self.conn.closed_by_client:
                    raise StopAsyncIteration
                raise self.conn.close_error or TandemError("connection closed")
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                async with self.conn.clock.timeout(self.retry):
                    await self._waiter
            except TimeoutError:
                pass  # look at the main connection again
            self._waiter = None
        conn, d = self._buffer.popleft()
        return Message(conn, d)

    async def next(self, timeout: float | None = None) -> Message | None:
        """The next message, or None after ``timeout`` seconds without one."""
        try:
            async with self.conn.clock.timeout(timeout):
                return await self.__anext__()
        except (TimeoutError, StopAsyncIteration):
            return None

    async def cancel(self) -> None:
        """Cancel every member's subscription.  Runs to the end even if the caller is
        cancelled meanwhile: a subscription left behind would hold messages nobody reads."""
        await asyncio.shield(self._cancel())

    async def _cancel(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        parts = list(self._parts.values())
        self._parts.clear()
        results = await asyncio.gather(*(c.cancel() for c in parts), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, TandemError):
                raise r  # (a TandemError: that connection is gone, nothing left to cancel there)
        while self._buffer:  # handed to nobody: back to the queue, uncounted
            conn, d = self._buffer.popleft()
            if not conn.is_closed:
                conn.settle(Nack, d.tag, delivered=False)

    async def close(self) -> None:
        await self.cancel()

    async def __aenter__(self) -> GroupConsumer:
        return await self.start()

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()
