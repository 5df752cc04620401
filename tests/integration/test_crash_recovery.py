"""kill -9 of a real broker process: every confirmed message survives, exactly once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

import client
from broker.process import NodeProcess
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
    """Publish ids in pipelined batches until the node is killed; (sent, confirmed)."""
    sent: set[int] = set()
    confirmed: set[int] = set()
    conn = await client.connect(url)
    await conn.declare_queue("q", partitions=4)
    p = conn.producer("q", max_batch=100)
    next_id = 0

    async def one(i: int) -> None:
        try:
            await p.send(str(i).encode(), key=str(i % 17))
            confirmed.add(i)
        except TandemError:
            pass  # in flight when the node died: may or may not be stored

    killed = False
    while not killed:
        batch = range(next_id, next_id + 250)
        next_id += 250
        sent.update(batch)
        tasks = [asyncio.ensure_future(one(i)) for i in batch]
        if len(confirmed) >= kill_after:
            await proc.kill()  # while this batch is in flight
            killed = True
        await asyncio.gather(*tasks)
    await conn.close()
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


async def test_kill_9_loses_no_confirmed_message(proc: NodeProcess) -> None:
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
    async with await client.connect(proc.url) as conn:
        await conn.declare_queue("q")
        await conn.producer("q").send_many([b"a", b"b", b"c"])
        c = await conn.consumer("q", prefetch=10).start()
        await wait_until(lambda: c.received == 3, what="3 deliveries")
        m = await c.next(5)
        assert m is not None
        await m.ack()  # one acked, two held unacked
        await c.cancel()
        # Delivery counts are written no later than the next confirmed write:
        await conn.producer("q").send(b"d")
    await proc.kill()
    await proc.start()
    async with await client.connect(proc.url) as conn:
        async with conn.consumer("q") as c:
            got = {}
            for _ in range(3):
                msg = await c.next(10)
                assert msg is not None
                got[msg.body] = (msg.redelivered, msg.delivery_count)
                await msg.ack()
    assert got[b"d"] == (False, 1)
    held = {k: v for k, v in got.items() if k != b"d"}
    assert len(held) == 2 and all(v == (True, 2) for v in held.values())


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
