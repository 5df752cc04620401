"""Placement by zone with real node processes: five nodes in zones a, b, c (``tandem cluster up
--zones a,b,c`` deals them node1 a, node2 b, node3 c, node4 a, node5 b), every partition's three
copies in three zones; then both nodes of zone a killed at once (kill -9) under load from
durable producers and consumers: every partition keeps an active, and the checker finds
nothing lost, duplicated or unexpected.  Each node holds three partitions of five and knows
the other two as foreign ones: their active (RemoteEnabled), in ``tandem status`` and in the
partition maps it gives clients, before the kill and after it."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import pytest

import client
from broker.tools.checker import classify
from broker.tools.cluster import LocalCluster
from broker.tools.cluster_up import zone_args
from broker.tools.drill.load import Load
from broker.tools.drill.model import QUEUE, DrillConfig
from client.clock import SYSTEM_CLOCK
from tests.conftest import FAST, PASSWORD
from tests.helpers import tandem, wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.timeout(300)]

PARTITIONS = 5
ZONE = {"node1": "a", "node2": "b", "node3": "c", "node4": "a", "node5": "b"}


async def copies_by_partition(cl: LocalCluster) -> dict[int, list[str]]:
    """partition -> its active and replicas, as its active reports them."""
    found: dict[int, list[str]] = {}

    async def every_partition() -> bool:
        found.clear()
        for p, active in (await cl.actives(QUEUE)).items():
            st = await cl.status(active)
            mine = next((x for x in st.partitions if x.queue == QUEUE and x.partition == p and x.role == "active"),
                        None)
            if mine is not None:
                found[p] = [active, *(r.node for r in mine.replicas)]
        return len(found) == PARTITIONS

    await wait_until(every_partition, timeout=60, what="an active for every partition, with its replicas")
    return found


async def foreign_views_agree(cl: LocalCluster, placed: dict[int, list[str]], actives: dict[int, str]) -> bool:
    """Every live node lists the partitions it holds no copy of as RemoteEnabled with their
    active, and names every active in its partition map."""
    for name, p in cl.nodes.items():
        if p.proc is None or p.proc.returncode is not None:
            continue
        st = await cl.status(name)
        want = {(QUEUE, i, "RemoteEnabled", actives[i], tuple(placed[i])) for i in placed if name not in placed[i]}
        have = {(f.queue, f.partition, f.status, f.active, tuple(r.node for r in f.replicas)) for f in st.foreign}
        if have != want:
            return False
        async with await client.connect_link(cl.url_of(name), observe=True) as link:
            if (await link.partition_map(QUEUE)).actives != [actives[i] for i in range(PARTITIONS)]:
                return False
    return True


async def test_copies_spread_over_zones_and_a_lost_zone_loses_nothing(tmp_path: Path) -> None:
    cl = LocalCluster(tmp_path, console=False, nodes=5, base_port=0, password=PASSWORD,
                      extra_args=[*FAST, *zone_args("a,b,c", 5)])
    await cl.start()
    try:
        await cl.wait_ready()
        rc, out, err = await tandem("status", "--url", cl.url_of("node2"))
        assert rc == 0, err
        assert "votes 1, zone b," in out.splitlines()[0], out
        rows = {line.split()[0]: line.split()[-1] for line in out.splitlines()[2:7]}
        assert rows == {"NODE": "ZONE", **{n: z for n, z in ZONE.items() if n != "node2"}}, out
        rc, out, err = await tandem("status", "--json", "--url", cl.url_of("node2"))
        assert rc == 0 and json.loads(out)["zones"] == ZONE, err
        async with await client.connect(cl.url) as conn:
            await conn.declare_queue(QUEUE, partitions=PARTITIONS)
        placed = await copies_by_partition(cl)
        for p, nodes in placed.items():
            assert len(nodes) == 3 and sorted(ZONE[n] for n in nodes) == ["a", "b", "c"], (p, nodes)
        assert {nodes[0] for nodes in placed.values()} == set(ZONE)  # an active on every node
        await wait_until(lambda: foreign_views_agree(cl, placed, {p: n[0] for p, n in placed.items()}),
                         what="every node knowing the actives of the partitions it does not hold")

        cfg = DrillConfig(scenario="zone", partitions=PARTITIONS, producers=2, consumers=2, messages=4000,
                          window=64)
        clock = SYSTEM_CLOCK
        load = Load(cl, cfg, 1, random.Random(11), clock)
        zone_a = [n for n, z in ZONE.items() if z == "a"]

        async def lose_zone_a() -> None:
            await asyncio.gather(*(cl.nodes[n].kill() for n in zone_a))

        await load.go(lose_zone_a, clock.monotonic() + 240)
        after = await cl.actives(QUEUE)
        assert sorted(after) == list(range(PARTITIONS)) and not set(after.values()) & set(zone_a), after
        await wait_until(lambda: foreign_views_agree(cl, placed, after),
                         what="the survivors knowing the new actives of the partitions they do not hold")
        v = classify(load.sent, load.confirmed, load.consumed)
        print(f"zone a ({', '.join(zone_a)}) killed: {len(load.confirmed)} confirmed, {load.failed} sends failed, "
              f"longest confirm wait {max(load.waits) * 1000:.0f} ms; checker {v.as_dict()}")
        assert (v.lost, v.duplicated, v.unexpected) == (0, 0, 0), v
        assert len(load.confirmed) == cfg.messages and load.failed == 0
    finally:
        await cl.stop()
