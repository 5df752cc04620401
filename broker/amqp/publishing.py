"""``basic.publish`` on an AMQP session: a run of publishes is one request of the node.

The session hands over each run of ``basic.publish`` that came in one read, on one channel, to
one exchange and routing key (:func:`batches`); it becomes one ``Publish`` of the node (to the
queue for the default exchange, else to the exchange), so a pipelining client costs the node one
pass of the publish path per run, not per message.  A ``mandatory`` publish is a run of its own:
its ``basic.return`` names it.

In confirm mode each publish has its number on the channel; a run is acked once stored, with
one ``basic.ack`` (``multiple``) for every publish up to the last one answered in order, since
runs to different partitions are stored in any order (:meth:`Channel.settled`); a run the node
refused is nacked, each publish of it.  In tx mode a run is a prepared write of the channel's
transaction (broker.amqp.transactions).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from pamqp import commands as C
from pamqp.base import Frame as AmqpMethod

from broker.amqp.channel import Channel
from broker.amqp.properties import route_headers, to_headers
from broker.amqp.wire import AmqpWire, ReplyCode
from broker.amqp.wire import Publish as AmqpPublish
from client.errors import ErrorCode
from client.protocol.frames import Error, Frame, Publish, PublishMessage, PublishOk

log = logging.getLogger("tandem.broker")

Reply = Callable[[Frame], None]


class PublishHost(Protocol):
    channels: dict[int, Channel]
    wire: AmqpWire
    client_name: str

    def method(self, channel: int, m: AmqpMethod) -> None: ...

    def write(self, data: bytes) -> None: ...

    async def request(self, make: Callable[[int], Frame], reply: Reply) -> None: ...

    def close_amqp(self, reply_code: int, text: str, class_id: int = 0, method_id: int = 0) -> None: ...


#: the most messages one publish request of the node takes from a client's run of basic.publish
MAX_BATCH = 256


def batches(events: list[Any]) -> list[Any]:
    """The wire's events, with each run of ``basic.publish`` on one channel to one exchange and
    routing key (not ``mandatory``: its ``basic.return`` names one message) as one list."""
    out: list[Any] = []
    for e in events:
        if isinstance(e, AmqpPublish) and not e.method.mandatory and out and isinstance(out[-1], list) \
                and len(out[-1]) < MAX_BATCH:
            head = out[-1][0]
            if (head.channel, head.method.exchange, head.method.routing_key, head.method.mandatory) == \
                    (e.channel, e.method.exchange, e.method.routing_key, False):
                out[-1].append(e)
                continue
        out.append([e] if isinstance(e, AmqpPublish) else e)
    return out


class Publishing:
    def __init__(self, s: PublishHost, fail: Callable[[Channel, AmqpMethod, Frame], None]) -> None:
        """``fail``: the node refused a method: its channel closes (broker.amqp.methods)."""
        self.s, self.fail = s, fail

    async def publish(self, ps: list[AmqpPublish]) -> None:
        """Messages published in a row on one channel to one exchange and routing key (the session
        batches them: :func:`batches`): one request of the node, confirmed together."""
        p = ps[0]
        ch = self.s.channels.get(p.channel)
        if ch is None:
            self.s.close_amqp(ReplyCode.CHANNEL_ERROR, f"CHANNEL_ERROR - channel {p.channel} is not open")
            return
        if ch.closing:
            return
        m = p.method
        first = ch.published + 1
        if ch.confirming:
            ch.published += len(ps)
        exchange, key = m.exchange or "", m.routing_key or ""
        route = route_headers(exchange, key)
        msgs = [PublishMessage(None, to_headers(x.properties) | route, x.body, None) for x in ps]
        tx = ch.tx
        ch.publishing(+1)

        def returned() -> None:  # (a mandatory publish is a batch of one)
            self.s.write(self.s.wire.content(ch.number, C.Basic.Return(reply_code=ReplyCode.NO_ROUTE, reply_text="NO_ROUTE",
                                                                       exchange=exchange, routing_key=key),
                                             p.properties, p.body))

        def reply(f: Frame) -> None:
            ch.publishing(-1)
            if ch.closing:
                return
            if isinstance(f, PublishOk):
                if f.unroutable and m.mandatory:
                    returned()
            elif isinstance(f, Error) and f.code in (ErrorCode.NO_ROUTE, ErrorCode.QUEUE_NOT_FOUND) and \
                    (f.code == ErrorCode.NO_ROUTE or not exchange):
                if m.mandatory:  # (no queue by that name on the default exchange: unroutable, as in RabbitMQ)
                    returned()
            elif isinstance(f, Error) and f.code in (ErrorCode.EXCHANGE_NOT_FOUND, ErrorCode.ACCESS_REFUSED):
                self.fail(ch, m, f)
                return
            elif isinstance(f, Error):
                log.info("session %s: publish to %s refused: %s", self.s.client_name, exchange or key, f.message)
                if not ch.confirming:
                    self.fail(ch, m, f)
                    return
                for tag in range(first, first + len(ps)):
                    self.s.method(ch.number, C.Basic.Nack(delivery_tag=tag))
                self._confirm(ch, first, first + len(ps) - 1, stored=False)
                return
            if ch.confirming:
                self._confirm(ch, first, first + len(ps) - 1, stored=True)

        if exchange or tx:  # (in a transaction the default exchange too: a queue by that name or none)
            await self.s.request(lambda rid: Publish(rid=rid, queue="", messages=msgs, exchange=exchange,
                                                     routing_key=key, mandatory=m.mandatory, tx=tx), reply)
        else:
            await self.s.request(lambda rid: Publish(rid=rid, queue=key, messages=msgs), reply)

    def _confirm(self, ch: Channel, first: int, last: int, *, stored: bool) -> None:
        """Publishes ``first``..``last`` are stored (or were nacked): ``basic.ack`` for every
        publish up to the last one answered in order (this batch, and any stored before it that
        waited for an earlier one)."""
        before = ch.acked
        top = ch.settled(first, last, stored=stored)
        if top:
            self.s.method(ch.number, C.Basic.Ack(delivery_tag=top, multiple=top > before + 1))
