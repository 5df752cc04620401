"""One client connection: a thin asyncio shell around the sans-IO protocol.

The read loop moves bytes from the socket into :class:`ProtocolConnection`,
turns each frame into a call on the :class:`Node`, and writes what comes back.
Publishes and acks do not block the loop: their replies are written when the
store confirms, so a client may pipeline many batches.  Queue administration
(declare, delete, purge) and stream reads are awaited in order.

A bad frame gets an ``Error`` frame naming its request id; a frame the stream
cannot recover from (over ``max_frame_size``, or anything wrong before the
handshake) gets an ``Error`` and the connection is closed.  Either way the node
and its other clients go on.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from broker.messaging.outcome import Outcome
from broker.messaging.publish import PublishRequest, PublishResult
from broker.sessions.status import StatusSource, status_of
from broker.messaging import delivery as _delivery
from broker.messaging.publish import Publisher
from broker.security.auth import ClientGuard, ClientHandshake
from broker.security.acl import AclTable
from broker.partitions.drain import Drains
from broker.logsafe import escape
from broker.partitions.members import GroupMembers
from broker.partitions.moves import Moves
from broker.partitions.remap import Remaps
from broker.security.security import Security
from broker.security.standing import Standing, recheck, standing_of
from broker.messaging.streams import Produced as StreamProduced
from broker.security.users import UserRegistry, make_user
from client.clock import Clock
from storage.writer import Callback
from broker.partitions.quarantine import refuse_client_write
from broker.messaging.queues import Consumer, Msg, Queue
from client.errors import (
    AccessRefusedError,
    AuthError,
    ConsumerNotFoundError,
    ErrorCode,
    HeartbeatTimeoutError,
    InvalidArgumentError,
    LocalProtocolError,
    NotActiveError,
    ProtocolError,
    QueueNotFoundError,
    StorageError,
    TandemError,
    UnavailableError,
    UnknownDeliveryTagError,
    UnsupportedProtocolError,
)
from client.protocol import (HANDSHAKE_MAX_FRAME, NEED_DATA, ConnectionEnded, FrameError, ProtocolConnection, Role,
                             choose_version)
from client.protocol.frames import (
    AclGrant,
    AclInfo,
    AclList,
    AclRevoke,
    Acls,
    UserDelete,
    UserInfo,
    UserList,
    UserPut,
    Users,
    PartitionMap,
    QueueInfo,
    StreamMessage,
    Ack,
    AuthResponse,
    Cancel,
    Close,
    Declare,
    DeclareOk,
    Deliver,
    Delivery,
    Delete,
    Error,
    Frame,
    Get,
    GetOk,
    Heartbeat,
    Hello,
    ListQueues,
    Nack,
    Ok,
    Metadata,
    MetadataOk,
    Publish,
    PublishOk,
    Purge,
    PurgeOk,
    Queues,
    Produced,
    Read,
    ReadOk,
    Reject,
    SetOption,
    ChangeGroup,
    ChangePartitions,
    DrainNode,
    MovePartition,
    SetQuorumOverride,
    Status,
    Subscribe,
    SubscribeOk,
    Welcome,
    expect,
)
from storage.base import AclRecord, UserRecord, WriteOp


class SessionHost(StatusSource, Protocol):
    """What a client session needs from its node."""
    clock: Clock
    users: UserRegistry
    guard: ClientGuard
    acls: AclTable
    security: Security
    drains: Drains
    moves: Moves
    remaps: Remaps
    group: GroupMembers
    confirms: int
    publisher: Publisher

    @property
    def delivery(self) -> _delivery.Delivery: ...

    def queue(self, name: str) -> Queue: ...

    def require_quorum(self, what: str) -> None: ...

    @property
    def has_quorum(self) -> bool: ...

    def refusal(self) -> NotActiveError | None:
        """Why this node serves no client now (a shared-mode passive), or None."""
        ...

    def partition_map(self, name: str, session: Any = None) -> PartitionMap: ...

    def write_later(self, ops: list[WriteOp], callback: Callback | None = None, *, lazy: bool = True) -> None: ...

    async def declare(self, frame: Declare, owner: str | None = None) -> tuple[QueueInfo, bool]: ...

    async def delete(self, name: str, if_empty: bool) -> None: ...

    async def purge(self, name: str) -> int: ...

    async def catch_up_catalogue(self) -> bool: ...

    async def read_stream(self, queue: str, partition: int, offset: int, max_messages: int,
                          *, hops: int = 0) -> tuple[list[StreamMessage], int, int]: ...

    async def produced(self, queue: str, partition: int, producer: str, offset: int,
                       *, hops: int = 0) -> StreamProduced: ...

log = logging.getLogger("tandem.broker")

#: seconds a login may wait for this member to catch up with the group's users
LOGIN_CATCH_UP = 1.0

READ_CHUNK = 256 * 1024
#: the first bytes of a TLS ClientHello (a handshake record, version 3.x)
TLS_HANDSHAKE = b"\x16\x03"
WRITE_HIGH_WATER = 4 * 1024 * 1024


class Session:
    def __init__(self, node: SessionHost, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.node = node
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
        self._next_tag = 1
        cfg = node.config
        # shared mode: clients learn that a paused or cut-off active is gone by its silence
        # (the passive cannot tell them), so they hear from it at least every half lease
        self.heartbeat = min(cfg.heartbeat, max(0.5, cfg.lease / 2)) if cfg.mode == "shared" else cfg.heartbeat
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
        self.send(_error(rid, exc))

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
            self.node.delivery.schedule(c.queue)

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
                self.node.guard.release(self.user.name)
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
                handler = _HANDLERS.get(type(frame))
                if handler is None:
                    raise InvalidArgumentError(f"{type(frame).__name__} is not a request a client may send")
                if self.observer and not isinstance(frame, Status):
                    raise self.node.refusal() or NotActiveError("this session is for status only")
                try:
                    await handler(self, frame)
                except QueueNotFoundError:
                    # In a group this member may not have applied a declare the group already
                    # confirmed: catch up with the catalogue's active, then look once more.
                    # (Every handler looks the queue up before it changes anything.)
                    if not await self.node.catch_up_catalogue():
                        raise
                    await handler(self, frame)
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
        self._auth = ClientHandshake(self.node.guard, self.node.users, self.address)
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
        self.node.guard.check_throttle(self.address)
        try:
            async with self.node.clock.timeout(LOGIN_CATCH_UP):
                await self.node.catch_up_catalogue()
        except (TimeoutError, TandemError):
            pass  # the catalogue's active is slow, gone or changing: the users this member has

    async def _auth_response(self, frame: AuthResponse) -> None:
        """The client's proof: Welcome (with the node's own proof) or AuthError."""
        hello, auth = self._hello_frame, self._auth
        if hello is None or auth is None:  # the protocol state machine admits no AuthResponse before
            raise ProtocolError("AuthResponse before Hello")
        user, server_final = auth.response(frame)
        self._auth = None
        if not self.node.security.current(user):  # changed or deleted during the exchange
            raise AuthError(f"user {user.name!r} changed while it logged in: log in again")
        refusal = self.node.refusal()
        if refusal is not None and not hello.observe:
            raise refusal  # the node stopped serving during the exchange
        self.node.guard.admit(user.name)
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

    def _authenticated(self) -> UserRecord:
        if self.user is None:  # the protocol state machine admits no request before Hello
            raise ProtocolError("request before the handshake")
        return self.user

    def _may(self, permission: str, queue: str, what: str | None = None) -> None:
        """The user must hold ``permission`` on ``queue`` (broker.security.acl); a request that changes
        state (``what``) also needs the node's quorum."""
        self.node.acls.check(self._authenticated(), permission, queue)
        if what is not None:
            self.node.require_quorum(what)

    def _group_admin(self, what: str) -> UserRecord:
        """A group operation: the user needs the ``admin`` permission (role admin or granted)."""
        user = self._authenticated()
        self.node.acls.check_group(user, what)
        return user

    async def _declare(self, f: Declare) -> None:
        self._may("configure", f.queue, "declare queues")
        self.node.acls.check_declare(self._authenticated(), f.queue, f.dead_letter_queue)
        info, created = await self.node.declare(f, self._authenticated().name)
        self.send(DeclareOk(rid=f.rid, queue=info, created=created))

    async def _delete(self, f: Delete) -> None:
        self._may("configure", f.queue, "delete queues")
        await self.node.delete(f.queue, f.if_empty)
        self.send(Ok(rid=f.rid))

    async def _purge(self, f: Purge) -> None:
        self._may("configure", f.queue, "purge queues")
        self.send(PurgeOk(rid=f.rid, purged=await self.node.purge(f.queue)))

    async def _list(self, f: ListQueues) -> None:
        user, acls = self._authenticated(), self.node.acls
        self.send(Queues(rid=f.rid, queues=[q.info() for q in self.node.queues.values() if acls.may_see(user, q.name)]))

    async def _publish(self, f: Publish) -> None:
        self._may("produce", f.queue, "publish")
        refuse_client_write(f.queue, "publish")
        result = self.node.publisher.publish(PublishRequest(f.queue, f.producer_id, f.messages, partition=f.partition,
                                                            dense=f.partition is not None))
        result.add_done_callback(functools.partial(self._published, f.rid))

    def _published(self, rid: int, result: Outcome[PublishResult]) -> None:
        err = result.exception()
        if err is None:
            r = result.result()
            self.node.confirms += r.stored + r.duplicates
            self.send(PublishOk(rid=rid, stored=r.stored, duplicates=r.duplicates, next_seq=r.last_seq + 1))
        elif isinstance(err, TandemError):
            self.send_error(rid, err)
        else:
            log.error("session %s: publish failed: %r", self.client_name, err, exc_info=err)
            self.send(Error(rid=rid, code=int(ErrorCode.INTERNAL_ERROR), message=repr(err)))

    async def _metadata(self, f: Metadata) -> None:
        # read-only, like a stream read: any permission on the queue (a producer routes with it,
        # a monitor's Spark job reads with it), any node (a minority node answers with what it knows)
        user = self._authenticated()
        if not self.node.acls.may_see(user, f.queue):
            raise AccessRefusedError(f"access refused: user {user.name!r} (role {user.role}) has no permission "
                                     f"on queue {f.queue!r}")
        self.send(MetadataOk(rid=f.rid, map=self.node.partition_map(f.queue, self), quorum=self.node.has_quorum))

    async def _subscribe(self, f: Subscribe) -> None:
        self._may("consume", f.queue, "consume")
        c = self.node.delivery.add_consumer(self, f.queue, f.prefetch)
        self.consumers[c.id] = c
        self.send(SubscribeOk(rid=f.rid, consumer=c.id))

    async def _cancel(self, f: Cancel) -> None:
        c = self.consumers.pop(f.consumer, None)
        if c is None:
            raise ConsumerNotFoundError(f"no consumer {f.consumer} on this connection")
        self.node.delivery.remove_consumer(c)
        self.send_in_order(Ok(rid=f.rid))  # after any delivery still waiting on a commit

    def cancelled_by_broker(self, c: Consumer, reason: str) -> None:
        self.consumers.pop(c.id, None)
        self.node.delivery.remove_consumer(c)
        self.send_in_order(Cancel(rid=0, consumer=c.id))
        log.info("session %s: consumer %d cancelled: %s", self.client_name, c.id, reason)

    def _delivery(self, c: Consumer, m: Msg) -> Delivery:
        tag = self._next_tag
        self._next_tag = tag + 1
        self.deliveries[tag] = (c, m)
        return Delivery(tag, m.partition, m.offset, m.key, m.headers, m.body, m.dc > 1, m.dc, m.ts, m.id)

    def deliver(self, c: Consumer, msgs: list[Msg]) -> None:
        marks, marked = self.node.delivery.record_deliveries(c.queue, msgs)
        c.unacked += len(msgs)
        frame = Deliver(consumer=c.id, messages=[self._delivery(c, m) for m in msgs])
        if marks:
            tags = [d.tag for d in frame.messages]
            self.send_after(marks, frame, marked, lambda _err: self._undeliver(tags))
        else:
            self.send_in_order(frame)

    def _undeliver(self, tags: list[int]) -> None:
        """The delivered mark of these deliveries did not commit: they never leave.  A
        message a consumer saw must come again counted, so none is shown before its mark
        is in the log; ready again here, or the new active's if the partition moved."""
        held = [self.deliveries.pop(t) for t in tags if t in self.deliveries]
        if held:
            self.node.delivery.requeue(held, counted=False)

    async def _get(self, f: Get) -> None:
        self._may("consume", f.queue, "get")
        q = self.node.queue(f.queue)
        msgs = q.take(1, self.node.config.max_frame_size)
        if not msgs:
            self.send_in_order(GetOk(rid=f.rid, message=None))
            return
        marks, marked = self.node.delivery.record_deliveries(q, msgs)
        holder = Consumer(0, q, self, 1)
        holder.unacked = 1
        d = self._delivery(holder, msgs[0])
        if f.auto_ack:
            self.node.delivery.ack([self.deliveries.pop(d.tag)])
        if marks:
            def failed(err: BaseException) -> Frame:
                self._undeliver([d.tag])
                return _error(f.rid, err if isinstance(err, TandemError) else StorageError(f"get: {err}"))

            self.send_after(marks, GetOk(rid=f.rid, message=d), marked, failed)
        else:
            self.send_in_order(GetOk(rid=f.rid, message=d))

    def _settle(self, tags: list[int], multiple: bool) -> tuple[list[tuple[Consumer, Msg]], list[int]]:
        held = self.deliveries
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

    def _settled(self, rid: int, unknown: list[int]) -> None:
        if unknown:
            shown = ", ".join(map(str, unknown[:10])) + (" ..." if len(unknown) > 10 else "")
            self.send_error(rid, UnknownDeliveryTagError(
                f"unknown delivery tag(s) {shown}: not held by this connection "
                "(already settled, or delivered on an earlier connection)"))
        else:
            self.send(Ok(rid=rid))

    async def _ack(self, f: Ack) -> None:
        settled, unknown = self._settle(f.tags, f.multiple)
        self.node.delivery.ack(settled)
        self._settled(f.rid, unknown)

    async def _nack(self, f: Nack) -> None:
        settled, unknown = self._settle(f.tags, f.multiple)
        if f.requeue:
            self.node.delivery.requeue(settled, counted=f.delivered)
        else:
            self.node.delivery.dead_letter(settled, "rejected")
        self._settled(f.rid, unknown)

    async def _reject(self, f: Reject) -> None:
        settled, unknown = self._settle(f.tags, f.multiple)
        self.node.delivery.dead_letter(settled, "rejected")
        self._settled(f.rid, unknown)

    async def _status(self, f: Status) -> None:
        user, acls = self._authenticated(), self.node.acls
        self.send(status_of(self.node, f.rid, lambda q: acls.may_see(user, q)))

    async def _set_quorum_override(self, f: SetQuorumOverride) -> None:
        self._group_admin("set quorum_override")  # allowed without quorum: that is its point
        self.node.set_quorum_override(f.nodes, by=self.client_name)
        self.send(status_of(self.node, f.rid))

    async def _set_option(self, f: SetOption) -> None:
        self._group_admin(f"set {f.name}")  # allowed without quorum, like the override
        self.node.set_option(f.name, f.value, by=self.client_name)
        self.send(status_of(self.node, f.rid))

    async def _drain_node(self, f: DrainNode) -> None:
        verb = "drain" if f.drained else "undrain"
        user = self._group_admin(f"{verb} a node")
        await self.node.drains.set(f.node, f.drained, f"{user.name} ({self.client_name})")
        self.send(status_of(self.node, f.rid))

    async def _move_partition(self, f: MovePartition) -> None:
        user = self._group_admin("move a partition")
        await self.node.moves.move(f.queue, f.partition, tuple(f.nodes), f"{user.name} ({self.client_name})",
                                   force=f.force_replication)
        self.send(status_of(self.node, f.rid))

    async def _change_partitions(self, f: ChangePartitions) -> None:
        user = self._group_admin(f"{f.action} partitions")
        by = f"{user.name} ({self.client_name})"
        if f.action == "add":
            await self.node.remaps.add(f.queue, f.count, f.placement, by)
        elif f.action == "update":
            await self.node.remaps.update(f.queue, f.mapper, by)
        else:
            raise InvalidArgumentError(f"partition change: action {f.action!r} is not add or update")
        self.send(status_of(self.node, f.rid))

    async def _change_group(self, f: ChangeGroup) -> None:
        user = self._group_admin(f"{f.action} a member")
        by = f"{user.name} ({self.client_name})"
        if f.action == "add":
            await self.node.group.add(f.node, f.address, f.zone, by)
        elif f.action == "remove":
            await self.node.group.remove(f.node, by)
        else:
            raise InvalidArgumentError(f"group change: action {f.action!r} is not add or remove")
        self.send(status_of(self.node, f.rid))

    async def _read(self, f: Read) -> None:
        self._may("browse", f.queue)
        msgs, nxt, end = await self.node.read_stream(f.queue, f.partition, f.offset, f.max_messages)
        self.send(ReadOk(rid=f.rid, messages=msgs, next_offset=nxt, end_offset=end))

    async def _produced(self, f: Produced) -> None:
        self._may("browse", f.queue)
        self.send((await self.node.produced(f.queue, f.partition, f.producer, f.offset)).ok(f.rid))

    # -- users and grants (the group's: broker.security.security) ------------------------------------------

    async def _user_put(self, f: UserPut) -> None:
        self._group_admin("manage users")
        role = f.role
        if f.mode == "password":
            have = self.node.users.get(f.name)
            role = have.role if have is not None else "user"  # the catalogue's active keeps the role it has
        user = await asyncio.to_thread(make_user, f.name, f.password, role)  # scrypt: off the loop
        mine = self.standing is not None and f.name == self.standing.name and f.mode == "password"
        if mine:  # a user changing its own password keeps this session (its others end)
            self.standing = None
        try:
            await self.node.security.put_user(user, f.mode)
        finally:
            if mine:
                self.renew_standing()
        log.warning("session %s: user %s %s", self.client_name, escape(f.name),
                    "password changed" if f.mode == "password" else f"stored (role {role})")
        self.send(Ok(rid=f.rid))

    async def _user_delete(self, f: UserDelete) -> None:
        user = self._group_admin("manage users")
        if f.name == user.name:
            raise InvalidArgumentError("you cannot delete the user you are logged in as")
        await self.node.security.drop_user(f.name)
        log.warning("session %s: user %s deleted", self.client_name, escape(f.name))
        self.send(Ok(rid=f.rid))

    async def _user_list(self, f: UserList) -> None:
        self._group_admin("list users")
        users = self.node.users
        self.send(Users(rid=f.rid, users=[UserInfo(n, u.role) for n in users.names()
                                          if (u := users.get(n)) is not None]))

    async def _acl_grant(self, f: AclGrant) -> None:
        self._group_admin("grant permissions")
        await self.node.security.grant(AclRecord(user=f.user, pattern=f.pattern, permissions=tuple(f.permissions)))
        log.warning("session %s: granted %s on %s to %s", self.client_name, ",".join(f.permissions),
                    escape(f.pattern), escape(f.user))
        self.send(Ok(rid=f.rid))

    async def _acl_revoke(self, f: AclRevoke) -> None:
        self._group_admin("revoke permissions")
        await self.node.security.revoke(AclRecord(user=f.user, pattern=f.pattern, permissions=tuple(f.permissions)))
        log.warning("session %s: revoked %s on %s from %s", self.client_name, ",".join(f.permissions),
                    escape(f.pattern), escape(f.user))
        self.send(Ok(rid=f.rid))

    async def _acl_list(self, f: AclList) -> None:
        user = self._authenticated()
        if f.user != user.name:  # a user may see its own grants; everyone's take the admin permission
            self._group_admin("list the grants of other users")
        records = self.node.acls.records(f.user)
        self.send(Acls(rid=f.rid, acls=[AclInfo(a.user, a.pattern, list(a.permissions)) for a in records]))


def _error(rid: int, exc: TandemError) -> Error:
    """The Error frame that answers request ``rid`` with ``exc``."""
    return Error(rid=rid, code=int(exc.code), message=exc.message, active_hint=getattr(exc, "active_hint", None),
                 next_seq=getattr(exc, "next_seq", None))


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


_HANDLERS: dict[type[Frame], Callable[[Session, Any], Awaitable[None]]] = {
    Declare: Session._declare, Delete: Session._delete, Purge: Session._purge,
    ListQueues: Session._list, Publish: Session._publish, Subscribe: Session._subscribe,
    Cancel: Session._cancel, Get: Session._get, Ack: Session._ack, Nack: Session._nack,
    Reject: Session._reject, Read: Session._read, Produced: Session._produced, Status: Session._status,
    SetQuorumOverride: Session._set_quorum_override,
    SetOption: Session._set_option, DrainNode: Session._drain_node,
    MovePartition: Session._move_partition, ChangeGroup: Session._change_group,
    ChangePartitions: Session._change_partitions, Metadata: Session._metadata,
    UserPut: Session._user_put, UserDelete: Session._user_delete, UserList: Session._user_list,
    AclGrant: Session._acl_grant, AclRevoke: Session._acl_revoke, AclList: Session._acl_list,
}
