"""The AMQP channel methods an :class:`~broker.amqp.session.AmqpSession` serves, each as the
node's own request (broker.sessions.messaging, broker.sessions.exchanges).

=========================  ============================================================
AMQP                       the node's request
=========================  ============================================================
queue.declare              ``Declare`` (``x-message-ttl``, ``x-expires``, ``x-max-length``,
                           ``x-overflow``, ``x-queue-type``, ``x-dead-letter-exchange`` and
                           ``-routing-key``); passive: the catalogue's queue (broker.amqp.declares)
queue.delete / purge       ``Delete`` / ``Purge``
queue.bind / unbind        ``Bind`` / ``Unbind`` (queue destination)
exchange.declare / delete  ``DeclareExchange`` (``alternate-exchange``) / ``DeleteExchange``
exchange.bind / unbind     ``Bind`` / ``Unbind`` (exchange destination)
basic.publish              ``Publish`` to the queue (default exchange) or the exchange, a run
                           of them as one (:mod:`broker.amqp.publishing`)
basic.consume / cancel     ``Subscribe`` (``exclusive``) / ``Cancel``; ``no_ack``: acked as delivered;
                           on a stream, a reader from ``x-stream-offset`` (:mod:`broker.amqp.streams`)
basic.get                  ``Get``
basic.ack / nack / reject  ``Ack`` / ``Nack`` (requeue) / ``Nack`` without requeue
basic.recover              ``Nack`` of every delivery the channel holds, requeued
basic.qos                  the prefetch of the channel's later consumers; ``global``: a limit
                           the channel's consumers share (deliveries beyond it wait here)
confirm.select             each publish acked once stored by the node's policy (or nacked)
tx.select / commit /       the node's transactions (:mod:`broker.amqp.transactions`):
rollback                   ``TxInit``, ``Publish.tx``, ``Ack.tx``, ``TxEnd``
=========================  ============================================================

Not served, refused with 540 ``NOT_IMPLEMENTED`` (never accepted silently):
``channel.flow`` with active false, ``basic.recover-async``, ``basic.qos`` with a
``prefetch_size``, exclusive consumers of a stream and internal exchanges
(broker.amqp.declares).
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Callable, Coroutine
from typing import Any, Literal, Protocol

from pamqp import commands as C
from pamqp.base import Frame as AmqpMethod

from broker.amqp import codes
from broker.amqp.channel import Channel, ChannelConsumer, TxSettle
from broker.amqp.declares import Declares, DeclaringNode
from broker.amqp.properties import from_headers, route_of
from broker.amqp.publishing import Publishing
from broker.amqp.streams import StreamConsumers, StreamHost, start_of
from broker.amqp.transactions import AmqpTransactions, TxHost, TxNode
from broker.amqp.wire import AmqpWire, ReplyCode
from client.errors import ErrorCode, TandemError
from client.protocol.frames import (Ack, Cancel, Deliver, Delivery, Error, Frame, Get, GetOk, Nack, Subscribe,
                                    SubscribeOk)

Reply = Callable[[Frame], None]


class Node(TxNode, DeclaringNode, Protocol):
    pass


class AmqpHost(TxHost, StreamHost, Protocol):
    """The AMQP session as its methods see it (broker.amqp.session.AmqpSession)."""

    @property
    def node(self) -> Node: ...

    channels: dict[int, Channel]
    consumer_channel: dict[int, int]
    temporary: set[str]
    wire: AmqpWire
    client_name: str

    def method(self, channel: int, m: AmqpMethod) -> None: ...

    def write(self, data: bytes) -> None: ...

    async def request(self, make: Callable[[int], Frame], reply: Reply) -> None: ...

    def spawn(self, make: Callable[[int], Frame], reply: Reply | None = None) -> None: ...

    def task(self, coro: Coroutine[Any, Any, None]) -> None: ...

    def close_amqp(self, reply_code: int, text: str, class_id: int = 0, method_id: int = 0) -> None: ...

    def close_channel(self, number: int, reply_code: int, text: str, class_id: int = 0, method_id: int = 0) -> None: ...

class Methods:
    def __init__(self, s: AmqpHost) -> None:
        self.s = s
        self.tx = AmqpTransactions(s)
        self.publish = Publishing(s, self.fail).publish
        self.streams = StreamConsumers(s)
        self.declares = d = Declares(s, self.fail, self.refuse)
        self._stream_ids = itertools.count(-1, -1)  # (a stream's consumers: no consumer id of the node's)
        self.table: dict[type, Any] = {
            C.Channel.Open: self.channel_open, C.Channel.Close: self.channel_close,
            C.Channel.CloseOk: self.channel_close_ok, C.Channel.Flow: self.flow,
            C.Queue.Declare: d.queue_declare, C.Queue.Delete: d.queue_delete, C.Queue.Purge: d.queue_purge,
            C.Queue.Bind: d.queue_bind, C.Queue.Unbind: d.queue_bind,
            C.Exchange.Declare: d.exchange_declare, C.Exchange.Delete: d.exchange_delete,
            C.Exchange.Bind: d.exchange_bind, C.Exchange.Unbind: d.exchange_bind,
            C.Basic.Qos: self.qos, C.Basic.Consume: self.consume, C.Basic.Cancel: self.cancel,
            C.Basic.Get: self.get, C.Basic.Ack: self.ack, C.Basic.Nack: self.nack, C.Basic.Reject: self.nack,
            C.Basic.Recover: self.recover, C.Confirm.Select: self.confirm_select,
            C.Tx.Select: self.tx.select, C.Tx.Commit: self.tx.commit, C.Tx.Rollback: self.tx.rollback,
        }

    # -- dispatch -------------------------------------------------------------------------------

    async def channel_method(self, number: int, m: AmqpMethod) -> None:
        ch = self.s.channels.get(number)
        if isinstance(m, C.Channel.Open):
            if ch is not None:
                self.s.close_amqp(ReplyCode.CHANNEL_ERROR, f"CHANNEL_ERROR - channel {number} is open already",
                                  *codes.ids(m))
                return
            await self.channel_open(number)
            return
        if ch is None:
            self.s.close_amqp(ReplyCode.CHANNEL_ERROR, f"CHANNEL_ERROR - channel {number} is not open", *codes.ids(m))
            return
        if ch.closing and not isinstance(m, (C.Channel.Close, C.Channel.CloseOk)):
            return  # (after channel.close, everything but its answer is dropped)
        handler = self.table.get(type(m))
        if handler is None:
            self.s.close_channel(number, ReplyCode.NOT_IMPLEMENTED,
                                 f"NOT_IMPLEMENTED - {m.name} is not served by this node", *codes.ids(m))
            return
        await handler(ch, m)

    def fail(self, ch: Channel, m: AmqpMethod, f: Frame) -> None:
        """The node refused ``m``: its channel closes with the code a client expects."""
        if isinstance(f, Error):
            code = codes.of(f.code)
            self.s.close_channel(ch.number, code, codes.text(code, f.message), *codes.ids(m))
        else:
            self.s.close_channel(ch.number, ReplyCode.INTERNAL_ERROR,
                                 f"INTERNAL_ERROR - {type(f).__name__} in reply to {m.name}", *codes.ids(m))

    def refuse(self, ch: Channel, m: AmqpMethod, code: int, why: str) -> None:
        self.s.close_channel(ch.number, code, codes.text(code, why), *codes.ids(m))

    # -- channels -------------------------------------------------------------------------------

    async def channel_open(self, number: int, _m: Any = None) -> None:
        if not 0 < number <= 2047:
            self.s.close_amqp(ReplyCode.CHANNEL_ERROR, f"CHANNEL_ERROR - channel {number} is out of range")
            return
        self.s.channels[number] = Channel(number)
        self.s.method(number, C.Channel.OpenOk())

    async def channel_close(self, ch: Channel, _m: C.Channel.Close) -> None:
        self.drop_channel(ch)
        self.s.channels.pop(ch.number, None)
        self.s.method(ch.number, C.Channel.CloseOk())

    async def channel_close_ok(self, ch: Channel, _m: C.Channel.CloseOk) -> None:
        self.s.channels.pop(ch.number, None)

    def drop_channel(self, ch: Channel) -> None:
        """A channel's end: its consumers cancelled, what it holds ready again."""
        for cid, c in list(ch.consumers.items()):
            del ch.consumers[cid]
            if c.stream is not None:
                c.stream.stop()
                continue
            self.s.consumer_channel.pop(cid, None)
            self.s.spawn(lambda rid, cid=cid: Cancel(rid=rid, consumer=cid),  # type: ignore[misc]
                         lambda _f, q=c.queue: self.s.task(self.declares.unused(q)))  # type: ignore[misc]
        ch.stream_tags.clear()
        self.tx.abort(ch)
        held = list(ch.unsettled()) + [t.session_tag for t in ch.tx_settles]
        unseen = [d.tag for _c, d in ch.waiting]
        ch.tags.clear()
        ch.tx_settles.clear()
        ch.waiting.clear()
        if held:
            self.s.spawn(lambda rid: Nack(rid=rid, tags=held, requeue=True, delivered=True))
        if unseen:
            self.s.spawn(lambda rid: Nack(rid=rid, tags=unseen, requeue=True))

    async def flow(self, ch: Channel, m: C.Channel.Flow) -> None:
        if not m.active:
            self.refuse(ch, m, ReplyCode.NOT_IMPLEMENTED, "channel.flow with active=false")
            return
        self.s.method(ch.number, C.Channel.FlowOk(active=True))

    async def confirm_select(self, ch: Channel, m: C.Confirm.Select) -> None:
        if ch.tx:
            self.refuse(ch, m, ReplyCode.PRECONDITION_FAILED, "cannot switch from tx to confirm mode")
            return
        ch.confirming = True
        if not m.nowait:
            self.s.method(ch.number, C.Confirm.SelectOk())

    # -- consuming ------------------------------------------------------------------------------

    async def qos(self, ch: Channel, m: C.Basic.Qos) -> None:
        if m.prefetch_size:
            self.refuse(ch, m, ReplyCode.NOT_IMPLEMENTED, "basic.qos with a prefetch_size")
            return
        if m.global_:  # (RabbitMQ's reading, per_consumer_qos: a limit the channel's consumers share)
            ch.shared_prefetch = m.prefetch_count
        else:
            ch.prefetch = m.prefetch_count
        self.s.method(ch.number, C.Basic.QosOk())
        self.release(ch)

    async def consume(self, ch: Channel, m: C.Basic.Consume) -> None:
        tag = m.consumer_tag or f"amq.ctag-{secrets.token_urlsafe(16)}"
        if ch.consumer_id(tag) is not None:
            self.s.close_amqp(ReplyCode.NOT_ALLOWED, f"NOT_ALLOWED - attempt to reuse consumer tag '{tag}'",
                              *codes.ids(m))
            return
        prefetch = ch.prefetch or self.s.node.config.max_prefetch
        try:
            q = self.s.node.catalogue.queue(m.queue)
        except TandemError:
            q = None  # (the node's Subscribe says why)
        if q is not None and q.stream:
            if m.exclusive:
                self.refuse(ch, m, ReplyCode.NOT_IMPLEMENTED, "exclusive consumers of a stream")
                return
            try:
                start = start_of((m.arguments or {}).get("x-stream-offset"))
            except ValueError as exc:
                self.refuse(ch, m, ReplyCode.PRECONDITION_FAILED, str(exc))
                return
            cid = next(self._stream_ids)
            c = ChannelConsumer(tag, m.queue, m.no_ack)
            refused = await self.streams.start(ch, cid, c, q.meta.partitions, start, ch.prefetch)
            if refused is not None:
                self.fail(ch, m, refused)
                return
            ch.consumers[cid] = c
            if not m.nowait:
                self.s.method(ch.number, C.Basic.ConsumeOk(consumer_tag=tag))
            return

        def reply(f: Frame) -> None:
            if not isinstance(f, SubscribeOk):
                self.fail(ch, m, f)
                return
            ch.consumers[f.consumer] = ChannelConsumer(tag, m.queue, m.no_ack)
            self.s.consumer_channel[f.consumer] = ch.number
            if not m.nowait:
                self.s.method(ch.number, C.Basic.ConsumeOk(consumer_tag=tag))

        await self.s.request(lambda rid: Subscribe(rid=rid, queue=m.queue, prefetch=prefetch,
                                                           exclusive=m.exclusive), reply)

    async def cancel(self, ch: Channel, m: C.Basic.Cancel) -> None:
        cid = ch.consumer_id(m.consumer_tag or "")
        c = ch.consumers.pop(cid, None) if cid is not None else None
        if cid is not None and c is not None and c.stream is not None:
            c.stream.stop()
        elif cid is not None:
            self.s.consumer_channel.pop(cid, None)
            self.release(ch)  # (what waited for it goes back)
            await self.s.request(lambda rid: Cancel(rid=rid, consumer=cid), lambda _f: None)
        if not m.nowait:
            self.s.method(ch.number, C.Basic.CancelOk(consumer_tag=m.consumer_tag))
        if c is not None and c.stream is None:
            self.s.task(self.declares.unused(c.queue))

    def delivered(self, frame: Deliver) -> None:
        """The node's deliveries to a consumer: ``basic.deliver`` each on its channel."""
        number = self.s.consumer_channel.get(frame.consumer)
        ch = self.s.channels.get(number) if number is not None else None
        c = ch.consumers.get(frame.consumer) if ch is not None else None
        if ch is None or c is None:  # (cancelled meanwhile: the node gives them back with the consumer)
            self.s.spawn(lambda rid: Nack(rid=rid, tags=[d.tag for d in frame.messages], requeue=True))
            return
        auto = []
        for d in frame.messages:
            if c.no_ack:
                auto.append(d.tag)
            elif ch.waiting or not ch.room():
                ch.waiting.append((frame.consumer, d))
                continue
            self._deliver(ch, c, d)
        if auto:
            self.s.spawn(lambda rid: Ack(rid=rid, tags=auto))

    def _deliver(self, ch: Channel, c: ChannelConsumer, d: Delivery) -> None:
        if c.no_ack:
            tag, ch.next_tag = ch.next_tag, ch.next_tag + 1
        else:
            tag = ch.deliver(d.tag)
        exchange, key = route_of(d.headers, c.queue)
        self.s.write(self.s.wire.content(ch.number, C.Basic.Deliver(consumer_tag=c.tag, delivery_tag=tag,
                                                                    redelivered=d.redelivered, exchange=exchange,
                                                                    routing_key=key),
                                         from_headers(d.headers), d.body))

    def release(self, ch: Channel) -> None:
        """Deliveries that waited for room under the channel's shared prefetch (basic.qos
        global), while there is room; those of a consumer cancelled meanwhile go back."""
        back = []
        while ch.waiting and ch.room():
            cid, d = ch.waiting.popleft()
            c = ch.consumers.get(cid)
            if c is None:
                back.append(d.tag)
            else:
                self._deliver(ch, c, d)
        if not ch.shared_prefetch:
            back += [d.tag for _c, d in ch.waiting]
            ch.waiting.clear()
        if back:
            self.s.spawn(lambda rid: Nack(rid=rid, tags=back, requeue=True))

    def cancelled(self, consumer: int) -> None:
        """The node cancelled a consumer (its queue deleted): ``basic.cancel`` to the client, an
        unexpected cancel (RabbitMQ's consumer_cancel_notify); for a queue this channel is
        deleting itself, after its delete-ok, as RabbitMQ sends it."""
        number = self.s.consumer_channel.pop(consumer, None)
        ch = self.s.channels.get(number) if number is not None else None
        c = ch.consumers.pop(consumer, None) if ch is not None else None
        if ch is not None and c is not None:
            if c.queue in ch.deleting:
                ch.cancelled_by_delete.append(c.tag)
            else:
                self.s.method(ch.number, C.Basic.Cancel(consumer_tag=c.tag, nowait=True))

    async def get(self, ch: Channel, m: C.Basic.Get) -> None:
        await ch.stored()  # (a get after a publish on the channel finds it, as in RabbitMQ)
        if ch.closing:
            return
        def reply(f: Frame) -> None:
            if not isinstance(f, GetOk):
                self.fail(ch, m, f)
                return
            d = f.message
            if d is None:
                self.s.method(ch.number, C.Basic.GetEmpty())
                return
            if m.no_ack:
                tag, ch.next_tag = ch.next_tag, ch.next_tag + 1
            else:
                tag = ch.deliver(d.tag)
            exchange, key = route_of(d.headers, m.queue)
            self.s.write(self.s.wire.content(ch.number, C.Basic.GetOk(delivery_tag=tag, redelivered=d.redelivered,
                                                                      exchange=exchange, routing_key=key,
                                                                      message_count=0),
                                             from_headers(d.headers), d.body))

        await self.s.request(lambda rid: Get(rid=rid, queue=m.queue, auto_ack=m.no_ack), reply)

    async def ack(self, ch: Channel, m: C.Basic.Ack) -> None:
        streamed = ch.settle_streams(m.delivery_tag or 0, m.multiple)  # (a stream's: room for its reader)
        if ch.tx:
            self._hold(ch, m, m.multiple, "ack", streamed)
            return
        tags = ch.settle(m.delivery_tag or 0, m.multiple)
        if not tags and not streamed and not (m.multiple and not m.delivery_tag):
            self.refuse(ch, m, ReplyCode.PRECONDITION_FAILED, f"unknown delivery tag {m.delivery_tag}")
            return
        if tags:
            self.release(ch)
            await self.s.request(lambda rid: Ack(rid=rid, tags=tags), lambda f: self._settled(ch, m, f))

    async def nack(self, ch: Channel, m: C.Basic.Nack | C.Basic.Reject) -> None:
        multiple = getattr(m, "multiple", False)
        streamed = ch.settle_streams(m.delivery_tag or 0, multiple)  # (a stream's message stays in it)
        if ch.tx:
            self._hold(ch, m, multiple, "requeue" if m.requeue else "reject", streamed)
            return
        tags = ch.settle(m.delivery_tag or 0, multiple)
        if not tags and not streamed and not (multiple and not m.delivery_tag):
            self.refuse(ch, m, ReplyCode.PRECONDITION_FAILED, f"unknown delivery tag {m.delivery_tag}")
            return
        if tags:
            self.release(ch)
            await self.s.request(lambda rid: Nack(rid=rid, tags=tags, requeue=m.requeue),
                                 lambda f: self._settled(ch, m, f))

    def _hold(self, ch: Channel, m: C.Basic.Ack | C.Basic.Nack | C.Basic.Reject, multiple: bool,
              kind: Literal["ack", "requeue", "reject"], streamed: int) -> None:
        """A settlement in tx mode: held by the channel until tx.commit (broker.amqp.transactions)."""
        tag = m.delivery_tag or 0
        done = [t for t in ch.tags if tag == 0 or t <= tag] if multiple else [tag] if tag in ch.tags else []
        if not done and not streamed and not (multiple and not tag):
            self.refuse(ch, m, ReplyCode.PRECONDITION_FAILED, f"unknown delivery tag {tag}")
            return
        ch.tx_settles.extend(TxSettle(t, ch.tags.pop(t), kind) for t in done)
        self.release(ch)

    def _settled(self, ch: Channel, m: AmqpMethod, f: Frame) -> None:
        if isinstance(f, Error) and f.code != ErrorCode.UNKNOWN_DELIVERY_TAG:
            self.fail(ch, m, f)

    async def recover(self, ch: Channel, m: C.Basic.Recover) -> None:
        held = ch.settle(0, True)
        if held:
            await self.s.request(lambda rid: Nack(rid=rid, tags=held, requeue=True), lambda _f: None)
        self.s.method(ch.number, C.Basic.RecoverOk())
        self.release(ch)
