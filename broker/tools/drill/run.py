"""One drill run: start (or reach) the group, run the load, inject the fault, judge."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import broker.tools.drill.netfaults  # noqa: F401  (registers the network fault families)
import client
from broker.config import ALIVE_GIVE_UP
from broker.tools.checker import classify, reordered
from broker.tools.cluster import LocalCluster, active_terms
from broker.tools.drill.families import check_needs, load_families, prepare
from broker.tools.drill.groups import ExistingGroup, all_active, caught_up, ha_events, target_of
from broker.tools.drill.healing import WATCH_FACTOR, HealWatch
from broker.tools.drill.load import Load
from broker.tools.drill.txload import QUEUE_OUT, TxLoad, make_load
from broker.tools.drill import diskfaults, writefaults  # noqa: F401  (register the disk fault families)
from broker.tools.drill.model import QUEUE, SCENARIOS, DrillConfig, RunResult
from broker.tools.drill.nemesis import NEMESES, FaultContext, Nemesis
from broker.tools.drill.report import summarize
from broker.tools.drill.upgrade import rolling_upgrade, step_figures
from broker.tools.builds import OtherBuild, from_ref, from_venv
from broker.tools.faults import stall_disk
from broker.tools.netns import require_root
from broker.tools.pair import REPLICATED, HaSetup
from broker.tools.scratch_db import fresh_database
from client.clock import SYSTEM_CLOCK, Clock
from client.errors import TandemError, UnavailableError

log = logging.getLogger("tandem.drill")

#: pause-active on a pair: how long past its hold the drill waits for the other node to take over
TAKEOVER_WAIT = 30.0


def slow_disk_stall(hold: float, nrt: float) -> float:
    """How long slow-disk stalls the replicas' fsyncs: its hold, within half of how long a
    replica goes on saying it is up (``ALIVE_GIVE_UP`` x ``nrt``): past that the active is meant
    to step down, which a very short ``--non-response-timeout`` would otherwise reach."""
    return min(hold, ALIVE_GIVE_UP / 2 * nrt)


async def _inject(cl: LocalCluster, cfg: DrillConfig, target: str, clock: Clock, deadline: float,
                  load: Load, res: RunResult, old: OtherBuild | None = None) -> None:
    s = cfg.scenario
    hold = cfg.pause
    if s == "rolling-upgrade" and old is not None:
        await rolling_upgrade(cl, cfg, old, clock, deadline, load, res.steps)
        return
    if s in ("kill-active", "kill-replica"):
        load.mark_fault()
        await cl.nodes[target].kill()
        load.after = await all_active(cl, cfg.partitions, deadline, clock)
        load.mark_settled()
        await cl.nodes[target].start()
    elif s == "pause-active":
        load.mark_fault()
        cl.nodes[target].pause()
        await clock.sleep(hold)  # the fault itself lasts at least this long: not a wait for a state
        if cfg.ha != REPLICATED and cfg.hold is None:
            # a pair: the paused node wakes up only once the other serves (then it must not write)
            load.after = await _taken_over(cl, cfg, target, clock, deadline)
        cl.nodes[target].resume()
        load.mark_settled()
    elif s == "partition-active":
        load.mark_fault()
        cl.cut_node(target)
        await clock.sleep(hold)  # the fault itself lasts this long: not a wait for a state
        cl.heal_node(target)
        load.mark_settled()
    elif s == "slow-disk":
        procs = [p.proc for name, p in cl.nodes.items() if name != target]
        try:
            await stall_disk([p.pid for p in procs if p is not None], slow_disk_stall(hold, cfg.nrt), clock=clock)
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
            await caught_up(cl, cfg.partitions, deadline, clock)
    else:
        raise UnavailableError(f"unknown scenario {s!r}")
    await cl.wait_ready()
    found = await all_active(cl, cfg.partitions, deadline, clock)
    if not load.after:
        load.after = found


async def _nemesis_fault(cl: LocalCluster, cfg: DrillConfig, nem: Nemesis, ctx: FaultContext, deadline: float,
                         load: Load, res: RunResult) -> HealWatch:
    """A fault family's fault: inject, hold (``--hold``, else the family's, else
    :attr:`DrillConfig.pause`), heal; then until every node sees every peer Up (``heal_up_ms``)
    and every partition has an active."""
    clock = ctx.clock
    load.mark_fault()
    ctx.received = load.received
    ctx.schedule.append(await nem.inject(ctx))
    log.info("drill run %d: %s", res.run, ctx.schedule[-1])
    res.target = ",".join(sorted(nem.cut)) or res.target
    hold = cfg.hold if cfg.hold is not None else nem.hold if nem.hold is not None else cfg.pause
    await clock.sleep(hold)  # the fault itself lasts this long: not a wait for a state
    watch = await HealWatch.before_heal(cl, QUEUE, nem.cut)
    await nem.heal(ctx)
    watch.healed_at = clock.monotonic()
    ctx.schedule.append(f"heal after {hold:g} s")
    res.target = ",".join(sorted(nem.cut)) or "none"
    load.mark_settled()
    await watch.wait_up(cl, deadline, clock)
    res.heal_up_ms = watch.heal_up_ms
    await cl.wait_ready()
    load.after = await all_active(cl, cfg.partitions, deadline, clock)
    return watch


async def _taken_over(cl: LocalCluster, cfg: DrillConfig, target: str, clock: Clock,
                      deadline: float) -> dict[int, str]:
    """Until every partition is served by a node other than the (paused) ``target``; at most
    :data:`TAKEOVER_WAIT` seconds."""
    give_up = min(deadline, clock.monotonic() + TAKEOVER_WAIT)
    while True:
        found = await cl.actives(QUEUE, cfg.partitions)
        if len(found) == cfg.partitions and target not in found.values():
            return found
        if clock.monotonic() > give_up:
            cl.nodes[target].resume()
            raise UnavailableError(f"no other node took over from the paused {target} within "
                                   f"{TAKEOVER_WAIT + cfg.pause:.0f} s")
        await clock.sleep(0.05)  # polling real processes, bounded by the deadline


async def run_once(cfg: DrillConfig, run: int, rng: random.Random, clock: Clock = SYSTEM_CLOCK) -> RunResult:
    """One run on a fresh group (shared mode: on a fresh database beside ``cfg.ha.database``)."""
    if not cfg.ha.shared:
        return await _run_spawned(cfg, cfg.ha, run, rng, clock)
    try:
        async with fresh_database(str(cfg.ha.database), f"drill{run}") as url:
            return await _run_spawned(cfg, dataclasses.replace(cfg.ha, database=url), run, rng, clock)
    except (TandemError, OSError) as exc:  # the database could not be made
        return RunResult(run, "", error=f"{type(exc).__name__}: {exc}")


async def _run_spawned(cfg: DrillConfig, ha: HaSetup, run: int, rng: random.Random, clock: Clock) -> RunResult:
    """A run in a directory of its own, removed afterwards unless the run failed: then its
    node logs stay there for the post-mortem (the result's ``kept``)."""
    tmp = tempfile.mkdtemp(prefix="tandem-drill-", dir=cfg.data_dir)
    res = RunResult(run, "")
    try:
        return await _run_in(cfg, ha, run, rng, clock, tmp, res)
    finally:
        if res.passed:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            res.kept = tmp
            log.warning("drill run %d failed: its node logs are kept in %s", run, tmp)


async def _run_in(cfg: DrillConfig, ha: HaSetup, run: int, rng: random.Random, clock: Clock, tmp: str,
                  res: RunResult) -> RunResult:
    """One run's group in ``tmp``: start it, load it, inject the fault, judge into ``res``."""
    node_args: dict[str, list[str]] = {}
    if cfg.scenario in ("kill-replica", "disk-error"):
        node_args[f"node{cfg.nodes}"] = ["--priority", "0"]
    nem = NEMESES[cfg.scenario]() if cfg.scenario in NEMESES else None
    old = other_build(cfg) if cfg.scenario == "rolling-upgrade" else None
    cl = LocalCluster(Path(tmp), nodes=cfg.nodes, base_port=0, sync=cfg.local_sync, console=False,
                      extra_args=cfg.node_args(), node_args=node_args, clock=clock,
                      proxied=cfg.scenario == "partition-active", ha=ha, tls=cfg.tls,
                      net="netns" if net_of(cfg) == "netns" else "local")
    load: Load | None = None
    ctx = FaultContext(cl, cfg, clock, random.Random(rng.random())) if nem is not None else None
    watch: HealWatch | None = None
    for p in cl.nodes.values():
        p.build = old  # (rolling-upgrade: the group starts on the older build)
    try:
        if nem is not None and ctx is not None:
            check_needs(nem.needs)
            await prepare(nem, ctx)
        await cl.start()
        deadline = clock.monotonic() + cfg.timeout
        await cl.wait_ready()
        if cfg.workload == "transactional" or (old is None and not ha.shared):
            # as tandem cluster up leaves a new group: at the build's highest level (transactions
            # need theirs; level 9's row checksums are what the storage families check)
            await cl.finalize()
        async with await client.connect(cl.url, client_name="drill-setup") as conn:
            await conn.declare_queue(QUEUE, partitions=cfg.partitions)
            if cfg.workload == "transactional":
                await conn.declare_queue(QUEUE_OUT, partitions=cfg.partitions)
        actives = await all_active(cl, cfg.partitions, deadline, clock)
        res.target = f"node{cfg.nodes}" if cfg.scenario in ("kill-replica", "disk-error") else \
            "all" if cfg.scenario in ("restart-all", "rolling-restart", "power-loss-all", "rolling-upgrade") \
            else target_of(actives)
        before = active_terms(await cl._statuses(), QUEUE) if cfg.scenario == "slow-disk" else {}
        load = make_load(cl, cfg, run, rng, clock)
        log.info("drill run %d: %s on %s", run, cfg.scenario, res.target)
        run_load = load
        if nem is not None and ctx is not None:
            fam, fctx = nem, ctx

            async def fault() -> None:
                nonlocal watch
                watch = await _nemesis_fault(cl, cfg, fam, fctx, deadline, run_load, res)

            await load.go(fault, deadline)
        else:
            await load.go(lambda: _inject(cl, cfg, res.target, clock, deadline, run_load, res, old), deadline)
        _verdict(res, load)
        if res.steps:
            step_figures(res.steps, load)
        if ctx is not None and ctx.failures:
            res.error = "; ".join(ctx.failures)
        cut = nem.cut if nem is not None else {res.target}
        took = load.takeover({p for p, n in actives.items() if n in cut})
        res.takeover_ms = round(took * 1000, 1) if took is not None else None
        res.after = target_of(load.after) if load.after else ""
        res.ha_events = await ha_events(cl)
        if nem is not None and watch is not None:
            res.fault = "; ".join(ctx.schedule) if ctx is not None else ""
            window = WATCH_FACTOR * cfg.nrt if cfg.watch is None else cfg.watch
            await watch.watch(cl, (watch.up_at or clock.monotonic()) + window, clock)
            deposed = watch.deposed(await cl._statuses())
            res.deposed = len(deposed)
            if deposed and nem.keeps_actives:
                res.error = (f"{len(deposed)} healthy active(s) deposed after the heal (a cut-off node's return "
                             f"must not depose them): " + "; ".join(f"partition {p}: {d}" for p, d in deposed.items()))
        if cfg.scenario == "slow-disk":
            await all_active(cl, cfg.partitions, deadline, clock)
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
            res.lost_ranges = [f"{p}/{part}:{first}+{count}" for p, part, first, count in load.lost_ranges]
        try:
            await cl.stop()
        finally:  # (after the nodes: a family's mounts go once nothing uses them)
            if nem is not None and ctx is not None:
                await nem.close(ctx)
                res.schedule = ctx.schedule
    return res


async def run_existing(cfg: DrillConfig, run: int, rng: random.Random, clock: Clock = SYSTEM_CLOCK) -> RunResult:
    """One run against a running group: the operator's commands inject and heal."""
    assert cfg.url is not None and cfg.inject is not None and cfg.heal is not None
    group = ExistingGroup(cfg.url)
    queue = f"drill-{rng.getrandbits(32):08x}"
    res = RunResult(run, "")
    load: Load | None = None
    deadline = clock.monotonic() + cfg.timeout
    try:
        load = make_load(group, cfg, run, rng, clock, queue)
        async with await client.connect(cfg.url, client_name="drill-setup") as conn:
            for q in load.queues():
                await conn.declare_queue(q, partitions=cfg.partitions)
        actives = await all_active(group, cfg.partitions, deadline, clock, queue)
        res.target = target_of(actives)
        inject, heal, target = cfg.inject, cfg.heal, res.target

        run_load = load

        async def fault() -> None:
            run_load.mark_fault()
            await group.run_command("inject", inject, target)
            await clock.sleep(cfg.pause)  # the fault lasts this long, as the operator asked
            await group.run_command("heal", heal, target)
            await all_active(group, cfg.partitions, deadline, clock, queue)
            run_load.mark_settled()

        await load.go(fault, deadline)
        _verdict(res, load)
        took = load.takeover({p for p, n in actives.items() if n == target})
        res.takeover_ms = round(took * 1000, 1) if took is not None else None
        res.ha_events = await ha_events(group)
        async with await client.connect(cfg.url, client_name="drill-setup") as conn:
            for q in load.queues():
                await conn.delete_queue(q)
    except (TandemError, OSError, TimeoutError) as exc:
        log.exception("drill run %d failed", run)
        res.error = f"{type(exc).__name__}: {exc}"
    finally:
        if load is not None:
            await load.close()
    return res


def _verdict(res: RunResult, load: Load) -> None:
    v = classify(load.sent, load.confirmed, load.consumed, reordered(load.received, load.origin))
    if isinstance(load, TxLoad):
        a = load.atomicity()
        res.transactions, res.tx_committed, res.tx_aborted = a.transactions, a.committed, a.aborted
        res.partial, res.acked_twice, res.tx_unknown = a.partial, a.acked_twice, load.unknown
        if not a.committed and not res.error:
            res.error = f"no transaction committed (failed batches: {dict(load.errors) or 'none'})"
    res.weak = "NO_SYNC" in (load.cfg.local_sync, load.cfg.remote_sync) and load.cfg.url is None
    if v.lost:
        res.unreported_lost = load.unreported(set(load.confirmed) - {b for b, _ in load.consumed})
    res.sent, res.confirmed, res.ok, res.lost = v.sent, v.confirmed, v.ok, v.lost
    res.duplicated, res.redelivered, res.unexpected = v.duplicated, v.redelivered, v.unexpected
    res.unconfirmed_delivered, res.reordered = v.recovered, v.reordered
    res.failed_sends = load.failed
    res.reported_lost = load.reported_lost
    res.failover_ms = round(max(load.waits, default=0.0) * 1000, 1)


def other_build(cfg: DrillConfig) -> OtherBuild:
    """rolling-upgrade: the older build its group starts on (made on first use)."""
    if cfg.from_venv:
        return from_venv(Path(cfg.from_venv))
    if not cfg.from_ref:
        raise UnavailableError("rolling-upgrade needs the build to upgrade from: --from REF or --from-venv PATH")
    return from_ref(cfg.from_ref)


def net_of(cfg: DrillConfig) -> str:
    """The spawned group's network: ``cfg.net``, else netns for a family that needs it, else proxy."""
    if cfg.net is not None:
        return cfg.net
    nem = NEMESES.get(cfg.scenario)
    return "netns" if nem is not None and "netns" in nem.needs else "proxy"


def check_family(cfg: DrillConfig) -> None:
    """What a fault family (or ``--net netns``) needs, checked before anything starts."""
    nem = NEMESES.get(cfg.scenario)
    net = net_of(cfg)
    if net not in ("proxy", "netns"):
        raise UnavailableError(f"--net {net}: proxy or netns")
    if nem is not None and cfg.url is not None:
        raise UnavailableError(f"{cfg.scenario} runs on a group the drill starts (it injects the fault itself): "
                               "drop --url")
    if nem is not None and "netns" in nem.needs and net != "netns":
        raise UnavailableError(f"{cfg.scenario} cuts links inside the nodes' network namespaces: --net netns "
                               f"(its default), not --net {net}")
    if net == "netns":
        if cfg.url is not None:
            raise UnavailableError("--net netns sets up the group the drill starts: drop --url")
        if cfg.scenario == "partition-active":
            raise UnavailableError("partition-active cuts through proxies on this machine's loopback (--net proxy); "
                                   "isolate-active is its network-namespace counterpart")
        if cfg.ha.shared or cfg.ha.witness:
            raise UnavailableError("--net netns: a replicated group of nodes (not shared mode, not a witness)")
        require_root("--net netns")
    if nem is not None and "root" in nem.needs:
        require_root(cfg.scenario)
    if not 0.0 < cfg.loss < 1.0:
        raise UnavailableError(f"--loss {cfg.loss}: a share between 0 and 1 (0.2: 20 %)")


async def drill(cfg: DrillConfig, repeat: int = 1, *, clock: Clock = SYSTEM_CLOCK,
                progress: Callable[[RunResult], None] | None = None) -> dict[str, Any]:
    known = [*SCENARIOS, *sorted(load_families())]
    if cfg.scenario not in known:
        raise UnavailableError(f"unknown scenario {cfg.scenario!r} (choose {', '.join(known)})")
    check_family(cfg)
    if cfg.url is not None and cfg.scenario == "slow-disk":
        raise UnavailableError("slow-disk runs on a group the drill starts (it stalls the nodes' fsyncs itself "
                               "and checks that no active moved): drop --url")
    if cfg.url is not None and (not cfg.inject or not cfg.heal):
        raise UnavailableError("against an existing group (--url) the drill needs --inject and --heal commands: "
                               "it cannot reach the nodes' processes itself")
    if cfg.scenario == "rolling-upgrade":
        old = other_build(cfg)  # (made here, once, before any run)
        log.info("drill: the older build is %s (%s)", old.label, old.version())
    rng = random.Random(cfg.seed)
    results = []
    for run in range(1, repeat + 1):
        one = run_existing if cfg.url is not None else run_once
        r = await one(cfg, run, random.Random(rng.random()), clock)
        results.append(r)
        if progress is not None:
            progress(r)
    return summarize(cfg, results, None if cfg.url is not None else net_of(cfg))


