"""``tandem group add`` / ``tandem group remove`` with real node processes under load from
durable producers and consumers (the drill's, broker.tools.drill.load): a fourth node joins
a three-node group and the partitions re-spread onto it, then a founding member is drained
and removed and the partitions re-spread off it; the checker accounts for every message,
and the longest confirm wait during each operation is reported.  And the refusals.

A member added in a zone, the partitions' copies kept in distinct zones, and an add at each
member's peer address refused by each member, run on the in-process group harness
(tests/harness/test_group_change.py)."""

from __future__ import annotations

import asyncio
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
from tests.conftest import FAST, PASSWORD, running_group
from tests.helpers import tandem, wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.timeout(420)]

PARTITIONS = 6


async def placement(cl: LocalCluster, via: str) -> dict[int, set[str]]:
    """partition -> the nodes holding a copy, as every member ``via`` names reports its own
    (a node removed from the group, running still, refuses clients once it knows)."""
    out: dict[int, set[str]] = {p: set() for p in range(PARTITIONS)}
    for name in (await cl.status(via)).members:
        proc = cl.nodes[name]
        if proc.proc is None or proc.proc.returncode is not None:
            continue
        for p in (await cl.status(name)).partitions:
            if p.queue == QUEUE:
                out[p.partition].add(name)
    return out


def longest_during(load: Load, start: float, end: float) -> tuple[int, float]:
    during = load.waits_during(start, end)
    return len(during), max(during, default=0.0)


async def test_add_a_fourth_node_then_drain_and_remove_a_founder_under_load(tmp_path: Path) -> None:
    cl = LocalCluster(tmp_path, console=False, nodes=3, base_port=0, password=PASSWORD,
                      extra_args=[*FAST, "--replicas", "1", "--sync-replicas", "1"])
    await cl.start()
    try:
        await cl.wait_ready()
        async with await client.connect(cl.url) as conn:
            await conn.declare_queue(QUEUE, partitions=PARTITIONS)
        await wait_until(lambda: _all_active(cl), timeout=30, what="an active for each partition")
        spec = cl.new_member("node4")
        clock = SYSTEM_CLOCK
        cfg = DrillConfig(scenario="group", partitions=PARTITIONS, producers=2, consumers=2, messages=60000,
                          window=64)
        load = Load(cl, cfg, 1, random.Random(17), clock)
        windows: dict[str, tuple[float, float]] = {}
        results: dict[str, tuple[int, str, str]] = {}

        async def step(what: str, *args: str) -> None:
            t0 = clock.monotonic()
            results[what] = rc = await tandem(*args, "--url", cl.url_of("node2"))
            windows[what] = (t0, clock.monotonic())
            assert rc[0] == 0, (what, rc)

        async def operations() -> None:
            # node4 is started after the add: the members dial it once they have applied the change
            t0 = clock.monotonic()
            rc = await tandem("group", "add", spec, "--json", "--url", cl.url_of("node2"))
            assert rc[0] == 0, rc
            await cl.nodes["node4"].start(60)
            await wait_until(lambda: _settled(cl, "node2", 4), timeout=180, what="node4 added, partitions re-spread")
            windows["add"] = (t0, clock.monotonic())
            await step("drain", "node", "drain", "node1", "--wait", "--timeout", "120", "--json")
            await step("remove", "group", "remove", "node1", "--wait", "--timeout", "180", "--json")

        await load.go(operations, clock.monotonic() + 360)
        v = classify(load.sent, load.confirmed, load.consumed)
        for what, (start, end) in windows.items():
            n, longest = longest_during(load, start, end)
            print(f"group {what}: {end - start:.2f} s, {n} sends during it, longest confirm wait "
                  f"{longest * 1000:.0f} ms")
        print(f"whole run: longest confirm wait {max(load.waits) * 1000:.0f} ms; checker {v.as_dict()}")
        assert load.failed == 0, f"{load.failed} sends failed"
        assert (v.lost, v.duplicated, v.unexpected) == (0, 0, 0), v
        assert len(load.confirmed) == cfg.messages
        doc = json.loads(results["remove"][1])
        assert doc["members"] == ["node2", "node3", "node4"], doc
        await wait_until(lambda: _all_settled(cl, 3), timeout=30, what="every node through with the change")
        for name in ("node2", "node3", "node4"):
            st = await cl.status(name)
            assert st.members == ["node2", "node3", "node4"] and not st.group_change and not st.moving, name
            assert "node1" not in {r.name for r in st.remotes}, name
        held = await placement(cl, "node2")
        assert all(len(nodes) == 2 and "node1" not in nodes for nodes in held.values()), held
        assert any("node4" in nodes for nodes in held.values()), held
        # node1 learnt of its removal: it holds nothing and links to no one
        st1 = await cl.status("node1")
        assert not [p for p in st1.partitions if p.queue == QUEUE], "node1 still holds copies"
        assert st1.members == ["node2", "node3", "node4"] and st1.remotes == [], st1
        # the new list outlives restarts: a founder (whose settings still name node1 and not
        # node4) and the joiner come back into the same group
        await cl.nodes["node1"].stop()
        for name in ("node2", "node4"):
            await cl.nodes[name].kill()
            await cl.nodes[name].start(60)
        await wait_until(lambda: _linked(cl, ("node2", "node3", "node4")), timeout=60,
                         what="node2, node3 and node4 linked again")
        async with await client.connect(cl.url_of("node3")) as conn:
            await conn.producer(QUEUE).send_many([f"after-restarts-{i}".encode() for i in range(60)])
        st = await cl.status("node2")
        assert st.members == ["node2", "node3", "node4"], st.members
    finally:
        await cl.stop()


async def test_refusals_and_a_member_that_never_came_up_taken_out_again(tmp_path: Path) -> None:
    async with running_group(tmp_path, "--replicas", "1", "--sync-replicas", "1", console=True) as cl:
        url = cl.url_of("node1")
        async with await client.connect(url) as conn:
            await conn.declare_queue(QUEUE, partitions=PARTITIONS)
        await wait_until(lambda: _all_active(cl), timeout=30, what="an active for each partition")
        cases = [
            (["add", "node2=127.0.0.1:1"], "group add: node2 is a member already"),
            (["add", "node9"], "group add: 'node9' is not NAME=HOST:PEER_PORT"),
            (["add", "node9=nohost"], "group add: 'nohost' is not host:port (the new member's peer address)"),
            (["add", "node9=my host:1"], "group add: 'my host:1' is not host:port (the new member's peer address)"),
            (["add", "no de=127.0.0.1:1"], "group add: 'no de' is not a node name (letters, digits, '_', '.', '-')"),
            (["add", "node9=127.0.0.1:1", "--zone", "a"],
             "group add: this group has no zones (--zone only where every member has one)"),
            # (every member's address, asked of each member, on the harness: tests/harness/test_group_change.py)
            (["add", f"node9=127.0.0.1:{cl.peer_ports['node2']}"],
             f"group add: 127.0.0.1:{cl.peer_ports['node2']} is node2's peer address"),
            (["remove", "node9"], "group remove: no member 'node9' (members: node1, node2, node3)"),
            (["add", "node9=127.0.0.1:1", "--wait", "--timeout", "0"], "--timeout 0.0: a number of seconds > 0"),
        ]
        # (each refusal changes nothing: the CLI runs for all of them at once)
        answers = await asyncio.gather(*(tandem("group", *argv, "--url", url) for argv, _want in cases))
        for (argv, want), (rc, _out, err) in zip(cases, answers, strict=True):
            assert rc == 2 and err.strip().splitlines() == [f"tandem: error: {want}"], (argv, err)
        assert (await cl.status("node1")).members == ["node1", "node2", "node3"]

        # a member added at an address where nothing answers: partitions start moving onto it
        # and never get there; removing it again sends them back, and the group settles
        base = cl.console_url("node2") + "api/v1/group/members"
        admin = {"Authorization": "Basic " + base64.b64encode(f"admin:{cl.password}".encode()).decode()}
        async with aiohttp.ClientSession(headers=admin) as s:
            async with s.post(base, json={"name": "node9"}) as r:
                assert r.status == 400 and (await r.json())["message"].startswith("address: "), await r.text()
            async with s.delete(f"{base}/node8") as r:
                assert r.status == 404, await r.text()
            async with s.post(base, json={"name": "node9", "address": "127.0.0.1:1"}) as r:
                assert r.status == 200, await r.text()
                doc = await r.json()
                assert doc["members"] == ["node1", "node2", "node3", "node9"] and doc["group_change"], doc

            async def stuck() -> bool:
                st = await cl.status("node2")
                return any("node9" in m for m in st.moving)

            await wait_until(stuck, timeout=30, what="a partition moving onto node9")
            rc, _out, err = await tandem("group", "add", "node8=127.0.0.1:2", "--url", url)
            assert rc == 2 and "a change is under way" in err, err
            async with s.delete(f"{base}/node9") as r:
                assert r.status == 200, await r.text()
        await wait_until(lambda: _all_settled(cl, 3), timeout=90, what="node9 taken out, partitions back")
        for name in cl.nodes:
            st = await cl.status(name)
            assert st.members == ["node1", "node2", "node3"] and not st.group_change, (name, st.members)
            assert {r.name for r in st.remotes} == set(cl.nodes) - {name}
        held = await placement(cl, "node1")
        assert all(len(nodes) == 2 and "node9" not in nodes for nodes in held.values()), held
        async with await client.connect(cl.url) as conn:
            await conn.producer(QUEUE).send_many([(f"m{i}".encode(), f"k{i}") for i in range(60)])

        # a node with the group's secret that is no member (removed while it was down, say): the
        # members tell it so in plain words, and count no intruder (it proved the secret)
        cl.new_member("node0")  # (the lower name dials)
        await cl.nodes["node0"].start(60)
        told = "node0 is not a member of this group (removed with tandem group remove, or never added)"
        await wait_until(lambda: told in cl.nodes["node0"].log_text(), timeout=30, what="node0 told why")
        assert "node0" not in (await cl.status("node1")).members
        assert "intruder" not in cl.nodes["node1"].log_text(), "a member refused node0 as an intruder"


async def _all_active(cl: LocalCluster) -> bool:
    return len(await cl.actives(QUEUE)) == PARTITIONS


async def _linked(cl: LocalCluster, names: tuple[str, ...]) -> bool:
    for name in names:
        st = await cl.status(name)
        if sorted(r.name for r in st.remotes if r.state == "Up") != sorted(n for n in names if n != name):
            return False
    return await _all_active(cl)


async def _all_settled(cl: LocalCluster, members: int) -> bool:
    for name in cl.nodes:
        if not await _settled(cl, name, members):
            return False
    return True


async def _settled(cl: LocalCluster, via: str, members: int) -> bool:
    st = await cl.status(via)
    return len(st.members) == members and not st.group_change and not st.moving
