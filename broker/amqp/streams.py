"""Stream consumers over AMQP: ``basic.consume`` on a stream (``x-queue-type: stream``).

As in RabbitMQ, a stream is read, not consumed: a consumer starts where ``x-stream-offset``
says (``first``, ``last``, ``next`` (the default), an offset, or a timestamp) and reads on
from there; messages stay in the stream for every other reader.  Each comes as a
``basic.deliver`` whose ``headers`` carry its ``x-stream-offset`` (and ``x-stream-partition``
where the stream has several partitions: offsets count per partition).  Acks are flow control:
at most the channel's prefetch (``basic.qos``, else 1,000) unacked deliveries a consumer.

A reader task per consumer reads each partition in turn with the node's ``Read`` request (the
partition's active answers, forwarded there in a group), and looks again every
:data:`POLL` seconds once it has caught up.  Its position lives in the task: a consumer made
again starts again from its ``x-stream-offset``.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

from pamqp import commands as C

from broker.amqp import codes
from broker.amqp.channel import Channel, ChannelConsumer
from broker.amqp.properties import from_headers, route_of
from broker.amqp.wire import AmqpWire, ReplyCode
from client.clock import Clock
from client.protocol.frames import Error, Frame, Read, ReadOk

#: seconds between two reads of a partition a reader has caught up with
POLL = 0.1
#: unacked deliveries a stream consumer may have when its channel set no prefetch
DEFAULT_CREDIT = 1000

Reply = Callable[[Frame], None]


class StreamNode(Protocol):
    @property
    def clock(self) -> Clock: ...


class StreamHost(Protocol):
    @property
    def node(self) -> StreamNode: ...

    wire: AmqpWire

    def write(self, data: bytes) -> None: ...

    async def request(self, make: Callable[[int], Frame], reply: Reply) -> None: ...

    def task(self, coro: Coroutine[Any, Any, None]) -> None: ...

    def close_channel(self, number: int, reply_code: int, text: str, class_id: int = 0, method_id: int = 0) -> None: ...


def start_of(value: Any) -> dict[str, Any]:
    """The ``Read`` fields for an ``x-stream-offset``; ValueError for one this node does not take."""
    if value is None or value == "next":
        return {"start": "next"}
    if value in ("first", "last"):
        return {"start": value}
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return {"offset": value}
    if isinstance(value, datetime.datetime):
        stamp = value if value.tzinfo is not None else value.replace(tzinfo=datetime.timezone.utc)
        return {"timestamp": max(1, int(stamp.timestamp() * 1000))}
    raise ValueError(f"x-stream-offset {value!r}: first, last, next, an offset or a timestamp")


@dataclass(eq=False)
class StreamReader:
    """One stream consumer's reading: where it is, and how many of its deliveries are unacked."""

    queue: str
    partitions: int
    start: dict[str, Any]
    credit: int
    no_ack: bool
    unacked: int = 0
    alive: bool = True
    room: asyncio.Event = field(default_factory=asyncio.Event)

    def acked(self, n: int) -> None:
        self.unacked -= n
        self.room.set()

    def stop(self) -> None:
        self.alive = False
        self.room.set()


class StreamConsumers:
    def __init__(self, s: StreamHost) -> None:
        self.s = s

    async def start(self, ch: Channel, cid: int, c: ChannelConsumer, partitions: int, start: dict[str, Any],
                    prefetch: int) -> Error | None:
        """Start reading for consumer ``c``: ``next`` is each partition's end now, before
        consume-ok (what is published after it comes).  The node's refusal, if it refuses."""
        r = StreamReader(c.queue, partitions, start, prefetch or DEFAULT_CREDIT, c.no_ack)
        where = {p: dict(start) for p in range(partitions)}
        if start == {"start": "next"}:
            for p in range(partitions):
                answer = await self._read(r, p, {"start": "next"}, 1)
                if not isinstance(answer, ReadOk):
                    return answer if isinstance(answer, Error) else Error(rid=0, code=0, message="no answer")
                where[p] = {"offset": answer.next_offset}
        c.stream = r
        self.s.task(self._run(ch, cid, c, r, where))
        return None

    async def _read(self, r: StreamReader, p: int, at: dict[str, Any], n: int) -> Frame | None:
        got: list[Frame] = []
        await self.s.request(lambda rid: Read(rid=rid, queue=r.queue, partition=p, max_messages=n, **at), got.append)
        return got[0] if got else None

    async def _run(self, ch: Channel, cid: int, c: ChannelConsumer, r: StreamReader,
                   where: dict[int, dict[str, Any]]) -> None:
        clock = self.s.node.clock
        while r.alive and not ch.closing:
            found = False
            for p in range(r.partitions):
                while r.alive and not r.no_ack and r.unacked >= r.credit:
                    r.room.clear()
                    await r.room.wait()
                if not r.alive or ch.closing:
                    return
                answer = await self._read(r, p, where[p], r.credit - r.unacked if not r.no_ack else r.credit)
                if not isinstance(answer, ReadOk):
                    if isinstance(answer, Error) and r.alive and not ch.closing:
                        code = codes.of(answer.code)
                        self.s.close_channel(ch.number, code, codes.text(code, answer.message))
                    return
                where[p] = {"offset": answer.next_offset}
                if not r.alive or ch.consumers.get(cid) is not c:
                    return
                for m in answer.messages:
                    found = True
                    props = from_headers(m.headers)
                    extra: dict[str, Any] = {"x-stream-offset": m.offset}
                    if r.partitions > 1:
                        extra["x-stream-partition"] = p
                    props.headers = {**(props.headers or {}), **extra}
                    if r.no_ack:
                        tag, ch.next_tag = ch.next_tag, ch.next_tag + 1
                    else:
                        tag = ch.deliver_stream(r)
                        r.unacked += 1
                    exchange, key = route_of(m.headers, r.queue)
                    self.s.write(self.s.wire.content(ch.number, C.Basic.Deliver(
                        consumer_tag=c.tag, delivery_tag=tag, redelivered=False, exchange=exchange, routing_key=key),
                        props, m.body))
            if not found:
                await clock.sleep(POLL)


def refuse_start(s: StreamHost, ch: Channel, m: C.Basic.Consume, why: str) -> None:
    s.close_channel(ch.number, ReplyCode.PRECONDITION_FAILED, codes.text(ReplyCode.PRECONDITION_FAILED, why),
                    *codes.ids(m))
