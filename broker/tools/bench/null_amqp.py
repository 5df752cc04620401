"""A null AMQP 0-9-1 server: the ceiling an AMQP client reaches whatever the server does.

``tandem bench --peer null-amqp`` runs the AMQP workload (the RabbitMQ driver's aio-pika
code) against this process. It stores nothing and checks nothing: a publish is confirmed as
soon as it is read, and handed to the queue's consumer at once, within the consumer's
prefetch. What the client achieves against it is the most it can achieve against any
server on the same machine, so it bounds every ratio measured with that client.

It serves exactly what the bench's client sends, to a trusted local client: the
connection handshake (any login), channels, ``confirm.select``, ``basic.qos``,
``queue.declare`` and ``queue.delete``, ``basic.publish``, ``basic.consume`` and
``basic.cancel``, ``basic.ack`` from a consumer. Anything else closes the connection with
540 NOT_IMPLEMENTED. It is a bench tool, not a broker.

Run as ``python -m broker.tools.bench.null_amqp PORT``; it prints ``listening on PORT``
once it accepts connections, and runs until killed.
"""

from __future__ import annotations

import asyncio
import itertools
import struct
import sys
from collections import deque
from dataclasses import dataclass, field

from pamqp import body as pbody, commands as C, frame as pframe, header as pheader, heartbeat as pheartbeat
from pamqp.base import Frame
from pamqp.common import FieldTable

_HEADER = b"AMQP\x00\x00\x09\x01"
_FRAME_MAX = 131072
#: what aio-pika needs to hear to open a channel in confirm mode
_PROPERTIES: FieldTable = {"product": "null-amqp", "capabilities": {
    "publisher_confirms": True, "basic.nack": True, "consumer_cancel_notify": True, "per_consumer_qos": True}}


@dataclass
class _Consumer:
    channel: int
    tag: str
    queue: str
    prefetch: int  # 0: no limit
    next_tag: itertools.count[int]  # the channel's delivery tags
    unacked: deque[int] = field(default_factory=deque)


class _Broker:
    """Queues by name: messages waiting for a consumer, and the consumers (one connection's)."""

    def __init__(self) -> None:
        self.waiting: dict[str, deque[tuple[C.Basic.Publish, pheader.ContentHeader, bytes]]] = {}
        self.consumers: dict[str, list[tuple[_Consumer, _Connection]]] = {}
        self.tags = itertools.count(1)
        self.dirty: set[_Connection] = set()

    def deliver(self, queue: str) -> None:
        """Hand the queue's waiting messages to its consumers while they have room."""
        waiting = self.waiting.get(queue)
        for consumer, conn in self.consumers.get(queue, []):
            while waiting and (not consumer.prefetch or len(consumer.unacked) < consumer.prefetch):
                publish, head, data = waiting.popleft()
                tag = next(consumer.next_tag)
                consumer.unacked.append(tag)
                conn.send(consumer.channel, C.Basic.Deliver(consumer.tag, tag, False, publish.exchange,
                                                            publish.routing_key))
                conn.send(consumer.channel, head)
                conn.send(consumer.channel, pbody.ContentBody(data))
                self.dirty.add(conn)

    def flush(self) -> None:
        """Send what each connection has been given since the last flush: a read's worth of
        deliveries goes out in one write, as the confirms do."""
        for conn in self.dirty:
            conn.flush()
        self.dirty.clear()


class _Connection:
    def __init__(self, broker: _Broker, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.broker = broker
        self.reader = reader
        self.writer = writer
        self.out: list[bytes] = []
        self.confirming: dict[int, int] = {}  # channel -> its last publish's delivery tag
        self.confirmed: dict[int, int] = {}  # channel -> the last delivery tag acked
        self.prefetch: dict[int, int] = {}
        self.delivery_tags: dict[int, itertools.count[int]] = {}
        self.consumers: dict[str, _Consumer] = {}
        self.content: dict[int, tuple[C.Basic.Publish, pheader.ContentHeader | None, list[bytes]]] = {}

    def send(self, channel: int, value: Frame | pheader.ContentHeader | pbody.ContentBody) -> None:
        self.out.append(pframe.marshal(value, channel))

    def flush(self) -> None:
        if self.out:
            self.writer.write(b"".join(self.out))
            self.out.clear()

    async def serve(self) -> None:
        if await self.reader.readexactly(8) != _HEADER:
            self.writer.write(_HEADER)
            return
        self.send(0, C.Connection.Start(server_properties=_PROPERTIES,
                                        mechanisms="PLAIN AMQPLAIN", locales="en_US"))
        self.flush()
        buf = b""
        while data := await self.reader.read(65536):
            buf += data
            at = 0
            while len(buf) - at >= 7 and len(buf) - at >= 8 + struct.unpack_from(">I", buf, at + 3)[0]:
                end = at + 8 + struct.unpack_from(">I", buf, at + 3)[0]
                _, channel, value = pframe.unmarshal(buf[at:end])
                at = end
                if self.handle(channel, value):
                    return
            buf = buf[at:]
            self._confirm()  # what was read together is confirmed together
            self.flush()
            self.broker.flush()

    def _confirm(self) -> None:
        for channel, tag in self.confirming.items():
            if tag > self.confirmed.get(channel, 0):
                self.send(channel, C.Basic.Ack(tag, multiple=True))
                self.confirmed[channel] = tag

    def handle(self, channel: int, value: object) -> bool:
        """Answer one frame; True once the connection is closed."""
        if isinstance(value, C.Basic.Publish):
            self.content[channel] = (value, None, [])
        elif isinstance(value, pheader.ContentHeader):
            publish, _, parts = self.content[channel]
            self.content[channel] = (publish, value, parts)
            if value.body_size == 0:
                self._published(channel, value)
        elif isinstance(value, pbody.ContentBody):
            publish, head, parts = self.content[channel]
            parts.append(value.value)
            if head is not None and sum(map(len, parts)) >= head.body_size:
                self._published(channel, head)
        elif isinstance(value, C.Basic.Ack):
            self._acked(channel, value)
        elif isinstance(value, pheartbeat.Heartbeat):
            pass
        else:
            return self._method(channel, value)
        return False

    def _published(self, channel: int, head: pheader.ContentHeader) -> None:
        publish, _, parts = self.content.pop(channel)
        if channel in self.confirming:
            self.confirming[channel] += 1
        queue = publish.routing_key
        self.broker.waiting.setdefault(queue, deque()).append((publish, head, b"".join(parts)))
        self.broker.deliver(queue)

    def _acked(self, channel: int, ack: C.Basic.Ack) -> None:
        for consumer in [c for c in self.consumers.values() if c.channel == channel]:
            if ack.multiple:
                while consumer.unacked and consumer.unacked[0] <= ack.delivery_tag:
                    consumer.unacked.popleft()
            elif ack.delivery_tag in consumer.unacked:
                consumer.unacked.remove(ack.delivery_tag)
            self.broker.deliver(consumer.queue)

    def _method(self, channel: int, value: object) -> bool:
        if isinstance(value, C.Connection.StartOk):
            self.send(0, C.Connection.Tune(channel_max=2047, frame_max=_FRAME_MAX, heartbeat=0))
        elif isinstance(value, C.Connection.TuneOk):
            pass
        elif isinstance(value, C.Connection.Open):
            self.send(0, C.Connection.OpenOk())
        elif isinstance(value, C.Connection.Close):
            self.send(0, C.Connection.CloseOk())
            self.flush()
            return True
        elif isinstance(value, C.Channel.Open):
            self.send(channel, C.Channel.OpenOk())
        elif isinstance(value, C.Channel.Close):
            self._drop(channel)
            self.send(channel, C.Channel.CloseOk())
        elif isinstance(value, C.Confirm.Select):
            self.confirming[channel] = 0
            if not value.nowait:
                self.send(channel, C.Confirm.SelectOk())
        elif isinstance(value, C.Basic.Qos):
            self.prefetch[channel] = value.prefetch_count
            self.send(channel, C.Basic.QosOk())
        elif isinstance(value, C.Queue.Declare):
            self.broker.waiting.setdefault(value.queue, deque())
            self.send(channel, C.Queue.DeclareOk(value.queue, len(self.broker.waiting[value.queue]), 0))
        elif isinstance(value, C.Queue.Delete):
            self.send(channel, C.Queue.DeleteOk(len(self.broker.waiting.pop(value.queue, ()))))
        elif isinstance(value, C.Basic.Consume):
            tag = value.consumer_tag or f"null-{next(self.broker.tags)}"
            consumer = _Consumer(channel, tag, value.queue, self.prefetch.get(channel, 0),
                                 self.delivery_tags.setdefault(channel, itertools.count(1)))
            self.consumers[tag] = consumer
            self.broker.consumers.setdefault(value.queue, []).append((consumer, self))
            self.send(channel, C.Basic.ConsumeOk(tag))
            self.broker.deliver(value.queue)
        elif isinstance(value, C.Basic.Cancel):
            self._drop(channel, value.consumer_tag)
            self.send(channel, C.Basic.CancelOk(value.consumer_tag))
        else:
            self.send(0, C.Connection.Close(540, f"NOT_IMPLEMENTED - null-amqp does not serve {value!r}"[:255]))
            self.flush()
            return True
        return False

    def _drop(self, channel: int, tag: str | None = None) -> None:
        for consumer in [c for c in self.consumers.values() if c.channel == channel and tag in (None, c.tag)]:
            del self.consumers[consumer.tag]
            self.broker.consumers[consumer.queue] = [
                (c, conn) for c, conn in self.broker.consumers.get(consumer.queue, []) if c is not consumer]

    def close(self) -> None:
        self.broker.dirty.discard(self)
        for channel in {c.channel for c in self.consumers.values()}:
            self._drop(channel)
        self.writer.close()


async def serve(port: int) -> None:
    broker = _Broker()

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Connection(broker, reader, writer)
        try:
            await conn.serve()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            conn.close()

    server = await asyncio.start_server(connected, "127.0.0.1", port)
    print(f"listening on {port}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0].isdigit():
        print("usage: python -m broker.tools.bench.null_amqp PORT", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(int(argv[0])))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
