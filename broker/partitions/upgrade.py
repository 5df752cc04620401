"""The group's feature level (``tandem upgrade finalize``; the rules: ha.upgrade, docs/upgrades.md).

The level is the group's state, like the drained members (:mod:`broker.partitions.drain`): a
change is an entry of the catalogue's replicated log (:class:`~storage.base.SetFeatureLevel`),
checked and proposed by the catalogue's active (a member forwards it there, ``UpgradeFwd``)
once every member's build supports the new level, and applied by every member, which stores
it (``Recovered.meta``, ``feature_level``) with the store's schema version it implies.  On a
single node the finalize is one store commit.  A store at a level above the build's refuses
to start (:meth:`FeatureLevels.load`).

Level 2 is the first above the first release's: its entry is the first a first-release build
cannot read, and its stores are stamped schema version 4, which such a build refuses by name.
So until the finalize every member can be started again on the previous build.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from typing import Protocol

from broker import __version__
from broker.messaging.forward import UpgradeFwd, pack_reply
from broker.security.security import CatalogueHost, catalogue_change
from broker.config import ConfigError
from client.errors import InvalidArgumentError
from ha.upgrade import LEVEL_MAX, LEVEL_MIN, LEVELS, Build, finalize_refusal, store_refusal
from storage.base import PutMeta, SetFeatureLevel, WriteOp

log = logging.getLogger("tandem.broker")

#: ``Recovered.meta`` key of the group's feature level (absent: 1)
LEVEL_KEY = "feature_level"
#: the store schema version each level stamps (storage.sqlite.schema reads them all)
SCHEMA_AT_LEVEL: Mapping[int, str] = {1: "3", 2: "4", 3: "4", 4: "4", 5: "4", 6: "4", 7: "4", 8: "4", 9: "4", 10: "4",
                                       11: "4", 12: "4"}


class StoreRefusedError(ConfigError):
    """The store belongs to a group finalized past this build's levels."""


class UpgradeGroup(Protocol):
    """The group as a finalize sees it."""

    def finalize_mode_refusal(self) -> str | None:
        """Why this node's mode has no feature level to raise (shared mode), or None."""
        ...

    def member_builds(self) -> tuple[Collection[str], Mapping[str, Build], Collection[str]]:
        """The other members (the witness too), what each one's build said on its latest link,
        and those linked to this node now; all empty for a single node."""
        ...

    def level_changed(self, level: int) -> None:
        """The group's level is now ``level`` here: the links' hellos say it from now on."""
        ...


class FeatureLevels:
    """The group's feature level as this member applied it, and the finalize asked here."""

    def __init__(self, catalogue: CatalogueHost, group: UpgradeGroup) -> None:
        self.catalogue = catalogue  # where a change is decided and committed
        self.group = group
        self.level = LEVEL_MIN

    def load(self, meta: Mapping[str, str]) -> None:
        """The level as the store recovered it; StoreRefusedError if this build is too old for it."""
        raw = meta.get(LEVEL_KEY, str(LEVEL_MIN))
        level = int(raw) if raw.isdigit() else LEVEL_MAX + 1
        refusal = store_refusal(str(self.catalogue.config.data_dir), level, __version__)
        if refusal is not None:
            raise StoreRefusedError(refusal)
        self._set(level)

    def _set(self, level: int) -> None:
        if level != self.level:
            self.level = level
            self.group.level_changed(level)

    @staticmethod
    def stored(level: int) -> list[WriteOp]:
        """What a store keeps of the group at ``level``."""
        return [PutMeta(LEVEL_KEY, str(level)), PutMeta("schema_version", SCHEMA_AT_LEVEL[level])]

    # -- committed changes (every member applies them) ------------------------------------------

    def apply(self, op: SetFeatureLevel) -> list[WriteOp]:
        """Apply a committed finalize here; the ops to store."""
        if op.level not in LEVELS:  # (only a member whose build knows the level can have proposed it)
            log.error("feature level %d committed, but this build (%s) knows levels %d..%d: ignored here",
                      op.level, __version__, LEVEL_MIN, LEVEL_MAX)
            return []
        if op.level > self.level:
            log.warning("FEATURE LEVEL %d finalized for the group (was %d): %s", op.level, self.level,
                        LEVELS[op.level])
            self._set(op.level)
        return self.stored(self.level)

    def snapshot(self) -> dict[str, int]:
        """The level, for the catalogue's snapshot (left out at level 1: a first-release
        build reads the rest)."""
        return {"level": self.level} if self.level > LEVEL_MIN else {}

    def install(self, data: Mapping[str, object]) -> list[WriteOp]:
        """A snapshot's level, where it is above this node's; the ops to store."""
        level = data.get("level")
        if isinstance(level, int) and level in LEVELS and level > self.level:
            return self.apply(SetFeatureLevel(level))
        return []

    # -- the finalize asked on this member ------------------------------------------------------------

    async def finalize(self, level: int, by: str, hops: int = 0) -> None:
        """Raise the group's level to ``level`` (0: the highest this build supports): returns once
        it is committed and applied here.  InvalidArgumentError naming the members whose build
        does not support it, or why there is nothing to raise."""
        refusal = self.group.finalize_mode_refusal()
        if refusal:
            raise InvalidArgumentError(refusal)
        target = level or LEVEL_MAX

        def check() -> WriteOp | list[WriteOp]:
            members, builds, linked = self.group.member_builds()
            why = finalize_refusal(target, self.level, members, builds, linked)
            if why is not None:
                raise InvalidArgumentError(why)
            if not self.catalogue.commit.catalogue_log:  # a node without a group: its store only
                return self.stored(target)
            return SetFeatureLevel(target)

        check()  # (here first: the catalogue's active may run an older build that knows no UpgradeFwd)
        await catalogue_change(self.catalogue, f"finalize feature level {target}", check,
                               UpgradeFwd(hops + 1, target, by), hops, local=lambda _op: self._set(target))
        log.warning("UPGRADE FINALIZE by %s: the group is at feature level %d", by, target)

    async def forwarded(self, req: UpgradeFwd) -> bytes:
        """A member forwarded a finalize here (this node is the catalogue's active)."""
        await self.finalize(req.level, req.by, max(1, req.hops))
        return pack_reply(self.catalogue.catalogue_commit())
