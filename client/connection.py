"""The asyncio client connection.

    conn = await client.connect("tandem://admin:PW@127.0.0.1:7780")
    await conn.declare_queue("orders", partitions=4)
    async with conn.producer("orders") as p:
        await p.send(b"hello", key="customer-1")
    async with conn.consumer("orders", prefetch=256) as c:
        async for m in c:
            await m.ack()
    await conn.close()

One reader task moves bytes from the socket into the sans-IO protocol and
routes frames: replies to the request futures waiting on their ``rid``,
deliveries to their consumer.  A heartbeat task keeps the link alive and
notices a dead broker.  Both are owned by the connection and end with it.

The management calls (status, the operator's changes, users and grants) are
:class:`client.management.Management`'s, a mixin of :class:`Connection`.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import socket
import ssl
from collections.abc import Callable
from types import TracebackType
from typing import Any

from client import tls
from client.clock import SYSTEM_CLOCK, Clock
from client.consumer import Consumer, GroupConsumer, Message
from client.errors import (
    ConnectionClosedError,
    ConsumerCancelledError,
    HeartbeatTimeoutError,
    NotActiveError,
    TandemError,
    for_code,
)
from client.link import Subscriber
from client.exchanges import ExchangeAdmin
from client.streams import StreamAdmin
from client.transactions import TransactionAdmin
from client.management import Management
from client.producer import Producer
from client.protocol import NEED_DATA, ConnectionEnded, FrameError, ProtocolConnection, Role
from client.protocol.frames import (
    Ack,
    AuthChallenge,
    Cancel,
    Close,
    Declare,
    DeclareOk,
    Delete,
    Deliver,
    Error,
    Frame,
    Get,
    GetOk,
    Heartbeat,
    ListQueues,
    MapChanged,
    Metadata,
    MetadataOk,
    Nack,
    PartitionMap,
    Placement,
    Produced,
    ProducedOk,
    Purge,
    PurgeOk,
    QueueInfo,
    Queues,
    Reject,
    StreamMessage,
    Subscribe,
    SubscribeOk,
    Welcome,
    expect,
    placement_text,
)
from client.scram import ScramClient
from client.url import ConnectParams, parse_url

log = logging.getLogger("tandem.client")


async def connect_link(url: str, *, client_name: str | None = None, clock: Clock = SYSTEM_CLOCK,
                       observe: bool = False, ssl_context: ssl.SSLContext | None = None) -> Connection:
    """One plain link to the first reachable node of ``url``: no failover, no partition
    map (tools and tests of the wire protocol; applications use :func:`client.connect`).
    ``observe``: for status only; a node that serves nothing (a shared-mode passive)
    accepts it too.  ``ssl_context``: for ``tandems://``, the TLS context to use instead of
    one that trusts the URL's ``ca`` (or the system's CAs)."""
    params = parse_url(url)
    if client_name or observe or ssl_context is not None:
        params = ConnectParams(**{**_params_dict(params), "client_name": client_name or params.client_name,
                                  "observe": observe, "ssl_context": ssl_context or params.ssl_context})
    conn = Connection(params, clock=clock)
    await conn._open()
    return conn


def _params_dict(p: ConnectParams) -> dict[str, Any]:
    return {k: getattr(p, k) for k in p.__dataclass_fields__}


class Connection(Management, ExchangeAdmin, StreamAdmin, TransactionAdmin):
    def __init__(self, params: ConnectParams, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.params = params
        self.clock = clock
        self.proto = ProtocolConnection(Role.CLIENT)
        self.node: str | None = None
        self.max_message_size = 5 * 1024 * 1024
        self.max_frame_size = 8 * 1024 * 1024
        self.heartbeat = params.heartbeat
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._rids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Frame]] = {}
        self._consumers: dict[int, Subscriber] = {}
        self._subscribing: dict[int, Subscriber] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._closed: TandemError | None = None
        self._last_recv = self._last_send = 0.0
        self._acks: dict[tuple[type, bool, bool, bool], tuple[list[int], asyncio.Future[None]]] = {}
        self._ack_flush_scheduled = False
        self.closed_event = asyncio.Event()
        self.closed_by_client = False
        self._siblings: dict[str, Connection] = {}  # other group members (GroupConsumer)
        #: set by a DurableConnection that owns this link
        self.on_map_changed: Callable[[str], None] | None = None
        self.on_closed: Callable[[Connection, TandemError], None] | None = None

    # -- open / close ---------------------------------------------------------------------

    async def _open(self, *, follow_hint: bool = True) -> None:
        """Connect to the first node of the URL that takes the handshake.  A node that
        serves nothing (a shared-mode passive) refuses with NotActive naming the one that
        does; with ``follow_hint`` that one is tried next."""
        last: BaseException | None = None
        todo, tried = list(self.params.hosts), set()
        while todo:
            host, port = todo.pop(0)
            tried.add((host, port))
            try:
                async with self.clock.timeout(self.params.connect_timeout):
                    await self._open_one(host, port)
                return
            except TandemError as exc:
                self._reset()
                if not exc.retriable:
                    raise
                if not isinstance(last, NotActiveError):  # the most telling reason wins
                    last = exc
                hint = exc.active_hint if isinstance(exc, NotActiveError) and follow_hint else None
                h, _, p = (hint or "").rpartition(":")
                if h and p.isdigit() and (h, int(p)) not in tried and (h, int(p)) not in todo:
                    todo.insert(0, (h, int(p)))
                continue
            except (OSError, TimeoutError) as exc:
                if not isinstance(last, NotActiveError):
                    last = exc
            self._reset()
        if isinstance(last, NotActiveError):
            raise last
        hosts = ", ".join(f"{h}:{p}" for h, p in self.params.hosts)
        raise ConnectionClosedError(f"cannot connect to {hosts}: {last}")

    def _reset(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self.proto = ProtocolConnection(Role.CLIENT)
        self._reader = self._writer = None

    async def _open_one(self, host: str, port: int) -> None:
        ctx = self.params.context()
        try:
            reader, writer = await asyncio.open_connection(host, port, limit=1 << 20, ssl=ctx,
                                                           server_hostname=host if ctx is not None else None)
        except ssl.SSLError as exc:
            raise tls.handshake_error(host, port, exc) from None
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._reader, self._writer = reader, writer
        p = self.params
        sc = ScramClient(p.user, p.password)
        writer.write(self.proto.hello(client_name=p.client_name, user=p.user, auth=sc.first,
                                      heartbeat=p.heartbeat, observe=p.observe))
        while True:
            try:
                frame = await self._next_frame()
            except ConnectionClosedError:
                if ctx is None:  # no answer at all to a plaintext Hello: a TLS-only port, most likely
                    raise tls.plaintext_refused(host, port) from None
                raise
            if isinstance(frame, AuthChallenge):
                sc.challenge(frame.data)
                salted = sc.cached()
                if salted is None:  # PBKDF2 (tens of ms): off the loop; cached for reconnects
                    salted = await asyncio.to_thread(sc.salt_password)
                writer.write(self.proto.auth_response(sc.final(salted)))
                continue
            if isinstance(frame, Welcome):
                sc.verify(frame.auth)  # the node proves it holds the user's credentials
                break
            if isinstance(frame, Error):
                raise for_code(frame.code, frame.message, active_hint=frame.active_hint,
                                   next_seq=frame.next_seq)
            if isinstance(frame, Close):
                raise ConnectionClosedError(f"broker closed the connection: {frame.reason}")
        self.node = frame.node
        self.heartbeat = frame.heartbeat if p.heartbeat > 0 else 0.0
        self.max_message_size = frame.max_message_size
        self.max_frame_size = frame.max_frame_size
        self.proto.max_frame_size = frame.max_frame_size
        self._last_recv = self._last_send = self.clock.monotonic()
        self._tasks.append(asyncio.create_task(self._read_loop(), name="tandem-client-reader"))
        if self.heartbeat > 0:
            self._tasks.append(asyncio.create_task(self._heartbeats(), name="tandem-client-heartbeat"))
        log.debug("connected node=%s version=%s", self.node, self.proto.version)

    async def _next_frame(self) -> Frame:
        if self._reader is None:
            raise ConnectionClosedError("not connected")
        while True:
            event = self.proto.next_event()
            if event is NEED_DATA:
                data = await self._reader.read(256 * 1024)
                self.proto.receive_data(data)
                continue
            if isinstance(event, ConnectionEnded):
                raise ConnectionClosedError("connection closed by the broker")
            event = expect(event, Frame)
            return event

    async def close(self, *, timeout: float = 5.0) -> None:
        """Close politely: settle what is queued, send Close and wait (up to ``timeout``)
        for the node's Close, so every reply sent before it is read; then stop the
        tasks and fail whatever is still waiting."""
        self.closed_by_client = True
        for sib in list(self._siblings.values()):
            await sib.close(timeout=timeout)
        self._siblings.clear()
        polite = False
        if self._writer is not None and self._closed is None and not self.proto.closed:
            # Settlements made before close() go out first; messages delivered but never
            # shown to the application go back uncounted.
            for c in list(self._consumers.values()):
                c._return_unseen()
            if self._acks:
                self._flush_acks()
            try:
                self._writer.write(self.proto.send(Close(code=0, reason="client closed")))
                polite = True
            except TandemError:
                pass  # the protocol is already closing; nothing more may be sent
        if polite and self._tasks:
            try:
                async with self.clock.timeout(timeout):
                    await self.closed_event.wait()
            except TimeoutError:
                log.warning("node %s did not answer Close within %.1fs", self.node, timeout)
        self._shutdown(ConnectionClosedError("connection closed by the client"))
        current = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not current]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._writer is not None:
            try:
                await self._writer.wait_closed()
            except (ConnectionError, OSError):
                pass  # the peer went first; the socket is closed either way

    def _shutdown(self, exc: TandemError) -> None:
        if self._closed is not None:
            return
        self._closed = exc
        if self._writer is not None:
            self._writer.close()
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(exc)
        self._pending.clear()
        for _tags, ack_fut in self._acks.values():
            if not ack_fut.done():
                ack_fut.set_exception(exc)
        self._acks.clear()
        for c in list(self._consumers.values()):
            c._closed(exc)
        self.closed_event.set()
        if self.on_closed is not None:
            self.on_closed(self, exc)

    @property
    def is_closed(self) -> bool:
        return self._closed is not None

    @property
    def close_error(self) -> TandemError | None:
        """Why the link closed (None while it is open)."""
        return self._closed

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    # -- tasks ---------------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        try:
            while True:
                frame = await self._next_frame()
                self._last_recv = self.clock.monotonic()
                self._dispatch(frame)
        except FrameError as exc:
            self._shutdown(ConnectionClosedError(f"protocol error from the broker: {exc.message}"))
        except TandemError as exc:
            self._shutdown(exc)
        except (ConnectionError, OSError) as exc:
            self._shutdown(ConnectionClosedError(f"connection lost: {exc}"))

    async def _heartbeats(self) -> None:
        while self._closed is None:
            await self.clock.sleep(self.heartbeat / 2)
            now = self.clock.monotonic()
            if now - self._last_recv > 3 * self.heartbeat:
                self._shutdown(HeartbeatTimeoutError(f"no frame from node {self.node} for {3 * self.heartbeat:.1f}s"))
                return
            if now - self._last_send >= self.heartbeat:
                try:
                    self.send_frame(Heartbeat())
                except TandemError:  # closed while this task slept: the read loop has said why
                    return

    def _dispatch(self, frame: Frame) -> None:
        if isinstance(frame, Deliver):
            c = self._consumers.get(frame.consumer)
            if c is not None:
                c._deliver(frame.messages)
            else:  # in flight when the consumer was cancelled: give them back, uncounted
                for d in frame.messages:
                    self.settle(Nack, d.tag, delivered=False)
            return
        rid = getattr(frame, "rid", 0)
        if rid:
            subscriber = self._subscribing.pop(rid, None)
            if subscriber is not None and isinstance(frame, SubscribeOk):
                # Register before the reply is seen: deliveries may be next in this very read.
                subscriber.consumer_id = frame.consumer
                self._consumers[frame.consumer] = subscriber
            fut = self._pending.pop(rid, None)
            if fut is not None and not fut.done():
                if isinstance(frame, Error):
                    fut.set_exception(for_code(frame.code, frame.message, active_hint=frame.active_hint,
                                   next_seq=frame.next_seq))
                else:
                    fut.set_result(frame)
            return
        if isinstance(frame, Cancel):
            c = self._consumers.pop(frame.consumer, None)
            if c is not None:
                c._closed(ConsumerCancelledError(f"consumer of queue {c.queue!r} cancelled by the broker "
                                                 "(the queue was deleted)"))
        elif isinstance(frame, MapChanged):
            if self.on_map_changed is not None:
                self.on_map_changed(frame.node)
        elif isinstance(frame, Error):
            log.warning("broker error: code=%d %s", frame.code, frame.message)
        elif isinstance(frame, Close):
            if self.closed_by_client:
                self._shutdown(ConnectionClosedError("connection closed by the client"))
            else:
                self._shutdown(ConnectionClosedError(f"broker closed the connection: {frame.reason or frame.code}"))

    # -- requests --------------------------------------------------------------------------------

    def next_rid(self) -> int:
        return next(self._rids)

    def send_frame(self, frame: Frame) -> None:
        if self._closed is not None:
            raise self._closed
        if self._writer is None:
            raise ConnectionClosedError("not connected")
        self._writer.write(self.proto.send(frame))
        self._last_send = self.clock.monotonic()

    def request_nowait(self, frame: Frame) -> asyncio.Future[Frame]:
        """Send a request (its ``rid`` from :meth:`next_rid`); the future gets the reply."""
        if self._closed is not None:
            raise self._closed
        fut: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self._pending[frame.rid] = fut  # type: ignore[attr-defined]
        try:
            self.send_frame(frame)
        except BaseException:  # (refused on this side, e.g. a frame the link's version lacks: no reply will come)
            self._pending.pop(frame.rid, None)  # type: ignore[attr-defined]
            raise
        return fut

    async def request(self, make: Callable[[int], Frame]) -> Frame:
        return await self.request_nowait(make(self.next_rid()))

    async def drain(self) -> None:
        if self._writer is not None:
            await self._writer.drain()

    # -- queues ------------------------------------------------------------------------------------

    async def declare_queue(self, name: str, *, partitions: int = 1, mapper: str | None = None,
                            ring_size: int = 1024, max_deliveries: int = 0,
                            dead_letter_queue: str | None = None, max_length: int = 0,
                            placement: Placement = None, max_length_bytes: int = 0,
                            overflow: str = "reject-publish", message_ttl: int = 0, expires: int = 0,
                            dead_letter_exchange: str | None = None,
                            dead_letter_routing_key: str | None = None) -> QueueInfo:
        """Create ``name`` (idempotent: same settings -> the existing queue; others -> QueueExistsError).
        ``mapper`` None: ``jump_hash`` for a new queue, whatever an existing one has.
        ``placement``: ``static`` distribution, in a replication group: one node list per
        partition, in priority order (the first node is the preferred active), each node
        ``name``, ``name:sync`` or ``name:async`` (``[["node1", "node2", "node3:async"],
        ["node2", "node3", "node1"]]``, or the same as "node1,node2,node3:async;node2,...");
        None: the group's ``dynamic`` policy places them.  ``max_length`` (messages held) and
        ``max_length_bytes`` (bytes of ready messages) bound the queue; ``overflow`` says what a
        publish past them does: ``reject-publish`` (QueueFullError) or ``drop-head`` (the oldest
        ready messages go, to ``dead_letter_queue`` if there is one; docs/architecture.md).
        ``message_ttl``: milliseconds a message may wait before it expires (0: for ever);
        ``expires``: milliseconds the queue may go unused (no consumer, get or declare on any
        member) before it is deleted (0: never).  ``dead_letter_exchange``, instead of a
        ``dead_letter_queue``: dead letters are published there, with ``dead_letter_routing_key``
        (None: each one's own routing key; docs/messaging.md)."""
        reply = await self.request(lambda rid: Declare(
            rid=rid, queue=name, partitions=partitions, mapper=mapper or "", ring_size=ring_size,
            max_deliveries=max_deliveries, dead_letter_queue=dead_letter_queue, max_length=max_length,
            placement=placement_text(placement), max_length_bytes=max_length_bytes, overflow=overflow,
            message_ttl=message_ttl, expires=expires, dead_letter_exchange=dead_letter_exchange,
            dead_letter_routing_key=dead_letter_routing_key))
        reply = expect(reply, DeclareOk)
        return reply.queue

    async def delete_queue(self, name: str, *, if_empty: bool = False) -> None:
        await self.request(lambda rid: Delete(rid=rid, queue=name, if_empty=if_empty))

    async def purge_queue(self, name: str) -> int:
        """Drop the queue's ready messages; returns how many."""
        reply = await self.request(lambda rid: Purge(rid=rid, queue=name))
        reply = expect(reply, PurgeOk)
        return reply.purged

    async def list_queues(self) -> list[QueueInfo]:
        reply = await self.request(lambda rid: ListQueues(rid=rid))
        reply = expect(reply, Queues)
        return reply.queues

    async def partition_map(self, queue: str) -> PartitionMap:
        """Where ``queue``'s partitions are active; the node sends MapChanged from now on."""
        return (await self.metadata(queue)).map

    async def metadata(self, queue: str) -> MetadataOk:
        """The partition map of ``queue`` and whether the answering node has quorum (its
        actives are to be trusted); the node sends MapChanged from now on."""
        return expect(await self.request(lambda rid: Metadata(rid=rid, queue=queue)), MetadataOk)

    async def get(self, queue: str, *, auto_ack: bool = False) -> Message | None:
        """One message, or None when the queue has none ready."""
        reply = await self.request(lambda rid: Get(rid=rid, queue=queue, auto_ack=auto_ack))
        reply = expect(reply, GetOk)
        return Message(self, reply.message) if reply.message is not None else None

    async def produced(self, queue: str, partition: int, producer: str, offset: int = 0) -> ProducedOk:
        """Which of ``producer``'s messages the partition stores from ``offset`` on (its
        active answers; a restore's look for a producer's resends)."""
        reply = await self.request(lambda rid: Produced(rid=rid, queue=queue, partition=partition,
                                                        producer=producer, offset=offset))
        return expect(reply, ProducedOk)

    # -- producers and consumers ---------------------------------------------------------------------

    def producer(self, queue: str, *, producer_id: str | None = None, max_batch: int = 256,
                 max_in_flight: int = 64) -> Producer:
        return Producer(self, queue, producer_id=producer_id, max_batch=max_batch, max_in_flight=max_in_flight)

    def exchange_producer(self, exchange: str, routing_key: str = "", *, mandatory: bool = False,
                          producer_id: str | None = None, max_batch: int = 256, max_in_flight: int = 64) -> Producer:
        """A producer that publishes to ``exchange`` (``""``: the default exchange, which routes
        to the queue ``routing_key`` names); ``send(..., routing_key=)`` overrides the key.  With
        ``mandatory`` a message routed to no queue fails its batch (UnroutableError, nothing
        stored); without, it is dropped and counted (``producer.unroutable``)."""
        return Producer(self, "", producer_id=producer_id, max_batch=max_batch, max_in_flight=max_in_flight,
                        exchange=exchange, routing_key=routing_key, mandatory=mandatory)

    def consumer(self, queue: str, *, prefetch: int = 256) -> Consumer:
        """A consumer of the whole queue: the partitions active on this connection's node, and
        those active on other members relayed by it (docs/architecture.md, "Consuming from any
        node")."""
        return Consumer(self, queue, prefetch=prefetch)

    def group_consumer(self, queue: str, *, prefetch: int = 256) -> GroupConsumer:
        """A consumer of the whole queue in a replication group: it subscribes on every
        member (each delivers the partitions it is active for).  On a single node it is
        the same as :meth:`consumer`."""
        return GroupConsumer(self, queue, prefetch=prefetch)

    async def sibling(self, name: str, address: str) -> Connection:
        """A connection to another member ``name`` at ``address`` with these credentials."""
        old = self._siblings.get(name)
        if old is not None and not old.is_closed:
            return old
        host, _, port = address.rpartition(":")
        params = ConnectParams(**{**_params_dict(self.params), "hosts": ((host, int(port)),)})
        conn = Connection(params, clock=self.clock)
        await conn._open()
        self._siblings[name] = conn
        return conn

    async def subscribe(self, c: Subscriber) -> int:
        """Subscribe ``c``.  The consumer is registered when the reply is read, even if
        the caller stopped waiting (a timeout), so no delivery is ever dropped."""
        rid = self.next_rid()
        fut = self.request_nowait(Subscribe(rid=rid, queue=c.queue, prefetch=c.prefetch, local=c.local))
        self._subscribing[rid] = c
        reply = await fut  # on an error reply _dispatch has already forgotten the rid
        reply = expect(reply, SubscribeOk)
        return reply.consumer

    def _unregister(self, consumer_id: int) -> None:
        self._consumers.pop(consumer_id, None)

    # -- settlement (coalesced: all acks of one loop iteration go in one frame) ---------------------------

    def settle(self, kind: type, tag: int, requeue: bool = True, *, delivered: bool = True,
               multiple: bool = False) -> asyncio.Future[None]:
        """Queue an ack/nack/reject; every settlement of one loop iteration goes in one frame.

        Returns the future of that frame's reply, shared by all its settlements.
        """
        if self._closed is not None:
            raise self._closed
        key = (kind, requeue, delivered, multiple)
        batch = self._acks.get(key)
        if batch is None:
            batch = self._acks[key] = ([], asyncio.get_running_loop().create_future())
            if not self._ack_flush_scheduled:
                self._ack_flush_scheduled = True
                asyncio.get_running_loop().call_soon(self._flush_acks)
        batch[0].append(tag)
        return batch[1]

    def _flush_acks(self) -> None:
        self._ack_flush_scheduled = False
        batches, self._acks = self._acks, {}
        for (kind, requeue, delivered, multiple), (tags, done) in batches.items():
            rid = self.next_rid()
            if multiple:
                tags = [max(tags)]
            if kind is Nack:
                frame: Frame = Nack(rid=rid, tags=tags, requeue=requeue, delivered=delivered, multiple=multiple)
            elif kind is Reject:
                frame = Reject(rid=rid, tags=tags, multiple=multiple)
            else:
                frame = Ack(rid=rid, tags=tags, multiple=multiple)
            try:
                reply = self.request_nowait(frame)
            except TandemError as exc:
                done.set_exception(exc)
                # The connection is closed and says so to everyone using it; a
                # fire-and-forget ack's future need not log it again.
                done.exception()
                continue
            reply.add_done_callback(functools.partial(_chain, done=done))


def _chain(reply: asyncio.Future[Frame], *, done: asyncio.Future[None]) -> None:
    if done.done():
        return
    if reply.cancelled():
        done.cancel()
    elif reply.exception() is not None:
        done.set_exception(reply.exception())  # type: ignore[arg-type]
    else:
        done.set_result(None)
