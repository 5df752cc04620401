"""A durable connection's producer to an exchange: each batch through whichever member the
connection's primary link reaches (the member routes it, broker.messaging.routed), sent again
after a failure (on another member if need be) with the same producer id and sequence numbers,
so each bound queue stores each message once.

Sends made in the same event-loop iteration share a batch.  One batch
is in flight at a time: a resend reaches every partition before any later message does, which
is what lets a partition tell a resend it holds already from one it never got.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING

from client.errors import InvalidArgumentError, MessageTooLargeError
from client.producer import Body, _as_bytes, routing
from client.protocol.frames import Publish, PublishMessage, PublishOk, expect
from client.timing import timed_headers

if TYPE_CHECKING:
    from client.durable.links import DurableLinks


class DurableExchangeProducer:
    def __init__(self, conn: DurableLinks, exchange: str, routing_key: str = "", *, mandatory: bool = False,
                 producer_id: str | None = None, max_batch: int = 256) -> None:
        if max_batch < 1:
            raise InvalidArgumentError("max_batch must be >= 1")
        self.conn, self.exchange, self.routing_key, self.mandatory = conn, exchange, routing_key, mandatory
        self.producer_id = producer_id or uuid.uuid4().hex
        self.max_batch = max_batch
        # (a chosen id may be an earlier process's: its seqs start above what that one sent)
        self._seq = int(conn.clock.time() * 1_000_000) if producer_id else 0
        self._buffer: list[tuple[PublishMessage, str, asyncio.Future[int]]] = []
        self._sender: asyncio.Task[None] | None = None
        self.confirmed = self.duplicates = self.unroutable = 0

    async def send(self, body: Body, *, key: str | None = None, headers: Mapping[str, str] | None = None,
                   routing_key: str | None = None, delay: float | None = None, deliver_at: float | None = None,
                   ttl: float | None = None) -> int:
        """Publish one message to the exchange; returns its sequence number once every queue it is
        routed to stores it (``routing_key`` None: the producer's)."""
        data = _as_bytes(body)
        primary = self.conn._primary
        limit = primary.max_message_size if primary is not None else 5 * 1024 * 1024
        if len(data) > limit:
            raise MessageTooLargeError(f"message of {len(data)} bytes exceeds the node's max_message_size {limit}")
        rk = self.routing_key if routing_key is None else routing_key
        if not isinstance(rk, str):
            raise InvalidArgumentError("routing_key must be a str")
        hdrs = timed_headers(headers, delay=delay, deliver_at=deliver_at, ttl=ttl)
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._buffer.append((PublishMessage(key, dict(hdrs) if hdrs else {}, data, self._seq), rk, fut))
        self._seq += 1
        if self._sender is None or self._sender.done():
            self._sender = asyncio.get_running_loop().create_task(self._send_all())
        return await fut

    async def _send_all(self) -> None:
        await asyncio.sleep(0)  # (the sends of this loop iteration join the batch)
        while self._buffer:
            batch, self._buffer = self._buffer[:self.max_batch], self._buffer[self.max_batch:]
            msgs = [m for m, _rk, _f in batch]
            keys = routing(self.exchange, [rk for _m, rk, _f in batch])
            try:
                reply = await self.conn._call(lambda c: c.request(lambda rid: Publish(
                    rid=rid, queue="", messages=msgs, producer_id=self.producer_id, exchange=self.exchange,
                    **keys, mandatory=self.mandatory)), timeout=self.conn.send_timeout)
                ok = expect(reply, PublishOk)
            except BaseException as exc:
                for _m, _rk, f in batch:
                    if not f.done():
                        f.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise
                continue
            self.confirmed += len(msgs)
            self.duplicates += ok.duplicates
            self.unroutable += ok.unroutable
            for m, _rk, f in batch:
                if not f.done():
                    f.set_result(m.seq or 0)
