"""kill -9 of a real broker process: every confirmed message survives, exactly once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

import client
from broker.tools.process import NodeProcess
from client.errors import TandemError
from tests.helpers import wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.integration]


@pytest_asyncio.fixture
async def proc(tmp_path: Path) -> AsyncIterator[NodeProcess]:
    p = NodeProcess(tmp_path / "node1", sync="SYNC")
    await p.start()
    try:
        yield p
    finally:
        await p.kill()


async def _publish_until_killed(url: str, proc: NodeProcess, kill_after: int) -> tuple[set[int], set[int]]:
    """Publish ids, pipelined (up to 2000 unconfirmed), and kill -9 the node once
    ``kill_after`` are confirmed, with sends still in flight; (sent, confirmed)."""
    sent: set[int] = set()
    confirmed: set[int] = set()
    conn = await client.connect(url)
    await conn.declare_queue("q", partitions=4)
    p = conn.producer("q", max_batch=100)
    window = asyncio.Semaphore(2000)
    dead = asyncio.Event()

    async def one(i: int) -> None:
        try:
            await p.send(str(i).encode(), key=str(i % 17))
            confirmed.add(i)
        except TandemError:
            pass  # in flight when the node died: may or may not be stored
        finally:
            window.release()

    async def produce() -> None:
        i = 0
        tasks = []
        while not dead.is_set():
            await window.acquire()
            sent.add(i)
            tasks.append(asyncio.ensure_future(one(i)))
            i += 1
        await asyncio.gather(*tasks)

    producer = asyncio.ensure_future(produce())
    await wait_until(lambda: len(confirmed) >= kill_after, what=f"{kill_after} confirms")
    await proc.kill()
    dead.set()
    window.release()  # let the producer loop see the flag
    # the node stays down: closing the connection fails the sends still in flight at once
    # (closing does not wait for them, nor for send_timeout)
    await conn.close()
    await producer
    assert len(sent) > len(confirmed), "the kill should catch sends in flight"
    return sent, confirmed


async def _consume_all(url: str) -> list[bytes]:
    bodies: list[bytes] = []
    async with await client.connect(url) as conn:
        (info,) = await conn.list_queues()
        expected = info.ready
        async with conn.consumer("q", prefetch=500) as c:
            while len(bodies) < expected:
                m = await c.next(10)
                assert m is not None, f"consumed {len(bodies)} of {expected}"
                bodies.append(m.body)
                m.ack()
        assert await conn.get("q") is None
    return bodies


@pytest.mark.parametrize("policy", ["SYNC", "WRITE_NO_SYNC"])
async def test_kill_9_loses_no_confirmed_message(tmp_path: Path, policy: str) -> None:
    """SYNC fsyncs before the confirm; WRITE_NO_SYNC has the data in the OS before it.
    A kill -9 (the OS survives) must lose no confirmed message under either."""
    proc = NodeProcess(tmp_path / "node1", sync=policy)
    await proc.start()
    try:
        await _check_kill_9(proc)
    finally:
        await proc.kill()


async def test_no_sync_confirms_at_once_and_recovers_what_was_written(tmp_path: Path) -> None:
    """NO_SYNC may lose the last moments' confirmed messages on a crash, but never
    duplicates or invents one, and a clean stop loses nothing."""
    proc = NodeProcess(tmp_path / "node1", sync="NO_SYNC")
    await proc.start()
    try:
        sent, confirmed = await _publish_until_killed(proc.url, proc, kill_after=2000)
        await proc.start()
        ids = [int(b) for b in await _consume_all(proc.url)]
        assert len(ids) == len(set(ids)) and set(ids) <= sent
        async with await client.connect(proc.url) as conn:
            await conn.producer("q").send_many([b"1", b"2", b"3"])
        assert await proc.stop() == 0
        await proc.start()
        async with await client.connect(proc.url) as conn:
            assert (await conn.list_queues())[0].ready == 3
    finally:
        await proc.kill()


async def _check_kill_9(proc: NodeProcess) -> None:
    sent, confirmed = await _publish_until_killed(proc.url, proc, kill_after=3000)
    assert len(confirmed) >= 3000
    await proc.start()
    bodies = await _consume_all(proc.url)
    ids = [int(b) for b in bodies]
    lost = confirmed - set(ids)
    duplicated = len(ids) - len(set(ids))
    unexpected = set(ids) - sent
    unconfirmed_stored = set(ids) - confirmed
    print(f"sent={len(sent)} confirmed={len(confirmed)} recovered={len(ids)} "
          f"unconfirmed_stored={len(unconfirmed_stored)}")
    assert (len(lost), duplicated, len(unexpected)) == (0, 0, 0)


async def test_unacked_deliveries_come_back_with_their_delivery_count(proc: NodeProcess) -> None:
    """A message that reached a consumer comes back marked redelivered after kill -9:
    the delivered mark is committed before the Deliver frame leaves."""
    async with await client.connect(proc.url) as conn:
        await conn.declare_queue("q")
        await conn.producer("q").send_many([b"a", b"b", b"c"])
        c = await conn.consumer("q", prefetch=10).start()
        await wait_until(lambda: c.received == 3, what="3 deliveries")
        await proc.kill()  # at once: nothing else is written after the deliveries
    await proc.start()
    async with await client.connect(proc.url) as conn:
        async with conn.consumer("q") as c2:
            got = {}
            for _ in range(3):
                msg = await c2.next(10)
                assert msg is not None
                got[msg.body] = (msg.redelivered, msg.delivery_count)
                await msg.ack()
    assert got == {b"a": (True, 2), b"b": (True, 2), b"c": (True, 2)}


async def test_clean_shutdown_on_sigterm(proc: NodeProcess) -> None:
    async with await client.connect(proc.url) as conn:
        await conn.declare_queue("q")
        await conn.producer("q").send_many([b"x"] * 100)
    assert await proc.stop() == 0
    log = proc.log_text()
    assert "node stop complete" in log and "Traceback" not in log
    await proc.start()
    async with await client.connect(proc.url) as conn:
        assert (await conn.list_queues())[0].ready == 100
