"""Peer links: the I/O that feeds :class:`ha.membership.Membership`.

One TCP connection per pair of group members, on the peer port; the member
whose name sorts first dials, the other accepts.  A link opens with the same
framing and version handshake as clients (``PeerHello`` / ``PeerWelcome``,
carrying the node's identity), then carries keep-alives (``Heartbeat``) every
``keepalive_interval``; any frame counts as a sign of life.  A peer silent for
``non_response_timeout`` is ``Down``.  A peer with our location code or store
stamp, or without a common protocol version, is refused with a clear log line.

Timeouts are the node clock's (``clock.timeout``, never ``wait_for``: on Python 3.11
``wait_for`` can swallow a cancellation that races with its result, and a dialer would
outlive ``stop``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from client.errors import ErrorCode, TandemError, UnavailableError, UnsupportedProtocolError, for_code
from client.protocol import HANDSHAKE_MAX_FRAME, NEED_DATA, ConnectionEnded, ProtocolConnection, Role, choose_version
from client.protocol.connection import MAX_VERSION, MIN_VERSION
from broker.config import ConfigError, NodeConfig
from broker.queues import Queue
from client.clock import Clock
from broker.forward import ForwardRequest
from client.protocol.frames import (
    Close,
    Error,
    Forward,
    ForwardOk,
    Frame,
    Heartbeat,
    PeerHello,
    PeerWelcome,
    Replicate,
    expect,
)
from ha.membership import (
    Change,
    Membership,
    NodeIdentity,
    QuorumPolicy,
    QuorumState,
    QuorumStateChanged,
    RemoteState,
    RemoteStateChanged,
)


class Receiving(Protocol):
    def receive(self, src: str, payload: bytes) -> None: ...


class PeerArbiter(Protocol):
    """The LockFile arbiter's driver (broker.lockfile), as the peer links feed it."""

    def heartbeat(self) -> Heartbeat:
        """The keep-alive to send now (it carries the epoch and the HA state)."""

    def heard(self, src: str, frame: Frame) -> None:
        """Any frame from peer ``src``, before it is handled (its epoch may fence this node)."""


class Dispatching(Protocol):
    def schedule(self, q: Queue) -> None: ...


class PeerHost(Protocol):
    """What the peer links need from their node."""
    config: NodeConfig
    clock: Clock
    store_stamp: str

    @property
    def replication(self) -> Receiving | None: ...

    @property
    def client_address(self) -> str: ...

    @property
    def queues(self) -> dict[str, Queue]: ...

    @property
    def delivery(self) -> Dispatching: ...

    async def handle_forward(self, kind: int, payload: bytes) -> bytes: ...

log = logging.getLogger("tandem.ha")

REFUSED = {RemoteState.DUPLICATE_LOCATION, RemoteState.DUPLICATE_TIMESTAMP, RemoteState.UNSUPPORTED_PROTOCOL}
HANDSHAKE_TIMEOUT = 5.0
PEER_MAX_FRAME = 512 * 1024 * 1024  # snapshots of large partitions travel in one frame (once admitted)
FORWARD_TIMEOUT = 30.0


class _Link:
    def __init__(self, name: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 proto: ProtocolConnection) -> None:
        self.name, self.reader, self.writer, self.proto = name, reader, writer, proto

    def send(self, frame: Frame) -> None:
        if not self.writer.is_closing():
            self.writer.write(self.proto.send(frame))

    def close(self) -> None:
        self.writer.close()


class PeerManager:
    def __init__(self, node: PeerHost) -> None:
        cfg = node.config
        self.node = node
        self.addresses = cfg.peer_addresses()
        witness = cfg.witness_address()
        if witness is not None:
            self.addresses[witness[0]] = witness[1]  # a member: its vote counts in the node quorum
        self.me = NodeIdentity(name=cfg.name, store_stamp=node.store_stamp, priority=cfg.priority, votes=cfg.votes)
        self.membership = Membership(me=self.me, peers=tuple(self.addresses),
                                     non_response_timeout=cfg.non_response_timeout,
                                     policy=QuorumPolicy.parse(cfg.quorum_policy),
                                     designated_primary=cfg.designated_primary)
        self.links: dict[str, _Link] = {}
        self.client_addresses: dict[str, str] = {}  # peer -> host:port its clients use
        self._next_rid = 1
        self._forwards: dict[int, tuple[_Link, asyncio.Future[bytes]]] = {}
        self._handlers: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self.address: tuple[str, int] | None = None
        self._up = asyncio.Event()
        #: the LockFile arbiter's driver, when the group has one; ``epoch`` what frames carry
        self.arbiter: PeerArbiter | None = None
        self.epoch = 0

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        cfg = self.node.config
        if cfg.peer_port is None:
            raise ConfigError("a replication group member needs a peer_port")
        self._server = await asyncio.start_server(self._accept, cfg.host, cfg.peer_port)
        sock = self._server.sockets[0].getsockname()
        self.address = (sock[0], sock[1])
        log.info("peer links started node=%s peer_address=%s:%d peers=%s quorum_policy=%s",
                 cfg.name, sock[0], sock[1], ",".join(self.addresses) or "-", cfg.quorum_policy)

    async def run(self) -> None:
        """Dial the peers this node dials, and keep every link alive; runs until cancelled."""
        async with asyncio.TaskGroup() as tg:
            for name in sorted(self.addresses):
                if self.me.name < name:
                    tg.create_task(self._dial_forever(name), name=f"tandem-peer-dial-{name}")
            tg.create_task(self._keepalive(), name="tandem-peer-keepalive")

    async def stop(self) -> None:
        for t in list(self._handlers):
            t.cancel()
        for _name, fut in self._forwards.values():
            if not fut.done():
                fut.set_exception(UnavailableError(f"node {self.me.name} is shutting down"))
        if self._server is not None:
            self._server.close()
        for link in list(self.links.values()):
            link.close()
        if self._server is not None:
            await self._server.wait_closed()

    # -- membership ------------------------------------------------------------------------------

    def report(self, changes: list[Change]) -> None:
        for c in changes:
            if isinstance(c, RemoteStateChanged):
                level = logging.INFO if c.new in (RemoteState.UP, RemoteState.DISCOVERED) else logging.WARNING
                log.log(level, "remote node %s: %s -> %s (%s)", c.node, c.old.value, c.new.value, c.reason)
            elif isinstance(c, QuorumStateChanged):
                level = logging.INFO if c.new is QuorumState.ACTIVE else logging.WARNING
                log.log(level, "node quorum %s -> %s (votes up %d of %d)%s", c.old.value, c.new.value,
                        c.up_votes, c.total_votes,
                        ": partitions Unavailable, clients refused" if c.new is QuorumState.DISABLED else "")
                if c.old is QuorumState.DISABLED:
                    for q in self.node.queues.values():
                        self.node.delivery.schedule(q)  # consumers waited while there was no quorum

    async def _keepalive(self) -> None:
        clock = self.node.clock
        interval = self.node.config.keepalive_interval
        while True:
            beat = self.arbiter.heartbeat() if self.arbiter is not None else Heartbeat()
            for link in list(self.links.values()):
                link.send(beat)
            self.report(self.membership.tick(clock.monotonic()))
            await clock.sleep(interval)

    # -- links --------------------------------------------------------------------------------------

    async def _dial_forever(self, name: str) -> None:
        host, port = self.addresses[name]
        clock = self.node.clock
        backoff = self.node.config.keepalive_interval
        while True:
            try:
                async with self.node.clock.timeout(HANDSHAKE_TIMEOUT):
                    reader, writer = await asyncio.open_connection(host, port)
            except (OSError, asyncio.TimeoutError):
                await clock.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            backoff = self.node.config.keepalive_interval
            proto = ProtocolConnection(Role.CLIENT, max_frame_size=HANDSHAKE_MAX_FRAME)
            link = _Link(name, reader, writer, proto)
            try:
                link.send(PeerHello(min_version=MIN_VERSION, max_version=MAX_VERSION, node=self.me.name,
                                    store_stamp=self.me.store_stamp, priority=self.me.priority, votes=self.me.votes,
                                    client_address=self._client_address(), epoch=self.epoch))
                async with self.node.clock.timeout(HANDSHAKE_TIMEOUT):
                    frame = await self._next_frame(link)
                if isinstance(frame, Error):
                    log.warning("peer %s refused this node: %s", name, frame.message)
                elif isinstance(frame, PeerWelcome):
                    who = NodeIdentity(name=frame.node, store_stamp=frame.store_stamp, priority=frame.priority,
                                       votes=frame.votes)
                    if frame.node != name:
                        log.warning("peer at %s:%d says it is %s, not %s: dropped", host, port, frame.node, name)
                    elif self._admit(link, who, frame.client_address):
                        if self.arbiter is not None:
                            self.arbiter.heard(name, frame)
                        await self._serve(link)
            except (TandemError, OSError, asyncio.TimeoutError) as exc:
                log.debug("peer link to %s failed: %r", name, exc)
            finally:
                self._drop(link)
            await clock.sleep(backoff)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        proto = ProtocolConnection(Role.SERVER, max_frame_size=HANDSHAKE_MAX_FRAME)
        link = _Link("?", reader, writer, proto)
        try:
            async with self.node.clock.timeout(HANDSHAKE_TIMEOUT):
                frame = await self._next_frame(link)
            if not isinstance(frame, PeerHello):
                self._refuse(link, f"expected PeerHello, got {type(frame).__name__}")
                return
            link.name = frame.node
            if frame.node == self.me.name:
                self._refuse(link, f"duplicate location: a node named {frame.node!r} (location code "
                                   f"{self.me.location_code:#x}) is this node")
                return
            if frame.node not in self.addresses:
                self._refuse(link, f"node {frame.node!r} is not a member of this group")
                return
            who = NodeIdentity(name=frame.node, store_stamp=frame.store_stamp, priority=frame.priority,
                               votes=frame.votes)
            try:
                version = choose_version(frame.min_version, frame.max_version)
            except UnsupportedProtocolError as exc:
                self.report(self.membership.handshake(who, self.node.clock.monotonic(), protocol_ok=False))
                self._refuse(link, exc.message)
                return
            if not self._admit(link, who, frame.client_address):
                return
            link.send(PeerWelcome(version=version, node=self.me.name, store_stamp=self.me.store_stamp,
                                  priority=self.me.priority, votes=self.me.votes,
                                  client_address=self._client_address(), epoch=self.epoch))
            if self.arbiter is not None:
                self.arbiter.heard(frame.node, frame)
            await self._serve(link)
        except (TandemError, OSError, asyncio.TimeoutError) as exc:
            log.debug("peer link from %s failed: %r", link.name, exc)
        finally:
            self._drop(link)

    def _client_address(self) -> str:
        return self.node.client_address

    def _admit(self, link: _Link, who: NodeIdentity, client_address: str = "") -> bool:
        self.report(self.membership.handshake(who, self.node.clock.monotonic()))
        state = self.membership.state(who.name)
        if state in REFUSED:
            self._refuse(link, f"refused as {state.value}: check that {who.name} has its own name and data dir")
            return False
        old = self.links.get(who.name)
        if old is not None and old is not link:
            old.close()
        link.proto.max_frame_size = PEER_MAX_FRAME  # a member's: snapshots travel in one frame
        self.links[who.name] = link
        if client_address:
            self.client_addresses[who.name] = client_address
        return True

    def _refuse(self, link: _Link, why: str) -> None:
        log.warning("peer link %s refused: %s", link.name, why)
        try:
            link.send(Error(rid=0, code=int(UnsupportedProtocolError.code), message=why))
            link.send(Close(code=int(UnsupportedProtocolError.code), reason=why))
        except TandemError:
            pass  # the protocol already forbids more output on this link; closing it is all that is left
        link.close()

    async def _serve(self, link: _Link) -> None:
        clock = self.node.clock
        rep = self.node.replication
        while True:
            frame = await self._next_frame(link)
            self.report(self.membership.heard(link.name, clock.monotonic()))
            if self.arbiter is not None:
                self.arbiter.heard(link.name, frame)
            if isinstance(frame, Replicate):
                if rep is not None:
                    rep.receive(link.name, frame.payload)
            elif isinstance(frame, Forward):
                task = asyncio.get_running_loop().create_task(self._answer(link, frame))
                self._handlers.add(task)
                task.add_done_callback(self._handlers.discard)
            elif isinstance(frame, ForwardOk):
                self._resolve(frame.rid, frame.payload, None)
            elif isinstance(frame, Error) and frame.rid:
                self._resolve(frame.rid, b"", for_code(frame.code, frame.message, active_hint=frame.active_hint,
                                   next_seq=frame.next_seq))
            elif isinstance(frame, Close):
                return

    # -- forwarded requests (location transparency) ----------------------------------------------

    async def forward(self, name: str, request: ForwardRequest) -> bytes:
        """Ask member ``name`` to do ``request``; its reply, or the error it raised."""
        kind = request.KIND.name
        link = self.links.get(name)
        if link is None:
            raise UnavailableError(f"node {name} is active for this request but not connected to {self.me.name}")
        rid = self._next_rid
        self._next_rid += 1
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._forwards[rid] = (link, fut)
        try:
            link.send(Forward(rid=rid, kind=int(request.KIND), payload=request.pack()))
            async with self.node.clock.timeout(FORWARD_TIMEOUT):
                return await fut
        except TimeoutError:
            raise UnavailableError(f"node {name} did not answer a forwarded {kind} in {FORWARD_TIMEOUT:.0f} s") \
                from None
        finally:
            self._forwards.pop(rid, None)

    def _resolve(self, rid: int, payload: bytes, err: BaseException | None) -> None:
        entry = self._forwards.get(rid)
        if entry is not None and not entry[1].done():
            entry[1].set_exception(err) if err is not None else entry[1].set_result(payload)

    async def _answer(self, link: _Link, f: Forward) -> None:
        try:
            out = await self.node.handle_forward(f.kind, f.payload)
            link.send(ForwardOk(rid=f.rid, payload=out))
        except TandemError as exc:
            link.send(Error(rid=f.rid, code=int(exc.code), message=exc.message,
                            active_hint=getattr(exc, "active_hint", None),
                            next_seq=getattr(exc, "next_seq", None)))
        except Exception as exc:  # a bug must not kill the link: answer, and log it
            log.exception("forwarded %s from %s failed", f.kind, link.name)
            link.send(Error(rid=f.rid, code=int(ErrorCode.INTERNAL_ERROR), message=repr(exc)))

    async def _next_frame(self, link: _Link) -> Frame:
        while True:
            event = link.proto.next_event()
            if event is NEED_DATA:
                data = await link.reader.read(65536)
                link.proto.receive_data(data)
                continue
            if isinstance(event, ConnectionEnded):
                raise ConnectionResetError("peer link closed")
            return expect(event, Frame)

    def _drop(self, link: _Link) -> None:
        link.close()
        if self.links.get(link.name) is link:
            del self.links[link.name]
        for _rid, (via, fut) in list(self._forwards.items()):
            if via is link and not fut.done():
                fut.set_exception(UnavailableError(f"link to node {link.name} lost during a forwarded request"))
            self.report(self.membership.link_lost(link.name))
