"""The blocking client's producer: sends confirmed one batch at a time, and a local buffer.

:meth:`client.blocking.BlockingConnection.producer` makes one.  A batch is resent under
the same sequence numbers after a failover, so it is stored once; sends made while no node
is reachable go to a local SQLite buffer (:mod:`client.buffer`) and drain from it, in
order, ahead of later sends.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from client.buffer import SendBuffer
from client.clock import SYSTEM_CLOCK
from client.errors import MessageTooLargeError
from client.producer import Body, _as_bytes
from client.protocol.frames import Frame, Publish, PublishMessage, PublishOk, expect
from client.timing import timed_headers


class ProducerLink(Protocol):
    """What a producer uses of its :class:`~client.blocking.BlockingConnection`."""

    max_message_size: int
    buffer_path: str | None
    buffer_max_bytes: int

    def reachable(self) -> bool: ...

    def _call(self, make: Any, *, retry: bool = True) -> Frame: ...


class BlockingProducer:
    """Publishes to ``queue`` over ``conn``, each call returning once its batch is confirmed;
    with the connection's ``buffer_path``, sends made while no node is reachable wait in a
    local buffer."""

    def __init__(self, conn: ProducerLink, queue: str, producer_id: str | None, *, exchange: str | None = None,
                 routing_key: str = "", mandatory: bool = False) -> None:
        self.conn = conn
        self.queue = queue
        #: a producer to an exchange (``queue`` ""): each batch to the queues it routes
        #: ``routing_key`` to; with ``mandatory`` a batch holding a message routed nowhere fails
        self.exchange, self.routing_key, self.mandatory = exchange, routing_key, mandatory
        self.unroutable = 0
        self.producer_id = producer_id or uuid.uuid4().hex
        # A producer id the application chose may be one an earlier process used: its seqs
        # start above anything that process sent (microseconds since the epoch), or the node
        # would take the first ones for resends and drop them.  A new random id starts at 0.
        self._seq = int(SYSTEM_CLOCK.time() * 1_000_000) if producer_id else 0
        self.buffer: SendBuffer | None = None
        if conn.buffer_path is not None and exchange is None:  # (the local buffer keeps a queue's sends)
            self.buffer = SendBuffer(conn.buffer_path, self.producer_id, queue, conn.buffer_max_bytes)

    def _message(self, body: Body, key: str | None, headers: Mapping[str, str] | None) -> PublishMessage:
        data = _as_bytes(body)
        if len(data) > self.conn.max_message_size:
            raise MessageTooLargeError(f"message of {len(data)} bytes exceeds max_message_size")
        seq = self._seq
        self._seq += 1
        return PublishMessage(key, dict(headers) if headers else {}, data, seq)

    def send(self, body: Body, *, key: str | None = None, headers: Mapping[str, str] | None = None,
             delay: float | None = None, deliver_at: float | None = None, ttl: float | None = None) -> int:
        """Publish one message; returns its sequence number once confirmed, or -1 when no node
        is reachable and the connection has a ``buffer_path``: then it waits in the buffer,
        which drains (in order, before this producer's later sends) once a node answers.
        ``delay``, ``deliver_at`` and ``ttl`` time it (:mod:`client.timing`)."""
        headers = timed_headers(headers, delay=delay, deliver_at=deliver_at, ttl=ttl)
        if self.buffer is not None:
            if not self.conn.reachable():
                data = _as_bytes(body)
                if len(data) > self.conn.max_message_size:
                    raise MessageTooLargeError(f"message of {len(data)} bytes exceeds max_message_size")
                self.buffer.append(key, dict(headers) if headers else {}, data)
                return -1
            self.drain()  # the buffer first: its messages get the earlier seqs
        msg = self._message(body, key, headers)
        self._publish([msg])
        return msg.seq or 0

    def drain(self) -> int:
        """Send what waits in the local buffer, oldest first; returns how many were sent.
        Each row's seq is written before it is first sent, so a process that dies mid-drain
        resends it under the same seq and it is stored once."""
        if self.buffer is None or not self.buffer.count:
            return 0
        done = 0
        rows = self.buffer.load()
        for i in range(0, len(rows), 100):
            chunk = rows[i:i + 100]
            fresh = [(r.id, -1, self._next_seq()) for r in chunk if r.seq is None]
            self.buffer.assign(fresh)
            seqs = {rid: seq for rid, _p, seq in fresh}
            msgs = [PublishMessage(r.key, r.headers, r.body, r.seq if r.seq is not None else seqs[r.id])
                    for r in chunk]
            self._publish(msgs)
            self.buffer.remove([r.id for r in chunk])
            done += len(chunk)
        return done

    def _next_seq(self) -> int:
        seq = self._seq
        self._seq += 1
        return seq

    @property
    def buffered_count(self) -> int:
        return self.buffer.count if self.buffer is not None else 0

    def send_many(self, bodies: Iterable[Body], *, key: str | None = None) -> int:
        """Publish many messages in one batch; returns how many were confirmed."""
        self.drain()
        msgs = [self._message(b, key, None) for b in bodies]
        if msgs:
            self._publish(msgs)
        return len(msgs)

    def _publish(self, msgs: list[PublishMessage]) -> None:
        # one batch at a time: a resend after a failover carries the same seqs, stored once
        reply = self.conn._call(lambda rid: Publish(rid=rid, queue=self.queue, messages=msgs,
                                                    producer_id=self.producer_id, exchange=self.exchange,
                                                    routing_key=self.routing_key if self.exchange is not None else "",
                                                    mandatory=self.mandatory))
        reply = expect(reply, PublishOk)
        self.unroutable += reply.unroutable
