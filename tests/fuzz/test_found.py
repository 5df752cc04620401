"""What the fuzzer found, one test each: the input that broke something, against the real thing."""

from __future__ import annotations

import asyncio
import socket
import struct
from pathlib import Path

import msgpack
import pytest

import client
from broker.node.node import Node
from broker.peers.codec import (
    MalformedReplicationError,
    UnknownMessageKind,
    decode_catalogue_snapshot,
    decode_message,
    decode_ops,
    decode_replicate,
    snapshot_ops,
)
from broker.tools.cluster import LocalCluster
from broker.tools.process import NodeProcess
from client.errors import ErrorCode
from client.protocol import FrameError, decode_payload, encode
from client.protocol.frames import Declare, Welcome
from ha.messages import InstallSnapshot
from tests.broker.test_bad_input import RawClient
from tests.fuzz.live import LOG_PROBLEM, login
from tests.helpers import wait_until

PASSWORD = "found-password"


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_client_gone_while_its_request_is_handled_leaves_no_traceback(tmp_path: Path) -> None:
    """A client sends a request the node awaits (a declare's commit) and a fatal frame behind
    it, then resets the connection: the node closed the session by writing ``Close`` on the
    closed transport, and uvloop raised (an unhandled exception in client_connected_cb)."""
    proc = NodeProcess(tmp_path / "n", password=PASSWORD)
    await proc.start()
    try:
        assert proc.address is not None
        n = 20
        for i in range(n):
            reader, writer = await asyncio.open_connection(*proc.address)
            assert isinstance(await login(reader, writer, PASSWORD), Welcome)
            writer.write(encode(Declare(rid=1, queue=f"q{i}")) + struct.pack(">I", 0))  # then: length 0, fatal
            await writer.drain()
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()  # RST, while the node awaits the declare
        await wait_until(lambda: proc.log_text().count("empty frame (length 0)") >= n, timeout=30,
                         what="the node to read every fatal frame")
        async with await client.connect(proc.url) as conn:
            await conn.declare_queue("after")
        bad = [line for line in proc.log_text().splitlines() if LOG_PROBLEM.search(line)]
        assert not bad, "\n".join(bad[:20])
    finally:
        await proc.stop()


# -- replication payloads: refused with MalformedReplicationError, nothing else ----------------------

MALFORMED_REPLICATE = [
    b"\xc1",  # not msgpack
    msgpack.packb({"a": 1}),  # not an array
    msgpack.packb([7]),  # an item that is not [queue_id, partition, message]
    msgpack.packb([[1, 0]]),
    msgpack.packb([[-1, 0, [6, 1, "n"]]]),  # a negative queue id
    msgpack.packb([["q", 0, [6, 1, "n"]]]),
]


@pytest.mark.parametrize("payload", MALFORMED_REPLICATE, ids=range(len(MALFORMED_REPLICATE)))
def test_a_malformed_replicate_payload_is_refused(payload: bytes) -> None:
    with pytest.raises(MalformedReplicationError):
        decode_replicate(payload)


MALFORMED_MESSAGES = [
    7,  # not an array
    [],
    ["2", 1],  # a kind that is not an int
    [0, 1, "n"],  # RequestVote with fields missing (IndexError before)
    [0, "1", "n", 1, 1, 1],  # a term that is a str (a TypeError in the core before: the node stopped)
    [2, 1, "n", 0, 0, "", [[1, 1, "data-as-str", "n", False]], 0],  # entry data not bin
    [2, 1, "n", 0, 0, "", 5, 0],  # entries not an array
    [2, 1, "n", 0, 0, "", [[1]], 0],  # an entry too short
    [3, 1, "n", 1, -4],  # a negative match index
    [4, 1, "n", 1, 1, "n", "state-as-str"],
]


@pytest.mark.parametrize("raw", MALFORMED_MESSAGES, ids=range(len(MALFORMED_MESSAGES)))
def test_a_malformed_replication_message_is_refused(raw: object) -> None:
    with pytest.raises(MalformedReplicationError) as exc:
        decode_message(raw)
    assert not isinstance(exc.value, UnknownMessageKind)


MALFORMED_OPS = [
    msgpack.packb(5),
    msgpack.packb([5]),  # an op that is not an array
    msgpack.packb([[]]),
    msgpack.packb([[["C"]]]),  # a code that is not a str (unhashable: a TypeError before)
    msgpack.packb([["C", 1, 2]]),  # too short
    msgpack.packb([["A", 1, 7]]),  # messages not an array
    msgpack.packb([["A", 1, [[1, None, b"", b""]]]]),  # a message too short
    msgpack.packb([["S", [1, "x"]]]),
    msgpack.packb([["D", [[1]]]]),
    msgpack.packb([["Q", [1, "q"]]]),
    msgpack.packb([["X", "q"]]),
    b"\x91\xa1\xff",  # not UTF-8
]


@pytest.mark.parametrize("data", MALFORMED_OPS, ids=range(len(MALFORMED_OPS)))
def test_a_malformed_log_entry_is_refused(data: bytes) -> None:
    with pytest.raises(MalformedReplicationError):
        decode_ops((1, 0), data)


@pytest.mark.parametrize("data", [
    msgpack.packb([1, 2, 3]),  # too short (a ValueError from unpacking before)
    msgpack.packb([1, 0, [], []]),  # producers not a map
    msgpack.packb([1, 0, {"p": "x"}, []]),
    msgpack.packb([1, 0, {}, [[1, None, b"", b"", None, None, 1.0]]]),  # a message without its delivery count
    msgpack.packb([1, 0, {}, 7]),
], ids=range(5))
def test_a_malformed_snapshot_is_refused(data: bytes) -> None:
    with pytest.raises(MalformedReplicationError):
        snapshot_ops((1, 0), data)


def test_a_malformed_catalogue_snapshot_is_refused() -> None:
    for data in (msgpack.packb(3), msgpack.packb([[1, "q"]]), msgpack.packb([[1, "q", 1, "m", 1, 1, 5, 0]])):
        with pytest.raises(MalformedReplicationError):
            decode_catalogue_snapshot(data)


def test_the_log_pattern_catches_what_it_must() -> None:
    assert LOG_PROBLEM.search("2026-01-01 00:00:00,000 ERROR   asyncio Unhandled exception in client_connected_cb")
    assert LOG_PROBLEM.search("Traceback (most recent call last):")
    assert LOG_PROBLEM.search("2026-01-01 00:00:00,000 ERROR   tandem.broker session x: internal error on Publish")
    assert not LOG_PROBLEM.search("2026-01-01 00:00:00,000 WARNING tandem.broker session x: bad frame")
    assert not LOG_PROBLEM.search("2026-01-01 00:00:00,000 ERROR   tandem.ha HA-1014 partition 3/1 on node1: ...")


async def _swallows(port: int, declared: int, send: int) -> bool:
    """Whether the node at ``port`` reads ``send`` bytes of a frame declared ``declared`` bytes
    long, sent before any handshake (False: it closed the connection first)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    chunk = b"\0" * (1 << 20)
    try:
        writer.write(struct.pack(">I", declared))
        for _ in range(send >> 20):
            writer.write(chunk)
            await writer.drain()
        return True
    except ConnectionError:
        return False
    finally:
        writer.transport.abort()


@pytest.mark.integration
@pytest.mark.asyncio
async def test_before_a_handshake_no_port_buffers_a_large_frame(tmp_path: Path) -> None:
    """A peer port took frames of up to 512 MB (a snapshot's size) from anyone before the
    handshake, and a client port 8 MB: an attacker with no credentials had each connection
    hold that much memory.  Before the handshake a frame is at most 64 KB; over it, the
    connection is closed at its length prefix."""
    cluster = LocalCluster(tmp_path, console=False, nodes=2, base_port=0, password=PASSWORD)
    try:
        await cluster.start()
        node = cluster.nodes["node1"]
        assert node.address is not None
        assert not await _swallows(cluster.peer_ports["node1"], 400 << 20, 64 << 20)
        assert not await _swallows(node.address[1], 8 << 20, 64 << 20)
        await cluster.wait_ready()
        async with await client.connect(cluster.url) as conn:
            await conn.declare_queue("after")  # both nodes still serve, their peer link up
    finally:
        await cluster.stop()


def test_a_negative_seq_in_a_publish_is_an_invalid_field() -> None:
    """Optional integers inside records (a message's ``seq``) were checked for their type
    only: a negative seq reached the producer bookkeeping, whose KeyError answered the client
    with INTERNAL_ERROR and a traceback in the node's log.  (Found with the fuzzer's check
    that no decoded integer is negative.)"""
    payload = msgpack.packb({"op": 20, "rid": 4, "queue": "q", "producer_id": "p",
                             "messages": [["k", {}, b"x", -1]]}, use_bin_type=True)
    with pytest.raises(FrameError) as exc:
        decode_payload(payload)
    assert exc.value.code == ErrorCode.INVALID_FIELD and exc.value.rid == 4 and "seq" in exc.value.message
    ok = msgpack.packb({"op": 20, "rid": 5, "queue": "q", "messages": [["k", {}, b"x", None], ["k", {}, b"y", 3]]},
                       use_bin_type=True)
    assert [m.seq for m in decode_payload(ok).messages] == [None, 3]  # type: ignore[attr-defined]


@pytest.mark.asyncio
async def test_a_node_answers_a_negative_seq_with_invalid_field(node: Node) -> None:
    raw = await RawClient.open(node)
    raw.send_map({"op": 10, "rid": 1, "queue": "q"})
    assert type(await raw.frame()).__name__ == "DeclareOk"
    raw.send_map({"op": 20, "rid": 2, "queue": "q", "producer_id": "p", "messages": [["k", {}, b"x", -1]]})
    err = await raw.error()
    assert (err.code, err.rid) == (ErrorCode.INVALID_FIELD, 2)
    raw.send_map({"op": 20, "rid": 3, "queue": "q", "producer_id": "p", "messages": [["k", {}, b"x", 0]]})
    assert type(await raw.frame()).__name__ == "PublishOk"
    raw.close()


@pytest.mark.asyncio
async def test_a_node_refuses_integers_over_64_bits_signed(node: Node) -> None:
    """A stream read from offset 2**64-1 reached SQLite, which cannot hold it (OverflowError:
    INTERNAL_ERROR and a traceback); a seq of 2**63 would have reached the store's producer
    table the same way.  Every integer of a frame is 0 .. 2**63-1 now.  (Found by the live
    phase.)"""
    raw = await RawClient.open(node)
    raw.send_map({"op": 10, "rid": 1, "queue": "q"})
    assert type(await raw.frame()).__name__ == "DeclareOk"
    raw.send_map({"op": 45, "rid": 2, "queue": "q", "partition": 0, "offset": 2**64 - 1})
    err = await raw.error()
    assert (err.code, err.rid) == (ErrorCode.INVALID_FIELD, 2) and "offset" in err.message
    raw.send_map({"op": 20, "rid": 3, "queue": "q", "producer_id": "p", "messages": [["k", {}, b"x", 2**63]]})
    err = await raw.error()
    assert (err.code, err.rid) == (ErrorCode.INVALID_FIELD, 3)
    raw.send_map({"op": 45, "rid": 4, "queue": "q", "partition": 0, "offset": 2**63 - 1})
    assert type(await raw.frame()).__name__ == "ReadOk"
    raw.close()


def test_a_malformed_snapshot_is_refused_as_it_arrives() -> None:
    """An InstallSnapshot whose data was not a snapshot went into the replication core, which
    dropped the partition's log for it; installing it then failed and the node stopped (live
    phase, a peer link that was not authenticated).  The transport checks a snapshot's data
    before the core sees it, and drops the message with a warning."""
    from broker.peers.codec import CATALOGUE, check_snapshot
    from broker.modes.replicated.transport import Transport

    bad = msgpack.packb([[0, 0, [4, 3, "node2", 9, 2, "node2", b"\xc1 not a snapshot"]],
                         [1, 0, [4, 3, "node2", 9, 2, "node2", msgpack.packb([1, 2, 3])]]])
    for key in (CATALOGUE, (1, 0)):
        with pytest.raises(MalformedReplicationError):
            check_snapshot(key, b"\x92\x01")
    logs = {CATALOGUE: object(), (1, 0): object()}
    transport = Transport(None, None, logs, engine=None, writer=None, peers=None, queues=None,  # type: ignore[arg-type]
                          group_state=dict, release_held=lambda _p: None, spawn=lambda _c: None,
                          restart=lambda p, _why: p)
    assert list(transport.receive("node2", bad)) == []
    good = msgpack.packb([[0, 0, [4, 3, "node2", 9, 2, "node2", msgpack.packb([])]]])
    ((_plog, msg),) = list(transport.receive("node2", good))
    assert isinstance(msg, InstallSnapshot) and msg.data == msgpack.packb([])
