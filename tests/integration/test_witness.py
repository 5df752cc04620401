"""A two-node replicated group with a witness (``tandem witness start``), real processes on
loopback: the witness is a member and a voter, never a replica; kill -9 of either data node
under producers and consumers on durable connections loses nothing confirmed (the checker)
and the survivor serves; no partition ever has two actives (both nodes' status polled
throughout); after commits with the witness alone, the stale node cannot serve."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

import client
from broker.tools.checker import classify
from broker.tools.cluster import LocalCluster, free_ports
from broker.tools.drill.load import Load
from broker.tools.drill.model import DrillConfig
from broker.tools.faults import FaultProxy
from broker.tools.witness_process import WitnessProcess
from client.clock import SYSTEM_CLOCK
from tests.conftest import FAST, PASSWORD
from tests.helpers import drain_served, wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.timeout(300)]

QUEUE = "drill"


@asynccontextmanager
async def witnessed_pair(tmp_path: Path, link: FaultProxy | None = None, args: tuple[str, ...] = ()
                         ) -> AsyncIterator[tuple[LocalCluster, WitnessProcess]]:
    """node1, node2 (arbiter witness) and w1, quick to notice a dead member, all started at
    once and each data node linked to w1; stopped after.  ``link``: a proxy (not started) that the data nodes' link goes
    through; ``args``: more flags for the data nodes."""
    wport = free_ports(1)[0]
    cl = LocalCluster(tmp_path, console=False, nodes=2, base_port=0, password=PASSWORD,
                      extra_args=[*FAST, "--arbiter", "witness", "--witness", f"w1=127.0.0.1:{wport}", *args])
    w = WitnessProcess(tmp_path / "w1", name="w1", peer_port=wport,
                       peers=[f"{n}=127.0.0.1:{p}" for n, p in cl.peer_ports.items()],
                       extra_args=["--cluster-secret-file", str(cl.secret_file), *FAST])
    try:
        if link is not None:
            link.target = ("127.0.0.1", cl.peer_ports["node2"])
            await link.start()
            cl.route("node1", "node2", link.address)  # node1 dials node2 (the lower name dials)
        await asyncio.gather(w.start(), cl.start())
        await cl.wait_ready()
        # a node dials a member it has not seen yet every REDIAL_MAX at most: the witness may
        # have come up just after a node's first dial
        for name in cl.nodes:
            await wait_until(lambda name=name: _remote_state(cl, name, "w1", "Up"), timeout=15,
                             what=f"{name} sees w1 Up")
        yield cl, w
    finally:
        await cl.stop()
        await w.stop()
        if link is not None:
            await link.stop()


class ActiveWatch:
    """Polls every live node's status until stopped: who says it is active for which
    partition, in which term.  Two nodes active for one partition in one term, or both
    active for it in the same round of polls, is recorded as a violation."""

    def __init__(self, cl: LocalCluster, queue: str) -> None:
        self.cl, self.queue = cl, queue
        self.by_term: dict[tuple[int, int], str] = {}
        self.violations: list[str] = []
        self.rounds = 0
        self.seen: list[tuple[float, dict[int, str]]] = []  # (monotonic time, partition -> active) per round
        self._stop = asyncio.Event()
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while not self._stop.is_set():
            seen: dict[int, list[str]] = {}
            for name, st in await self.cl._statuses():
                for p in st.partitions:
                    if p.queue == self.queue and p.role == "active" and p.active == name:
                        seen.setdefault(p.partition, []).append(name)
                        other = self.by_term.setdefault((p.partition, p.term), name)
                        if other != name:
                            self.violations.append(f"partition {p.partition} term {p.term}: {other} and {name}")
            for part, names in seen.items():
                if len(names) > 1:
                    self.violations.append(f"partition {part}: {names} active in one round")
            self.rounds += 1
            self.seen.append((time.monotonic(), {part: names[0] for part, names in seen.items()}))
            try:
                async with asyncio.timeout(0.05):
                    await self._stop.wait()
            except TimeoutError:
                pass

    async def stop(self) -> None:
        self._stop.set()
        await self._task


async def test_the_witness_is_a_member_and_a_voter_never_a_replica_and_holds_no_data(tmp_path: Path) -> None:
    async with witnessed_pair(tmp_path) as (cl, w):
        async with await client.connect(cl.url) as conn:
            await conn.declare_queue("q", partitions=4)
        await wait_until(lambda: _all_active(cl, "q", 4), timeout=30, what="an active for each partition")
        for name in cl.nodes:
            st = await cl.status(name)
            remotes = {r.name: r for r in st.remotes}
            assert remotes["w1"].state == "Up" and remotes["w1"].priority == 0, st.remotes
            assert remotes["w1"].store_stamp.startswith("witness-")
            assert st.quorum_state == "Active" and st.arbiter == "witness"
            for p in st.partitions:
                assert p.active != "w1" and all(r.node != "w1" for r in p.replicas), p
        async with await client.connect(cl.url) as conn:
            producer = conn.producer("q")
            for i in range(50):
                await producer.send(f"secret-body-{i}".encode(), key=str(i))
        await w.stop()
        assert w.proc is not None and w.proc.returncode == 0, w.log_text()[-2000:]
        assert "witness w1 stopped" in w.log_text()
        raw = b"".join(f.read_bytes() for f in (tmp_path / "w1").iterdir() if f.is_file())
        assert b"secret-body" not in raw, "message data reached the witness"
        # the witness down: two of three votes, the group still serves
        await wait_until(lambda: _remote_state(cl, "node1", "w1", "Down"), timeout=10, what="w1 Down")
        async with await client.connect(cl.url) as conn:
            await conn.producer("q").send(b"without-the-witness", key="x")
        st = await cl.status("node1")
        assert st.quorum_state == "Partial"


async def _all_active(cl: LocalCluster, queue: str, n: int) -> bool:
    return len(await cl.actives(queue)) == n


async def _remote_state(cl: LocalCluster, node: str, remote: str, state: str) -> bool:
    st = await cl.status(node)
    return any(r.name == remote and r.state == state for r in st.remotes)


@pytest.mark.parametrize("victim", ["node1", "node2"])
async def test_kill_9_of_either_data_node_loses_nothing_confirmed_and_the_survivor_serves(
        tmp_path: Path, victim: str) -> None:
    async with witnessed_pair(tmp_path) as (cl, _w):
        partitions = 4
        async with await client.connect(cl.url) as conn:
            await conn.declare_queue(QUEUE, partitions=partitions)
        await wait_until(lambda: _all_active(cl, QUEUE, partitions), timeout=30, what="an active for each partition")
        before = await cl.actives(QUEUE)
        assert set(before.values()) == {"node1", "node2"}, before  # each is active for some partition
        survivor = "node2" if victim == "node1" else "node1"
        watch = ActiveWatch(cl, QUEUE)
        cfg = DrillConfig(scenario="kill-active", nodes=2, partitions=partitions, producers=2, consumers=2,
                          messages=3000, window=32, timeout=120)
        load = Load(cl, cfg, 1, random.Random(7), SYSTEM_CLOCK, queue=QUEUE)
        killed_at = 0.0

        async def kill() -> None:
            nonlocal killed_at
            killed_at = time.monotonic()
            await cl.nodes[victim].kill()

        await load.go(kill, time.monotonic() + cfg.timeout)
        await watch.stop()
        after = await cl.actives(QUEUE)
        v = classify(load.sent, load.confirmed, load.consumed)
        longest = max(load.waits) if load.waits else 0.0
        moved = next((t - killed_at for t, act in watch.seen
                      if t > killed_at and len(act) == partitions and victim not in act.values()), -1.0)
        print(f"kill -9 {victim}: {v.as_dict()} failed sends {load.failed}, longest confirm wait {longest:.2f}s, "
              f"every partition active on {survivor} {moved:.2f}s after the kill, "
              f"{watch.rounds} status rounds, actives after {after}")
        assert (v.lost, v.duplicated, v.unexpected) == (0, 0, 0), v
        assert v.confirmed == cfg.messages and load.failed == 0, v
        assert set(after.values()) == {survivor} and len(after) == partitions, after
        assert not watch.violations, watch.violations
        assert killed_at and watch.rounds > 10


async def test_after_commits_with_the_witness_alone_the_stale_node_does_not_serve_and_nothing_is_lost(
        tmp_path: Path) -> None:
    # an election timeout of 0.25 s on the data nodes: ten of them are watched below
    async with witnessed_pair(tmp_path, args=("--keepalive-interval", "0.05", "--non-response-timeout", "0.25")
                              ) as (cl, _w):
        async with await client.connect(cl.url) as conn:
            await conn.declare_queue("q", partitions=2)
        await wait_until(lambda: _all_active(cl, "q", 2), timeout=30, what="an active for each partition")
        await cl.nodes["node2"].kill()
        await wait_until(lambda: _active_set(cl, "q", {"node1"}), timeout=30, what="node1 active for both")
        bodies = [f"m-{i}".encode() for i in range(200)]
        async with await client.connect(cl.url_of("node1")) as conn:
            # confirmed by node1 and the witness alone
            await conn.producer("q").send_many([(b, b.decode()) for b in bodies])
        await cl.nodes["node1"].kill()
        await cl.nodes["node2"].start()
        terms = {p.partition: p.term for p in (await cl.status("node2")).partitions if p.queue == "q"}

        async def witness_up() -> bool:
            st = await cl.status("node2")
            return any(r.name == "w1" and r.state == "Up" for r in st.remotes)

        await wait_until(witness_up, timeout=30, what="node2 linked to the witness")
        # node2 asks again and again (pre-votes): the witness refuses, its log is behind what the
        # witness acknowledged; never elected, and it raises no term either
        end = time.monotonic() + 2.5  # ten election timeouts, watched
        while time.monotonic() < end:
            st = await cl.status("node2")
            q = [p for p in st.partitions if p.queue == "q"]
            assert not [p for p in q if p.role == "active"], st.partitions
            # (it may take up the term node1 was elected in, which the witness's refusal carries)
            assert all(p.term <= terms.get(p.partition, 0) + 1 for p in q), (terms, st.partitions)
            await asyncio.sleep(0.25)  # sampling over a fixed window, as _stable_for does
        await cl.nodes["node1"].start()
        await wait_until(lambda: _all_active(cl, "q", 2), timeout=30, what="an active for each partition")
        consumed = await drain_served(cl.url, "q")
        v = classify(bodies, bodies, consumed)
        assert (v.lost, v.duplicated, v.unexpected) == (0, 0, 0), v


async def _stable_for(cl: LocalCluster, want: dict[int, str], seconds: float) -> bool:
    """Whether the actives stay ``want`` (and their terms do not move) for ``seconds``."""
    start = time.monotonic()
    terms = {p.partition: p.term for _n, st in await cl._statuses() for p in st.partitions
             if p.queue == QUEUE and p.role == "active"}
    while time.monotonic() - start < seconds:
        now = {p.partition: p.term for _n, st in await cl._statuses() for p in st.partitions
               if p.queue == QUEUE and p.role == "active"}
        if await cl.actives(QUEUE) != want or now != terms:
            want.clear()
            want.update(await cl.actives(QUEUE))
            return False
        await asyncio.sleep(0.05)  # sampling that the actives stay put, over a fixed window
    return True


async def _active_set(cl: LocalCluster, queue: str, nodes: set[str]) -> bool:
    act = await cl.actives(queue)
    return bool(act) and set(act.values()) == nodes and len(act) == 2


async def test_cutting_the_link_between_the_data_nodes_keeps_one_active_per_partition_and_loses_nothing(
        tmp_path: Path) -> None:
    """Both data nodes reach the witness but not each other: each partition has one active
    (the witness votes once per term, and does not let the node that cannot win depose the
    one that can), and after the heal every confirmed message is consumed.  (Clients still
    reach both nodes meanwhile, and a node forwards what it is not active for over the cut
    link: they wait for the heal.  That is the client side of a partial cut, not the witness's.)"""
    px = FaultProxy(("127.0.0.1", 1))
    async with witnessed_pair(tmp_path, px) as (cl, _w):
        partitions = 4
        async with await client.connect(cl.url) as conn:
            await conn.declare_queue(QUEUE, partitions=partitions)
        await wait_until(lambda: _all_active(cl, QUEUE, partitions), timeout=30, what="an active for each partition")
        watch = ActiveWatch(cl, QUEUE)
        cfg = DrillConfig(scenario="partition-active", nodes=2, partitions=partitions, producers=2, consumers=2,
                          messages=4000, window=32, timeout=150)
        load = Load(cl, cfg, 1, random.Random(11), SYSTEM_CLOCK, queue=QUEUE)

        async def cut_and_heal() -> None:
            px.cut()
            await wait_until(lambda: _remote_state(cl, "node1", "node2", "Down"), timeout=10, what="node2 Down")
            await wait_until(lambda: _all_active(cl, QUEUE, partitions), timeout=30,
                             what="an active for each partition while the data nodes are cut apart")
            settled = await cl.actives(QUEUE)
            await wait_until(lambda: _stable_for(cl, settled, 3 * 0.5), timeout=30,
                             what="the same actives for three election timeouts")
            px.heal()

        await load.go(cut_and_heal, time.monotonic() + cfg.timeout)
        await watch.stop()
        v = classify(load.sent, load.confirmed, load.consumed)
        print(f"data link cut: {v.as_dict()} failed sends {load.failed}, {watch.rounds} status rounds, "
              f"violations {watch.violations}")
        assert (v.lost, v.duplicated, v.unexpected) == (0, 0, 0), v
        assert v.confirmed == cfg.messages and load.failed == 0, v
        assert not [x for x in watch.violations if "term" in x], watch.violations
        assert not watch.violations, watch.violations


async def test_a_killed_data_node_restarts_catches_up_and_takes_its_partitions_back(tmp_path: Path) -> None:
    """kill -9 of a data node under load, then its restart: it catches up from the survivor
    (the witness holds no data to give), failback hands it its partitions again, and every
    confirmed message is consumed exactly once.  (Failback after 1 s back and answering, not
    the default 5 s.)"""
    async with witnessed_pair(tmp_path, args=("--failback-after", "1")) as (cl, _w):
        partitions = 4
        async with await client.connect(cl.url) as conn:
            await conn.declare_queue(QUEUE, partitions=partitions)
        await wait_until(lambda: _all_active(cl, QUEUE, partitions), timeout=30, what="an active for each partition")
        placed = await cl.actives(QUEUE)
        victim = placed[0]
        watch = ActiveWatch(cl, QUEUE)
        cfg = DrillConfig(scenario="kill-active", nodes=2, partitions=partitions, producers=2, consumers=2,
                          messages=6000, window=32, timeout=150)
        load = Load(cl, cfg, 1, random.Random(5), SYSTEM_CLOCK, queue=QUEUE)

        async def kill_and_restart() -> None:
            await cl.nodes[victim].kill()
            await wait_until(lambda: _without(cl, victim, partitions), timeout=30, what="failover")
            await cl.nodes[victim].start()
            await wait_until(lambda: _back(cl, placed), timeout=60, what=f"failback to {victim}")

        await load.go(kill_and_restart, time.monotonic() + cfg.timeout)
        await watch.stop()
        v = classify(load.sent, load.confirmed, load.consumed)
        print(f"kill -9 {victim}, restart, failback: {v.as_dict()} failed sends {load.failed}")
        assert (v.lost, v.duplicated, v.unexpected) == (0, 0, 0), v
        assert load.failed == 0, v
        assert not watch.violations, watch.violations


async def _without(cl: LocalCluster, victim: str, partitions: int) -> bool:
    act = await cl.actives(QUEUE)
    return len(act) == partitions and victim not in act.values()


async def _back(cl: LocalCluster, placed: dict[int, str]) -> bool:
    return await cl.actives(QUEUE) == placed


async def test_kill_9_of_the_witness_under_load_changes_nothing_for_the_data_nodes(tmp_path: Path) -> None:
    async with witnessed_pair(tmp_path) as (cl, w):
        partitions = 4
        async with await client.connect(cl.url) as conn:
            await conn.declare_queue(QUEUE, partitions=partitions)
        await wait_until(lambda: _all_active(cl, QUEUE, partitions), timeout=30, what="an active for each partition")
        placed = await cl.actives(QUEUE)
        cfg = DrillConfig(scenario="kill-replica", nodes=2, partitions=partitions, producers=2, consumers=2,
                          messages=3000, window=32, timeout=120)
        load = Load(cl, cfg, 1, random.Random(3), SYSTEM_CLOCK, queue=QUEUE)
        await load.go(w.kill, time.monotonic() + cfg.timeout)
        v = classify(load.sent, load.confirmed, load.consumed)
        print(f"kill -9 w1: {v.as_dict()} failed sends {load.failed}, longest confirm wait {max(load.waits):.2f}s")
        assert (v.lost, v.duplicated, v.unexpected) == (0, 0, 0), v
        assert load.failed == 0 and await cl.actives(QUEUE) == placed
        await wait_until(lambda: _remote_state(cl, "node1", "w1", "Down"), timeout=10, what="w1 Down")
        assert (await cl.status("node1")).quorum_state == "Partial"
