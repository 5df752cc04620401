"""The server's side of an AMQP 0-9-1 connection, without I/O: bytes in, events out; methods in, bytes out.

pamqp is the codec (method arguments, field tables, content properties); this module frames:
it reads the protocol header, cuts the stream into frames, holds each channel's published
message until its content is whole, and turns every fault into the reply code and text that
RabbitMQ would close the connection or the channel with.

On the wire (AMQP 0-9-1 §4.2), client to server::

    protocol header   "AMQP" 0x00 0x00 0x09 0x01                   8 octets, once, first
    frame             type:u8  channel:u16  size:u32  payload[size]  0xCE
      type 1 method     class-id:u16  method-id:u16  arguments
      type 2 header     class-id:u16 (60)  weight:u16 (0)  body-size:u64  flags:u16...  properties
      type 3 body       body-size octets of the message, in as many frames as it takes
      type 8 heartbeat  channel 0, size 0

A published message is a ``basic.publish`` method, a content header and body frames, all on
one channel.  Frames of other channels may come between them; a method, or a second header,
on the same channel may not (505 UNEXPECTED_FRAME).  A header with body-size 0 ends the
message.

The faults, and what RabbitMQ 4 answers to each (``rabbit_reader``, ``rabbit_command_assembler``,
``rabbit_channel``), which is what this module raises:

* first 8 octets that are not the 0-9-1 header: the 0-9-1 header written back, then the
  socket closed (no connection.close; RabbitMQ, which also speaks 1.0, writes the 1.0 header);
* a frame over ``frame_max`` (its payload over frame_max: RabbitMQ allows the 8 octets of
  overhead that clients often forget), or no 0xCE where a frame ends: 501 FRAME_ERROR, fatal,
  the stream being out of step;
* an unknown frame type, a heartbeat with a payload, a method or content header frame too
  short for its ids: 501 FRAME_ERROR;
* method arguments or content properties that pamqp cannot decode: 501 FRAME_ERROR, with the
  method's class and method ids (RabbitMQ's "cannot decode");
* an unknown class or method id: 540 NOT_IMPLEMENTED (RabbitMQ's reader exits on it and the
  client sees the socket close with no connection.close);
* a method of another class than ``connection`` on channel 0: 504 CHANNEL_ERROR;
* a content-bearing method that only servers send (``basic.deliver``, ``basic.get-ok``,
  ``basic.return``): 503 COMMAND_INVALID;
* a content header or body with no ``basic.publish`` before it, or on channel 0, or a method
  or second header on a channel whose content is not whole, or a header of another class
  than ``basic`` or of weight other than 0: 505 UNEXPECTED_FRAME;
* a heartbeat on a channel other than 0: 505 UNEXPECTED_FRAME;
* a body-size over :data:`MESSAGE_SIZE_LIMIT` (512 MiB), or a body frame past the body-size
  the header announced: 501 FRAME_ERROR;
* a message over ``max_message_size``: 406 PRECONDITION_FAILED on its channel only, raised
  when its last body frame is read (its octets are counted, not kept).

Reply texts read as RabbitMQ's do (``FRAME_ERROR - ...``), at most 255 octets.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TypeVar

from pamqp import base, body as pbody, commands, common, frame as pframe, header as pheader, heartbeat as pheartbeat

from client.errors import RemoteProtocolError

__all__ = [
    "AmqpWire", "Beat", "ChannelError", "Event", "FRAME_MIN_SIZE", "HeaderOk", "MESSAGE_SIZE_LIMIT", "Method",
    "Publish", "ReplyCode", "WireError", "reply_text", "server_properties",
]


class ReplyCode(IntEnum):
    """The reply codes of AMQP 0-9-1 (spec §1.2, ``amqp-0-9-1.xml`` constants)."""

    REPLY_SUCCESS = 200
    CONTENT_TOO_LARGE = 311
    NO_ROUTE = 312
    NO_CONSUMERS = 313
    CONNECTION_FORCED = 320
    INVALID_PATH = 402
    ACCESS_REFUSED = 403
    NOT_FOUND = 404
    RESOURCE_LOCKED = 405
    PRECONDITION_FAILED = 406
    FRAME_ERROR = 501
    SYNTAX_ERROR = 502
    COMMAND_INVALID = 503
    CHANNEL_ERROR = 504
    UNEXPECTED_FRAME = 505
    RESOURCE_ERROR = 506
    NOT_ALLOWED = 530
    NOT_IMPLEMENTED = 540
    INTERNAL_ERROR = 541


#: the smallest frame_max a peer may negotiate, and what both accept before tuning (spec §4.2.1)
FRAME_MIN_SIZE = 4096
#: the largest body-size a content header may announce (RabbitMQ's ?MAX_MSG_SIZE, 512 MiB)
MESSAGE_SIZE_LIMIT = 512 * 2**20

FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
FRAME_END = 0xCE
#: type, channel, size ahead of the payload; the end octet after it
FRAME_OVERHEAD = 8
_FRAME_HEAD = struct.Struct(">BHI")
_CONTENT_HEAD = struct.Struct(">HHQ")
_SHORTSTR_MAX = 255

_CONNECTION_CLASS = commands.Connection.Start.index >> 16
_BASIC_CLASS = commands.Basic.Publish.index >> 16
_PUBLISH_IDS = (_BASIC_CLASS, commands.Basic.Publish.index & 0xFFFF)
#: the methods a content header and body follow (spec: ``content="1"``)
_CONTENT_METHODS = frozenset(m.index for m in (
    commands.Basic.Publish, commands.Basic.Return, commands.Basic.Deliver, commands.Basic.GetOk))


def _shortstr(text: str) -> str:
    raw = text.encode()
    return text if len(raw) <= _SHORTSTR_MAX else raw[:_SHORTSTR_MAX].decode(errors="ignore")


def reply_text(code: ReplyCode, detail: str) -> str:
    """``NAME - detail``, as RabbitMQ words a close, cut to the 255 octets of a shortstr."""
    return _shortstr(f"{code.name} - {detail}")


def _ids(index: int) -> tuple[int, int]:
    return index >> 16, index & 0xFFFF


# -- faults -------------------------------------------------------------------------------------


class WireError(RemoteProtocolError):
    """A fault that closes the connection: reply_code/text as connection.close carries them.

    ``fatal``: the stream is out of step (a frame over frame_max, a bad end octet, a bad
    protocol header); nothing more can be read.  Send :meth:`close_method` (unless
    ``send_header``), wait briefly, close the socket: a client seldom answers close-ok then.
    Every later :meth:`AmqpWire.feed` raises this error again.

    Otherwise the wire is now *closing*: send :meth:`close_method` and go on feeding; only
    ``connection`` methods on channel 0 come out (close-ok, or the client's own close).

    ``send_header``: the protocol header was wrong (``reply_code`` 0).  Write
    :attr:`AmqpWire.PROTOCOL_HEADER` back and close the socket; there is no connection.close.

    ``events``: what the same :meth:`AmqpWire.feed` call decoded before the faulty frame,
    in order; handle them first.
    """

    def __init__(self, reply_code: int, reply_text: str, class_id: int = 0, method_id: int = 0, *,
                 fatal: bool = False, send_header: bool = False) -> None:
        text = _shortstr(reply_text)
        super().__init__(text)
        self.reply_code = reply_code
        self.reply_text = text
        self.class_id = class_id
        self.method_id = method_id
        self.fatal = fatal
        self.send_header = send_header
        self.events: tuple[Event, ...] = ()

    def close_method(self) -> commands.Connection.Close:
        """The connection.close that reports it (on channel 0)."""
        return commands.Connection.Close(self.reply_code, self.reply_text, self.class_id, self.method_id)


class ChannelError(RemoteProtocolError):
    """A fault that closes one channel (channel.close); the connection and its other channels go on.

    ``events``: what the same :meth:`AmqpWire.feed` call decoded before the faulty frame, in
    order; handle them first.  The frames after it are still buffered: call ``feed(b"")`` to
    decode them.  Until the client's channel.close-ok, the session drops what comes on the
    channel (the wire does not know the channel is closing).
    """

    def __init__(self, channel: int, reply_code: int, reply_text: str, class_id: int = 0,
                 method_id: int = 0) -> None:
        text = _shortstr(reply_text)
        super().__init__(text)
        self.channel = channel
        self.reply_code = reply_code
        self.reply_text = text
        self.class_id = class_id
        self.method_id = method_id
        self.events: tuple[Event, ...] = ()

    def close_method(self) -> commands.Channel.Close:
        """The channel.close that reports it (on :attr:`channel`)."""
        return commands.Channel.Close(self.reply_code, self.reply_text, self.class_id, self.method_id)


def _fault(code: ReplyCode, detail: str, ids: tuple[int, int] = (0, 0), *, fatal: bool = False) -> WireError:
    return WireError(code, reply_text(code, detail), *ids, fatal=fatal)


# -- events -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HeaderOk:
    """A valid ``AMQP 0-0-9-1`` protocol header was read: answer connection.start."""


@dataclass(frozen=True, slots=True)
class Method:
    """A method frame, whole and decoded: any but a ``basic.publish`` (that comes as :class:`Publish`)."""

    channel: int
    method: base.Frame


@dataclass(frozen=True, slots=True)
class Publish:
    """A published message: the ``basic.publish``, its content header's properties, and its whole body."""

    channel: int
    method: commands.Basic.Publish
    properties: commands.Basic.Properties
    body: bytes


@dataclass(frozen=True, slots=True)
class Beat:
    """A heartbeat frame: the client is there."""


Event = HeaderOk | Method | Publish | Beat


@dataclass(slots=True)
class _Content:
    """A channel's message being put together: its publish, then its header, then body frames."""

    method: commands.Basic.Publish
    properties: commands.Basic.Properties | None = None
    size: int = 0
    received: int = 0
    chunks: list[bytes] = field(default_factory=list)
    #: over max_message_size: its octets are counted, not kept
    dropped: bool = False


_T = TypeVar("_T")


def _decode(what: str, ids: tuple[int, int], decode: Callable[[], _T]) -> _T:
    """Run a pamqp decode; any failure is the peer's frame error (the original is the cause).

    pamqp raises ValueError and struct.error as documented, and on hostile octets also
    OverflowError (a timestamp past year 9999), RecursionError (tables nested thousands
    deep) and others: none of them is ours.
    """
    try:
        return decode()
    except Exception as err:
        raise _fault(ReplyCode.FRAME_ERROR, f"cannot decode {what}: {err}", ids) from err


#: what the first octets of a wrong protocol header most likely are, for the log
_HEADER_HINTS = ((b"\x16\x03", "a TLS handshake on a plain AMQP port"),
                 (b"AMQP\x00\x01", "AMQP 1.0; this port speaks 0-9-1"),
                 (b"AMQP\x03\x01", "AMQP 1.0 with SASL; this port speaks 0-9-1"),
                 (b"GET ", "an HTTP request"), (b"POST", "an HTTP request"))


class AmqpWire:
    """The framing of one client connection, server side.

    Feed it what the socket reads; it returns the events of the whole frames in it (a
    message's frames come as one :class:`Publish`) and keeps the rest for the next call::

        try:
            events = wire.feed(data)
        except ChannelError as err:   # err.events first, then channel.close, then feed(b"") again
            ...
        except WireError as err:      # err.events first, then as its docstring says
            ...

    A fault is raised at the frame that has it; the frames after it stay buffered.

    ``frame_max`` is the largest frame accepted and sent, overhead included; set it to the
    value the client's connection.tune-ok carries.  Frames decoded by the same ``feed`` as the
    tune-ok are checked against the value before, so construct with one no smaller than the
    server's connection.tune offers.  ``max_message_size`` caps a published body.
    """

    PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"

    def __init__(self, *, frame_max: int = 131072, max_message_size: int = 5 * 2**20) -> None:
        if not 0 < max_message_size <= MESSAGE_SIZE_LIMIT:
            raise ValueError(f"max_message_size must be 1..{MESSAGE_SIZE_LIMIT}, not {max_message_size}")
        self._frame_max = self._checked_frame_max(frame_max)
        self._max_message_size = max_message_size
        self._buf = bytearray()
        self._pos = 0
        self._started = False
        self._closing = False
        self._broken: WireError | None = None
        self._content: dict[int, _Content] = {}

    @staticmethod
    def _checked_frame_max(value: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < FRAME_MIN_SIZE:
            raise ValueError(f"frame_max must be an int >= {FRAME_MIN_SIZE}, not {value!r}")
        return value

    @property
    def frame_max(self) -> int:
        return self._frame_max

    @frame_max.setter
    def frame_max(self, value: int) -> None:
        self._frame_max = self._checked_frame_max(value)

    @property
    def max_message_size(self) -> int:
        return self._max_message_size

    @property
    def closing(self) -> bool:
        """The server sent connection.close: only connection methods on channel 0 come out now."""
        return self._closing

    def begin_close(self) -> None:
        """The session sent connection.close: from here on ``feed`` yields only the ``connection``
        methods of channel 0 (close-ok, or a close of the client's own) and drops every other frame,
        as the spec asks of a peer that closes.  A :class:`WireError` that is not fatal does this
        itself."""
        self._closing = True

    # -- reading ------------------------------------------------------------------------------

    def feed(self, data: bytes) -> list[Event]:
        """The events of the whole frames read so far; see the class docstring for the faults."""
        if self._broken is not None:
            self._broken.events = ()
            raise self._broken
        self._buf += data
        events: list[Event] = []
        try:
            if not self._started:
                if not self._read_header():
                    return events
                events.append(HeaderOk())
            while (frame := self._next_frame()) is not None:
                event = self._closing_frame(*frame) if self._closing else self._frame(*frame)
                if event is not None:
                    events.append(event)
        except WireError as err:
            err.events = tuple(events)
            if err.fatal:
                self._broken = err
                self._buf.clear()
                self._pos = 0
            else:
                self._closing = True
            raise
        except ChannelError as err:
            err.events = tuple(events)
            raise
        finally:
            if self._pos:
                del self._buf[:self._pos]
                self._pos = 0
        return events

    def _read_header(self) -> bool:
        have = bytes(self._buf[:8])
        if not self.PROTOCOL_HEADER.startswith(have):
            hint = next((text for prefix, text in _HEADER_HINTS if have.startswith(prefix)), "not AMQP 0-9-1")
            raise WireError(0, f"bad protocol header {have!r}: {hint}", fatal=True, send_header=True)
        if len(have) < 8:
            return False
        self._pos = 8
        self._started = True
        return True

    def _next_frame(self) -> tuple[int, int, bytes] | None:
        """The next whole frame's type, channel and payload, or None until its last octet is here."""
        start = self._pos
        if len(self._buf) - start < _FRAME_HEAD.size:
            return None
        kind, channel, size = _FRAME_HEAD.unpack_from(self._buf, start)
        if size > self._frame_max:
            raise _fault(ReplyCode.FRAME_ERROR, f"frame of type {kind} on channel {channel}: payload of {size} "
                         f"octets over frame_max {self._frame_max}", fatal=True)
        end = start + _FRAME_HEAD.size + size
        if len(self._buf) <= end:
            return None
        if self._buf[end] != FRAME_END:
            raise _fault(ReplyCode.FRAME_ERROR, f"frame of type {kind} on channel {channel}: end octet "
                         f"0x{self._buf[end]:02x}, not 0xce", fatal=True)
        payload = bytes(self._buf[start + _FRAME_HEAD.size:end])
        self._pos = end + 1
        return kind, channel, payload

    def _frame(self, kind: int, channel: int, payload: bytes) -> Event | None:
        if kind == FRAME_METHOD:
            return self._method(channel, payload)
        if kind == FRAME_HEADER:
            return self._header(channel, payload)
        if kind == FRAME_BODY:
            return self._body(channel, payload)
        if kind == FRAME_HEARTBEAT and not payload:
            if channel:
                raise _fault(ReplyCode.UNEXPECTED_FRAME, f"heartbeat frame on channel {channel}")
            return Beat()
        raise _fault(ReplyCode.FRAME_ERROR, f"unknown frame: type {kind}, {len(payload)} octets, channel {channel}")

    def _closing_frame(self, kind: int, channel: int, payload: bytes) -> Event | None:
        if kind != FRAME_METHOD or channel:
            return None
        try:
            return self._method(0, payload)
        except WireError:
            return None

    def _method(self, channel: int, payload: bytes) -> Event | None:
        if len(payload) < 4:
            raise _fault(ReplyCode.FRAME_ERROR, f"method frame of {len(payload)} octets on channel {channel}")
        index = int.from_bytes(payload[:4], "big")
        ids = _ids(index)
        cls: type[base.Frame] | None = commands.INDEX_MAPPING.get(index)
        if cls is None:
            raise _fault(ReplyCode.NOT_IMPLEMENTED, f"unknown method: class {ids[0]}, method {ids[1]}", ids)
        pending = self._content.get(channel)
        if pending is not None:
            raise self._out_of_turn(pending, f"{cls.name} method frame", channel)
        method = cls()
        _decode(cls.name, ids, lambda: method.unmarshal(payload[4:]))
        if channel == 0 and ids[0] != _CONNECTION_CLASS:
            raise _fault(ReplyCode.CHANNEL_ERROR, f"{cls.name} on channel 0, which carries connection methods only",
                         ids)
        if isinstance(method, commands.Basic.Publish):
            self._content[channel] = _Content(method)
            return None
        if index in _CONTENT_METHODS:
            raise _fault(ReplyCode.COMMAND_INVALID, f"{cls.name} is sent by servers, not clients", ids)
        return Method(channel, method)

    @staticmethod
    def _out_of_turn(pending: _Content, got: str, channel: int) -> WireError:
        wanted = "content body" if pending.properties is not None else f"content header for class {_BASIC_CLASS}"
        return _fault(ReplyCode.UNEXPECTED_FRAME, f"expected {wanted} on channel {channel}, got {got} instead",
                      _PUBLISH_IDS)

    def _no_content(self, what: str, channel: int) -> WireError:
        return _fault(ReplyCode.UNEXPECTED_FRAME, f"expected method frame on channel {channel}, got {what} instead")

    def _header(self, channel: int, payload: bytes) -> Publish | None:
        if len(payload) < _CONTENT_HEAD.size:
            raise _fault(ReplyCode.FRAME_ERROR, f"content header frame of {len(payload)} octets on channel {channel}")
        pending = self._content.get(channel)
        if pending is None:
            raise self._no_content("content header", channel)
        if pending.properties is not None:
            raise self._out_of_turn(pending, "content header", channel)
        class_id, weight, size = _CONTENT_HEAD.unpack_from(payload)
        if class_id != _BASIC_CLASS or weight:
            raise _fault(ReplyCode.UNEXPECTED_FRAME, f"expected content header for class {_BASIC_CLASS} on channel "
                         f"{channel}, got one for class {class_id}, weight {weight}", _PUBLISH_IDS)
        if size > MESSAGE_SIZE_LIMIT:
            raise _fault(ReplyCode.FRAME_ERROR, f"content body size {size} exceeds maximum allowed size "
                         f"{MESSAGE_SIZE_LIMIT}", _PUBLISH_IDS)
        content = pheader.ContentHeader()
        _decode("content header properties", _PUBLISH_IDS, lambda: content.unmarshal(payload))
        pending.properties, pending.size = content.properties, size
        pending.dropped = size > self._max_message_size
        return self._complete(channel, pending)

    def _body(self, channel: int, payload: bytes) -> Event | None:
        pending = self._content.get(channel)
        if pending is None:
            raise self._no_content("content body", channel)
        if pending.properties is None:
            raise self._out_of_turn(pending, "content body", channel)
        if len(payload) > pending.size - pending.received:
            raise _fault(ReplyCode.FRAME_ERROR, f"content body frame on channel {channel} exceeds remaining content "
                         f"size ({len(payload)} > {pending.size - pending.received})", _PUBLISH_IDS)
        pending.received += len(payload)
        if not pending.dropped and payload:
            pending.chunks.append(payload)
        return self._complete(channel, pending)

    def _complete(self, channel: int, pending: _Content) -> Publish | None:
        if pending.received < pending.size or pending.properties is None:
            return None
        del self._content[channel]
        if pending.dropped:
            raise ChannelError(channel, ReplyCode.PRECONDITION_FAILED, reply_text(
                ReplyCode.PRECONDITION_FAILED, f"message size {pending.size} is larger than configured max size "
                f"{self._max_message_size}"), *_PUBLISH_IDS)
        return Publish(channel, pending.method, pending.properties, b"".join(pending.chunks))

    # -- writing ------------------------------------------------------------------------------

    def method(self, channel: int, m: base.Frame) -> bytes:
        """One method frame (not a content-bearing one: :meth:`content` sends those).

        pamqp validates the arguments: a bad one (a shortstr over 255 octets, an exchange name
        outside its pattern) raises ValueError, which is the caller's bug.
        """
        if m.index in _CONTENT_METHODS:
            raise ValueError(f"{m.name} carries content: send it with content()")
        return pframe.marshal(m, channel)

    def content(self, channel: int, m: base.Frame, properties: commands.Basic.Properties, body: bytes) -> bytes:
        """A ``basic.deliver``, ``basic.get-ok`` or ``basic.return`` with its content header and
        body, the body cut into frames of at most ``frame_max`` octets each (none when it is empty).

        The content header frame is never cut (AMQP has no way to): properties bigger than a
        frame make a bigger frame, as RabbitMQ sends them too.
        """
        if m.index not in _CONTENT_METHODS:
            raise ValueError(f"{m.name} carries no content: send it with method()")
        parts = [pframe.marshal(m, channel),
                 pframe.marshal(pheader.ContentHeader(0, len(body), properties), channel)]
        step = self._frame_max - FRAME_OVERHEAD
        parts.extend(pframe.marshal(pbody.ContentBody(body[at:at + step]), channel)
                     for at in range(0, len(body), step))
        return b"".join(parts)

    def heartbeat(self) -> bytes:
        """A heartbeat frame."""
        return pheartbeat.Heartbeat.marshal()


def server_properties(version: str) -> common.FieldTable:
    """The ``server_properties`` table of connection.start.

    Clients read little of it, and what they read decides what they do:

    * ``capabilities``: aio-pika (aiormq) indexes it outright, and refuses to open a channel
      with publisher confirms (its default) unless ``publisher_confirms`` is true; pika's
      ``confirm_delivery`` raises unless ``publisher_confirms`` and ``basic.nack`` both are,
      and it reads ``consumer_cancel_notify`` and ``exchange_exchange_bindings``; py-amqp
      (kombu) sends back in connection.start-ok only those of its own capabilities the server
      lists here (``authentication_failure_close``, ``connection.blocked``,
      ``consumer_cancel_notify``): one missing here is one the client turns off.
    * ``product`` and ``version``: kombu's py-amqp transport answers whether basic.qos follows
      the spec (``qos_semantics_matches_spec``) by ``product == "RabbitMQ"`` and ``version <
      3.3``; for "Tandem" it answers yes, and Celery then sends basic.qos with
      ``global=False``, which under the ``per_consumer_qos`` advertised here (RabbitMQ's
      reading) limits each consumer, not the channel.
    """
    return {
        "product": "Tandem",
        "version": version,
        "platform": "Python",
        "capabilities": {
            "publisher_confirms": True,
            "exchange_exchange_bindings": True,
            "basic.nack": True,
            "consumer_cancel_notify": True,
            "connection.blocked": True,
            "authentication_failure_close": True,
            "per_consumer_qos": True,
        },
    }
