"""Backlogs larger than a node's memory budget (``max_memory``), on real node processes:
memory stays bounded, every message comes out exactly once in per-partition order, also
after a restart and in a 3-node group; purge and a dead session's requeue with a cold region."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

import client
from broker.tools.bench.backlog import run_backlog
from broker.tools.bench.workload import body_for, id_of
from broker.tools.cluster import LocalCluster
from broker.tools.process import NodeProcess
from tests.conftest import FAST
from tests.helpers import wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.integration]

MIB = 1024 * 1024


async def test_a_backlog_ten_times_the_budget_stays_bounded_and_drains_exactly_once(tmp_path: Path) -> None:
    res = await run_backlog(80 * MIB, max_memory=8 * MIB, warm=False, data_dir=tmp_path, interval=0.2)
    assert res.error is None, res
    assert res.confirmed == res.consumed == 80 * 1024
    assert res.exactly_once and res.redelivered == 0, res
    # without the bound the node holds the 80 MiB and their objects (about 200 MiB); with it,
    # its base and the 8 MiB
    assert 0 < res.peak_rss["node1"] < 150 * MIB, res.peak_rss


async def test_a_cold_backlog_survives_a_restart(tmp_path: Path) -> None:
    res = await run_backlog(24 * MIB, max_memory=2 * MIB, warm=False, restart=True, data_dir=tmp_path,
                            interval=0.2)
    assert res.error is None, res
    assert res.exactly_once and res.consumed == 24 * 1024, res
    assert res.peak_rss["node1"] < 150 * MIB, res.peak_rss


async def test_a_group_with_a_backlog_stays_bounded(tmp_path: Path) -> None:
    res = await run_backlog(40 * MIB, max_memory=4 * MIB, nodes=3, partitions=3, warm=False, data_dir=tmp_path,
                            interval=0.2)
    assert res.error is None, res
    assert res.exactly_once and res.consumed == 40 * 1024, res
    assert set(res.peak_rss) == {"node1", "node2", "node3"}


@pytest_asyncio.fixture
async def node(tmp_path: Path) -> AsyncIterator[NodeProcess]:
    p = await NodeProcess(tmp_path / "node1", extra_args=["--max-memory", "1M"]).start()
    try:
        yield p
    finally:
        await p.kill()


async def _publish(conn: client.DurableConnection, ids: range) -> None:
    await conn.producer("q").send_many(body_for(i, 1024) for i in ids)


async def test_requeue_and_purge_with_a_cold_region(node: NodeProcess) -> None:
    async with await client.connect(node.url) as conn:
        await conn.declare_queue("q", partitions=1)
        await _publish(conn, range(5000))  # about 800 fit in 1 MiB: the rest is cold
        (info,) = await conn.list_queues()
        assert info.ready == 5000

        # a session takes some and dies without acking: they are ready again, first
        async with await client.connect(node.url) as other:
            c = await other.consumer("q", prefetch=300).start()
            held = [await c.next(10) for _ in range(300)]
            assert [m.offset for m in held if m is not None] == list(range(300))

        async def requeued() -> bool:  # the node handles the close on its own time
            (q,) = await conn.list_queues()
            return q.unacked == 0 and q.ready == 5000

        await wait_until(requeued, what="the dead session's 300 messages ready again")
        seen: list[int] = []
        offsets: list[int] = []
        redelivered = 0
        async with conn.consumer("q", prefetch=500) as c:
            while len(seen) < 5000:
                m = await c.next(10)
                assert m is not None, f"consumed {len(seen)} of 5000"
                seen.append(id_of(m.body))
                offsets.append(m.offset)
                redelivered += m.delivery_count > 1
                m.ack()
        assert sorted(seen) == list(range(5000)) and offsets == sorted(offsets)
        assert redelivered == 300

        # purge: the messages in memory and the cold region, counted exactly
        await _publish(conn, range(5000, 9000))
        assert await conn.purge_queue("q") == 4000
        (info,) = await conn.list_queues()
        assert info.ready == 0 and info.unacked == 0
        await _publish(conn, range(9000, 9010))
        async with conn.consumer("q", prefetch=100) as c:
            got = []
            while len(got) < 10:
                m = await c.next(10)
                assert m is not None
                got.append(id_of(m.body))
                m.ack()
            assert got == list(range(9000, 9010))
            assert await c.next(0.2) is None  # nothing purged comes back


async def test_a_cold_backlog_moves_with_its_partition(tmp_path: Path) -> None:
    """The active of a partition with a cold region stops: the next active loads the
    partition within its budget and delivers the whole backlog, once, in order."""
    cl = LocalCluster(tmp_path, console=False, nodes=3, base_port=0, password="test-password",
                      extra_args=[*FAST, "--max-memory", "2M"])
    await cl.start()
    try:
        await cl.wait_ready()
        async with await client.connect(cl.url) as conn:
            await conn.declare_queue("q", partitions=1)
            found: dict[int, str] = {}

            async def has_active() -> bool:
                nonlocal found
                found = await cl.actives("q")
                return len(found) == 1

            await wait_until(has_active, what="an active for q/0")
            await _publish(conn, range(12_000))  # 12 MiB against a share of 2 MiB
        old = found[0]
        await cl.nodes[old].stop()
        await wait_until(lambda: has_active_elsewhere(cl, old), what="another active for q/0")
        other = next(n for n in cl.nodes if n != old)
        async with await client.connect(cl.url_of(other)) as conn:
            seen: list[int] = []
            offsets: list[int] = []
            async with conn.consumer("q", prefetch=1000) as c:
                while len(seen) < 12_000:
                    m = await c.next(30)
                    assert m is not None, f"consumed {len(seen)} of 12000"
                    seen.append(id_of(m.body))
                    offsets.append(m.offset)
                    m.ack()
            assert sorted(seen) == list(range(12_000)) and offsets == sorted(offsets)
    finally:
        await cl.stop()


async def has_active_elsewhere(cl: LocalCluster, old: str) -> bool:
    now = await cl.actives("q")  # (the live nodes' view)
    return now.get(0) not in (None, old)
