"""The fault families a drill knows, and how a spawned group is set up for what they need.

The families live in modules of their own (:data:`FAMILY_MODULES`) and register themselves in
:data:`~broker.tools.drill.nemesis.NEMESES` when imported; :func:`load_families` imports the
ones present.  A family's :attr:`~broker.tools.drill.nemesis.Nemesis.needs` name what the group
must have before its nodes start ("faketime": a clock of its own per node, say); a
:class:`GroupSetup` registered for that need (:func:`register_setup`) arranges it on the
:class:`~broker.tools.cluster.LocalCluster` (each node's ``wrap`` and ``env``) and undoes it
afterwards.  The need "root" is only checked.
"""

from __future__ import annotations

import importlib
import os
import random
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

from broker.tools.drill.nemesis import NEMESES, FaultContext, Nemesis
from client.errors import InvalidArgumentError, UnavailableError

#: the modules that define fault families, under ``broker.tools.drill``
FAMILY_MODULES = ("procfaults", "clockfaults", "netfaults", "diskfaults")


def load_families() -> dict[str, type[Nemesis]]:
    """Import every family module present; the registered families by name."""
    for mod in FAMILY_MODULES:
        name = f"broker.tools.drill.{mod}"
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
    return dict(NEMESES)


def families(names: Iterable[str]) -> list[type[Nemesis]]:
    """The families named (a ``--faults`` list); an unknown name is one line naming the known ones."""
    known = load_families()
    out = []
    for n in names:
        if n not in known:
            raise InvalidArgumentError(f"unknown fault family {n!r} (known: {', '.join(sorted(known)) or 'none'})")
        out.append(known[n])
    return out


class GroupSetup:
    """What a spawned group is given for one need, before its nodes start."""

    need: ClassVar[str] = ""

    def __init__(self, cluster: Any, rng: random.Random) -> None:
        self.cluster, self.rng = cluster, rng

    async def prepare(self) -> None:
        """Arrange the need (the nodes are not running yet); may raise UnavailableError."""
        raise NotImplementedError

    async def close(self) -> None:
        """Undo :meth:`prepare` (idempotent; the nodes have stopped)."""
        return None


SETUPS: dict[str, type[GroupSetup]] = {}


def register_setup(cls: type[GroupSetup]) -> type[GroupSetup]:
    """Class decorator: ``cls`` sets a group up for the need ``cls.need``."""
    if not cls.need or cls.need in SETUPS:
        raise ValueError(f"group setup {cls.need!r} is unnamed or named twice")
    SETUPS[cls.need] = cls
    return cls


def needs_of(fams: Iterable[type[Nemesis]]) -> frozenset[str]:
    return frozenset().union(*(f.needs for f in fams))


async def prepare_group(needs: Iterable[str], cluster: Any, rng: random.Random,
                        cleanup: Callable[[GroupSetup], None]) -> None:
    """Set ``cluster`` up for every need, in a stable order; each setup made is handed to
    ``cleanup`` before it prepares (so a half-done one is closed too)."""
    load_families()
    for need in sorted(needs):
        if need == "root":
            if os.geteuid() != 0:
                raise UnavailableError("these fault families need root")
            continue
        cls = SETUPS.get(need)
        if cls is None:
            raise UnavailableError(f"no fault family sets a group up for {need!r} here "
                                   f"(known: {', '.join(sorted(SETUPS)) or 'none'})")
        setup = cls(cluster, random.Random(rng.random()))
        cleanup(setup)
        await setup.prepare()


async def hold_fault(nemesis: Nemesis, ctx: FaultContext) -> str:
    """Inject, hold for ``ctx.cfg.pause`` seconds, heal; closed on every exit path.  What was done."""
    try:
        what = await nemesis.inject(ctx)
        await ctx.clock.sleep(ctx.cfg.pause)  # the fault lasts this long: not a wait for a state
        await nemesis.heal(ctx)
        return what
    finally:
        await nemesis.close(ctx)
