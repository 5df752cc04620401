"""Runs one workload against one system and measures it.

Two phases per system, each on a fresh queue of its own (``drv.setup`` before each), so
that nothing one phase left behind (a peer's client that closes with deliveries it had not
acked, say, whose broker then delivers them again) is counted in the other:

1. *throughput*: ``producers`` publishers (each ``window`` confirms in flight)
   and ``consumers`` consumers (manual acks, ``prefetch``) run at once;
   ``publish_per_s`` = messages / time to the last confirm, ``consume_per_s`` =
   messages / time to the last consumed message, both from the first send.
2. *latency*: one publisher paced at ``latency_rate`` msg/s, consumers on;
   ``confirm_ms`` are the percentiles of publish-to-confirm times.

Server CPU: when the system's server processes are known (the nodes the bench spawned, or
a peer's server found on this machine, see :class:`ServerProcs`), their user + system CPU
time is read before and after each phase and divided by the phase's messages (each one
published once and consumed once): ``server_cpu_us_per_msg``. Otherwise the figure is
``None`` and ``server_cpu["reason"]`` says why.

The checker then counts lost (confirmed, never consumed), duplicated and
unexpected messages: the run fails if any is non-zero.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import client
from broker.tools.bench.workload import Checker, Driver, Publisher, RunResult, Workload, percentile
from broker.tools.cluster import LocalCluster
from broker.tools.process import NodeProcess
from client.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger("tandem.bench")


def _ms(lat: list[float]) -> dict[str, float]:
    return {
        "p50": round(percentile(lat, 50) * 1000, 3),
        "p99": round(percentile(lat, 99) * 1000, 3),
        "max": round(max(lat) * 1000, 3) if lat else 0.0,
    }


async def _phase(drv: Driver, w: Workload, first_id: int, count: int, producers: int, rate: float,
                 clock: Clock, *, sequential: bool = False) -> tuple[float, float, Checker, list[Publisher]]:
    """Publish ``count`` messages and consume them; (publish seconds, consume seconds, ...).

    Concurrent: consumers run from the start and both times count from the first
    send.  ``sequential``: consumers start when every publish is confirmed, and the
    consume time counts from then (each side measured alone).
    """
    checker = Checker(count, base=first_id)
    pubs = [await drv.publisher(w) for _ in range(producers)]
    per = -(-count // producers)
    ranges = [range(first_id + k * per, min(first_id + count, first_id + (k + 1) * per)) for k in range(producers)]

    def start_consumers() -> list[asyncio.Task[None]]:
        return [asyncio.create_task(drv.consume(w, checker), name=f"bench-consumer-{i}")
                for i in range(w.consumers)]

    t0 = clock.monotonic()
    consumers = [] if sequential else start_consumers()
    try:
        pub_rate = rate / producers if rate else 0.0
        await asyncio.wait_for(asyncio.gather(*(p.run(r, w.size, pub_rate) for p, r in zip(pubs, ranges))),
                               w.timeout)
        t_pub = clock.monotonic() - t0
        if sequential:
            t0 = clock.monotonic()
            consumers = start_consumers()
        confirmed = sum(p.confirmed for p in pubs)
        if confirmed == count:
            done = asyncio.ensure_future(checker.done.wait())
            failed = asyncio.ensure_future(asyncio.wait(consumers, return_when=asyncio.FIRST_EXCEPTION))
            await asyncio.wait([done, failed], timeout=w.timeout, return_when=asyncio.FIRST_COMPLETED)
            done.cancel()
            failed.cancel()
            for t in consumers:
                if t.done() and not t.cancelled() and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
        t_cons = clock.monotonic() - t0
    finally:
        for t in consumers:
            t.cancel()
        await asyncio.gather(*consumers, return_exceptions=True)
        for p in pubs:
            await p.close()
    return t_pub, t_cons, checker, pubs


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a running process so far (Linux ``/proc``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class ServerProcs:
    """A system's server processes on this machine, or why they are not measured."""

    pids: tuple[int, ...] = ()
    what: str = ""  # which processes, for the report ("nats-server pid 2955 (listens on :4222)")
    reason: str | None = None  # set when ``pids`` is empty: why there is no server figure


def _cpu_now(servers: ServerProcs | None) -> tuple[float, float | None]:
    t = os.times()
    total: float | None = None
    if servers is not None and servers.pids:
        try:
            total = sum(process_cpu_seconds(pid) for pid in servers.pids)
        except (OSError, ValueError, IndexError):
            total = None  # not Linux, or a process is gone: no server figure
    return t.user + t.system, total


def _server_us(cpu0: tuple[float, float | None], cpu1: tuple[float, float | None], n: int) -> float | None:
    if not n or cpu0[1] is None or cpu1[1] is None:
        return None
    return round((cpu1[1] - cpu0[1]) / n * 1e6, 1)


async def run_system(drv: Driver, w: Workload, *, clock: Clock = SYSTEM_CLOCK,
                     servers: Callable[[], ServerProcs] | None = None, mode: str = "") -> RunResult:
    """``servers``: finds the system's server processes (called after the first setup, so
    a driver may learn them from its connection); ``mode``: how it runs, for the report."""
    res = RunResult(system=drv.name, messages=w.messages, durability=drv.durability, mode=mode)
    t_start = clock.monotonic()
    procs = ServerProcs(reason="not measured")
    try:
        await drv.setup(w)
        if servers is not None:
            try:
                procs = servers()
            except Exception as exc:  # finding them must never cost the run
                procs = ServerProcs(reason=f"could not look for the server processes: {exc!r}")
        res.server_cpu = {"processes": procs.what or None, "reason": procs.reason,
                          "per": "message published and consumed in the phase"}
        cpu0 = _cpu_now(procs)
        t_pub, t_cons, checker, pubs = await _phase(drv, w, 0, w.messages, w.producers, 0.0, clock,
                                                    sequential=w.sequential)
        cpu1 = _cpu_now(procs)
        if w.messages:
            res.cpu_us_per_msg["client"] = round((cpu1[0] - cpu0[0]) / w.messages * 1e6, 1)
            us = _server_us(cpu0, cpu1, w.messages)
            if us is not None:
                res.cpu_us_per_msg["servers"] = us
                res.server_cpu_us_per_msg = {"throughput": us}
            elif procs.pids:
                res.server_cpu["reason"] = "a server process ended during the phase"
        res.confirmed = sum(p.confirmed for p in pubs)
        res.consumed = checker.unique
        res.publish_per_s = round(w.messages / t_pub, 1) if t_pub else 0.0
        res.consume_per_s = round(checker.unique / t_cons, 1) if t_cons else 0.0
        res.confirm_ms_saturated = _ms([x for p in pubs for x in p.latencies])
        res.lost = checker.lost(res.confirmed)
        res.duplicated = checker.duplicated
        res.unexpected = checker.unexpected
        errors = [p.first_error for p in pubs if p.first_error is not None]
        if errors:
            res.error = f"{sum(p.failed for p in pubs)} publish(es) failed: {errors[0]!r}"
        if w.latency_rate > 0 and w.latency_messages > 0:
            await drv.setup(w)
            cpu0 = _cpu_now(procs)
            _tp, _tc, lchk, lpubs = await _phase(drv, w, w.messages, w.latency_messages, 1, w.latency_rate, clock)
            us = _server_us(cpu0, _cpu_now(procs), w.latency_messages)
            if us is not None and res.server_cpu_us_per_msg is not None:
                res.server_cpu_us_per_msg["latency"] = us
            res.confirm_ms = _ms(lpubs[0].latencies)
            lconf = lpubs[0].confirmed
            res.lost += lchk.lost(lconf)
            res.duplicated += lchk.duplicated
            res.unexpected += lchk.unexpected
    except Exception as exc:  # one system failing must not lose the others' figures
        log.exception("bench %s failed", drv.name)
        res.error = f"{type(exc).__name__}: {exc}"
    finally:
        try:
            await drv.teardown()
        except Exception as exc:
            log.warning("bench %s teardown failed: %r", drv.name, exc)
        res.seconds = round(clock.monotonic() - t_start, 2)
    return res


class TandemDriver:
    """Tandem through its own SDK: one connection per publisher and per consumer."""

    name = "tandem"

    def __init__(self, url: str, durability: str = "SYNC", *, relayed: bool = False,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        self.url = url
        self.durability = durability
        #: consumers on one node (a plain link to the URL's first), the others' partitions relayed
        self.relayed = relayed
        self.queue = ""
        self._queues: list[str] = []  # every queue setup made, for teardown
        self._conns: list[client.DurableConnection] = []

    async def _connect(self) -> client.DurableConnection:
        conn = await client.connect(self.url, client_name="tandem-bench")
        self._conns.append(conn)
        return conn

    async def setup(self, w: Workload) -> None:
        """Declare a fresh queue for the phase to come, and wait until its partitions have actives."""
        conn = self._conns[0] if self._conns else await self._connect()
        self.queue = f"bench-{uuid.uuid4().hex[:8]}"
        await conn.declare_queue(self.queue, partitions=w.partitions)
        self._queues.append(self.queue)
        # In a group a new queue's partitions elect their actives first, and every member learns
        # of the queue (a consumer subscribes on each): not part of the figures.
        async with asyncio.timeout(w.timeout):
            while True:
                st = await conn.status()
                mine = [p for p in st.partitions if p.queue == self.queue and p.active]
                if not st.partitions or len(mine) == w.partitions:
                    break
                await self.clock.sleep(0.05)  # polling a remote state, bounded by the timeout
            if st.mode != "replicated":
                return  # single node, or shared mode: one active serves every client
            primary = await conn.primary()
            while not all(r.state == "Up" for r in st.remotes):  # a link still coming up
                await self.clock.sleep(0.05)
                st = await conn.status()
            for r in st.remotes:
                if not r.client_address:
                    continue  # a witness: no clients, no queues
                member = await primary.sibling(r.name, r.client_address)
                while sum(p.queue == self.queue for p in (await member.status()).partitions) < w.partitions:
                    await self.clock.sleep(0.05)

    async def publisher(self, w: Workload) -> Publisher:
        conn = await self._connect()
        producer = conn.producer(self.queue)
        return Publisher(lambda body: producer.send_nowait(body), window=w.window)

    async def consume(self, w: Workload, checker: Checker) -> None:
        if self.relayed:  # one node, which relays the partitions active on the others
            link = await client.connect_link(self.url, client_name="tandem-bench")
            try:
                await _until_done(await link.consumer(self.queue, prefetch=w.prefetch).start(), checker)
            finally:
                await link.close()
            return
        conn = await self._connect()
        # every member: in a group each delivers the partitions it is active for
        c = await conn.group_consumer(self.queue, prefetch=w.prefetch).start()
        try:
            await _until_done(c, checker)
        finally:
            if not conn.is_closed:
                await c.cancel()

    async def teardown(self) -> None:
        if self._conns:
            try:
                for q in self._queues:
                    await self._conns[0].delete_queue(q)
                self._queues.clear()
            finally:
                for c in self._conns:
                    await c.close()
                self._conns.clear()


async def _until_done(consumer: Any, checker: Checker) -> None:
    """Record and ack what ``consumer`` delivers until ``checker`` has every message."""
    async for m in consumer:
        checker.record(m.body)
        m.ack()
        if checker.done.is_set():
            return


async def spawn_target(tmp: Path, nodes: int, sync: str) -> tuple[str, Callable[[], Awaitable[object]]]:
    """A node (``nodes`` 1) or a group of ``nodes`` started in ``tmp`` for a run, the group
    finalized at this build's highest feature level (exchanges and streams need theirs); its
    client URL and what stops it."""
    if nodes > 1:
        cluster = LocalCluster(tmp, nodes=nodes, base_port=0, sync=sync, console=False)
        await cluster.start()
        await cluster.finalize()
        return cluster.url, cluster.stop
    node = await NodeProcess(tmp / "node1", sync=sync).start()
    return node.url, node.stop
