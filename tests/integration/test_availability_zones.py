"""Availability zones with real node processes: a node in two zones loses the quorum of one
when its zone-mate is killed (kill -9) under load, though the group keeps its majority.  Its
HA services go off: it hands what it is active for to a node whose zones hold, stands for
nothing, refuses clients with a line naming the zone; durable clients do not notice, and
the checker counts every message.  Once the zone-mate is back, failback gives it its
partitions again."""

from __future__ import annotations

import base64
import random
from pathlib import Path

import aiohttp
import pytest

import client
from broker.tools.checker import classify
from broker.tools.cluster import LocalCluster
from broker.tools.drill.load import Load
from broker.tools.drill.model import QUEUE, DrillConfig
from client.clock import SYSTEM_CLOCK
from client.errors import UnavailableError
from tests.conftest import running_group
from tests.helpers import tandem, wait_until
from tests.integration.test_drain import actives

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.timeout(300)]

#: node2 is in both zones; node1 and node3 each in one
ZONES = ("--availability-zone", "a=node1,node2", "--availability-zone", "b=node2,node3")


async def zone_state(cl: LocalCluster, node: str) -> dict[str, str]:
    return {z.name: z.state for z in (await cl.status(node)).availability_zones}


async def seen_by(cl: LocalCluster) -> str:
    """What node2 and node3 say of the queue's partitions and their zones, and what their logs
    say of hand-overs (for a failure's message)."""
    out = []
    for n in ("node2", "node3"):
        st = await cl.status(n)
        parts = [(p.partition, p.role, p.active, p.term, p.state) for p in st.partitions if p.queue == QUEUE]
        zones = {z.name: z.state for z in st.availability_zones}
        lines = [ln for ln in cl.nodes[n].log_text().splitlines()
                 if any(w in ln for w in ("zone", "hand", "drain", "stand", "elected", "active for"))][-15:]
        out.append(f"{n}: quorum {st.quorum_state}, zones {zones}, partitions {parts}; log: {lines}")
    return "\n".join(out)


async def test_a_node_whose_zone_loses_quorum_hands_everything_over_and_nothing_is_lost(tmp_path: Path) -> None:
    async with running_group(tmp_path, *ZONES, "--failback-after", "1", console=True) as cl:
        async def zones_hold() -> bool:  # (each node counts its zones once its links are up)
            return [await zone_state(cl, n) for n in cl.nodes] == [
                {"a": "Active"}, {"a": "Active", "b": "Active"}, {"b": "Active"}]

        await wait_until(zones_hold, timeout=30, what="every node counting its zones Active")
        async with await client.connect(cl.url) as conn:
            await conn.declare_queue(QUEUE, partitions=3)
        placed: dict[int, str] = {}

        async def node2_has_its_own() -> bool:  # (dynamic placement: one partition each; the first
            nonlocal placed                     # elections may go elsewhere, failback brings it home)
            placed = await actives(cl, QUEUE, 3)
            return "node2" in placed.values()

        await wait_until(node2_has_its_own, timeout=30, what="node2 active for the partition placed on it")
        node2s = sorted(p for p, n in placed.items() if n == "node2")
        cfg = DrillConfig(scenario="zones", partitions=3, producers=2, consumers=2, messages=4500, window=64)
        clock = SYSTEM_CLOCK
        load = Load(cl, cfg, 1, random.Random(11), clock)
        window: list[float] = []

        async def everything_on_node3() -> bool:
            now = await cl.actives(QUEUE)
            return len(now) == 3 and set(now.values()) == {"node3"}

        async def kill_node1() -> None:
            window.append(clock.monotonic())
            await cl.nodes["node1"].kill()
            try:
                await wait_until(everything_on_node3, timeout=60, what="node3 active for every partition")
            except AssertionError as e:
                raise AssertionError(f"{e}; {await seen_by(cl)}") from None
            window.append(clock.monotonic())

        await load.go(kill_node1, clock.monotonic() + 240)

        # node2 counts its zones: a lost its quorum (node2 alone of two), b holds; the group
        # (node2 and node3 of three) has its majority.
        st = await cl.status("node2")
        assert st.quorum_state == "Disabled", st.quorum_state
        assert {z.name: (z.state, z.up_votes, z.total_votes) for z in st.availability_zones} == {
            "a": ("Disabled", 1, 2), "b": ("Active", 2, 2)}
        assert (await cl.status("node3")).quorum_state == "Partial"
        assert all(p.role != "active" for p in st.partitions), st.partitions
        assert "availability zone a" in cl.nodes["node2"].log_text()
        async with await client.connect_link(cl.url_of("node2")) as link:
            with pytest.raises(UnavailableError, match="no quorum in availability zone a .*HA services are off"):
                await link.producer(QUEUE).send(b"refused")
        rc, out, err = await tandem("status", "--url", cl.url_of("node2"))
        assert rc == 0 and "availability zone a: Disabled (1 of 2 votes up, policy majority; node1, node2): " \
                          "HA services off here" in out, out + err

        # the console (node3's) shows each member's zones as it counts them
        admin = {"Authorization": "Basic " + base64.b64encode(f"admin:{cl.password}".encode()).decode()}
        async with aiohttp.ClientSession(headers=admin) as s:
            async with s.get(cl.console_url("node3") + "api/v1/nodes") as r:
                shown = {n["name"]: n for n in await r.json()}
        assert [(z["name"], z["state"], z["up_votes"], z["total_votes"], z["policy"], z["members"])
                for z in shown["node2"]["availability_zones"]] == [
            ("a", "Disabled", 1, 2, "majority", ["node1", "node2"]),
            ("b", "Active", 2, 2, "majority", ["node2", "node3"])]
        assert shown["node2"]["quorum_state"] == "Disabled" and not shown["node2"]["actives"]

        v = classify(load.sent, load.confirmed, load.consumed)
        start, end = window
        during = load.waits_during(start, end)
        print(f"node1 killed: node2's partition(s) {node2s} handed to node3 in {end - start:.2f} s; "
              f"{len(during)} sends meanwhile, longest confirm wait {max(during, default=0.0) * 1000:.0f} ms; "
              f"checker {v.as_dict()}")
        assert load.failed == 0, f"{load.failed} sends failed"
        assert (v.lost, v.duplicated, v.unexpected) == (0, 0, 0), v
        assert len(load.confirmed) == cfg.messages

        # node1 back: zone a holds again, node2's HA services are back, and failback gives it
        # the partitions it is placed first for.
        await cl.nodes["node1"].start()

        async def node2_serves_again() -> bool:
            now = await cl.actives(QUEUE)
            return all(now.get(p) == "node2" for p in node2s)

        await wait_until(node2_serves_again, timeout=60, what=f"failback handing {node2s} back to node2")
        assert await zone_state(cl, "node2") == {"a": "Active", "b": "Active"}
        async with await client.connect(cl.url_of("node2")) as conn:
            await conn.producer(QUEUE).send(b"served again")


async def test_a_disabled_node_whose_log_is_the_only_full_one_takes_over_then_hands_over(tmp_path: Path) -> None:
    """node3 is frozen (SIGSTOP) while node1 and node2 confirm messages under load, so its logs
    lag; then node1 is killed and node3 resumed at once.  node2, Disabled by zone a, holds the
    only full log of the partitions node1 was active for: it still stands for them (as a
    drained node does: availability first), brings node3 up to date and hands them over.
    node3 ends up active for every partition, and the checker counts every message."""
    async with running_group(tmp_path, *ZONES, "--failback-after", "1") as cl:
        await cl.wait_members()
        async with await client.connect(cl.url) as conn:
            await conn.declare_queue(QUEUE, partitions=3)
        await actives(cl, QUEUE, 3)
        cfg = DrillConfig(scenario="zones-lag", partitions=3, producers=2, consumers=2, messages=4500, window=64)
        clock = SYSTEM_CLOCK
        load = Load(cl, cfg, 2, random.Random(12), clock)

        async def everything_on_node3() -> bool:
            now = await cl.actives(QUEUE)
            return len(now) == 3 and set(now.values()) == {"node3"}

        async def lag_node3_then_kill_node1() -> None:
            confirmed = len(load.confirmed)
            cl.nodes["node3"].pause()
            await wait_until(lambda: len(load.confirmed) >= confirmed + 500, timeout=60,
                             what="500 messages confirmed without node3")
            await cl.nodes["node1"].kill()
            cl.nodes["node3"].resume()
            try:
                await wait_until(everything_on_node3, timeout=60, what="node3 active for every partition")
            except AssertionError as e:
                raise AssertionError(f"{e}; {await seen_by(cl)}") from None

        await load.go(lag_node3_then_kill_node1, clock.monotonic() + 240)
        v = classify(load.sent, load.confirmed, load.consumed)
        print(f"node3 lagged, node1 killed: checker {v.as_dict()}")
        assert load.failed == 0, f"{load.failed} sends failed"
        assert (v.lost, v.duplicated, v.unexpected) == (0, 0, 0), v
        assert len(load.confirmed) == cfg.messages
        assert (await cl.status("node2")).quorum_state == "Disabled"
