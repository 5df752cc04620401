"""The in-memory network: streams whole and in order, cuts that hold and heal, resets, delays
on the fake clock, and a refused or hanging dial."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from broker.config import NodeConfig
from broker.peers.links import LinkTasks
from client.testing import FakeClock
from tests.harness.network import MemoryNetwork
from tests.harness.runtime import Driver

pytestmark = pytest.mark.asyncio


class Pair:
    """Endpoint "a" dialled "b": the two ends of one connection, and the clock."""

    def __init__(self, net: MemoryNetwork, driver: Driver, cfg: NodeConfig) -> None:
        self.net, self.driver, self.cfg = net, driver, cfg
        self.accepted: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()
        self.tasks = LinkTasks()

    async def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self.accepted.put((reader, writer))
        await asyncio.Event().wait()  # (the connection's handler runs until the test ends it)

    async def dial(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, asyncio.StreamReader,
                                  asyncio.StreamWriter]:
        r, w = await self.net.endpoint("a").connect(self.cfg, self.net.clock, "127.0.0.1", 7002)
        br, bw = await self.accepted.get()
        return r, w, br, bw


@pytest_asyncio.fixture
async def pair(tmp_path: Path) -> AsyncIterator[Pair]:
    clock = FakeClock()
    net = MemoryNetwork(clock, random.Random(1))
    cfg = NodeConfig(name="b", data_dir=tmp_path, peer_port=7002, keepalive_interval=0.1, non_response_timeout=0.5)
    p = Pair(net, Driver(clock), cfg)
    await net.endpoint("b").listen(cfg, clock, p.accept, refused=lambda _r, _w: None, tasks=p.tasks)
    yield p
    await p.tasks.close()


async def read_some(reader: asyncio.StreamReader, driver: Driver) -> bytes:
    """What has arrived by now (the clock moved as far as the next idle point)."""
    await driver.settle()
    out = b""
    while reader._buffer:  # type: ignore[attr-defined]
        out += await reader.read(65536)
    return out


async def test_bytes_arrive_whole_and_in_order_both_ways(pair: Pair) -> None:
    r, w, br, bw = await pair.dial()
    for i in range(100):
        w.write(b"%d," % i)
    bw.write(b"back")
    assert await read_some(br, pair.driver) == b"".join(b"%d," % i for i in range(100))
    assert await read_some(r, pair.driver) == b"back"
    assert bw.get_extra_info("peername")[0] == "127.0.0.1" and bw.get_extra_info("ssl_object") is None


async def test_a_cut_holds_bytes_and_a_heal_lets_them_through_in_order(pair: Pair) -> None:
    r, w, br, bw = await pair.dial()
    pair.net.cut("a", "b", both=False)
    w.write(b"held ")
    w.write(b"then")
    bw.write(b"the other way is open")
    await pair.driver.run_for(5.0)
    assert await read_some(br, pair.driver) == b""
    assert await read_some(r, pair.driver) == b"the other way is open"
    pair.net.heal()
    assert await read_some(br, pair.driver) == b"held then"


async def test_a_dial_across_a_cut_hangs_until_its_timeout_and_one_to_nobody_is_refused(pair: Pair) -> None:
    pair.net.cut("b", "a", both=False)  # (TCP's handshake needs both ways)
    dial = asyncio.ensure_future(pair.dial())
    assert not await pair.driver.until(dial.done, 0.1, fail=False)
    await pair.driver.until(dial.done, 1.0, what="the dial's timeout")
    with pytest.raises(TimeoutError):
        dial.result()
    with pytest.raises(ConnectionRefusedError):
        await pair.net.endpoint("a").connect(pair.cfg, pair.net.clock, "127.0.0.1", 7999)


async def test_a_drop_resets_both_ends_and_a_crash_resets_the_other(pair: Pair) -> None:
    r, _w, br, _bw = await pair.dial()
    assert pair.net.drop("a", "b") == 1
    await pair.driver.settle()
    for reader in (r, br):
        with pytest.raises(ConnectionResetError):
            await reader.read(10)
    r2, _w2, _br2, _bw2 = await pair.dial()
    pair.net.crash("b")
    await pair.driver.settle()
    with pytest.raises(ConnectionResetError):
        await r2.read(10)
    with pytest.raises(ConnectionRefusedError):  # (its listener went with it)
        await pair.dial()


async def test_a_silent_crash_leaves_the_other_end_waiting(pair: Pair) -> None:
    r, _w, _br, _bw = await pair.dial()
    pair.net.crash("b", silent=True)
    read = asyncio.ensure_future(r.read(10))
    assert not await pair.driver.until(read.done, 10.0, fail=False)
    read.cancel()


async def test_delays_keep_each_stream_in_order_and_let_streams_overtake_each_other(pair: Pair) -> None:
    pair.net.max_delay = 0.05
    r1, w1, br1, _ = await pair.dial()
    r2, w2, br2, _ = await pair.dial()
    arrivals: list[tuple[float, str]] = []
    for i in range(50):
        w1.write(b"%d," % i)
        w2.write(b"%d," % i)
    got = {1: b"", 2: b""}
    clock = pair.net.clock
    while len(got[1]) < len(b"".join(b"%d," % i for i in range(50))) or len(got[2]) < len(got[1]):
        nxt = clock.next_deadline()
        assert nxt is not None, "bytes still on their way with no timer to bring them"
        clock.advance(nxt - clock.monotonic())
        for n, reader in ((1, br1), (2, br2)):
            chunk = await read_some(reader, pair.driver)
            if chunk:
                got[n] += chunk
                arrivals.append((clock.monotonic(), f"{n}"))
    expected = b"".join(b"%d," % i for i in range(50))
    assert got[1] == expected and got[2] == expected  # each stream in order
    order = "".join(who for _t, who in arrivals)
    assert "12" in order and "21" in order  # ... and the two streams interleaved
    assert clock.monotonic() <= 50 * 0.05 + 0.05
