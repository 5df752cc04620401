"""Durable connections: a client that rides through failovers.

    conn = await client.connect("tandem://admin:PW@h1:7780,h2:7790,h3:7800")
    async with conn.producer("orders") as p:
        await p.send(b"hello", key="customer-1")   # takes longer across a failover, no more
    async with conn.consumer("orders") as c:
        async for m in c:
            await m.ack()

A durable connection holds one *link* (a plain :class:`~client.connection.Connection`)
per node it uses.  The *primary* link carries requests that are not about one
partition (declare, status, the partition map); when it breaks, the connection
dials the next node it knows, with jittered exponential backoff, and says so in
a :class:`ConnectionEvent`.

Producers learn the queue's partition map (a Metadata frame; the node pushes
MapChanged when an active moves) and send each partition's messages straight to
its active, numbered 0, 1, 2, ... per (producer, partition).  The node refuses a
batch that would leave a gap (OutOfOrderSequence) and confirms again, without
storing, a sequence it holds.  So after any failure of a partition's batches
the producer waits for all of them to come back, asks the partition where its
sequence stands (an empty publish), reports confirmed messages the partition no
longer holds (``messages_lost``, only possible under weak durability policies),
and resends every unconfirmed message in order.  ``send`` raises only when
``send_timeout`` passes.

With ``buffer_path``, a send made while no node is reachable goes to a local
SQLite file (:mod:`client.buffer`) and returns at once, marked ``buffered``;
the buffer drains in order before later sends, and a new process with the same
path and producer id drains what an earlier one left.

Consumers subscribe on every member (each delivers the partitions it is active
for) and resubscribe after a link fails; the messages held on a failed link come
again, marked ``redelivered``, and settling one of the old deliveries raises
:class:`~client.errors.StaleDeliveryError` (safe to ignore), never touching
another message.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import random
import uuid
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from client.buffer import Buffered, SendBuffer
from client.clock import SYSTEM_CLOCK, Backoff, Clock
from client.connection import Connection, _params_dict
from client.errors import (
    AccessRefusedError,
    ConfirmedMessagesLost,
    ConsumerCancelledError,
    ConnectionClosedError,
    InvalidArgumentError,
    MessageTooLargeError,
    NotActiveError,
    QueueFullError,
    QueueNotFoundError,
    ShuttingDownError,
    StaleDeliveryError,
    TandemError,
    TimeoutError_,
    UnavailableError,
    UnknownDeliveryTagError,
)
from client.mapper import DataMapper, make_mapper
from client.producer import Body, _as_bytes
from client.protocol.frames import (
    Ack,
    Delivery,
    Nack,
    Reject,
    PartitionMap,
    Publish,
    PublishMessage,
    PublishOk,
    QueueInfo,
    StatusOk,
    StreamMessage,
    expect,
)
from client.url import ConnectParams

if TYPE_CHECKING:
    from client.consumer import Consumer

log = logging.getLogger("tandem.client")
T = TypeVar("T")

DEFAULT_SEND_TIMEOUT = 60.0
DEFAULT_REQUEST_TIMEOUT = 30.0
DEFAULT_BUFFER_MAX_BYTES = 64 * 1024 * 1024
STALL = 1.0  # seconds a batch may go unanswered before the producer asks who is active
FRAME_OVERHEAD = 64


@dataclass(frozen=True, slots=True)
class ConnectionEvent:
    """What happened to a durable connection.

    ``kind``: ``connected`` (first link up), ``disconnected`` (a link failed),
    ``failed_over`` (the primary link moved to ``node``), ``buffering`` (a send went to
    the local buffer), ``drained`` (the buffer is empty again), ``messages_lost``
    (``error`` is the :class:`~client.errors.ConfirmedMessagesLost`)."""

    kind: str
    node: str = ""
    detail: str = ""
    error: TandemError | None = None


@dataclass(frozen=True, slots=True)
class SendResult:
    """What ``send`` returns: where the message went, or that it waits in the local buffer."""

    partition: int
    seq: int
    buffered: bool = False
    duplicate: bool = False


def _transient(exc: BaseException) -> bool:
    """A failure the connection rides through (another node or a later try may succeed).
    A full queue is not one: that is the application's to hear at once."""
    return isinstance(exc, TandemError) and exc.retriable and not isinstance(exc, QueueFullError)


class DurableConnection:
    def __init__(self, params: ConnectParams, *, clock: Clock = SYSTEM_CLOCK,
                 send_timeout: float = DEFAULT_SEND_TIMEOUT, request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
                 buffer_path: str | None = None, buffer_max_bytes: int = DEFAULT_BUFFER_MAX_BYTES) -> None:
        if send_timeout <= 0 or request_timeout <= 0:
            raise InvalidArgumentError("send_timeout and request_timeout must be > 0")
        if buffer_max_bytes <= 0:
            raise InvalidArgumentError("buffer_max_bytes must be > 0")
        self.params = params
        self.clock = clock
        self.send_timeout = send_timeout
        self.request_timeout = request_timeout
        self.buffer_path = buffer_path
        self.buffer_max_bytes = buffer_max_bytes
        self.links: dict[str, Connection] = {}  # node name -> open link
        self._opening: dict[str, asyncio.Task[Connection | None]] = {}
        self._link_retry: dict[str, float] = {}  # node -> earliest next dial
        self.addresses: dict[str, tuple[str, int]] = {}  # node name -> client host, port
        self._primary: Connection | None = None
        self._primary_up = asyncio.Event()
        self._primary_lost = asyncio.Event()
        self._keeper: asyncio.Task[None] | None = None
        self._maps: dict[str, tuple[int, PartitionMap]] = {}  # queue -> (map_epoch, map)
        self.map_epoch = 0  # bumped by every MapChanged: cached maps are stale
        self.changed = asyncio.Event()  # set (and replaced) on link and map changes
        self._listeners: list[Callable[[ConnectionEvent], None]] = []
        self.events: deque[ConnectionEvent] = deque(maxlen=1000)
        self._producers: set[DurableProducer] = set()
        self._consumers: set[DurableConsumer] = set()
        self._closed = False
        self.closed_by_client = False
        self._rng = random.Random()
        self._last_primary: str | None = None  # the node of the latest primary link
        self._rotated_at = -1e9
        self._last_dial_error: BaseException | None = None
        self._unreachable: set[tuple[str, int]] = set()

    # -- events ----------------------------------------------------------------------------

    def on_event(self, callback: Callable[[ConnectionEvent], None]) -> None:
        """Call ``callback`` with every later :class:`ConnectionEvent` (in order, on the loop)."""
        self._listeners.append(callback)

    def _emit(self, ev: ConnectionEvent) -> None:
        self.events.append(ev)
        level = logging.WARNING if ev.kind in ("disconnected", "failed_over", "messages_lost") else logging.INFO
        log.log(level, "durable connection: %s %s %s", ev.kind, ev.node, ev.detail)
        for cb in list(self._listeners):
            try:
                cb(ev)
            except Exception:  # a listener's bug must not break the connection
                log.exception("connection event listener failed on %s", ev.kind)

    def _changed(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    async def wait_changed(self, timeout: float) -> None:
        """Until a link or a partition map changes, or ``timeout`` seconds."""
        ev = self.changed
        try:
            async with asyncio.timeout(timeout):
                await ev.wait()
        except TimeoutError:
            pass

    # -- links -----------------------------------------------------------------------------------

    async def _open(self) -> None:
        for host, port in self.params.hosts:
            link = await self._dial(host, port)
            if link is not None:
                self._set_primary(link)
                break
        else:
            hosts = ", ".join(f"{h}:{p}" for h, p in self.params.hosts)
            if self.buffer_path is None:
                raise ConnectionClosedError(f"cannot connect to {hosts}: {self._last_dial_error}")
            log.warning("durable connection: no node of %s is reachable; buffering sends to %s",
                        hosts, self.buffer_path)
        self._keeper = asyncio.create_task(self._keep_primary(), name="tandem-durable-primary")

    async def _dial(self, host: str, port: int) -> Connection | None:
        params = ConnectParams(**{**_params_dict(self.params), "hosts": ((host, port),)})
        link = Connection(params, clock=self.clock)
        try:
            async with asyncio.timeout(self.params.connect_timeout):
                await link._open()
        except TandemError as exc:
            link._reset()
            if not exc.retriable:
                raise
            self._dial_failed(host, port, exc)
            return None
        except (OSError, TimeoutError) as exc:
            link._reset()
            self._dial_failed(host, port, exc)
            return None
        self._unreachable.discard((host, port))
        name = link.node or f"{host}:{port}"
        if self._closed:
            await link.close()
            return None
        old = self.links.get(name)
        if old is not None and not old.is_closed:
            await link.close()
            return old
        link.on_map_changed = self._on_map_changed
        link.on_closed = self._on_link_closed
        self.links[name] = link
        self.addresses.setdefault(name, (host, port))
        self._changed()
        return link

    def _dial_failed(self, host: str, port: int, exc: BaseException) -> None:
        self._last_dial_error = exc
        if (host, port) not in self._unreachable:  # said once, until it answers again
            self._unreachable.add((host, port))
            log.info("durable connection: %s:%d does not answer: %s", host, port, exc)

    def _set_primary(self, link: Connection) -> None:
        before = self._last_primary
        self._primary = link
        self._last_primary = link.node or ""
        self._primary_lost.clear()
        self._primary_up.set()
        if before is None:
            self._emit(ConnectionEvent("connected", link.node or ""))
        elif before != link.node:
            self._emit(ConnectionEvent("failed_over", link.node or "", f"from {before}"))
        else:
            log.info("durable connection: reconnected to %s", link.node)

    def _on_link_closed(self, link: Connection, exc: TandemError) -> None:
        name = link.node or ""
        if self.links.get(name) is link:
            del self.links[name]
        if self._closed or link.closed_by_client:
            return
        self._emit(ConnectionEvent("disconnected", name, str(exc)))
        if link is self._primary:
            self._primary = None
            self._primary_up.clear()
            self._primary_lost.set()
        self.map_epoch += 1  # who is active may be what just changed
        self._changed()

    def _on_map_changed(self, node: str) -> None:
        self.map_epoch += 1
        self._changed()

    def _candidates(self) -> list[tuple[str, int]]:
        """Addresses to try for a new primary: known members first, then the URL's hosts."""
        seen: list[tuple[str, int]] = []
        for addr in list(self.addresses.values()) + list(self.params.hosts):
            if addr not in seen:
                seen.append(addr)
        self._rng.shuffle(seen)
        return seen

    async def _keep_primary(self) -> None:
        backoff = Backoff(rng=self._rng)
        while not self._closed:
            if self._primary is not None and not self._primary.is_closed:
                await self._primary_lost.wait()
                continue
            for name, link in list(self.links.items()):  # a link that is up already will do
                if not link.is_closed:
                    self._set_primary(link)
                    backoff.reset()
                    break
            else:
                for host, port in self._candidates():
                    try:
                        dialed = await self._dial(host, port)
                    except TandemError as exc:  # refused for good (bad credentials): say so, keep trying
                        log.error("durable connection: %s:%d refused: %s", host, port, exc)
                        dialed = None
                    if dialed is not None:
                        self._set_primary(dialed)
                        backoff.reset()
                        break
                else:
                    await self.clock.sleep(backoff.next())

    async def primary(self, deadline: float | None = None) -> Connection:
        """The primary link, waiting (until ``deadline``, monotonic) while it is being re-dialed."""
        while True:
            if self._closed:
                raise ConnectionClosedError("connection closed by the client")
            p = self._primary
            if p is not None and not p.is_closed:
                return p
            remaining = None if deadline is None else deadline - self.clock.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError_("no node of the group is reachable")
            try:
                async with asyncio.timeout(remaining):
                    await self._primary_up.wait()
            except TimeoutError:
                raise TimeoutError_("no node of the group is reachable") from None

    @property
    def connected(self) -> bool:
        return self._primary is not None and not self._primary.is_closed

    def link_now(self, node: str) -> Connection | None:
        """The open link to ``node``, or None (and a dial is started if its address is known)."""
        link = self.links.get(node)
        if link is not None and not link.is_closed:
            return link
        if node and node in self.addresses and node not in self._opening and not self._closed:
            if self.clock.monotonic() >= self._link_retry.get(node, 0.0):
                self._link_retry[node] = self.clock.monotonic() + 0.2 + self._rng.random() * 0.3
                host, port = self.addresses[node]
                task = asyncio.create_task(self._dial(host, port), name=f"tandem-durable-dial-{node}")
                self._opening[node] = task
                task.add_done_callback(functools.partial(self._dialed, node))
        return None

    def _dialed(self, node: str, task: asyncio.Task[Connection | None]) -> None:
        self._opening.pop(node, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("durable connection: dialing %s failed: %s", node, task.exception())
        self._changed()

    async def link(self, node: str, deadline: float) -> Connection:
        """A link to ``node``, dialing it if need be (until ``deadline``)."""
        while True:
            link = self.link_now(node)
            if link is not None:
                return link
            if node not in self.addresses:
                raise UnavailableError(f"no address known for node {node!r}")
            if self.clock.monotonic() >= deadline or self._closed:
                raise UnavailableError(f"node {node} is not reachable")
            await self.wait_changed(min(0.5, max(0.01, deadline - self.clock.monotonic())))

    # -- requests that are not about one partition ---------------------------------------------

    async def _call(self, fn: Callable[[Connection], Awaitable[T]], *, retry: bool = True,
                    timeout: float | None = None) -> T:
        """Run ``fn`` on the primary link; with ``retry``, again (on another node if need be)
        after a transient failure, until ``timeout`` (default ``request_timeout``)."""
        deadline = self.clock.monotonic() + (timeout or self.request_timeout)
        backoff = Backoff(rng=self._rng)
        while True:
            link = await self.primary(deadline)
            try:
                async with asyncio.timeout(max(0.05, deadline - self.clock.monotonic())):
                    return await fn(link)
            except TimeoutError:
                # no answer in time: the node may hang; another member may answer (a request
                # that is not retried is not sent again)
                if link is self._primary:
                    await self._rotate(link)
                if not retry or self.clock.monotonic() >= deadline or self._closed:
                    raise TimeoutError_(f"node {link.node} did not answer in time") from None
            except TandemError as exc:
                if not retry or not _transient(exc) or self.clock.monotonic() >= deadline or self._closed:
                    raise
                if isinstance(exc, (UnavailableError, ShuttingDownError)) and link is self._primary:
                    await self._rotate(link)  # a member without quorum or going away: ask another
                await self.clock.sleep(backoff.next())

    async def _rotate(self, current: Connection) -> None:
        """Make a link to another node the primary, if one answers (at most once a second)."""
        now = self.clock.monotonic()
        if now - self._rotated_at < 1.0:
            return
        self._rotated_at = now
        for name, link in list(self.links.items()):
            if link is not current and not link.is_closed:
                self._set_primary(link)
                return
        here = self.addresses.get(current.node or "")
        for host, port in self._candidates():
            if (host, port) == here:
                continue
            try:
                dialed = await self._dial(host, port)
            except TandemError:
                continue
            if dialed is not None and dialed is not current:
                self._set_primary(dialed)
                return

    @property
    def node(self) -> str | None:
        """The node the primary link is connected to (None while re-dialing)."""
        return self._primary.node if self._primary is not None else None

    async def declare_queue(self, name: str, **settings: Any) -> QueueInfo:
        """Create ``name`` (idempotent); see :meth:`Connection.declare_queue`."""
        return await self._call(lambda c: c.declare_queue(name, **settings))

    async def delete_queue(self, name: str, *, if_empty: bool = False) -> None:
        """Not retried once sent: a retry could not tell "deleted just now" from "never was"."""
        await self._call(lambda c: c.delete_queue(name, if_empty=if_empty), retry=False)

    async def purge_queue(self, name: str) -> int:
        return await self._call(lambda c: c.purge_queue(name), retry=False)

    async def list_queues(self) -> list[QueueInfo]:
        return await self._call(lambda c: c.list_queues())

    async def status(self) -> StatusOk:
        return await self._call(lambda c: c.status())

    async def set_quorum_override(self, nodes: int | None) -> StatusOk:
        return await self._call(lambda c: c.set_quorum_override(nodes))

    async def set_priority(self, priority: int) -> StatusOk:
        return await self._call(lambda c: c.set_priority(priority))

    async def set_designated_primary(self, on: bool) -> StatusOk:
        return await self._call(lambda c: c.set_designated_primary(on))

    async def read(self, queue: str, partition: int, offset: int = 0,
                   max_messages: int = 1000) -> tuple[list[StreamMessage], int, int]:
        return await self._call(lambda c: c.read(queue, partition, offset, max_messages))

    async def get(self, queue: str, *, auto_ack: bool = False) -> Any:
        """One message from the primary link's node, or None (not retried once sent)."""
        return await self._call(lambda c: c.get(queue, auto_ack=auto_ack), retry=False)

    async def partition_map(self, queue: str, *, timeout: float | None = None) -> PartitionMap:
        """The queue's partition map, fetched again after any MapChanged or link failure."""
        epoch = self.map_epoch
        cached = self._maps.get(queue)
        if cached is not None and cached[0] == epoch:
            return cached[1]
        m = await self._call(lambda c: c.partition_map(queue), timeout=timeout)
        for name, addr in m.addresses.items():
            host, _, port = addr.rpartition(":")
            if host and port.isdigit():
                self.addresses[name] = (host, int(port))
        self._maps[queue] = (epoch, m)
        return m

    # -- producers and consumers ---------------------------------------------------------------

    def producer(self, queue: str, *, producer_id: str | None = None, max_batch: int = 256,
                 max_in_flight: int = 16, send_timeout: float | None = None) -> DurableProducer:
        """A producer that sends each partition's messages to its active and resends across
        failovers.  Give ``producer_id`` to continue an earlier producer (its buffer, its
        sequences); by default a new random one."""
        p = DurableProducer(self, queue, producer_id=producer_id, max_batch=max_batch,
                            max_in_flight=max_in_flight, send_timeout=send_timeout or self.send_timeout)
        self._producers.add(p)
        return p

    def consumer(self, queue: str, *, prefetch: int = 256) -> DurableConsumer:
        """A consumer of the whole queue: every member's partitions, resubscribed after failures."""
        c = DurableConsumer(self, queue, prefetch=prefetch)
        self._consumers.add(c)
        return c

    group_consumer = consumer

    # -- close -----------------------------------------------------------------------------------

    @property
    def is_closed(self) -> bool:
        return self._closed

    async def close(self, *, timeout: float = 5.0) -> None:
        """Stop consumers and producers (what is unconfirmed fails), then every link."""
        if self._closed:
            return
        self.closed_by_client = True
        for c in list(self._consumers):
            try:
                await c.close()
            except TandemError:
                pass  # its links are gone: nothing to cancel there
        for p in list(self._producers):
            await p._stop(ConnectionClosedError("connection closed by the client"))
        self._closed = True
        self._changed()
        if self._keeper is not None:
            self._keeper.cancel()
            await asyncio.gather(self._keeper, return_exceptions=True)
        for t in list(self._opening.values()):
            t.cancel()
        await asyncio.gather(*self._opening.values(), return_exceptions=True)
        await asyncio.gather(*(link.close(timeout=timeout) for link in list(self.links.values())),
                             return_exceptions=True)
        self.links.clear()

    async def __aenter__(self) -> DurableConnection:
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()


# -- producer ------------------------------------------------------------------------------------


class _Item:
    __slots__ = ("msg", "fut", "deadline", "sent", "buf_id", "buf_at", "partition", "size")

    def __init__(self, msg: PublishMessage, fut: asyncio.Future[SendResult] | None, deadline: float,
                 buf_id: int | None = None) -> None:
        self.msg = msg
        self.fut = fut  # None: nobody waits (a buffered message, or its sender timed out)
        self.deadline = deadline
        self.sent = False  # may have reached a node
        self.buf_id = buf_id  # its row in the local buffer
        self.buf_at: tuple[int, int] | None = None  # (partition, seq) as written in that row
        self.partition = -1
        # what it adds to a Publish frame (msgpack overhead estimated generously)
        size = len(msg.body) + FRAME_OVERHEAD
        if msg.key:
            size += len(msg.key.encode())
        if msg.headers:
            size += sum(len(k.encode()) + len(v.encode()) + 10 for k, v in msg.headers.items())
        self.size = size


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


class _Part:
    """One partition's pipeline: ``unsent`` in sequence order, the number of batches in
    flight, and the items of failed batches (``back``) waiting for the partition to settle."""

    __slots__ = ("index", "next_seq", "confirmed", "unsent", "flying", "back", "failed", "probe", "busy",
                 "retry_at", "backoff", "seen_active")

    def __init__(self, index: int, rng: random.Random) -> None:
        self.index = index
        self.next_seq = 0
        self.confirmed = -1  # highest sequence confirmed to this producer
        self.unsent: deque[_Item] = deque()
        #: batch -> (node it went to, its items, when it went)
        self.flying: dict[int, tuple[str, list[_Item], float]] = {}
        self.back: list[_Item] = []
        self.failed = False  # a batch failed: send nothing until all are back, then probe
        self.probe = False  # ask the partition where the sequence stands before sending
        self.busy = False  # a probe or a buffer write runs for it
        self.retry_at = 0.0
        self.backoff = Backoff(0.02, 1.0, rng)
        self.seen_active = ""  # the partition's active in the last map loaded

    @property
    def inflight(self) -> int:
        return len(self.flying)


class DurableProducer:
    def __init__(self, conn: DurableConnection, queue: str, *, producer_id: str | None, max_batch: int,
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
        self._pending: deque[_Item] = deque()  # not yet given a partition
        self._parts: list[_Part] = []
        self._map: PartitionMap | None = None
        self._map_epoch = -1
        self._mapper: DataMapper | None = None
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

    async def send(self, body: Body, *, key: str | None = None,
                   headers: Mapping[str, str] | None = None) -> SendResult:
        """Publish one message; returns once it is confirmed (or written to the local buffer).
        Raises only after ``send_timeout`` (TimeoutError_), or for a message no node could take."""
        return await self.send_nowait(body, key=key, headers=headers)

    def send_nowait(self, body: Body, *, key: str | None = None,
                    headers: Mapping[str, str] | None = None) -> asyncio.Future[SendResult]:
        """Queue one message and return the future of its :class:`SendResult` (for callers
        that keep many in flight without a task each)."""
        item = self._item(body, key, headers)
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

    def _item(self, body: Body, key: str | None, headers: Mapping[str, str] | None) -> _Item:
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
        item = _Item(PublishMessage(key, dict(headers) if headers else {}, data, None), fut,
                     self.conn.clock.monotonic() + self.send_timeout)
        if item.size > frame_limit:
            raise MessageTooLargeError(f"message with its key and headers ({item.size} bytes) does not fit in "
                                       f"a frame ({frame_limit} bytes)")
        self._idle.clear()
        return item

    async def _to_buffer(self, item: _Item) -> SendResult:
        assert self.buffer is not None
        m = item.msg
        try:
            await asyncio.to_thread(self.buffer.append, m.key, m.headers, m.body)
        finally:
            self._appending -= 1
            self._wake.set()
        self.buffered += 1
        return SendResult(-1, -1, buffered=True)

    def _resolve(self, it: _Item, result: SendResult | None, exc: BaseException | None = None) -> None:
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
                async with asyncio.timeout(0.5):
                    await self._idle.wait()
            except TimeoutError:
                pass

    async def wait_drained(self, timeout: float | None = None) -> None:
        """Until the local buffer is empty: every buffered message sent and confirmed."""
        async with asyncio.timeout(timeout):
            while self._draining and self._stopped is None:
                self._drained.clear()
                try:
                    async with asyncio.timeout(0.5):
                        await self._drained.wait()
                except TimeoutError:
                    pass

    @property
    def buffered_count(self) -> int:
        """Messages waiting in the local buffer."""
        return self.buffer.count if self.buffer is not None else 0

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
            items += list(part.unsent) + part.back
            for _node, flying, _t in part.flying.values():
                items += flying
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
                if self._draining and conn.connected and not any(p.probe or p.failed or p.busy
                                                                  for p in self._parts):
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
            wake = asyncio.ensure_future(self._wake.wait())
            changed = asyncio.ensure_future(conn.changed.wait())
            try:
                await asyncio.wait([wake, changed], timeout=0.1, return_when=asyncio.FIRST_COMPLETED)
            finally:
                wake.cancel()
                changed.cancel()

    async def _load_map(self) -> None:
        conn = self.conn
        epoch = conn.map_epoch
        m = await conn.partition_map(self.queue, timeout=1.0)
        info = m.queue
        if self._parts and len(self._parts) != info.partitions:
            raise InvalidArgumentError(f"queue {self.queue!r} changed its partition count under a producer")
        if self._mapper is None:
            self._mapper = make_mapper(info.mapper, info.partitions, info.ring_size)
            self._parts = [_Part(i, conn._rng) for i in range(info.partitions)]
            for p in self._parts:
                p.probe = self._continues
        self._map = m
        self._map_epoch = epoch
        for part in self._parts:
            active = m.actives[part.index] if part.index < len(m.actives) else ""
            if active and active != part.seen_active and part.failed:
                # A new active: try it now.  The back-off grew while the group elected it
                # (up to a second a wait), and waiting it out would add that to the failover.
                part.retry_at = 0.0
                part.backoff.reset()
            part.seen_active = active
            self._abandon_moved(part, active)

    def _abandon_moved(self, part: _Part, active: str) -> None:
        """Batches in flight to a node that is no longer the partition's active (it hangs,
        or is cut off, and has not answered) are not waited for: that node cannot commit
        them any more, and whatever of them a majority had is on the new active, which the
        probe asks.  A late answer to an abandoned batch is ignored."""
        if not active or not part.flying:
            return
        gone = [bid for bid, (node, _items, _t) in part.flying.items() if node and node != active]
        if not gone:
            return
        for bid in gone:
            _node, items, _t = part.flying.pop(bid)
            part.back.extend(items)
        part.failed = True
        part.retry_at = 0.0
        log.info("producer %s: partition %d of %s moved to %s: %d batch(es) in flight elsewhere are resent",
                 self.producer_id, part.index, self.queue, active, len(gone))

    def _assign(self) -> None:
        if self._mapper is None:
            return
        mapper, parts = self._mapper, self._parts
        while self._pending:
            it = self._pending.popleft()
            part = parts[mapper.partition(it.msg.key)]
            it.partition = part.index
            it.msg.seq = part.next_seq
            part.next_seq += 1
            part.unsent.append(it)

    def _link_for(self, part: _Part) -> Connection | None:
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

    def _drive(self, part: _Part) -> None:
        if part.busy or part.inflight and part.failed or self.conn.clock.monotonic() < part.retry_at:
            return
        if part.failed or part.probe:
            link = self._link_for(part)
            if link is not None:
                part.busy = True
                self._spawn(self._probe(part, link))
            return
        if not part.unsent:
            return
        if self.buffer is not None and any(
                it.buf_id is not None and it.buf_at != (part.index, it.msg.seq)
                for it in itertools.islice(part.unsent, self.max_batch * self.max_in_flight)):
            part.busy = True  # buffered messages: their numbering goes to disk before they go out
            self._spawn(self._record(part, list(itertools.islice(part.unsent, self.max_batch * self.max_in_flight))))
            return
        link = self._link_for(part)
        if link is None:
            return
        limit = link.max_frame_size - 4096
        while part.unsent and part.inflight < self.max_in_flight:
            items: list[_Item] = []
            size = 0
            while part.unsent and len(items) < self.max_batch:
                msize = part.unsent[0].size
                if items and size + msize > limit:
                    break
                it = part.unsent.popleft()
                if it.buf_id is not None and it.buf_at != (part.index, it.msg.seq):
                    part.unsent.appendleft(it)  # not yet on disk: the next turn records it
                    break
                items.append(it)
                size += msize
            if not items:
                return
            rid = link.next_rid()
            try:
                reply = link.request_nowait(Publish(rid=rid, queue=self.queue, messages=[it.msg for it in items],
                                                    producer_id=self.producer_id, partition=part.index))
                bid = self._batch_ids = self._batch_ids + 1
                part.flying[bid] = (link.node or "", items, self.conn.clock.monotonic())
            except TandemError as exc:
                if _transient(exc):
                    part.unsent.extendleft(reversed(items))
                    self._failed(part, exc, [])
                else:  # say, a key msgpack cannot encode: it never goes out
                    self._failed(part, exc, items)
                return
            for it in items:
                if it.sent:
                    self.resent += 1
                it.sent = True
            self.sent += len(items)
            reply.add_done_callback(functools.partial(self._reply, part, bid))

    async def _record(self, part: _Part, items: list[_Item]) -> None:
        """Write the (partition, seq) of buffered messages to their rows before sending them."""
        assert self.buffer is not None
        try:
            rows = [(it.buf_id, part.index, it.msg.seq) for it in items
                    if it.buf_id is not None and it.msg.seq is not None]
            await asyncio.to_thread(self.buffer.assign, rows)
            for it in items:
                if it.buf_id is not None and it.msg.seq is not None:
                    it.buf_at = (part.index, it.msg.seq)
        finally:
            part.busy = False

    def _reply(self, part: _Part, bid: int, reply: asyncio.Future[Any]) -> None:
        self._wake.set()
        entry = part.flying.pop(bid, None)
        exc = reply.exception() if not reply.cancelled() else ConnectionClosedError("publish cancelled")
        if entry is None:  # abandoned (its node lost the partition): it is being resent
            return
        _node, items, _t = entry
        if exc is None:
            ok = expect(reply.result(), PublishOk)
            self._confirm(part, items, ok.duplicates)
            part.backoff.reset()
            return
        if self._stopped is not None:  # closing: nothing is resent
            for it in items:
                self._resolve(it, None, self._stopped)
            return
        self._failed(part, exc, items)

    def _failed(self, part: _Part, exc: BaseException, items: list[_Item]) -> None:
        """The batch ``items`` failed: the partition settles (probe) and resends, except
        what can never be stored, which fails; a buffered message is never dropped."""
        part.failed = True
        part.retry_at = self.conn.clock.monotonic() + part.backoff.next()
        if isinstance(exc, (NotActiveError, ConnectionClosedError, UnavailableError, ShuttingDownError)):
            self.conn.map_epoch += 1  # ask again who is active
        if _transient(exc):
            part.back.extend(items)
        else:
            # this batch can never be stored as it is (a full queue, a deleted queue): its
            # senders hear it; the probe renumbers what follows over the gap it leaves
            keep = [it for it in items if it.buf_id is not None]
            for it in items:
                if it.buf_id is None:
                    self._resolve(it, None, exc)
            part.back.extend(keep)
            if keep:
                log.error("producer %s: %d buffered message(s) of %s refused (%s); they stay in %s and are "
                          "tried again", self.producer_id, len(keep), self.queue, exc, self.conn.buffer_path)
                self.conn._emit(ConnectionEvent("buffer_blocked", "", f"{self.queue}: {exc}",
                                                exc if isinstance(exc, TandemError) else None))
        log.info("producer %s: partition %d of %s: %s", self.producer_id, part.index, self.queue, exc)

    def _confirm(self, part: _Part, items: list[_Item], duplicates: int) -> None:
        for it in items:
            seq = it.msg.seq or 0
            if seq > part.confirmed:
                part.confirmed = seq
            self._resolve(it, SendResult(part.index, seq))
        self.confirmed += len(items)
        self.duplicates += duplicates
        self._forget_buffered(items)

    def _forget_buffered(self, items: list[_Item]) -> None:
        ids = [it.buf_id for it in items if it.buf_id is not None]
        if ids and self.buffer is not None:
            self._spawn(self._remove_rows(ids))

    async def _remove_rows(self, ids: list[int]) -> None:
        assert self.buffer is not None
        await asyncio.to_thread(self.buffer.remove, ids)
        self._check_drained()

    def _check_drained(self) -> None:
        """The buffer is empty and nothing of it is in flight: say so, once."""
        assert self.buffer is not None
        if self.buffer.count == 0 and self._draining and not self._appending and \
                not any(it.buf_id is not None for p in self._parts
                        for it in itertools.chain(p.unsent, p.back, *(i for _n, i, _t in p.flying.values()))):
            self._draining = False
            self.conn._emit(ConnectionEvent("drained", "", f"{self.queue}: the local buffer is empty"))
            self._maybe_idle()

    async def _probe(self, part: _Part, link: Connection) -> None:
        """Ask the partition where this producer's sequence stands, report confirmed messages
        it no longer holds, renumber what it does not hold, and resume sending."""
        try:
            try:
                reply = expect(await link.request(lambda rid: Publish(
                    rid=rid, queue=self.queue, messages=[], producer_id=self.producer_id, partition=part.index)),
                    PublishOk)
            except TandemError as exc:
                part.retry_at = self.conn.clock.monotonic() + part.backoff.next()
                if isinstance(exc, (NotActiveError, ConnectionClosedError, UnavailableError, ShuttingDownError)):
                    self.conn.map_epoch += 1
                if not _transient(exc):
                    raise
                return
            n = reply.next_seq
            if part.confirmed >= n:
                lost = part.confirmed - n + 1
                self.lost += lost
                err = ConfirmedMessagesLost(
                    f"partition {part.index} of {self.queue} holds producer {self.producer_id}'s messages only "
                    f"up to seq {n - 1}, but {part.confirmed} was confirmed: {lost} confirmed messages lost",
                    queue=self.queue, partition=part.index, producer_id=self.producer_id, first_seq=n, count=lost)
                log.error("%s", err.message)
                self.conn._emit(ConnectionEvent("messages_lost", link.node or "", err.message, err))
                part.confirmed = n - 1
            # What went out under a seq below n is held (its resend is confirmed as a
            # duplicate); everything else follows on from n, in the order it was sent.
            items = sorted(part.back, key=lambda it: it.msg.seq if it.msg.seq is not None else 1 << 62)
            items += list(part.unsent)
            part.back = []
            nxt = n
            for it in items:
                if not it.sent or it.msg.seq is None or it.msg.seq >= n:
                    it.msg.seq = nxt
                    nxt += 1
            part.next_seq = nxt
            part.unsent = deque(items)
            part.failed = part.probe = False
        finally:
            part.busy = False

    def _expire(self) -> None:
        now = self.conn.clock.monotonic()
        timeout = self.send_timeout
        if now - self._stall_checked >= STALL and any(
                now - t >= STALL for part in self._parts for _n, _i, t in part.flying.values()):
            # a batch unanswered this long: its node may hang (SIGSTOP, a cut link that TCP
            # has not noticed): ask again who is active (and another node, if the primary hangs)
            self._stall_checked = now
            self.conn.map_epoch += 1
        while self._pending and self._pending[0].deadline <= now:
            self._resolve(self._pending.popleft(), None,
                          TimeoutError_(f"message to {self.queue}: no node took it within send_timeout={timeout}s"))
        for part in self._parts:
            expired = False
            for it in itertools.chain(part.unsent, part.back):
                if it.fut is not None and it.deadline <= now:
                    expired = True
                    self._resolve(it, None, TimeoutError_(
                        f"message to {self.queue} not confirmed within send_timeout={timeout}s"
                        + ("; it may still be stored" if it.sent else "")))
            if expired and not part.busy:
                self._drop_unsent(part)

    @staticmethod
    def _drop_unsent(part: _Part) -> None:
        """Drop messages nobody waits for that never went out, closing the gap they leave
        (they are a tail of ``unsent``: messages go out in order)."""
        keep: list[_Item] = []
        nxt: int | None = None
        for it in part.unsent:
            if not it.sent and it.fut is None and it.buf_id is None:
                if nxt is None:
                    nxt = it.msg.seq
                continue
            if nxt is not None and not it.sent:
                it.msg.seq = nxt
                nxt += 1
            keep.append(it)
        if nxt is not None:
            part.unsent = deque(keep)
            part.next_seq = nxt

    async def _drain(self) -> None:
        """Load the local buffer into the partitions' pipelines, ahead of later sends."""
        assert self.buffer is not None and self._mapper is not None
        rows: list[Buffered] = await asyncio.to_thread(self.buffer.load, self._loaded_upto)
        if rows:
            self._loaded_upto = rows[-1].id
        if not rows:
            self._check_drained()
            return
        log.info("producer %s: draining %d buffered messages of %s", self.producer_id, len(rows), self.queue)
        for r in rows:
            it = _Item(PublishMessage(r.key, r.headers, r.body, r.seq), None, float("inf"), buf_id=r.id)
            if r.partition is not None and r.seq is not None:
                # numbered (and maybe sent) by an earlier run: a probe settles it first
                it.partition = r.partition
                it.buf_at = (r.partition, r.seq)
                it.sent = True
                part = self._parts[r.partition]
                part.back.append(it)
                part.failed = True
            else:
                part = self._parts[self._mapper.partition(r.key)]
                it.partition = part.index
                if part.failed:
                    it.msg.seq = None  # the probe numbers it, after the earlier ones
                else:
                    it.msg.seq = part.next_seq
                    part.next_seq += 1
                part.unsent.append(it)


# -- consumer ------------------------------------------------------------------------------------


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
        elif isinstance(exc, (ConnectionClosedError, UnknownDeliveryTagError)) or \
                (isinstance(exc, TandemError) and exc.retriable):
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

    __slots__ = ("_link", "_d", "_settled")

    def __init__(self, link: Connection, d: Delivery) -> None:
        self._link = link
        self._d = d
        self._settled = False

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

    def __repr__(self) -> str:
        return f"<DurableMessage id={self.id} node={self.node} dc={self.delivery_count}>"

    def _settle(self, kind: type, requeue: bool = True) -> asyncio.Future[None]:
        if self._settled:
            raise InvalidArgumentError(f"message {self.id} is already settled")
        if self._link.is_closed:
            raise StaleDeliveryError(f"message {self.id} came on a link to {self._link.node} that has failed; "
                                     "it will be delivered again")
        self._settled = True
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

    def __init__(self, conn: DurableConnection, queue: str, *, prefetch: int = 256) -> None:
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
        # Wait (a little) for every member's subscription; one that is down is retried meanwhile.
        deadline = self.conn.clock.monotonic() + 5.0
        while not all(n in self._subs for n in m.addresses) and self.conn.clock.monotonic() < deadline:
            await self.conn.wait_changed(0.1)
        return self

    def _ended(self, exc: TandemError) -> None:
        """A subscription ended for good (its queue was deleted): so does this consumer."""
        if isinstance(exc, (ConsumerCancelledError, QueueNotFoundError, AccessRefusedError)) and self._error is None:
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
        from client.consumer import Consumer

        backoff = Backoff(0.05, 1.0, self.conn._rng)
        while not self._closed and not self.conn.is_closed:
            try:
                link = await self.conn.link(name, self.conn.clock.monotonic() + 5.0)
                c = Consumer(link, self.queue, prefetch=self.prefetch)
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
            except (QueueNotFoundError, AccessRefusedError) as exc:
                self._ended(exc)
                return
            except TandemError as exc:
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
                return DurableMessage(link, d)
            if self._error is not None:
                raise self._error
            if self._closed or self.conn.is_closed:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(0.5):
                    await self._waiter
            except TimeoutError:
                pass
            self._waiter = None

    async def next(self, timeout: float | None = None) -> DurableMessage | None:
        """The next message, or None after ``timeout`` seconds without one."""
        try:
            async with asyncio.timeout(timeout):
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
