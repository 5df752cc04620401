"""Hostile and broken clients on a raw socket: clear error frames, no crash, nothing lost."""

from __future__ import annotations

import asyncio
import struct

import msgpack
import pytest

import client
from broker.node.node import Node
from client.errors import ErrorCode
from client.protocol import FrameBuffer, ProtocolConnection, Role, decode_payload, encode
from client.protocol.frames import AuthChallenge, AuthResponse, Error, Frame, PublishOk, Welcome
from client.protocol.versions import MAX_VERSION
from client.scram import ScramClient
from tests.conftest import PASSWORD

pytestmark = pytest.mark.asyncio


class RawClient:
    """A client that can send anything, byte for byte."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.proto = ProtocolConnection(Role.CLIENT)
        self.buffer = FrameBuffer()

    @classmethod
    async def open(cls, node: Node, *, handshake: bool = True) -> RawClient:
        r, w = await asyncio.open_connection("127.0.0.1", node.address[1])
        raw = cls(r, w)
        if handshake:
            sc = ScramClient("admin", PASSWORD)
            w.write(raw.proto.hello(client_name="raw", user="admin", auth=sc.first, heartbeat=10))
            challenge = await raw.frame()
            assert isinstance(challenge, AuthChallenge), challenge
            sc.challenge(challenge.data)
            w.write(encode(AuthResponse(data=sc.final(sc.salt_password()))))
            welcome = await raw.frame()
            assert isinstance(welcome, Welcome), welcome
            sc.verify(welcome.auth)
        return raw

    def send_raw(self, payload: bytes, declared: int | None = None) -> None:
        n = len(payload) if declared is None else declared
        self.writer.write(struct.pack(">I", n) + payload)

    def send_map(self, obj: dict) -> None:
        self.send_raw(msgpack.packb(obj, use_bin_type=True))

    async def frame(self, timeout: float = 10.0) -> Frame | None:
        """The next frame, or None at EOF (decoded without client-side state checks)."""
        while True:
            payload = self.buffer.next_payload()
            if payload is not None:
                return decode_payload(payload)
            data = await asyncio.wait_for(self.reader.read(65536), timeout)
            if not data:
                return None
            self.buffer.feed(data)

    async def error(self) -> Error:
        f = await self.frame()
        assert isinstance(f, Error), f
        return f

    async def closed(self) -> bool:
        """True when the node closes the connection (a Close frame may come first)."""
        while True:
            f = await self.frame()
            if f is None:
                return True
            if type(f).__name__ != "Close" and not isinstance(f, Error):
                return False

    def close(self) -> None:
        self.writer.close()


@pytest.mark.parametrize("payload, code, rid", [
    (b"\xc1\xc1 not msgpack", ErrorCode.MALFORMED_FRAME, 0),
    (msgpack.packb([1, 2, 3]), ErrorCode.MALFORMED_FRAME, 0),
    (msgpack.packb({"op": 999, "rid": 7}), ErrorCode.UNKNOWN_OP, 7),
    (msgpack.packb({"op": 20, "rid": 8, "queue": "q"}), ErrorCode.INVALID_FIELD, 8),  # no messages
    (msgpack.packb({"op": 20, "rid": 9, "queue": 5, "messages": []}), ErrorCode.INVALID_FIELD, 9),
    (msgpack.packb({"op": 20, "rid": 10, "queue": "q", "messages": [["k", {}, "str-not-bytes"]]}),
     ErrorCode.INVALID_FIELD, 10),
    (msgpack.packb({"op": 10, "rid": 11, "queue": "q", "partitions": "four"}), ErrorCode.INVALID_FIELD, 11),
    (msgpack.packb({"op": 40, "rid": 12, "tags": [1, "two"]}), ErrorCode.INVALID_FIELD, 12),
    (msgpack.packb({"op": 10, "rid": 13, "queue": "bad name"}), ErrorCode.INVALID_ARGUMENT, 13),
    (msgpack.packb({"op": 33, "consumer": 1, "messages": []}), ErrorCode.INVALID_ARGUMENT, 0),  # broker-only op
])
async def test_contained_bad_frames_get_an_error_and_the_connection_goes_on(
        node: Node, payload: bytes, code: ErrorCode, rid: int) -> None:
    raw = await RawClient.open(node)
    raw.send_raw(payload)
    err = await raw.error()
    assert (err.code, err.rid) == (code, rid) and err.message
    # still usable: a good request gets its answer
    raw.send_map({"op": 15, "rid": 100})
    reply = await raw.frame()
    assert type(reply).__name__ == "Queues" and reply.rid == 100  # type: ignore[union-attr]
    raw.close()


async def test_oversized_frame_is_refused_and_closes_only_that_connection(node: Node, url: str) -> None:
    async with await client.connect(url) as good:
        await good.declare_queue("q")
        await good.producer("q").send_many([b"kept"] * 10)
        raw = await RawClient.open(node)
        raw.send_raw(b"", declared=node.config.max_frame_size + 1)
        err = await raw.error()
        assert err.code == ErrorCode.FRAME_TOO_LARGE and "max_frame_size" in err.message
        assert await raw.closed()
        # the node and the other client go on, and nothing confirmed is lost
        await good.producer("q").send(b"after")
        (info,) = await good.list_queues()
        assert info.ready == 11


async def test_message_over_max_message_size_is_refused_not_fatal(node: Node) -> None:
    raw = await RawClient.open(node)
    raw.send_map({"op": 10, "rid": 1, "queue": "q"})
    await raw.frame()
    big = b"x" * (node.config.max_message_size + 1)
    raw.send_map({"op": 20, "rid": 2, "queue": "q", "messages": [[None, {}, big]]})
    err = await raw.error()
    assert err.code == ErrorCode.MESSAGE_TOO_LARGE and err.rid == 2
    raw.send_map({"op": 20, "rid": 3, "queue": "q", "messages": [[None, {}, b"ok"]]})
    assert isinstance(await raw.frame(), PublishOk)
    raw.close()


async def test_garbage_before_handshake_closes_the_connection(node: Node) -> None:
    raw = await RawClient.open(node, handshake=False)
    raw.send_raw(b"GET / HTTP/1.1\r\n")
    assert await raw.closed()


async def test_requests_before_hello_are_refused(node: Node) -> None:
    raw = await RawClient.open(node, handshake=False)
    raw.send_map({"op": 15, "rid": 1})
    err = await raw.error()
    assert err.code == ErrorCode.PROTOCOL_ERROR and "ListQueues" in err.message
    assert await raw.closed()


async def test_unsupported_protocol_version_is_named_and_closed(node: Node) -> None:
    raw = await RawClient.open(node, handshake=False)
    raw.send_map({"op": 1, "min_version": MAX_VERSION + 1, "max_version": MAX_VERSION + 3, "client_name": "future",
                  "user": "admin",
                  "password": PASSWORD})
    err = await raw.error()
    assert err.code == ErrorCode.UNSUPPORTED_PROTOCOL_VERSION
    assert "unsupported protocol version" in err.message
    assert await raw.closed()


async def test_half_frame_then_disconnect_leaves_node_healthy(node: Node, url: str) -> None:
    raw = await RawClient.open(node)
    raw.writer.write(struct.pack(">I", 1000) + b"\x85partial")
    raw.writer.transport.abort()
    async with await client.connect(url) as conn:
        await conn.declare_queue("q")
        await conn.producer("q").send(b"fine")
        assert (await conn.list_queues())[0].ready == 1
