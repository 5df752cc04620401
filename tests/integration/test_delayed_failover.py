"""Delayed messages across a kill -9 of their partition's active, with real node processes: a
3-node group, 1,000 messages delayed 2-12 s, the active of partition 0 killed once a quarter has
arrived.  Each message arrives once or more (never lost), never before its time, and those due
once every partition is active again arrive close to their time: within 5 s, a bound a timer
armed anew from the failover (a message late by its whole delay) breaks and a loaded machine
does not; the distribution is printed, and `tandem bench --delayed` measures the lateness."""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from pathlib import Path

import pytest

import client
from client.errors import StaleDeliveryError
from broker.tools.cluster import LocalCluster
from tests.conftest import FAST
from tests.helpers import wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.timeout(240)]

PARTITIONS = 3


async def test_delayed_messages_across_a_kill_of_their_active(tmp_path: Path) -> None:
    cl = LocalCluster(tmp_path, console=False, nodes=3, base_port=0, password="test-password", extra_args=FAST)
    await cl.start()
    try:
        await cl.finalize()
        async with await client.connect(cl.url) as conn:
            await conn.declare_queue("later", partitions=PARTITIONS)

        async def served() -> bool:
            return len(await cl.actives("later", PARTITIONS)) == PARTITIONS

        await wait_until(served, timeout=60, what="every partition active")
        rng = random.Random(7)
        delay = {f"d{i}".encode(): rng.uniform(2.0, 12.0) for i in range(1000)}
        got: dict[bytes, list[float]] = {}
        stamp: dict[bytes, float] = {}
        async with await client.connect(cl.url, send_timeout=60) as conn:
            p = conn.producer("later")
            t_start = time.time()
            await asyncio.gather(*(p.send(b, key=b.decode(), delay=d) for b, d in delay.items()))
            async with conn.consumer("later", prefetch=500) as c:
                async def consume() -> None:
                    async for m in c:
                        got.setdefault(m.body, []).append(time.time())
                        stamp[m.body] = m.timestamp
                        try:
                            await m.ack()
                        except StaleDeliveryError:
                            pass  # delivered by the node that was killed: it comes again

                reader = asyncio.ensure_future(consume())
                try:
                    await wait_until(lambda: len(got) >= 250, timeout=60, what="a quarter delivered")
                    victim = (await cl.actives("later", PARTITIONS))[0]
                    await cl.nodes[victim].kill()
                    killed = time.time()

                    async def back() -> bool:
                        where = await cl.actives("later", PARTITIONS)
                        return len(where) == PARTITIONS and victim not in where.values()

                    await wait_until(back, timeout=60, what="every partition active again")
                    served_again = time.time()
                    try:
                        await wait_until(lambda: len(got) == len(delay), timeout=60, what="every message delivered")
                    except AssertionError:
                        missing = sorted(set(delay) - set(got))
                        logs = {n: [ln for ln in p.log_text().splitlines() if "Traceback" in ln or "Error" in ln
                                    or "exception" in ln.lower()][-10:] for n, p in cl.nodes.items()}
                        raise AssertionError(f"{len(missing)} never delivered, e.g. {missing[:5]} (killed {victim} "
                                             f"at +{killed - t_start:.1f} s); node logs: {logs}") from None
                finally:
                    reader.cancel()
        due = {b: stamp[b] + delay[b] for b in delay}
        early = [b for b in delay if got[b][0] < due[b] - 0.002]  # (the broker's clock and ours: the same host)
        assert not early, f"{len(early)} early, e.g. {early[:3]}"
        late = sorted(got[b][0] - due[b] for b in delay if due[b] >= served_again)
        during = [got[b][0] - served_again for b in delay if killed <= due[b] < served_again]
        twice = sum(1 for t in got.values() if len(t) > 1)
        print(f"1,000 delayed 2-12 s, active killed, every partition back after {served_again - killed:.2f} s: "
              f"due after, late p50 {statistics.median(late) * 1000:.0f} ms, p99 "
              f"{late[len(late) * 99 // 100] * 1000:.0f} ms, max {late[-1] * 1000:.0f} ms; {len(during)} due "
              f"during the failover, delivered within {max(during, default=0) * 1000:.0f} ms of its end; "
              f"{twice} delivered twice")
        assert late[-1] <= 5.0, late[-5:]
    finally:
        await cl.stop()
