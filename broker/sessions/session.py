"""One client connection: a thin asyncio shell around the sans-IO protocol.

The read loop moves bytes from the socket into :class:`ProtocolConnection`, hands each
request frame to its handler (:func:`requests` puts together the node's one table of them:
:mod:`~broker.sessions.messaging`, :mod:`~broker.sessions.admin`, :mod:`~broker.sessions.users`,
:mod:`~broker.sessions.status`), and writes what comes back.  The shell itself does the login
(SCRAM, broker.security.auth), the heartbeats, the order of replies that wait on a commit, and
the consumer side of the connection that delivery sees (tags, deliveries held).

A bad frame gets an ``Error`` frame naming its request id; a frame the stream
cannot recover from (over ``max_frame_size``, or anything wrong before the
handshake) gets an ``Error`` and the connection is closed.  Either way the node
and its other clients go on.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from broker.config import NodeConfig
from broker.logsafe import escape
from broker.messaging.catalogue import Catalogue
from broker.messaging import delivery as _delivery
from broker.messaging.message import Msg
from broker.messaging.queues import Consumer
from broker.security.acl import AclTable
from broker.security.auth import ClientGuard, ClientHandshake
from broker.security.security import Security
from broker.security.standing import Standing, recheck, standing_of
from broker.security.users import UserRegistry
from broker.sessions.requests import Handler, Requests, error_frame
from client.clock import Clock
from client.errors import (
    AccessRefusedError,
    AuthError,
    ErrorCode,
    HeartbeatTimeoutError,
    InvalidArgumentError,
    LocalProtocolError,
    NotActiveError,
    ProtocolError,
    QueueNotFoundError,
    TandemError,
    UnavailableError,
    UnsupportedProtocolError,
)
from client.protocol import (HANDSHAKE_MAX_FRAME, NEED_DATA, ConnectionEnded, FrameError, ProtocolConnection, Role,
                             choose_version)
from client.protocol.frames import (AuthResponse, Cancel, Close, Deliver, Delivery, Error, Frame, Heartbeat, Hello,
                                    Ok, Status, Welcome, expect)
from storage.base import UserRecord, WriteOp
from storage.writer import Callback


class SessionHost(Protocol):
    """What a client session's shell reads and asks of its node (the request handlers name their
    own).  The users, grants and catalogue are read at each use: a shared-mode node makes them
    anew when it takes the lock."""

    @property
    def config(self) -> NodeConfig: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def users(self) -> UserRegistry: ...

    @property
    def acls(self) -> AclTable: ...

    @property
    def catalogue(self) -> Catalogue: ...

    def refusal(self) -> NotActiveError | None:
        """Why this node serves no client now (a shared-mode passive), or None."""
        ...

    def write_later(self, ops: list[WriteOp], callback: Callback | None = None, *, lazy: bool = True) -> None: ...

    def alarmed(self) -> str | None:
        """Why this node refuses new data now (its disk alarm: broker.node.diskalarm), or None."""
        ...

    async def served(self, queue: str) -> None:
        """Until each partition of ``queue`` has an active (at most the election wait)."""
        ...


@dataclass(frozen=True, slots=True)
class SessionParts:
    """What a node hands each of its client sessions: itself as the shell sees it, the parts
    the shell calls, and the table of requests (:func:`requests`)."""

    node: SessionHost
    guard: ClientGuard  # the login throttle and the connections per user (broker.security.auth)
    security: Security  # whether a login's user is still the one proved
    delivery: _delivery.Delivery  # what a consumer's deliveries go through
    requests: Mapping[type[Frame], Handler[Session]]


log = logging.getLogger("tandem.broker")

#: seconds a login may wait for this member to catch up with the group's users
LOGIN_CATCH_UP = 1.0

READ_CHUNK = 256 * 1024
#: the first bytes of a TLS ClientHello (a handshake record, version 3.x)
TLS_HANDSHAKE = b"\x16\x03"
WRITE_HIGH_WATER = 4 * 1024 * 1024


class Session:
    def __init__(self, parts: SessionParts, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.node = node = parts.node
        self.guard, self.security, self.delivery = parts.guard, parts.security, parts.delivery
        self.requests = parts.requests
        self.reader = reader
        self.writer = writer
        # max_frame_size once the client has logged in (_auth_response)
        self.proto = ProtocolConnection(Role.SERVER, max_frame_size=HANDSHAKE_MAX_FRAME)
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.address = str(peer[0]) if isinstance(peer, tuple) else str(peer)  # the host, for the login throttle
        self.client_name = self.peer
        _tune_socket(writer)
        self.user: UserRecord | None = None
        self.standing: Standing | None = None  # what the login rests on (broker.security.standing)
        self._auth: ClientHandshake | None = None  # the SCRAM exchange, between Hello and Welcome
        self._hello_frame: Hello | None = None
        self._version = 0
        self._admitted = False  # counted in the guard's connections per user
        self.observer = False  # a status-only session on a node that serves nothing
        self.consumers: dict[int, Consumer] = {}
        self.deliveries: dict[int, tuple[Consumer, Msg]] = {}
        self.txs: dict[str, set[tuple[str, int]]] = {}  # its transactions not ended (broker.sessions.transactions)
        self._next_tag = 1
        cfg = node.config
        self.heartbeat = cfg.client_heartbeat
        clock = node.clock
        self.connected_at = self.last_recv = self.last_send = clock.monotonic()
        self.finished = asyncio.Event()
        self._logged_in = asyncio.Event()
        self._closing = False
        self._outbox: deque[list[Any]] = deque()  # [frame, ready]: frames waiting on a commit, in order
        self._drain_task: asyncio.Task[None] | None = None
        self._tg: asyncio.TaskGroup | None = None

    # -- output --------------------------------------------------------------------------

    def send(self, frame: Frame) -> None:
        if self._closing or self.writer.is_closing():
            return
        try:
            data = self.proto.send(frame)
        except LocalProtocolError:
            log.exception("session %s: refused to send %s", self.client_name, type(frame).__name__)
            return
        self.writer.write(data)
        self.last_send = self.node.clock.monotonic()

    def send_error(self, rid: int, exc: TandemError) -> None:
        self.send(error_frame(rid, exc))

    def send_after(self, ops: list[WriteOp], frame: Frame, on_commit: Callable[[], None],
                   on_fail: Callable[[BaseException], Frame | None]) -> None:
        """Send ``frame`` once ``ops`` are committed, keeping the order of everything sent.
        If they fail (in a group: the partition is no longer served here), ``on_fail(err)``
        says what goes in its place (None: nothing)."""
        slot: list[Any] = [frame, False]
        self._outbox.append(slot)

        def committed(err: BaseException | None) -> None:
            if err is None:
                on_commit()
            else:
                slot[0] = on_fail(err)
            slot[1] = True
            while self._outbox and self._outbox[0][1]:
                out = self._outbox.popleft()[0]
                if out is not None:
                    self.send(out)

        self.node.write_later(ops, committed, lazy=False)

    def send_in_order(self, frame: Frame) -> None:
        """Send now, unless frames waiting on a commit must go first."""
        if self._outbox:
            self._outbox.append([frame, True])
        else:
            self.send(frame)

    @staticmethod
    def refuse(writer: asyncio.StreamWriter, err: TandemError) -> None:
        """Turn a connection away before its handshake, saying why."""
        if writer.is_closing():
            return
        proto = ProtocolConnection(Role.SERVER)
        writer.write(proto.send(Error(rid=0, code=int(err.code), message=err.message,
                                      active_hint=getattr(err, "active_hint", None))))
        writer.write(proto.send(Close(code=int(err.code), reason=err.message)))
        writer.close()

    @property
    def writable(self) -> bool:
        if self._closing or self.writer.is_closing():
            return False
        if self.writer.transport.get_write_buffer_size() <= WRITE_HIGH_WATER:
            return True
        if self._drain_task is None and self._tg is not None:
            self._drain_task = self._tg.create_task(self._wait_drain())
        return False

    async def _wait_drain(self) -> None:
        try:
            await self.writer.drain()
        except ConnectionError:
            return
        finally:
            self._drain_task = None
        for c in self.consumers.values():
            self.delivery.schedule(c.queue)

    def close(self, code: int = 0, reason: str = "") -> None:
        if self._closing:
            return
        self._closing = True
        if self.writer.is_closing():
            return  # the client is gone already (uvloop raises on a write to a closed transport)
        try:
            self.writer.write(self.proto.send(Close(code=code, reason=reason)))
        except LocalProtocolError:
            pass  # a Close went out already: nothing more may follow
        self.writer.close()

    def shutdown(self, exc: TandemError) -> None:
        if self._auth is None:  # (while the client owes its SCRAM proof, only Close says why)
            self.send_error(0, exc)
        self.close(int(exc.code), exc.message)

    # -- the connection task -------------------------------------------------------------------

    async def run(self) -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                hb = tg.create_task(self._heartbeats())
                try:
                    await self._read_loop()
                finally:
                    hb.cancel()
                    if self._drain_task is not None:
                        self._drain_task.cancel()
        except* ConnectionError as group:
            log.debug("session %s: connection error: %s", self.client_name, group.exceptions[0])
        finally:
            if not self.writer.is_closing():
                self.writer.close()
            self._closing = True
            if self._admitted and self.user is not None:
                self._admitted = False
                self.guard.release(self.user.name)
            self.finished.set()

    async def _read_loop(self) -> None:
        first = True
        while not self._closing:
            data = await self.reader.read(READ_CHUNK)
            self.last_recv = self.node.clock.monotonic()
            if first and data.startswith(TLS_HANDSHAKE):  # never a frame: its length would be > 369 MB
                log.warning("session %s: a TLS handshake on the plaintext client port (a tandems:// client; "
                            "this node has no tls_cert): closed", self.client_name)
                self.close(int(ErrorCode.PROTOCOL_ERROR), "this port does not speak TLS (use tandem://)")
                return
            first = False
            self.proto.receive_data(data)
            while not self._closing:
                try:
                    event = self.proto.next_event()
                except FrameError as exc:
                    log.warning("session %s: bad frame code=%s fatal=%s: %s",
                                self.client_name, exc.code.name, exc.fatal, exc.message)
                    self.send_error(exc.rid, exc)
                    if exc.fatal:
                        self.close(int(exc.code), exc.message)
                        return
                    continue
                if event is NEED_DATA:
                    break
                if isinstance(event, ConnectionEnded):
                    self._closing = True  # no more deliveries to a peer that is gone
                    return
                await self._handle(expect(event, Frame))
            if not data:
                self._closing = True
                return
            # A read returns at once while the socket has data: let the node's other work (its
            # peer links' keep-alives above all) run between chunks of a client that floods it.
            await asyncio.sleep(0)

    async def _heartbeats(self) -> None:
        """Until the login: end it ``login_timeout`` after the connection opened, whatever
        arrives meanwhile (a client that trickles bytes holds no slot longer).  Then: send
        heartbeats when idle, drop a peer silent for 3 intervals, and end the session when
        its user no longer stands (broker.security.standing).  A client that asked for heartbeat 0
        (the blocking SDK) gets none, and TCP keepalive watches its socket."""
        clock = self.node.clock
        limit = self.node.config.login_timeout
        try:
            async with clock.timeout(max(0.0, self.connected_at + limit - clock.monotonic())):
                await self._logged_in.wait()
        except TimeoutError:
            self._time_out(f"no login within {limit:g}s of connecting (login_timeout)")
            return
        while True:
            interval = self.heartbeat
            if interval <= 0:
                return
            await clock.sleep(interval / 2)
            if not self.recheck_standing():
                return
            now = clock.monotonic()
            if now - self.last_recv > 3 * interval:
                self._time_out(f"no frame from the client for {3 * interval:.1f}s")
                return
            if now - self.last_send >= interval:
                self.send(Heartbeat())

    def _time_out(self, why: str) -> None:
        self._end(HeartbeatTimeoutError(why))

    def _end(self, err: TandemError, prefix: str = "") -> None:
        """End the session from the node's side, saying why (to the client and the log)."""
        log.warning("session %s: %s%s", self.client_name, prefix, err.message)
        self.shutdown(err)
        self.reader.feed_eof()

    @property
    def logged_in(self) -> bool:
        return self.user is not None

    def give_up_slot(self) -> None:
        """The node is at max_connections and a new connection takes this one's slot: it has
        waited longest without logging in."""
        self._end(UnavailableError("node is at max_connections and this connection had not logged in: "
                                   "its slot went to a new one"))

    def recheck_standing(self) -> bool:
        """Whether the session's user still stands as it did at login (broker.security.standing);
        if not, the session ends saying why."""
        if self.standing is None or self._closing:
            return not self._closing
        keep, why = recheck(self.node, self.standing)
        if keep is None:
            self._end(AccessRefusedError(f"session ended: {why}"), "closed: ")
            return False
        self.standing = keep
        self.user = self.node.users.get(keep.name) or self.user
        return True

    def renew_standing(self) -> None:
        """Take the user's standing as it is now (the group's first admin replacing the local
        one, or this session's own change of its password)."""
        if self.user is not None:
            self.standing = standing_of(self.node.users, self.node.acls, self.user.name)
            self.user = self.node.users.get(self.user.name) or self.user

    # -- frames ---------------------------------------------------------------------------------

    async def _handle(self, frame: Frame) -> None:
        rid = getattr(frame, "rid", 0)
        try:
            if isinstance(frame, Hello):
                await self._hello(frame)
            elif isinstance(frame, AuthResponse):
                await self._auth_response(frame)
            elif isinstance(frame, (Heartbeat, Ok, Error)):
                pass
            elif isinstance(frame, Close):
                log.info("session %s: client closed code=%d reason=%s", self.client_name, frame.code,
                         escape(frame.reason))
                self.close()
            elif self.user is None:  # (a peer's handshake frame on the client port, say)
                raise ProtocolError(f"{type(frame).__name__} before the login: this port takes Hello first")
            else:
                handler = self.requests.get(type(frame))
                if handler is None:
                    raise InvalidArgumentError(f"{type(frame).__name__} is not a request a client may send")
                if self.observer and not isinstance(frame, Status):
                    raise self.node.refusal() or NotActiveError("this session is for status only")
                try:
                    await handler(self, self.user, frame)
                except QueueNotFoundError:
                    # In a group this member may not have applied a declare the group already
                    # confirmed: catch up with the catalogue's active, then look once more.
                    # (Every handler looks the queue up before it changes anything.)
                    if not await self.node.catalogue.catch_up():
                        raise
                    await handler(self, self.user, frame)
        except TandemError as exc:
            self.send_error(rid, exc)
            if self.user is None:  # nothing but a login is served before one
                self.close(int(exc.code), exc.message)
        except Exception as exc:  # a bug must cost one request, not the node
            log.exception("session %s: internal error on %s", self.client_name, type(frame).__name__)
            self.send(Error(rid=rid, code=int(ErrorCode.INTERNAL_ERROR), message=f"internal error: {exc!r}"))

    async def _hello(self, frame: Hello) -> None:
        """Check the version and the node's readiness, start the SCRAM exchange (broker.security.auth)."""
        try:
            self._version = choose_version(frame.min_version, frame.max_version)
        except UnsupportedProtocolError as exc:
            log.warning("session %s: %s", self.peer, exc.message)
            raise
        refusal = self.node.refusal()
        if refusal is not None and not frame.observe:
            raise refusal  # a node that serves nothing (a shared-mode passive) names the one that does
        if refusal is None and self.node.users.get(frame.user) is None:
            await self._catch_up_users()  # (a node that serves nothing has no catalogue to catch up with)
        self._auth = ClientHandshake(self.guard, self.node.users, self.address)
        self.send(self._auth.hello(frame))
        self._hello_frame = frame

    async def _catch_up_users(self) -> None:
        """In a group, a user this member does not know: apply the users and grants the
        catalogue's active holds before looking it up, so one created through another member a
        moment ago logs in here too.  Bounded: a catalogue active that does not answer (a cut
        link) costs such a login LOGIN_CATCH_UP at most, and logins of known users nothing.  An
        address the failed-login throttle holds back is refused first, so guessing names costs
        the group little (docs/security.md: the extra round trip tells a patient guesser that a
        name is unknown)."""
        self.guard.check_throttle(self.address)
        try:
            async with self.node.clock.timeout(LOGIN_CATCH_UP):
                await self.node.catalogue.catch_up()
        except (TimeoutError, TandemError):
            pass  # the catalogue's active is slow, gone or changing: the users this member has

    async def _auth_response(self, frame: AuthResponse) -> None:
        """The client's proof: Welcome (with the node's own proof) or AuthError."""
        hello, auth = self._hello_frame, self._auth
        if hello is None or auth is None:  # the protocol state machine admits no AuthResponse before
            raise ProtocolError("AuthResponse before Hello")
        user, server_final = auth.response(frame)
        self._auth = None
        if not self.security.current(user):  # changed or deleted during the exchange
            raise AuthError(f"user {user.name!r} changed while it logged in: log in again")
        refusal = self.node.refusal()
        if refusal is not None and not hello.observe:
            raise refusal  # the node stopped serving during the exchange
        self.guard.admit(user.name)
        self._admitted = True
        self.user = user
        self.standing = standing_of(self.node.users, self.node.acls, user.name)
        self._logged_in.set()
        self.observer = refusal is not None
        self.client_name = f"{escape(hello.client_name)}@{self.peer}"  # (logged, and in the by= of changes)
        if hello.heartbeat > 0:
            self.heartbeat = max(0.5, min(self.heartbeat, hello.heartbeat))
        else:
            self.heartbeat = 0.0  # disabled on request; TCP keepalive is on
        cfg = self.node.config
        self.proto.max_frame_size = cfg.max_frame_size
        self.send(Welcome(version=self._version, node=cfg.name, heartbeat=self.heartbeat,
                          max_frame_size=cfg.max_frame_size, max_message_size=cfg.max_message_size,
                          auth=server_final))
        log.info("session %s: open user=%s version=%d", self.client_name, escape(user.name), self._version)

    # -- the consumer side (broker.messaging.queues.Recipient) ----------------------------------

    def new_tag(self) -> int:
        """This connection's next delivery tag."""
        tag = self._next_tag
        self._next_tag = tag + 1
        return tag

    def tag(self, c: Consumer, m: Msg) -> Delivery:
        """``m`` delivered to ``c`` under this connection's next delivery tag, held until settled."""
        tag = self.new_tag()
        self.deliveries[tag] = (c, m)
        return Delivery(tag, m.partition, m.offset, m.key, m.headers, m.body, m.dc > 1, m.dc, m.ts, m.id)

    def deliver(self, c: Consumer, msgs: list[Msg]) -> None:
        delivery = self.delivery
        marks, marked = delivery.record_deliveries(c.queue, msgs)
        c.unacked += len(msgs)
        frame = Deliver(consumer=c.id, messages=[self.tag(c, m) for m in msgs])
        if marks:
            tags = [d.tag for d in frame.messages]
            self.send_after(marks, frame, marked, lambda _err: delivery.undeliver(self, tags))
        else:
            self.send_in_order(frame)

    def cancelled_by_broker(self, c: Consumer, reason: str) -> None:
        self.consumers.pop(c.id, None)
        self.delivery.remove_consumer(c)
        self.send_in_order(Cancel(rid=0, consumer=c.id))
        log.info("session %s: consumer %d cancelled: %s", self.client_name, c.id, reason)


def requests(*groups: Requests[Session]) -> dict[type[Frame], Handler[Session]]:
    """The table of every request a logged-in client may send, from the node's handler groups."""
    table: dict[type[Frame], Handler[Session]] = {}
    for group in groups:
        table.update(group.handlers())
    return table


def _tune_socket(writer: asyncio.StreamWriter) -> None:
    """No Nagle delay; TCP keepalive that notices a dead peer within about a minute
    (clients with heartbeats off, like the blocking SDK, rely on it)."""
    sock = writer.get_extra_info("socket")
    if sock is None:
        return
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, opt):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)

