"""``tandem partition move`` with real node processes: a three-node group keeping two copies
of each partition (``--replicas 1``), under load from durable producers and consumers (the
drill's, broker.tools.drill.load); a partition is moved onto the node that held no copy and
off its active, while the checker accounts for every message.  And the refusals."""

from __future__ import annotations

import asyncio
import base64
import json
import random
import re
import sqlite3
from collections.abc import Awaitable, Callable
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

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.timeout(300)]


async def holders(cl: LocalCluster, queue: str, partition: int) -> dict[str, str]:
    """node -> its role, for every node that holds a copy of the partition."""
    out = {}
    for name in cl.nodes:
        st = await cl.status(name)
        for p in st.partitions:
            if p.queue == queue and p.partition == partition:
                out[name] = p.role
    return out


async def _held_by(cl: LocalCluster, queue: str, partition: int, nodes: set[str]) -> bool:
    return set(await holders(cl, queue, partition)) == nodes


async def test_move_under_load_copies_to_the_new_node_hands_over_and_loses_nothing(tmp_path: Path) -> None:
    async with running_group(tmp_path, "--replicas", "1", "--sync-replicas", "1") as cl:
        async with await client.connect(cl.url) as conn:
            await conn.declare_queue(QUEUE, partitions=3)
        await wait_until(lambda: _all_active(cl, 3), timeout=30, what="an active for each partition")
        before = await holders(cl, QUEUE, 0)
        assert len(before) == 2, before
        active = next(n for n, role in before.items() if role == "active")
        newcomer = next(n for n in cl.nodes if n not in before)
        target = [newcomer, active]  # onto the node without a copy, which becomes the active
        cfg = DrillConfig(scenario="move", partitions=3, producers=2, consumers=2, messages=12000, window=64)
        clock = SYSTEM_CLOCK
        load = Load(cl, cfg, 1, random.Random(11), clock)
        window: list[float] = []
        result: list[tuple[int, str, str]] = []

        async def move_it() -> None:
            window.append(clock.monotonic())
            result.append(await tandem("partition", "move", QUEUE, "0", "--to", ",".join(target), "--wait",
                                       "--timeout", "120", "--json", "--url", cl.url_of(active)))
            window.append(clock.monotonic())

        await load.go(move_it, clock.monotonic() + 240)
        rc, out, err = result[0]
        assert rc == 0, err
        doc = json.loads(out)
        assert doc["done"] is True and doc["nodes"] == target, doc
        # (the member the command asked saw the move end; the one that leaves drops its copy
        # once the catalogue's entry reaches it, a moment later)
        await wait_until(lambda: _held_by(cl, QUEUE, 0, set(target)), timeout=30,
                         what=f"{QUEUE}/0 held by {target} only")
        assert (await cl.actives(QUEUE))[0] == newcomer
        v = classify(load.sent, load.confirmed, load.consumed)
        start, end = window
        during = load.waits_during(start, end)
        longest = max(during, default=0.0)
        print(f"move of {QUEUE}/0 {sorted(before)} -> {target}: {doc['seconds']:.2f} s; {len(during)} sends "
              f"during it, longest confirm wait {longest * 1000:.0f} ms (whole run {max(load.waits) * 1000:.0f} ms); "
              f"checker {v.as_dict()}")
        assert load.failed == 0, f"{load.failed} sends failed"
        assert (v.lost, v.duplicated, v.unexpected) == (0, 0, 0), v
        assert len(load.confirmed) == cfg.messages
        for name in cl.nodes:
            assert (await cl.status(name)).moving == [], name


async def test_a_move_survives_kill_9_of_its_active_and_of_the_new_node_mid_copy(tmp_path: Path) -> None:
    """Four nodes, three copies of each partition.  The new node is frozen (SIGSTOP) so the
    move is caught mid-copy; the partition's active is killed and restarted, then the new
    node is killed and restarted: the move goes on under the new active and ends with every
    copy in place, nothing lost."""
    cl = LocalCluster(tmp_path, console=False, nodes=4, base_port=0, password=PASSWORD, extra_args=FAST)
    await cl.start()
    try:
        await cl.wait_ready()
        async with await client.connect(cl.url) as conn:
            await conn.declare_queue(QUEUE, partitions=4)
        await wait_until(lambda: _all_active(cl, 4), timeout=30, what="an active for each partition")
        before = await holders(cl, QUEUE, 0)
        active = next(n for n, role in before.items() if role == "active")
        newcomer = next(n for n in cl.nodes if n not in before)
        target = [newcomer] + [n for n in before if n != active]
        keep = target[1]
        cfg = DrillConfig(scenario="move", nodes=4, partitions=4, producers=2, consumers=2, messages=9000, window=64)
        clock = SYSTEM_CLOCK
        load = Load(cl, cfg, 1, random.Random(12), clock)

        async def state_on(name: str) -> str:
            st = await cl.status(name)
            return next((p.state for p in st.partitions if p.queue == QUEUE and p.partition == 0), "")

        async def move_accepted() -> bool:
            # the frozen newcomer may hold the catalogue: the move is forwarded to it and the
            # link is lost; the others elect a new catalogue active and the retry goes there
            # (where a lost request did commit, the retry is told the move is under way)
            rc, out, err = await tandem("partition", "move", QUEUE, "0", "--to", ",".join(target),
                                        "--url", cl.url_of(keep))
            if rc == 0:
                assert "is moving to" in out, out
                return True
            assert any(why in err for why in ("forwarded", "retry", "is already moving to")), err
            return "is already moving to" in err

        async def faults() -> None:
            cl.nodes[newcomer].pause()
            await wait_until(move_accepted, timeout=60, what="the move accepted")
            await wait_until(lambda: _state_is(state_on, active, "Replicating"), timeout=30,
                             what=f"{QUEUE}/0 Replicating on {active}")
            await cl.nodes[active].kill()
            await cl.nodes[active].start()

            async def moving_elsewhere() -> bool:
                for n in target[1:]:
                    if any(p.queue == QUEUE and p.partition == 0 and p.role == "active" and p.state == "Replicating"
                           for p in (await cl.status(n)).partitions):
                        return True
                return False

            await wait_until(moving_elsewhere, timeout=60, what="the move going on under another active")
            await cl.nodes[newcomer].kill()
            await cl.nodes[newcomer].start()

            await wait_until(lambda: no_moves(cl), timeout=120, what="the move to end")

        await load.go(faults, clock.monotonic() + 240)
        assert set(await holders(cl, QUEUE, 0)) == set(target)
        assert (await cl.actives(QUEUE)).get(0) == newcomer, [
            p for p in (await cl.status(newcomer)).partitions if p.queue == QUEUE and p.partition == 0]
        v = classify(load.sent, load.confirmed, load.consumed)
        print(f"move {sorted(before)} -> {target} with kill -9 of {active} and {newcomer} mid-copy: "
              f"checker {v.as_dict()}")
        assert (v.lost, v.duplicated, v.unexpected) == (0, 0, 0), v
        assert len(load.confirmed) == cfg.messages
    finally:
        await cl.stop()


async def no_moves(cl: LocalCluster) -> bool:
    """No member lists a move under way."""
    for n in cl.nodes:
        if (await cl.status(n)).moving:
            return False
    return True


async def _state_is(state_on: Callable[[str], Awaitable[str]], name: str, want: str) -> bool:
    return await state_on(name) == want


async def _all_active(cl: LocalCluster, n: int) -> bool:
    return len(await cl.actives(QUEUE)) == n


async def test_refusals_the_console_api_and_a_placement_that_outlives_a_restart(tmp_path: Path) -> None:
    async with running_group(tmp_path, console=True) as cl:
        url = cl.url_of("node1")
        async with await client.connect(url) as conn:
            await conn.declare_queue("orders", partitions=2)
        await wait_until(lambda: _actives_of(cl, "orders", 2), timeout=30, what="actives for orders")
        cases = [
            (["nope", "0", "--to", "node1"], "partition move: no queue 'nope'"),
            (["orders", "2", "--to", "node1"], "partition move: queue orders has partitions 0..1, not 2"),
            (["orders", "0", "--to", "node1,node9"], "partition move: no member node9 (members: node1, node2, node3)"),
            (["orders", "0", "--to", "node1,node1"], "partition move: a node appears twice in node1,node1"),
            (["orders", "0", "--to", "node1,node2,node3"], "partition orders/0 is already on node1,node2,node3"),
            (["orders", "0", "--to", "node1,,node2"], "--to 'node1,,node2': comma-separated node names"),
            (["orders", "-1", "--to", "node1"], "P -1: a partition number >= 0"),
            (["orders", "0", "--to", "node1,node2:fast"],
             "partition move: 'node2:fast': a node's kind is sync or async (name:sync, name:async)"),
            (["orders", "0", "--to", "node2:async,node1"],
             "partition move: the first node, node2, is the active: it cannot be async"),
            (["orders", "0", "--to", "node1,node2:sync,node3:sync"],
             "partition orders/0 is already on node1,node2:sync,node3:sync"),
        ]
        # (each refusal changes nothing: the CLI runs for all of them at once)
        answers = await asyncio.gather(*(tandem("partition", "move", *argv, "--url", url) for argv, _want in cases))
        for (argv, want), (rc, _out, err) in zip(cases, answers, strict=True):
            assert rc == 2 and err.strip().splitlines() == [f"tandem: error: {want}"], (argv, err)
        assert (await cl.status("node1")).moving == []

        # the console's API: the same operation and refusals; the move takes node1 off partition 1
        base = cl.console_url("node2") + "api/v1/queues"
        admin = {"Authorization": "Basic " + base64.b64encode(f"admin:{cl.password}".encode()).decode()}
        async with aiohttp.ClientSession(headers=admin) as s:
            async with s.post(f"{base}/nope/partitions/0/move", json={"to": ["node1"]}) as r:
                assert r.status == 404
            async with s.post(f"{base}/orders/partitions/1/move", json={"to": "node1"}) as r:
                assert r.status == 400 and (await r.json())["message"].startswith("to: "), await r.text()
            async with s.post(f"{base}/orders/partitions/1/move", json={"to": ["node3", "node2"]}) as r:
                assert r.status == 200, await r.text()
                assert await r.json() == {"queue": "orders", "partition": 1, "nodes": ["node3", "node2"],
                                          "moving": True}

        async def moved() -> bool:
            return await no_moves(cl) and set(await holders(cl, "orders", 1)) == {"node3", "node2"}

        await wait_until(moved, timeout=60, what="orders/1 on node3 and node2 only")
        assert (await cl.actives("orders")).get(1) == "node3"
        # node1 keeps no copy across a restart, and the others keep the placement
        await cl.nodes["node1"].stop()
        await cl.nodes["node1"].start()
        await cl.wait_ready()
        async with await client.connect(cl.url_of("node1")) as conn:
            await conn.producer("orders").send_many([(f"m{i}".encode(), f"k{i}") for i in range(40)])
        assert set(await holders(cl, "orders", 1)) == {"node3", "node2"}
        st = await cl.status("node1")
        assert [p for p in st.foreign if p.queue == "orders" and p.partition == 1], st.foreign

        # a node made async: a learner of the partition's log, shown as such by its active
        rc, out, err = await tandem("partition", "move", "orders", "0", "--to", "node1,node2,node3:async", "--wait",
                                    "--timeout", "60", "--json", "--url", cl.url_of("node2"))
        assert rc == 0 and json.loads(out)["done"] is True, err

        async def kinds() -> dict[str, str]:
            for n in cl.nodes:
                for p in (await cl.status(n)).partitions:
                    if p.queue == "orders" and p.partition == 0 and p.role == "active":
                        return {r.node: r.kind for r in p.replicas}
            return {}

        assert await kinds() == {"node2": "sync", "node3": "async"}


async def _actives_of(cl: LocalCluster, queue: str, n: int) -> bool:
    return len(await cl.actives(queue)) == n


async def test_a_snapshot_stream_cut_by_kill_9_of_the_new_copy_starts_over_and_loses_nothing(
        tmp_path: Path) -> None:
    """The new copy gets the partition as a streamed snapshot (parts of 5 messages here); it
    is frozen after its first part and killed: restarted, it starts the partition over (the
    store's mark) and takes a new stream.  Every message is there once, on the new node."""
    async with running_group(tmp_path, "--replicas", "1", "--sync-replicas", "1",
                             "--objects-locked-per-transaction", "5") as cl:
        async with await client.connect(cl.url) as conn:
            await conn.declare_queue("big", partitions=1)
            bodies = [f"{i:06d}".encode() + b"x" * 20000 for i in range(1500)]
            await conn.producer("big").send_many(bodies)
        before = await holders(cl, "big", 0)
        newcomer = next(n for n in cl.nodes if n not in before)
        active = next(n for n, role in before.items() if role == "active")
        rc, _out, err = await tandem("partition", "move", "big", "0", "--to", f"{newcomer},{active}",
                                     "--url", cl.url_of(active))
        assert rc == 0, err
        node = cl.nodes[newcomer]

        def parts_written() -> bool:
            """The stream's mark and some of its messages are in the new node's store."""
            db = sqlite3.connect(f"file:{node.data_dir / 'tandem.db'}?mode=ro", uri=True)
            try:
                # (big is the group's first queue: id 1)
                mark = db.execute("SELECT value FROM meta WHERE key = 'streaming.1.0'").fetchone()
                chunks = db.execute("SELECT count(*) FROM chunks").fetchone()[0]
                return mark == ("1",) and chunks > 0
            except sqlite3.OperationalError:  # (not created yet)
                return False
            finally:
                db.close()

        await wait_until(parts_written, timeout=30, what=f"a snapshot's first parts written on {newcomer}")
        node.pause()
        await node.kill()
        await node.start()

        await wait_until(lambda: no_moves(cl), timeout=120, what="the move to end")
        assert "cut short by a stop: starting the partition over" in node.log_text()
        assert (await cl.actives("big")).get(0) == newcomer
        # the new active's store holds as many messages as were sent, and each is delivered once
        loaded = re.findall(rf"partition 1/0 active on {newcomer} in term \d+ \((\d+) messages\)", node.log_text())
        assert loaded and int(loaded[-1]) == len(bodies), loaded
        got: list[bytes] = []
        async with await client.connect(cl.url_of(newcomer)) as conn:
            c = await conn.consumer("big", prefetch=200).start()
            while len(got) < len(bodies) and (m := await c.next(5.0)) is not None:
                got.append(m.body)
                m.ack()
        assert sorted(got) == sorted(bodies) and len(set(got)) == len(bodies)


async def test_forced_replication_copies_every_replica_afresh_under_load(tmp_path: Path) -> None:
    """Three nodes, three copies.  ``--force-replication`` on the list the partition is on:
    each replica in turn drops its copy and gets a new one from the active, while the drill's
    producers and consumers run; the checker accounts for every message."""
    async with running_group(tmp_path, console=True) as cl:
        async with await client.connect(cl.url) as conn:
            await conn.declare_queue(QUEUE, partitions=2)
        await wait_until(lambda: _all_active(cl, 2), timeout=30, what="an active for each partition")
        active = (await cl.actives(QUEUE))[0]
        nodes = [active] + sorted(n for n in cl.nodes if n != active)
        cfg = DrillConfig(scenario="force", partitions=2, producers=2, consumers=2, messages=6000, window=64)
        clock = SYSTEM_CLOCK
        load = Load(cl, cfg, 1, random.Random(5), clock)
        result: list[tuple[int, str, str]] = []

        async def force_it() -> None:
            result.append(await tandem("partition", "move", QUEUE, "0", "--to", ",".join(nodes), "--force-replication",
                                       "--wait", "--timeout", "120", "--url", cl.url_of(nodes[1])))

        await load.go(force_it, clock.monotonic() + 240)
        rc, out, err = result[0]
        assert rc == 0 and out.startswith(f"partition {QUEUE}/0 moved to {','.join(nodes)} in ") \
            and out.strip().endswith(", every replica copied afresh"), (out, err)
        v = classify(load.sent, load.confirmed, load.consumed)
        print(f"forced replication of {QUEUE}/0 on {nodes}: checker {v.as_dict()}, longest confirm wait "
              f"{max(load.waits) * 1000:.0f} ms")
        assert load.failed == 0, f"{load.failed} sends failed"
        assert (v.lost, v.duplicated, v.unexpected) == (0, 0, 0), v
        # each replica dropped its copy once and holds one again; the active never did
        for name in nodes[1:]:
            assert cl.nodes[name].log_text().count(f"moved off {name}: dropping its copy here") == 1, name
        assert "dropping its copy" not in cl.nodes[active].log_text()
        assert set(await holders(cl, QUEUE, 0)) == set(nodes)
        st = await cl.status(nodes[1])
        assert st.moving == [], st.moving
        rc, _out, err = await tandem("partition", "move", QUEUE, "0", "--to", "node1,node9", "--force-replication",
                                     "--url", cl.url)
        assert rc == 2 and "partition move: no member node9" in err, err
        base = cl.console_url("node2") + f"api/v1/queues/{QUEUE}/partitions/1/move"
        admin = {"Authorization": "Basic " + base64.b64encode(f"admin:{cl.password}".encode()).decode()}
        async with aiohttp.ClientSession(headers=admin) as s:
            async with s.post(base, json={"to": nodes, "force_replication": "yes"}) as r:
                assert r.status == 400 and (await r.json())["message"].startswith("force_replication: "), \
                    await r.text()
