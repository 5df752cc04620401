"""Benchmark drivers for the peer systems: RabbitMQ (quorum queue), NATS JetStream, and a null AMQP server.

Each follows :class:`broker.tools.bench.workload.Driver`: ``setup`` makes a fresh
queue/stream with a unique name, every publisher and consumer gets its own
connection, and ``teardown`` deletes what ``setup`` made and closes every
connection still open.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import sys
import uuid
from typing import Any
from urllib.parse import urlsplit

import aio_pika
import aiormq
import nats
import psutil
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage
from nats.aio.client import Client as NatsClient
from nats.js.api import AckPolicy, ConsumerConfig, StorageType, StreamConfig

from broker.tools.bench.harness import ServerProcs
from broker.tools.cluster import free_ports
from broker.tools.bench.workload import Checker, Publisher, Workload

_AMQP_ERRORS = (aio_pika.exceptions.AMQPError, aiormq.exceptions.AMQPError, ConnectionError)
_log = logging.getLogger(__name__)


def _run_name() -> str:
    return f"tandem-bench-{uuid.uuid4().hex[:12]}"


def _is_local(host: str) -> bool:
    """True when ``host`` is an address of this machine (loopback or one of its interfaces)."""
    try:
        addrs = {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    mine = {a.address.split("%")[0] for nic in psutil.net_if_addrs().values() for a in nic}
    return all(ipaddress.ip_address(a.split("%")[0]).is_loopback or a.split("%")[0] in mine for a in addrs)


def local_listeners(url: str, default_port: int, server: str, ports: list[int] | None = None) -> ServerProcs:
    """The ``server`` processes (by executable name) on this machine listening on ``url``'s
    port (and on ``ports``, for the other members of a cluster), found by their listening
    sockets, or why there are none (another process on the port, a proxy say, is not counted)."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or default_port
    if not _is_local(host):
        return ServerProcs(reason=f"{host} is not an address of this machine (or does not resolve)")
    wanted = sorted({port, *(ports or [])})
    by_port: dict[int, int] = {}
    for c in psutil.net_connections("tcp"):
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port in wanted and c.pid is not None:
            by_port.setdefault(c.laddr.port, c.pid)
    missing = [p for p in wanted if p not in by_port]
    if missing:
        return ServerProcs(reason=f"no process of this machine (that this user may see) listens on port(s) "
                                  f"{', '.join(map(str, missing))}")
    pids = sorted(set(by_port.values()))
    names = {pid: psutil.Process(pid).name() for pid in pids}
    others = [f"{names[pid]} (pid {pid})" for pid in pids if names[pid] != server]
    if others:
        return ServerProcs(reason=f"the process listening on the server's port is {', '.join(others)}, "
                                  f"not {server}")
    what = ", ".join(f"{names[pid]} pid {pid} (listens on :"
                     f"{','.join(str(p) for p, q in sorted(by_port.items()) if q == pid)})" for pid in pids)
    return ServerProcs(pids=tuple(pids), what=what)


async def _sentinel_when_done(done: asyncio.Event, inbox: asyncio.Queue[Any]) -> None:
    """Wake a consumer blocked on ``inbox`` once the checker has seen everything."""
    await done.wait()
    inbox.put_nowait(None)


class RabbitMQDriver:
    """RabbitMQ through aio-pika: durable quorum queue, persistent messages, publisher confirms."""

    name = "rabbitmq"
    durability = "quorum queue (fsync before confirm)"

    def __init__(self, url: str = "amqp://guest:guest@127.0.0.1:5672/", cluster_nodes: int = 1) -> None:
        if cluster_nodes > 1:
            self.durability = f"quorum queue on a {cluster_nodes}-node cluster (fsync before confirm)"
        self.cluster_nodes = cluster_nodes
        self.url = url
        self.queue_name = ""
        self._queues: list[str] = []
        self._admin: AbstractChannel | None = None
        self._conns: list[AbstractConnection] = []

    def server_processes(self) -> ServerProcs:
        """The RabbitMQ node (the Erlang VM, beam.smp) listening on the URL's port; its
        helpers (epmd, erl_child_setup) are not counted. Not measured for a cluster (its
        other nodes are not found)."""
        if self.cluster_nodes > 1:
            return ServerProcs(reason=f"a {self.cluster_nodes}-node RabbitMQ cluster: only the node at the URL "
                                      "could be found, not its peers")
        return local_listeners(self.url, 5672, "beam.smp")

    async def _connect(self) -> AbstractConnection:
        conn = await aio_pika.connect(self.url)
        self._conns.append(conn)
        return conn

    async def _close(self, conn: AbstractConnection) -> None:
        if conn in self._conns:
            self._conns.remove(conn)
        if not conn.is_closed:
            await conn.close()

    async def setup(self, w: Workload) -> None:
        """Declare a fresh durable quorum queue for this run."""
        if self._admin is None or self._admin.is_closed:
            self._admin = await (await self._connect()).channel()
        self.queue_name = _run_name()
        await self._admin.declare_queue(
            self.queue_name, durable=True, arguments={"x-queue-type": "quorum"})
        self._queues.append(self.queue_name)

    async def publisher(self, w: Workload) -> Publisher:
        """A Publisher on its own connection and confirm-mode channel."""
        conn = await self._connect()
        channel = await conn.channel(publisher_confirms=True, on_return_raises=True)
        exchange = channel.default_exchange
        routing_key = self.queue_name

        def submit(body: bytes) -> asyncio.Future[Any]:
            message = aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
            # The coroutine resolves on the broker's Basic.Ack; as a task many are in flight.
            return asyncio.ensure_future(exchange.publish(message, routing_key=routing_key))

        return Publisher(submit, window=w.window, close=lambda: self._close(conn))

    async def consume(self, w: Workload, checker: Checker) -> None:
        """Consume with prefetch ``w.prefetch``, acking cumulatively (``multiple=True``).

        An ack goes out after ``prefetch // 2`` records or whenever no further
        delivery is buffered, so every recorded message is acked promptly and
        the broker never stalls on a full prefetch window.
        """
        conn = await self._connect()
        inbox: asyncio.Queue[AbstractIncomingMessage | None] = asyncio.Queue()
        watcher = asyncio.ensure_future(_sentinel_when_done(checker.done, inbox))
        last: AbstractIncomingMessage | None = None
        try:
            channel = await conn.channel()
            await channel.set_qos(prefetch_count=w.prefetch)
            queue = await channel.get_queue(self.queue_name, ensure=False)

            async def on_message(message: AbstractIncomingMessage) -> None:
                inbox.put_nowait(message)

            await queue.consume(on_message, no_ack=False)
            batch = max(1, w.prefetch // 2)
            unacked = 0
            while (message := await inbox.get()) is not None:
                checker.record(message.body)
                last, unacked = message, unacked + 1
                if unacked >= batch or inbox.empty():
                    await message.ack(multiple=True)
                    last, unacked = None, 0
        finally:
            watcher.cancel()
            if last is not None and not conn.is_closed:
                try:
                    await last.ack(multiple=True)
                except _AMQP_ERRORS as e:  # the run is ending; unacked ones go back to the queue
                    _log.warning("rabbitmq: final ack failed: %r", e)
            await self._close(conn)

    async def teardown(self) -> None:
        """Delete the run's queues and close every connection."""
        try:
            if self._admin is not None and not self._admin.is_closed:
                for q in self._queues:
                    await self._admin.queue_delete(q)
                self._queues.clear()
        finally:
            self._admin = None
            for conn in list(self._conns):
                await self._close(conn)


class TandemAmqpDriver(RabbitMQDriver):
    """Tandem's AMQP port through aio-pika: the RabbitMQ driver's code (a durable queue, persistent
    messages, publisher confirms, acks), pointed at a spawned Tandem node or group."""

    name = "tandem-amqp"

    def __init__(self, url: str, durability: str, servers: Any) -> None:
        super().__init__(url)
        self.durability = f"{durability}, through AMQP"
        self._servers = servers

    def server_processes(self) -> ServerProcs:
        return self._servers()


class NullAmqpDriver(RabbitMQDriver):
    """The RabbitMQ driver's code against a null AMQP server started for the run
    (``broker.tools.bench.null_amqp``: a publish confirmed and delivered as soon as it is
    read, nothing stored): what this client can do against any server on this machine."""

    name = "null-amqp"
    durability = "none: confirmed as read, nothing stored (the client's ceiling)"

    def __init__(self) -> None:
        super().__init__(url="")
        self._proc: asyncio.subprocess.Process | None = None

    async def setup(self, w: Workload) -> None:
        if self._proc is None:
            port = free_ports(1)[0]
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "broker.tools.bench.null_amqp", str(port), stdout=asyncio.subprocess.PIPE)
            assert self._proc.stdout is not None
            line = await asyncio.wait_for(self._proc.stdout.readline(), 30)
            if not line.startswith(b"listening"):
                raise RuntimeError(f"the null AMQP server did not start (exit status {await self._proc.wait()})")
            self.url = f"amqp://guest:guest@127.0.0.1:{port}/"
        await super().setup(w)

    def server_processes(self) -> ServerProcs:
        if self._proc is None:
            return ServerProcs(reason="the null AMQP server is not running")
        return ServerProcs(pids=(self._proc.pid,), what=f"null-amqp pid {self._proc.pid}")

    async def teardown(self) -> None:
        try:
            await super().teardown()
        finally:
            if self._proc is not None and self._proc.returncode is None:
                self._proc.kill()
                await self._proc.wait()
            self._proc = None


class NatsDriver:
    """NATS JetStream through nats-py: R1 file stream, async publish acks, durable pull consumer."""

    name = "nats"
    durability = "JetStream R1 file storage (acks before fsync)"
    consumer_name = "bench"
    fetch_timeout = 1.0  # seconds a fetch lingers before the consumer loops

    def __init__(self, url: str = "nats://127.0.0.1:4222", replicas: int = 1) -> None:
        self.replicas = replicas
        if replicas > 1:
            self.durability = f"JetStream R{replicas} file storage (acks before fsync)"
        self.url = url
        self.stream = ""
        self.subject = ""
        self._streams: list[str] = []
        self._admin: NatsClient | None = None
        self._conns: list[NatsClient] = []

    def server_processes(self) -> ServerProcs:
        """The nats-server processes of the cluster at the URL: the one listening on the URL's
        client port and those listening on the client ports the cluster advertises to its
        clients (``connect_urls`` of the server's INFO; none for a lone server). A nats-server
        of this machine that is not in that cluster (e.g. the one on :4222 beside a cluster on
        :4301..) is not counted."""
        info: dict[str, Any] = getattr(self._admin, "_server_info", None) or {}
        ports = []
        for u in info.get("connect_urls") or []:
            p = urlsplit(f"nats://{u}")
            if p.hostname is None or not _is_local(p.hostname):
                return ServerProcs(reason=f"a member of the NATS cluster ({u}) is not on this machine")
            ports.append(p.port or 4222)
        if self.replicas > 1 and not ports:
            return ServerProcs(reason="the server at the URL advertises no cluster members")
        return local_listeners(self.url, 4222, "nats-server", ports)

    async def _connect(self) -> NatsClient:
        nc = await nats.connect(self.url)
        self._conns.append(nc)
        return nc

    async def _close(self, nc: NatsClient) -> None:
        if nc in self._conns:
            self._conns.remove(nc)
        if not nc.is_closed:
            await nc.close()

    async def setup(self, w: Workload) -> None:
        """Create a fresh R1 file-storage stream and its shared durable pull consumer."""
        if self._admin is None or self._admin.is_closed:
            self._admin = await self._connect()
        js = self._admin.jetstream()
        self.stream = _run_name()
        self.subject = self.stream.replace("-", ".")
        await js.add_stream(StreamConfig(
            name=self.stream, subjects=[self.subject], storage=StorageType.FILE, num_replicas=self.replicas))
        self._streams.append(self.stream)
        await js.add_consumer(self.stream, ConsumerConfig(
            durable_name=self.consumer_name,
            ack_policy=AckPolicy.EXPLICIT,
            max_ack_pending=max(1, w.prefetch * w.consumers),
        ))

    async def publisher(self, w: Workload) -> Publisher:
        """A Publisher on its own connection, using ``publish_async`` for pipelined acks."""
        nc = await self._connect()
        js = nc.jetstream(publish_async_max_pending=max(1, w.window))
        subject = self.subject

        async def confirmed(body: bytes) -> Any:
            ack_future = await js.publish_async(subject, body)
            return await ack_future

        def submit(body: bytes) -> asyncio.Future[Any]:
            return asyncio.ensure_future(confirmed(body))

        return Publisher(submit, window=w.window, close=lambda: self._close(nc))

    async def consume(self, w: Workload, checker: Checker) -> None:
        """Fetch batches of ``w.prefetch`` from the shared durable consumer; ack each message."""
        nc = await self._connect()
        try:
            js = nc.jetstream()
            sub = await js.pull_subscribe_bind(durable=self.consumer_name, stream=self.stream)
            while not checker.done.is_set():
                try:
                    msgs = await sub.fetch(batch=w.prefetch, timeout=self.fetch_timeout)
                except asyncio.TimeoutError:  # nats.errors.TimeoutError included
                    continue
                for msg in msgs:
                    checker.record(msg.data)
                    await msg.ack()  # a plain publish: no reply is awaited
        finally:
            await self._close(nc)

    async def teardown(self) -> None:
        """Delete the run's streams and close every connection."""
        try:
            if self._admin is not None and not self._admin.is_closed:
                js = self._admin.jetstream()
                for s in self._streams:
                    await js.delete_stream(s)
                self._streams.clear()
        finally:
            self._admin = None
            for nc in list(self._conns):
                await self._close(nc)
