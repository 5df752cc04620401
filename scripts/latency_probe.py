"""Publish-to-confirm latency in a local 3-node group, paced, by path.

    .venv/bin/python scripts/latency_probe.py

Starts a fresh group (tandem cluster's LocalCluster) and prints (p50 ms, p99 ms) for sends
straight to a partition's active at several rates, through a node that forwards, and with a
consumer acking at the same time.  A diagnostic for docs/benchmarks.md, not a benchmark
(``tandem bench`` is).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import client
from broker.tools.cluster import LocalCluster


async def paced(url: str, queue: str, n: int = 2000, rate: float = 2000) -> tuple[float, float]:
    lat: list[float] = []
    async with await client.connect(url) as conn:
        p = conn.producer(queue)

        async def one(i: int) -> None:
            t = time.monotonic()
            await p.send(b"x" * 1024, key=str(i))
            lat.append(time.monotonic() - t)

        t0 = time.monotonic()
        pending = []
        for i in range(n):
            delay = t0 + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)  # pacing the sends, not waiting for a state
            pending.append(asyncio.ensure_future(one(i)))
        await asyncio.gather(*pending)
    lat.sort()
    return round(lat[len(lat) // 2] * 1000, 2), round(lat[int(len(lat) * 0.99)] * 1000, 2)


async def consume(url: str, queue: str, stop: asyncio.Event) -> None:
    async with await client.connect(url) as conn:
        async with conn.group_consumer(queue, prefetch=1000) as c:
            while not stop.is_set():
                m = await c.next(0.5)
                if m is not None:
                    m.ack()


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cl = LocalCluster(Path(tmp), nodes=3, base_port=0, password="probe-password")
        await cl.start()
        try:
            await cl.wait_ready()
            async with await client.connect(cl.url_of("node1")) as conn:
                await conn.declare_queue("q1", partitions=1)
                await conn.declare_queue("q4", partitions=4)
            while len(await cl.actives("q1")) < 1 or len(await cl.actives("q4")) < 4:
                await asyncio.sleep(0.1)  # the new queues elect their actives
            active = (await cl.actives("q1"))[0]
            for rate in (200, 500, 1000, 2000, 4000):
                print("1 partition, straight to its active, rate", rate,
                      await paced(cl.url_of(active), "q1", n=max(1000, rate * 2), rate=rate))
            print("4 partitions through node1 (half forwarded)", await paced(cl.url_of("node1"), "q4"))
            stop = asyncio.Event()
            task = asyncio.ensure_future(consume(cl.url_of("node1"), "q4", stop))
            print("4 partitions through node1, a consumer acking", await paced(cl.url_of("node1"), "q4"))
            stop.set()
            await task
        finally:
            await cl.stop()


if __name__ == "__main__":
    asyncio.run(main())
