"""The consumers other members hold here for their clients (consuming from any node).

A client session on member A consumes the partitions active here through a *relay*
(:mod:`broker.sessions.relay` on A): A subscribes here on the session's behalf, this node
delivers the partitions it is active for back over the same peer link (``RELAY_DELIVER``), and
A forwards the client's settlements (``RELAY_SETTLE``) and gets (``RELAY_GET``).  Here each
client session of A is a :class:`RelayHolder`: a recipient of deliveries like a client session
(broker.messaging.queues.Recipient), bound to the link it was made over.  It ends when A says
the session ended or with that link; what it holds is then ready again, counted as delivered
(the client may have seen it).  A delivery moves the partition's delivered mark before it
leaves, as for a local consumer (broker.messaging.delivery); a partition that stops being
active here revokes what the holders hold of it, like a session's (broker.node.holding).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, MutableSet
from typing import Any, Protocol

import msgpack

from broker.config import NodeConfig
from broker.messaging import delivery as _delivery
from broker.messaging.forward import (ForwardRequest, RelayCancelFwd, RelayDeliverFwd, RelayGetFwd,
                                      RelayReleaseFwd, RelaySettleFwd, RelaySubscribeFwd, RelayTxAckFwd)
from broker.messaging.message import Msg
from broker.messaging.queues import Consumer, Queue, Recipient
from broker.peers.links import Link
from client.errors import ConsumerNotFoundError, InvalidArgumentError, StorageError, TandemError, UnavailableError
from client.protocol.codec import encode
from client.protocol.frames import Deliver, Delivery, GetOk
from storage.base import WriteOp
from storage.writer import Callback

log = logging.getLogger("tandem.broker")

Ask = Callable[[Link, ForwardRequest], Awaitable[bytes]]
#: what a ``RELAY_SETTLE`` may ask
ACTIONS = ("ack", "requeue", "unseen", "reject")
#: holds deliveries for a transaction until its outcome: (txid, deliveries, what frees their slots)
HoldAcks = Callable[[str, list[tuple[Consumer, Msg]], Callable[[list[tuple[Consumer, Msg]]], None]],
                    Awaitable[None]]


def settled_tags(req: RelaySettleFwd) -> list[int]:
    """The tags a ``RELAY_SETTLE`` settles; InvalidArgumentError if it does not fit."""
    if req.action not in ACTIONS:
        raise InvalidArgumentError(f"relay settle: action {req.action!r} is not one of {', '.join(ACTIONS)}")
    try:
        tags = msgpack.unpackb(req.tags)
    except Exception:  # msgpack raises several types
        tags = None
    if type(tags) is not list or not all(type(t) is int for t in tags):
        raise InvalidArgumentError("relay settle: tags is not a msgpack list of ints")
    return tags


class RelayedHost(Protocol):
    """What the relays served here use of their node."""

    @property
    def config(self) -> NodeConfig: ...

    def queue(self, name: str) -> Queue: ...

    def write_later(self, ops: list[WriteOp], callback: Callback | None = None, *, lazy: bool = True) -> None: ...

    def require_quorum(self, what: str) -> None: ...

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...


class RelayHolder:
    """Client session ``session`` of the member at the other end of ``link``, as the deliveries
    of the partitions active here see it."""

    def __init__(self, served: Relayed, link: Link, session: int) -> None:
        self.served, self.link, self.session = served, link, session
        self.client_name = f"{link.name} relay {session}"
        self.consumers: dict[int, Consumer] = {}  # by this node's consumer id
        self.deliveries: dict[int, tuple[Consumer, Msg]] = {}  # by this node's tag
        self.remote: dict[int, int] = {}  # this node's consumer id -> the consumer's id on the link's member
        self._next_tag = 1

    @property
    def writable(self) -> bool:
        return not self.link.writer.is_closing()

    def tag(self, c: Consumer, m: Msg) -> Delivery:
        tag = self._next_tag
        self._next_tag = tag + 1
        self.deliveries[tag] = (c, m)
        return Delivery(tag, m.partition, m.offset, m.key, m.headers, m.body, m.dc > 1, m.dc, m.ts, m.id)

    def deliver(self, c: Consumer, msgs: list[Msg]) -> None:
        self.served.deliver(self, c, msgs)

    def cancelled_by_broker(self, c: Consumer, reason: str) -> None:
        # (the queue is gone: the asking member cancels its client's consumer itself)
        self.consumers.pop(c.id, None)
        self.remote.pop(c.id, None)
        self.served.delivery.remove_consumer(c)

    def consumer_for(self, remote_id: int) -> Consumer | None:
        for cid, rid in self.remote.items():
            if rid == remote_id:
                return self.consumers.get(cid)
        return None


class Relayed:
    """The relays other members hold here: made, fed, settled and ended by their requests."""

    def __init__(self, host: RelayedHost, delivery: _delivery.Delivery, *, holders: MutableSet[Recipient],
                 ask: Ask, hold_acks: HoldAcks) -> None:
        self.host, self.delivery, self.ask = host, delivery, ask
        self._hold_acks = hold_acks  # (broker.transactions.participant.Participants.hold_acks)
        self._holders: dict[tuple[Link, int], RelayHolder] = {}
        #: where the node looks for deliveries to revoke (broker.node.holding's local holders)
        self._registry = holders

    def held(self) -> int:
        """Deliveries held for other members' clients (unsettled)."""
        return sum(len(h.deliveries) for h in self._holders.values())

    async def handle(self, link: Link, req: ForwardRequest) -> bytes:
        if isinstance(req, RelaySubscribeFwd):
            self._subscribe(link, req)
        elif isinstance(req, RelaySettleFwd):
            self._settle(link, req)
        elif isinstance(req, RelayCancelFwd):
            h = self._holders.get((link, req.session))
            c = h.consumer_for(req.consumer) if h is not None else None
            if h is not None and c is not None:
                h.cancelled_by_broker(c, "cancelled")
        elif isinstance(req, RelayReleaseFwd):
            self._release(link, req.session)
        elif isinstance(req, RelayGetFwd):
            return await self._get(link, req)
        elif isinstance(req, RelayTxAckFwd):
            return await self._tx_ack(link, req)
        return b""

    def link_lost(self, link: Link) -> None:
        """What every session of ``link``'s member held here is ready again."""
        for key in [k for k in self._holders if k[0] is link]:
            self._release(*key)

    # -- the requests ---------------------------------------------------------------------------------

    def _holder(self, link: Link, session: int) -> RelayHolder:
        h = self._holders.get((link, session))
        if h is None:
            if link.writer.is_closing():
                raise UnavailableError(f"the link to {link.name} is closing")
            h = self._holders[(link, session)] = RelayHolder(self, link, session)
            self._registry.add(h)
        return h

    def _subscribe(self, link: Link, req: RelaySubscribeFwd) -> None:
        h = self._holder(link, req.session)
        if h.consumer_for(req.consumer) is not None:
            return  # (asked again: the first reply was lost)
        try:
            c = self.delivery.add_consumer(h, req.queue, req.prefetch, req.exclusive)
        except TandemError:
            if not h.consumers and not h.deliveries:
                self._release(link, req.session)  # (nothing of it here: no holder left behind)
            raise
        c.relayed = True
        h.consumers[c.id] = c
        h.remote[c.id] = req.consumer

    def _settle(self, link: Link, req: RelaySettleFwd) -> None:
        tags = settled_tags(req)
        h = self._holders.get((link, req.session))
        if h is None:
            return
        held = [h.deliveries.pop(t) for t in tags if t in h.deliveries]
        if not held:
            return
        if req.action == "ack":
            self.delivery.ack(held)
        elif req.action == "reject":
            self.delivery.dead_letter(held, "rejected")
        else:
            self.delivery.requeue(held, counted=req.action == "requeue")

    async def _tx_ack(self, link: Link, req: RelayTxAckFwd) -> bytes:
        """Acks in transaction ``req.tx`` of deliveries the session holds here: held by it until
        its outcome, as an ack in it made here; the [queue, partition] pairs they belong to."""
        tags = settled_tags(RelaySettleFwd(req.session, "ack", req.tags))
        h = self._holders.get((link, req.session))
        held = [h.deliveries.pop(t) for t in tags if t in h.deliveries] if h is not None else []
        if not held:
            return msgpack.packb([])
        await self._hold_acks(req.tx, held, self.delivery.release_slots)
        return msgpack.packb(sorted({(c.queue.name, m.partition) for c, m in held}))

    def _release(self, link: Link, session: int) -> None:
        h = self._holders.pop((link, session), None)
        if h is not None:
            self._registry.discard(h)
            self.delivery.release(h)

    async def _get(self, link: Link, req: RelayGetFwd) -> bytes:
        self.host.require_quorum("get")
        q = self.host.queue(req.queue)
        h = self._holder(link, req.session)  # (before a message leaves ready: a closing link takes none)
        msgs = self.delivery.take_live(q, 1, self.host.config.max_frame_size)
        if not msgs:
            return encode(GetOk(rid=0, message=None))[4:]
        d, marks, marked = self.delivery.hold_got(h, q, msgs[0])
        if marks:
            done: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()

            def committed(err: BaseException | None) -> None:
                if not done.done():
                    done.set_result(err)

            self.host.write_later(marks, committed, lazy=False)
            err = await done
            if err is not None:
                self.delivery.undeliver(h, [d.tag])
                raise err if isinstance(err, TandemError) else StorageError(f"get: {err}")
            marked()
        if req.auto_ack:
            held = h.deliveries.pop(d.tag, None)
            if held is not None:
                self.delivery.ack([held])
        return encode(GetOk(rid=0, message=d))[4:]

    # -- deliveries -----------------------------------------------------------------------------------

    def deliver(self, h: RelayHolder, c: Consumer, msgs: list[Msg]) -> None:
        marks, marked = self.delivery.record_deliveries(c.queue, msgs)
        c.unacked += len(msgs)
        messages = [h.tag(c, m) for m in msgs]
        tags = [d.tag for d in messages]
        payload = encode(Deliver(consumer=h.remote[c.id], messages=messages))[4:]
        if not marks:
            self.host.spawn(self._send(h, c, tags, payload))
            return

        def committed(err: BaseException | None) -> None:
            if err is not None:
                self.delivery.undeliver(h, tags)  # never shown: its mark is not in the log
            else:
                marked()
                self.host.spawn(self._send(h, c, tags, payload))

        self.host.write_later(marks, committed, lazy=False)

    async def _send(self, h: RelayHolder, c: Consumer, tags: list[int], payload: bytes) -> None:
        try:
            await self.ask(h.link, RelayDeliverFwd(h.session, h.remote.get(c.id, 0), payload))
        except TandemError as exc:
            refused = isinstance(exc, ConsumerNotFoundError)  # the consumer or its session is gone there
            if refused and c.id in h.consumers:
                h.cancelled_by_broker(c, "gone on its member")
            held = [h.deliveries.pop(t) for t in tags if t in h.deliveries]
            if held:
                # not taken: again, uncounted; no answer (a timeout): again, counted (it may have been seen)
                self.delivery.requeue(held, counted=not refused)
                log.debug("relay %s: %d deliveries back: %s", h.client_name, len(held), exc.message)
