"""Consuming from any node: a client session's relays to the members its queues' partitions
are active on.

A consumer subscribed on this node gets the partitions active here directly; for the others,
this node subscribes on the session's behalf on every linked member of the queue's node lists
(``RELAY_SUBSCRIBE``), and each of them delivers the partitions it is active for back over the
peer link (``RELAY_DELIVER``, :mod:`broker.sessions.relayed`).  Each relayed delivery gets a tag
of the client's connection; a settlement of it is forwarded to the member that holds the
message (``RELAY_SETTLE``), and a get that finds nothing here asks the partitions' actives in
turn (``RELAY_GET``).  A relay is bound to its link: when the link ends, the member makes what
it held ready again, the client's tags of it are forgotten here (a settlement of one is
answered "unknown delivery tag", as after a failover), and the consumer subscribes there
again once the link is back.  Relays follow no failover: a member that becomes a partition's
active already has the consumer, so a consumer sees the whole queue through every
election.  A consumer's prefetch applies on each member that delivers to it.

A member whose build has no relays (an older one, during a rolling upgrade) refuses the
subscription; its partitions reach only consumers connected to it (the SDK's group and
durable consumers subscribe on every member, with ``Subscribe.local``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Collection, Coroutine, Mapping
from typing import Any, Protocol

import msgpack

from broker.config import NodeConfig
from broker.messaging.forward import (UNKNOWN_KIND, ForwardRequest, RelayCancelFwd, RelayDeliverFwd, RelayGetFwd,
                                      RelayReleaseFwd, RelaySettleFwd, RelaySubscribeFwd, RelayTxAckFwd,
                                      refused_as_longer)
from broker.messaging.queues import Consumer, Queue
from broker.peers.links import Link
from broker.sessions.relayed import Relayed
from client.clock import Clock
from client.errors import ConsumerNotFoundError, ErrorCode, InvalidArgumentError, TandemError, UnavailableError
from client.protocol.codec import FrameError, decode_payload
from client.protocol.frames import Deliver, Delivery, Frame, GetOk, expect

log = logging.getLogger("tandem.broker")

Ask = Callable[[Link, ForwardRequest], Awaitable[bytes]]
#: seconds between looks for members a relayed consumer is not yet subscribed on (a link back up)
RELAY_RETRY = 1.0


class RelayHost(Protocol):
    """What the relays use of their node: its links and where its queues' partitions are placed."""

    @property
    def config(self) -> NodeConfig: ...

    @property
    def clock(self) -> Clock: ...

    def queue(self, name: str) -> Queue: ...

    def links(self) -> Mapping[str, Link]:
        """The peer links up now, by member."""
        ...

    def placed(self, q: Queue) -> Collection[str]:
        """The members in the node lists of ``q``'s partitions (those that may become active)."""
        ...

    def actives(self, q: Queue) -> Collection[str]:
        """The members active for ``q``'s partitions now."""
        ...

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...


class Relaying(Protocol):
    """A client session as its relays see it."""

    client_name: str
    consumers: dict[int, Consumer]

    def new_tag(self) -> int:
        """The connection's next delivery tag."""
        ...

    def send_in_order(self, frame: Frame) -> None: ...

    def cancelled_by_broker(self, c: Consumer, reason: str) -> None:
        """Consumer ``c`` ends: the client is told (its Cancel)."""
        ...


class _SessionRelays:
    """One client session's relays."""

    def __init__(self, sid: int, s: Relaying) -> None:
        self.sid, self.s = sid, s
        self.wanted: dict[int, tuple[str, int, bool]] = {}  # relayed consumer id -> (queue, prefetch, exclusive)
        self.subs: set[tuple[Link, int]] = set()  # (link, consumer id): subscribed over it, or asking
        self.tags: dict[int, tuple[Link, int]] = {}  # the client's tag -> (link, the serving member's tag)
        self.links: set[Link] = set()  # every link a relay was asked over (told when the session ends)
        self.ended = False


class Relays:
    """The relays of this node's client sessions, and (``served``) those other members' sessions
    hold here."""

    def __init__(self, host: RelayHost, served: Relayed, ask: Ask) -> None:
        self.host, self.served, self.ask = host, served, ask
        self._next_sid = 1
        self._by_sid: dict[int, _SessionRelays] = {}
        self._of: dict[Relaying, _SessionRelays] = {}
        self._no_relays: set[Link] = set()  # links to members whose build has no relays
        self._looking = False
        self._turn = 0

    def relayed(self) -> int:
        """Deliveries relayed to this node's clients, not yet settled."""
        return sum(len(r.tags) for r in self._of.values())

    def _relays_of(self, s: Relaying) -> _SessionRelays:
        r = self._of.get(s)
        if r is None:
            r = self._of[s] = self._by_sid[self._next_sid] = _SessionRelays(self._next_sid, s)
            self._next_sid += 1
        return r

    # -- consumers ------------------------------------------------------------------------------------

    def subscribe(self, s: Relaying, c: Consumer) -> None:
        """Relay the partitions active on other members to consumer ``c`` of session ``s``."""
        if self.host.config.peer_port is None:
            return  # (a single node serves every partition itself)
        self._relays_of(s).wanted[c.id] = (c.queue.name, c.prefetch, c.exclusive)
        self._look()
        if not self._looking:
            self._looking = True
            self.host.spawn(self._keep_looking())

    def cancel(self, s: Relaying, consumer: int) -> None:
        r = self._of.get(s)
        if r is None or r.wanted.pop(consumer, None) is None:
            return
        for link, cid in [k for k in r.subs if k[1] == consumer]:
            r.subs.discard((link, cid))
            self.host.spawn(self._tell(link, RelayCancelFwd(r.sid, cid)))

    def release(self, s: Relaying) -> None:
        """Session ``s`` ended: its relays end; what they held is ready again on their members."""
        r = self._of.pop(s, None)
        if r is None:
            return
        del self._by_sid[r.sid]
        r.ended = True
        for link in r.links:
            if not link.writer.is_closing():
                self.host.spawn(self._tell(link, RelayReleaseFwd(r.sid)))

    def link_lost(self, link: Link) -> None:
        """``link`` ended: its member made what it held ready again; the tags of it are forgotten,
        and the consumers subscribe there again once it is back."""
        self.served.link_lost(link)
        self._no_relays.discard(link)
        for r in self._of.values():
            r.subs = {k for k in r.subs if k[0] is not link}
            r.links.discard(link)
            gone = [t for t, (via, _tag) in r.tags.items() if via is link]
            for t in gone:
                del r.tags[t]
            if gone:
                log.info("session %s: %d relayed deliveries from %s dropped with its link (delivered again)",
                         r.s.client_name, len(gone), link.name)

    async def _keep_looking(self) -> None:
        try:
            while any(r.wanted for r in self._of.values()):
                await self.host.clock.sleep(RELAY_RETRY)
                self._look()
        finally:
            self._looking = False

    def _look(self) -> None:
        """Subscribe every relayed consumer on each linked member of its queue's node lists
        where it is not yet."""
        links, me = self.host.links(), self.host.config.name
        for r in list(self._of.values()):
            for cid, (name, prefetch, exclusive) in list(r.wanted.items()):
                if cid not in r.s.consumers:  # (cancelled by the broker: its queue was deleted)
                    del r.wanted[cid]
                    continue
                missing = {m for m, link in links.items()
                           if m != me and link not in self._no_relays and (link, cid) not in r.subs}
                if not missing:
                    continue
                try:
                    q = self.host.queue(name)
                except TandemError:
                    continue
                for member in missing.intersection(self.host.placed(q)):
                    link = links[member]
                    r.subs.add((link, cid))
                    r.links.add(link)
                    self.host.spawn(self._subscribe(r, link, RelaySubscribeFwd(r.sid, cid, name, prefetch, exclusive)))

    async def _subscribe(self, r: _SessionRelays, link: Link, req: RelaySubscribeFwd) -> None:
        try:
            try:
                await self.ask(link, req)
            except InvalidArgumentError as exc:
                if not req.exclusive or not refused_as_longer(exc, req):
                    raise
                # a member of an older build keeps no exclusive consumers: relayed as a plain one
                log.info("consumer %d of %s: %s keeps no exclusive consumers (its build is older): relayed as "
                         "a plain consumer there", req.consumer, req.queue, link.name)
                await self.ask(link, dataclasses.replace(req, exclusive=False))
        except TandemError as exc:
            r.subs.discard((link, req.consumer))  # (asked again at the next look)
            if exc.message.startswith(UNKNOWN_KIND):
                self._no_relays.add(link)
                log.info("node %s relays no consumers (its build is older): its partitions reach only "
                         "consumers connected to it", link.name)
            elif req.exclusive and exc.code == ErrorCode.ACCESS_REFUSED and req.consumer in r.wanted:
                # the queue has consumers on that member: an exclusive consumer is not one, so it ends
                # (a plain consumer refused by another's exclusive one asks again, and gets that member's
                # partitions once it ends)
                c = r.s.consumers.get(req.consumer)
                self.cancel(r.s, req.consumer)
                if c is not None:
                    r.s.cancelled_by_broker(c, f"{exc.message} on {link.name}")
            else:
                log.debug("relay of consumer %d to %s: %s", req.consumer, link.name, exc.message)
            return
        if r.ended or req.consumer not in r.wanted:  # cancelled meanwhile
            r.subs.discard((link, req.consumer))
            await self._tell(link, RelayCancelFwd(r.sid, req.consumer))

    async def _tell(self, link: Link, req: ForwardRequest) -> None:
        """Ask without waiting on the answer: a lost one changes nothing (the member releases what
        the relay holds when the link ends)."""
        try:
            await self.ask(link, req)
        except TandemError as exc:
            log.debug("%s to %s: %s", req.KIND.name.lower(), link.name, exc.message)

    # -- deliveries and settlements -------------------------------------------------------------------

    async def handle(self, link: Link, req: ForwardRequest) -> bytes:
        """A relay request another member forwarded: deliveries for a session here, or a request
        of one of its sessions (``served``)."""
        if isinstance(req, RelayDeliverFwd):
            return self._delivered(link, req)
        return await self.served.handle(link, req)

    def _delivered(self, link: Link, req: RelayDeliverFwd) -> bytes:
        r = self._by_sid.get(req.session)
        if r is None or req.consumer not in r.wanted or (link, req.consumer) not in r.subs:
            raise ConsumerNotFoundError(f"no relayed consumer {req.consumer} of session {req.session} "
                                        f"on {self.host.config.name}")
        try:
            frame = expect(decode_payload(req.frame), Deliver)
        except (FrameError, TandemError) as exc:
            raise InvalidArgumentError(f"relay deliver: frame is not a Deliver ({exc})") from None
        for d in frame.messages:
            tag = r.s.new_tag()
            r.tags[tag] = (link, d.tag)
            d.tag = tag
        r.s.send_in_order(Deliver(consumer=req.consumer, messages=frame.messages))
        return b""

    def held(self, s: Relaying) -> set[int]:
        """The session's delivery tags of relayed deliveries (held on other members)."""
        r = self._of.get(s)
        return set(r.tags) if r is not None else set()

    def settle(self, s: Relaying, tags: list[int], multiple: bool, action: str) -> set[int]:
        """Forward the settlement of the relayed ones among ``tags`` (``multiple``: every relayed tag
        up to the highest) to the members holding them; the tags it took."""
        r = self._of.get(s)
        if r is None or not r.tags or not tags:
            return set()
        if multiple:
            upto = max(tags)
            taken = {t for t in r.tags if t <= upto}
        else:
            taken = {t for t in tags if t in r.tags}
        by_link: dict[Link, list[int]] = {}
        for t in sorted(taken):
            link, tag = r.tags.pop(t)
            by_link.setdefault(link, []).append(tag)
        for link, tags_there in by_link.items():
            self.host.spawn(self._tell(link, RelaySettleFwd(r.sid, action, msgpack.packb(tags_there))))
        return taken

    async def tx_ack(self, s: Relaying, tags: list[int], multiple: bool, txid: str) -> set[tuple[str, int]]:
        """Ack the relayed ones among ``tags`` in transaction ``txid`` on the members holding
        them (each holds them for the transaction, as an ack made there); the (queue, partition)
        pairs they belong to.  A member that cannot (a build without it) raises its refusal: the
        transaction then does not commit, and what it held goes back as the session ends."""
        r = self._of.get(s)
        if r is None or not r.tags or not tags:
            return set()
        upto = max(tags)
        taken = sorted(t for t in r.tags if t <= upto) if multiple else sorted(t for t in tags if t in r.tags)
        by_link: dict[Link, list[int]] = {}
        for t in taken:
            link, tag = r.tags.pop(t)
            by_link.setdefault(link, []).append(tag)
        parts: set[tuple[str, int]] = set()
        for link, tags_there in by_link.items():
            reply = await self.ask(link, RelayTxAckFwd(r.sid, txid, msgpack.packb(tags_there)))
            try:
                pairs = msgpack.unpackb(reply)
                parts.update((q, p) for q, p in pairs if type(q) is str and type(p) is int)
            except Exception:  # msgpack raises several types; a pair that is no pair
                raise UnavailableError(f"{link.name} answered a transactional ack with no partitions") from None
        return parts

    async def get(self, s: Relaying, q: Queue, auto_ack: bool) -> Delivery | None:
        """One message from a partition active on another member (asked in turn), or None."""
        links, me = self.host.links(), self.host.config.name
        members = [m for m in dict.fromkeys(self.host.actives(q)) if m != me and m in links]
        self._turn += 1
        turn = self._turn % len(members) if members else 0
        for member in members[turn:] + members[:turn]:
            link = links[member]
            if link in self._no_relays:
                continue
            r = self._relays_of(s)
            r.links.add(link)
            try:
                reply = expect(decode_payload(await self.ask(link, RelayGetFwd(r.sid, q.name, auto_ack))), GetOk)
            except (FrameError, TandemError) as exc:
                log.debug("relayed get of %s from %s: %s", q.name, member, exc)
                continue
            d = reply.message
            if d is None:
                continue
            theirs, d.tag = d.tag, s.new_tag()
            if r.ended:  # the session ended meanwhile: what the member holds for it goes back
                self.host.spawn(self._tell(link, RelayReleaseFwd(r.sid)))
            elif not auto_ack:
                r.tags[d.tag] = (link, theirs)
            return d
        return None
