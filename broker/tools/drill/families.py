"""The fault families a drill knows, and how a spawned group is set up for what they need.

The families live in modules of their own (:data:`FAMILY_MODULES`) and register themselves in
:data:`~broker.tools.drill.nemesis.NEMESES` when imported; :func:`load_families` imports the
ones present.  A family's :attr:`~broker.tools.drill.nemesis.Nemesis.needs` name what the group
must have before its nodes start; a family that sets it up itself does so in ``prepare(ctx)``
(:func:`prepare`: the clock family gives every node its own clocks there), undone by its
``close``.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable

from broker.tools.drill.nemesis import NEMESES, FaultContext, Nemesis
from client.errors import InvalidArgumentError, UnavailableError

#: the modules that define fault families, under ``broker.tools.drill``
FAMILY_MODULES = ("procfaults", "clockfaults", "netfaults", "diskfaults", "writefaults", "storefaults")


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


def needs_of(fams: Iterable[type[Nemesis]]) -> frozenset[str]:
    """What a group set up for all of ``fams`` needs."""
    return frozenset().union(*(f.needs for f in fams))


def check_needs(needs: Iterable[str]) -> None:
    """What this process must be for ``needs``: root for "root"."""
    if "root" in needs and os.geteuid() != 0:
        raise UnavailableError(f"these fault families need root ({', '.join(sorted(needs))})")


async def prepare(nemesis: Nemesis, ctx: FaultContext) -> None:
    """The family's own setup of the group before its nodes start (what :attr:`Nemesis.needs`
    says), if it has one; its :meth:`~Nemesis.close` undoes it."""
    step = getattr(nemesis, "prepare", None)
    if step is not None:
        await step(ctx)
