"""``tandem drill jepsen``: many faults of many families, one after another, on one group under
steady load, then every message checked.

One spawned group (``--nodes``, set up for what the chosen families need: network namespaces,
the power-loss file system, a clock per node), one queue, producers sending about ``--rate``
messages a second in all for ``--time`` seconds, consumers taking them.  Meanwhile a schedule
made from ``--seed`` alone (:func:`make_schedule`: per fault its family, how long it lasts, the
gap before it and a seed for the family's own choices) runs fault by fault: the family injects
(:meth:`~broker.tools.drill.nemesis.Nemesis.inject`), the fault holds, the family heals, and the
runner waits until every partition has an active again (the fault's *recovery*) before the next
gap.  Faults stop when the next one would not end before ``--time``.  Then the producers stop,
the consumers drain the queue, and the checker (:mod:`broker.tools.checker`) classifies every
message: lost, unexpected, duplicated, recovered, redelivered, and first deliveries out of
their producer's order within a partition (reordered).  A run passes when nothing confirmed is
lost and nothing is unexpected, duplicated or reordered, and no family found its fault handled
wrong (a damaged record the node did not find, a node running on after a failed fsync: each
fault's ``failures`` in the timeline, beside what its family said as it healed, ``said``).

The same seed gives the same schedule (families, holds, gaps, the families' seeds); which node
a family hits can still differ, where it picks by the group's state (the node active for the
most partitions at that moment).  The results go to a JSON file (:func:`results`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import logging
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import client
from broker.tools.checker import classify, reordered
from broker.tools.cluster import LocalCluster
from broker.tools.drill.families import check_needs, families, needs_of, prepare
from broker.tools.drill.groups import all_active, ha_events
from broker.tools.drill.load import Load, takeover_time
from broker.tools.drill.txload import TxLoad, make_load
from broker.tools.drill.model import DrillConfig
from broker.tools.drill.nemesis import FaultContext, Nemesis
from client.clock import SYSTEM_CLOCK, Clock
from client.errors import InvalidArgumentError, TandemError

log = logging.getLogger("tandem.drill")

#: a fault lasts HOLD seconds, with GAP seconds of quiet before it (ranges, uniform)
HOLD = (1.0, 10.0)
GAP = (1.0, 5.0)
#: the most a fault's recovery (every partition served again) may take, seconds
RECOVERY = 60.0


@dataclass(frozen=True, slots=True)
class Fault:
    """One planned fault: its place, family, how long it holds, the quiet before it, and the
    seed of the family's own random choices."""

    index: int
    family: str
    hold: float
    gap: float
    seed: int

    def line(self) -> str:
        return f"#{self.index} {self.family}: gap {self.gap:.1f} s, hold {self.hold:.1f} s, seed {self.seed}"


def make_schedule(names: Sequence[str], seed: int, duration: float) -> list[Fault]:
    """The faults that fit in ``duration`` seconds (gaps and holds; recoveries, unknown in
    advance, make a run do fewer), from ``seed`` alone.  A longer duration makes a longer
    schedule with the same beginning."""
    if not names:
        raise InvalidArgumentError("--faults: name at least one fault family")
    rng = random.Random(seed)
    out: list[Fault] = []
    t = 0.0
    while True:
        family = rng.choice(list(names))
        gap = round(rng.uniform(*GAP), 1)
        hold = round(rng.uniform(*HOLD), 1)
        fseed = rng.getrandbits(32)
        t += gap + hold
        if t > duration:
            return out
        out.append(Fault(len(out) + 1, family, hold, gap, fseed))


def default_out(seed: int) -> Path:
    """Where the results go without ``--out``: the current directory, named by seed and time."""
    return Path(f"jepsen-seed{seed}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json")


def verdict_line(rep: dict[str, Any]) -> str:
    c = rep["checker"]
    a = rep.get("atomicity")
    tx = (f"; transactions {a['transactions']} ({a['committed']} committed), partial {a['partial']}, "
          f"inputs acked twice {a['acked_twice']}, outcome unknown {a['unknown']}") if a else ""
    return (f"lost {c['lost']} of {rep['history']['confirmed']} confirmed, unexpected {c['unexpected']}, "
            f"duplicated {c['duplicated']} (reordered {c['reordered']}, recovered {c['recovered']}, "
            f"redelivered {c['redelivered']}){tx}: {'PASSED' if rep['passed'] else 'FAILED'}")


class _Runner:
    def __init__(self, cfg: DrillConfig, names: Sequence[str], duration: float, rate: float, clock: Clock,
                 say: Callable[[str], None]) -> None:
        self.cfg, self.names, self.duration, self.rate, self.clock, self.say = cfg, list(names), duration, rate, clock, say
        self.schedule = make_schedule(self.names, cfg.seed, duration)
        self.timeline: list[dict[str, Any]] = []
        self.t0 = 0.0

    def _at(self) -> float:
        return round(self.clock.monotonic() - self.t0, 2)

    async def faults(self, cl: LocalCluster, fams: dict[str, Nemesis], end: float, deadline: float,
                     received: list[Any]) -> None:
        """The schedule, fault by fault, while there is time for the next one (each family one
        instance, prepared before the group started, closed after it stopped); ``received``: the
        load's deliveries (FaultContext.received)."""
        clock, cfg = self.clock, self.cfg
        for f in self.schedule:
            if clock.monotonic() + f.gap + f.hold > end:
                break
            await clock.sleep(f.gap)  # the schedule's quiet: not a wait for a state
            entry: dict[str, Any] = {**dataclasses.asdict(f), "injected_s": self._at()}
            self.timeline.append(entry)
            nem = fams[f.family]
            ctx = FaultContext(cl, dataclasses.replace(cfg, hold=f.hold), clock, random.Random(f.seed),
                               received=received)
            injected = clock.monotonic()
            healing = False
            try:
                entry["what"] = await nem.inject(ctx)
                self.say(f"[{entry['injected_s']:7.1f} s] {f.line()}: {entry['what']}")
                await clock.sleep(f.hold)  # the fault lasts this long: not a wait for a state
                healing = True
                await nem.heal(ctx)
                entry["healed_s"] = self._at()
                healed = clock.monotonic()
                await cl.wait_ready(RECOVERY)
                await all_active(cl, cfg.partitions, min(deadline, healed + RECOVERY), clock)
                entry["served_s"] = self._at()
                entry["recovery_ms"] = round((clock.monotonic() - healed) * 1000, 1)
                entry["_window"] = (injected, clock.monotonic())
                self.say(f"[{entry['served_s']:7.1f} s] #{f.index} healed at {entry['healed_s']:.1f} s; every "
                         f"partition served {entry['recovery_ms']:.0f} ms after")
            except (TandemError, OSError, TimeoutError) as exc:
                entry["error"] = f"{type(exc).__name__}: {exc}"
                self.say(f"[{self._at():7.1f} s] #{f.index} {f.family}: {entry['error']}")
                if not healing:
                    await nem.heal(ctx)  # the group is to serve for the drain
                raise
            finally:
                self._said(f, ctx, entry)

    def _said(self, f: Fault, ctx: FaultContext, entry: dict[str, Any]) -> None:
        """A fault's report, printed and kept in its timeline entry: the family's lines from the
        heal (``said``: the damage the node found, what the node did) and the faults it finds
        beyond the messages (``failures``: each fails the run)."""
        for line in ctx.schedule:
            self.say(f"[{self._at():7.1f} s] #{f.index} {line}")
        for line in ctx.failures:
            self.say(f"[{self._at():7.1f} s] #{f.index} FAILED: {line}")
        entry["said"] = list(ctx.schedule)
        if ctx.failures:
            entry["failures"] = list(ctx.failures)

    async def run(self, tmp: str) -> dict[str, Any]:
        cfg, clock = self.cfg, self.clock
        fams = families(self.names)
        rep: dict[str, Any] = {"seed": cfg.seed, "faults": self.names, "time_s": self.duration, "rate": self.rate,
                               "nodes": cfg.nodes, "partitions": cfg.partitions, "producers": cfg.producers,
                               "consumers": cfg.consumers,
                               "policies": {"local_sync": cfg.local_sync, "remote_sync": cfg.remote_sync},
                               "planned": [dataclasses.asdict(f) for f in self.schedule], "error": ""}
        self.say(f"jepsen: seed {cfg.seed}, faults {','.join(self.names)}, {self.duration:.0f} s at about "
                 f"{self.rate:.0f} msg/s, {len(self.schedule)} fault(s) planned")
        for f in self.schedule:
            self.say(f"  planned {f.line()}")
        needs = needs_of(fams)
        check_needs(needs)
        net: dict[str, Any] = {}
        if "netns" in needs and "net" in inspect.signature(LocalCluster).parameters:
            net["net"] = "netns"  # each node in a network namespace of its own, made by the group
        cl = LocalCluster(Path(tmp), nodes=cfg.nodes, base_port=0, sync=cfg.local_sync, extra_args=cfg.node_args(),
                          console=False,
                          clock=clock, tls=cfg.tls, **net)
        rng = random.Random(cfg.seed)
        setup_ctx = FaultContext(cl, cfg, clock, random.Random(rng.random()))
        nems = {f.name: f() for f in fams}
        prepared: list[Nemesis] = []
        load: Load | None = None
        tasks: list[asyncio.Future[Any]] = []
        try:
            for nem in nems.values():
                prepared.append(nem)
                await prepare(nem, setup_ctx)
            await cl.start()
            await cl.wait_ready()
            await cl.finalize()  # (as tandem cluster up leaves a new group: at the build's highest level)
            async with await client.connect(cl.url, client_name="drill-setup") as conn:
                for q in make_load(None, cfg, 1, random.Random(0), clock).queues():
                    await conn.declare_queue(q, partitions=cfg.partitions)
            await all_active(cl, cfg.partitions, clock.monotonic() + cfg.timeout, clock)
            load = make_load(cl, cfg, 1, random.Random(rng.random()), clock)
            self.t0 = clock.monotonic()
            end, deadline = self.t0 + self.duration, self.t0 + self.duration + cfg.timeout
            tasks += [asyncio.ensure_future(c) for c in load.consumers()]
            per = self.rate / cfg.producers
            producers = asyncio.ensure_future(asyncio.gather(
                *(load.produce(i, None, rate=per, until=end) for i in range(cfg.producers))))
            tasks.append(producers)
            try:
                await self.faults(cl, nems, end, deadline, load.received)
            except (TandemError, OSError, TimeoutError) as exc:
                rep["error"] = f"{type(exc).__name__}: {exc}"
            self.say(f"[{self._at():7.1f} s] faults done; the producers stop at {self.duration:.0f} s, then the drain")
            async with asyncio.timeout(max(1.0, deadline - clock.monotonic())):
                await producers
            await load.drained(deadline)
            rep["ha_events"] = await ha_events(cl)
        except (TandemError, OSError, TimeoutError) as exc:
            log.exception("jepsen run failed")
            rep["error"] = rep["error"] or f"{type(exc).__name__}: {exc}"
        finally:
            if load is not None:
                await load.close()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await cl.stop()
            for nem in reversed(prepared):
                await nem.close(setup_ctx)
        self._judge(rep, load)
        return rep

    def _judge(self, rep: dict[str, Any], load: Load | None) -> None:
        if load is None:
            load = Load(None, self.cfg, 1, random.Random(0), self.clock)
        v = classify(load.sent, load.confirmed, load.consumed, reordered(load.received, load.origin))
        parts = set(range(self.cfg.partitions))
        for e in self.timeline:
            window = e.pop("_window", None)
            if window is not None:
                took = takeover_time(load.confirm_times, window[0], window[1], parts)
                e["takeover_ms"] = round(took * 1000, 1) if took is not None else None
        rep["history"] = {"sent": v.sent, "confirmed": v.confirmed, "consumed": len(load.consumed),
                          "consumed_unique": len({b for b, _ in load.consumed}), "failed_sends": load.failed,
                          "reported_lost": load.reported_lost,
                          "rate": round(v.sent / self.duration, 1) if self.duration else None,
                          "longest_confirm_wait_ms": round(max(load.waits, default=0.0) * 1000, 1)}
        rep["checker"] = {"ok": v.ok, "lost": v.lost, "unexpected": v.unexpected, "duplicated": v.duplicated,
                          "recovered": v.recovered, "redelivered": v.redelivered, "reordered": v.reordered}
        rep["timeline"] = self.timeline
        rep["passed"] = v.passed and not rep["error"] and v.confirmed > 0 and \
            not any(e.get("failures") for e in self.timeline)
        if isinstance(load, TxLoad):
            a = load.atomicity()
            rep["atomicity"] = {**a.as_dict(), "unknown": load.unknown, "failed_batches": dict(load.errors),
                                "duplicates": load.duplicates()}
            rep["passed"] = rep["passed"] and a.partial == a.acked_twice == load.unknown == 0


async def jepsen(cfg: DrillConfig, names: Sequence[str], duration: float, rate: float, *,
                 clock: Clock = SYSTEM_CLOCK, say: Callable[[str], None] = log.warning,
                 out: Path | None = None) -> dict[str, Any]:
    """One run (see the module's docstring); the results, also written to ``out`` if given.
    A failed run keeps its directory, node logs in it (``kept``)."""
    families(names)  # an unknown family: one line naming the known ones, before anything starts
    runner = _Runner(cfg, names, duration, rate, clock, say)
    tmp = tempfile.mkdtemp(prefix="tandem-jepsen-", dir=cfg.data_dir)
    rep: dict[str, Any] = {}
    try:
        rep = await runner.run(tmp)
    finally:
        if rep.get("passed"):
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            rep["kept"] = tmp
            say(f"jepsen: node logs kept in {tmp}")
    if out is not None:
        out.write_text(json.dumps(rep, indent=1) + "\n")
    return rep
