"""The builds of the other members, as each said on its latest link, and the group's feature
level as this node applied it: what a link's hello and welcome carry (ha.upgrade), the check
that refuses a member too old for the group, or a group too new for this node, and the
record types each member defines differently (ha.recordtypes: the stamps in the hello or
welcome, then a ``PeerTypes`` of the definitions that differ, once the link is open).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from broker import __version__
from broker.peers.codec.recordtypes import type_table
from client.protocol.frames import PeerHello, PeerTypes, PeerWelcome
from client.protocol.versions import MAX_VERSION, MIN_VERSION
from ha.upgrade import LEVEL_MAX, LEVEL_MIN, Build, too_new_a_group, too_old

log = logging.getLogger("tandem.ha")


class PeerBuilds:
    """What each member's build said on its latest link (``said``), and the group's level as
    this node applied it (``level``: set by broker.partitions.upgrade, read here for the links'
    hellos and their checks)."""

    def __init__(self, me: str) -> None:
        self.me = me
        self.level = LEVEL_MIN
        self.said: dict[str, Build] = {}
        self._refused: dict[str, str] = {}  # member -> the refusal last logged (logged once until it changes)
        self.types = type_table()  # this build's record types, and what each member defines differently
        self._to_send: dict[str, list[str]] = {}  # member -> the types whose definitions its link is owed

    def ours(self) -> dict[str, Any]:
        """The build fields of this node's PeerHello (PeerWelcome: and ``protocol``)."""
        return {"build": __version__, "levels": [LEVEL_MIN, LEVEL_MAX], "level": self.level,
                "types": self.types.stamps()}

    def welcome(self) -> dict[str, Any]:
        """The build fields of this node's PeerWelcome."""
        return {**self.ours(), "protocol": [MIN_VERSION, MAX_VERSION]}

    def check(self, name: str, frame: PeerHello | PeerWelcome, protocol: tuple[int, int]) -> str | None:
        """Member ``name`` said ``frame`` on a link at ``protocol`` (its range): recorded; why the
        link must be refused (logged here, once until it changes), or None."""
        build = Build.said(frame.build, protocol, frame.levels, frame.level)
        self.said[name] = build
        # (a first-release build exchanges no types: its are the first release's, version 1 each)
        self._to_send[name] = self.types.heard_stamps(name, frame.types) if frame.build else self.types.forget(name)
        why = too_old(name, build, self.level) or too_new_a_group(self.me, __version__, name, build)
        if why is None:
            self._refused.pop(name, None)
        elif self._refused.get(name) != why:
            self._refused[name] = why
            log.error("peer %s: link refused: %s", name, why)
        return why

    def heard_level(self, name: str, level: int) -> None:
        """Member ``name``'s keep-alive says the group's level as it applied it (0: it does not say)."""
        build = self.said.get(name)
        if build is not None and level and level != build.level:
            self.said[name] = dataclasses.replace(build, level=level)

    def owed(self, name: str, version: int) -> PeerTypes | None:
        """What the link to ``name``, open at protocol ``version``, is to send first: this node's
        definitions of the types whose stamps differ (None: none, or a link too old for them)."""
        names = self._to_send.pop(name, [])
        if not names or version < 2:
            return None
        return PeerTypes(definitions=self.types.definitions(names))

    def heard_types(self, name: str, definitions: dict[str, str]) -> None:
        """Member ``name`` sent its definitions of the types that differ: the mismatches, logged."""
        for m in self.types.learn(name, definitions):
            how = {"here": "this node converts both ways", "there": f"{name} converts both ways",
                   "none": "nothing converts"}[m.converts]
            log.warning("record type %s: this node's is version %d, %s's %d: %s%s", m.name, m.ours, name, m.theirs,
                        how, "" if m.convertible or m.converts == "none" else " (no converter: records of it "
                        "between the two are refused and counted)")

    @staticmethod
    def protocol_of(frame: PeerHello | PeerWelcome) -> tuple[int, int]:
        """The protocol versions the other end speaks: a hello's range; a welcome's ``protocol``
        (a first-release build's welcome says only the version chosen: 1)."""
        if isinstance(frame, PeerHello):
            return frame.min_version, frame.max_version
        if len(frame.protocol) == 2:
            return frame.protocol[0], frame.protocol[1]
        return frame.version, frame.version
