"""The AMQP queue and exchange methods, each as the node's own request
(broker.sessions.messaging, broker.sessions.exchanges): queue.declare, delete, purge, bind and
unbind; exchange.declare, delete, bind and unbind.

Names starting ``amq.`` are the broker's, as in RabbitMQ: a queue or exchange by such a name is
declared passively only (403 ``ACCESS_REFUSED`` otherwise), and the server names its queues
``amq.gen-...``.  An internal exchange is not served (540 ``NOT_IMPLEMENTED``).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from typing import Any, Protocol

from pamqp import commands as C
from pamqp.base import Frame as AmqpMethod

from broker.amqp import codes
from broker.amqp.channel import Channel
from broker.amqp.wire import ReplyCode
from broker.messaging.queues import Queue
from client.errors import ErrorCode, TandemError
from client.protocol.frames import (Bind, Declare, DeclareExchange, DeclareExchangeOk, DeclareOk, Delete,
                                    DeleteExchange, Error, Exchanges, Frame, ListExchanges, Purge, PurgeOk, Unbind)

#: queue.declare arguments the node takes, and the Declare field each sets
QUEUE_ARGS = {"x-message-ttl": "message_ttl", "x-expires": "expires", "x-max-length": "max_length",
              "x-max-length-bytes": "max_length_bytes", "x-overflow": "overflow", "x-queue-type": "type"}
QUEUE_TYPES = {"classic": "classic", "quorum": "classic", "stream": "stream"}



log = logging.getLogger("tandem.broker")

Reply = Callable[[Frame], None]

#: the prefix of the broker's own names
RESERVED = "amq."
#: what an unbind may meet and still answer unbind-ok: what it would remove is gone already
GONE = (ErrorCode.QUEUE_NOT_FOUND, ErrorCode.EXCHANGE_NOT_FOUND)


class QueueLookup(Protocol):
    def queue(self, name: str) -> Queue: ...

    async def delete(self, name: str, if_empty: bool, hops: int = 0, ready_only: bool = False) -> None: ...


class DeclaringNode(Protocol):
    @property
    def catalogue(self) -> QueueLookup: ...

    async def served(self, queue: str) -> None:
        """Until each partition of ``queue`` has an active (at most the election wait)."""
        ...


class DeclaresHost(Protocol):
    """The AMQP session as these methods see it (broker.amqp.session.AmqpSession)."""

    @property
    def node(self) -> DeclaringNode: ...

    temporary: set[str]

    def method(self, channel: int, m: AmqpMethod) -> None: ...

    async def request(self, make: Callable[[int], Frame], reply: Reply) -> None: ...


class Declares:
    """The queue and exchange methods of an AMQP session ``s``."""

    def __init__(self, s: DeclaresHost, fail: Callable[[Channel, AmqpMethod, Frame], None],
                 refuse: Callable[[Channel, AmqpMethod, int, str], None]) -> None:
        self.s, self.fail, self.refuse = s, fail, refuse

    async def queue_declare(self, ch: Channel, m: C.Queue.Declare) -> None:
        await ch.stored()  # (its message count holds what the channel published before)
        if ch.closing:
            return
        name = m.queue or f"amq.gen-{secrets.token_urlsafe(16)}"
        if m.queue.startswith(RESERVED) and not m.passive:
            self.refuse(ch, m, ReplyCode.ACCESS_REFUSED, f"queue name '{m.queue}' contains reserved prefix 'amq.*'")
            return
        if m.passive:
            try:
                info = self.s.node.catalogue.queue(name).info()
            except TandemError as exc:
                self.refuse(ch, m, codes.of(int(exc.code)), f"no queue '{name}' in vhost '/'")
                return
            if not m.nowait:
                self.s.method(ch.number, C.Queue.DeclareOk(queue=name, message_count=info.ready,
                                                            consumer_count=info.consumers))
            return
        fields: dict[str, Any] = {}
        args = dict(m.arguments or {})
        if "x-dead-letter-exchange" in args or "x-dead-letter-routing-key" in args:
            dlx, dlk = args.pop("x-dead-letter-exchange", None), args.pop("x-dead-letter-routing-key", None)
            if not isinstance(dlx, str) or (dlk is not None and not isinstance(dlk, str)):
                self.refuse(ch, m, ReplyCode.PRECONDITION_FAILED,
                            "x-dead-letter-exchange (and x-dead-letter-routing-key) must be text")
                return
            if dlx:
                fields["dead_letter_exchange"], fields["dead_letter_routing_key"] = dlx, dlk
            elif dlk:  # (the default exchange: the queue the routing key names)
                fields["dead_letter_queue"] = dlk
            else:
                self.refuse(ch, m, ReplyCode.PRECONDITION_FAILED,
                            "x-dead-letter-exchange '' (the default exchange) needs x-dead-letter-routing-key: "
                            "the queue its dead letters go to")
                return
        for arg, value in args.items():
            field = QUEUE_ARGS.get(arg)
            if field is None:
                self.refuse(ch, m, ReplyCode.PRECONDITION_FAILED, f"queue argument '{arg}' is not supported")
                return
            if field == "type":
                kind = QUEUE_TYPES.get(str(value), "")
                if not kind:
                    self.refuse(ch, m, ReplyCode.PRECONDITION_FAILED, f"x-queue-type {value!r}: classic, quorum or stream")
                    return
                value = kind
            elif field != "overflow" and (isinstance(value, bool) or not isinstance(value, int)):
                self.refuse(ch, m, ReplyCode.PRECONDITION_FAILED, f"queue argument '{arg}' must be an integer")
                return
            fields[field] = value

        answer: list[Frame] = []
        await self.s.request(lambda rid: Declare(rid=rid, queue=name, **fields), answer.append)
        f = answer[0] if answer else None
        if not isinstance(f, DeclareOk):
            if f is not None:
                self.fail(ch, m, f)
            return
        if m.exclusive:
            self.s.temporary.add(name)
        if m.auto_delete:
            try:
                self.s.node.catalogue.queue(name).auto_delete = True
            except TandemError:
                pass  # (deleted meanwhile)
        if f.created:  # (declare-ok once it can be used at once, as in RabbitMQ: its first election)
            await self.s.node.served(name)
        if not m.nowait and not ch.closing:
            self.s.method(ch.number, C.Queue.DeclareOk(queue=name, message_count=f.queue.ready,
                                                        consumer_count=f.queue.consumers))

    async def queue_delete(self, ch: Channel, m: C.Queue.Delete) -> None:
        await ch.stored()  # (what the channel published before counts)
        if ch.closing:
            return
        try:
            info = self.s.node.catalogue.queue(m.queue).info()
        except TandemError:
            if not m.nowait:  # (a queue that is not there: deleted, as RabbitMQ answers)
                self.s.method(ch.number, C.Queue.DeleteOk(message_count=0))
            return
        if m.if_unused and info.consumers:
            self.refuse(ch, m, ReplyCode.PRECONDITION_FAILED, f"queue '{m.queue}' in vhost '/' in use")
            return

        def reply(f: Frame) -> None:
            if isinstance(f, Error) and f.code != ErrorCode.QUEUE_NOT_FOUND:
                self.fail(ch, m, f)
            elif not m.nowait:
                self.s.method(ch.number, C.Queue.DeleteOk(message_count=info.ready))

        self.s.temporary.discard(m.queue)
        ch.deleting.add(m.queue)
        try:
            await self.s.request(lambda rid: Delete(rid=rid, queue=m.queue, if_empty=m.if_empty, ready_only=True), reply)
        finally:
            ch.deleting.discard(m.queue)
            for tag in ch.cancelled_by_delete:  # (after delete-ok, as RabbitMQ sends them)
                self.s.method(ch.number, C.Basic.Cancel(consumer_tag=tag, nowait=True))
            ch.cancelled_by_delete.clear()

    async def unused(self, name: str, leaving: object = None) -> None:
        """A consumer of ``name`` on this connection ended: an auto-delete queue with no consumer
        left (``leaving``: a session whose consumers are going, not counted) is deleted, as
        RabbitMQ deletes one when its last consumer goes."""
        try:
            q = self.s.node.catalogue.queue(name)
        except TandemError:
            return
        if not q.auto_delete or any(c.session is not leaving for c in q.consumers):
            return
        try:
            await self.s.node.catalogue.delete(name, False)
        except TandemError as exc:
            log.info("auto-delete queue %s left: %s", name, exc.message)
            return
        log.info("auto-delete queue %s deleted: its last consumer went", name)

    async def queue_purge(self, ch: Channel, m: C.Queue.Purge) -> None:
        await ch.stored()  # (what the channel published before counts)
        if ch.closing:
            return
        def reply(f: Frame) -> None:
            if not isinstance(f, PurgeOk):
                self.fail(ch, m, f)
            elif not m.nowait:
                self.s.method(ch.number, C.Queue.PurgeOk(message_count=f.purged))

        await self.s.request(lambda rid: Purge(rid=rid, queue=m.queue), reply)

    async def queue_bind(self, ch: Channel, m: C.Queue.Bind | C.Queue.Unbind) -> None:
        if not m.exchange:
            self.refuse(ch, m, ReplyCode.ACCESS_REFUSED, "operation not permitted on the default exchange")
            return
        bind = isinstance(m, C.Queue.Bind)
        kind = Bind if bind else Unbind
        args = {str(k): str(v) for k, v in (m.arguments or {}).items()}

        def reply(f: Frame) -> None:
            if isinstance(f, Error) and (bind or f.code not in GONE):
                self.fail(ch, m, f)
            elif bind and not getattr(m, "nowait", False):
                self.s.method(ch.number, C.Queue.BindOk())
            elif not bind:  # (an unbind from a queue or exchange gone: unbind-ok, as RabbitMQ answers)
                self.s.method(ch.number, C.Queue.UnbindOk())

        await self.s.request(lambda rid: kind(rid=rid, source=m.exchange, destination=m.queue,
                                              routing_key=m.routing_key or "", arguments=args), reply)

    async def exchange_declare(self, ch: Channel, m: C.Exchange.Declare) -> None:
        if m.passive:
            def found(f: Frame) -> None:
                if not isinstance(f, Exchanges):
                    self.fail(ch, m, f)
                elif m.exchange not in {e.name for e in f.exchanges}:
                    self.refuse(ch, m, ReplyCode.NOT_FOUND, f"no exchange '{m.exchange}' in vhost '/'")
                elif not m.nowait:
                    self.s.method(ch.number, C.Exchange.DeclareOk())

            await self.s.request(lambda rid: ListExchanges(rid=rid), found)
            return
        if m.exchange.startswith(RESERVED):
            self.refuse(ch, m, ReplyCode.ACCESS_REFUSED, f"exchange name '{m.exchange}' contains reserved prefix "
                                                         f"'amq.*'")
            return
        if m.internal:
            self.refuse(ch, m, ReplyCode.NOT_IMPLEMENTED, "internal exchanges")
            return
        alternate = (m.arguments or {}).get("alternate-exchange")

        def reply(f: Frame) -> None:
            if not isinstance(f, DeclareExchangeOk):
                self.fail(ch, m, f)
            elif not m.nowait:
                self.s.method(ch.number, C.Exchange.DeclareOk())

        await self.s.request(lambda rid: DeclareExchange(rid=rid, exchange=m.exchange, type=m.exchange_type,
                                                         alternate=str(alternate) if alternate else None), reply)

    async def exchange_delete(self, ch: Channel, m: C.Exchange.Delete) -> None:
        def reply(f: Frame) -> None:
            if isinstance(f, Error) and f.code != ErrorCode.EXCHANGE_NOT_FOUND:
                self.fail(ch, m, f)
            elif not m.nowait:
                self.s.method(ch.number, C.Exchange.DeleteOk())

        await self.s.request(lambda rid: DeleteExchange(rid=rid, exchange=m.exchange, if_unused=m.if_unused), reply)

    async def exchange_bind(self, ch: Channel, m: C.Exchange.Bind | C.Exchange.Unbind) -> None:
        bind = isinstance(m, C.Exchange.Bind)
        kind = Bind if bind else Unbind
        args = {str(k): str(v) for k, v in (m.arguments or {}).items()}

        def reply(f: Frame) -> None:
            if isinstance(f, Error) and (bind or f.code not in GONE):
                self.fail(ch, m, f)
            elif not m.nowait:
                self.s.method(ch.number, C.Exchange.BindOk() if bind else C.Exchange.UnbindOk())

        await self.s.request(lambda rid: kind(rid=rid, source=m.source, destination=m.destination, to_exchange=True,
                                              routing_key=m.routing_key or "", arguments=args), reply)
