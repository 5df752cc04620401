"""``tandem node drain`` / ``undrain`` with real node processes: a three-node group under
load from durable producers and consumers (the drill's, broker.tools.drill.load), the node
active for a partition drained with the CLI; every message is accounted for by the
checker, and the drained flag survives a restart of the drained node.  And the refusals."""

from __future__ import annotations

import base64
import json
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
from client.errors import AccessRefusedError
from tests.conftest import running_group
from tests.helpers import tandem, wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.timeout(300)]


async def actives(cl: LocalCluster, queue: str, partitions: int) -> dict[int, str]:
    found: dict[int, str] = {}

    async def all_active() -> bool:
        nonlocal found
        found = await cl.actives(queue)
        return len(found) == partitions

    await wait_until(all_active, timeout=30, what=f"an active for each partition of {queue}")
    return found


async def holds_no_active(cl: LocalCluster, name: str) -> bool:
    """``name`` is active for nothing, as it and every other member see it (the catalogue
    included), and every partition has an active."""
    for member in cl.nodes:
        st = await cl.status(member)
        if any(p.active == name or (member == name and p.role == "active") or not p.active
               for p in st.partitions):
            return False
    return True


async def test_drain_under_load_moves_every_active_and_loses_nothing_and_undrain_brings_them_back(
        tmp_path: Path) -> None:
    async with running_group(tmp_path, "--failback-after", "1") as cl:
        async with await client.connect(cl.url) as conn:
            await conn.declare_queue(QUEUE, partitions=3)
        placed = await actives(cl, QUEUE, 3)
        target = placed[0]
        other = next(n for n in cl.nodes if n != target)
        mine = {p for p, n in placed.items() if n == target}
        cfg = DrillConfig(scenario="drain", partitions=3, producers=2, consumers=2, messages=12000, window=64)
        clock = SYSTEM_CLOCK
        load = Load(cl, cfg, 1, random.Random(7), clock)
        window: list[float] = []
        result: list[tuple[int, str, str]] = []

        async def drain_it() -> None:
            window.append(clock.monotonic())
            result.append(await tandem("node", "drain", target, "--wait", "--timeout", "60", "--json",
                                       "--url", cl.url_of(other)))
            window.append(clock.monotonic())

        await load.go(drain_it, clock.monotonic() + 240)
        rc, out, err = result[0]
        assert rc == 0, err
        doc = json.loads(out)
        assert doc["node"] == target and doc["actives"] == 0 and doc["moved"] >= len(mine), doc
        assert await holds_no_active(cl, target)
        for member in cl.nodes:
            assert (await cl.status(member)).drained == [target], member
        v = classify(load.sent, load.confirmed, load.consumed)
        # the confirms of sends made while the drain ran (waits and confirm times line up: none failed)
        assert load.failed == 0, f"{load.failed} sends failed"
        start, end = window
        during = load.waits_during(start, end)
        longest = max(during, default=0.0)
        print(f"drain of {target} (active for partition(s) {sorted(mine)}): {doc['moved']} moved in "
              f"{doc['seconds']:.2f} s; {len(during)} sends during it, longest confirm wait {longest * 1000:.0f} ms "
              f"(whole run {max(load.waits) * 1000:.0f} ms); checker {v.as_dict()}")
        assert (v.lost, v.duplicated, v.unexpected) == (0, 0, 0), v
        assert len(load.confirmed) == cfg.messages

        # The flag survives a restart of the drained node, and it takes nothing back.
        await cl.nodes[target].stop()
        await cl.nodes[target].start()
        await cl.wait_ready()
        assert (await cl.status(target)).drained == [target]
        async with await client.connect(cl.url_of(other)) as conn:
            await conn.producer(QUEUE).send_many([f"after-restart-{i}".encode() for i in range(50)])
        await wait_until(lambda: holds_no_active(cl, target), timeout=30, what=f"{target} holding no active")
        st = await cl.status(target)
        assert all(p.role != "active" for p in st.partitions), st.partitions

        rc, out, err = await tandem("node", "undrain", target, "--url", cl.url_of(other))
        assert rc == 0 and "undrained" in out, err

        async def back() -> bool:
            now = await cl.actives(QUEUE)
            return all(now.get(p) == target for p in mine)

        await wait_until(back, timeout=60, what=f"failback handing partition(s) {sorted(mine)} back to {target}")
        for member in cl.nodes:
            assert (await cl.status(member)).drained == [], member


async def test_drain_refusals_are_one_line_and_change_nothing(tmp_path: Path) -> None:
    async with running_group(tmp_path, console=True) as cl:
        url = cl.url_of("node1")
        rc, _out, err = await tandem("node", "drain", "nodeX", "--url", url)
        assert rc == 2 and err.strip().splitlines() == [
            "tandem: error: no node 'nodeX' in this group (members: node1, node2, node3)"], err
        rc, _out, err = await tandem("node", "undrain", "node2", "--url", url)
        assert rc == 2 and err.strip() == "tandem: error: node node2 is not drained", err
        rc, out, err = await tandem("node", "drain", "node2", "--url", url)
        assert rc == 0 and "node node2 drained" in out, err
        rc, _out, err = await tandem("node", "drain", "node2", "--url", cl.url_of("node3"))
        assert rc == 2 and err.strip() == "tandem: error: node node2 is already drained", err
        rc, _out, err = await tandem("node", "drain", "node3", "--url", url)
        assert rc == 0, err
        rc, _out, err = await tandem("node", "drain", "node1", "--url", url)
        assert rc == 2 and "cannot drain node1: every other member is drained" in err, err
        rc, _out, err = await tandem("node", "drain", "node1", "--timeout", "0", "--url", url)
        assert rc == 2 and "--timeout 0" in err, err
        # the admin permission: a user without it is refused
        async with await client.connect(url) as conn:
            await conn.create_user("viewer", "viewer-password", "monitor")
        viewer = url.replace("admin:", "viewer:", 1).replace(cl.password, "viewer-password")
        rc, _out, err = await tandem("node", "undrain", "node2", "--url", viewer)
        assert rc == 2 and "access refused" in err and len(err.strip().splitlines()) == 1, err
        async with await client.connect_link(viewer) as link:
            with pytest.raises(AccessRefusedError):
                await link.drain_node("node2", False)
        st = await cl.status("node2")
        assert st.drained == ["node2", "node3"]
        rc, out, _err = await tandem("status", "--url", cl.url_of("node1"))
        assert "Up, drained" in out

        # the console's API: the same operation, the same refusals, and the nodes it shows drained
        base = cl.console_url("node1") + "api/v1/nodes"
        admin = {"Authorization": "Basic " + base64.b64encode(f"admin:{cl.password}".encode()).decode()}
        async with aiohttp.ClientSession(headers=admin) as s:
            async with s.get(base) as r:
                assert {n["name"]: n["drained"] for n in await r.json()} == {
                    "node1": False, "node2": True, "node3": True}
            async with s.post(f"{base}/node9/drain") as r:
                assert r.status == 404
            async with s.post(f"{base}/node2/drain") as r:
                assert r.status == 400 and (await r.json())["message"] == "node node2 is already drained"
            async with s.post(f"{base}/node3/undrain") as r:
                assert r.status == 200 and await r.json() == {"node": "node3", "drained": False}
        assert (await cl.status("node1")).drained == ["node2"]  # (applied where it was asked before the answer)

        async def applied_everywhere() -> bool:
            return [(await cl.status(m)).drained for m in cl.nodes] == [["node2"]] * len(cl.nodes)

        await wait_until(applied_everywhere, timeout=10, what="the undrain applied on every member")
