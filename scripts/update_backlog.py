"""How long ``tandem partition update`` takes when the partition holds a large backlog, and what a producer sees.

    .venv/bin/python scripts/update_backlog.py [--size 1G] [--body 64K] [--runs 1]

Each run starts a fresh three-node group (``LocalCluster``, default settings: three copies
of each partition, in a temp dir), fills a one-partition queue with ``--size`` of keyed
messages (a key each, confirmed), waits until the replicas have all of it, adds a partition
(``tandem partition add backlog 1``) and re-maps the backlog (``tandem partition update
backlog --wait --json``) while a durable producer sends one message every 10 ms to the
queue.  Jump hashing from one partition to two moves about half the keys: the partition's
active publishes those messages to partition 1 and settles them, most of them read back
from the store (only its ``max_memory`` share is in memory).  It reports the update's time,
how many messages moved, the longest confirm wait of a send made during it, and that the
queue holds every message once afterwards.  The figures are for docs/operations.md.
"""

from __future__ import annotations

import asyncio
import json
import re
import tempfile
from pathlib import Path
from typing import Any

import client
from broker.config import parse_size
from broker.tools.cluster import LocalCluster
from broker.tools.totals import queue_totals
from client.clock import SYSTEM_CLOCK
from client.mapper import JumpHashMapper
from drain_backlog import (QUEUE, Prober, backlog_args, caught_up, cli,  # (scripts/, beside this one)
                           keep_logs, wait_for)

clock = SYSTEM_CLOCK


async def send_keyed(p: Any, size: int, body: int) -> tuple[int, int, float]:
    """Send ``size`` bytes of ``body``-byte messages, keys key-0, key-1, ... (confirmed):
    (messages, bytes, seconds)."""
    payload = b"x" * body
    t0 = clock.monotonic()
    n = sent = 0
    while sent < size:
        await p.send_many([(payload, f"key-{n + i}") for i in range(256)])
        n += 256
        sent += 256 * body
    return n, sent, clock.monotonic() - t0


async def fill(cl: LocalCluster, size: int, body: int) -> tuple[int, int, float]:
    """(messages, bytes, seconds) of a one-partition queue filled with keyed messages."""
    async with await client.connect(cl.url) as conn:
        await conn.declare_queue(QUEUE, partitions=1)
        n, sent, took = await send_keyed(conn.producer(QUEUE), size, body)
    active = (await cl.actives(QUEUE, 1))[0]
    await wait_for(lambda: caught_up(cl, active), "the replicas to have the backlog")
    return n, sent, took


async def one_run(size: int, body: int, keep: str | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="tandem-update-backlog-", dir=keep) as tmp:
        cl = LocalCluster(Path(tmp), nodes=3, base_port=0)
        await cl.start()
        try:
            await cl.wait_ready()
            n, sent, took = await fill(cl, size, body)
            await cli("partition", "add", QUEUE, "1", "--json", "--url", cl.url)
            await wait_for(lambda: _two_actives(cl), "the new partition's active")
            prober = Prober(cl.url)
            probing = asyncio.ensure_future(prober.run())
            await clock.sleep(1.0)  # the probe's steady state before the update (a baseline, not a wait for a state)
            u0 = clock.monotonic()
            done = await cli("partition", "update", QUEUE, "--wait", "--timeout", "1800", "--json", "--url",
                             cl.url)
            u1 = clock.monotonic()
            await clock.sleep(1.0)  # the probe after the update (a tail, not a wait for a state)
            prober.stop()
            await probing
            moved = sum(int(m) for proc in cl.nodes.values()
                        for m in re.findall(r"partition backlog/\d: update: (\d+) message", proc.log_text()))
            totals = await queue_totals(cl.url)  # (every member's partitions)
            q = next(q for q in totals.queues if q.name == QUEUE)
            consumed = await consume_all(cl.url, n + len(prober.waits))
            return {"backlog_messages": n, "backlog_bytes": sent, "fill_seconds": round(took, 1),
                    "update_seconds": done["seconds"], "update_wall_seconds": round(u1 - u0, 2),
                    "moved_messages": moved,
                    "longest_confirm_wait_during_update_ms": round(prober.longest(u0, u1) * 1000),
                    "probe_sends": len(prober.waits) + prober.failed, "probe_failed": prober.failed,
                    "ready_after": q.ready, "expected_ready": n + len(prober.waits), **consumed}
        finally:
            await cl.stop()
            keep_logs(tmp, keep)


async def consume_all(url: str, expected: int) -> dict:
    """Consume the whole queue: every backlog key once, in the partition jump_hash gives it
    over two, and nothing more than ``expected`` messages."""
    mapper = JumpHashMapper(2)
    keys: set[str] = set()
    total = misplaced = twice = 0
    async with await client.connect(url, client_name="update-check") as conn:
        async with conn.group_consumer(QUEUE, prefetch=256) as c:
            while (m := await c.next(5.0)) is not None:
                total += 1
                if m.key is not None:
                    twice += m.key in keys
                    keys.add(m.key)
                    misplaced += m.partition != mapper.partition(m.key)
                m.ack()
    return {"consumed": total, "consumed_expected": expected, "backlog_keys_consumed": len(keys),
            "keys_twice": twice, "misplaced": misplaced}


async def _two_actives(cl: LocalCluster) -> bool:
    return len(await cl.actives(QUEUE)) == 2


async def main() -> None:
    args = backlog_args(__doc__).parse_args()
    for i in range(args.runs):
        print(json.dumps({"run": i + 1, **await one_run(parse_size(args.size), parse_size(args.body), args.logs)}),
              flush=True)


if __name__ == "__main__":
    asyncio.run(main())
