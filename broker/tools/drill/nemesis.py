"""The fault families a drill injects, one class each: ``tandem drill FAMILY`` runs one of them
once under load, ``tandem drill jepsen`` mixes them on a seeded random schedule.

A family says what the spawned group needs before it starts (:attr:`Nemesis.needs`: nodes in
network namespaces, data dirs on the power-loss file system, a faked clock, root), injects
its fault (:meth:`Nemesis.inject`, a one-line description for the schedule), heals it
(:meth:`Nemesis.heal`), and undoes everything it set up on every exit path
(:meth:`Nemesis.close`, idempotent).  The families register themselves in :data:`NEMESES`
under their ``--faults`` name.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, ClassVar

from broker.tools.drill.model import QUEUE, DrillConfig
from client.clock import Clock


@dataclass(slots=True)
class FaultContext:
    """What a family acts on: the spawned group (a :class:`~broker.tools.cluster.LocalCluster`),
    the drill's options, its clock and its seeded random source."""

    cluster: Any
    cfg: DrillConfig
    clock: Clock
    rng: random.Random
    queue: str = QUEUE
    #: one line per fault injected and healed, in order (the schedule a run prints and replays)
    schedule: list[str] = field(default_factory=list)
    #: what the fault showed wrong beyond the messages (a node that died of it): fails the run
    failures: list[str] = field(default_factory=list)
    #: the run's deliveries as its consumers received them (Load.received), where a family's own
    #: consumer adds what it got: a message it had before a failover may come again unflagged
    received: list[Any] | None = None

    async def actives(self) -> dict[int, str]:
        """partition -> the node active for it, as the live nodes report."""
        return dict(await self.cluster.actives(self.queue, self.cfg.partitions))

    async def target(self) -> str:
        """The node active for the most partitions (the first node if none is known)."""
        counts: dict[str, int] = {}
        for n in (await self.actives()).values():
            counts[n] = counts.get(n, 0) + 1
        if not counts:
            return next(iter(self.cluster.nodes))
        return max(sorted(counts), key=lambda n: counts[n])


class Nemesis:
    """One fault family; subclasses set :attr:`name` and override the three steps."""

    name: ClassVar[str] = ""
    #: what the spawned group must be set up with: "netns" (each node in its own network
    #: namespace), "powerfs" (each data dir on the power-loss file system), "faketime"
    #: (libfaketime and a time namespace per node), "root"
    needs: ClassVar[frozenset[str]] = frozenset()
    #: seconds between inject and heal unless ``--hold`` says (None: :attr:`DrillConfig.pause`)
    hold: ClassVar[float | None] = None
    #: an active on a node this fault never cut that loses its role (or term) after the heal
    #: fails the run (``deposed`` is recorded for every family)
    keeps_actives: ClassVar[bool] = False
    #: the nodes the last :meth:`inject` cut off from some peer (set by it): the actives
    #: elsewhere are the healthy ones
    cut: frozenset[str] = frozenset()

    async def prepare(self, ctx: FaultContext) -> None:
        """Set up what :attr:`needs` says on the group before its nodes start (mounts under
        their data dirs, say); :meth:`close` undoes it."""
        return None

    async def inject(self, ctx: FaultContext) -> str:
        """Start the fault; a one-line description of what was done."""
        raise NotImplementedError

    async def heal(self, ctx: FaultContext) -> None:
        """End the fault (the group is to serve again after it)."""
        raise NotImplementedError

    async def close(self, ctx: FaultContext) -> None:
        """Undo whatever :meth:`inject` left in place (rules, mounts, processes); idempotent."""
        return None


NEMESES: dict[str, type[Nemesis]] = {}


def register(cls: type[Nemesis]) -> type[Nemesis]:
    """Class decorator: ``cls`` is the family named ``cls.name``."""
    if not cls.name or cls.name in NEMESES:
        raise ValueError(f"fault family {cls.name!r} is unnamed or named twice")
    NEMESES[cls.name] = cls
    return cls
