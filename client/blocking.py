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
it works in plain scripts and under gevent's monkey-patched sockets (locust).
Heartbeats are off by default (``heartbeat=0`` in the handshake): a blocking
client may sit idle between calls; the broker relies on TCP keepalive.
A connection is not thread-safe: use one per thread or greenlet.
"""

from __future__ import annotations

import itertools
import socket
import uuid
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any

from client.errors import (
    ConnectionClosedError,
    ConsumerCancelledError,
    InvalidArgumentError,
    MessageTooLargeError,
    TandemError,
    for_code,
)
from client.consumer import DeliveredMessage
from client.producer import Body, _as_bytes
from client.protocol import NEED_DATA, ConnectionEnded, ProtocolConnection, Role
from client.protocol.frames import (
    expect,
    Ack,
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
    Read,
    ReadOk,
    Reject,
    StreamMessage,
    Subscribe,
    SubscribeOk,
    Welcome,
)
from client.url import parse_url


def connect(url: str, *, client_name: str = "tandem-python-blocking", timeout: float | None = None) -> BlockingConnection:
    """Open a blocking connection to the first reachable node of ``url``."""
    params = parse_url(url)
    last: BaseException | None = None
    for host, port in params.hosts:
        try:
            sock = socket.create_connection((host, port), timeout=params.connect_timeout)
        except OSError as exc:
            last = exc
            continue
        conn = BlockingConnection(sock, timeout=timeout)
        try:
            conn._handshake(client_name, params.user, params.password)
        except TandemError as exc:
            conn._sock.close()
            if not exc.retriable:
                raise
            last = exc
            continue
        return conn
    raise ConnectionClosedError(f"cannot connect to {params.hosts}: {last}")


class BlockingMessage(DeliveredMessage):
    """A delivered message; ``ack``/``nack``/``reject`` return once the node answered."""

    __slots__ = ("_conn",)

    def __init__(self, conn: BlockingConnection, d: Delivery) -> None:
        super().__init__(d)
        self._conn = conn

    def _settle(self, frame_of: Any) -> None:
        self._mark_settled()
        self._conn._call(frame_of)

    def ack(self) -> None:
        self._settle(lambda rid: Ack(rid=rid, tags=[self._d.tag]))

    def nack(self, *, requeue: bool = True) -> None:
        self._settle(lambda rid: Nack(rid=rid, tags=[self._d.tag], requeue=requeue))

    def reject(self) -> None:
        self._settle(lambda rid: Reject(rid=rid, tags=[self._d.tag]))


class BlockingConnection:
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

    # -- plumbing ------------------------------------------------------------------------

    def _read_frame(self) -> Frame | None:
        """The next frame for the caller, or None after one handled here (a delivery, a heartbeat)."""
        while True:
            event = self.proto.next_event()
            if event is NEED_DATA:
                try:
                    data = self._sock.recv(256 * 1024)
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

    def _call(self, make: Any) -> Frame:
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

    def _handshake(self, client_name: str, user: str, password: str) -> None:
        self._sock.sendall(self.proto.hello(client_name=client_name, user=user, password=password, heartbeat=0))
        frame = self._read_frame()
        while frame is None:
            frame = self._read_frame()
        if isinstance(frame, Error):
            raise for_code(frame.code, frame.message)
        if not isinstance(frame, Welcome):
            raise ConnectionClosedError(f"unexpected {type(frame).__name__} during the handshake")
        self.node = frame.node
        self.max_message_size = frame.max_message_size

    def close(self) -> None:
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

    def declare_queue(self, name: str, *, partitions: int = 1, mapper: str = "consistent_hash",
                      ring_size: int = 1024, max_deliveries: int = 0, dead_letter_queue: str | None = None,
                      max_length: int = 0) -> QueueInfo:
        reply = self._call(lambda rid: Declare(
            rid=rid, queue=name, partitions=partitions, mapper=mapper, ring_size=ring_size,
            max_deliveries=max_deliveries, dead_letter_queue=dead_letter_queue, max_length=max_length))
        reply = expect(reply, DeclareOk)
        return reply.queue

    def delete_queue(self, name: str, *, if_empty: bool = False) -> None:
        self._call(lambda rid: Delete(rid=rid, queue=name, if_empty=if_empty))

    def purge_queue(self, name: str) -> int:
        reply = self._call(lambda rid: Purge(rid=rid, queue=name))
        reply = expect(reply, PurgeOk)
        return reply.purged

    def list_queues(self) -> list[QueueInfo]:
        reply = self._call(lambda rid: ListQueues(rid=rid))
        reply = expect(reply, Queues)
        return reply.queues

    def get(self, queue: str, *, auto_ack: bool = False) -> BlockingMessage | None:
        reply = self._call(lambda rid: Get(rid=rid, queue=queue, auto_ack=auto_ack))
        reply = expect(reply, GetOk)
        return BlockingMessage(self, reply.message) if reply.message else None

    def read(self, queue: str, partition: int, offset: int = 0,
             max_messages: int = 1000) -> tuple[list[StreamMessage], int, int]:
        reply = self._call(lambda rid: Read(rid=rid, queue=queue, partition=partition, offset=offset,
                                            max_messages=max_messages))
        reply = expect(reply, ReadOk)
        return reply.messages, reply.next_offset, reply.end_offset

    def producer(self, queue: str, *, producer_id: str | None = None) -> BlockingProducer:
        return BlockingProducer(self, queue, producer_id)

    def consumer(self, queue: str, *, prefetch: int = 256) -> BlockingConsumer:
        return BlockingConsumer(self, queue, prefetch)


class BlockingProducer:
    def __init__(self, conn: BlockingConnection, queue: str, producer_id: str | None) -> None:
        self.conn = conn
        self.queue = queue
        self.producer_id = producer_id or uuid.uuid4().hex
        self._seq = 0

    def _message(self, body: Body, key: str | None, headers: Mapping[str, str] | None) -> PublishMessage:
        data = _as_bytes(body)
        if len(data) > self.conn.max_message_size:
            raise MessageTooLargeError(f"message of {len(data)} bytes exceeds max_message_size")
        seq = self._seq
        self._seq += 1
        return PublishMessage(key, dict(headers) if headers else {}, data, seq)

    def send(self, body: Body, *, key: str | None = None, headers: Mapping[str, str] | None = None) -> int:
        """Publish one message; returns its sequence number once confirmed."""
        msg = self._message(body, key, headers)
        self._publish([msg])
        return msg.seq or 0

    def send_many(self, bodies: Iterable[Body], *, key: str | None = None) -> int:
        """Publish many messages in one batch; returns how many were confirmed."""
        msgs = [self._message(b, key, None) for b in bodies]
        if msgs:
            self._publish(msgs)
        return len(msgs)

    def _publish(self, msgs: list[PublishMessage]) -> None:
        reply = self.conn._call(lambda rid: Publish(rid=rid, queue=self.queue, messages=msgs,
                                                    producer_id=self.producer_id))
        reply = expect(reply, PublishOk)


class BlockingConsumer:
    def __init__(self, conn: BlockingConnection, queue: str, prefetch: int) -> None:
        self.conn = conn
        reply = conn._call(lambda rid: Subscribe(rid=rid, queue=queue, prefetch=prefetch))
        reply = expect(reply, SubscribeOk)
        self.consumer_id = reply.consumer
        self._buf = conn._deliveries.setdefault(self.consumer_id, deque())

    def next(self) -> BlockingMessage:
        """Block until the next message arrives (socket timeout -> ConnectionClosedError;
        ConsumerCancelledError when the broker ends the consumer)."""
        while not self._buf:
            if self.consumer_id in self.conn._cancelled:
                raise ConsumerCancelledError("consumer cancelled by the broker (the queue was deleted)")
            self.conn._read_frame()
        return BlockingMessage(self.conn, self._buf.popleft())

    def __iter__(self) -> Iterator[BlockingMessage]:
        while True:
            yield self.next()

    def cancel(self) -> None:
        """Stop deliveries; buffered messages never handed out go back uncounted."""
        self.conn._call(lambda rid: Cancel(rid=rid, consumer=self.consumer_id))
        unseen = [d.tag for d in self._buf]
        self._buf.clear()
        self.conn._deliveries.pop(self.consumer_id, None)
        if unseen:
            self.conn._call(lambda rid: Nack(rid=rid, tags=unseen, requeue=True, delivered=False))
