"""Heartbeats both ways: a silent client is dropped, a frozen node is noticed."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

import client
from broker.config import NodeConfig
from broker.node.node import Node
from broker.tools.process import NodeProcess
from client.errors import ConnectionClosedError, ErrorCode, HeartbeatTimeoutError
from client.testing import FakeClock
from tests.broker.test_bad_input import RawClient
from tests.conftest import url_of
from tests.helpers import wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.integration]


async def test_node_sends_heartbeats_and_drops_a_silent_client(tmp_path: Path) -> None:
    node = Node(NodeConfig(data_dir=tmp_path / "n", port=0, heartbeat=0.5))
    await node.start()
    try:
        raw = await RawClient.open(node)  # handshake asks for 10 s; the node's 0.5 s wins
        frames = []
        while True:
            f = await raw.frame(timeout=30)
            if f is None:
                break
            frames.append(type(f).__name__)
        assert "Heartbeat" in frames  # the node spoke while we were silent
        assert frames[-2:] == ["Error", "Close"]
        # and a live client on the same node is unaffected
        async with await client.connect_link(url_of(node) + "/?heartbeat=0.5") as conn:
            await conn.declare_queue("q")
    finally:
        await node.stop()


async def test_node_drops_a_connection_that_never_says_hello(tmp_path: Path) -> None:
    node = Node(NodeConfig(data_dir=tmp_path / "n", port=0, login_timeout=0.5))
    await node.start()
    try:
        raw = await RawClient.open(node, handshake=False)
        err = await raw.error()
        assert err.code == ErrorCode.HEARTBEAT_TIMEOUT and "no login within 0.5s of connecting" in err.message
        assert await raw.closed()
    finally:
        await node.stop()


async def test_client_notices_a_frozen_node(tmp_path: Path) -> None:
    proc = NodeProcess(tmp_path / "n", extra_args=["--heartbeat", "0.5"])
    await proc.start()
    try:
        conn = await client.connect_link(proc.url + "/?heartbeat=0.5")
        await conn.declare_queue("q")
        assert proc.proc is not None
        proc.proc.send_signal(signal.SIGSTOP)
        try:
            await asyncio.wait_for(conn.closed_event.wait(), 30)
        finally:
            proc.proc.send_signal(signal.SIGCONT)
        with pytest.raises(HeartbeatTimeoutError):
            await conn.list_queues()
        await conn.close()
    finally:
        await proc.kill()


async def test_send_on_a_dead_connection_fails_fast(tmp_path: Path) -> None:
    proc = NodeProcess(tmp_path / "n")
    await proc.start()
    conn = await client.connect_link(proc.url)
    await conn.declare_queue("q")
    await proc.kill()
    await asyncio.wait_for(conn.closed_event.wait(), 30)
    with pytest.raises(ConnectionClosedError):
        await conn.producer("q").send(b"x")
    await conn.close()


async def test_heartbeat_deadlines_run_on_the_node_clock(tmp_path: Path) -> None:
    """The session's timers are the node's clock: on a FakeClock a connection that has not
    logged in within login_timeout (30 s) of connecting is dropped when the test moves time
    past it, and not before, however often it sends a byte meanwhile."""
    clock = FakeClock(start=1000.0)
    node = Node(NodeConfig(data_dir=tmp_path / "n", port=0, heartbeat=5.0, login_timeout=30.0), clock=clock)
    await node.start()
    try:
        raw = await RawClient.open(node, handshake=False)
        await wait_until(lambda: len(node.sessions) == 1, what="the session")
        raw.writer.write(b"\x00\x00\x10\x00")  # a frame of 4,096 bytes announced, sent a byte at a time

        async def let_run() -> None:
            for _ in range(10):  # let the node read and its session's tasks wake and sleep again
                await asyncio.sleep(0)

        for _ in range(6):  # a byte every 5 s for 30 s: far inside any idle limit
            raw.writer.write(b"\x00")
            await raw.writer.drain()
            await let_run()
            assert len(node.sessions) == 1 and not raw.buffer.next_payload()
            clock.advance(5.0)
            await let_run()
        # 30 s after the connection opened: dropped, bytes or not
        err = await raw.error()
        assert err.code == ErrorCode.HEARTBEAT_TIMEOUT and "no login within 30s of connecting" in err.message
        assert await raw.closed()
    finally:
        await node.stop()
