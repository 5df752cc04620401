"""Seeded schedules of faults against a 3-node group with producers and consumers.

One seed is one run: the seed draws the queue's partitions, the network's delays, the clients'
work and a list of steps, each a fault (kill, silent kill, restart, cut both ways or one way,
isolate, heal, reset the links between two nodes, slow a link, or nothing) followed by some
virtual time.  Then every cut heals, every dead node restarts, and the run waits until the
queue is drained: every producer's messages confirmed, every confirmed message delivered and
acked, nothing ready or unacked on any partition's active.  :meth:`Run.violations` then lists
what the run broke (:meth:`tests.harness.clients.Ledger.violations`, and HA-1014 reports of
confirmed entries lost).

Everything random comes from the seed, the loop runs one thing at a time and time is virtual,
so a seed replays exactly: ``TANDEM_HARNESS_SEED=17 pytest tests/harness/test_group_schedules.py``
(docs/testing.md).
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness.clients import Consumer, Ledger, Pipelined, Producer, spawn_clients
from tests.harness.group import Group, Member
from tests.helpers import group_secret_file

QUEUE = "q"
DRAIN_TIMEOUT = 60.0
MAX_SENT = 200  # messages per producer at most (they send until the heal)  # virtual seconds after the heal for the queue to drain


@dataclass
class Run:
    seed: int
    ledger: Ledger = field(default_factory=Ledger)
    steps: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # the run's own: no drain, HA-1014 losses
    virtual: float = 0.0

    def violations(self) -> list[str]:
        return self.problems + self.ledger.violations()

    def report(self) -> str:
        lines = [f"seed {self.seed}: {self.ledger.summary()}, {self.virtual:.1f} virtual s",
                 "  steps: " + "; ".join(self.steps)]
        lines += [f"  VIOLATION {v}" for v in self.violations()]
        return "\n".join(lines)


async def fault(g: Group, rng: random.Random) -> str:
    """One fault drawn from ``rng``, done to ``g``; what it was, in words."""
    names = sorted(g.members)
    alive = [m.name for m in g.alive()]
    dead = [n for n in names if n not in alive]
    a, b = rng.sample(names, 2)
    actives = sorted({m.name for m in g.alive() for key in queue_keys(g) if serves(m, key)})
    kind = rng.choice(["kill", "kill_active", "restart", "restart", "cut", "cut_one_way", "isolate",
                       "isolate_active", "heal", "heal_all", "drop", "delay", "nothing"])
    if kind == "isolate_active" and actives:
        kind, a = "isolate", rng.choice(actives)
    if kind in ("kill", "kill_active") and alive:
        who = rng.choice(actives if kind == "kill_active" and actives else alive)
        silent = rng.random() < 0.3
        await g.kill(who, silent=silent)
        return f"kill {who}" + (" (silent)" if silent else "")
    if kind in ("kill", "kill_active", "restart") and dead:
        who = rng.choice(dead)
        await g.restart(who)
        return f"restart {who}"
    if kind == "cut":
        g.net.cut(a, b)
        return f"cut {a}-{b}"
    if kind == "cut_one_way":
        g.net.cut(a, b, both=False)
        return f"cut {a}->{b}"
    if kind == "isolate":
        g.net.isolate(a, [n for n in names if n != a])
        return f"isolate {a}"
    if kind == "heal":
        g.net.heal(a, b)
        return f"heal {a}-{b}"
    if kind == "heal_all":
        g.net.heal()
        return "heal all"
    if kind == "drop":
        return f"drop {a}-{b} ({g.net.drop(a, b)} links)"
    if kind == "delay":
        d = rng.choice([0.0, 0.01, 0.05, 0.2])
        g.net.set_delay(a, b, d)
        return f"delay {a}->{b} {d:g}"
    return "nothing"


def queue_keys(g: Group) -> list[tuple[int, int]]:
    """The partitions of the queue, as some live member knows them."""
    for m in g.alive():
        q = m.node.catalogue.queues.get(QUEUE) if m.node is not None else None
        if q is not None:
            return [(q.meta.id, i) for i in range(q.meta.partitions)]
    return []


def serves(m: Member, key: tuple[int, int]) -> bool:
    rep = m.node.ha.replication if m.node is not None else None
    return rep is not None and rep.serving(key)


def drained(g: Group, run: Run, producers: list[Producer | Pipelined], consumers: list[Consumer]) -> bool:
    """Every producer done, every confirmed message delivered and acked, and on each
    partition's active nothing ready, unacked or waiting to commit."""
    if not all(p.done for p in producers) or run.ledger.unacked_confirmed() or any(c.pending for c in consumers):
        return False
    alive = g.alive()
    if not alive or len(alive) < len(g.members):
        return False
    meta = alive[0].node.catalogue.queues[QUEUE].meta if alive[0].node is not None else None
    if meta is None:
        return False
    for pidx in range(meta.partitions):
        key = (meta.id, pidx)
        active = [m for m in alive if m.node is not None and m.node.ha.replication is not None
                  and m.node.ha.replication.serving(key)]
        if len(active) != 1:
            return False
        q = active[0].node.catalogue.queues[QUEUE]  # type: ignore[union-attr]
        part = q.partitions[pidx]
        if part.ready or part.cold_count or q.unacked_count or q.pending_count:
            return False
    return True


async def run_schedule(seed: int, tmp_path: Path, *, steps: int | None = None) -> Run:
    """Run seed ``seed``'s schedule in a fresh group under ``tmp_path``."""
    rng = random.Random(seed)
    run = Run(seed)
    partitions = rng.randint(1, 3)
    max_delay = rng.choice([0.0, 0.0, 0.002, 0.02])
    async with Group(tmp_path / f"seed-{seed}", seed=seed, max_delay=max_delay,
                     secret=group_secret_file(tmp_path)) as g:
        await g.start()
        await g.declare(QUEUE, partitions=partitions)
        producers: list[Producer | Pipelined] = [Producer(g, run.ledger, QUEUE, f"p{i}", random.Random(f"{seed}-p{i}"), total=MAX_SENT,
                              pause=rng.choice([0.05, 0.2, 0.5])) for i in range(2)]
        producers.append(Pipelined(g, run.ledger, QUEUE, "p2", random.Random(f"{seed}-p2"), total=MAX_SENT // 4,
                                   in_flight=rng.choice([2, 4, 8]), pause=rng.choice([0.05, 0.2])))
        consumers = [Consumer(g, run.ledger, QUEUE, f"c{i}", random.Random(f"{seed}-c{i}"),
                              prefetch=rng.choice([1, 5, 50])) for i in range(2)]
        tasks = spawn_clients(*(p.run() for p in producers), *(c.run() for c in consumers))
        try:
            run.steps.append(f"{partitions} partition(s), max delay {max_delay:g}")
            for _ in range(steps if steps is not None else rng.randint(3, 8)):
                run.steps.append(await fault(g, rng))
                await g.run_for(rng.uniform(0.1, 1.5))
            for p in producers:
                p.stop = True
            g.net.heal()
            g.net.delays.clear()
            for m in list(g.members.values()):
                if not m.alive:
                    await g.restart(m.name)
            run.steps.append("heal, restart all, drain")
            if not await g.until(lambda: drained(g, run, producers, consumers), DRAIN_TIMEOUT, fail=False):
                run.problems.append(f"not drained {DRAIN_TIMEOUT:g} virtual s after the heal: "
                                    f"{len(run.ledger.unacked_confirmed())} confirmed message(s) not delivered "
                                    f"and acked, producers done: {[p.done for p in producers]}")
            await g.run_for(0.5)  # (a redelivery still on its way shows up)
            for m in g.alive():
                rep = m.node.ha.replication if m.node is not None else None
                if rep is not None and rep.confirmed_lost:
                    run.problems.append(f"{m.name} reports HA-1014: {rep.confirmed_lost} confirmed entries lost")
        finally:
            for t in tasks:
                t.cancel()
            ended = await asyncio.gather(*tasks, return_exceptions=True)
            run.problems.extend(f"a client failed: {e!r}" for e in ended if isinstance(e, Exception))
            run.virtual = g.clock.monotonic()
    return run
