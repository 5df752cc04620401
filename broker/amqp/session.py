"""An AMQP 0-9-1 client connection on a node's ``amqp_port``.

An :class:`AmqpSession` is a client session (:class:`broker.sessions.session.Session`) whose
wire speaks AMQP: the node sees the same requests a Tandem client sends, through the same
handlers (ACLs, forwarding to a partition's active, relays, confirms, exchanges), and each
AMQP method becomes one of them (:mod:`broker.amqp.methods`).  What the handlers answer comes
back through :meth:`AmqpSession.send` and is turned into AMQP: a reply to the method that asked,
``basic.deliver`` for a delivery, ``basic.cancel`` for a consumer the node cancelled.

The connection: the protocol header, ``connection.start`` (SASL ``PLAIN`` or ``AMQPLAIN``
against the node's users; a failed login closes with 403), ``tune`` (the node's heartbeat,
frame_max 128 KiB), ``open`` of the virtual host ``/`` (the only one).  A fault in a channel's
request closes that channel with the AMQP reply code a client expects; a fault in the
connection's framing closes the connection (:mod:`broker.amqp.wire`).  Either way the node and
its other clients go on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from pamqp import commands as C
from pamqp import decode
from pamqp.base import Frame as AmqpMethod

from broker.amqp import codes
from broker.amqp.channel import Channel
from broker.amqp.methods import Methods
from broker.amqp.publishing import batches
from broker.amqp.wire import (AmqpWire, Beat, ChannelError, HeaderOk, Method, ReplyCode, WireError,
                              server_properties)
from broker.logsafe import escape
from broker.security.standing import standing_of
from broker.security.users import credentials
from broker.sessions.requests import error_frame
from broker.sessions.session import READ_CHUNK, Session, SessionParts
from client.errors import AuthError, QueueNotFoundError, TandemError
from client.protocol.frames import Cancel, Close, Deliver, Error, Frame, Heartbeat
from client.scram import check_password

log = logging.getLogger("tandem.broker")

Reply = Callable[[Frame], None]
VHOST = "/"
CHANNEL_MAX = 2047
FRAME_MAX = 131072
#: seconds between two looks at the node's disk alarm (broker.node.diskalarm checks as often)
ALARM_CHECK = 0.5


class AmqpSession(Session):
    def __init__(self, parts: SessionParts, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        super().__init__(parts, reader, writer)
        cfg = self.node.config
        self.wire = AmqpWire(frame_max=FRAME_MAX, max_message_size=cfg.max_message_size)
        self.channels: dict[int, Channel] = {}
        self.consumer_channel: dict[int, int] = {}  # the node's consumer id -> its channel
        self.temporary: set[str] = set()  # exclusive queues: deleted when the connection ends
        self.version = ""
        self._replies: dict[int, Reply] = {}
        self._out: list[bytes] = []  # written this turn of the event loop (write)
        self._next_rid = 1
        self._opened = False  # connection.open answered
        self._tuned = False
        self.methods = Methods(self)

    # -- output ---------------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        """Queue ``data`` for the client: what one turn of the event loop writes goes out in one
        write (a run of confirms or deliveries is one send, not one each)."""
        if self.writer.is_closing():
            return
        if not self._out:
            asyncio.get_running_loop().call_soon(self._flush)
        self._out.append(data)
        self.last_send = self.node.clock.monotonic()

    def _flush(self) -> None:
        out, self._out = self._out, []
        if out and not self.writer.is_closing():
            self.writer.write(b"".join(out))

    def _close_writer(self) -> None:
        self._flush()
        self.writer.close()

    def method(self, channel: int, m: AmqpMethod) -> None:
        self.write(self.wire.method(channel, m))

    def send(self, frame: Frame) -> None:
        """What the node's handlers send: a reply to the request that asked, a delivery, a
        consumer the node cancelled."""
        if self._closing or self.writer.is_closing():
            return
        if isinstance(frame, Deliver):
            self.methods.delivered(frame)
        elif isinstance(frame, Cancel) and frame.rid == 0:
            self.methods.cancelled(frame.consumer)
        elif isinstance(frame, Heartbeat):  # (the session's heartbeats: AMQP's own frame)
            self.write(self.wire.heartbeat())
        elif isinstance(frame, Close):
            pass
        else:
            reply = self._replies.pop(getattr(frame, "rid", 0), None)
            if reply is not None:
                reply(frame)

    async def request(self, make: Callable[[int], Frame], reply: Reply) -> None:
        """Hand the node's request ``make(rid)`` to its handler; ``reply`` gets the answer (a
        reply frame or an Error)."""
        rid = self._next_rid
        self._next_rid += 1
        self._replies[rid] = reply
        frame = make(rid)
        handler = self.requests[type(frame)]
        user = self.user
        try:
            if user is None:  # (the methods are read only once the connection is open, after the login)
                raise AuthError("a request before the login")
            try:
                await handler(self, user, frame)
            except QueueNotFoundError:
                if not await self.node.catalogue.catch_up():  # (as a Tandem client's session does)
                    raise
                await handler(self, user, frame)
        except TandemError as exc:
            self.send(error_frame(rid, exc))
        except Exception as exc:  # a bug must cost one request, not the node
            log.exception("session %s: internal error on %s", self.client_name, type(frame).__name__)
            self.send(Error(rid=rid, code=int(codes.INTERNAL), message=f"internal error: {exc!r}"))

    def task(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` as a task of the connection (a stream consumer's reader): it ends with it."""
        if self._tg is not None and not self._closing:
            self._tg.create_task(coro)
        else:
            coro.close()

    def spawn(self, make: Callable[[int], Frame], reply: Reply | None = None) -> None:
        """:meth:`request` as a task of the connection (an ack the client did not ask for)."""
        if self._tg is not None and not self._closing:
            self._tg.create_task(self.request(make, reply or (lambda _f: None)))

    def close(self, code: int = 0, reason: str = "") -> None:
        """End the connection: ``connection.close`` with the AMQP reply code for the node's
        error ``code`` (0: a clean close)."""
        reply = codes.of(code) if code else ReplyCode.CONNECTION_FORCED
        self.close_amqp(reply, codes.text(reply, reason or "closed by the node"))

    def close_amqp(self, reply_code: int, text: str, class_id: int = 0, method_id: int = 0) -> None:
        if self._closing:
            return
        self._closing = True
        for ch in self.channels.values():
            ch.close()
        if not self.writer.is_closing():
            self.write(self.wire.method(0, C.Connection.Close(reply_code=reply_code, reply_text=text[:255],
                                                             class_id=class_id, method_id=method_id)))
            self._close_writer()

    def close_channel(self, number: int, reply_code: int, text: str, class_id: int = 0, method_id: int = 0) -> None:
        """``channel.close`` for a fault in one of its requests: what it held is given back."""
        ch = self.channels.get(number)
        if ch is None or ch.closing:
            return
        ch.close()
        self.method(number, C.Channel.Close(reply_code=reply_code, reply_text=text[:255], class_id=class_id,
                                            method_id=method_id))
        self.methods.drop_channel(ch)

    # -- the connection task --------------------------------------------------------------------

    async def _read_loop(self) -> None:
        try:
            await self._read()
        finally:  # (the connection's tasks end with it: a stream consumer's reader waiting for an ack too)
            for ch in self.channels.values():
                ch.close()
                for c in ch.consumers.values():
                    if c.stream is not None:
                        c.stream.stop()

    async def _read(self) -> None:
        while not self._closing:
            data = await self.reader.read(READ_CHUNK)
            self.last_recv = self.node.clock.monotonic()
            if not data:
                self._closing = True
                return
            while not self._closing:
                fault: WireError | ChannelError | None = None
                try:
                    events = self.wire.feed(data)
                except (WireError, ChannelError) as exc:
                    events, fault = list(exc.events), exc
                for event in batches(events):
                    if self._closing:
                        return
                    await self._event(event)
                if fault is None:
                    break
                if isinstance(fault, ChannelError):  # (that channel closes; the frames after it are read on)
                    self.close_channel(fault.channel, fault.reply_code, fault.reply_text, fault.class_id,
                                       fault.method_id)
                    data = b""
                    continue
                log.warning("session %s: %s", self.client_name, fault.reply_text or "not AMQP 0-9-1")
                if fault.send_header:  # (not AMQP 0-9-1: the header this port speaks, then closed)
                    self.write(AmqpWire.PROTOCOL_HEADER)
                    self._closing = True
                    self._close_writer()
                else:
                    self.close_amqp(fault.reply_code, fault.reply_text, fault.class_id, fault.method_id)
                return
            await asyncio.sleep(0)  # (a flooding client leaves room for the node's other work)

    async def _event(self, event: Any) -> None:
        if isinstance(event, HeaderOk):
            self.method(0, C.Connection.Start(server_properties=server_properties(self.version_label()),
                                              mechanisms="PLAIN AMQPLAIN", locales="en_US"))
        elif isinstance(event, Beat):
            pass
        elif isinstance(event, Method) and (event.channel == 0 or not self._opened):
            await self._connection(event.channel, event.method)
        elif isinstance(event, Method):
            await self.methods.channel_method(event.channel, event.method)
        elif isinstance(event, list):  # (basic.publish, in a row: broker.amqp.publishing.batches)
            if not self._opened:
                self.close_amqp(ReplyCode.COMMAND_INVALID, "COMMAND_INVALID - basic.publish before connection.open")
            else:
                await self.methods.publish(event)

    def version_label(self) -> str:
        from broker import __version__
        return str(__version__)

    async def _connection(self, channel: int, m: AmqpMethod) -> None:
        if channel != 0:
            self.close_amqp(ReplyCode.CHANNEL_ERROR, f"CHANNEL_ERROR - channel {channel} before connection.open")
        elif isinstance(m, C.Connection.StartOk) and self.user is None:
            await self._login(m)
        elif isinstance(m, C.Connection.TuneOk) and self.user is not None and not self._tuned:
            self._tuned = True
            if m.frame_max:
                self.wire.frame_max = max(4096, min(FRAME_MAX, m.frame_max))
            self.heartbeat = float(m.heartbeat)
        elif isinstance(m, C.Connection.Open) and self._tuned and not self._opened:
            if m.virtual_host != VHOST:
                self.close_amqp(ReplyCode.NOT_ALLOWED, f"NOT_ALLOWED - vhost {m.virtual_host} not found "
                                                   f"(this node has the one virtual host {VHOST})")
                return
            self._opened = True
            self.method(0, C.Connection.OpenOk())
        elif isinstance(m, C.Connection.Close):
            self.method(0, C.Connection.CloseOk())
            self._closing = True
            self._close_writer()
        elif isinstance(m, C.Connection.CloseOk):
            self._closing = True
            self._close_writer()
        elif isinstance(m, (C.Connection.Blocked, C.Connection.Unblocked)):
            pass
        elif isinstance(m, C.Connection.UpdateSecret) and self._opened:
            await self._update_secret(m)
        else:
            self.close_amqp(ReplyCode.COMMAND_INVALID, f"COMMAND_INVALID - {m.name} is not expected now",
                            *codes.ids(m))

    async def _login(self, m: C.Connection.StartOk) -> None:
        """SASL PLAIN or AMQPLAIN against the node's users (the login throttle as for Tandem's
        own clients); ``connection.tune`` once the user is admitted, 403 otherwise."""
        name, password = _credentials(m.mechanism, m.response)
        try:
            self.guard.check_throttle(self.address)
            if name is None or password is None:
                raise AuthError(f"mechanism {m.mechanism} is not one this port takes (PLAIN, AMQPLAIN)")
            user = self.node.users.get(name)
            creds = credentials(user) if user is not None else None
            ok = creds is not None and await asyncio.to_thread(check_password, password, creds)
            if not ok or user is None:
                self.guard.login_failed(self.address, name, "bad user or password")
                raise AuthError(f"Login was refused using authentication mechanism {m.mechanism}")
            self.guard.login_succeeded(self.address)
            refusal = self.node.refusal()
            if refusal is not None:
                raise refusal
            self.guard.admit(user.name)
        except TandemError as exc:
            log.warning("session %s: amqp login refused: %s", self.peer, exc.message)
            self.close_amqp(ReplyCode.ACCESS_REFUSED if isinstance(exc, AuthError) else codes.of(int(exc.code)),
                            f"ACCESS_REFUSED - {exc.message}" if isinstance(exc, AuthError) else exc.message)
            return
        self._admitted = True
        self.user = user
        self.standing = standing_of(self.node.users, self.node.acls, user.name)
        self._logged_in.set()
        props = m.client_properties if isinstance(m.client_properties, dict) else {}
        product = props.get("product", "amqp")
        capabilities = props.get("capabilities")
        if isinstance(capabilities, dict) and capabilities.get("connection.blocked") is True and self._tg is not None:
            self._tg.create_task(self._watch_alarm())
        self.client_name = f"{escape(str(product))}@{self.peer}"
        beat = self.node.config.client_heartbeat
        self.heartbeat = beat
        self.method(0, C.Connection.Tune(channel_max=CHANNEL_MAX, frame_max=FRAME_MAX, heartbeat=int(beat)))
        log.info("session %s: amqp open user=%s", self.client_name, escape(user.name))

    async def _update_secret(self, m: C.Connection.UpdateSecret) -> None:
        """connection.update-secret (a client rotating an OAuth token): update-secret-ok, as
        RabbitMQ answers it for users of its own database.  The connection stays the user's it
        logged in as; a password is checked at login only, so the new secret changes nothing."""
        log.info("session %s: amqp update-secret (%s): the connection stays %s's", self.client_name,
                 escape(m.reason or ""), escape(self.user.name if self.user is not None else ""))
        self.method(0, C.Connection.UpdateSecretOk())

    async def _watch_alarm(self) -> None:
        """``connection.blocked`` while the node's disk alarm is raised (its publishes are refused),
        ``connection.unblocked`` once it clears: for a client that said it takes them."""
        blocked = False
        while not self._closing:
            why = self.node.alarmed()
            if (why is not None) != blocked:
                blocked = why is not None
                self.method(0, C.Connection.Blocked(reason=f"low on disk: {why}"[:255]) if why is not None
                            else C.Connection.Unblocked())
            await self.node.clock.sleep(ALARM_CHECK)

    async def run(self) -> None:
        try:
            await super().run()
        finally:
            consumed = {c.queue for ch in self.channels.values() for c in ch.consumers.values() if c.stream is None}
            for name in sorted(consumed - self.temporary):  # (its consumers go: an auto-delete queue with them)
                await self.methods.declares.unused(name, leaving=self)
            for name in sorted(self.temporary):  # (exclusive queues end with their connection)
                try:
                    await self.node.catalogue.delete(name, False)
                except TandemError as exc:
                    log.info("session %s: queue %s left: %s", self.client_name, name, exc.message)

    def user_name(self) -> str:
        return self.user.name if self.user is not None else ""

    def shutdown(self, exc: TandemError) -> None:
        self.close(int(exc.code), exc.message)


def _credentials(mechanism: str, response: Any) -> tuple[str | None, str | None]:
    """(user, password) of a ``connection.start-ok``'s SASL response; (None, None) if unreadable."""
    raw = response.encode("utf-8", "surrogateescape") if isinstance(response, str) else bytes(response or b"")
    if mechanism == "PLAIN":
        parts = raw.split(b"\x00")
        if len(parts) == 3:
            try:
                return parts[1].decode(), parts[2].decode()
            except UnicodeDecodeError:
                return None, None
    elif mechanism == "AMQPLAIN":
        try:
            _n, table = decode.field_table(len(raw).to_bytes(4, "big") + raw)
        except Exception:  # pamqp raises several types for a malformed table
            return None, None
        login, password = table.get("LOGIN"), table.get("PASSWORD")
        if isinstance(login, str) and isinstance(password, str):
            return login, password
    return None, None
