"""Replication groups of real node processes on loopback, with faults injected where the
process is the point: kill -9 of an active, two-node groups, `tandem cluster up`, the SDK's
retries, the log's files, the stores, disks stalled (and helpers other modules use: node3
cut off by fault-injecting proxies).  Every message is accounted for by the checker
(broker.tools.checker): lost, duplicated and unexpected must be 0.  What needs no OS process
(elections, failback, priority 0, async replicas, quorum override, what goes in a log entry,
a member that has not applied a declare) runs on the in-process group harness, tests/harness/."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import client
from broker.tools.checker import classify
from broker.tools.cluster import LocalCluster
from broker.tools.faults import FaultProxy, stall_disk
from broker.config import ALIVE_GIVE_UP
from client.errors import StaleDeliveryError, TandemError, UnavailableError
from client.mapper import make_mapper
from client.protocol.frames import StatusOk
from tests.helpers import drain_served, free_base_port, tandem, wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.timeout(240)]

from tests.conftest import FAST, running_group


async def actives(cl: LocalCluster, queue: str, partitions: int) -> dict[int, str]:
    """Once every partition has an active: partition -> node."""
    found: dict[int, str] = {}

    async def all_active() -> bool:
        nonlocal found
        found = await cl.actives(queue)
        return len(found) == partitions

    await wait_until(all_active, timeout=30, what=f"an active for each partition of {queue}")
    return found


async def drain(url: str, queue: str, idle: float = 3.0, expect: int | None = None,
                then: float = 1.0) -> list[tuple[bytes, str]]:
    """Consume the whole queue (every member) until ``idle`` seconds pass without a message;
    once ``expect`` messages have come, until ``then`` seconds pass without another (one
    more, a message stored twice, comes with the rest: the queue holds it already)."""
    out: list[tuple[bytes, str]] = []
    async with await client.connect(url) as conn:
        async with conn.group_consumer(queue) as c:
            while True:
                m = await c.next(then if expect is not None and len(out) >= expect else idle)
                if m is None:
                    return out
                out.append((m.body, m.id))
                try:
                    await m.ack()
                except StaleDeliveryError:
                    pass  # its partition failed over meanwhile: the new active delivers it again


async def _send_one(p: Any, b: bytes, confirmed: list[bytes], failed: list[bytes]) -> float:
    """Send ``b`` (its own key) with a confirm, into ``confirmed`` or ``failed``; the wait (s)."""
    t = time.monotonic()
    try:
        await p.send(b, key=b.decode())
        confirmed.append(b)
    except TandemError:
        failed.append(b)
    return time.monotonic() - t


async def produce(url: str, queue: str, bodies: list[bytes], confirmed: list[bytes], failed: list[bytes],
                  window: int = 20) -> float:
    """Send with confirms, ``window`` in flight; returns the longest wait for a confirm (s)."""
    longest = 0.0
    async with await client.connect(url) as conn:
        p = conn.producer(queue)

        async def one(b: bytes) -> None:
            nonlocal longest
            longest = max(longest, await _send_one(p, b, confirmed, failed))

        for i in range(0, len(bodies), window):
            await asyncio.gather(*(one(b) for b in bodies[i:i + window]))
    return longest


async def test_kill_9_of_an_active_loses_no_confirmed_message(trio: LocalCluster) -> None:
    cl = trio
    async with await client.connect(cl.url) as conn:
        await conn.declare_queue("orders", partitions=3)
    act = await actives(cl, "orders", 3)
    victim = act[0]
    survivor = next(n for n in cl.nodes if n != victim)
    bodies = [f"order-{i}".encode() for i in range(1500)]
    confirmed: list[bytes] = []
    failed: list[bytes] = []
    sending = asyncio.ensure_future(produce(cl.url_of(survivor), "orders", bodies, confirmed, failed))
    await wait_until(lambda: len(confirmed) >= 300, timeout=60, what="300 confirms before the kill")
    await cl.nodes[victim].kill()  # kill -9 of the active of partition 0, producers still sending
    longest = await sending
    after = await actives(cl, "orders", 3)
    assert victim not in after.values()
    consumed = await drain_served(cl.url_of(survivor), "orders")
    v = classify(bodies, confirmed, consumed)
    print(f"kill -9 {victim}: {v.as_dict()} longest confirm wait {longest:.2f}s")
    assert len(confirmed) >= 1400, f"producers did not continue after the failover: {v}"
    assert (v.lost, v.duplicated, v.unexpected) == (0, 0, 0), v


async def test_two_node_group_stops_writes_without_a_designated_primary(tmp_path: Path) -> None:
    cl = LocalCluster(tmp_path, console=False, nodes=2, base_port=0, password="test-password", extra_args=FAST)
    await cl.start()
    try:
        await cl.wait_ready()
        async with await client.connect(cl.url_of("node1")) as conn:
            await conn.declare_queue("q", partitions=2)
            await conn.producer("q").send_many([b"before-1", b"before-2"])
        await actives(cl, "q", 2)
        await cl.nodes["node2"].kill()
        async with await client.connect_link(cl.url_of("node1")) as conn:  # node1's own answers
            async def refused() -> bool:
                try:
                    await conn.producer("q").send(b"refused")
                except UnavailableError:
                    return True
                return False

            await wait_until(refused, timeout=30, what="node1 to refuse writes alone")
            st = await conn.set_designated_primary(True)
            assert st.designated_primary and st.quorum_state != "Disabled"
            await conn.producer("q").send(b"after")  # the survivor goes on alone
        assert set((await actives(cl, "q", 2)).values()) == {"node1"}  # (node2 stays down)
        consumed = await drain_served(cl.url_of("node1"), "q")
        got = sorted(b for b, _ in consumed)
        assert b"after" in got and b"before-1" in got and b"before-2" in got
    finally:
        await cl.stop()


async def _disabled(conn: client.Connection) -> bool:
    return (await conn.status()).quorum_state == "Disabled"


async def _node3_behind_proxies(cl: LocalCluster) -> list[FaultProxy]:
    """node1 and node2 dial node3 (names sort): both links to node3 go through proxies (before start)."""
    proxies = [await FaultProxy(("127.0.0.1", cl.peer_ports["node3"])).start() for _ in range(2)]
    cl.route("node1", "node3", proxies[0].address)
    cl.route("node2", "node3", proxies[1].address)
    return proxies


async def q_then_node3_cut(cl: LocalCluster, proxies: list[FaultProxy]) -> None:
    """Once the group is ready: queue ``q`` (3 partitions, each with an active, and every
    member following it with the same active), then node3 cut off from node1 and node2
    (``proxies``: :func:`_node3_behind_proxies`; or whatever links they cut)."""
    await cl.wait_ready()
    async with await client.connect(cl.url_of("node1")) as conn:
        await conn.declare_queue("q", partitions=3)
    await actives(cl, "q", 3)

    async def everywhere() -> bool:  # (a member that has not applied the declare yet has nothing to go on alone)
        views = [{p.partition: p.active for p in (await cl.status(n)).partitions if p.queue == "q"}
                 for n in cl.nodes]
        return all(len(v) == 3 and all(v.values()) and v == views[0] for v in views)

    await wait_until(everywhere, timeout=30, what="every member following each partition of q")
    for p in proxies:
        p.cut()


async def override_and_write(iso: client.Connection, queue: str, body: bytes,
                             key: str | None = None) -> client.Producer:
    """Set ``quorum_override 1`` on the isolated node ``iso`` and send ``body`` (its own key
    unless ``key``) there until it is confirmed (the override takes effect within a moment);
    the producer."""
    await iso.set_quorum_override(1)
    alone = iso.producer(queue)

    async def took_it() -> bool:
        try:
            async with asyncio.timeout(3):
                await alone.send(body, key=key or body.decode())
            return True
        except (TandemError, TimeoutError):
            return False

    await wait_until(took_it, timeout=30, what="the isolated node to take a write under the override")
    return alone


async def test_cluster_up_serves_a_group_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    import json
    import os
    import signal
    import sys


    base = free_base_port()
    env = {**os.environ, "TANDEM_ADMIN_PASSWORD": "test-password"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "broker.cli", "cluster", "up", "--nodes", "3", "--base-port", str(base),
        "--data-dir", str(tmp_path / "group"), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env=env)
    try:
        assert proc.stdout is not None
        url_line = ""
        seen: list[str] = []
        async with asyncio.timeout(90):
            while "client URL" not in url_line:
                line = await proc.stdout.readline()
                assert line, "cluster up exited before printing its URL:\n" + "".join(seen)
                url_line = line.decode()
                seen.append(url_line)
        hosts = url_line.split("tandem://admin@", 1)[1].strip()
        assert hosts == f"127.0.0.1:{base},127.0.0.1:{base + 10},127.0.0.1:{base + 20}"
        url = f"tandem://admin:test-password@{hosts}"
        rc, out, err = await tandem("produce", "orders", "a", "b", "c", "--declare", "3", "--url",
                                    f"tandem://admin:test-password@127.0.0.1:{base + 10}")
        assert rc == 0, err
        rc, out, err = await tandem("consume", "orders", "-n", "3", "--timeout", "10", "--url", url, "--json")
        assert rc == 0, err
        assert sorted(json.loads(line)["body"] for line in out.splitlines()) == ["a", "b", "c"]
        rc, out, err = await tandem("status", "--url", url, "--json")
        st = json.loads(out)
        assert {r["name"] for r in st["remotes"]} | {st["node"]} == {"node1", "node2", "node3"}
        assert len([p for p in st["partitions"] if p["queue"] == "orders"]) == 3
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
        async with asyncio.timeout(60):
            assert await proc.wait() == 0  # every node stopped cleanly


def log_segments(cl: LocalCluster, name: str) -> list[Path]:
    """Node ``name``'s replication log files, oldest first."""
    return sorted((cl.data_dir / name / "tandem.db-log").glob("*.seg"))


async def test_the_log_is_compacted_by_size_as_well(tmp_path: Path) -> None:
    """Entries of big batches are big: a partition's log (on disk, and in memory) is
    compacted once its applied entries reach COMPACT_BYTES, not only every 4,000 entries
    (which at 8 MiB an entry would be 32 GiB); and the log's files on disk shrink with it
    (a segment goes once all of it is compacted: 4 MiB segments here)."""
    from broker.modes.replicated import COMPACT_BYTES

    segment = 4 * 1024 * 1024
    async with running_group(tmp_path, "--log-segment-size", str(segment)) as cl:
        async with await client.connect(cl.url) as conn:
            await conn.declare_queue("big", partitions=1)
            p = conn.producer("big")
            body = b"x" * 65536
            for _ in range(12):  # 96 MiB, in ~10 entries of up to 8 MiB
                await p.send_many([body] * 100)

        def log_bytes(name: str) -> int:
            """The node's log files' size; a segment compacted away between the listing
            and its stat counts for nothing (the node is running)."""
            total = 0
            for f in log_segments(cl, name):
                try:
                    total += f.stat().st_size
                except FileNotFoundError:
                    pass
            return total

        assert max(log_bytes(n) for n in cl.nodes) > 0  # (where the log is kept)
        # compaction runs when an apply passes the mark; whole segments go, the newest stays
        bound = COMPACT_BYTES + 8 * 1024 * 1024 + 2 * segment
        await wait_until(lambda: all(log_bytes(n) <= bound for n in cl.nodes), timeout=60,
                         what=f"every node's log compacted under {bound} bytes")


async def test_quiet_partitions_do_not_keep_the_log_files(tmp_path: Path) -> None:
    """Only the oldest segment of the log's files can go, and only once every entry in it
    is compacted.  A quiet partition (and the catalogue: queue declares are entries too)
    compacts only every 4,000 entries, so its few entries would keep the oldest segment,
    and with it every later one, forever: the nodes compact such partitions past it."""
    segment = 1024 * 1024
    async with running_group(tmp_path, "--log-segment-size", str(segment)) as cl:
        async with await client.connect(cl.url) as conn:
            await conn.declare_queue("quiet", partitions=1)
            await conn.producer("quiet").send(b"a message that stays")
            await conn.declare_queue("busy", partitions=1)
            await actives(cl, "busy", 1)  # (every node has applied the declare)
            p = conn.producer("busy")
            async with conn.consumer("busy") as c:  # consumed: the store does not keep them
                for _ in range(8):  # 32 MiB: past the busy partition's first compaction (COMPACT_BYTES)
                    await p.send_many([b"y" * 65536] * 64)
                    for _ in range(64):
                        m = await c.next(30)
                        assert m is not None
                        await m.ack()

            def segments(name: str) -> list[int]:
                return [int(f.stem) for f in log_segments(cl, name)]

            # The first segment (the declares, the quiet message) goes, and the rest with it
            # down to what compaction by size keeps of the busy partition, plus the newest.
            from broker.modes.replicated import COMPACT_BYTES
            bound = (COMPACT_BYTES + 8 * 1024 * 1024) // segment + 2
            await wait_until(lambda: all(segments(n)[0] > 1 and len(segments(n)) <= bound for n in cl.nodes),
                             timeout=60, what=f"every node's first log segment gone, and at most {bound} left")
            # and the quiet partition's message is still there, on whichever node is active
            async with conn.consumer("quiet") as c:
                m = await c.next(30)
                assert m is not None and m.body == b"a message that stays"


async def test_a_quiet_partition_reaches_every_store(trio: LocalCluster) -> None:
    """The store writes of committed entries are held back (HOLD_APPLY) for the entries
    after them: with no traffic after them, they still reach every node's store, and a
    stream read (which stops at the store's end) returns them, made on any member."""
    import sqlite3

    cl = trio
    async with await client.connect(cl.url) as conn:
        await conn.declare_queue("quiet", partitions=1)
        await conn.producer("quiet").send_many([f"m{i}".encode() for i in range(5)])

    def stored(name: str) -> int:
        db = sqlite3.connect(f"file:{cl.data_dir / name / 'tandem.db'}?mode=ro", uri=True)
        try:
            return int(db.execute("SELECT coalesce(sum(count), 0) FROM chunks WHERE queue_id > 0").fetchone()[0])
        finally:
            db.close()

    await wait_until(lambda: all(stored(n) == 5 for n in cl.nodes), timeout=30,
                     what="the 5 messages in every node's store")
    for name in cl.nodes:  # the active reads its store; the others forward the read to it
        async with await client.connect_link(cl.url_of(name)) as link:
            msgs, _next, end = await link.read("quiet", 0)
        assert [m.body for m in msgs] == [f"m{i}".encode() for i in range(5)] and end == 5, name


class _Forever:
    """A back-off that never ends within a test: a retry can only come from something else."""

    def next(self) -> float:
        return 3600.0

    def reset(self) -> None:
        pass


async def test_a_producer_retries_a_partition_as_soon_as_the_map_names_its_new_active(trio: LocalCluster) -> None:
    """After its active dies, a partition's sends wait out a back-off that grows while the
    group elects a new active (up to a second a wait). A map naming the new active ends the
    wait: here the back-off never ends, so only that can deliver the send."""
    cl = trio
    async with await client.connect(cl.url) as conn:
        await conn.declare_queue("moved", partitions=1)
    victim = (await actives(cl, "moved", 1))[0]
    bodies = [f"m{i}".encode() for i in range(3000)]
    async with await client.connect(cl.url, send_timeout=120) as conn:
        p = conn.producer("moved", max_batch=10)
        futs = [p.send_nowait(b) for b in bodies]
        await wait_until(lambda: p.confirmed >= 300, timeout=60, what="300 confirms before the kill")
        assert p._parts
        for part in p._parts:
            part.backoff = _Forever()  # type: ignore[assignment]
        await cl.nodes[victim].kill()  # batches in flight fail with it
        await asyncio.wait_for(asyncio.gather(*futs), timeout=60)
    after = await actives(cl, "moved", 1)
    assert after[0] != victim
    consumed = await drain_served(cl.url_of(after[0]), "moved")
    v = classify(bodies, bodies, consumed)
    assert (v.lost, v.duplicated, v.unexpected) == (0, 0, 0), v


async def test_every_store_reaches_the_commit_index_after_a_replica_catches_up(tmp_path: Path) -> None:
    """Store writes are held back (HOLD_APPLY), the log compacts past COMPACT_EVERY while a
    replica is stopped, and the replica catches up (by snapshot or entries) under traffic.
    Once quiet, every node's store stands at the commit index: its rows and its applied
    position agree with the log.  (A compaction-only Ready right after a held position is
    not forced here: tests/unit/test_compaction.py pins the rule that keeps the newest
    position.)"""
    import sqlite3

    # (the log written to the OS, not synced: a confirm per entry costs no fsync; not what this is about)
    async with running_group(tmp_path, "--sync", "WRITE_NO_SYNC") as cl:
        async with await client.connect(cl.url) as conn:
            await conn.declare_queue("lagging", partitions=1)
        active = (await actives(cl, "lagging", 1))[0]
        lag = next(n for n in cl.nodes if n != active)
        cl.nodes[lag].pause()
        async with await client.connect(cl.url_of(active)) as conn:
            p = conn.producer("lagging")
            for i in range(4300):  # one entry each: past COMPACT_EVERY (4,000) while it lags
                await p.send(f"m{i}".encode())
            cl.nodes[lag].resume()
            for i in range(4300, 5000):  # and on, while it catches up
                await p.send(f"m{i}".encode())

        def stored_applied(name: str) -> int:
            db = sqlite3.connect(f"file:{cl.data_dir / name / 'tandem.db'}?mode=ro", uri=True)
            try:
                row = db.execute("SELECT applied_index FROM ha_state WHERE queue_id > 0").fetchone()
                return int(row[0] or 0) if row else 0
            finally:
                db.close()

        async def settled() -> bool:
            st = await cl.status(active)
            commit = next(pi.commit for pi in st.partitions if pi.queue == "lagging")
            return all(stored_applied(n) == commit for n in cl.nodes)

        await wait_until(settled, timeout=60, what="every store at the commit index")
        st = await cl.status(active)
        assert next(pi.commit for pi in st.partitions if pi.queue == "lagging") >= 5000, st.partitions


async def send_until(url: str, queue: str, stop: asyncio.Event, bodies: list[bytes], confirmed: list[bytes],
                     failed: list[bytes], window: int = 20, *, prefix: str = "order",
                     keep: Callable[[str], bool] = lambda key: True, waits: list[float] | None = None) -> None:
    """Send with confirms, ``window`` in flight, new bodies until ``stop`` is set; each body
    is its own key, ``prefix-N``, those ``keep`` takes (to aim at some partitions only);
    each send's wait for its confirm goes to ``waits``."""
    async with await client.connect(url) as conn:
        p = conn.producer(queue)

        async def one(b: bytes) -> None:
            wait = await _send_one(p, b, confirmed, failed)
            if waits is not None:
                waits.append(wait)

        n = 0
        while not stop.is_set():
            batch: list[bytes] = []
            while len(batch) < window:
                key = f"{prefix}-{n}"
                n += 1
                if keep(key):
                    batch.append(key.encode())
            bodies.extend(batch)
            await asyncio.gather(*(one(b) for b in batch))


async def _stall_partition_0s_replicas(tmp_path: Path, seconds: float) -> tuple[str, int, StatusOk, list[float]]:
    """A group, producers on every partition (partition 0 on a producer of its own, so that
    it has writes in flight all through), the disks of both replicas of partition 0 stopped
    for ``seconds``, then writes again.  Checks every message (none lost, duplicated,
    unexpected or failed) and returns (partition 0's active before, its term before, the
    status of that node after, partition 0's waits for confirms)."""
    async with running_group(tmp_path) as cl:
        async with await client.connect(cl.url) as conn:
            await conn.declare_queue("orders", partitions=3)

        async def spread() -> bool:  # each node active for one partition, as placed
            return len(set((await actives(cl, "orders", 3)).values())) == 3

        # The stall reaches partition 0's replies through the replicas' own fsyncs, which
        # they make as actives of the other partitions and as its replicas (SYNC, the default).
        await wait_until(spread, timeout=60, what="the partitions' actives on three nodes")
        active = (await actives(cl, "orders", 3))[0]
        replicas = [n for n in cl.nodes if n != active]
        mapper = make_mapper("jump_hash", 3, 1024)  # declare_queue's default
        before = term_of_0(await cl.status(active))
        bodies: list[bytes] = []
        confirmed: list[bytes] = []
        failed: list[bytes] = []
        stop = asyncio.Event()
        waits: list[float] = []
        sending = [asyncio.ensure_future(send_until(cl.url_of(active), "orders", stop, bodies, confirmed, failed,
                                                    prefix=prefix, keep=keep, waits=w))
                   for prefix, keep, w in (("zero", lambda k: mapper.partition(k) == 0, waits),
                                           ("rest", lambda k: mapper.partition(k) != 0, None))]
        await wait_until(lambda: len(confirmed) >= 300, timeout=60, what="300 confirms before the stall")
        pids = [p.pid for p in (cl.nodes[n].proc for n in replicas) if p is not None]
        assert len(pids) == 2, "both replicas running"
        await stall_disk(pids, seconds)
        mark = len(confirmed)
        await wait_until(lambda: len(confirmed) >= mark + 300, timeout=60, what="writes after the stall")
        stop.set()
        await asyncio.gather(*sending)
        await actives(cl, "orders", 3)
        st = await cl.status(active)
        consumed = await drain_served(cl.url_of(active), "orders")
        v = classify(bodies, confirmed, consumed)
        print(f"disks of {replicas} stalled {seconds} s: {v.as_dict()}, {len(failed)} failed")
        assert (v.lost, v.duplicated, v.unexpected) == (0, 0, 0), v
        assert not failed, f"{len(failed)} publishes failed"
        return active, before, st, waits


def term_of_0(st: StatusOk) -> int:
    return next(p.term for p in st.partitions if p.queue == "orders" and p.partition == 0)


async def test_a_stalled_disk_on_both_replicas_does_not_depose_the_active(tmp_path: Path) -> None:
    """The disks of both replicas of partition 0 stop for four times ``non_response_timeout``
    while producers send.  Their writer threads wait for their own partitions' fsyncs, and
    partition 0's replies to its active wait behind them; but they tell it they are up
    (Alive): it stays the active, in the same term, and takes writes again once the disks
    do, with no election."""
    active, before, st, waits = await _stall_partition_0s_replicas(tmp_path, 4 * 0.5)  # FAST: 0.5 s
    # the stall took: partition 0's confirms waited for the replicas' disks
    assert max(waits) >= 1.0, f"longest wait for a partition-0 confirm {max(waits):.2f} s"
    assert st.partitions and any(p.queue == "orders" and p.partition == 0 and p.active == active
                                 for p in st.partitions), st.partitions
    assert term_of_0(st) == before, st.events
    assert not any("heard from" in e for e in st.events), st.events


async def test_a_disk_stuck_past_alive_give_up_fails_its_partitions_over(tmp_path: Path) -> None:
    """Stuck for longer than ALIVE_GIVE_UP non-response timeouts (5 s here, of a 7 s stall), the replicas stop
    saying they are up: the active steps down ("heard from 1 of 3 voters") rather than hold
    its clients' confirms for ever, and once the disks go on, the partition serves again
    with nothing lost.  (The step-down comes a non-response timeout after the give-up, 5.5 s
    into the stall: the rest is slack for a loaded machine.)"""
    stall = ALIVE_GIVE_UP * 0.5 + 2  # FAST: non_response_timeout 0.5 s
    _active, before, st, waits = await _stall_partition_0s_replicas(tmp_path, stall)
    assert max(waits) >= ALIVE_GIVE_UP * 0.5, f"longest wait for a partition-0 confirm {max(waits):.2f} s"
    assert any("heard from" in e for e in st.events), st.events
    assert term_of_0(st) > before
