"""Fuzz targets: each takes one input (bytes) and runs it through what a node or a client
does with bytes from the other side, up to the point where a typed value leaves the decoder.

A target may raise :class:`~client.errors.TandemError` (the decoder refused the input with
a protocol error); anything else is a finding.  Stream targets read a leading *mode* byte:
bit 0 set means "handshake first" (a valid ``Hello``/``Welcome``/``PeerHello`` exchange, so
the rest reaches the OPEN state), bits 1..7 the size of the chunks the rest is fed in
(0: all at once), so the frame buffer sees frames split anywhere.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

from broker.amqp.publishing import batches
from broker.amqp.wire import AmqpWire, ChannelError
from broker.messaging.forward import (DeclareFwd, PublishFwd, RelayDeliverFwd, RelaySettleFwd, decode_reply,
                                      decode_request)
from broker.sessions.relayed import settled_tags
from broker.messaging.declare import validate_declare
from broker.peers.codec import (
    CATALOGUE,
    UnknownMessageKind,
    decode_catalogue_snapshot,
    decode_message,
    decode_ops,
    decode_replicate,
    snapshot_ops,
)
from client.errors import TandemError
from client.protocol import NEED_DATA, ConnectionEnded, FrameError, ProtocolConnection, Role, State, encode
from client.protocol.codec import MAX_INT, decode_payload
from client.protocol.frames import (
    Declare,
    Deliver,
    Forward,
    Frame,
    Record,
    Hello,
    PeerHello,
    AuthChallenge,
    AuthResponse,
    PeerWelcome,
    Publish,
    Replicate,
    Welcome,
    expect,
)
from ha.messages import AppendEntries, Entry, Envelope, InstallSnapshot, VoteReply
from ha.replica import Replica, ReplicaConfig
from tests.fuzz.corpus import hello, peer_hello, welcome

Target = Callable[[bytes], None]

KEY = (3, 0)


def _feed(conn: ProtocolConnection, data: bytes, chunk: int, on_frame: Callable[[Frame], None]) -> None:
    """Feed ``data`` (in ``chunk``-sized pieces, 0: at once), then EOF, taking every event."""
    pieces = [data] if chunk == 0 else [data[i:i + chunk] for i in range(0, len(data), chunk)]
    for piece in [*pieces, b""]:
        conn.receive_data(piece)
        while conn.state is not State.ERROR:
            try:
                event = conn.next_event()
            except FrameError as exc:
                if exc.fatal:
                    return
                continue
            if event is NEED_DATA:
                break
            if isinstance(event, ConnectionEnded):
                return
            assert isinstance(event, Frame)
            _check_invariants(event, type(event).__name__)
            on_frame(event)


def _check_invariants(value: object, path: str = "frame") -> None:
    """What the codec promises of every decoded frame (client/protocol/codec.py): integers
    are 0 .. MAX_INT.  A frame that breaks it is a finding (AssertionError)."""
    if type(value) is int:
        if not 0 <= value <= MAX_INT:
            raise AssertionError(f"{path}: the decoder let an integer out of 0 .. 2**63-1 through ({value})")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_invariants(v, f"{path}[{i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_invariants(v, f"{path}.{k}")
    elif isinstance(value, (Frame, Record)):
        for f in dataclasses.fields(value):  # type: ignore[arg-type]
            _check_invariants(getattr(value, f.name), f"{path}.{f.name}")


def _mode(data: bytes) -> tuple[bool, int, bytes]:
    if not data:
        return False, 0, b""
    return bool(data[0] & 1), data[0] >> 1, data[1:]


def client_stream(data: bytes) -> None:
    """Bytes a client sends to a node's client port (the node's side: Role.SERVER)."""
    primed, chunk, rest = _mode(data)
    conn = ProtocolConnection(Role.SERVER)
    if primed:
        conn.receive_data(encode(hello()))
        expect(conn.next_event(), Hello)
        conn.send(CHALLENGE)
        conn.receive_data(encode(RESPONSE))
        expect(conn.next_event(), AuthResponse)
        conn.send(welcome())

    def on_frame(f: Frame) -> None:
        if isinstance(f, Hello) and conn.state is State.HELLO_RECEIVED:
            conn.send(CHALLENGE)
        elif isinstance(f, AuthResponse) and conn.state is State.RESPONSE_RECEIVED:
            conn.send(welcome())

    _feed(conn, rest, chunk, on_frame)


def server_stream(data: bytes) -> None:
    """Bytes a node (or something posing as one) sends to a client (Role.CLIENT)."""
    primed, chunk, rest = _mode(data)
    conn = ProtocolConnection(Role.CLIENT)
    conn.send(hello())
    if primed:
        conn.receive_data(encode(CHALLENGE))
        expect(conn.next_event(), AuthChallenge)
        conn.send(RESPONSE)
        conn.receive_data(encode(welcome()))
        expect(conn.next_event(), Welcome)

    def on_frame(f: Frame) -> None:
        if isinstance(f, AuthChallenge) and conn.state is State.CHALLENGED:
            conn.send(RESPONSE)

    _feed(conn, rest, chunk, on_frame)


#: the SCRAM exchange's middle frames, as the state machine sees them (their contents are the
#: node's business: broker.security.auth checks them, and tests/unit/test_scram.py the math)
CHALLENGE = AuthChallenge(data="r=fuzznonceNODE,s=c2FsdA==,i=4096")
RESPONSE = AuthResponse(data="c=biws,r=fuzznonceNODE,p=cHJvb2Y=")


def peer_stream(data: bytes) -> None:
    """Bytes a peer sends to a node's peer port, each peer frame's payload decoded as the
    node does (Replicate: the replication codec; Forward: the forwarded request)."""
    primed, chunk, rest = _mode(data)
    conn = ProtocolConnection(Role.SERVER)
    welcome_frame = PeerWelcome(version=1, node="node1", store_stamp="s", priority=1, votes=1)
    if primed:
        conn.receive_data(encode(peer_hello()))
        expect(conn.next_event(), PeerHello)
        conn.send(welcome_frame)

    def on_frame(f: Frame) -> None:
        if isinstance(f, PeerHello) and conn.state is State.HELLO_RECEIVED:
            conn.send(welcome_frame)
        elif isinstance(f, Replicate):
            replicate(f.payload)
        elif isinstance(f, Forward):
            _forward(f.kind, f.payload)

    _feed(conn, rest, chunk, on_frame)


def _forward(kind: int, payload: bytes) -> None:
    req = decode_request(kind, payload)
    _check_invariants([getattr(req, f.name) for f in dataclasses.fields(req)], type(req).__name__)
    if isinstance(req, PublishFwd):
        _check_invariants(expect(decode_payload(req.frame), Publish), "PublishFwd.frame")
    elif isinstance(req, DeclareFwd):
        validate_declare(expect(decode_payload(req.frame), Declare))
    elif isinstance(req, RelayDeliverFwd):
        _check_invariants(expect(decode_payload(req.frame), Deliver), "RelayDeliverFwd.frame")
    elif isinstance(req, RelaySettleFwd):
        settled_tags(req)


def forward(data: bytes) -> None:
    """A ``Forward`` frame's kind (first byte) and payload (the rest), and the same bytes as
    a ``ForwardOk`` reply."""
    if not data:
        return
    try:
        _forward(data[0], data[1:])
    finally:
        decode_reply(data[1:])


def replicate(payload: bytes) -> None:
    """A ``Replicate`` payload, decoded as the node does: the items, each item's message,
    the log entries an AppendEntries carries and the snapshot an InstallSnapshot carries."""
    for qid, p, raw in decode_replicate(payload):
        try:
            msg = decode_message(raw)
        except UnknownMessageKind:
            continue
        if isinstance(msg, AppendEntries):
            for e in msg.entries:
                if e.data is not None:
                    decode_ops((qid, p), e.data)
        elif isinstance(msg, InstallSnapshot) and msg.data is not None:
            if (qid, p) == CATALOGUE:
                decode_catalogue_snapshot(msg.data)
            else:
                snapshot_ops((qid, p), msg.data)


def _core(leader: bool) -> Replica:
    """Node "a" of a three-voter partition (a, b, c) holding three entries: active, or a
    follower of "b"."""
    cfg = ReplicaConfig(node="a", voters=("a", "b", "c"), election_timeout=1.0, heartbeat_interval=0.2)
    if not leader:
        entries = [Entry(1, i, b"x", "b") for i in (1, 2, 3)]
        return Replica(cfg, rng=random.Random(0), term=1, log=entries, commit=2)
    r = Replica(cfg, rng=random.Random(0))
    r.tick(5.0)
    r.step(Envelope("b", "a", VoteReply(r.term + 1, "b", True, pre=True)))  # its pre-vote, then its vote
    ready = r.step(Envelope("b", "a", VoteReply(r.term, "b", True)))
    r.persisted(ready.append[-1])
    for _ in range(2):
        _ready, e = r.propose(b"x")
        if e is not None:
            r.persisted(e)
    return r


def replica(data: bytes) -> None:
    """A ``Replicate`` payload's messages stepped into a partition's replication core (active
    or follower, per the first byte's bit 0; from member "b" or "c", per bit 1), the driver's
    part played (appends persisted, time moving on): what a member's messages do to a node."""
    if not data:
        return
    r = _core(bool(data[0] & 1))
    src = "c" if data[0] & 2 else "b"
    now = 6.0
    for _qid, _p, raw in decode_replicate(data[1:]):
        try:
            msg = decode_message(raw)
        except UnknownMessageKind:
            continue
        ready = r.step(Envelope(src, "a", msg))
        if ready.append:
            r.persisted(ready.append[-1])
        now += 0.3
        r.tick(now)


def log_entry(data: bytes) -> None:
    """A log entry payload (what a committed entry applies)."""
    decode_ops(KEY, data)


def snapshot(data: bytes) -> None:
    """A snapshot: a partition's (first byte even) or the catalogue's (odd)."""
    if not data:
        return
    if data[0] & 1:
        decode_catalogue_snapshot(data[1:])
    else:
        snapshot_ops(KEY, data[1:])


def amqp_stream(data: bytes) -> None:
    """Bytes a client sends to a node's AMQP port (broker.amqp.wire), read as the session reads
    them: a channel's fault (ChannelError) closes that channel and the rest is read on; a
    connection's fault (WireError) ends it.  Mode bit 0: the protocol header first."""
    primed, chunk, rest = _mode(data)
    wire = AmqpWire(frame_max=4096, max_message_size=1 << 16)
    if primed:
        assert wire.feed(AmqpWire.PROTOCOL_HEADER)
    pieces = [rest] if chunk == 0 else [rest[i:i + chunk] for i in range(0, len(rest), chunk)]
    for piece in pieces:
        for _ in range(len(rest) + 2):  # (each ChannelError consumed a frame: a loop here is a finding)
            try:
                events = wire.feed(piece)
            except ChannelError as exc:
                events, piece = list(exc.events), b""
                continue
            batches(events)
            break
        else:
            raise AssertionError("the wire raised ChannelError without reading on")


TARGETS: dict[str, Target] = {
    "client-stream": client_stream,
    "server-stream": server_stream,
    "peer-stream": peer_stream,
    "forward": forward,
    "replicate": replicate,
    "replica": replica,
    "log-entry": log_entry,
    "snapshot": snapshot,
    "amqp-stream": amqp_stream,
}

#: what a target may raise: the project's own errors
EXPECTED: tuple[type[BaseException], ...] = (TandemError,)
