"""Streams across a kill -9, with real node processes in a 3-node group.  A producer sends 1,500
messages to a 3-partition stream: a third, then the rest while the active of partition 0 is
killed and started again;
then every partition, read from its first offset, holds each confirmed message once (the
checker counts lost, duplicated and unexpected).  Named consumers' offsets and reads by time
give the same answers after the failover, and a retention cut made before it stays cut on the
new active (TRIM is replicated)."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

import client
from broker.tools.cluster import LocalCluster
from client.protocol.frames import StreamMessage
from tests.conftest import FAST
from tests.helpers import wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.timeout(240)]

PARTITIONS = 3
N = 1500


async def _read_all(conn: client.DurableConnection, stream: str, partition: int) -> list[StreamMessage]:
    out: list[StreamMessage] = []
    msgs, nxt, end = await conn.read(stream, partition, "first")
    out.extend(msgs)
    while nxt < end:
        msgs, nxt, end = await conn.read(stream, partition, nxt)
        out.extend(msgs)
    return out


async def _first(conn: client.DurableConnection, stream: str) -> int:
    msgs, _, _ = await conn.read(stream, 0, "first", max_messages=1)
    return msgs[0].offset if msgs else -1


async def test_a_stream_keeps_every_confirmed_message_once_across_a_kill_of_its_active(tmp_path: Path) -> None:
    cl = LocalCluster(tmp_path, console=False, nodes=3, base_port=0, password="test-password", extra_args=FAST)
    await cl.start()
    try:
        await cl.finalize()
        async with await client.connect(cl.url, send_timeout=60) as conn:
            await conn.declare_stream("events", partitions=PARTITIONS)
            await conn.declare_stream("sized", max_bytes=20_000)

            async def served() -> bool:
                return len(await cl.actives("events", PARTITIONS)) == PARTITIONS and bool(await cl.actives("sized", 1))

            await wait_until(served, timeout=60, what="every partition active")
            # the retention cut, made before the kill
            async with conn.producer("sized") as p:
                for i in range(60):
                    await p.send(bytes([i]) * 1000)
            await wait_until(lambda: _above(_first(conn, "sized"), 30), timeout=60,
                             what="the sized stream's retention (every 5 s)")
            cut = await _first(conn, "sized")

            confirmed: list[str] = []
            third, killed = asyncio.Event(), asyncio.Event()

            async def produce() -> None:
                async with conn.producer("events") as p:
                    for start in range(0, N, 50):
                        bodies = [f"m{i}" for i in range(start, start + 50)]
                        await asyncio.gather(*(p.send(b.encode(), key=b) for b in bodies))
                        confirmed.extend(bodies)
                        if len(confirmed) == N // 3:
                            third.set()
                            await killed.wait()  # (the rest is sent across the failover)

            producer = asyncio.ensure_future(produce())
            await asyncio.wait([producer, asyncio.ensure_future(third.wait())], return_when=asyncio.FIRST_COMPLETED)
            await conn.store_offset("events", "billing", 1, 7)
            await wait_until(lambda: _stored_past(conn, 5), timeout=30, what="6 messages readable in each partition")
            before = {p: (await conn.read("events", p, 5, max_messages=1))[0][0] for p in range(PARTITIONS)}
            victim = (await cl.actives("events", PARTITIONS))[0]
            sized_active = (await cl.actives("sized", 1))[0]
            await cl.nodes[victim].kill()
            killed.set()
            await cl.nodes[victim].start()
            await producer
            if sized_active != victim:  # (the sized stream's active goes too: its new one must keep the cut)
                await cl.nodes[sized_active].kill()
                await cl.nodes[sized_active].start()

            read: list[StreamMessage] = []

            async def all_read() -> bool:  # (a store writes what committed a moment later: HOLD_APPLY)
                read[:] = [m for p in range(PARTITIONS) for m in await _read_all(conn, "events", p)]
                return len(read) >= len(confirmed)

            try:
                await wait_until(all_read, timeout=20, what="every confirmed message readable")
            except AssertionError:
                pass  # (the checker below says what is missing)
            counts = Counter(m.body.decode() for m in read)
            lost = set(confirmed) - set(counts)
            unexpected = set(counts) - {f"m{i}" for i in range(N)}
            twice = [b for b, c in counts.items() if c > 1]
            assert (len(lost), len(twice), len(unexpected)) == (0, 0, 0), \
                f"lost {sorted(lost)[:10]}, stored twice {twice[:10]}, unexpected {sorted(unexpected)[:10]}"
            assert await conn.fetch_offset("events", "billing", 1) == 7
            for p, m in before.items():  # a read by time finds the same message after the failover
                msgs, _, _ = await conn.read("events", p, timestamp=m.timestamp)
                first = msgs[0]
                assert first.offset <= m.offset and first.timestamp >= int(m.timestamp * 1000) / 1000
            assert await _first(conn, "sized") >= cut
    finally:
        await cl.stop()


async def _stored_past(conn: client.DurableConnection, offset: int) -> bool:
    reads = [(await conn.read("events", p, offset, max_messages=1))[0] for p in range(PARTITIONS)]
    return all(reads)


async def _above(value: object, floor: int) -> bool:
    return await value > floor  # type: ignore[misc,operator]
