"""Producers: confirmed publishing with automatic batching.

``await producer.send(body)`` returns once the broker has stored the message
per its durability policy.  Sends made in the same event-loop iteration (say,
``asyncio.gather`` over many ``send`` calls, or ``send_many``) are coalesced
into ``Publish`` frames of up to ``max_batch`` messages, like Kafka's producer
linger, and up to ``max_in_flight`` frames are pipelined before the producer
waits for confirms.

Every message carries the producer's id and a sequence number, so the broker
stores a resent message once (an idempotent producer).

A producer publishes to one queue, or to an exchange (``exchange`` set; ``queue`` ""): then
each message goes to every queue the exchange routes its routing key and headers to.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections import deque
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any

from client.errors import InvalidArgumentError, MessageTooLargeError, TandemError
from client.link import Link
from client.protocol.frames import Frame, Publish, PublishMessage, PublishOk, expect
from client.timing import timed_headers

Body = bytes | bytearray | memoryview | str
FRAME_OVERHEAD = 64  # per-message msgpack overhead estimate, bytes


def _as_bytes(body: Body) -> bytes:
    if isinstance(body, str):
        return body.encode()
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    raise InvalidArgumentError(f"message body must be bytes or str, not {type(body).__name__}")


def routing(exchange: str | None, keys: list[str]) -> dict[str, Any]:
    """A publish's routing fields for messages with these routing keys: one key for the batch
    when they share it, else one per message (none for a publish to a queue)."""
    if exchange is None or not keys:
        return {}
    if all(k == keys[0] for k in keys):
        return {"routing_key": keys[0]}
    return {"routing_key": "", "routing_keys": keys}


class Producer:
    def __init__(self, conn: Link, queue: str, *, producer_id: str | None = None,
                 max_batch: int = 256, max_in_flight: int = 64, exchange: str | None = None,
                 routing_key: str = "", mandatory: bool = False) -> None:
        if max_batch < 1 or max_in_flight < 1:
            raise InvalidArgumentError("max_batch and max_in_flight must be >= 1")
        self.conn = conn
        self.queue = queue
        self.exchange, self.routing_key, self.mandatory = exchange, routing_key, mandatory
        self.producer_id = producer_id or uuid.uuid4().hex
        self.max_batch = max_batch
        self.max_in_flight = max_in_flight
        # A producer id the application chose may be one an earlier process used: its seqs
        # start above anything that process sent (microseconds since the epoch), or the node
        # would take the first ones for resends and drop them.  A new random id starts at 0.
        self._seq = int(conn.clock.time() * 1_000_000) if producer_id else 0
        #: each message, its confirm, its routing key (a publish to an exchange)
        self._buffer: deque[tuple[PublishMessage, asyncio.Future[int], str]] = deque()
        self._in_flight = 0
        self._flush_scheduled = False
        self._unconfirmed = 0  # sent or buffered, not yet confirmed or failed
        self._idle: asyncio.Event | None = None
        self.sent = 0
        self.confirmed = 0
        self.duplicates = 0
        self.unroutable = 0  # messages an exchange routed to no queue (dropped)

    def _enqueue(self, body: Body, key: str | None, headers: Mapping[str, str] | None,
                 routing_key: str | None = None) -> asyncio.Future[int]:
        data = _as_bytes(body)
        if len(data) > self.conn.max_message_size:
            raise MessageTooLargeError(
                f"message of {len(data)} bytes exceeds the node's max_message_size {self.conn.max_message_size}")
        if headers and not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
            raise InvalidArgumentError("headers must map str to str")
        if key is not None and not isinstance(key, str):
            raise InvalidArgumentError("key must be a str")
        seq = self._seq
        self._seq = seq + 1
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        if routing_key is not None and not isinstance(routing_key, str):
            raise InvalidArgumentError("routing_key must be a str")
        self._buffer.append((PublishMessage(key, dict(headers) if headers else {}, data, seq), fut,
                             self.routing_key if routing_key is None else routing_key))
        self._unconfirmed += 1
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        return fut

    async def send(self, body: Body, *, key: str | None = None, headers: Mapping[str, str] | None = None,
                   delay: float | None = None, deliver_at: float | None = None, ttl: float | None = None,
                   routing_key: str | None = None) -> int:
        """Publish one message; returns its sequence number once it is confirmed.  ``delay``,
        ``deliver_at`` and ``ttl`` time it (:mod:`client.timing`); ``routing_key``: an exchange
        producer's key for this message (None: the producer's)."""
        return await self._enqueue(body, key, timed_headers(headers, delay=delay, deliver_at=deliver_at, ttl=ttl),
                                   routing_key)

    async def send_many(self, messages: Iterable[Body | tuple[Body, str | None] |
                                                 tuple[Body, str | None, Mapping[str, str] | None]]) -> list[int]:
        """Publish many messages, pipelined; returns their sequence numbers once all are confirmed.

        Each item is a body, ``(body, key)`` or ``(body, key, headers)``.
        """
        futs = []
        for item in messages:
            if isinstance(item, tuple):
                body, key, *rest = item
                futs.append(self._enqueue(body, key, rest[0] if rest else None))
            else:
                futs.append(self._enqueue(item, None, None))
        return list(await asyncio.gather(*futs))

    def _flush(self) -> None:
        self._flush_scheduled = False
        conn = self.conn
        limit = conn.max_frame_size - 4096
        buf = self._buffer
        while buf and self._in_flight < self.max_in_flight:
            batch: list[PublishMessage] = []
            futs: list[asyncio.Future[int]] = []
            size = 0
            keys: list[str] = []
            while buf and len(batch) < self.max_batch:
                msg, fut, rk = buf[0]
                msize = len(msg.body) + FRAME_OVERHEAD + (len(msg.key) if msg.key else 0) + \
                    sum(len(k) + len(v) for k, v in msg.headers.items())
                if batch and size + msize > limit:
                    break
                buf.popleft()
                if fut.cancelled():
                    self._settled(1)
                    continue
                batch.append(msg)
                futs.append(fut)
                keys.append(rk)
                size += msize + len(rk)
            if not batch:
                continue
            rid = conn.next_rid()
            try:
                reply = conn.request_nowait(Publish(rid=rid, queue=self.queue, messages=batch,
                                                    producer_id=self.producer_id, exchange=self.exchange,
                                                    **routing(self.exchange, keys), mandatory=self.mandatory))
            except TandemError as exc:
                for f in futs:
                    if not f.done():
                        f.set_exception(exc)
                self._settled(len(futs))
                continue
            self._in_flight += 1
            self.sent += len(batch)
            reply.add_done_callback(functools.partial(self._confirmed, futs=futs, batch=batch))

    def _confirmed(self, reply: asyncio.Future[Frame], *, futs: list[asyncio.Future[int]],
                   batch: list[PublishMessage]) -> None:
        self._in_flight -= 1
        exc = reply.exception() if not reply.cancelled() else TandemError("publish cancelled")
        if exc is None:
            frame = reply.result()
            frame = expect(frame, PublishOk)
            self.confirmed += len(batch)
            self.duplicates += frame.duplicates
            self.unroutable += frame.unroutable
        for f, m in zip(futs, batch):
            if not f.done():
                if exc is None:
                    f.set_result(m.seq or 0)
                else:
                    f.set_exception(exc)
        self._settled(len(futs))
        if self._buffer and not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _settled(self, n: int) -> None:
        self._unconfirmed -= n
        if self._unconfirmed == 0 and self._idle is not None:
            self._idle.set()

    async def flush(self) -> None:
        """Wait until everything sent so far is confirmed (or failed)."""
        while self._unconfirmed:
            self._idle = asyncio.Event()
            await self._idle.wait()

    async def close(self) -> None:
        await self.flush()

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()
