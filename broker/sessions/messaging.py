"""A client session's messaging requests: queues, publish, consumers and their deliveries, stream reads.

Publishes and acks do not block the session's read loop: their replies are written when the
store confirms, so a client may pipeline many batches.  Queue administration (declare, delete,
purge) and stream reads are awaited in order.  A request on a queue needs a permission on it
(broker.security.acl), and one that changes state the node's quorum too; cancels and
settlements act on the connection's own consumers and delivery tags.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Protocol

from broker.config import NodeConfig
from broker.messaging.catalogue import TX_ROUTED_LEVEL, Catalogue
from broker.messaging import delivery as _delivery
from broker.messaging.publish import Publisher, PublishRequest, PublishResult
from broker.messaging.message import Msg
from broker.messaging.message import REGISTER
from broker.messaging.queues import Consumer, Queue, Recipient
from broker.messaging.offsets import fetch_offset, store_offset
from broker.sessions.transactions import check_tx
from broker.transactions.service import Transactions
from broker.messaging.streams import StreamHost, produced, read_stream
from broker.partitions.quarantine import refuse_client_write
from broker.security.acl import AclTable
from broker.messaging.routed import Router, RoutedRequest
from broker.partitions.topology import Topology
from broker.sessions.exchanges import Exchanges
from broker.sessions.relay import Relays
from broker.sessions.requests import Handler, error_frame
from client.errors import (ConsumerNotFoundError, ErrorCode, InvalidArgumentError, StorageError, TandemError,
                           UnknownDeliveryTagError)
from client.protocol.frames import (Ack, Cancel, Declare, DeclareOk, Delete, Delivery, Error, FetchOffset, Frame, Get,
                                    GetOk, ListQueues, Nack, OffsetOk, Ok, Produced, Publish, PublishOk, Purge, PurgeOk,
                                    Queues, Read, ReadOk, Reject, StoreOffset, Subscribe, SubscribeOk)
from storage.base import UserRecord, WriteOp

log = logging.getLogger("tandem.broker")


class Consuming(Recipient, Protocol):
    """A client session as its messaging requests see it: the consumer of deliveries it is
    (broker.messaging.queues.Recipient), and how it answers."""

    def send(self, frame: Frame) -> None: ...

    def send_in_order(self, frame: Frame) -> None:
        """Send now, unless frames waiting on a commit must go first."""
        ...

    def send_after(self, ops: list[WriteOp], frame: Frame, on_commit: Callable[[], None],
                   on_fail: Callable[[BaseException], Frame | None]) -> None:
        """Send ``frame`` once ``ops`` are committed, in order; ``on_fail(err)`` says what goes
        in its place if they fail (None: nothing)."""
        ...

    def tag(self, c: Consumer, m: Msg) -> Delivery:
        """``m`` delivered to ``c`` under this connection's next delivery tag, held until settled."""
        ...

    def new_tag(self) -> int:
        """This connection's next delivery tag."""
        ...

    #: the transactions it wrote in and did not end -> the partitions (broker.sessions.transactions)
    txs: dict[str, set[tuple[str, int]]]


class MessagingHost(Protocol):
    """What the messaging requests use of their node: its queues and who may use them."""

    @property
    def config(self) -> NodeConfig: ...

    @property
    def catalogue(self) -> Catalogue: ...  # (a shared-mode node makes it anew when it takes the lock)

    @property
    def acls(self) -> AclTable: ...

    def require_quorum(self, what: str) -> None: ...


class Messaging:
    """The handlers of the messaging requests: queues through the node's catalogue, publishes
    through ``publisher``, consumers and settlements through ``delivery`` (and ``relays`` for the
    partitions active on other members: broker.sessions.relay), stream reads through ``streams``
    (broker.messaging.streams)."""

    def __init__(self, node: MessagingHost, *, streams: StreamHost, delivery: _delivery.Delivery,
                 publisher: Publisher, relays: Relays, router: Router, topology: Topology,
                 transactions: Transactions) -> None:
        self.node, self.streams, self.delivery, self.publisher = node, streams, delivery, publisher
        self.relays, self.router, self.transactions = relays, router, transactions
        self.exchanges = Exchanges(node, topology)

    def handlers(self) -> Mapping[type[Frame], Handler[Consuming]]:
        return {Declare: self.declare, Delete: self.delete, Purge: self.purge, ListQueues: self.list_queues,
                Publish: self.publish, Subscribe: self.subscribe, Cancel: self.cancel, Get: self.get,
                Ack: self.ack, Nack: self.nack, Reject: self.reject, Read: self.read, Produced: self.produced,
                StoreOffset: self.store_offset, FetchOffset: self.fetch_offset,
                **self.exchanges.handlers()}

    def _may(self, user: UserRecord, permission: str, queue: str, what: str | None = None) -> None:
        """The user must hold ``permission`` on ``queue`` (broker.security.acl); a request that changes
        state (``what``) also needs the node's quorum."""
        self.node.acls.check(user, permission, queue)
        if what is not None:
            self.node.require_quorum(what)

    # -- queues -------------------------------------------------------------------------------------

    async def declare(self, s: Consuming, user: UserRecord, f: Declare) -> None:
        self._may(user, "configure", f.queue, "declare queues")
        self.node.acls.check_declare(user, f.queue, f.dead_letter_queue, f.dead_letter_exchange)
        info, created = await self.node.catalogue.declare(f, owner=user.name)
        s.send(DeclareOk(rid=f.rid, queue=info, created=created))

    async def delete(self, s: Consuming, user: UserRecord, f: Delete) -> None:
        self._may(user, "configure", f.queue, "delete queues")
        await self.node.catalogue.delete(f.queue, f.if_empty, ready_only=f.ready_only)
        s.send(Ok(rid=f.rid))

    async def purge(self, s: Consuming, user: UserRecord, f: Purge) -> None:
        self._may(user, "configure", f.queue, "purge queues")
        _not_a_stream(self.node.catalogue.queue(f.queue), "purged (its retention, max_age and max_bytes, "
                                                          "drops old messages)")
        s.send(PurgeOk(rid=f.rid, purged=await self.node.catalogue.purge(f.queue)))

    async def list_queues(self, s: Consuming, user: UserRecord, f: ListQueues) -> None:
        acls = self.node.acls
        s.send(Queues(rid=f.rid, queues=[q.info() for q in self.node.catalogue.queues.values()
                                         if acls.may_see(user, q.name)]))

    # -- publish --------------------------------------------------------------------------------------

    async def publish(self, s: Consuming, user: UserRecord, f: Publish) -> None:
        if f.producer_id is not None and f.producer_id.startswith(REGISTER):
            raise InvalidArgumentError(f"producer_id {f.producer_id!r}: ids starting {REGISTER!r} are the broker's "
                                       f"(a stream's named consumers)")
        written = check_tx(s, user, f.tx) if f.tx else None
        if f.exchange is not None:
            if written is not None:
                self.node.catalogue.require_level(TX_ROUTED_LEVEL, "transactional publishes through exchanges need")
            if f.exchange:
                self._may(user, "produce", f.exchange, "publish")
            for queue in {f.routing_key, *f.routing_keys} if not f.exchange else ():
                # the default exchange: each message to the queue its routing key names
                self._may(user, "produce", queue, "publish")
                refuse_client_write(queue, "publish")
            parts = self.router.publish_to(RoutedRequest(f.exchange, f.routing_key, f.producer_id, f.messages,
                                                         f.mandatory, f.routing_keys, f.tx),
                                           _PublishReply(s, f.rid, self.publisher))
            if written is not None:
                written.update(parts)  # (before any await: the link's end aborts what it wrote)
            return
        if written is not None:
            written.add((f.queue, -1 if f.partition is None else f.partition))
        self._may(user, "produce", f.queue, "publish")
        refuse_client_write(f.queue, "publish")
        self.publisher.publish_to(PublishRequest(f.queue, f.producer_id, f.messages, partition=f.partition,
                                                 dense=f.partition is not None, tx=f.tx),
                                  _PublishReply(s, f.rid, self.publisher))

    # -- consumers and deliveries ---------------------------------------------------------------------

    async def subscribe(self, s: Consuming, user: UserRecord, f: Subscribe) -> None:
        self._may(user, "consume", f.queue, "consume")
        _not_a_stream(self.node.catalogue.queue(f.queue), "consumed")
        c = self.delivery.add_consumer(s, f.queue, f.prefetch, f.exclusive)
        s.consumers[c.id] = c
        s.send(SubscribeOk(rid=f.rid, consumer=c.id))
        if not f.local:
            self.relays.subscribe(s, c)  # (after the reply: the client knows the consumer before its deliveries)

    async def cancel(self, s: Consuming, user: UserRecord, f: Cancel) -> None:
        c = s.consumers.pop(f.consumer, None)
        if c is None:
            raise ConsumerNotFoundError(f"no consumer {f.consumer} on this connection")
        self.delivery.remove_consumer(c)
        self.relays.cancel(s, c.id)
        s.send_in_order(Ok(rid=f.rid))  # after any delivery still waiting on a commit

    async def get(self, s: Consuming, user: UserRecord, f: Get) -> None:
        self._may(user, "consume", f.queue, "get")
        q = self.node.catalogue.queue(f.queue)
        _not_a_stream(q, "consumed")
        q.touch()
        msgs = self.delivery.take_live(q, 1, self.node.config.max_frame_size)
        if not msgs:
            s.send_in_order(GetOk(rid=f.rid, message=await self.relays.get(s, q, f.auto_ack)))
            return
        delivery = self.delivery
        d, marks, marked = delivery.hold_got(s, q, msgs[0])
        if f.auto_ack:
            delivery.ack([s.deliveries.pop(d.tag)])
        if marks:
            def failed(err: BaseException) -> Frame:
                delivery.undeliver(s, [d.tag])
                return error_frame(f.rid, err if isinstance(err, TandemError) else StorageError(f"get: {err}"))

            s.send_after(marks, GetOk(rid=f.rid, message=d), marked, failed)
        else:
            s.send_in_order(GetOk(rid=f.rid, message=d))

    async def ack(self, s: Consuming, user: UserRecord, f: Ack) -> None:
        if f.tx:
            await self._ack_in(s, user, f)
            return
        settled, unknown = self._settle(s, f.tags, f.multiple, "ack")
        self.delivery.ack(settled)
        _settled(s, f.rid, unknown)

    async def nack(self, s: Consuming, user: UserRecord, f: Nack) -> None:
        settled, unknown = self._settle(s, f.tags, f.multiple,
                                        "reject" if not f.requeue else "requeue" if f.delivered else "unseen")
        if f.requeue:
            self.delivery.requeue(settled, counted=f.delivered)
        else:
            self.delivery.dead_letter(settled, "rejected")
        _settled(s, f.rid, unknown)

    async def reject(self, s: Consuming, user: UserRecord, f: Reject) -> None:
        settled, unknown = self._settle(s, f.tags, f.multiple, "reject")
        self.delivery.dead_letter(settled, "rejected")
        _settled(s, f.rid, unknown)

    async def _ack_in(self, s: Consuming, user: UserRecord, f: Ack) -> None:
        """Acks in a transaction: the deliveries are held by it (broker.transactions.participant)."""
        parts = check_tx(s, user, f.tx)
        relayed = self.relays.held(s)
        if relayed and (f.multiple or relayed.intersection(f.tags)):
            # (held by the members that delivered them, each for the transaction)
            parts.update(await self.relays.tx_ack(s, f.tags, f.multiple, f.tx))
            tags = [t for t in f.tags if t not in relayed]
            if not tags and not f.multiple:
                s.send(Ok(rid=f.rid))
                return
            f = dataclasses.replace(f, tags=tags)
        unknown = [] if f.multiple else [t for t in f.tags if t not in s.deliveries]
        if unknown:
            _settled(s, f.rid, unknown)  # (refused whole: nothing is taken)
            return
        settled, unknown = _settle(s, f.tags, f.multiple)
        if unknown:
            _settled(s, f.rid, unknown)
            return
        parts.update((c.queue.name, m.partition) for c, m in settled)
        await self.transactions.participants.hold_acks(f.tx, settled, self.delivery.release_slots)
        s.send(Ok(rid=f.rid))

    def _settle(self, s: Consuming, tags: list[int], multiple: bool,
                action: str) -> tuple[list[tuple[Consumer, Msg]], list[int]]:
        """The deliveries of ``tags`` held here, and the unknown tags; the relayed ones are settled
        on the members that hold them (``action``: broker.sessions.relayed.ACTIONS)."""
        relayed = self.relays.settle(s, tags, multiple, action)
        if not relayed:
            return _settle(s, tags, multiple)
        settled, unknown = _settle(s, tags if multiple else [t for t in tags if t not in relayed], multiple)
        return settled, [] if multiple else unknown

    # -- stream reads ---------------------------------------------------------------------------------

    async def read(self, s: Consuming, user: UserRecord, f: Read) -> None:
        self._may(user, "browse", f.queue)
        msgs, nxt, end = await read_stream(self.streams, f.queue, f.partition, f.offset, f.max_messages,
                                           start=f.start, timestamp=f.timestamp)
        s.send(ReadOk(rid=f.rid, messages=msgs, next_offset=nxt, end_offset=end))

    async def store_offset(self, s: Consuming, user: UserRecord, f: StoreOffset) -> None:
        self._may(user, "consume", f.queue)
        await store_offset(self.streams, f.queue, f.partition, f.consumer, f.offset)
        s.send(Ok(rid=f.rid))

    async def fetch_offset(self, s: Consuming, user: UserRecord, f: FetchOffset) -> None:
        self._may(user, "browse", f.queue)
        offset = await fetch_offset(self.streams, f.queue, f.partition, f.consumer)
        s.send(OffsetOk(rid=f.rid, offset=offset or 0, found=offset is not None))

    async def produced(self, s: Consuming, user: UserRecord, f: Produced) -> None:
        self._may(user, "browse", f.queue)
        s.send((await produced(self.streams, f.queue, f.partition, f.producer, f.offset)).ok(f.rid))


def _not_a_stream(q: Queue, what: str) -> None:
    if q.stream:
        raise InvalidArgumentError(f"queue {q.name!r} is a stream: it is not {what}; read it by offset, time, "
                                   f"first, last or next (read), keeping a named consumer's offset (store_offset)")


def _settle(s: Recipient, tags: list[int], multiple: bool) -> tuple[list[tuple[Consumer, Msg]], list[int]]:
    held = s.deliveries
    if multiple:
        if not tags:
            return [], []
        upto = max(tags)
        done_tags = [t for t in held if t <= upto]
        out = [held.pop(t) for t in done_tags]
        return out, ([] if out else [upto])
    out, unknown = [], []
    for t in tags:
        item = held.pop(t, None)
        if item is None:
            unknown.append(t)
        else:
            out.append(item)
    return out, unknown


def _settled(s: Consuming, rid: int, unknown: list[int]) -> None:
    if unknown:
        shown = ", ".join(map(str, unknown[:10])) + (" ..." if len(unknown) > 10 else "")
        s.send(error_frame(rid, UnknownDeliveryTagError(
            f"unknown delivery tag(s) {shown}: not held by this connection "
            "(already settled, or delivered on an earlier connection)")))
    else:
        s.send(Ok(rid=rid))


class _PublishReply:
    """A publish's reply to its client, sent in the call that settles it (the commit's callback)."""

    __slots__ = ("_s", "_rid", "_publisher", "_done")

    def __init__(self, s: Consuming, rid: int, publisher: Publisher) -> None:
        self._s, self._rid, self._publisher, self._done = s, rid, publisher, False

    def done(self) -> bool:
        return self._done

    def set_result(self, r: PublishResult) -> None:
        self._done = True
        self._publisher.confirms += r.stored + r.duplicates
        self._s.send(PublishOk(rid=self._rid, stored=r.stored, duplicates=r.duplicates, next_seq=r.last_seq + 1,
                               unroutable=r.unroutable, queues=r.queues))

    def set_exception(self, err: BaseException) -> None:
        self._done = True
        s = self._s
        if isinstance(err, TandemError):
            s.send(error_frame(self._rid, err))
        else:
            log.error("session %s: publish failed: %r", s.client_name, err, exc_info=err)
            s.send(Error(rid=self._rid, code=int(ErrorCode.INTERNAL_ERROR), message=repr(err)))
