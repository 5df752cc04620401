"""broker.amqp.wire: the server side of AMQP 0-9-1 framing, fed what pamqp marshals as a client would.

Every fault comes with the reply code RabbitMQ closes with; a hypothesis run feeds hostile
frames and octets and sees nothing but WireError and ChannelError come out.
"""

from __future__ import annotations

import datetime
import random
import struct

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from pamqp import body as pbody, commands, frame as pframe, header as pheader, heartbeat as pheartbeat
from pamqp.base import Frame

from broker.amqp.wire import (
    FRAME_MIN_SIZE, MESSAGE_SIZE_LIMIT, AmqpWire, Beat, ChannelError, Event, HeaderOk, Method, Publish, ReplyCode,
    WireError, reply_text, server_properties,
)

HEADER = AmqpWire.PROTOCOL_HEADER
PUBLISH_IDS = (60, 40)
PROPS = commands.Basic.Properties(
    content_type="application/json", headers={"x-n": 7, "x-s": "text", "x-t": {"deep": True}}, delivery_mode=2,
    priority=3, correlation_id="c-1", reply_to="r", message_id="m-1",
    timestamp=datetime.datetime(2024, 5, 1, 12, 0, tzinfo=datetime.UTC), app_id="tests")


def frame(m: pframe.FrameTypes, channel: int = 0) -> bytes:
    return pframe.marshal(m, channel)


def start_ok() -> bytes:
    return frame(commands.Connection.StartOk(client_properties={"product": "pika"}, mechanism="PLAIN",
                                             response="\x00guest\x00guest", locale="en_US"))


def publish(channel: int, body: bytes, *, frame_max: int = 131072, properties: commands.Basic.Properties = PROPS,
            routing_key: str = "rk") -> bytes:
    """A basic.publish the way a client frames it: method, content header, body frames."""
    step = frame_max - 8
    return b"".join([frame(commands.Basic.Publish(exchange="ex", routing_key=routing_key, mandatory=True), channel),
                     frame(pheader.ContentHeader(0, len(body), properties), channel),
                     *(frame(pbody.ContentBody(body[i:i + step]), channel) for i in range(0, len(body), step))])


def raw(kind: int, channel: int, payload: bytes, end: int = 0xCE) -> bytes:
    return struct.pack(">BHI", kind, channel, len(payload)) + payload + bytes([end])


def heartbeat_frame() -> bytes:
    return pheartbeat.Heartbeat.marshal()


def content_header(size: int, *, class_id: int = 60, weight: int = 0, props: bytes = b"\x00\x00") -> bytes:
    return struct.pack(">HHQ", class_id, weight, size) + props


def started(**kwargs: int) -> AmqpWire:
    wire = AmqpWire(**kwargs)
    assert wire.feed(HEADER) == [HeaderOk()]
    return wire


def described(event: Event) -> tuple[object, ...]:
    """An event as plain values (pamqp's methods do not compare by value)."""
    if isinstance(event, Method):
        return ("method", event.channel, event.method.name, dict(event.method))
    if isinstance(event, Publish):
        return ("publish", event.channel, dict(event.method), dict(event.properties), event.body)
    return (type(event).__name__,)


def feed_in_chunks(wire: AmqpWire, data: bytes, sizes: list[int]) -> list[Event]:
    events: list[Event] = []
    at, i = 0, 0
    while at < len(data):
        n = sizes[i % len(sizes)]
        events += wire.feed(data[at:at + n])
        at, i = at + n, i + 1
    return events


def fault(wire: AmqpWire, data: bytes) -> WireError:
    with pytest.raises(WireError) as caught:
        wire.feed(data)
    return caught.value


# -- reading what clients send -----------------------------------------------------------------------


def test_the_header_then_start_ok() -> None:
    events = AmqpWire().feed(HEADER + start_ok())
    assert events[0] == HeaderOk()
    assert isinstance(events[1], Method) and events[1].channel == 0
    assert isinstance(events[1].method, commands.Connection.StartOk)
    assert events[1].method.mechanism == "PLAIN" and events[1].method.client_properties == {"product": "pika"}


def test_the_header_comes_out_only_when_whole() -> None:
    wire = AmqpWire()
    assert [wire.feed(HEADER[i:i + 1]) for i in range(7)] == [[]] * 7
    assert wire.feed(HEADER[7:]) == [HeaderOk()]


@pytest.mark.parametrize("data, hint", [
    (b"AMQP\x00\x00\x09\x00", "not AMQP 0-9-1"),
    (b"AMQP\x01\x01\x00\x09", "not AMQP 0-9-1"),
    (b"AMQP\x00\x01\x00\x00", "AMQP 1.0"),
    (b"AMQP\x03\x01\x00\x00", "AMQP 1.0 with SASL"),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01", "TLS"),
    (b"GET / HTTP/1.1\r\n", "HTTP"),
    (b"X", "not AMQP 0-9-1"),
])
def test_a_wrong_header_asks_for_ours_back_and_stays_broken(data: bytes, hint: str) -> None:
    wire = AmqpWire()
    err = fault(wire, data)
    assert (err.reply_code, err.send_header, err.fatal) == (0, True, True)
    assert hint in err.reply_text
    assert fault(wire, HEADER) is err


@pytest.mark.parametrize("sizes", [[1], [2, 5], [7], [3, 11, 1], [4096], [1 << 20]])
def test_a_publish_over_several_body_frames_in_any_chunks(sizes: list[int]) -> None:
    body = bytes(random.Random(7).randbytes(3 * (FRAME_MIN_SIZE - 8) + 17))
    wire = started(frame_max=FRAME_MIN_SIZE)
    events = feed_in_chunks(wire, publish(1, body, frame_max=FRAME_MIN_SIZE) + raw(8, 0, b""), sizes)
    assert [type(e) for e in events] == [Publish, Beat]
    message = events[0]
    assert isinstance(message, Publish)
    assert (message.channel, message.body, message.method.exchange, message.method.routing_key) == (1, body, "ex", "rk")
    assert message.method.mandatory is True
    assert message.properties == PROPS


def test_an_empty_body_comes_out_with_its_header() -> None:
    wire = started()
    data = publish(3, b"")
    events = wire.feed(data[:-1])
    assert events == []
    events = wire.feed(data[-1:])
    assert len(events) == 1 and isinstance(events[0], Publish) and events[0].body == b""


def test_empty_body_frames_are_nothing() -> None:
    wire = started()
    method_and_header = frame(commands.Basic.Publish(routing_key="q"), 1) + frame(pheader.ContentHeader(0, 2, PROPS), 1)
    events = wire.feed(method_and_header + raw(3, 1, b"") + raw(3, 1, b"a") + raw(3, 1, b"") + raw(3, 1, b"b"))
    assert len(events) == 1 and isinstance(events[0], Publish) and events[0].body == b"ab"


def test_heartbeats() -> None:
    wire = started()
    assert wire.feed(heartbeat_frame() * 2) == [Beat(), Beat()]
    err = fault(wire, raw(8, 1, b""))
    assert err.reply_code == ReplyCode.UNEXPECTED_FRAME and not err.fatal
    err = fault(started(), raw(8, 0, b"x"))
    assert err.reply_code == ReplyCode.FRAME_ERROR and not err.fatal


def test_other_channels_frames_may_come_between_a_publishs_frames() -> None:
    wire = started(frame_max=FRAME_MIN_SIZE)
    body1 = b"1" * 5000
    one = publish(1, body1, frame_max=FRAME_MIN_SIZE)
    method_and_header = len(frame(commands.Basic.Publish(exchange="ex", routing_key="rk", mandatory=True), 1)) + \
        len(frame(pheader.ContentHeader(0, len(body1), PROPS), 1))
    declare = frame(commands.Queue.Declare(queue="q2", durable=True), 2)
    data = one[:method_and_header] + declare + one[method_and_header:method_and_header + 4096] + \
        publish(2, b"two") + heartbeat_frame() + one[method_and_header + 4096:]
    events = feed_in_chunks(wire, data, [1, 100, 5000])
    assert [described(e)[:2] for e in events] == [("method", 2), ("publish", 2), ("Beat",), ("publish", 1)]
    assert isinstance(events[1], Publish) and events[1].body == b"two"
    assert isinstance(events[3], Publish) and events[3].body == body1


def test_what_pika_frames_reads_the_same() -> None:
    """pika has an encoder of its own (aio-pika's is pamqp): its frames give the same events."""
    pika = pytest.importorskip("pika")
    body = b"p" * 10_000
    step = FRAME_MIN_SIZE - 8
    props = pika.spec.BasicProperties(content_type="text/plain", headers={"n": 1}, delivery_mode=2)
    data = pika.frame.ProtocolHeader().marshal() + b"".join(f.marshal() for f in (
        pika.frame.Method(0, pika.spec.Connection.StartOk({"product": "pika"}, "PLAIN", "\x00u\x00p", "en_US")),
        pika.frame.Method(1, pika.spec.Basic.Publish(exchange="", routing_key="q")),
        pika.frame.Header(1, len(body), props),
        *(pika.frame.Body(1, body[i:i + step]) for i in range(0, len(body), step)),
        pika.frame.Heartbeat()))
    events = feed_in_chunks(AmqpWire(frame_max=FRAME_MIN_SIZE), data, [1, 4000])
    assert [type(e) for e in events] == [HeaderOk, Method, Publish, Beat]
    message = events[2]
    assert isinstance(message, Publish) and message.body == body and message.method.routing_key == "q"
    assert (message.properties.content_type, message.properties.headers) == ("text/plain", {"n": 1})


# -- faults -------------------------------------------------------------------------------------------


def test_a_method_on_the_same_channel_mid_content_is_an_unexpected_frame() -> None:
    declare = frame(commands.Queue.Declare(queue="q"), 1)
    data = publish(1, b"abcdef")
    body_at = data.index(frame(pbody.ContentBody(b"abcdef"), 1))
    for cut, wanted in ((data.index(frame(pheader.ContentHeader(0, 6, PROPS), 1)), "content header"),
                        (body_at, "content body")):
        err = fault(started(), data[:cut] + declare)
        assert (err.reply_code, err.class_id, err.method_id) == (ReplyCode.UNEXPECTED_FRAME, *PUBLISH_IDS)
        assert err.reply_text.startswith("UNEXPECTED_FRAME - expected " + wanted)
        assert not err.fatal


@pytest.mark.parametrize("data, ids", [
    (raw(2, 1, content_header(3)), (0, 0)),                                    # a header with no publish
    (raw(3, 1, b"abc"), (0, 0)),                                               # a body with no publish
    (raw(2, 0, content_header(3)), (0, 0)),                                    # content on channel 0
    (raw(3, 0, b"abc"), (0, 0)),
    (frame(commands.Basic.Publish(), 1) + raw(3, 1, b"abc"), PUBLISH_IDS),     # a body before the header
    (frame(commands.Basic.Publish(), 1) + raw(2, 1, content_header(3)) * 2, PUBLISH_IDS),  # two headers
    (frame(commands.Basic.Publish(), 1) + raw(2, 1, content_header(3, class_id=50)), PUBLISH_IDS),
    (frame(commands.Basic.Publish(), 1) + raw(2, 1, content_header(3, weight=1)), PUBLISH_IDS),
])
def test_content_out_of_turn_is_an_unexpected_frame(data: bytes, ids: tuple[int, int]) -> None:
    err = fault(started(), data)
    assert (err.reply_code, (err.class_id, err.method_id), err.fatal) == (ReplyCode.UNEXPECTED_FRAME, ids, False)


def test_a_frame_over_frame_max_is_fatal_on_its_first_seven_octets() -> None:
    wire = started(frame_max=FRAME_MIN_SIZE)
    err = fault(wire, struct.pack(">BHI", 3, 1, FRAME_MIN_SIZE + 1))
    assert (err.reply_code, err.fatal, err.send_header) == (ReplyCode.FRAME_ERROR, True, False)
    assert fault(wire, heartbeat_frame()) is err


def test_a_payload_of_frame_max_octets_passes_as_rabbitmq_lets_it() -> None:
    wire = started(frame_max=FRAME_MIN_SIZE)
    data = frame(commands.Basic.Publish(), 1) + frame(pheader.ContentHeader(0, FRAME_MIN_SIZE, PROPS), 1)
    events = wire.feed(data + raw(3, 1, b"x" * FRAME_MIN_SIZE))
    assert len(events) == 1 and isinstance(events[0], Publish) and len(events[0].body) == FRAME_MIN_SIZE


def test_frame_max_is_the_negotiated_value_once_set() -> None:
    wire = started()
    wire.frame_max = FRAME_MIN_SIZE
    assert fault(wire, raw(1, 1, b"\x00" * (FRAME_MIN_SIZE + 1))).fatal


def test_a_bad_end_octet_is_fatal() -> None:
    wire = started()
    err = fault(wire, heartbeat_frame() + raw(8, 0, b"", end=0xCD))
    assert (err.reply_code, err.fatal, err.events) == (ReplyCode.FRAME_ERROR, True, (Beat(),))


def test_an_unknown_frame_type_is_a_frame_error_and_the_wire_closes() -> None:
    wire = started()
    err = fault(wire, raw(4, 0, b"abc") + publish(1, b"dropped") + frame(commands.Connection.CloseOk()))
    assert (err.reply_code, err.fatal, wire.closing) == (ReplyCode.FRAME_ERROR, False, True)
    events = wire.feed(b"")
    assert [described(e)[:3] for e in events] == [("method", 0, "Connection.CloseOk")]


@pytest.mark.parametrize("payload, code, ids", [
    (b"\x00\x0a", ReplyCode.FRAME_ERROR, (0, 0)),                                  # too short for its ids
    (struct.pack(">HH", 10, 99), ReplyCode.NOT_IMPLEMENTED, (10, 99)),            # unknown method
    (struct.pack(">HH", 99, 10), ReplyCode.NOT_IMPLEMENTED, (99, 10)),            # unknown class
    (struct.pack(">HH", 50, 10) + b"\x00", ReplyCode.FRAME_ERROR, (50, 10)),      # queue.declare cut short
    (struct.pack(">HH", 50, 10) + b"\x00\x00\x01q\x00" + b"\x00\x00\x00\x03\x01k?", ReplyCode.FRAME_ERROR, (50, 10)),
])
def test_methods_that_cannot_be_decoded(payload: bytes, code: ReplyCode, ids: tuple[int, int]) -> None:
    err = fault(started(), raw(1, 1, payload))
    assert (err.reply_code, (err.class_id, err.method_id), err.fatal) == (code, ids, False)
    assert err.reply_text.startswith(code.name + " - ")


def test_properties_that_cannot_be_decoded() -> None:
    timestamp_flag = commands.Basic.Properties.flags["timestamp"]
    too_late = struct.pack(">HQ", timestamp_flag, 2**63 - 1)
    nested = b""
    for _ in range(3000):
        entry = b"\x01k" + b"F" + struct.pack(">I", len(nested)) + nested
        nested = entry
    headers = struct.pack(">HI", commands.Basic.Properties.flags["headers"], len(nested)) + nested
    for props in (too_late, headers, b"\x80"):
        err = fault(started(), frame(commands.Basic.Publish(), 1) + raw(2, 1, content_header(1, props=props)))
        assert (err.reply_code, (err.class_id, err.method_id)) == (ReplyCode.FRAME_ERROR, PUBLISH_IDS)
        assert err.__cause__ is not None


def test_only_connection_methods_on_channel_0() -> None:
    err = fault(started(), frame(commands.Basic.Publish(), 0))
    assert (err.reply_code, err.class_id, err.method_id) == (ReplyCode.CHANNEL_ERROR, *PUBLISH_IDS)


def test_content_methods_of_servers_from_a_client() -> None:
    deliver = commands.Basic.Deliver(consumer_tag="c", delivery_tag=1, routing_key="k")
    err = fault(started(), frame(deliver, 1))
    assert (err.reply_code, err.class_id, err.method_id) == (ReplyCode.COMMAND_INVALID, 60, 60)


def test_a_body_size_over_the_limit_and_a_body_past_its_size() -> None:
    err = fault(started(), frame(commands.Basic.Publish(), 1) + raw(2, 1, content_header(MESSAGE_SIZE_LIMIT + 1)))
    assert (err.reply_code, err.class_id, err.method_id) == (ReplyCode.FRAME_ERROR, *PUBLISH_IDS)
    err = fault(started(), frame(commands.Basic.Publish(), 1) + raw(2, 1, content_header(2)) + raw(3, 1, b"abc"))
    assert (err.reply_code, err.class_id, err.method_id) == (ReplyCode.FRAME_ERROR, *PUBLISH_IDS)


def test_a_message_over_max_message_size_closes_its_channel_only() -> None:
    wire = started(frame_max=FRAME_MIN_SIZE, max_message_size=5000)
    data = heartbeat_frame() + publish(1, b"x" * 5001, frame_max=FRAME_MIN_SIZE) + publish(2, b"ok") + \
        publish(1, b"again")
    with pytest.raises(ChannelError) as caught:
        wire.feed(data)
    err = caught.value
    assert (err.channel, err.reply_code, err.class_id, err.method_id) == (1, ReplyCode.PRECONDITION_FAILED, 60, 40)
    assert err.reply_text == "PRECONDITION_FAILED - message size 5001 is larger than configured max size 5000"
    assert err.events == (Beat(),)
    assert isinstance(err.close_method(), commands.Channel.Close)
    assert [described(e)[:2] + (getattr(e, "body"),) for e in wire.feed(b"")] == [("publish", 2, b"ok"),
                                                                                   ("publish", 1, b"again")]
    assert not wire.closing


def test_once_the_session_closes_only_connection_methods_on_channel_0_come_out() -> None:
    wire = started()
    wire.begin_close()
    data = publish(1, b"late") + frame(commands.Queue.Declare(queue="q"), 2) + raw(1, 0, b"\x00") + \
        raw(4, 0, b"?") + frame(commands.Basic.Qos(), 0) + frame(commands.Connection.Close(200, "bye", 0, 0))
    assert [described(e)[:3] for e in wire.feed(data)] == [("method", 0, "Connection.Close")]
    assert fault(wire, raw(1, 0, b"\x00" * 200_000)).fatal


def test_errors_close_as_amqp_says() -> None:
    err = WireError(ReplyCode.NOT_ALLOWED, reply_text(ReplyCode.NOT_ALLOWED, "x" * 300), 10, 40)
    close = err.close_method()
    assert isinstance(close, commands.Connection.Close)
    assert (close.reply_code, close.class_id, close.method_id) == (530, 10, 40)
    assert len(close.reply_text.encode()) == 255 and close.reply_text.startswith("NOT_ALLOWED - xxx")
    frame(close)  # pamqp takes it: a shortstr within 255 octets
    assert len(ChannelError(1, 406, "é" * 200).reply_text.encode()) <= 255


# -- writing to clients -------------------------------------------------------------------------------


def unmarshal_all(data: bytes) -> list[tuple[int, int, pframe.FrameTypes]]:
    frames = []
    while data:
        used, channel, value = pframe.unmarshal(data)
        frames.append((used, channel, value))
        data = data[used:]
    return frames


def test_method_frames_decode_as_sent() -> None:
    wire = AmqpWire()
    data = wire.method(5, commands.Queue.DeclareOk(queue="q", message_count=3, consumer_count=1))
    [(used, channel, value)] = unmarshal_all(data)
    assert (used, channel) == (len(data), 5)
    assert isinstance(value, commands.Queue.DeclareOk) and value.message_count == 3
    with pytest.raises(ValueError):
        wire.method(1, commands.Basic.Deliver(consumer_tag="c", delivery_tag=1, routing_key="k"))


@pytest.mark.parametrize("frame_max, size", [
    (FRAME_MIN_SIZE, 0), (FRAME_MIN_SIZE, 1), (FRAME_MIN_SIZE, FRAME_MIN_SIZE - 8),
    (FRAME_MIN_SIZE, FRAME_MIN_SIZE - 7), (FRAME_MIN_SIZE, 3 * (FRAME_MIN_SIZE - 8)), (131072, 400_000),
])
def test_content_is_cut_into_frames_within_frame_max(frame_max: int, size: int) -> None:
    wire = AmqpWire()
    wire.frame_max = frame_max
    body = random.Random(size).randbytes(size)
    method: Frame
    for method in (commands.Basic.Deliver(consumer_tag="ctag", delivery_tag=9, redelivered=True, exchange="ex",
                                          routing_key="k"),
                   commands.Basic.GetOk(delivery_tag=2, exchange="", routing_key="q", message_count=0),
                   commands.Basic.Return(reply_code=312, reply_text="NO_ROUTE", exchange="ex", routing_key="k")):
        frames = unmarshal_all(wire.content(7, method, PROPS, body))
        assert all(used <= frame_max for used, _, value in frames if isinstance(value, pbody.ContentBody))
        assert {channel for _, channel, _ in frames} == {7}
        (_, _, sent), (_, _, head), *bodies = frames
        assert isinstance(sent, type(method)) and dict(sent) == dict(method)
        assert isinstance(head, pheader.ContentHeader) and head.body_size == size and head.properties == PROPS
        chunks = [value for _, _, value in bodies if isinstance(value, pbody.ContentBody)]
        assert len(chunks) == len(bodies) == -(-size // (frame_max - 8))
        assert b"".join(chunk.value for chunk in chunks) == body
    with pytest.raises(ValueError):
        wire.content(1, commands.Queue.DeclareOk(queue="q"), PROPS, b"")


def test_what_the_wire_writes_it_reads_back() -> None:
    """A delivery the wire writes, turned into a publish, is read back whole."""
    sender, reader = AmqpWire(frame_max=FRAME_MIN_SIZE), started(frame_max=FRAME_MIN_SIZE)
    body = b"z" * 9000
    data = sender.content(4, commands.Basic.Deliver(consumer_tag="c", delivery_tag=1, routing_key="k"), PROPS, body)
    deliver_length = unmarshal_all(data)[0][0]
    data = frame(commands.Basic.Publish(routing_key="k"), 4) + data[deliver_length:]
    [event] = reader.feed(data)
    assert isinstance(event, Publish) and event.body == body and event.properties == PROPS


def test_heartbeat_frame() -> None:
    [(used, channel, value)] = unmarshal_all(AmqpWire().heartbeat())
    assert (used, channel, type(value)) == (8, 0, pheartbeat.Heartbeat)


def test_limits_are_checked() -> None:
    for bad in (FRAME_MIN_SIZE - 1, 0, True):
        with pytest.raises(ValueError):
            AmqpWire(frame_max=bad)
        with pytest.raises(ValueError):
            AmqpWire().frame_max = bad
    for bad in (0, MESSAGE_SIZE_LIMIT + 1):
        with pytest.raises(ValueError):
            AmqpWire(max_message_size=bad)


def test_server_properties_go_in_connection_start() -> None:
    props = server_properties("0.6.0")
    assert (props["product"], props["version"], props["platform"]) == ("Tandem", "0.6.0", "Python")
    assert props["capabilities"] == {
        "publisher_confirms": True, "exchange_exchange_bindings": True, "basic.nack": True,
        "consumer_cancel_notify": True, "connection.blocked": True, "authentication_failure_close": True,
        "per_consumer_qos": True}
    data = AmqpWire().method(0, commands.Connection.Start(server_properties=props, mechanisms="PLAIN"))
    [(_, _, start)] = unmarshal_all(data)
    assert isinstance(start, commands.Connection.Start) and start.server_properties == props


# -- properties ---------------------------------------------------------------------------------------

#: payloads of methods clients send, and of a content header, whole: the hostile frames are cut
#: from them, changed in one octet, or made up of a real class and method id and random arguments
_SENT = [frame(m, 1)[7:-1] for m in (
    commands.Connection.StartOk(client_properties={"capabilities": {"basic.nack": True}}, response="\x00u\x00p"),
    commands.Connection.TuneOk(channel_max=10, frame_max=4096, heartbeat=60), commands.Connection.Open(),
    commands.Channel.Open(), commands.Queue.Declare(queue="q", arguments={"x-max-length": 10, "x-d": 1.5}),
    commands.Exchange.Declare(exchange="e", exchange_type="topic"), commands.Basic.Publish(routing_key="q"),
    commands.Basic.Consume(queue="q", arguments={"x-priority": 1}), commands.Basic.Qos(prefetch_count=5),
    commands.Basic.Ack(delivery_tag=1, multiple=True), commands.Confirm.Select())]
_SENT.append(pheader.ContentHeader(0, 10, PROPS).marshal())


def _changed(payload: bytes, at: int, octet: int, cut: bool) -> bytes:
    at %= len(payload)
    return payload[:at] if cut else payload[:at] + bytes([octet]) + payload[at + 1:]


_payloads = st.one_of(
    st.sampled_from(_SENT),
    st.builds(_changed, st.sampled_from(_SENT), st.integers(0, 500), st.integers(0, 255), st.booleans()),
    st.builds(lambda index, args: struct.pack(">I", index) + args, st.sampled_from(sorted(commands.INDEX_MAPPING)),
              st.binary(max_size=64)),
    st.builds(lambda size, props: content_header(size, props=props), st.integers(0, 70), st.binary(max_size=40)),
    st.binary(max_size=64),
)
_frames = st.builds(raw, st.sampled_from([1, 1, 1, 2, 2, 3, 3, 8, 0, 4]), st.integers(0, 2), _payloads)
_publishes = st.builds(lambda channel, size: publish(channel, b"b" * size), st.integers(1, 2), st.integers(0, 64))
_hostile = st.lists(st.one_of(_frames, _frames, _frames, _publishes, _publishes, st.binary(max_size=8)), max_size=16)


@pytest.mark.filterwarnings("ignore:This command is deprecated:DeprecationWarning")  # pamqp, on basic.recover-async
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_hostile, st.lists(st.integers(1, 64), min_size=1))
def test_hostile_octets_raise_only_wire_and_channel_errors(parts: list[bytes], sizes: list[int]) -> None:
    wire = started(frame_max=FRAME_MIN_SIZE, max_message_size=32)
    data = b"".join(parts)
    at, i = 0, 0
    while at < len(data):
        chunk, at, i = data[at:at + sizes[i % len(sizes)]], at + sizes[i % len(sizes)], i + 1
        while True:
            try:
                wire.feed(chunk)
                break
            except ChannelError:
                chunk = b""
            except WireError as err:
                if err.fatal:
                    return
                chunk = b""


_valid = st.one_of(
    st.builds(lambda ch, body: publish(ch, body, frame_max=FRAME_MIN_SIZE), st.integers(1, 3),
              st.binary(max_size=9000)),
    st.builds(lambda ch, q: frame(commands.Queue.Declare(queue=q), ch), st.integers(1, 3),
              st.text("abcxyz.-", max_size=20)),
    st.just(pheartbeat.Heartbeat.marshal()),
    st.just(start_ok()),
)


@settings(max_examples=100, deadline=None)
@given(st.lists(_valid, max_size=6), st.lists(st.integers(1, 5000), min_size=1, max_size=8))
def test_any_chunking_yields_the_same_events(parts: list[bytes], sizes: list[int]) -> None:
    data = HEADER + b"".join(parts)
    whole = AmqpWire(frame_max=FRAME_MIN_SIZE).feed(data)
    chunked = feed_in_chunks(AmqpWire(frame_max=FRAME_MIN_SIZE), data, sizes)
    assert [described(e) for e in chunked] == [described(e) for e in whole]
    assert len(whole) == len(parts) + 1
