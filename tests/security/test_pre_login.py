"""An unauthenticated attacker holding the client port's slots: a connection that trickles a
partial frame, or opens with a peer's handshake, is closed — the login has a deadline from
connect, not from the last byte, and a peer frame before the login is fatal — and
connections that never log in cannot lock a user out of a node at ``max_connections``.

One node process for the module, started with a short login_timeout and a small
max_connections."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

import client
from broker.tools.process import NodeProcess
from client.protocol import encode
from client.protocol.frames import PeerHello, PeerProof
from tests.conftest import PASSWORD
from tests.helpers import wait_until

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.integration, pytest.mark.timeout(120),
              pytest.mark.xdist_group("security-pre-login")]

LOGIN_TIMEOUT = 2.0
MAX_CONNECTIONS = 12


async def started(tmp: Path, login_timeout: float) -> NodeProcess:
    proc = NodeProcess(tmp / "node1", password=PASSWORD,
                       extra_args=["--login-timeout", str(login_timeout), "--heartbeat", "1",
                                   "--max-connections", str(MAX_CONNECTIONS)])
    await proc.start()
    return proc


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def node(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[NodeProcess]:
    proc = await started(tmp_path_factory.mktemp("pre-login"), LOGIN_TIMEOUT)
    try:
        yield proc
    finally:
        await proc.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def patient(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[NodeProcess]:
    """A node whose login deadline is far off: only the slot rule frees a slot here."""
    proc = await started(tmp_path_factory.mktemp("pre-login-patient"), 120.0)
    try:
        yield proc
    finally:
        await proc.stop()


async def raw(node: NodeProcess) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    assert node.address is not None
    return await asyncio.open_connection(*node.address)


async def closed_by_node(reader: asyncio.StreamReader) -> bool:
    """Whether the node has ended the connection (its Error and Close read, then EOF)."""
    try:
        while await reader.read(65536):
            pass
    except ConnectionError:
        pass
    return True


async def test_a_connection_that_trickles_a_frame_is_closed_at_the_login_deadline(node: NodeProcess) -> None:
    reader, writer = await raw(node)
    closed = asyncio.ensure_future(closed_by_node(reader))
    writer.write(struct.pack(">I", 60_000))  # a frame of 60,000 bytes announced, sent a byte at a time
    sent = 0
    async with asyncio.timeout(LOGIN_TIMEOUT * 10):
        while not closed.done():  # the attacker's pace: a byte every 100 ms, far inside any idle limit
            writer.write(b"\x00")
            sent += 1
            await asyncio.wait([closed], timeout=0.1)
    assert sent < 60_000
    writer.close()
    assert f"no login within {LOGIN_TIMEOUT:g}s of connecting" in node.log_text()


@pytest.mark.parametrize("frame", [
    PeerHello(min_version=1, max_version=1, node="node2", store_stamp="x", priority=1, votes=1, nonce=b"n" * 32),
    PeerProof(proof=b"p" * 32),
], ids=["PeerHello", "PeerProof"])
async def test_a_peer_frame_on_the_client_port_closes_the_connection(node: NodeProcess, frame: object) -> None:
    reader, writer = await raw(node)
    writer.write(encode(frame))  # type: ignore[arg-type]
    async with asyncio.timeout(LOGIN_TIMEOUT / 2):  # at once, not at the login deadline
        assert await closed_by_node(reader)
    writer.close()


async def test_connections_that_never_log_in_do_not_lock_users_out(patient: NodeProcess) -> None:
    held = [await raw(patient) for _ in range(MAX_CONNECTIONS)]
    for _r, w in held:
        w.write(b"\x00\x00")  # half a length prefix, and nothing more
    # every slot is held by a connection that has not logged in: the admin still gets in, every time
    admins = []
    for _ in range(3):  # (each stays open: each needs a slot of its own)
        admins.append(conn := await client.connect_link(patient.url))
        assert (await conn.status()).node == "node1"
    await asyncio.gather(*(c.close() for c in admins))
    # the admin's logins took the slots of the three that waited longest, which the node closed
    async with asyncio.timeout(10):
        for r, _w in held[:3]:
            assert await closed_by_node(r)
    assert patient.log_text().count("its slot went to a new one") == 3
    for _r, w in held:
        w.close()


async def test_logged_in_sessions_keep_their_slots(node: NodeProcess) -> None:
    """At max_connections of logged-in sessions, a new connection is refused: only waiting
    logins give up their slots."""
    conns: list[client.Connection] = []
    try:
        async with asyncio.timeout(30):
            while len(conns) < MAX_CONNECTIONS:
                conns.append(await client.connect_link(node.url))
        reader, writer = await raw(node)
        data = await reader.read(65536)
        assert b"max_connections" in data
        writer.close()
        assert not any(c.is_closed for c in conns)
    finally:
        await asyncio.gather(*(c.close() for c in conns))
