"""The fault-injecting proxy the drills and integration tests rely on: a delayed link keeps
the byte order (even when the delay changes midway), and a cut drops what is still held."""

from __future__ import annotations

import asyncio

import pytest

from broker.tools.faults import FaultProxy
from tests.helpers import wait_until

pytestmark = pytest.mark.asyncio


async def _echo_server() -> tuple[asyncio.Server, int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _read_exactly(reader: asyncio.StreamReader, n: int) -> bytes:
    async with asyncio.timeout(10):
        return await reader.readexactly(n)


async def test_a_delayed_link_keeps_the_order_when_the_delay_changes() -> None:
    server, port = await _echo_server()
    px = await FaultProxy(("127.0.0.1", port)).start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", px.port)
        px.delay = 0.2
        chunks = [bytes([65 + i]) * 1000 for i in range(5)]
        for c in chunks[:3]:
            writer.write(c)
            await writer.drain()
        await wait_until(lambda: px.held == 3000, timeout=10, what="the proxy holding the first chunks")
        px.delay = 0.0  # the rest would overtake the held chunks if each were timed on its own
        for c in chunks[3:]:
            writer.write(c)
            await writer.drain()
        assert await _read_exactly(reader, 5000) == b"".join(chunks)
        writer.close()
    finally:
        await px.stop()
        server.close()


async def test_a_cut_drops_what_a_delayed_link_still_holds() -> None:
    server, port = await _echo_server()
    px = await FaultProxy(("127.0.0.1", port)).start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", px.port)
        writer.write(b"before")
        assert await _read_exactly(reader, 6) == b"before"
        px.delay = 5.0
        writer.write(b"held")
        await writer.drain()
        await wait_until(lambda: px.held == 4, timeout=10, what="the proxy holding the chunk")
        px.cut()
        got = b""
        async with asyncio.timeout(10):
            try:
                while data := await reader.read(65536):
                    got += data
            except ConnectionResetError:
                pass  # a cut is an abort: a reset, not a goodbye
        assert got == b""  # "held" never arrived
    finally:
        await px.stop()
        server.close()
