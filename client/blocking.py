"""The blocking client: plain sockets around the same sans-IO protocol.

    from client import blocking
    with blocking.connect("tandem://admin:PW@127.0.0.1:7780") as conn:
        conn.declare_queue("q", partitions=4)
        p = conn.producer("q")
        p.send(b"hello", key="k")           # returns when confirmed
        p.send_many([b"a", b"b", b"c"])     # one batch, one confirm
        c = conn.consumer("q", prefetch=64)
        for m in c:                         # blocks until a message arrives
            m.ack()
            break

No threads and no event loop: every call writes its frame and reads frames
until its reply arrives, buffering deliveries for the consumers meanwhile.  So
it works in plain scripts and under gevent (locust): after ``gevent.monkey.patch_all()``
(before this module is imported) its sockets, TLS, name resolution and backoff sleeps
(``time.sleep``) are gevent's, so a greenlet blocked in a call, a consumer's iteration, a
re-dial or a socket timeout lets the others run.  Tested (tests/client/test_gevent.py):
50 greenlets with a connection each in one process, consumers blocked in iteration while
producers publish, the producers' node killed -9 mid-run in a 3-node group (plaintext and
``tandems://``) with every confirmed message consumed; re-dial, handshake and read timeouts
during which another greenlet keeps running.  Not cooperative: ``buffer_path``'s SQLite
writes (short, local).

It is durable too: when its node goes away (a broken link, a refusal, a node
without quorum) a call re-dials the URL's nodes in turn with jittered backoff,
resubscribes its consumers and sends the request again, until ``send_timeout``.
A publish is resent under the same (producer id, seq), so it is stored once.
Messages delivered on the old link come again, marked redelivered; settling one
of the old ones raises StaleDeliveryError.  It talks to one node at a time: in a
group, that node relays the partitions active on the other members, so its
consumers and gets reach the whole queue (a settlement of a relayed message whose
peer link failed meanwhile raises StaleDeliveryError too: the message comes again).
Heartbeats are off (``heartbeat=0`` in the handshake): a blocking client may sit idle
between calls; the broker relies on TCP keepalive.  The handshake gives a node that does
not answer up after the URL's ``connect_timeout`` (default 10 s); later reads wait as long as
``timeout`` says (None: for ever).
A connection is not thread-safe: use one per thread or greenlet.
Its producer, and the local buffer behind it, is :mod:`client.blocking_producer`'s.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import socket
import ssl
from collections import deque
from collections.abc import Iterator
from types import TracebackType
from typing import Any

from client.errors import (
    ConnectionClosedError,
    ConsumerCancelledError,
    InvalidArgumentError,
    StaleDeliveryError,
    TandemError,
    TimeoutError_,
    UnknownDeliveryTagError,
    for_code,
)
from client import tls
from client.clock import SYSTEM_CLOCK, Backoff
from client.blocking_exchanges import BlockingExchanges
from client.blocking_streams import BlockingStreams
from client.blocking_transactions import BlockingTransactions
from client.blocking_producer import BlockingProducer
from client.consumer import DeliveredMessage
from client.protocol import NEED_DATA, ConnectionEnded, ProtocolConnection, Role
from client.protocol.frames import (
    expect,
    Ack,
    AclGrant,
    AclInfo,
    AclList,
    AclRevoke,
    Acls,
    AuthChallenge,
    Cancel,
    Close,
    Declare,
    DeclareOk,
    Deliver,
    Delete,
    Delivery,
    Error,
    Frame,
    Get,
    GetOk,
    Heartbeat,
    ListQueues,
    Nack,
    Publish,
    PublishMessage,
    PublishOk,
    Purge,
    PurgeOk,
    QueueInfo,
    Queues,
    Metadata,
    MetadataOk,
    PartitionMap,
    Reject,
    StreamMessage,
    Subscribe,
    SubscribeOk,
    UserDelete,
    UserInfo,
    UserList,
    UserPut,
    Users,
    Welcome,
    Placement,
    placement_text,
)
from client.scram import ScramClient
from client.url import ConnectParams, parse_url


def connect(url: str, *, client_name: str = "tandem-python-blocking", timeout: float | None = None,
            send_timeout: float = 60.0, durable: bool = True, buffer_path: str | None = None,
            buffer_max_bytes: int = 64 * 1024 * 1024, ssl_context: ssl.SSLContext | None = None) -> BlockingConnection:
    """Open a blocking connection to the first reachable node of ``url``.

    ``timeout``: the socket timeout of one read.  ``durable``: ride through the loss
    of the node (see the module docs) for up to ``send_timeout`` seconds per call.
    ``buffer_path``: a SQLite file where producers put sends made while no node is
    reachable (then ``connect`` succeeds even so); they drain in order once one is.
    ``ssl_context``: for ``tandems://``, the TLS context to use instead of one that trusts
    the URL's ``ca`` (or the system's CAs)."""
    if buffer_max_bytes <= 0:
        raise InvalidArgumentError("buffer_max_bytes must be > 0")
    params = parse_url(url)
    if ssl_context is not None:
        params = dataclasses.replace(params, ssl_context=ssl_context)
    last: BaseException | None = None
    for k, (host, port) in enumerate(params.hosts):
        try:
            sock = _open_socket(params, host, port)
        except TandemError as exc:
            if not exc.retriable:
                raise
            last = exc
            continue
        except OSError as exc:
            last = exc
            continue
        conn = BlockingConnection(sock, timeout=timeout)
        try:
            conn._handshake(client_name, params.user, params.password, params.connect_timeout)
        except TandemError as exc:
            conn._sock.close()
            if not exc.retriable:
                raise
            last = exc
            continue
        conn._params, conn._client_name, conn._send_timeout = params, client_name, send_timeout
        conn._durable, conn._host_index = durable, k
        conn.buffer_path, conn.buffer_max_bytes = buffer_path, buffer_max_bytes
        return conn
    if buffer_path is not None:  # no node now: the producers buffer, the first call re-dials
        conn = BlockingConnection(socket.socket(), timeout=timeout)
        conn._closed = True
        conn._params, conn._client_name, conn._send_timeout = params, client_name, send_timeout
        conn._durable, conn._host_index = True, -1
        conn.buffer_path, conn.buffer_max_bytes = buffer_path, buffer_max_bytes
        return conn
    raise ConnectionClosedError(f"cannot connect to {', '.join(f'{h}:{p}' for h, p in params.hosts)}: {last}")


def _open_socket(params: ConnectParams, host: str, port: int) -> socket.socket:
    """A connected socket to ``host:port``, its TLS handshake done for tandems://."""
    sock = socket.create_connection((host, port), timeout=params.connect_timeout)
    ctx = params.context()
    if ctx is None:
        return sock
    try:
        return ctx.wrap_socket(sock, server_hostname=host)
    except ssl.SSLError as exc:
        sock.close()
        raise tls.handshake_error(host, port, exc) from None
    except OSError:
        sock.close()
        raise


def _dial(params: ConnectParams, client_name: str, start: int) -> tuple[socket.socket, int]:
    """A socket to the first node from ``start`` on (in turn) that accepts TCP (and TLS)."""
    last: BaseException | None = None
    hosts = params.hosts
    for i in range(len(hosts)):
        k = (start + i) % len(hosts)
        try:
            return _open_socket(params, *hosts[k]), k
        except TandemError as exc:
            if not exc.retriable:
                raise
            last = exc
        except OSError as exc:
            last = exc
    raise ConnectionClosedError(f"cannot connect to {', '.join(f'{h}:{p}' for h, p in hosts)}: {last}")


class BlockingMessage(DeliveredMessage):
    """A delivered message; ``ack``/``nack``/``reject`` return once the node answered."""

    __slots__ = ("_conn", "_epoch")

    def __init__(self, conn: BlockingConnection, d: Delivery) -> None:
        super().__init__(d)
        self._conn = conn
        self._epoch = conn._epoch

    def _settle(self, frame_of: Any) -> None:
        if self._epoch != self._conn._epoch:
            raise StaleDeliveryError(f"message {self.id} came on a link that has since failed; "
                                     "it will be delivered again")
        self._mark_settled()
        try:
            self._conn._call(frame_of, retry=False)
        except UnknownDeliveryTagError as exc:
            # the node no longer holds it (relayed from a member whose link failed, or its partition
            # moved): it will be delivered again, as a message of a failed link is
            raise StaleDeliveryError(f"message {self.id}: {exc.message}; it will be delivered again") from None

    def ack(self) -> None:
        self._settle(lambda rid: Ack(rid=rid, tags=[self._d.tag]))

    def nack(self, *, requeue: bool = True) -> None:
        self._settle(lambda rid: Nack(rid=rid, tags=[self._d.tag], requeue=requeue))

    def reject(self) -> None:
        self._settle(lambda rid: Reject(rid=rid, tags=[self._d.tag]))


class BlockingConnection(BlockingExchanges, BlockingStreams, BlockingTransactions):
    def __init__(self, sock: socket.socket, *, timeout: float | None = None) -> None:
        self._sock = sock
        sock.settimeout(timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.proto = ProtocolConnection(Role.CLIENT)
        self._rids = itertools.count(1)
        self._deliveries: dict[int, deque[Delivery]] = {}
        self._cancelled: set[int] = set()  # consumers the broker ended
        self._closed = False
        self.node = ""
        self.max_message_size = 5 * 1024 * 1024
        self._timeout = timeout
        self._params: ConnectParams | None = None
        self._client_name = "tandem-python-blocking"
        self._send_timeout = 60.0
        self._durable = False
        self._epoch = 0  # bumped by every reconnect: deliveries of older links are stale
        self._host_index = 0
        self._consumers: list[BlockingConsumer] = []
        self._closing = False
        self.buffer_path: str | None = None
        self.buffer_max_bytes = 64 * 1024 * 1024
        self._rng = random.Random()

    # -- plumbing ------------------------------------------------------------------------

    def _read_frame(self) -> Frame | None:
        """The next frame for the caller, or None after one handled here (a delivery, a heartbeat)."""
        while True:
            event = self.proto.next_event()
            if event is NEED_DATA:
                try:
                    data = self._sock.recv(256 * 1024)
                except TimeoutError as exc:  # the socket timeout: the caller's to hear (the link is fine)
                    raise TimeoutError_(f"no frame from node {self.node} within {self._timeout}s") from exc
                except OSError as exc:
                    self._closed = True
                    raise ConnectionClosedError(f"connection lost: {exc}") from exc
                self.proto.receive_data(data)
                continue
            if isinstance(event, ConnectionEnded):
                self._closed = True
                raise ConnectionClosedError("connection closed by the broker")
            event = expect(event, Frame)
            if isinstance(event, Deliver):
                self._deliveries.setdefault(event.consumer, deque()).extend(event.messages)
                return None
            if isinstance(event, Heartbeat):
                return None
            if isinstance(event, Cancel) and event.rid == 0:
                self._cancelled.add(event.consumer)
                return None
            if isinstance(event, Close):
                self._closed = True
                raise ConnectionClosedError(f"broker closed the connection: {event.reason}")
            return event

    def _write(self, frame: Frame) -> None:
        if self._closed:
            raise ConnectionClosedError("connection is closed")
        try:
            self._sock.sendall(self.proto.send(frame))
        except OSError as exc:
            self._closed = True
            raise ConnectionClosedError(f"connection lost: {exc}") from exc

    def _call(self, make: Any, *, retry: bool = True) -> Frame:
        """Send a request and read until its reply; if durable (and ``retry``), ride through
        a lost node: reconnect and send it again until ``send_timeout``."""
        clock = SYSTEM_CLOCK
        deadline = clock.monotonic() + self._send_timeout
        backoff = Backoff(rng=self._rng)
        while True:
            try:
                return self._call_once(make)
            except TimeoutError_:
                raise  # the socket timeout the caller chose: theirs to hear (the link is fine)
            except TandemError as exc:
                if not (self._durable and retry and exc.should_retry and not self._closing) \
                        or clock.monotonic() >= deadline:
                    raise
                clock.sleep_blocking(backoff.next())
                if self._closed or exc.reroutes:
                    self._reconnect(deadline)

    def _call_once(self, make: Any) -> Frame:
        rid = next(self._rids)
        self._write(make(rid))
        while True:
            frame = self._read_frame()
            if frame is None or getattr(frame, "rid", None) != rid:
                continue  # a delivery, or a broker notice; nothing else is outstanding
            if isinstance(frame, Error):
                raise for_code(frame.code, frame.message, active_hint=frame.active_hint,
                                   next_seq=frame.next_seq)
            return frame

    def reachable(self) -> bool:
        """Connected, or one pass over the URL's nodes found one (never waits longer)."""
        if not self._closed:
            return True
        try:
            self._reconnect(SYSTEM_CLOCK.monotonic())
        except TandemError:
            return False
        return True

    def _reconnect(self, deadline: float) -> None:
        """A new link to the next node that takes us (from the one after the current), with
        jittered backoff until ``deadline``; consumers resubscribed."""
        assert self._params is not None
        try:
            self._sock.close()
        except OSError:
            pass
        backoff = Backoff(rng=self._rng)
        while True:
            sock = None
            try:
                sock, k = _dial(self._params, self._client_name, self._host_index + 1)
                self._host_index = k
                self._sock = sock
                sock.settimeout(self._timeout)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self.proto = ProtocolConnection(Role.CLIENT)
                self._closed = False
                self._handshake(self._client_name, self._params.user, self._params.password,
                                self._params.connect_timeout)
                break
            except (TandemError, OSError) as exc:
                if sock is not None:
                    sock.close()
                self._closed = True
                if isinstance(exc, TandemError) and not exc.retriable:
                    raise
                if SYSTEM_CLOCK.monotonic() >= deadline:
                    raise ConnectionClosedError(f"no node of the URL answers: {exc}") from exc
            SYSTEM_CLOCK.sleep_blocking(backoff.next())
        self._epoch += 1
        self._deliveries.clear()
        for c in self._consumers:
            c._resubscribe()

    def _handshake(self, client_name: str, user: str, password: str, timeout: float) -> None:
        """Hello, the SCRAM-SHA-256 exchange (no password on the wire), Welcome; a node that does
        not answer within ``timeout`` (the URL's ``connect_timeout``) is given up on."""
        self._sock.settimeout(timeout)
        try:
            self._handshake_steps(client_name, user, password)
        except TimeoutError_:
            raise ConnectionClosedError(f"node {self._peer()} did not answer the handshake within {timeout}s") \
                from None
        finally:
            self._sock.settimeout(self._timeout)

    def _peer(self) -> str:
        try:
            host, port = self._sock.getpeername()[:2]
        except OSError:
            return "(gone)"
        return f"at {host}:{port}"

    def _send_bytes(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except OSError as exc:
            self._closed = True
            raise ConnectionClosedError(f"connection lost: {exc}") from exc

    def _handshake_steps(self, client_name: str, user: str, password: str) -> None:
        sc = ScramClient(user, password)
        self._send_bytes(self.proto.hello(client_name=client_name, user=user, auth=sc.first, heartbeat=0))
        try:
            frame = self._handshake_frame()
        except ConnectionClosedError:
            if not isinstance(self._sock, ssl.SSLSocket):  # no answer to a plaintext Hello: a TLS-only port?
                host, port = self._sock.getpeername()[:2]
                raise tls.plaintext_refused(host, port) from None
            raise
        if isinstance(frame, AuthChallenge):
            sc.challenge(frame.data)
            self._send_bytes(self.proto.auth_response(sc.final(sc.salt_password())))
            frame = self._handshake_frame()
        if isinstance(frame, Error):
            raise for_code(frame.code, frame.message)
        if not isinstance(frame, Welcome):
            raise ConnectionClosedError(f"unexpected {type(frame).__name__} during the handshake")
        sc.verify(frame.auth)  # the node proves it holds the user's credentials
        self.node = frame.node
        self.max_message_size = frame.max_message_size

    def _handshake_frame(self) -> Frame:
        frame = self._read_frame()
        while frame is None:
            frame = self._read_frame()
        return frame

    def close(self) -> None:
        self._closing = True
        if not self._closed:
            try:
                self._sock.sendall(self.proto.send(Close(code=0, reason="client closed")))
            except (OSError, TandemError):
                pass  # closing anyway
            self._closed = True
        self._sock.close()

    def __enter__(self) -> BlockingConnection:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # -- API (mirrors the async client) --------------------------------------------------------

    def declare_queue(self, name: str, *, partitions: int = 1, mapper: str | None = None,
                      ring_size: int = 1024, max_deliveries: int = 0, dead_letter_queue: str | None = None,
                      max_length: int = 0, placement: Placement = None, max_length_bytes: int = 0,
                      overflow: str = "reject-publish", message_ttl: int = 0, expires: int = 0,
                      dead_letter_exchange: str | None = None, dead_letter_routing_key: str | None = None) -> QueueInfo:
        reply = self._call(lambda rid: Declare(
            rid=rid, queue=name, partitions=partitions, mapper=mapper or "", ring_size=ring_size,
            max_deliveries=max_deliveries, dead_letter_queue=dead_letter_queue, max_length=max_length,
            placement=placement_text(placement), max_length_bytes=max_length_bytes, overflow=overflow,
            message_ttl=message_ttl, expires=expires, dead_letter_exchange=dead_letter_exchange,
            dead_letter_routing_key=dead_letter_routing_key))
        reply = expect(reply, DeclareOk)
        return reply.queue

    def delete_queue(self, name: str, *, if_empty: bool = False) -> None:
        """Not resent after a failover: a retry could not tell "deleted now" from "never was"."""
        self._call(lambda rid: Delete(rid=rid, queue=name, if_empty=if_empty), retry=False)

    def purge_queue(self, name: str) -> int:
        """Not resent after a failover: it would purge what came in meanwhile."""
        reply = self._call(lambda rid: Purge(rid=rid, queue=name), retry=False)
        reply = expect(reply, PurgeOk)
        return reply.purged

    def list_queues(self) -> list[QueueInfo]:
        reply = self._call(lambda rid: ListQueues(rid=rid))
        reply = expect(reply, Queues)
        return reply.queues

    # -- users and grants (the group's; see docs/security.md) ---------------------------------

    def create_user(self, name: str, password: str, role: str = "user") -> None:
        """A new user of the group: ``role`` admin, monitor or user (refused if it exists; not
        sent again after a lost node: a retry could not tell "created just now" from "taken")."""
        self._call(lambda rid: UserPut(rid=rid, name=name, password=password, role=role, mode="create"),
                   retry=False)

    def change_password(self, name: str, password: str) -> None:
        self._call(lambda rid: UserPut(rid=rid, name=name, password=password, mode="password"))

    def delete_user(self, name: str) -> None:
        """Delete a user and its grants (not sent again after a lost node)."""
        self._call(lambda rid: UserDelete(rid=rid, name=name), retry=False)

    def list_users(self) -> list[UserInfo]:
        return expect(self._call(lambda rid: UserList(rid=rid)), Users).users

    def grant(self, user: str, pattern: str, permissions: list[str]) -> None:
        """Grant ``permissions`` (produce, consume, browse, configure, admin) on the queues
        matching ``pattern`` (``orders.*``, ``*``) to ``user``."""
        self._call(lambda rid: AclGrant(rid=rid, user=user, pattern=pattern, permissions=list(permissions)))

    def revoke(self, user: str, pattern: str, permissions: list[str]) -> None:
        self._call(lambda rid: AclRevoke(rid=rid, user=user, pattern=pattern, permissions=list(permissions)))

    def list_acls(self, user: str | None = None) -> list[AclInfo]:
        """The grants of ``user`` (None: of every user)."""
        return expect(self._call(lambda rid: AclList(rid=rid, user=user)), Acls).acls

    def get(self, queue: str, *, auto_ack: bool = False) -> BlockingMessage | None:
        reply = self._call(lambda rid: Get(rid=rid, queue=queue, auto_ack=auto_ack), retry=False)
        reply = expect(reply, GetOk)
        return BlockingMessage(self, reply.message) if reply.message else None

    def partition_map(self, queue: str) -> PartitionMap:
        """Where ``queue``'s partitions are active (and the members' client addresses)."""
        return expect(self._call(lambda rid: Metadata(rid=rid, queue=queue)), MetadataOk).map

    def publish(self, queue: str, messages: list[PublishMessage], producer_id: str) -> PublishOk:
        """One batch as it is, seqs included (callers that number their own messages, such as
        the Spark sink, whose retried tasks send the same seqs again); resent on a failover."""
        return expect(self._call(lambda rid: Publish(rid=rid, queue=queue, messages=messages,
                                                     producer_id=producer_id)), PublishOk)

    def producer(self, queue: str, *, producer_id: str | None = None) -> BlockingProducer:
        return BlockingProducer(self, queue, producer_id)

    def consumer(self, queue: str, *, prefetch: int = 256, local: bool = False) -> BlockingConsumer:
        """A consumer of the whole queue (``local``: of the partitions active on the node this
        connection talks to only, the others not relayed)."""
        return BlockingConsumer(self, queue, prefetch, local)


class BlockingConsumer:
    def __init__(self, conn: BlockingConnection, queue: str, prefetch: int, local: bool = False) -> None:
        self.conn = conn
        self.queue = queue
        self.prefetch = prefetch
        self.local = local
        self.consumer_id = 0
        self._buf: deque[Delivery] = deque()
        self._subscribe()
        conn._consumers.append(self)

    def _subscribe(self) -> None:
        reply = self.conn._call(
            lambda rid: Subscribe(rid=rid, queue=self.queue, prefetch=self.prefetch, local=self.local), retry=False)
        reply = expect(reply, SubscribeOk)
        self.consumer_id = reply.consumer
        self._buf = self.conn._deliveries.setdefault(self.consumer_id, deque())

    def _resubscribe(self) -> None:
        self._subscribe()

    def next(self) -> BlockingMessage:
        """Block until the next message arrives (the connection's ``timeout`` -> TimeoutError_;
        ConsumerCancelledError when the broker ends the consumer).  A lost node is ridden
        through like any call: the consumer resubscribes elsewhere."""
        conn = self.conn
        while not self._buf:
            if self.consumer_id in conn._cancelled:
                raise ConsumerCancelledError("consumer cancelled by the broker (the queue was deleted)")
            try:
                conn._read_frame()
            except ConnectionClosedError:
                if not conn._durable or conn._closing:
                    raise
                conn._reconnect(SYSTEM_CLOCK.monotonic() + conn._send_timeout)
        return BlockingMessage(conn, self._buf.popleft())

    def __iter__(self) -> Iterator[BlockingMessage]:
        while True:
            yield self.next()

    def cancel(self) -> None:
        """Stop deliveries; buffered messages never handed out go back uncounted."""
        if self in self.conn._consumers:
            self.conn._consumers.remove(self)
        self.conn._call(lambda rid: Cancel(rid=rid, consumer=self.consumer_id), retry=False)
        unseen = [d.tag for d in self._buf]
        self._buf.clear()
        self.conn._deliveries.pop(self.consumer_id, None)
        if unseen:
            self.conn._call(lambda rid: Nack(rid=rid, tags=unseen, requeue=True, delivered=False), retry=False)
