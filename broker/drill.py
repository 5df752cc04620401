"""``tandem drill SCENARIO``: inject a fault into a running group under load and check
every message.

One run: a fresh local group (``--nodes``, default 3, the default policies unless
flags say otherwise), one queue, P producers and C consumers on durable
connections (confirms, acks, a unique payload per message).  Once a third of the
messages are confirmed the fault is injected; it is healed; the producers finish;
the consumers drain the queue; the checker classifies every message (see
:mod:`broker.checker`).  A run passes when nothing is duplicated or unexpected
and nothing confirmed is lost, or, under weak policies, when every loss was
reported by Tandem itself (the SDK's ``messages_lost`` events).

Scenarios (the *target* is the node active for the most partitions):

* ``kill-active``: ``kill -9`` the target; once every partition has an active
  again, start it again (it rejoins and catches up).
* ``kill-replica``: the group's last node has priority 0, so it is a replica of
  every partition and active for none: ``kill -9`` it, start it again.
* ``pause-active``: SIGSTOP the target for 2 x ``non_response_timeout`` + 1 s,
  then SIGCONT: it must step down, not write.
* ``partition-active``: every peer link and client connection of the target goes
  through a fault-injecting proxy; cut them all for 2 x ``non_response_timeout``
  + 1 s, then heal.
* ``restart-all``: ``kill -9`` every node, start them all again.
* ``rolling-restart``: stop (SIGTERM) and start each node in turn, waiting after
  each until every partition has an active and every replica has caught up.
* ``slow-disk``: the disks of every node but the target stop for 2 x
  ``non_response_timeout`` + 1 s, at most 5 x (half of ``ALIVE_GIVE_UP``, past which an
  active is meant to step down) (strace delays the next fsync of each of their
  threads, :func:`broker.faults.stall_disk`): the replicas of the target's
  partitions are up but cannot write.  No partition may change its active or
  its term (a slow disk is not a dead node); confirms wait for the stall, so
  ``failover_ms`` is about the stall's length.  Spawned groups only.

Against a group that is already running (``--url``), the drill cannot reach the
nodes' processes itself: the operator gives the fault and its healing as shell
commands (``--inject``, ``--heal``; ``{node}`` stands for the target's name, e.g.
``ssh {node} sudo systemctl kill -s KILL tandem``), and the drill runs its
workload on a queue of its own (``drill-<random>``, deleted afterwards).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import random
import statistics
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import client
import shlex

from broker.checker import classify
from broker.cluster import LocalCluster, active_terms, actives_of
from broker.faults import stall_disk
from broker.replication import ALIVE_GIVE_UP
from client.clock import SYSTEM_CLOCK, Clock
from client.durable import ConnectionEvent, DurableConnection
from client.errors import ConfirmedMessagesLost, StaleDeliveryError, TandemError, UnavailableError

log = logging.getLogger("tandem.drill")

SCENARIOS = ("kill-active", "kill-replica", "pause-active", "partition-active", "restart-all", "rolling-restart",
             "slow-disk")
QUEUE = "drill"


@dataclass(slots=True)
class DrillConfig:
    scenario: str
    nodes: int = 3
    partitions: int = 6
    producers: int = 2
    consumers: int = 2
    messages: int = 3000  # per run, over all producers
    window: int = 64  # sends in flight per producer
    keys: int = 64
    seed: int = 1
    local_sync: str = "SYNC"
    remote_sync: str = "WRITE_NO_SYNC"
    non_response_timeout: float | None = None  # None: the node default
    timeout: float = 180.0  # per run
    data_dir: Path | None = None
    extra_args: list[str] = field(default_factory=list)
    url: str | None = None  # an existing group instead of a spawned one
    inject: str | None = None  # shell command injecting the fault ({node}: the target)
    heal: str | None = None  # shell command healing it
    hold: float = 5.0  # seconds between inject and heal (existing group)

    def node_args(self) -> list[str]:
        args = ["--remote-sync", self.remote_sync, *self.extra_args]
        if self.non_response_timeout is not None:
            args += ["--non-response-timeout", str(self.non_response_timeout),
                      "--keepalive-interval", str(self.non_response_timeout / 4)]
        return args

    @property
    def nrt(self) -> float:
        return self.non_response_timeout or 1.0


@dataclass(slots=True)
class RunResult:
    run: int
    target: str
    sent: int = 0
    confirmed: int = 0
    ok: int = 0
    lost: int = 0
    duplicated: int = 0
    redelivered: int = 0
    unexpected: int = 0
    unconfirmed_delivered: int = 0
    failed_sends: int = 0
    reported_lost: int = 0
    unreported_lost: int = 0  # lost messages no messages_lost event covers
    weak: bool = False  # a policy that may lose confirmed messages (NO_SYNC somewhere)
    failover_ms: float = 0.0
    ha_events: list[str] = field(default_factory=list)
    error: str = ""

    @property
    def passed(self) -> bool:
        """Nothing duplicated or unexpected, and nothing lost; under weak policies a loss is
        allowed only where Tandem reported it (the lost messages' sequences lie in the
        ranges of the SDK's ConfirmedMessagesLost events)."""
        if self.error or self.duplicated or self.unexpected:
            return False
        return self.lost == 0 or (self.weak and self.unreported_lost == 0)


class ExistingGroup:
    """A group the drill did not start: reached through its URL, faults by the operator's
    commands."""

    def __init__(self, url: str) -> None:
        from client.url import parse_url

        self.url = url
        self.params = parse_url(url)

    def _link_urls(self) -> list[str]:
        p = self.params
        from urllib.parse import quote

        cred = f"{quote(p.user)}:{quote(p.password)}@"
        return [f"tandem://{cred}{h}:{port}" for h, port in p.hosts]

    async def _statuses(self) -> list[tuple[str, Any]]:
        out = []
        for u in self._link_urls():
            try:
                async with await client.connect_link(u, client_name="tandem-drill") as link:
                    st = await link.status()
                    out.append((st.node, st))
            except (TandemError, OSError):
                continue  # down or refusing: the caller looks again
        return out

    async def actives(self, queue: str) -> dict[int, str]:
        return actives_of(await self._statuses(), queue)

    async def wait_ready(self) -> None:
        return None  # the operator's group: the drill only waits for its queue's actives

    async def queue_empty(self, queue: str) -> bool:
        for u in self._link_urls():
            try:
                async with await client.connect_link(u, client_name="tandem-drill") as link:
                    for q in await link.list_queues():
                        if q.name == queue and q.ready + q.unacked:
                            return False
            except (TandemError, OSError):
                continue
        return True

    async def run_command(self, what: str, cmd: str, target: str) -> None:
        line = cmd.replace("{node}", shlex.quote(target))
        log.warning("drill: %s: %s", what, line)
        proc = await asyncio.create_subprocess_shell(line)
        code = await proc.wait()
        if code != 0:
            raise UnavailableError(f"--{what} command exited with status {code}: {line}")


class _Load:
    """The producers and consumers of one run."""

    def __init__(self, cl: Any, cfg: DrillConfig, run: int, rng: random.Random, clock: Clock,
                 queue: str = QUEUE) -> None:
        self.cl, self.cfg, self.run_no, self.rng, self.clock = cl, cfg, run, rng, clock
        self.queue = queue
        self.sent: list[bytes] = []
        self.confirmed: list[bytes] = []
        self.consumed: list[tuple[bytes, str]] = []
        self.waits: list[float] = []
        self.failed = 0
        self.reported_lost = 0
        self.where: dict[bytes, tuple[str, int, int]] = {}  # confirmed body -> (producer id, partition, seq)
        self.lost_ranges: list[tuple[str, int, int, int]] = []  # (producer id, partition, first seq, count)
        self.third = asyncio.Event()
        self.conns: list[DurableConnection] = []
        self._stop_consumers = asyncio.Event()

    def _event(self, ev: ConnectionEvent) -> None:
        err = ev.error
        if ev.kind == "messages_lost" and isinstance(err, ConfirmedMessagesLost):
            self.reported_lost += err.count
            self.lost_ranges.append((err.producer_id, err.partition, err.first_seq, err.count))

    def unreported(self, lost: set[bytes]) -> int:
        """How many of ``lost`` no reported range covers."""
        n = 0
        for body in lost:
            pid, part, seq = self.where.get(body, ("", -1, -1))
            if not any(pid == rp and part == rpart and first <= seq < first + count
                       for rp, rpart, first, count in self.lost_ranges):
                n += 1
        return n

    async def _connect(self, name: str) -> DurableConnection:
        conn = await client.connect(self.cl.url, client_name=name, send_timeout=self.cfg.timeout)
        conn.on_event(self._event)
        self.conns.append(conn)
        return conn

    async def produce(self, index: int, count: int) -> None:
        conn = await self._connect(f"drill-producer-{index}")
        p = conn.producer(self.queue, max_in_flight=8)
        cfg, clock = self.cfg, self.clock
        sem = asyncio.Semaphore(cfg.window)
        rng = random.Random(self.rng.random())
        pending: set[asyncio.Future[Any]] = set()

        def done(body: bytes, t0: float, fut: asyncio.Future[Any]) -> None:
            sem.release()
            pending.discard(fut)
            self.waits.append(clock.monotonic() - t0)
            if fut.cancelled() or fut.exception() is not None:
                self.failed += 1
                return
            r = fut.result()
            self.where[body] = (p.producer_id, r.partition, r.seq)
            self.confirmed.append(body)
            if len(self.confirmed) >= cfg.messages // 3:
                self.third.set()

        for i in range(count):
            await sem.acquire()
            body = f"{self.run_no}:{index}:{i}".encode()
            self.sent.append(body)
            fut = p.send_nowait(body, key=f"k{rng.randrange(cfg.keys)}")
            pending.add(fut)
            fut.add_done_callback(functools.partial(done, body, clock.monotonic()))
        while pending:
            await asyncio.wait(set(pending))
        await p.close()

    async def consume(self, index: int) -> None:
        conn = await self._connect(f"drill-consumer-{index}")
        c = await conn.consumer(self.queue, prefetch=128).start()
        try:
            while not self._stop_consumers.is_set():
                m = await c.next(0.2)
                if m is None:
                    continue
                self.consumed.append((m.body, m.id))
                try:
                    m.ack()
                except StaleDeliveryError:
                    pass  # its link failed: it comes again, redelivered
        finally:
            await c.close()

    async def go(self, fault: Callable[[], Awaitable[None]], deadline: float) -> None:
        """Consumers and producers; ``fault`` once a third is confirmed; then until drained."""
        cfg = self.cfg
        consumers = [asyncio.ensure_future(self.consume(i)) for i in range(cfg.consumers)]
        share = [cfg.messages // cfg.producers + (1 if i < cfg.messages % cfg.producers else 0)
                 for i in range(cfg.producers)]
        producers: asyncio.Future[Any] = asyncio.ensure_future(
            asyncio.gather(*(self.produce(i, n) for i, n in enumerate(share))))
        third: asyncio.Future[Any] = asyncio.ensure_future(self.third.wait())
        await asyncio.wait([third, producers], return_when=asyncio.FIRST_COMPLETED)
        third.cancel()
        await fault()
        async with asyncio.timeout(max(1.0, deadline - self.clock.monotonic())):
            await producers
        await self.drained(deadline)
        await self.close()
        await asyncio.gather(*consumers, return_exceptions=True)

    async def drained(self, deadline: float) -> None:
        """Until every confirmed message was consumed and the queue holds nothing."""
        want = set(self.confirmed)
        async with await client.connect(self.cl.url, client_name="drill-check") as conn:
            while self.clock.monotonic() < deadline:
                seen = {b for b, _ in self.consumed}
                if want <= seen:
                    infos = await conn.list_queues()
                    total = sum(q.ready + q.unacked for q in infos if q.name == self.queue)
                    if total == 0 and await _empty_everywhere(self.cl, self.queue):
                        return
                await self.clock.sleep(0.1)  # polling consumers and nodes, bounded by the deadline
        log.warning("drill run %d: drain deadline passed", self.run_no)

    async def close(self) -> None:
        self._stop_consumers.set()
        await asyncio.gather(*(c.close() for c in self.conns), return_exceptions=True)


async def _empty_everywhere(cl: Any, queue: str) -> bool:
    """No live node holds a ready or unacked message of the drill queue (each reports the
    partitions it is active for)."""
    if isinstance(cl, ExistingGroup):
        return await cl.queue_empty(queue)
    for name, p in cl.nodes.items():
        if p.proc is None or p.proc.returncode is not None:
            continue
        try:
            async with await client.connect_link(cl.url_of(name), client_name="drill-check") as link:
                for q in await link.list_queues():
                    if q.name == queue and q.ready + q.unacked:
                        return False
        except (TandemError, OSError):
            return False
    return True


async def _all_active(cl: Any, partitions: int, deadline: float, clock: Clock,
                      queue: str = QUEUE) -> dict[int, str]:
    while True:
        found = await cl.actives(queue)
        if len(found) == partitions:
            return found
        if clock.monotonic() > deadline:
            raise UnavailableError(f"only {len(found)} of {partitions} partitions have an active")
        await clock.sleep(0.05)  # polling real processes, bounded by the deadline


async def _caught_up(cl: LocalCluster, partitions: int, deadline: float, clock: Clock) -> None:
    """Every partition has an active whose replicas all match its log."""
    while clock.monotonic() < deadline:
        ok = 0
        for _name, st in await cl._statuses():
            for part in st.partitions:
                if part.queue == QUEUE and part.role == "active" and part.replicas and \
                        all(r.lag == 0 for r in part.replicas) and len(part.replicas) >= len(cl.nodes) - 1:
                    ok += 1
        if ok >= partitions:
            return
        await clock.sleep(0.1)  # polling real processes, bounded by the deadline
    raise UnavailableError("replicas did not catch up in time")


async def _ha_events(group: Any) -> list[str]:
    """The HA-1014 events the group's live nodes report."""
    return sorted({e for _n, st in await group._statuses() for e in st.events if "HA-1014" in e})


def _target(actives: dict[int, str]) -> str:
    counts: dict[str, int] = {}
    for n in actives.values():
        counts[n] = counts.get(n, 0) + 1
    return max(sorted(counts), key=lambda n: counts[n])


async def _inject(cl: LocalCluster, cfg: DrillConfig, target: str, clock: Clock, deadline: float) -> None:
    s = cfg.scenario
    hold = 2 * cfg.nrt + 1.0
    if s in ("kill-active", "kill-replica"):
        await cl.nodes[target].kill()
        await _all_active(cl, cfg.partitions, deadline, clock)
        await cl.nodes[target].start()
    elif s == "pause-active":
        cl.nodes[target].pause()
        await clock.sleep(hold)  # the fault itself lasts this long: not a wait for a state
        cl.nodes[target].resume()
    elif s == "partition-active":
        cl.cut_node(target)
        await clock.sleep(hold)  # the fault itself lasts this long: not a wait for a state
        cl.heal_node(target)
    elif s == "slow-disk":
        procs = [p.proc for name, p in cl.nodes.items() if name != target]
        # (within half of how long a replica goes on saying it is up: past that the active is
        # meant to step down, which a very short --non-response-timeout would otherwise reach)
        stall = min(hold, ALIVE_GIVE_UP / 2 * cfg.nrt)
        try:
            await stall_disk([p.pid for p in procs if p is not None], stall, clock=clock)
        except (RuntimeError, ValueError) as exc:  # strace missing, or not allowed to trace the nodes
            raise UnavailableError(f"slow-disk could not stall the disks: {exc}") from exc
    elif s == "restart-all":
        await asyncio.gather(*(p.kill() for p in cl.nodes.values()))
        await cl.start()
    elif s == "rolling-restart":
        for name, p in cl.nodes.items():
            await p.stop()
            await p.start()
            await cl.wait_ready()
            await _caught_up(cl, cfg.partitions, deadline, clock)
    else:
        raise UnavailableError(f"unknown scenario {s!r}")
    await cl.wait_ready()
    await _all_active(cl, cfg.partitions, deadline, clock)


async def run_once(cfg: DrillConfig, run: int, rng: random.Random, clock: Clock = SYSTEM_CLOCK) -> RunResult:
    with tempfile.TemporaryDirectory(prefix="tandem-drill-", dir=cfg.data_dir) as tmp:
        node_args: dict[str, list[str]] = {}
        if cfg.scenario == "kill-replica":
            node_args[f"node{cfg.nodes}"] = ["--priority", "0"]
        cl = LocalCluster(Path(tmp), nodes=cfg.nodes, base_port=0, sync=cfg.local_sync,
                          extra_args=cfg.node_args(), node_args=node_args, clock=clock,
                          proxied=cfg.scenario == "partition-active")
        res = RunResult(run, "")
        load: _Load | None = None
        try:
            await cl.start()
            deadline = clock.monotonic() + cfg.timeout
            await cl.wait_ready()
            async with await client.connect(cl.url, client_name="drill-setup") as conn:
                await conn.declare_queue(QUEUE, partitions=cfg.partitions)
            actives = await _all_active(cl, cfg.partitions, deadline, clock)
            res.target = f"node{cfg.nodes}" if cfg.scenario == "kill-replica" else \
                "all" if cfg.scenario in ("restart-all", "rolling-restart") else _target(actives)
            before = active_terms(await cl._statuses(), QUEUE) if cfg.scenario == "slow-disk" else {}
            load = _Load(cl, cfg, run, rng, clock)
            log.info("drill run %d: %s on %s", run, cfg.scenario, res.target)
            await load.go(lambda: _inject(cl, cfg, res.target, clock, deadline), deadline)
            _verdict(res, load)
            res.ha_events = await _ha_events(cl)
            if cfg.scenario == "slow-disk":
                await _all_active(cl, cfg.partitions, deadline, clock)
                after = active_terms(await cl._statuses(), QUEUE)
                moved = {p: f"{before[p][0]} (term {before[p][1]}) -> {after[p][0]} (term {after[p][1]})"
                         for p in sorted(before) if after.get(p) != before[p]}
                if moved:
                    res.error = ("a disk stall changed active(s) or term(s), which only a dead or cut-off node "
                                 f"should: {moved}")
        except (TandemError, OSError, TimeoutError) as exc:
            log.exception("drill run %d failed", run)
            res.error = f"{type(exc).__name__}: {exc}"
        finally:
            if load is not None:
                await load.close()
            await cl.stop()
        return res


async def run_existing(cfg: DrillConfig, run: int, rng: random.Random, clock: Clock = SYSTEM_CLOCK) -> RunResult:
    """One run against a running group: the operator's commands inject and heal."""
    assert cfg.url is not None and cfg.inject is not None and cfg.heal is not None
    group = ExistingGroup(cfg.url)
    queue = f"drill-{rng.getrandbits(32):08x}"
    res = RunResult(run, "")
    load: _Load | None = None
    deadline = clock.monotonic() + cfg.timeout
    try:
        async with await client.connect(cfg.url, client_name="drill-setup") as conn:
            await conn.declare_queue(queue, partitions=cfg.partitions)
        actives = await _all_active(group, cfg.partitions, deadline, clock, queue)
        res.target = _target(actives)
        load = _Load(group, cfg, run, rng, clock, queue)
        inject, heal, target = cfg.inject, cfg.heal, res.target

        async def fault() -> None:
            await group.run_command("inject", inject, target)
            await clock.sleep(cfg.hold)  # the fault lasts this long, as the operator asked
            await group.run_command("heal", heal, target)
            await _all_active(group, cfg.partitions, deadline, clock, queue)

        await load.go(fault, deadline)
        _verdict(res, load)
        res.ha_events = await _ha_events(group)
        async with await client.connect(cfg.url, client_name="drill-setup") as conn:
            await conn.delete_queue(queue)
    except (TandemError, OSError, TimeoutError) as exc:
        log.exception("drill run %d failed", run)
        res.error = f"{type(exc).__name__}: {exc}"
    finally:
        if load is not None:
            await load.close()
    return res


def _verdict(res: RunResult, load: _Load) -> None:
    v = classify(load.sent, load.confirmed, load.consumed)
    res.weak = "NO_SYNC" in (load.cfg.local_sync, load.cfg.remote_sync) and load.cfg.url is None
    if v.lost:
        res.unreported_lost = load.unreported(set(load.confirmed) - {b for b, _ in load.consumed})
    res.sent, res.confirmed, res.ok, res.lost = v.sent, v.confirmed, v.ok, v.lost
    res.duplicated, res.redelivered, res.unexpected = v.duplicated, v.redelivered, v.unexpected
    res.unconfirmed_delivered = v.unconfirmed_delivered
    res.failed_sends = load.failed
    res.reported_lost = load.reported_lost
    res.failover_ms = round(max(load.waits, default=0.0) * 1000, 1)


def summarize(cfg: DrillConfig, results: list[RunResult]) -> dict[str, Any]:
    waits = [r.failover_ms for r in results if not r.error]
    out: dict[str, Any] = {
        "scenario": cfg.scenario, "runs": len(results), "seed": cfg.seed,
        "group": "existing" if cfg.url else f"spawned, {cfg.nodes} nodes",
        "policies": {"local_sync": cfg.local_sync, "remote_sync": cfg.remote_sync} if cfg.url is None
        else {"local_sync": "the group's own", "remote_sync": "the group's own"},
    }
    for k in ("sent", "confirmed", "ok", "lost", "duplicated", "redelivered", "unexpected",
              "unconfirmed_delivered", "failed_sends", "reported_lost", "unreported_lost"):
        out[k] = sum(getattr(r, k) for r in results)
    out["failover_ms"] = {"p50": round(statistics.median(waits), 1) if waits else None,
                          "max": max(waits) if waits else None}
    out["ha_events"] = sorted({e for r in results for e in r.ha_events})
    out["errors"] = [f"run {r.run}: {r.error}" for r in results if r.error]
    out["passed"] = bool(results) and all(r.passed for r in results)
    return out


async def drill(cfg: DrillConfig, repeat: int = 1, *, clock: Clock = SYSTEM_CLOCK,
                progress: Callable[[RunResult], None] | None = None) -> dict[str, Any]:
    if cfg.scenario not in SCENARIOS:
        raise UnavailableError(f"unknown scenario {cfg.scenario!r} (choose {', '.join(SCENARIOS)})")
    if cfg.url is not None and cfg.scenario == "slow-disk":
        raise UnavailableError("slow-disk runs on a group the drill starts (it stalls the nodes' fsyncs itself "
                               "and checks that no active moved): drop --url")
    if cfg.url is not None and (not cfg.inject or not cfg.heal):
        raise UnavailableError("against an existing group (--url) the drill needs --inject and --heal commands: "
                               "it cannot reach the nodes' processes itself")
    rng = random.Random(cfg.seed)
    results = []
    for run in range(1, repeat + 1):
        one = run_existing if cfg.url is not None else run_once
        r = await one(cfg, run, random.Random(rng.random()), clock)
        results.append(r)
        if progress is not None:
            progress(r)
    return summarize(cfg, results)


def report_text(rep: dict[str, Any]) -> str:
    lines = [f"drill {rep['scenario']}: {rep['runs']} run(s){' on ' + rep['group'] if rep.get('group') else ''}, policies local_sync={rep['policies']['local_sync']} "
             f"remote_sync={rep['policies']['remote_sync']}, seed {rep['seed']}",
             f"  sent {rep['sent']}, confirmed {rep['confirmed']}, ok {rep['ok']}, lost {rep['lost']} "
             f"(reported by Tandem: {rep['reported_lost']}), duplicated {rep['duplicated']}, "
             f"unexpected {rep['unexpected']}",
             f"  redelivered {rep['redelivered']}, unconfirmed but delivered {rep['unconfirmed_delivered']}, "
             f"sends that raised {rep['failed_sends']}",
             f"  longest wait for a confirm: p50 {rep['failover_ms']['p50']} ms, max {rep['failover_ms']['max']} ms"]
    if rep["ha_events"]:
        lines.append("  HA events: " + "; ".join(rep["ha_events"][:10]))
    for e in rep["errors"]:
        lines.append("  error: " + e)
    lines.append("  PASSED" if rep["passed"] else "  FAILED")
    return "\n".join(lines)


def progress_line(r: RunResult) -> str:
    return json.dumps({"run": r.run, "target": r.target, "lost": r.lost, "duplicated": r.duplicated,
                       "unexpected": r.unexpected, "reported_lost": r.reported_lost, "failover_ms": r.failover_ms,
                       "unreported_lost": r.unreported_lost, "passed": r.passed, **({"error": r.error} if r.error else {})})
