"""``tandem bench --backlog SIZE``: a backlog larger than the node's memory budget.

Publishes SIZE bytes of messages to a queue nobody consumes, on a spawned node (or group)
started with ``--max-memory``, sampling every node's resident memory each second; then
one consumer drains the queue, checking every message arrived exactly once and, in each
partition, in offset order.  Before that, a warm queue (one that fits in memory) is
published and consumed the same way: its consume rate is what the drain is compared with.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import client
from broker.tools.bench.workload import Publisher, id_of
from broker.tools.cluster import LocalCluster
from broker.tools.process import NodeProcess
from client.clock import SYSTEM_CLOCK, Clock
from client.errors import TandemError

#: bytes a message costs the node's memory beyond its body (storage.budget.MSG_MEMORY, about)
PER_MESSAGE = 200


def rss_of(pid: int) -> int:
    """Resident memory of a process (bytes; 0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class RssSampler:
    """Every node's peak RSS, sampled each ``interval`` seconds while it runs."""

    def __init__(self, pids: Callable[[], dict[str, int]], interval: float = 1.0, clock: Clock = SYSTEM_CLOCK) -> None:
        self.pids = pids
        self.interval = interval
        self.clock = clock
        self.peak: dict[str, int] = {}
        self.samples = 0
        self._task: asyncio.Task[None] | None = None

    def sample(self) -> None:
        for name, pid in self.pids().items():
            self.peak[name] = max(self.peak.get(name, 0), rss_of(pid))
        self.samples += 1

    async def _run(self) -> None:
        while True:
            self.sample()
            await self.clock.sleep(self.interval)

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self.sample()


@dataclass
class BacklogResult:
    nodes: int
    messages: int
    size: int
    max_memory: int
    partitions: int
    restarted: bool = False
    confirmed: int = 0
    publish_per_s: float = 0.0
    drain_per_s: float = 0.0
    warm_messages: int = 0
    warm_consume_per_s: float = 0.0
    peak_rss: dict[str, int] = field(default_factory=dict)
    rss_samples: int = 0
    consumed: int = 0
    lost: int = 0
    duplicated: int = 0
    out_of_order: int = 0
    redelivered: int = 0
    error: str | None = None

    @property
    def exactly_once(self) -> bool:
        return self.error is None and self.consumed == self.confirmed and not (self.lost or self.duplicated
                                                                             or self.out_of_order)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "exactly_once": self.exactly_once}


async def publish_ids(url: str, queue: str, ids: range, size: int, producers: int, window: int,
                      submit: Callable[[Any], Callable[[bytes], Any]] = lambda p: p.send_nowait) -> tuple[int, float]:
    """Publish ``ids`` over ``producers`` connections, each message through ``submit(producer)``;
    (confirmed, seconds)."""
    conns = [await client.connect(url, client_name="tandem-bench") for _ in range(producers)]
    try:
        pubs = [Publisher(submit(conn.producer(queue)), window=window) for conn in conns]
        t0 = time.perf_counter()
        n = len(ids)
        step = -(-n // producers)
        await asyncio.gather(*(p.run(ids[k * step:(k + 1) * step], size) for k, p in enumerate(pubs)))
        took = time.perf_counter() - t0
        errors = [p.first_error for p in pubs if p.first_error is not None]
        if errors:
            raise errors[0]
        return sum(p.confirmed for p in pubs), took
    finally:
        for conn in conns:
            await conn.close()


class Drained:
    """What a drain saw: each id once, each partition's offsets rising."""

    def __init__(self, messages: int) -> None:
        self.seen = bytearray(messages)
        self.count = 0
        self.duplicated = 0
        self.unexpected = 0
        self.out_of_order = 0
        self.redelivered = 0
        self.last: dict[int, int] = {}

    def record(self, body: bytes, partition: int, offset: int, redelivered: bool) -> None:
        i = id_of(body)
        if not 0 <= i < len(self.seen):
            self.unexpected += 1
        elif self.seen[i]:
            self.duplicated += 1
        else:
            self.seen[i] = 1
        self.count += 1
        if offset <= self.last.get(partition, -1):
            self.out_of_order += 1
        self.last[partition] = offset
        self.redelivered += redelivered


async def _drain(url: str, queue: str, expected: int, messages: int, prefetch: int,
                 idle: float = 30.0) -> tuple[Drained, float]:
    """Consume and ack ``expected`` messages; (what was seen, seconds)."""
    seen = Drained(messages)
    async with await client.connect(url, client_name="tandem-bench-backlog") as conn:
        c = await conn.group_consumer(queue, prefetch=prefetch).start()
        t0 = time.perf_counter()
        try:
            while seen.count < expected:
                m = await c.next(idle)
                if m is None:
                    break
                seen.record(m.body, m.partition, m.offset, m.delivery_count > 1)
                m.ack()
            took = time.perf_counter() - t0
        finally:
            await c.cancel()
    return seen, took


async def declare_served(url: str, queue: str, partitions: int, *, client_name: str = "tandem-bench-backlog") -> None:
    """Declare ``queue`` and return once every partition of it has its active."""
    async with await client.connect(url, client_name=client_name) as conn:
        await conn.declare_queue(queue, partitions=partitions)
        async with asyncio.timeout(60):
            while True:  # every partition has its active (a group elects them)
                st = await conn.status()
                if not st.partitions or sum(p.queue == queue and bool(p.active) for p in st.partitions) \
                        == partitions:
                    return
                await asyncio.sleep(0.05)  # polling a remote state, bounded by the timeout


async def _delete(url: str, queue: str) -> None:
    async with await client.connect(url, client_name="tandem-bench-backlog") as conn:
        await conn.delete_queue(queue)


async def run_backlog(total: int, *, max_memory: int, size: int = 1024, nodes: int = 1, partitions: int = 4,
                      producers: int = 4, window: int = 2000, prefetch: int = 1000, sync: str = "SYNC",
                      restart: bool = False, warm: bool = True, data_dir: Path | None = None,
                      interval: float = 1.0) -> BacklogResult:
    """Spawn the node(s), publish ``total`` bytes of ``size``-byte messages with no consumer,
    then drain them (after a restart of every node with ``restart``)."""
    messages = max(1, total // size)
    res = BacklogResult(nodes, messages, size, max_memory, partitions, restarted=restart)
    with tempfile.TemporaryDirectory(prefix="tandem-backlog-", dir=data_dir) as tmp:
        args = ["--max-memory", str(max_memory)]
        node: NodeProcess | None = None
        cluster: LocalCluster | None = None

        def pids() -> dict[str, int]:
            if cluster is not None:
                return {name: p.pid for name, p in cluster.processes.items() if getattr(p, "proc", None) is not None}
            return {node.name: node.pid} if node is not None and node.proc is not None else {}

        sampler = RssSampler(pids, interval)
        try:
            if nodes > 1:
                cluster = LocalCluster(Path(tmp), nodes=nodes, base_port=0, sync=sync, extra_args=args)
                await cluster.start()
                await cluster.wait_ready()
                url = cluster.url
            else:
                node = await NodeProcess(Path(tmp) / "node1", sync=sync, extra_args=args).start()
                url = node.url
            sampler.start()
            if warm:
                # a queue that fits in memory: the consume rate a backlog's drain is held to
                res.warm_messages = min(messages, max(1000, max_memory // 2 // (size + PER_MESSAGE)), 200_000)
                await declare_served(url, "warm", partitions)
                n, _took = await publish_ids(url, "warm", range(res.warm_messages), size, producers, window)
                seen, took = await _drain(url, "warm", n, res.warm_messages, prefetch)
                res.warm_consume_per_s = round(seen.count / took, 1) if took else 0.0
                await _delete(url, "warm")
            await declare_served(url, "backlog", partitions)
            res.confirmed, took = await publish_ids(url, "backlog", range(messages), size, producers, window)
            res.publish_per_s = round(res.confirmed / took, 1) if took else 0.0
            if restart:
                if cluster is not None:
                    await cluster.stop()
                    await cluster.start()
                    await cluster.wait_ready()
                    url = cluster.url
                elif node is not None:
                    await node.stop()
                    node = await NodeProcess(node.data_dir, sync=sync, extra_args=args).start()
                    url = node.url
            seen, took = await _drain(url, "backlog", res.confirmed, messages, prefetch)
            res.drain_per_s = round(seen.count / took, 1) if took else 0.0
            res.consumed = seen.count
            res.duplicated = seen.duplicated + seen.unexpected
            res.out_of_order = seen.out_of_order
            res.redelivered = seen.redelivered
            res.lost = max(0, res.confirmed - (seen.count - res.duplicated))
        except (TandemError, OSError, TimeoutError) as exc:
            res.error = f"{type(exc).__name__}: {exc}"
        finally:
            await sampler.stop()
            res.peak_rss, res.rss_samples = dict(sampler.peak), sampler.samples
            if node is not None:
                await node.stop()
            if cluster is not None:
                await cluster.stop()
    return res


def print_backlog(res: BacklogResult, *, as_json: bool, rss_limit: int = 0) -> None:
    if as_json:
        print(json.dumps({**res.to_json(), "rss_limit": rss_limit}, indent=2))
        return
    mib = 1024 * 1024
    print(f"backlog: {res.messages:,} x {res.size} B ({res.messages * res.size / mib:,.0f} MiB) to "
          f"{res.partitions} partition(s), {res.nodes} node(s), max_memory {res.max_memory / mib:,.0f} MiB"
          + (", every node restarted before the drain" if res.restarted else ""))
    print(f"publish (no consumer): {res.publish_per_s:,.0f} msg/s, {res.confirmed:,} confirmed")
    print(f"drain: {res.drain_per_s:,.0f} msg/s; warm queue ({res.warm_messages:,} messages): "
          f"{res.warm_consume_per_s:,.0f} msg/s"
          + (f" (drain / warm: {res.drain_per_s / res.warm_consume_per_s:.2f})" if res.warm_consume_per_s else ""))
    for name, peak in sorted(res.peak_rss.items()):
        print(f"peak RSS {name}: {peak / mib:,.0f} MiB ({res.rss_samples} samples)")
    verdict = "exactly once, in order" if res.exactly_once else "FAILED"
    print(f"{verdict}: consumed {res.consumed:,}, lost {res.lost}, duplicated {res.duplicated}, "
          f"out of order {res.out_of_order}, redelivered {res.redelivered}")
    if res.error:
        print(f"  ! {res.error}")
    if rss_limit and any(p > rss_limit for p in res.peak_rss.values()):
        print(f"  ! peak RSS above {rss_limit / mib:,.0f} MiB")


def add_backlog_args(p: Any) -> None:
    """``tandem bench``'s backlog mode flags."""
    g = p.add_argument_group("backlog mode (--spawn --backlog SIZE)")
    g.add_argument("--backlog", metavar="SIZE",
                   help="with --spawn: publish SIZE bytes (e.g. 5GB, 100M) of --size messages to a queue with no "
                        "consumer on node(s) started with --max-memory, sampling every node's RSS each second, "
                        "then drain it with one consumer, checking exactly-once and per-partition order; a warm "
                        "queue's consume rate first, for comparison")
    g.add_argument("--max-memory", dest="max_memory", default="200M", metavar="SIZE",
                   help="with --backlog: the spawned nodes' max_memory (default 200M)")
    g.add_argument("--rss-limit", dest="rss_limit", default="400M", metavar="SIZE",
                   help="with --backlog: peak RSS a node may reach for the run to pass (default 400M)")
    g.add_argument("--restart", action="store_true",
                   help="with --backlog: stop and start every node between publish and drain")


def backlog_command(args: Any) -> Coroutine[Any, Any, int]:
    from broker.config import ConfigError, parse_size
    from client.errors import InvalidArgumentError

    if not args.spawn:
        raise InvalidArgumentError("--backlog needs --spawn (it starts the node(s) with --max-memory)")
    try:
        total, mem, limit = (parse_size(args.backlog, "--backlog"),
                             parse_size(args.max_memory, "--max-memory"), parse_size(args.rss_limit, "--rss-limit"))
    except ConfigError as exc:
        raise InvalidArgumentError(str(exc)) from None
    if args.size < 8:
        raise InvalidArgumentError("--size: at least 8 bytes")
    partitions = args.partitions or 4

    async def run() -> int:
        res = await run_backlog(total, max_memory=mem, size=args.size, nodes=args.nodes, partitions=partitions,
                                producers=max(1, args.producers), window=args.window, prefetch=args.prefetch,
                                sync=args.sync, restart=args.restart)
        print_backlog(res, as_json=args.json, rss_limit=limit)
        under = all(p <= limit for p in res.peak_rss.values())
        return 0 if res.exactly_once and under else 1

    return run()
