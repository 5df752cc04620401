"""Property tests of the sans-IO wire protocol (client.protocol) and the error tree.

No sockets, no sleeping: bytes go straight into ProtocolConnection objects.

Sections:
  1. round trip (encode/decode_payload and a ProtocolConnection fed arbitrary chunkings)
  2. robustness of the decoder against hostile bytes
  3. the connection state machine and version negotiation
  4. wire error codes -> exceptions
  5. known bugs, as strict xfails (remove the mark once fixed)
"""

from __future__ import annotations

import dataclasses
import struct
import typing
from types import NoneType, UnionType
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from client.errors import (
    ErrorCode,
    LocalProtocolError,
    NotActiveError,
    TandemError,
    UnsupportedProtocolError,
    for_code,
)
from client.protocol import (
    DEFAULT_MAX_FRAME_SIZE,
    FRAME_TYPES,
    MAX_VERSION,
    MIN_VERSION,
    NEED_DATA,
    ConnectionEnded,
    Frame,
    FrameError,
    ProtocolConnection,
    Record,
    Role,
    State,
    choose_version,
    decode_payload,
    encode,
)
from client.protocol.frames import (
    AuthChallenge,
    AuthResponse,
    Close,
    Declare,
    Error,
    Heartbeat,
    Hello,
    PeerChallenge,
    PeerHello,
    PeerProof,
    PeerWelcome,
    Ok,
    Publish,
    PublishMessage,
    Purge,
    Welcome,
)

U64 = 2**64 - 1
I64_MIN = -(2**63)
MAX_INT = 2**63 - 1  # the largest integer a frame field holds (client.protocol.codec.MAX_INT)

FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MEDIUM = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

ALL_FRAME_CLASSES = list(FRAME_TYPES.values())
HANDSHAKE = (Hello, AuthChallenge, AuthResponse, Welcome, PeerHello, PeerWelcome, PeerChallenge, PeerProof)
# Frames any side may receive while OPEN without ending the connection.
BODY_CLASSES = [c for c in ALL_FRAME_CLASSES if c not in (*HANDSHAKE, Close)]
# Frames that are requests/replies: refused on the wire before the handshake.
PRE_HANDSHAKE_FORBIDDEN = [c for c in ALL_FRAME_CLASSES if c not in (*HANDSHAKE, Close, Error)]


# -- strategies built from the dataclass annotations ---------------------------------------


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _required(f: dataclasses.Field) -> bool:  # type: ignore[type-arg]
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def strategy_for(tp: Any) -> st.SearchStrategy[Any]:
    origin = typing.get_origin(tp)
    if origin in (UnionType, typing.Union):
        (inner,) = [a for a in typing.get_args(tp) if a is not NoneType]
        return st.none() | strategy_for(inner)
    if origin is list:
        (item,) = typing.get_args(tp)
        return st.lists(strategy_for(item), max_size=4)
    if origin is dict:
        return st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3)
    if isinstance(tp, type) and issubclass(tp, Record):
        hints = _hints(tp)
        return st.builds(tp, *[strategy_for(hints[f.name]) for f in dataclasses.fields(tp)])
    if tp is int:
        return st.integers(0, MAX_INT)
    if tp is float:
        return st.floats(allow_nan=False)
    if tp is str:
        return st.text(max_size=16)
    if tp is bytes:
        return st.binary(max_size=32)
    if tp is bool:
        return st.booleans()
    raise TypeError(f"no strategy for {tp!r}")


_FRAME_STRATEGIES: dict[type, st.SearchStrategy[Any]] = {}


def frame_strategy(cls: type[Frame]) -> st.SearchStrategy[Any]:
    """Valid instances of ``cls``; defaulted fields are sometimes left to their default."""
    if cls not in _FRAME_STRATEGIES:
        hints = _hints(cls)
        req: dict[str, Any] = {}
        opt: dict[str, Any] = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            (req if _required(f) else opt)[f.name] = strategy_for(hints[f.name])
        _FRAME_STRATEGIES[cls] = st.fixed_dictionaries(req, optional=opt).map(lambda kw: cls(**kw))
    return _FRAME_STRATEGIES[cls]


any_body_frame = st.one_of([frame_strategy(c) for c in BODY_CLASSES])
any_frame = st.one_of([frame_strategy(c) for c in ALL_FRAME_CLASSES])

# Arbitrary msgpack-representable values (no ext types).
msgpack_scalars = (
    st.none()
    | st.booleans()
    | st.integers(I64_MIN, U64)
    | st.floats()
    | st.text(max_size=10)
    | st.binary(max_size=10)
)
msgpack_values = st.recursive(
    msgpack_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


def minimal_value(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (UnionType, typing.Union):
        (inner,) = [a for a in typing.get_args(tp) if a is not NoneType]
        return minimal_value(inner)
    if origin is list:
        (item,) = typing.get_args(tp)
        return [minimal_value(item)]
    if origin is dict:
        return {"h": "v"}
    if isinstance(tp, type) and issubclass(tp, Record):
        hints = _hints(tp)
        return tp(*[minimal_value(hints[f.name]) for f in dataclasses.fields(tp)])
    return {int: 1, float: 1.5, str: "s", bytes: b"b", bool: True}[tp]


def minimal_frame(cls: type[Frame], rid: int = 42) -> Frame:
    hints = _hints(cls)
    kw = {f.name: minimal_value(hints[f.name]) for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    if "rid" in kw:
        kw["rid"] = rid
    return cls(**kw)


def wire_map(frame: Frame) -> dict[str, Any]:
    """The msgpack map a frame travels as (records as lists)."""
    return msgpack.unpackb(encode(frame)[4:], raw=False)


def frame_bytes(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def _record_as_list(obj: Any) -> Any:
    if isinstance(obj, Record):
        return [getattr(obj, f.name) for f in dataclasses.fields(obj)]  # type: ignore[arg-type]
    raise TypeError(type(obj).__name__)


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True, default=_record_as_list)


# -- connection helpers --------------------------------------------------------------------


def open_pair(*, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> tuple[ProtocolConnection, ProtocolConnection]:
    """A client and a server that completed the handshake (Hello, AuthChallenge, AuthResponse,
    Welcome; the SCRAM messages are not checked at this layer)."""
    client = ProtocolConnection(Role.CLIENT)
    server = ProtocolConnection(Role.SERVER, max_frame_size=max_frame_size)
    server.receive_data(client.hello(client_name="t", user="u", auth="n,,n=u,r=abc", heartbeat=5.0))
    hello = server.next_event()
    assert isinstance(hello, Hello)
    assert server.state is State.HELLO_RECEIVED
    version = choose_version(hello.min_version, hello.max_version)
    client.receive_data(server.send(AuthChallenge(data="r=abcdef,s=c2FsdA==,i=4096")))
    assert isinstance(client.next_event(), AuthChallenge)
    assert client.state is State.CHALLENGED and server.state is State.CHALLENGE_SENT
    server.receive_data(client.auth_response("c=biws,r=abcdef,p=cHJvb2Y="))
    assert isinstance(server.next_event(), AuthResponse)
    assert client.state is State.RESPONSE_SENT and server.state is State.RESPONSE_RECEIVED
    client.receive_data(server.send(Welcome(
        version=version, node="n1", heartbeat=5.0,
        max_frame_size=max_frame_size, max_message_size=1024, auth="v=c2ln",
    )))
    welcome = client.next_event()
    assert isinstance(welcome, Welcome)
    assert client.state is State.OPEN and server.state is State.OPEN
    assert client.version == server.version == version
    return client, server


def client_hello_sent() -> ProtocolConnection:
    client = ProtocolConnection(Role.CLIENT)
    client.hello(client_name="t", user="u", auth="n,,n=u,r=abc", heartbeat=5.0)
    assert client.state is State.HELLO_SENT
    return client


def client_response_sent() -> ProtocolConnection:
    """A client that answered the node's AuthChallenge and waits for Welcome."""
    client = client_hello_sent()
    client.receive_data(encode(AuthChallenge(data="r=abcdef,s=c2FsdA==,i=4096")))
    assert isinstance(client.next_event(), AuthChallenge)
    client.auth_response("c=biws,r=abcdef,p=cHJvb2Y=")
    assert client.state is State.RESPONSE_SENT
    return client


def server_hello_received() -> ProtocolConnection:
    server = ProtocolConnection(Role.SERVER)
    server.receive_data(encode(Hello(min_version=1, max_version=1, client_name="c", user="u", mechanism="SCRAM-SHA-256", auth="n,,n=u,r=abc")))
    assert isinstance(server.next_event(), Hello)
    return server


def drain(conn: ProtocolConnection) -> list[Frame]:
    """Every frame ready now (stops at NEED_DATA); errors propagate."""
    out: list[Frame] = []
    for _ in range(100_000):
        ev = conn.next_event()
        if ev is NEED_DATA:
            return out
        assert isinstance(ev, Frame), ev
        out.append(ev)
    raise AssertionError("next_event never asked for more data")


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = [0, *sorted(cuts), len(data)]
    return [data[a:b] for a, b in zip(points, points[1:]) if b > a]


def chunkings(data: bytes) -> st.SearchStrategy[list[bytes]]:
    return st.lists(st.integers(0, len(data)), max_size=10).map(lambda cuts: split(data, cuts))


def feed_hostile(conn: ProtocolConnection, data: bytes, *, eof: bool = True) -> list[Any]:
    """Feed ``data`` and pull events until NEED_DATA / end / a fatal error.

    Asserts the only exception is FrameError, that a fatal one leaves the
    connection in ERROR, and that the loop terminates (each call consumes a
    frame or asks for data, so the bound is generous).
    """
    if data:
        conn.receive_data(data)
    if eof:
        conn.receive_data(b"")
    events: list[Any] = []
    for _ in range(len(data) + 3):
        try:
            ev = conn.next_event()
        except FrameError as exc:
            assert isinstance(exc.code, ErrorCode)
            assert isinstance(exc.rid, int) and exc.rid >= 0
            events.append(exc)
            if exc.fatal:
                assert conn.state is State.ERROR
                assert conn.closed
                return events
            continue
        except Exception as exc:  # pragma: no cover - that is the failure being looked for
            raise AssertionError(f"decoder raised {type(exc).__name__}: {exc}") from exc
        events.append(ev)
        if ev is NEED_DATA or isinstance(ev, ConnectionEnded):
            return events
        assert isinstance(ev, Frame)
    raise AssertionError("decoder did not terminate")


# ==========================================================================================
# 1. Round trip
# ==========================================================================================


def test_frame_types_cover_every_op() -> None:
    for op, cls in FRAME_TYPES.items():
        assert cls.OP is op
    assert len(FRAME_TYPES) == len({c.__name__ for c in FRAME_TYPES.values()})


@pytest.mark.parametrize("cls", ALL_FRAME_CLASSES, ids=lambda c: c.__name__)
@FAST
@given(data=st.data())
def test_encode_decode_roundtrip(cls: type[Frame], data: st.DataObject) -> None:
    frame = data.draw(frame_strategy(cls))
    wire = encode(frame)
    (n,) = struct.unpack(">I", wire[:4])
    assert n == len(wire) - 4 >= 1
    decoded = decode_payload(wire[4:])
    assert type(decoded) is cls
    assert decoded == frame
    assert encode(decoded) == wire  # canonical: re-encoding gives the same bytes


@FAST
@given(frame=frame_strategy(Hello), data=st.data())
def test_hello_roundtrip_through_server_in_any_chunking(frame: Hello, data: st.DataObject) -> None:
    server = ProtocolConnection(Role.SERVER)
    got: list[Frame] = []
    for chunk in data.draw(chunkings(encode(frame))):
        server.receive_data(chunk)
        got += drain(server)
    assert got == [frame]
    assert server.state is State.HELLO_RECEIVED


@FAST
@given(  # a version the client offered (one outside its range may rightly be refused)
    frame=st.builds(dataclasses.replace, frame_strategy(Welcome), version=st.integers(MIN_VERSION, MAX_VERSION)),
    data=st.data(),
)
def test_welcome_roundtrip_through_client_in_any_chunking(frame: Welcome, data: st.DataObject) -> None:
    client = client_response_sent()
    got: list[Frame] = []
    for chunk in data.draw(chunkings(encode(frame))):
        client.receive_data(chunk)
        got += drain(client)
    assert got == [frame]
    assert client.state is State.OPEN
    assert client.version == frame.version


@SLOW
@given(
    frames=st.lists(any_body_frame, max_size=6),
    close=st.none() | frame_strategy(Close),
    data=st.data(),
)
def test_stream_roundtrip_through_open_connection(
    frames: list[Frame], close: Close | None, data: st.DataObject
) -> None:
    client, server = open_pair()
    sent = frames + ([close] if close is not None else [])
    stream = b"".join(client.send(f) for f in sent)
    assert stream == b"".join(encode(f) for f in sent)
    got: list[Frame] = []
    for chunk in data.draw(chunkings(stream)):
        server.receive_data(chunk)
        got += drain(server)
    assert got == sent
    assert server.state is (State.CLOSED if close is not None else State.OPEN)
    server.receive_data(b"")
    assert server.next_event() == ConnectionEnded(clean=close is not None)


@pytest.mark.parametrize("cls", BODY_CLASSES, ids=lambda c: c.__name__)
@FAST
@given(data=st.data())
def test_each_body_frame_roundtrips_through_open_connection(cls: type[Frame], data: st.DataObject) -> None:
    frame = data.draw(frame_strategy(cls))
    _client, server = open_pair()
    got: list[Frame] = []
    for chunk in data.draw(chunkings(encode(frame) * 2)):
        server.receive_data(chunk)
        got += drain(server)
    assert got == [frame, frame]
    assert server.state is State.OPEN


def test_large_stream_with_buffer_compaction() -> None:
    """Several MiB through one buffer exercises the FrameBuffer compaction path."""
    _client, server = open_pair()
    frames = [
        Publish(rid=i + 1, queue="q", messages=[PublishMessage(None, {}, bytes([i]) * 300_000, i)])
        for i in range(12)
    ]
    stream = b"".join(encode(f) for f in frames)
    got: list[Frame] = []
    step = 70_001
    for i in range(0, len(stream), step):
        server.receive_data(stream[i:i + step])
        got += drain(server)
    assert got == frames


def test_record_trailing_default_may_be_omitted() -> None:
    payload = pack({"op": 20, "rid": 1, "queue": "q", "messages": [["k", {"a": "b"}, b"x"]]})
    frame = decode_payload(payload)
    assert frame == Publish(rid=1, queue="q", messages=[PublishMessage("k", {"a": "b"}, b"x", None)])


def test_unknown_extra_keys_are_ignored() -> None:
    payload = pack({"op": 6, "rid": 3, "future_field": [1, {"x": b"y"}], "another": None})
    assert decode_payload(payload) == Ok(rid=3)


def test_int_accepted_for_float_field() -> None:
    payload = pack({"op": 1, "min_version": 1, "max_version": 1, "client_name": "c",
                    "user": "u", "password": "p", "heartbeat": 3})
    frame = decode_payload(payload)
    assert isinstance(frame, Hello) and frame.heartbeat == 3.0 and type(frame.heartbeat) is float


# ==========================================================================================
# 2. Robustness
# ==========================================================================================

# -- bad payloads that a length prefix contains: each must be a non-fatal FrameError ----------


def _invalid_utf8() -> st.SearchStrategy[bytes]:
    def bad(b: bytes) -> bool:
        try:
            b.decode("utf-8")
        except UnicodeDecodeError:
            return True
        return False
    return st.binary(min_size=1, max_size=20).filter(bad) | st.sampled_from(
        [b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"a\x80"])


def _msgpack_str_raw(b: bytes) -> bytes:
    return b"\xd9" + bytes([len(b)]) + b


def _ext_raw(code: int, data: bytes) -> bytes:
    return b"\xc7" + bytes([len(data)]) + struct.pack("b", code) + data


def _map_raw(items: list[tuple[bytes, bytes]]) -> bytes:
    assert len(items) < 16
    return bytes([0x80 | len(items)]) + b"".join(k + v for k, v in items)


unknown_ops = st.integers(I64_MIN, U64).filter(lambda op: op not in FRAME_TYPES)
non_int_ops = st.sampled_from([None, True, False, "1", "publish", 1.0, b"\x01", [1], {"op": 1}])

bad_payloads = st.one_of(
    # not msgpack at all: 0xc1 is never used by msgpack; trailing garbage; truncated values
    st.binary(max_size=16).map(lambda b: b"\xc1" + b),
    st.sampled_from([b"\x82\xa2op", b"\xda\x00\x05ab", b"\x81\xa2op\x06\x00\x00", b"\x93\x01"]),
    # valid msgpack, not a map
    msgpack_values.filter(lambda v: not isinstance(v, dict)).map(pack),
    # a map without a known op
    st.builds(lambda op, rid: pack({"op": op, "rid": rid}), unknown_ops | non_int_ops, st.integers(0, U64)),
    st.dictionaries(st.text(max_size=5).filter(lambda k: k != "op"), msgpack_values, max_size=3).map(pack),
    # map keys that are not strings
    st.just(b"\x81\x01\x02"),
    # ext types (every code but the timestamp type -1, see the xfail below)
    st.builds(
        lambda code, data: _map_raw([(pack("op"), pack(5)), (pack("x"), _ext_raw(code, data))]),
        st.integers(-128, 127).filter(lambda c: c != -1), st.binary(max_size=8),
    ),
    # invalid UTF-8 as a value and as a key
    _invalid_utf8().map(lambda b: _map_raw([(pack("op"), pack(13)), (pack("rid"), pack(1)),
                                            (pack("queue"), _msgpack_str_raw(b))])),
    _invalid_utf8().map(lambda b: _map_raw([(pack("op"), pack(6)), (_msgpack_str_raw(b), pack(1))])),
    # huge lengths declared inside msgpack
    st.sampled_from([b"\xdb\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff", b"\xdd\xff\xff\xff\xff",
                     b"\xdf\xff\xff\xff\xff", b"\x82\xa2op\x06\xa3rid\xdd\xff\xff\xff\xff"]),
    # deep nesting
    st.integers(1_000, 50_000).map(lambda n: b"\x81\xa2op" + b"\x91" * n + b"\xc0"),
    # a known op with a missing required field
    st.just(pack({"op": int(Purge.OP), "rid": 9})),
    # a known op with a mistyped field
    st.builds(lambda v: pack({"op": int(Purge.OP), "rid": 9, "queue": v}),
              msgpack_values.filter(lambda v: type(v) is not str)),
)


@SLOW
@given(bad=bad_payloads, good=any_body_frame)
def test_contained_bad_payload_is_not_fatal_after_handshake(bad: bytes, good: Frame) -> None:
    _client, server = open_pair()
    server.receive_data(frame_bytes(bad) + encode(good))
    with pytest.raises(FrameError) as info:
        server.next_event()
    assert info.value.fatal is False
    assert server.state is State.OPEN
    assert server.next_event() == good
    assert server.next_event() is NEED_DATA


@MEDIUM
@given(bad=bad_payloads)
def test_bad_payload_before_handshake_is_fatal(bad: bytes) -> None:
    for conn in (ProtocolConnection(Role.SERVER), client_hello_sent()):
        conn.receive_data(frame_bytes(bad))
        with pytest.raises(FrameError) as info:
            conn.next_event()
        assert info.value.fatal is True
        assert conn.state is State.ERROR
        with pytest.raises(LocalProtocolError):
            conn.next_event()


@MEDIUM
@given(bad=bad_payloads)
def test_decode_payload_raises_only_non_fatal_frame_error(bad: bytes) -> None:
    with pytest.raises(FrameError) as info:
        decode_payload(bad)
    assert info.value.fatal is False
    assert info.value.code in {ErrorCode.MALFORMED_FRAME, ErrorCode.UNKNOWN_OP, ErrorCode.INVALID_FIELD}


# -- random / mutated byte streams -----------------------------------------------------------


@SLOW
@given(data=st.binary(max_size=300), state=st.sampled_from(["open", "start", "hello_sent", "hello_received"]))
def test_random_bytes(data: bytes, state: str) -> None:
    conn = {
        "open": lambda: open_pair(max_frame_size=256)[1],
        "start": lambda: ProtocolConnection(Role.SERVER, max_frame_size=256),
        "hello_sent": client_hello_sent,
        "hello_received": server_hello_received,
    }[state]()
    events = feed_hostile(conn, data)
    if state in ("start", "hello_sent"):
        assert all(e.fatal for e in events if isinstance(e, FrameError))


@SLOW
@given(payload=st.binary(min_size=1, max_size=200), good=any_body_frame)
def test_random_payload_with_valid_length_is_contained(payload: bytes, good: Frame) -> None:
    _client, server = open_pair()
    server.receive_data(frame_bytes(payload) + encode(good))
    try:
        first = server.next_event()
    except FrameError as exc:
        if exc.fatal:  # only legitimate if the bytes happen to be a Hello/Welcome
            assert isinstance(decode_payload(payload), HANDSHAKE)
            return
        assert server.next_event() == good
        return
    # It happened to decode: only a frame the state machine refuses could be fatal, and that
    # would have raised.  Otherwise the good frame is next.
    assert isinstance(first, Frame)
    if isinstance(first, Close):
        return
    assert server.next_event() == good


@SLOW
@given(frames=st.lists(any_frame, min_size=1, max_size=4), data=st.data())
def test_mutated_byte(frames: list[Frame], data: st.DataObject) -> None:
    stream = b"".join(encode(f) for f in frames)
    pos = data.draw(st.integers(0, len(stream) - 1), label="pos")
    value = data.draw(st.integers(0, 255).filter(lambda v: v != stream[pos]), label="value")
    mutated = stream[:pos] + bytes([value]) + stream[pos + 1:]
    _client, server = open_pair(max_frame_size=4096)
    feed_hostile(server, mutated, eof=data.draw(st.booleans(), label="eof"))


@SLOW
@given(frame=any_body_frame, cut=st.data())
def test_truncated_frame_needs_data_then_ends_unclean(frame: Frame, cut: st.DataObject) -> None:
    wire = encode(frame)
    n = cut.draw(st.integers(0, len(wire) - 1))
    _client, server = open_pair()
    if n:
        server.receive_data(wire[:n])
    assert server.next_event() is NEED_DATA
    assert server.next_event() is NEED_DATA  # asking twice does not consume anything
    server.receive_data(b"")
    assert server.next_event() == ConnectionEnded(clean=False)


@SLOW
@given(frame=any_body_frame, length=st.integers(0, 2**32 - 1), data=st.data())
def test_corrupted_length_prefix(frame: Frame, length: int, data: st.DataObject) -> None:
    max_frame_size = 1024
    wire = encode(frame)
    corrupted = struct.pack(">I", length) + wire[4:]
    _client, server = open_pair(max_frame_size=max_frame_size)
    events = feed_hostile(server, corrupted, eof=data.draw(st.booleans()))
    if length == 0 or length > max_frame_size:
        (exc,) = events
        assert isinstance(exc, FrameError) and exc.fatal is True
        assert exc.code is (ErrorCode.MALFORMED_FRAME if length == 0 else ErrorCode.FRAME_TOO_LARGE)
    elif length > len(wire) - 4:
        assert events[0] is NEED_DATA or events[0] == ConnectionEnded(clean=False)


@MEDIUM
@given(length=st.integers(1025, 2**32 - 1), state=st.sampled_from(["open", "start", "hello_sent"]))
def test_frame_over_max_frame_size_is_fatal_from_the_header_alone(length: int, state: str) -> None:
    conn = {
        "open": lambda: open_pair(max_frame_size=1024)[1],
        "start": lambda: ProtocolConnection(Role.SERVER, max_frame_size=1024),
        "hello_sent": client_hello_sent,
    }[state]()
    conn.max_frame_size = 1024
    conn.receive_data(struct.pack(">I", length))  # no payload at all: the header is enough
    with pytest.raises(FrameError) as info:
        conn.next_event()
    assert info.value.fatal is True
    assert info.value.code is ErrorCode.FRAME_TOO_LARGE
    assert conn.state is State.ERROR
    with pytest.raises(LocalProtocolError):
        conn.next_event()


def test_frame_of_exactly_max_frame_size_is_accepted() -> None:
    frame = Purge(rid=1, queue="x")
    base = len(encode(frame)) - 4
    frame = Purge(rid=1, queue="x" * 20)
    size = len(encode(frame)) - 4
    assert size > base
    _client, server = open_pair()
    server.max_frame_size = size
    server.receive_data(encode(frame))
    assert server.next_event() == frame
    server.receive_data(encode(Purge(rid=1, queue="x" * 21)))
    with pytest.raises(FrameError) as info:
        server.next_event()
    assert info.value.fatal is True


def test_zero_length_frame_is_fatal() -> None:
    _client, server = open_pair()
    server.receive_data(b"\x00\x00\x00\x00" + encode(Heartbeat()))
    with pytest.raises(FrameError) as info:
        server.next_event()
    assert info.value.fatal is True
    assert server.state is State.ERROR


# -- field-level checks --------------------------------------------------------------------

# msgpack "kinds" and a sample of each
KIND_SAMPLES: dict[str, list[Any]] = {
    "nil": [None],
    "bool": [True, False],
    "int": [0, 7, -1, U64],
    "float": [1.5, -0.0],
    "str": ["", "x"],
    "bin": [b"", b"x"],
    "array": [[], [1]],
    "map": [{}, {"a": "b"}],
}


def accepted_kinds(tp: Any) -> set[str]:
    origin = typing.get_origin(tp)
    if origin in (UnionType, typing.Union):
        (inner,) = [a for a in typing.get_args(tp) if a is not NoneType]
        return accepted_kinds(inner) | {"nil"}
    if origin is list or (isinstance(tp, type) and issubclass(tp, Record)):
        return {"array"}
    if origin is dict:
        return {"map"}
    return {int: {"int"}, float: {"int", "float"}, str: {"str"}, bytes: {"bin"}, bool: {"bool"}}[tp]


@pytest.mark.parametrize("cls", ALL_FRAME_CLASSES, ids=lambda c: c.__name__)
def test_wrong_type_for_each_field(cls: type[Frame]) -> None:
    base = wire_map(minimal_frame(cls, rid=42))
    hints = _hints(cls)
    _client, server = open_pair()
    checked = 0
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        ok = accepted_kinds(hints[f.name])
        for kind, samples in KIND_SAMPLES.items():
            if kind in ok:
                continue
            for value in samples:
                payload = pack({**base, f.name: value})
                with pytest.raises(FrameError) as info:
                    decode_payload(payload)
                exc = info.value
                assert exc.code is ErrorCode.INVALID_FIELD, (f.name, value)
                assert exc.fatal is False
                assert exc.rid == (42 if "rid" in base and f.name != "rid" else 0), (f.name, value)
                assert f.name in exc.message
                # and through the connection: contained, the next frame still decodes
                server.receive_data(frame_bytes(payload) + encode(Heartbeat()))
                with pytest.raises(FrameError) as info2:
                    server.next_event()
                assert info2.value.fatal is False
                assert server.next_event() == Heartbeat()
                checked += 1
    assert checked or cls is Heartbeat


@pytest.mark.parametrize("payload", [
    {"op": 40, "rid": 1, "tags": ["1"]},
    {"op": 40, "rid": 1, "tags": [True]},
    {"op": 40, "rid": 1, "tags": [1.0]},
    {"op": 40, "rid": 1, "tags": [1, None]},
    {"op": 20, "rid": 1, "queue": "q", "messages": [[None, {}, "not bytes"]]},
    {"op": 20, "rid": 1, "queue": "q", "messages": [[None, {"a": 1}, b""]]},
    {"op": 20, "rid": 1, "queue": "q", "messages": [[None, {b"a": "b"}, b""]]},
    {"op": 20, "rid": 1, "queue": "q", "messages": [[None, {}, b"", None, "extra"]]},
    {"op": 20, "rid": 1, "queue": "q", "messages": [[None, {}]]},
    {"op": 20, "rid": 1, "queue": "q", "messages": [[1, {}, b""]]},
    {"op": 20, "rid": 1, "queue": "q", "messages": [{"key": None, "headers": {}, "body": b""}]},
    {"op": 20, "rid": 1, "queue": "q", "messages": [None]},
    {"op": 33, "consumer": 1, "messages": [[1, 0, 0, None, {}, b"", False, 1, "ts", "id"]]},
    {"op": 33, "consumer": 1, "messages": [[1, 0, 0, None, {}, b"", 0, 1, 1.0, "id"]]},
    {"op": 11, "rid": 1, "queue": {"name": "q"}, "created": True},
    {"op": 11, "rid": 1, "queue": ["q"], "created": True},
    {"op": 44, "rid": 1, "message": []},
    {"op": 16, "rid": 1, "queues": [["q", 1, "m", 1, 0, None, 0, 0, 0, 0, 0, 0, "not int"]]},
    {"op": 46, "rid": 1, "messages": [[0, 0, None, {}, b"", 1.0, 5]], "next_offset": 0, "end_offset": 0},
], ids=lambda p: f"op{p['op']}")
def test_wrong_types_inside_lists_maps_and_records(payload: dict[str, Any]) -> None:
    with pytest.raises(FrameError) as info:
        decode_payload(pack(payload))
    assert info.value.code is ErrorCode.INVALID_FIELD
    assert info.value.fatal is False
    assert info.value.rid == payload.get("rid", 0)


@pytest.mark.parametrize("cls", ALL_FRAME_CLASSES, ids=lambda c: c.__name__)
def test_missing_fields(cls: type[Frame]) -> None:
    frame = minimal_frame(cls, rid=42)
    base = wire_map(frame)
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        payload = {k: v for k, v in base.items() if k != f.name}
        if _required(f):
            with pytest.raises(FrameError) as info:
                decode_payload(pack(payload))
            assert info.value.code is ErrorCode.INVALID_FIELD
            assert info.value.fatal is False
            assert info.value.rid == (42 if "rid" in base and f.name != "rid" else 0)
            assert f.name in info.value.message
        else:
            decoded = decode_payload(pack(payload))
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            assert getattr(decoded, f.name) == default
            assert decoded == dataclasses.replace(frame, **{f.name: default})  # type: ignore[type-var]


@MEDIUM
@given(op=unknown_ops | non_int_ops, rid=st.integers(I64_MIN, U64) | st.none() | st.text(max_size=3),
       extra=st.dictionaries(st.text(max_size=5), msgpack_values, max_size=3))
def test_unknown_op(op: Any, rid: Any, extra: dict[str, Any]) -> None:
    obj = {**extra, "op": op, "rid": rid}
    with pytest.raises(FrameError) as info:
        decode_payload(pack(obj))
    exc = info.value
    assert exc.code is ErrorCode.UNKNOWN_OP
    assert exc.fatal is False
    assert exc.rid == (rid if type(rid) is int and rid >= 0 else 0)


def test_missing_op_and_bool_op() -> None:
    for obj in ({"rid": 1}, {"op": True, "min_version": 1, "max_version": 1, "client_name": "c",
                             "user": "u", "password": "p"}):
        with pytest.raises(FrameError) as info:
            decode_payload(pack(obj))
        assert info.value.code is ErrorCode.UNKNOWN_OP


@MEDIUM
@given(value=msgpack_values.filter(lambda v: not isinstance(v, dict)))
def test_non_map_payload(value: Any) -> None:
    with pytest.raises(FrameError) as info:
        decode_payload(pack(value))
    assert info.value.code is ErrorCode.MALFORMED_FRAME
    assert info.value.fatal is False


@MEDIUM
@given(code=st.integers(-128, 127).filter(lambda c: c != -1), data=st.binary(max_size=10),
       where=st.sampled_from(["top", "field", "extra", "nested"]))
def test_ext_types_are_refused(code: int, data: bytes, where: str) -> None:
    ext = _ext_raw(code, data)
    payload = {
        "top": ext,
        "field": _map_raw([(pack("op"), pack(13)), (pack("rid"), pack(1)), (pack("queue"), ext)]),
        "extra": _map_raw([(pack("op"), pack(6)), (pack("rid"), pack(1)), (pack("x"), ext)]),
        "nested": _map_raw([(pack("op"), pack(6)), (pack("rid"), pack(1)),
                            (pack("x"), b"\x91\x81" + pack("k") + ext)]),
    }[where]
    with pytest.raises(FrameError) as info:
        decode_payload(payload)
    assert info.value.code is ErrorCode.MALFORMED_FRAME
    assert info.value.fatal is False


@MEDIUM
@given(bad=_invalid_utf8(), where=st.sampled_from(["value", "key", "header"]))
def test_invalid_utf8_strings(bad: bytes, where: str) -> None:
    s = _msgpack_str_raw(bad)
    payload = {
        "value": _map_raw([(pack("op"), pack(13)), (pack("rid"), pack(1)), (pack("queue"), s)]),
        "key": _map_raw([(pack("op"), pack(6)), (pack("rid"), pack(1)), (s, pack(1))]),
        "header": _map_raw([(pack("op"), pack(20)), (pack("rid"), pack(1)), (pack("queue"), pack("q")),
                            (pack("messages"), b"\x91\x93\xc0\x81" + pack("h") + s + pack(b"")) ]),
    }[where]
    with pytest.raises(FrameError) as info:
        decode_payload(payload)
    assert info.value.code is ErrorCode.MALFORMED_FRAME


@SLOW
@given(obj=st.dictionaries(st.text(max_size=12), msgpack_values, max_size=6),
       op=st.sampled_from(sorted(FRAME_TYPES)), use_fields=st.data())
def test_fuzzed_maps_with_known_op(obj: dict[str, Any], op: int, use_fields: st.DataObject) -> None:
    """Random values under real field names: decoded frames are well-typed or FrameError."""
    cls = FRAME_TYPES[op]
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    if names:
        for name in use_fields.draw(st.lists(st.sampled_from(names), max_size=len(names))):
            obj[name] = use_fields.draw(msgpack_values | strategy_for(_hints(cls)[name]))
    obj["op"] = op
    try:
        frame = decode_payload(pack(obj))
    except FrameError as exc:
        assert exc.fatal is False
        assert exc.code in {ErrorCode.INVALID_FIELD}
        return
    assert type(frame) is cls
    wire = encode(frame)
    assert encode(decode_payload(wire[4:])) == wire  # bytes, so NaN compares equal


# ==========================================================================================
# 3. State machine
# ==========================================================================================


@pytest.mark.parametrize("cls", PRE_HANDSHAKE_FORBIDDEN, ids=lambda c: c.__name__)
def test_requests_before_handshake_are_fatal(cls: type[Frame]) -> None:
    frame = minimal_frame(cls, rid=42)
    for make in (lambda: ProtocolConnection(Role.SERVER), server_hello_received,
                 lambda: ProtocolConnection(Role.CLIENT), client_hello_sent):
        conn = make()
        conn.receive_data(encode(frame) + encode(Heartbeat()))
        with pytest.raises(FrameError) as info:
            conn.next_event()
        assert info.value.fatal is True
        assert info.value.code is ErrorCode.PROTOCOL_ERROR
        assert info.value.rid == getattr(frame, "rid", 0)
        assert conn.state is State.ERROR
        with pytest.raises(LocalProtocolError):
            conn.next_event()


def test_error_before_handshake() -> None:
    err = Error(rid=0, code=int(ErrorCode.UNSUPPORTED_PROTOCOL_VERSION), message="no")
    # The server must not accept an Error from a client that has not said Hello ...
    server = ProtocolConnection(Role.SERVER)
    server.receive_data(encode(err))
    with pytest.raises(FrameError) as info:
        server.next_event()
    assert info.value.fatal is True
    # ... but a client waiting for Welcome takes it (the server refused the Hello).
    client = client_hello_sent()
    client.receive_data(encode(err))
    assert client.next_event() == err
    assert client.state is not State.ERROR


def test_welcome_without_hello_is_refused() -> None:
    welcome = Welcome(version=1, node="n", heartbeat=1.0, max_frame_size=100, max_message_size=10)
    for conn in (ProtocolConnection(Role.SERVER), ProtocolConnection(Role.CLIENT)):
        conn.receive_data(encode(welcome))
        with pytest.raises(FrameError) as info:
            conn.next_event()
        assert info.value.fatal is True
        assert conn.state is State.ERROR
        assert conn.version is None
    server = ProtocolConnection(Role.SERVER)
    with pytest.raises(LocalProtocolError):
        server.send(welcome)
    assert server.state is State.START


def test_handshake_frames_are_refused_once_open() -> None:
    hello = Hello(min_version=1, max_version=1, client_name="c", user="u", mechanism="SCRAM-SHA-256", auth="n,,n=u,r=abc")
    welcome = Welcome(version=1, node="n", heartbeat=1.0, max_frame_size=100, max_message_size=10)
    for frame in (hello, welcome):
        for side in (0, 1):
            conn = open_pair()[side]
            conn.receive_data(encode(frame))
            with pytest.raises(FrameError) as info:
                conn.next_event()
            assert info.value.fatal is True
            assert conn.state is State.ERROR
            conn = open_pair()[side]
            with pytest.raises(LocalProtocolError):
                conn.send(frame)
            assert conn.state is State.OPEN
    server = server_hello_received()
    server.receive_data(encode(hello))
    with pytest.raises(FrameError):
        server.next_event()
    client = client_hello_sent()
    with pytest.raises(LocalProtocolError):
        client.send(hello)


@pytest.mark.parametrize("cls", PRE_HANDSHAKE_FORBIDDEN + [Welcome], ids=lambda c: c.__name__)
def test_client_cannot_send_before_handshake(cls: type[Frame]) -> None:
    frame = minimal_frame(cls)
    for conn in (ProtocolConnection(Role.CLIENT), client_hello_sent()):
        before = conn.state
        with pytest.raises(LocalProtocolError):
            conn.send(frame)
        assert conn.state is before


@pytest.mark.parametrize("cls", [c for c in PRE_HANDSHAKE_FORBIDDEN] + [Hello], ids=lambda c: c.__name__)
def test_server_cannot_send_before_welcome(cls: type[Frame]) -> None:
    frame = minimal_frame(cls)
    for conn in (ProtocolConnection(Role.SERVER), server_hello_received()):
        before = conn.state
        with pytest.raises(LocalProtocolError):
            conn.send(frame)
        assert conn.state is before


def test_welcome_without_the_scram_exchange_is_fatal() -> None:
    """A node that skips the challenge (it cannot prove it holds the credentials) is refused
    by the protocol itself, before any SCRAM check."""
    client = client_hello_sent()
    client.receive_data(encode(Welcome(version=1, node="n", heartbeat=1.0, max_frame_size=100,
                                       max_message_size=10)))
    with pytest.raises(FrameError) as info:
        client.next_event()
    assert info.value.fatal and client.state is State.ERROR


def test_server_cannot_welcome_before_the_proof() -> None:
    server = server_hello_received()
    welcome = Welcome(version=1, node="n", heartbeat=1.0, max_frame_size=100, max_message_size=10)
    with pytest.raises(LocalProtocolError):
        server.send(welcome)
    server.send(AuthChallenge(data="r=x"))
    with pytest.raises(LocalProtocolError):
        server.send(welcome)
    assert server.state is State.CHALLENGE_SENT


def test_server_may_refuse_the_proof_with_error_then_close() -> None:
    server = server_hello_received()
    server.send(AuthChallenge(data="r=x"))
    server.receive_data(encode(AuthResponse(data="c=biws")))
    assert isinstance(server.next_event(), AuthResponse)
    server.send(Error(rid=0, code=int(ErrorCode.AUTHENTICATION_FAILED), message="no"))
    assert server.state is State.RESPONSE_RECEIVED
    server.send(Close(code=int(ErrorCode.AUTHENTICATION_FAILED)))
    assert server.state is State.CLOSE_SENT


def test_server_may_refuse_hello_with_error_then_close() -> None:
    server = server_hello_received()
    server.send(Error(rid=0, code=int(ErrorCode.AUTHENTICATION_FAILED), message="no"))
    assert server.state is State.HELLO_RECEIVED
    server.send(Close(code=int(ErrorCode.AUTHENTICATION_FAILED)))
    assert server.state is State.CLOSE_SENT


@MEDIUM
@given(after=st.lists(any_body_frame, max_size=4), reply=st.booleans(), side=st.sampled_from([0, 1]),
       more=any_frame)
def test_after_sending_close(after: list[Frame], reply: bool, side: int, more: Frame) -> None:
    pair = open_pair()
    me, peer = pair[side], pair[1 - side]
    me.send(Close(code=0, reason="bye"))
    assert me.state is State.CLOSE_SENT
    # nothing at all may be sent after Close, not even another Close
    with pytest.raises(LocalProtocolError):
        me.send(more)
    assert me.state is State.CLOSE_SENT
    # frames already in flight are still delivered; only Close ends the connection cleanly
    in_flight = b"".join(peer.send(f) for f in after)
    if in_flight:
        me.receive_data(in_flight)
    assert drain(me) == after
    assert me.state is State.CLOSE_SENT
    if reply:
        me.receive_data(encode(Close(code=0)))
        assert me.next_event() == Close(code=0)
        assert me.state is State.CLOSED
    me.receive_data(b"")
    assert me.next_event() == ConnectionEnded(clean=reply)
    assert me.closed


@pytest.mark.parametrize("frame", [
    Hello(min_version=1, max_version=1, client_name="c", user="u", mechanism="SCRAM-SHA-256", auth="n,,n=u,r=abc"),
    Welcome(version=1, node="n", heartbeat=1.0, max_frame_size=100, max_message_size=10),
], ids=["Hello", "Welcome"])
def test_handshake_frames_refused_after_sending_close_when_open(frame: Frame) -> None:
    _client, server = open_pair()
    server.send(Close())
    server.receive_data(encode(frame))
    with pytest.raises(FrameError) as info:
        server.next_event()
    assert info.value.fatal is True


def test_received_close_ends_cleanly_and_nothing_may_follow() -> None:
    client, server = open_pair()
    server.receive_data(client.send(Close(code=1, reason="r")) + encode(Heartbeat()))
    assert server.next_event() == Close(code=1, reason="r")
    assert server.state is State.CLOSED and server.closed
    with pytest.raises(FrameError) as info:
        server.next_event()
    assert info.value.fatal is True
    with pytest.raises(LocalProtocolError):
        server.send(Heartbeat())


def test_eof_without_close_is_unclean() -> None:
    _client, server = open_pair()
    server.receive_data(encode(Heartbeat()))
    server.receive_data(b"")
    assert server.next_event() == Heartbeat()  # buffered frames still come first
    assert server.next_event() == ConnectionEnded(clean=False)


def test_send_refused_when_closed_or_errored() -> None:
    _client, server = open_pair()
    server.receive_data(b"\xff\xff\xff\xff")
    with pytest.raises(FrameError):
        server.next_event()
    with pytest.raises(LocalProtocolError):
        server.send(Heartbeat())


# -- version negotiation -------------------------------------------------------------------


versions = st.integers(0, 12)


@SLOW
@given(peer_min=versions, peer_max=versions, our_min=versions, our_max=versions)
def test_choose_version(peer_min: int, peer_max: int, our_min: int, our_max: int) -> None:
    common = set(range(peer_min, peer_max + 1)) & set(range(our_min, our_max + 1))
    if common:
        assert choose_version(peer_min, peer_max, (our_min, our_max)) == max(common)
    else:
        with pytest.raises(UnsupportedProtocolError) as info:
            choose_version(peer_min, peer_max, (our_min, our_max))
        assert "unsupported protocol version" in str(info.value)
        assert info.value.code is ErrorCode.UNSUPPORTED_PROTOCOL_VERSION


def test_choose_version_default_range() -> None:
    assert choose_version(MIN_VERSION, MAX_VERSION) == MAX_VERSION
    assert choose_version(0, MAX_VERSION + 5) == MAX_VERSION
    with pytest.raises(UnsupportedProtocolError, match="unsupported protocol version"):
        choose_version(MAX_VERSION + 1, MAX_VERSION + 3)
    with pytest.raises(UnsupportedProtocolError, match="unsupported protocol version"):
        choose_version(0, MIN_VERSION - 1)


def test_a_link_at_version_2_does_not_send_an_overflow() -> None:
    """A node of an older build would ignore the fields and make a queue without its bound."""
    proto = ProtocolConnection(Role.CLIENT)
    proto.version = 2
    with pytest.raises(UnsupportedProtocolError, match="Declare.overflow needs protocol version 3"):
        proto._advance("send", Declare(rid=1, queue="q", overflow="drop-head"))
    with pytest.raises(UnsupportedProtocolError, match="Declare.max_length_bytes needs protocol version 3"):
        proto._advance("send", Declare(rid=1, queue="q", max_length_bytes=5))


# ==========================================================================================
# 4. Error codes
# ==========================================================================================


@pytest.mark.parametrize("code", list(ErrorCode), ids=lambda c: c.name)
def test_for_code_maps_every_code(code: ErrorCode) -> None:
    exc = for_code(int(code), "boom", active_hint="node-2")
    assert isinstance(exc, TandemError)
    assert exc.code is code
    assert exc.message == "boom"
    if code is ErrorCode.NOT_ACTIVE:
        assert isinstance(exc, NotActiveError) and exc.active_hint == "node-2"
    # and through the wire
    err = decode_payload(encode(Error(rid=3, code=int(code), message="boom"))[4:])
    assert isinstance(err, Error)
    assert for_code(err.code, err.message).code is code


@MEDIUM
@given(code=st.integers(I64_MIN, U64).filter(lambda c: c not in {int(e) for e in ErrorCode}),
       message=st.text(min_size=1, max_size=20))
def test_for_code_unknown_codes(code: int, message: str) -> None:
    exc = for_code(code, message)
    assert type(exc) is TandemError
    assert exc.message == message


def test_frame_error_codes_name_the_defect() -> None:
    cases = [
        (b"\xc1", ErrorCode.MALFORMED_FRAME),
        (pack([1]), ErrorCode.MALFORMED_FRAME),
        (pack({"op": 99}), ErrorCode.UNKNOWN_OP),
        (pack({"op": 13, "rid": 1}), ErrorCode.INVALID_FIELD),
    ]
    for payload, code in cases:
        with pytest.raises(FrameError) as info:
            decode_payload(payload)
        assert info.value.code is code
        assert info.value.cause.code is code


# ==========================================================================================
# 5. Regressions: bugs found by these tests, fixed
# ==========================================================================================


@pytest.mark.parametrize("data", [b"\x00" * 4, b"\x00" * 8, b"\x00" * 12], ids=["ts32", "ts64", "ts96"])
def test_timestamp_ext_type_is_ignored_under_unknown_keys_and_refused_in_fields(data: bytes) -> None:
    # msgpack decodes ext -1 (timestamp) itself; under an unknown key it is ignored like any value
    ok = _map_raw([(pack("op"), pack(6)), (pack("rid"), pack(1)), (pack("x"), _ext_raw(-1, data))])
    assert decode_payload(ok) == Ok(rid=1)
    bad = _map_raw([(pack("op"), pack(6)), (pack("rid"), _ext_raw(-1, data))])
    with pytest.raises(FrameError):
        decode_payload(bad)
    bad = _map_raw([(pack("op"), pack(12)), (pack("rid"), pack(1)), (pack("queue"), _ext_raw(-1, data))])
    with pytest.raises(FrameError):
        decode_payload(bad)


@pytest.mark.parametrize("case", ["hello", "close", "int"])
def test_failed_send_leaves_state_unchanged(case: str) -> None:
    if case == "hello":
        conn, frame = ProtocolConnection(Role.CLIENT), Hello(
            min_version=1, max_version=1, client_name="\ud800", user="u")
    elif case == "close":
        conn, frame = open_pair()[0], Close(reason="\udc80")
    else:
        conn, frame = ProtocolConnection(Role.CLIENT), Hello(
            min_version=1, max_version=2**64, client_name="c", user="u", mechanism="SCRAM-SHA-256", auth="n,,n=u,r=abc")
    before = conn.state
    with pytest.raises(Exception):  # ideally LocalProtocolError
        conn.send(frame)
    assert conn.state is before


def test_handshake_refusal_error_then_close() -> None:
    client = ProtocolConnection(Role.CLIENT)
    server = ProtocolConnection(Role.SERVER)
    server.receive_data(client.hello(client_name="c", user="u", auth="n,,n=u,r=abc", heartbeat=1.0))
    assert isinstance(server.next_event(), Hello)
    code = int(ErrorCode.UNSUPPORTED_PROTOCOL_VERSION)
    client.receive_data(server.send(Error(rid=0, code=code, message="no")) + server.send(Close(code=code)))
    client.receive_data(b"")
    assert isinstance(client.next_event(), Error)
    assert client.next_event() == Close(code=code)
    assert client.next_event() == ConnectionEnded(clean=True)


def test_eof_after_handshake_error_without_close_is_unclean() -> None:
    client = client_hello_sent()
    client.receive_data(encode(Error(rid=0, code=200, message="no")))
    client.receive_data(b"")
    assert isinstance(client.next_event(), Error)
    assert client.next_event() == ConnectionEnded(clean=False)


def test_connection_ended_is_stable() -> None:
    _client, server = open_pair()
    server.receive_data(b"")
    assert server.next_event() == ConnectionEnded(clean=False)
    assert server.next_event() == ConnectionEnded(clean=False)


@pytest.mark.parametrize("state", ["start", "open"])
def test_server_can_report_a_fatal_frame_error(state: str) -> None:
    """After a fatal receive error the output stream is still fine: Error then Close may be
    sent (broker/sessions/session.py _read_loop does exactly that), nothing else.

    Regression test: fails on d955972, where send() refused everything in state ERROR; fixed
    in 54080c8 by the (ERROR, send, Error/Close) transitions in client/protocol/connection.py.
    """
    server = ProtocolConnection(Role.SERVER) if state == "start" else open_pair()[1]
    server.receive_data(b"\xff\xff\xff\xff")
    with pytest.raises(FrameError) as info:
        server.next_event()
    assert info.value.fatal
    with pytest.raises(LocalProtocolError):
        server.send(Heartbeat())
    wire = server.send(Error(rid=info.value.rid, code=int(info.value.code), message=info.value.message))
    assert decode_payload(wire[4:]) == Error(rid=0, code=int(ErrorCode.FRAME_TOO_LARGE),
                                             message=info.value.message)
    server.send(Close(code=int(info.value.code)))
    assert server.closed


def test_close_can_be_answered() -> None:
    client, server = open_pair()
    server.receive_data(client.send(Close(code=0)))
    assert server.next_event() == Close(code=0)
    client.receive_data(server.send(Close(code=0)))
    client.receive_data(b"")
    assert client.next_event() == Close(code=0)
    assert client.next_event() == ConnectionEnded(clean=True)


def test_welcome_crossing_close_is_tolerated() -> None:
    client = client_hello_sent()
    client.send(Close())
    client.receive_data(encode(Welcome(version=1, node="n", heartbeat=1.0, max_frame_size=100,
                                       max_message_size=10)) + encode(Close()))
    drain(client)
    assert client.state is State.CLOSED


def test_client_refuses_welcome_with_unoffered_version() -> None:
    client = client_hello_sent()
    client.receive_data(encode(Welcome(version=MAX_VERSION + 7, node="n", heartbeat=1.0,
                                       max_frame_size=100, max_message_size=10)))
    with pytest.raises(FrameError):
        client.next_event()
