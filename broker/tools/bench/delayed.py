"""``tandem bench --delayed COUNT``: COUNT delayed messages scheduled, what they cost, and how
late due ones arrive.

On a spawned node (or group, finalized at its build's feature level), publishes COUNT messages
each delayed ``--delay-min`` .. ``--delay-max`` seconds (by default far enough that none falls
due during the run) to a queue nobody consumes, sampling every node's resident memory: the
publish rate, and the memory a scheduled message costs.  Then the nodes sit idle for a few
seconds with all of them scheduled: the CPU they use says whether anything runs per message
(one loop per node looks at the head of each partition's heap).  Last, ``--due`` messages
delayed 1 to 5 s go to another queue with a consumer: each must arrive no earlier than its time,
and how late it arrives is reported (p50, p99, max).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import tempfile
import time
from collections.abc import Coroutine
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import client
from broker.tools.bench.backlog import RssSampler, publish_ids, rss_of
from broker.tools.cluster import LocalCluster
from broker.tools.process import NodeProcess
from client.clock import SYSTEM_CLOCK
from client.errors import InvalidArgumentError, TandemError

#: seconds the nodes sit idle with every message scheduled, their CPU measured
IDLE = 5.0


@dataclass
class DelayedResult:
    nodes: int
    messages: int
    size: int
    partitions: int
    delay_min: float
    delay_max: float
    confirmed: int = 0
    publish_per_s: float = 0.0
    rss_before: dict[str, int] = field(default_factory=dict)
    peak_rss: dict[str, int] = field(default_factory=dict)
    bytes_per_message: float = 0.0
    idle_cpu_percent: dict[str, float] = field(default_factory=dict)
    due_messages: int = 0
    due_received: int = 0
    early: int = 0
    late_ms: dict[str, float] = field(default_factory=dict)
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def cpu_seconds(pid: int) -> float:
    """User and system CPU a process used so far (seconds; 0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


async def _due(url: str, count: int, seed: int) -> tuple[int, int, list[float]]:
    """``count`` messages delayed 1-5 s, consumed as they fall due: (received, early, lateness s)."""
    rng = random.Random(seed)
    due: dict[bytes, float] = {}
    late: list[float] = []
    early = 0
    async with await client.connect(url, client_name="tandem-bench-delayed") as conn:
        await conn.declare_queue("due", partitions=4)
        async with conn.consumer("due", prefetch=1000) as c:
            p = conn.producer("due")
            futs = []
            for i in range(count):
                body = f"due-{i}".encode()
                delay = rng.uniform(1.0, 5.0)
                due[body] = delay
                futs.append(p.send_nowait(body, delay=delay))
            await asyncio.gather(*futs)
            while len(late) + early < count:
                m = await c.next(15.0)
                if m is None:
                    break
                got = time.time() - (m.timestamp + due[m.body])
                if got < 0:
                    early += 1
                else:
                    late.append(got)
                m.ack()
    return len(late) + early, early, late


async def run_delayed(count: int, *, size: int = 128, nodes: int = 1, partitions: int = 4, producers: int = 4,
                      window: int = 2000, sync: str = "SYNC", delays: tuple[float, float] = (600.0, 1200.0),
                      due: int = 10_000, seed: int = 1) -> DelayedResult:
    res = DelayedResult(nodes, count, size, partitions, delays[0], delays[1])
    with tempfile.TemporaryDirectory(prefix="tandem-delayed-") as tmp:
        node: NodeProcess | None = None
        cluster: LocalCluster | None = None

        def pids() -> dict[str, int]:
            if cluster is not None:
                return {n: p.pid for n, p in cluster.processes.items() if getattr(p, "proc", None) is not None}
            return {node.name: node.pid} if node is not None and node.proc is not None else {}

        sampler = RssSampler(pids, 1.0)
        try:
            if nodes > 1:
                cluster = LocalCluster(Path(tmp), nodes=nodes, base_port=0, sync=sync)
                await cluster.start()
                await cluster.finalize()  # (timing headers need level 3 in a group)
                url = cluster.url
            else:
                node = await NodeProcess(Path(tmp) / "node1", sync=sync).start()
                url = node.url
            async with await client.connect(url, client_name="tandem-bench-delayed") as conn:
                await conn.declare_queue("delayed", partitions=partitions)
            res.rss_before = {n: rss_of(pid) for n, pid in pids().items()}
            sampler.start()
            rng = random.Random(seed)
            res.confirmed, took = await publish_ids(
                url, "delayed", range(count), size, producers, window,
                submit=lambda p: lambda body: p.send_nowait(body, delay=rng.uniform(*delays)))
            res.publish_per_s = round(res.confirmed / took, 1) if took else 0.0
            await sampler.stop()
            res.peak_rss = dict(sampler.peak)
            grown = sum(res.peak_rss.get(n, 0) - res.rss_before.get(n, 0) for n in res.rss_before)
            res.bytes_per_message = round(grown / max(1, res.confirmed), 1)
            before = {n: cpu_seconds(pid) for n, pid in pids().items()}
            t0 = time.perf_counter()
            await SYSTEM_CLOCK.sleep(IDLE)  # the measurement: idle nodes holding every message scheduled
            spent = time.perf_counter() - t0
            res.idle_cpu_percent = {n: round(100 * (cpu_seconds(pid) - before.get(n, 0.0)) / spent, 2)
                                    for n, pid in pids().items()}
            if due:
                res.due_messages = due
                res.due_received, res.early, late = await _due(url, due, seed + 1)
                if late:
                    late.sort()
                    res.late_ms = {"p50": round(statistics.median(late) * 1000, 1),
                                   "p99": round(late[len(late) * 99 // 100] * 1000, 1),
                                   "max": round(late[-1] * 1000, 1)}
        except (TandemError, OSError, TimeoutError) as exc:
            res.error = f"{type(exc).__name__}: {exc}"
        finally:
            await sampler.stop()
            if node is not None:
                await node.stop()
            if cluster is not None:
                await cluster.stop()
    return res


def print_delayed(res: DelayedResult, *, as_json: bool) -> None:
    if as_json:
        print(json.dumps(res.to_json(), indent=2))
        return
    mib = 1024 * 1024
    print(f"delayed: {res.messages:,} x {res.size} B, each {res.delay_min:g}-{res.delay_max:g} s ahead, to "
          f"{res.partitions} partition(s), {res.nodes} node(s)")
    print(f"publish: {res.publish_per_s:,.0f} msg/s, {res.confirmed:,} confirmed")
    for name in sorted(res.peak_rss):
        print(f"RSS {name}: {res.rss_before.get(name, 0) / mib:,.0f} -> {res.peak_rss[name] / mib:,.0f} MiB")
    print(f"memory a scheduled message costs: {res.bytes_per_message:,.0f} B (RSS grown, all nodes, / messages)")
    print("idle CPU with all of them scheduled: " + ", ".join(f"{n} {p:.2f} %"
                                                             for n, p in sorted(res.idle_cpu_percent.items())))
    if res.due_messages:
        print(f"due in 1-5 s: {res.due_received:,} of {res.due_messages:,} received, {res.early} early; late by "
              + ", ".join(f"{k} {v:,.0f} ms" for k, v in res.late_ms.items()))
    if res.error:
        print(f"  ! {res.error}")


def add_delayed_args(p: Any) -> None:
    """``tandem bench``'s delayed-messages mode flags."""
    g = p.add_argument_group("delayed messages (--spawn --delayed COUNT)")
    g.add_argument("--delayed", type=int, metavar="COUNT",
                   help="with --spawn: schedule COUNT delayed messages of --size bytes (default 128 here) on the "
                        "spawned node(s), reporting the publish rate, the memory each costs, the nodes' idle CPU "
                        "with all scheduled, and how late messages due in 1-5 s arrive")
    g.add_argument("--delay-min", dest="delay_min", type=float, default=600.0, metavar="S",
                   help="with --delayed: the shortest delay (default 600 s: none falls due during the run)")
    g.add_argument("--delay-max", dest="delay_max", type=float, default=1200.0, metavar="S",
                   help="with --delayed: the longest delay (default 1200 s)")
    g.add_argument("--due", type=int, default=10_000, metavar="COUNT",
                   help="with --delayed: messages delayed 1-5 s whose lateness is measured (default 10000; 0: none)")


def delayed_command(args: Any) -> Coroutine[Any, Any, int]:
    if not args.spawn:
        raise InvalidArgumentError("--delayed needs --spawn (it starts the node(s) it measures)")
    if args.delayed < 1 or not 0 <= args.delay_min <= args.delay_max:
        raise InvalidArgumentError("--delayed: at least 1 message, and 0 <= --delay-min <= --delay-max")
    size = args.size if args.size != 1024 else 128

    async def run() -> int:
        res = await run_delayed(args.delayed, size=size, nodes=args.nodes, partitions=args.partitions or 4,
                                producers=max(1, args.producers), window=args.window, sync=args.sync,
                                delays=(args.delay_min, args.delay_max), due=args.due)
        print_delayed(res, as_json=args.json)
        return 0 if res.error is None and res.early == 0 and res.due_received == res.due_messages else 1

    return run()
