"""``tandem bench --failover``: the client-visible pause when the active of a partition is killed.

A fresh local group (default settings unless flags say otherwise), one queue, producers
sending with confirms through a node that survives; after ``warmup`` confirms the node active
for partition 0 gets ``kill -9``.  Reported: the longest time any send waited for its confirm
(the pause the application saw), how long until every partition had an active again, and the
checker's verdict over every message (nothing confirmed may be lost or stored twice).
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

import client
from broker.tools.checker import classify
from broker.tools.cluster import LocalCluster
from client.clock import SYSTEM_CLOCK, Clock
from client.errors import TandemError, StaleDeliveryError


async def measure_failover(*, nodes: int = 3, partitions: int = 4, messages: int = 3000, warmup: int = 500,
                           window: int = 50, extra_args: list[str] | None = None,
                           clock: Clock = SYSTEM_CLOCK) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tandem-failover-") as tmp:
        cl = LocalCluster(Path(tmp), nodes=nodes, base_port=0, extra_args=extra_args, clock=clock)
        await cl.start()
        try:
            await cl.wait_ready()
            return await _run(cl, partitions, messages, warmup, window, clock)
        finally:
            await cl.stop()


async def _actives(cl: LocalCluster, queue: str, partitions: int, timeout: float = 60.0) -> dict[int, str]:
    async with asyncio.timeout(timeout):
        while True:
            found = await cl.actives(queue)
            if len(found) == partitions:
                return found
            await cl.clock.sleep(0.02)  # polling real processes, bounded by the timeout


async def _run(cl: LocalCluster, partitions: int, messages: int, warmup: int, window: int,
               clock: Clock) -> dict[str, Any]:
    async with await client.connect(cl.url) as conn:
        await conn.declare_queue("failover", partitions=partitions)
    before = await _actives(cl, "failover", partitions)
    victim = before[0]
    survivor = next(n for n in cl.nodes if n != victim)
    bodies = [f"m-{i}".encode() for i in range(messages)]
    confirmed: list[bytes] = []
    waits: list[float] = []
    warmed_up = asyncio.Event()

    async def produce() -> None:
        async with await client.connect(cl.url_of(survivor)) as conn:
            p = conn.producer("failover")

            async def one(b: bytes) -> None:
                t = clock.monotonic()
                try:
                    await p.send(b, key=b.decode())
                    confirmed.append(b)
                    if len(confirmed) >= warmup:
                        warmed_up.set()
                except TandemError:
                    pass  # unconfirmed: allowed to be lost, never to be duplicated
                waits.append(clock.monotonic() - t)

            for i in range(0, len(bodies), window):
                await asyncio.gather(*(one(b) for b in bodies[i:i + window]))

    sending = asyncio.ensure_future(produce())
    warm = asyncio.ensure_future(warmed_up.wait())
    await asyncio.wait([warm, sending], return_when=asyncio.FIRST_COMPLETED)
    warm.cancel()
    kill_at = clock.monotonic()
    await cl.nodes[victim].kill()
    after = await _actives(cl, "failover", partitions)
    reelected = clock.monotonic() - kill_at
    await sending
    consumed: list[tuple[bytes, str]] = []
    async with await client.connect(cl.url_of(survivor)) as conn:
        async with conn.group_consumer("failover") as c:
            while True:
                m = await c.next(3.0)
                if m is None:
                    break
                consumed.append((m.body, m.id))
                try:
                    await m.ack()
                except StaleDeliveryError:
                    pass  # delivered again by the new active
    verdict = classify(bodies, confirmed, consumed)
    return {
        "killed": victim, "new_active_of_partition_0": after[0],
        "failover_ms": {"max_confirm_wait": round(max(waits) * 1000, 1),
                        "all_partitions_active_again": round(reelected * 1000, 1)},
        "verdict": verdict.as_dict(),
    }
