"""A two-node group arbitrated by a LockFile (``--arbiter lockfile``), real node processes:
the link between them cut by the fault proxy, kill -9 and SIGSTOP of the lock holder under
durable producers and consumers.  Every message is accounted for by the checker
(broker.tools.checker): lost, duplicated and unexpected must be 0."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

import client
from broker.tools.checker import classify
from broker.tools.cluster import LocalCluster
from broker.tools.faults import FaultProxy
from client.errors import InvalidArgumentError, StaleDeliveryError, TandemError
from client.protocol.frames import StatusOk
from tests.conftest import FAST, PASSWORD
from tests.helpers import drain_served, tandem, wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.timeout(240)]

LEASE = "1.0"


@asynccontextmanager
async def lock_pair(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    """Two nodes, one lock file, every link behind a fault proxy; in step (ACTIVE/PASSIVE).
    Each node reaches the gateway's directory through a mount point of its own (a symlink,
    ``mount-NODE``), which :func:`cut_gateway` takes away."""
    (tmp_path / "gateway").mkdir()
    args: dict[str, list[str]] = {}
    for name in ("node1", "node2"):
        (tmp_path / f"mount-{name}").symlink_to(tmp_path / "gateway")
        args[name] = ["--lockfile", str(tmp_path / f"mount-{name}" / "tandem.lock")]
    cl = LocalCluster(tmp_path, console=False, nodes=2, base_port=0, password=PASSWORD, proxied=True, node_args=args,
                      extra_args=[*FAST, "--arbiter", "lockfile", "--lease", LEASE])
    await cl.start()
    try:
        await wait_states(cl, {"ACTIVE", "PASSIVE"})
        yield cl
    finally:
        await cl.stop()


async def statuses(cl: LocalCluster) -> dict[str, StatusOk]:
    """The status of every node that runs and answers (a paused one is not asked: it would
    answer only when it wakes)."""
    out = {}
    for name, p in cl.nodes.items():
        if p.proc is None or p.proc.returncode is not None or p.paused:
            continue
        try:
            out[name] = await cl.status(name)
        except (TandemError, OSError):
            continue  # paused or starting: not answering
    return out


async def wait_states(cl: LocalCluster, want: set[str], *, names: list[str] | None = None,
                      timeout: float = 30) -> dict[str, StatusOk]:
    """Until the nodes (``names``, default all) report exactly the HA states ``want``."""
    found: dict[str, StatusOk] = {}

    async def reached() -> bool:
        nonlocal found
        found = await statuses(cl)
        got = {n: st.ha_state for n, st in found.items() if names is None or n in names}
        return len(got) == len(names or cl.nodes) and set(got.values()) == want

    try:
        await wait_until(reached, timeout=timeout, what=f"HA states {sorted(want)}")
    except AssertionError as exc:
        seen = {n: (st.ha_state, st.epoch, st.lock_holder) for n, st in found.items()}
        for n, proc in cl.nodes.items():  # what each node said about its HA state and roles
            print(n, "\n".join(line for line in proc.log_text().splitlines()
                               if "HA state" in line or "LockFile" in line or " -> active" in line)[-6000:])
        raise AssertionError(f"{exc}; last seen {seen}") from None
    return found


def holder_of(sts: dict[str, StatusOk]) -> str:
    serving = [n for n, st in sts.items() if st.ha_state in ("STANDALONE", "ACTIVE_SYNC", "ACTIVE")]
    assert len(serving) == 1, {n: st.ha_state for n, st in sts.items()}
    return serving[0]


def cut_gateway(tmp_path: Path, name: str) -> None:
    """Node ``name`` loses the gateway: its mount point leads nowhere (a dead NFS mount).  The
    link is swapped in one rename: a node that finds no mount point at all makes the lock file's
    directory there, and a swap in two steps could race it."""
    mount, swap = tmp_path / f"mount-{name}", tmp_path / f".mount-{name}.cut"
    swap.symlink_to(tmp_path / "unreachable")
    os.replace(swap, mount)


def peer_proxies(cl: LocalCluster) -> list[FaultProxy]:
    """The proxy of the peer link between the two nodes (not the clients')."""
    a, b = cl.nodes
    return [px for px in cl.proxies[a] if px in cl.proxies[b]]


class Load:
    """A durable producer sending with confirms (``window`` in flight) and a durable consumer
    acking, until stopped; what each saw, with the time of every confirm."""

    def __init__(self, url: str, queue: str, window: int = 20) -> None:
        self.url, self.queue, self.window = url, queue, window
        self.bodies: list[bytes] = []
        self.confirmed: list[bytes] = []
        self.confirm_times: list[float] = []
        self.failed: list[bytes] = []
        self.consumed: list[tuple[bytes, str]] = []
        self.stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.ensure_future(self._produce()), asyncio.ensure_future(self._consume())]

    async def finish(self) -> None:
        self.stop.set()
        await asyncio.gather(*self._tasks)

    async def _produce(self) -> None:
        async with await client.connect(self.url) as conn:
            p = conn.producer(self.queue)

            async def one(b: bytes) -> None:
                try:
                    await p.send(b, key=b.decode())
                    self.confirmed.append(b)
                    self.confirm_times.append(time.monotonic())
                except TandemError:
                    self.failed.append(b)

            n = 0
            while not self.stop.is_set():
                batch = [f"m-{i}".encode() for i in range(n, n + self.window)]
                n += self.window
                self.bodies.extend(batch)
                await asyncio.gather(*(one(b) for b in batch))
                await asyncio.sleep(0.02)  # pacing (at most ~1,000 messages a second): the run's length, not a wait

    async def _consume(self) -> None:
        async with await client.connect(self.url) as conn:
            async with conn.group_consumer(self.queue) as c:
                while not self.stop.is_set():
                    m = await c.next(0.2)
                    if m is None:
                        continue
                    self.consumed.append((m.body, m.id))
                    try:
                        await m.ack()
                    except (StaleDeliveryError, TandemError):
                        pass  # its partition moved: the new active delivers it again

    def pause_after(self, t: float) -> tuple[float, float]:
        """The longest gap between two confirms from ``t`` on (the clients' pause), and the time
        from ``t`` to the confirm that ended it (``t``: when the fault was injected)."""
        times = [t] + [c for c in self.confirm_times if c > t]
        gap, end = max((b - a, b) for a, b in zip(times, times[1:]))
        return gap, end - t


async def test_a_cut_link_leaves_one_serving_and_heals_into_active_passive(tmp_path: Path) -> None:
    async with lock_pair(tmp_path) as cl:
        async with await client.connect(cl.url) as conn:
            await conn.declare_queue("q", partitions=2)
            await conn.producer("q").send_many([f"before-{i}".encode() for i in range(50)])
        holder = holder_of(await statuses(cl))
        other = next(n for n in cl.nodes if n != holder)
        for px in peer_proxies(cl):
            px.cut()
        sts = await wait_states(cl, {"STANDALONE", "WAITING"})
        assert sts[holder].ha_state == "STANDALONE" and sts[other].ha_state == "WAITING"
        epoch = sts[holder].epoch
        # the holder goes on alone; the waiting node never takes the lock while it renews
        async with await client.connect_link(cl.url_of(holder)) as conn:
            await conn.producer("q").send_many([f"alone-{i}".encode() for i in range(50)])
        for _ in range(2 * 4):  # two leases' worth of looks: a lock not renewed for one lease is free
            sts = await statuses(cl)
            assert sts[holder].ha_state == "STANDALONE" and sts[holder].epoch == epoch
            assert sts[other].ha_state == "WAITING" and sts[other].lock_holder in ("", holder)
            assert not [p for p in sts[other].partitions if p.role == "active"]
            await asyncio.sleep(float(LEASE) / 4)  # spacing the looks over the leases, not waiting for a state
        for px in peer_proxies(cl):
            px.heal()
        sts = await wait_states(cl, {"ACTIVE", "PASSIVE"})
        assert sts[holder].ha_state == "ACTIVE" and sts[holder].epoch == epoch and sts[other].lock_holder == holder

        async def caught_up() -> bool:
            s = await statuses(cl)
            mine = {(p.queue, p.partition): p.commit for p in s[holder].partitions}
            theirs = {(p.queue, p.partition): p.last_index for p in s[other].partitions}
            return all(theirs.get(k, -1) >= c for k, c in mine.items())

        await wait_until(caught_up, timeout=30, what="the passive to have every entry the active committed")
        record = tmp_path / "gateway" / "tandem.lock.epoch"
        await wait_until(lambda: not json.loads(record.read_text())["alone"], timeout=10,
                         what="the lock record to say the holder no longer confirms alone")
        # ... and it has them for real: the holder dies, the passive takes over with all of it
        await cl.nodes[holder].kill()
        await wait_states(cl, {"STANDALONE"}, names=[other])
        consumed = await drain_served(cl.url_of(other), "q")
        sent = [f"before-{i}".encode() for i in range(50)] + [f"alone-{i}".encode() for i in range(50)]
        v = classify(sent, sent, consumed)
        assert (v.lost, v.duplicated, v.unexpected) == (0, 0, 0), v


async def test_kill_9_of_the_holder_under_load_the_other_takes_the_lock_and_loses_nothing(tmp_path: Path) -> None:
    async with lock_pair(tmp_path) as cl:
        async with await client.connect(cl.url) as conn:
            await conn.declare_queue("orders", partitions=3)
        holder = holder_of(await statuses(cl))
        other = next(n for n in cl.nodes if n != holder)
        load = Load(cl.url, "orders")
        load.start()
        await wait_until(lambda: len(load.confirmed) >= 300, timeout=60, what="300 confirms before the kill")
        killed_at = time.monotonic()
        await cl.nodes[holder].kill()
        sts = await wait_states(cl, {"STANDALONE"}, names=[other])
        assert sts[other].epoch >= 2 and sts[other].lock_holder == other
        mark = len(load.confirmed)
        await wait_until(lambda: len(load.confirmed) >= mark + 100, timeout=60, what="confirms after the failover")
        await load.finish()
        consumed = load.consumed + await drain_served(cl.url_of(other), "orders")
        v = classify(load.bodies, load.confirmed, consumed)
        gap, took = load.pause_after(killed_at)
        print(f"kill -9 {holder}: {v.as_dict()} confirms resumed on {other} {took:.2f}s after the kill "
              f"(longest gap {gap:.2f}s)")
        assert (v.lost, v.duplicated, v.unexpected) == (0, 0, 0), v


async def test_sigstop_of_the_holder_past_its_lease_the_other_serves_and_the_old_one_confirms_nothing(
        tmp_path: Path) -> None:
    async with lock_pair(tmp_path) as cl:
        async with await client.connect(cl.url) as conn:
            await conn.declare_queue("orders", partitions=3)
        sts = await statuses(cl)
        holder = holder_of(sts)
        other = next(n for n in cl.nodes if n != holder)
        epoch = sts[holder].epoch
        load = Load(cl.url, "orders")
        load.start()
        # a second producer on a plain link to the holder itself: its sends wait in the
        # paused process's socket and meet it when it wakes up
        direct_confirmed: list[bytes] = []
        direct_bodies = [f"direct-{i}".encode() for i in range(200)]

        connected, go = asyncio.Event(), asyncio.Event()

        async def direct() -> None:
            async with await client.connect_link(cl.url_of(holder)) as conn:
                p = conn.producer("orders")
                connected.set()
                await go.wait()

                async def one(b: bytes) -> None:
                    try:
                        await p.send(b, key=b.decode())
                        direct_confirmed.append(b)
                    except TandemError:
                        pass  # refused or cut: never confirmed, so it may be missing

                await asyncio.gather(*(one(b) for b in direct_bodies))

        sending_direct = asyncio.ensure_future(direct())
        await connected.wait()
        await wait_until(lambda: len(load.confirmed) >= 300, timeout=60, what="300 confirms before the pause")
        # in step at the pause: a holder paused while its record says it confirms alone (after a
        # keep-alive missed under load) is rightly waited for, not taken over
        record = tmp_path / "gateway" / "tandem.lock.epoch"
        await wait_until(lambda: not json.loads(record.read_text())["alone"], timeout=10,
                         what="the lock record to say the holder does not confirm alone")
        cl.nodes[holder].pause()
        paused_at = time.monotonic()
        go.set()
        try:
            sts = await wait_states(cl, {"STANDALONE"}, names=[other])
            assert sts[other].epoch > epoch
            mark = len(load.confirmed)
            await wait_until(lambda: len(load.confirmed) >= mark + 100, timeout=60,
                             what=f"confirms from {other} while {holder} is paused")
            gap, took = load.pause_after(paused_at)
        finally:
            cl.nodes[holder].resume()
        resumed = time.monotonic()
        sts = await wait_states(cl, {"ACTIVE", "PASSIVE"})
        print(f"in step again {time.monotonic() - resumed:.2f}s after SIGCONT, {len(load.confirmed)} confirmed")
        assert sts[other].ha_state == "ACTIVE" and sts[holder].ha_state == "PASSIVE", "the old holder stepped down"
        assert sts[holder].epoch == sts[other].epoch > epoch
        await asyncio.wait_for(sending_direct, 60)
        await load.finish()
        log = cl.nodes[holder].log_text()
        print("\n".join(line for line in log.splitlines() if "HA state" in line or "LockFile" in line
                        or "-> follower" in line or "HA-1014" in line)[-4000:])
        assert "-> WAITING" in log, "the old holder stepped down to WAITING when it woke"
        consumed = load.consumed + await drain_served(cl.url_of(other), "orders")
        v = classify(load.bodies + direct_bodies, load.confirmed + direct_confirmed, consumed)
        print(f"SIGSTOP {holder}: {v.as_dict()} confirms resumed on {other} {took:.2f}s after the pause "
              f"(longest gap {gap:.2f}s); "
              f"direct sends confirmed {len(direct_confirmed)} of {len(direct_bodies)}")
        assert (v.lost, v.duplicated, v.unexpected) == (0, 0, 0), v


async def test_status_shows_the_ha_state_epoch_and_holder(tmp_path: Path) -> None:
    async with lock_pair(tmp_path) as cl:
        sts = await statuses(cl)
        holder = holder_of(sts)
        for name, st in sts.items():
            assert st.arbiter == "lockfile" and st.epoch == 1 and st.lock_holder == holder
        names = list(cl.nodes)  # the CLI asks each node, both at once
        answers = await asyncio.gather(*(tandem("status", "--json", "--url", cl.url_of(name)) for name in names))
        for name, (rc, out, err) in zip(names, answers):
            assert rc == 0, err
            d = json.loads(out)
            want = "ACTIVE" if name == holder else "PASSIVE"
            assert (d["arbiter"], d["ha_state"], d["epoch"], d["lock_holder"]) == ("lockfile", want, 1, holder), d
        async with await client.connect_link(cl.url_of(holder)) as conn:
            with pytest.raises(InvalidArgumentError, match="arbiter decides"):
                await conn.set_designated_primary(True)  # the lock decides who goes on alone


async def test_a_holder_cut_from_the_gateway_stops_serving_and_the_other_takes_over(tmp_path: Path) -> None:
    async with lock_pair(tmp_path) as cl:
        async with await client.connect(cl.url) as conn:
            await conn.declare_queue("orders", partitions=3)
        sts = await statuses(cl)
        holder = holder_of(sts)
        other = next(n for n in cl.nodes if n != holder)
        load = Load(cl.url, "orders")
        load.start()
        await wait_until(lambda: len(load.confirmed) >= 300, timeout=60, what="300 confirms before the cut")
        cut_at = time.monotonic()
        cut_gateway(tmp_path, holder)
        await wait_states(cl, {"ACTIVE"}, names=[other])
        await wait_states(cl, {"PASSIVE"}, names=[holder])

        async def follows() -> bool:  # (the old holder names the new one at the next keep-alive it hears)
            sts = await statuses(cl)
            return sts[holder].lock_holder == other and sts[other].epoch == sts[holder].epoch == 2

        await wait_until(follows, timeout=30, what=f"{holder} naming {other} the holder, both at epoch 2")
        mark = len(load.confirmed)
        await wait_until(lambda: len(load.confirmed) >= mark + 100, timeout=60, what=f"confirms from {other}")
        await load.finish()
        gap, took = load.pause_after(cut_at)
        consumed = load.consumed + await drain_served(cl.url_of(other), "orders")
        v = classify(load.bodies, load.confirmed, consumed)
        print(f"gateway cut from {holder}: {v.as_dict()} confirms resumed on {other} {took:.2f}s after the cut "
              f"(longest gap {gap:.2f}s)")
        assert "renewal failed" in cl.nodes[holder].log_text()
        assert (v.lost, v.duplicated, v.unexpected) == (0, 0, 0), v


async def test_what_a_holder_confirmed_alone_is_never_lost_the_other_waits_for_it(tmp_path: Path) -> None:
    """Cut from its peer, the holder confirms alone (the record says so); killed then, the
    other does NOT take the lock over (it lacks those writes): the group waits for the
    holder, which serves again when it is back, with everything it confirmed."""
    async with lock_pair(tmp_path) as cl:
        async with await client.connect(cl.url) as conn:
            await conn.declare_queue("q", partitions=2)
            await conn.producer("q").send_many([f"before-{i}".encode() for i in range(20)])
        holder = holder_of(await statuses(cl))
        other = next(n for n in cl.nodes if n != holder)
        for px in peer_proxies(cl):
            px.cut()
        await wait_states(cl, {"STANDALONE", "WAITING"})
        alone = [f"alone-{i}".encode() for i in range(20)]
        async with await client.connect_link(cl.url_of(holder)) as conn:
            await conn.producer("q").send_many(alone)
        record = tmp_path / "gateway" / "tandem.lock.epoch"
        await wait_until(lambda: json.loads(record.read_text())["alone"], timeout=10,
                         what="the lock record to say the holder confirms alone")
        await cl.nodes[holder].kill()
        await wait_until(lambda: "does not take the lock over" in cl.nodes[other].log_text(), timeout=30,
                         what=f"{other} refusing a lock whose holder confirmed alone")
        assert (await cl.status(other)).ha_state == "WAITING"
        for px in peer_proxies(cl):
            px.heal()
        await cl.nodes[holder].start()  # it takes its lock again and brings the other up to date
        sts = await wait_states(cl, {"ACTIVE", "PASSIVE"})
        assert sts[holder].ha_state == "ACTIVE" and sts[other].lock_holder == holder
        consumed = await drain_served(cl.url_of(holder), "q")
        before = [f"before-{i}".encode() for i in range(20)]
        v = classify(before + alone, before + alone, consumed)
        assert (v.lost, v.duplicated, v.unexpected) == (0, 0, 0), v
