"""Rolling upgrades, sans-IO: the group's feature levels, what each member's build says of
itself on its links, and the rules that admit a member and allow a finalize.

A *feature level* names what the group may write to its logs, snapshots, catalogue and
stores: a new behaviour that changes any of them is used only once the group's level
allows it, and the level is raised (``tandem upgrade finalize``) only once every member's
build supports it.  Until then a member can go back to the previous build: nothing it
cannot read has been written.  The level is group state, in the catalogue's log
(broker.partitions.upgrade); docs/upgrades.md has the rules and the runbook.

A member's *build* says on its link (PeerHello / PeerWelcome) its version, the protocol
versions and the feature levels it supports, and the level its group is at as it applied
it.  A build that says nothing of it is a first-release build: protocol 1, level 1.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: the feature levels and what each lets the group write, on top of the level before it
LEVELS: Mapping[int, str] = {
    1: "the first release's logs, snapshots, catalogue and stores (builds 0.1.x)",
    2: "the group's feature level is an entry of its catalogue log, and each store is stamped schema version 4 "
       "(a 0.1.x build refuses it by its schema version)",
    3: "a queue may bound the bytes it holds and drop its oldest messages when full (max_length_bytes, "
       "overflow drop-head), give its messages a time to live (message_ttl: version 2 of a queue's record and "
       "row), and messages may be delayed or expire (x-delay, x-deliver-at, expiration)",
    4: "exchanges and bindings (the catalogue log's PUT_EXCHANGE, DROP_EXCHANGE and SET_BINDING ops, and the "
       "catalogue snapshot's exchanges and bindings: version 2 of its layout)",
    5: "streams: a queue of type stream with its retention (max_age, max_bytes: version 3 of a queue's record "
       "and row) and the partition log's TRIM op",
    6: "transactions: the registers of a transaction's coordinator and of what it prepared in a partition "
       "(producer-table entries starting ~tx), whose messages a member of an older build would deliver",
    7: "transactional publishes through exchanges: a routed part forwarded to another member carries its "
       "transaction id (RoutedFwd's Publish.tx), which a member of an older build would store as a plain publish",
    8: "dead-lettering through an exchange: a queue's dead_letter_exchange and dead_letter_routing_key (version 4 "
       "of a queue's record and row), which a member of an older build would drop its dead letters without",
    9: "checksums of the store's rows besides its messages (settlements, delivery counts, producer positions, "
       "queues, users, grants, each partition's hard state, snapshot mark and applied position), which a member "
       "of an older build would update without, leaving checksums that no longer fit",
    10: "a digest of each partition's stored chunks in its row of the store's partitions table, which a member "
        "of an older build would add and delete chunks without updating",
    11: "that digest covers the partition's applied position too, which a member of an older build would move "
        "without updating the digest",
    12: "that digest covers the partition's settled ranges and delivery counts too, which a member of an older "
        "build would write and delete without updating the digest",
}
LEVEL_MIN = min(LEVELS)
LEVEL_MAX = max(LEVELS)

#: what a member that says nothing of its build supports (a first-release build)
FIRST_RELEASE = (1, 1)


@dataclass(frozen=True, slots=True)
class Build:
    """What a member's build said on its latest link."""

    version: str  # its product version; "" for a first-release build, which does not say
    protocol: tuple[int, int]  # the protocol versions it speaks
    levels: tuple[int, int]  # the feature levels it supports
    level: int  # the group's level as it applied it

    @classmethod
    def said(cls, version: str, protocol: tuple[int, int], levels: Iterable[int], level: int) -> Build:
        """From a link's hello or welcome (``levels`` [min, max], or empty: a first-release build)."""
        lv = tuple(levels)
        pair = (lv[0], lv[1]) if len(lv) == 2 and 0 < lv[0] <= lv[1] else FIRST_RELEASE
        return cls(version=version, protocol=protocol, levels=pair, level=max(level, 1))

    @property
    def label(self) -> str:
        """The build as messages name it (a first-release build: "0.1.x")."""
        return self.version or "0.1.x"


def too_old(member: str, build: Build, level: int) -> str | None:
    """Why ``member`` cannot be a member of a group at feature level ``level``; None if it can."""
    if build.levels[1] >= level:
        return None
    return (f"{member} runs build {build.label}, which supports feature levels {build.levels[0]}..{build.levels[1]}, "
            f"but this group is finalized at level {level}: start {member} on a build that supports level {level} "
            f"(see docs/upgrades.md)")


def too_new_a_group(me: str, mine: str, member: str, build: Build) -> str | None:
    """Why this node (``me``, build ``mine``) cannot serve in the group ``member`` says is at
    ``build.level``; None if it can."""
    if build.level <= LEVEL_MAX:
        return None
    return (f"{member} says this group is finalized at feature level {build.level}, but this node's build {mine} "
            f"supports levels {LEVEL_MIN}..{LEVEL_MAX}: start {me} on a build that supports level {build.level} "
            f"(see docs/upgrades.md)")


def store_refusal(where: str, stored: int, mine: str) -> str | None:
    """Why this build (``mine``) cannot open a store finalized at level ``stored``; None if it can."""
    if stored <= LEVEL_MAX:
        return None
    return (f"the store at {where} belongs to a group finalized at feature level {stored}, but this build ({mine}) "
            f"supports levels {LEVEL_MIN}..{LEVEL_MAX}: start this node on a build that supports level {stored} "
            f"(see docs/upgrades.md)")


def finalize_refusal(target: int, current: int, others: Iterable[str], builds: Mapping[str, Build],
                     up: Iterable[str]) -> str | None:
    """Why the group cannot be finalized at ``target`` now; None if it can.  ``others``: the
    group's other members (the asking node's build supports every level it knows);
    ``builds``: what each one's build said on its latest link; ``up``: those linked now."""
    if target not in LEVELS:
        return f"no feature level {target}: this build knows levels {LEVEL_MIN}..{LEVEL_MAX}"
    if target <= current:
        return f"the group is at feature level {current} already"
    linked = set(up)
    behind: list[str] = []
    for name in sorted(others):
        build = builds.get(name)
        if name not in linked:
            behind.append(f"{name} (not linked to this node: its build is not known)")
        elif build is None:
            behind.append(f"{name} (its build is not known yet)")
        elif build.levels[1] < target:
            behind.append(f"{name} (build {build.label} supports levels {build.levels[0]}..{build.levels[1]})")
    if behind:
        return (f"cannot finalize feature level {target}: not every member supports it: {'; '.join(behind)}. "
                f"Start every member on a build that supports level {target}, then finalize again")
    return None
