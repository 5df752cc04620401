"""Group membership and node quorum, sans-IO.

What one node knows of the others in its group: each remote node's state
(``Undiscovered`` until its first handshake, then ``Up``/``Down`` by keep-alive,
or one of the refusal states), and from that the group's quorum state:
``Active`` (every known node up), ``Partial`` (some down, quorum holds),
``Disabled`` (no quorum: HA services off, partitions Unavailable here).

Availability zones (StreamBase's) are named sets of members inside the group, each with
a quorum policy of its own; a node may be in several.  A node counts the group's quorum
and the quorum of every zone it is in, and is ``Disabled`` when any of them fails: its HA
services go off though the rest of the group goes on.  An operator's ``quorum_override``
and a ``designated_primary`` set the zones aside with the group's policy.

The driver (``broker/``) reports handshakes, frames heard and lost links, and
calls :meth:`Membership.tick`; every call returns the changes it caused, and
installed notifiers are called with each remote-state change in order (so they
are serialized per node by construction).  Time is passed in.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from ha.errors import IllegalTransition


class RemoteState(Enum):
    __hash__ = object.__hash__  # members are singletons: identity, in C (Enum's own hashes the name in Python, per lookup)
    UNDISCOVERED = "Undiscovered"
    DISCOVERED = "Discovered"
    UP = "Up"
    DOWN = "Down"
    DUPLICATE_LOCATION = "DuplicateLocation"
    DUPLICATE_TIMESTAMP = "DuplicateTimestamp"
    UNSUPPORTED_PROTOCOL = "UnsupportedProtocol"
    #: its placement settings (members, replicas, zones) differ from this node's: the two would
    #: disagree on which nodes hold each partition, so they do not link
    MISMATCHED_SETTINGS = "MismatchedSettings"


class QuorumState(Enum):
    ACTIVE = "Active"
    PARTIAL = "Partial"
    DISABLED = "Disabled"


_REFUSED = {RemoteState.DUPLICATE_LOCATION, RemoteState.DUPLICATE_TIMESTAMP, RemoteState.UNSUPPORTED_PROTOCOL,
            RemoteState.MISMATCHED_SETTINGS}

# (state, event) -> state
TRANSITIONS: dict[tuple[RemoteState, str], RemoteState] = {}
for _s in RemoteState:
    TRANSITIONS[(_s, "duplicate_location")] = RemoteState.DUPLICATE_LOCATION
    TRANSITIONS[(_s, "duplicate_timestamp")] = RemoteState.DUPLICATE_TIMESTAMP
    TRANSITIONS[(_s, "unsupported_protocol")] = RemoteState.UNSUPPORTED_PROTOCOL
    TRANSITIONS[(_s, "mismatched_settings")] = RemoteState.MISMATCHED_SETTINGS
for _s in (RemoteState.UNDISCOVERED, RemoteState.DOWN, RemoteState.DISCOVERED, *_REFUSED):
    TRANSITIONS[(_s, "handshake")] = RemoteState.DISCOVERED
TRANSITIONS[(RemoteState.UP, "handshake")] = RemoteState.UP
TRANSITIONS[(RemoteState.DISCOVERED, "heard")] = RemoteState.UP
TRANSITIONS[(RemoteState.UP, "heard")] = RemoteState.UP
TRANSITIONS[(RemoteState.DOWN, "heard")] = RemoteState.UP
TRANSITIONS[(RemoteState.UP, "silent")] = RemoteState.DOWN
TRANSITIONS[(RemoteState.DISCOVERED, "silent")] = RemoteState.DOWN
TRANSITIONS[(RemoteState.UP, "link_lost")] = RemoteState.DOWN
TRANSITIONS[(RemoteState.DISCOVERED, "link_lost")] = RemoteState.DOWN


def location_code(name: str) -> int:
    """Stable 64-bit hash of a node name (the same on every machine and version)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big")


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    name: str
    store_stamp: str
    priority: int = 1  # 0 Never, 1 Normal, 2 High, 3 Highest
    votes: int = 1

    @property
    def location_code(self) -> int:
        return location_code(self.name)


@dataclass(frozen=True, slots=True)
class QuorumPolicy:
    """``majority`` | ``percentage:P`` | ``min_votes:N`` | ``disabled``."""

    kind: str = "majority"
    value: int = 0

    @classmethod
    def parse(cls, text: str) -> QuorumPolicy:
        kind, _, arg = text.partition(":")
        if kind in ("majority", "disabled") and not arg:
            return cls(kind)
        if kind in ("percentage", "min_votes") and arg.isdigit():
            value = int(arg)
            if kind == "percentage" and not 1 <= value <= 100:
                raise ValueError(f"quorum policy {text!r}: percentage must be 1..100")
            if kind == "min_votes" and value < 1:
                raise ValueError(f"quorum policy {text!r}: min_votes must be >= 1")
            return cls(kind, value)
        raise ValueError(f"quorum policy {text!r}: use majority, percentage:P, min_votes:N or disabled")

    def __str__(self) -> str:
        return f"{self.kind}:{self.value}" if self.kind in ("percentage", "min_votes") else self.kind

    def holds(self, up_votes: int, total_votes: int) -> bool:
        if self.kind == "disabled":
            return True
        if self.kind == "majority":
            return up_votes * 2 > total_votes
        if self.kind == "percentage":
            return up_votes * 100 >= self.value * total_votes
        return up_votes >= self.value


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


@dataclass(frozen=True, slots=True)
class AvailabilityZone:
    """A named set of members that give each other quorum under ``policy``; its spec is
    ``NAME=MEMBER,MEMBER,...[:POLICY]`` (``east=node1,node2,node3:percentage:60``)."""

    name: str
    members: tuple[str, ...]
    policy: QuorumPolicy = QuorumPolicy()

    @classmethod
    def parse(cls, spec: str) -> AvailabilityZone:
        name, sep, rest = spec.partition("=")
        listed, _, policy = rest.partition(":")
        members = tuple(m.strip() for m in listed.split(","))
        if not sep or not _NAME.match(name) or not all(_NAME.match(m) for m in members):
            raise ValueError(f"availability zone {spec!r}: expected NAME=MEMBER,MEMBER,...[:POLICY] (names of "
                             "letters, digits, '_', '.', '-')")
        if len(set(members)) != len(members):
            raise ValueError(f"availability zone {name}: a member is named twice")
        try:
            return cls(name, members, QuorumPolicy.parse(policy) if policy else QuorumPolicy())
        except ValueError as exc:
            raise ValueError(f"availability zone {name}: {exc}") from None

    def __str__(self) -> str:
        return f"{self.name}={','.join(self.members)}:{self.policy}"


@dataclass(frozen=True, slots=True)
class ZoneQuorum:
    """An availability zone's quorum as this node counts it: ``members`` are those of the
    group now (a member removed from the group leaves its zones)."""

    zone: AvailabilityZone
    state: QuorumState
    up_votes: int
    total_votes: int
    members: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RemoteStateChanged:
    node: str
    old: RemoteState
    new: RemoteState
    reason: str


@dataclass(frozen=True, slots=True)
class QuorumStateChanged:
    old: QuorumState
    new: QuorumState
    up_votes: int
    total_votes: int
    #: the availability zone whose quorum failed ("" the group's, or none failed)
    zone: str = ""


Change = RemoteStateChanged | QuorumStateChanged
Notifier = Callable[[RemoteStateChanged], None]


@dataclass
class _Remote:
    state: RemoteState = RemoteState.UNDISCOVERED
    identity: NodeIdentity | None = None
    last_heard: float = 0.0


@dataclass
class Membership:
    me: NodeIdentity
    peers: tuple[str, ...]  # the other members, by name (static discovery)
    non_response_timeout: float = 1.0
    policy: QuorumPolicy = field(default_factory=QuorumPolicy)
    quorum_override: int | None = None  # minimum nodes up, overriding the policy (temporary)
    #: two-node group: this node keeps quorum alone when its peer is gone
    designated_primary: bool = False
    #: the availability zones (those this node is not in are kept, and not counted)
    zones: tuple[AvailabilityZone, ...] = ()

    def __post_init__(self) -> None:
        if self.me.votes < 0 or not 0 <= self.me.priority <= 3:
            raise ValueError("votes must be >= 0 and priority 0..3")
        self._remotes = {p: _Remote() for p in self.peers if p != self.me.name}
        if self.quorum_override is not None and not 1 <= self.quorum_override <= 1 + len(self._remotes):
            raise ValueError(f"quorum_override must be 1..{1 + len(self._remotes)}")
        self._notifiers: list[Notifier] = []
        #: the availability zone whose quorum this node lacks ("" none: its state is the group's)
        self.disabled_by = ""
        self.quorum_state, _, _, self.disabled_by = self._compute_quorum()

    # -- queries ----------------------------------------------------------------------------

    def state(self, node: str) -> RemoteState:
        return self._remotes[node].state

    def identity(self, node: str) -> NodeIdentity | None:
        return self._remotes[node].identity

    def up(self) -> list[str]:
        return [n for n, r in self._remotes.items() if r.state is RemoteState.UP]

    def zone_quorums(self) -> list[ZoneQuorum]:
        """The quorum of each availability zone this node is in, as it counts it now."""
        out = []
        for z in self.zones:
            if self.me.name not in z.members:
                continue
            members = tuple(m for m in z.members if m == self.me.name or m in self._remotes)
            up, total = self._votes(members)
            if not z.policy.holds(up, total):
                state = QuorumState.DISABLED
            elif all(m == self.me.name or self._remotes[m].state is RemoteState.UP for m in members):
                state = QuorumState.ACTIVE
            else:
                state = QuorumState.PARTIAL
            out.append(ZoneQuorum(z, state, up, total, members))
        return out

    # -- notifiers ------------------------------------------------------------------------------

    def add_notifier(self, cb: Notifier) -> None:
        """Install ``cb``; it is called at once for every node already up, then for each change."""
        self._notifiers.append(cb)
        for n, r in self._remotes.items():
            if r.state is RemoteState.UP:
                cb(RemoteStateChanged(n, RemoteState.UNDISCOVERED, RemoteState.UP, "already up"))

    # -- inputs -----------------------------------------------------------------------------------

    def handshake(self, who: NodeIdentity, now: float, *, protocol_ok: bool = True,
                  mismatch: str = "", unsupported: str = "") -> list[Change]:
        """A peer link opened and the peer said who it is; ``mismatch``: how its placement
        settings differ from this node's ("" they agree); ``protocol_ok`` False: no common
        protocol version; ``unsupported``: why its build cannot be a member now ("" it can)."""
        changes: list[Change] = []
        r = self._remotes.get(who.name)
        if r is None:
            return changes  # not a member of this group: the driver refuses the link
        if not protocol_ok or unsupported:
            self._move(who.name, "unsupported_protocol", unsupported or "no common protocol version", changes)
        elif mismatch:
            self._move(who.name, "mismatched_settings", mismatch, changes)
        elif who.location_code == self.me.location_code or any(
                o.identity is not None and o.identity.location_code == who.location_code and n != who.name
                for n, o in self._remotes.items()):
            self._move(who.name, "duplicate_location", f"location code {who.location_code:#x} already in use",
                       changes)
        elif who.store_stamp == self.me.store_stamp or any(
                o.identity is not None and o.identity.store_stamp == who.store_stamp and n != who.name
                for n, o in self._remotes.items()):
            self._move(who.name, "duplicate_timestamp", f"store stamp {who.store_stamp} already in use "
                       "(a copied data directory?)", changes)
        else:
            r.identity = who
            r.last_heard = now
            self._move(who.name, "handshake", "handshake", changes)
            self._move(who.name, "heard", "first frame", changes)
        return self._with_quorum(changes)

    def heard(self, node: str, now: float) -> list[Change]:
        """Any frame from ``node`` (keep-alives included)."""
        changes: list[Change] = []
        r = self._remotes.get(node)
        if r is None or r.state in _REFUSED or r.state is RemoteState.UNDISCOVERED:
            return changes
        r.last_heard = now
        if r.state is RemoteState.UP:
            return changes  # every frame of a live link: nothing moves, the quorum stays
        self._move(node, "heard", "frame received", changes)
        return self._with_quorum(changes)

    def link_lost(self, node: str) -> list[Change]:
        changes: list[Change] = []
        r = self._remotes.get(node)
        if r is not None and r.state in (RemoteState.UP, RemoteState.DISCOVERED):
            self._move(node, "link_lost", "connection closed", changes)
        return self._with_quorum(changes)

    def tick(self, now: float) -> list[Change]:
        changes: list[Change] = []
        for n, r in self._remotes.items():
            if r.state in (RemoteState.UP, RemoteState.DISCOVERED) and now - r.last_heard > self.non_response_timeout:
                self._move(n, "silent", f"no response for {now - r.last_heard:.2f}s", changes)
        return self._with_quorum(changes)

    def set_quorum_override(self, value: int | None) -> list[Change]:
        total = 1 + len(self._remotes)
        if value is not None and not 1 <= value <= total:
            raise ValueError(f"quorum_override must be 1..{total}")
        self.quorum_override = value
        return self._with_quorum([])

    def set_peers(self, peers: tuple[str, ...]) -> list[Change]:
        """The group's members changed (``tandem group add`` / ``remove``): a new one is
        ``Undiscovered`` until its handshake, a removed one is forgotten; the quorum is counted
        over the new list at once."""
        peers = tuple(p for p in peers if p != self.me.name)
        for p in peers:
            self._remotes.setdefault(p, _Remote())
        for p in [p for p in self._remotes if p not in peers]:
            del self._remotes[p]
        self.peers = peers
        if self.quorum_override is not None and self.quorum_override > 1 + len(self._remotes):
            self.quorum_override = 1 + len(self._remotes)
        if self.designated_primary and len(self._remotes) != 1:
            self.designated_primary = False
        return self._with_quorum([])

    def set_designated_primary(self, on: bool) -> list[Change]:
        if on and len(self._remotes) != 1:
            raise ValueError(f"designated_primary: only in a two-node group (this one has {1 + len(self._remotes)})")
        self.designated_primary = on
        return self._with_quorum([])

    # -- internals ---------------------------------------------------------------------------------

    def _move(self, node: str, event: str, reason: str, changes: list[Change]) -> None:
        r = self._remotes[node]
        new = TRANSITIONS.get((r.state, event))
        if new is None:
            raise IllegalTransition(f"{node}: {r.state.value} cannot take {event!r}")
        if new is not r.state:
            change = RemoteStateChanged(node, r.state, new, reason)
            r.state = new
            changes.append(change)
            for cb in self._notifiers:
                cb(change)

    def _votes(self, members: tuple[str, ...] | None = None) -> tuple[int, int]:
        """Votes up and in all among ``members`` (None: the whole group).  Every configured
        member counts towards the total, refused ones too: refusing a peer (a copied store, an
        old version during an upgrade) must not shrink the quorum."""
        known = [r for n, r in self._remotes.items() if members is None or n in members]
        mine = self.me.votes if members is None or self.me.name in members else 0
        up = mine + sum(r.identity.votes for r in known if r.state is RemoteState.UP and r.identity is not None)
        return up, mine + sum(r.identity.votes if r.identity is not None else 1 for r in known)

    def _compute_quorum(self) -> tuple[QuorumState, int, int, str]:
        """The node quorum state, the votes it was counted by and the availability zone that
        failed it ("" the group's policy, or none)."""
        up_votes, total = self._votes()
        if self.designated_primary:
            holds = True  # the two-node group's tie-breaker: it goes on alone
        elif self.quorum_override is not None:
            holds = 1 + len(self.up()) >= self.quorum_override
        else:
            holds = self.policy.holds(up_votes, total)
        if not holds:
            return QuorumState.DISABLED, up_votes, total, ""
        if self.quorum_override is None and not self.designated_primary:  # (an override sets the zones aside)
            for zq in self.zone_quorums():
                if zq.state is QuorumState.DISABLED:
                    return QuorumState.DISABLED, zq.up_votes, zq.total_votes, zq.zone.name
        if all(r.state is RemoteState.UP for r in self._remotes.values()):
            return QuorumState.ACTIVE, up_votes, total, ""
        return QuorumState.PARTIAL, up_votes, total, ""

    def _with_quorum(self, changes: list[Change]) -> list[Change]:
        new, up, total, zone = self._compute_quorum()
        if new is not self.quorum_state or zone != self.disabled_by:
            changes.append(QuorumStateChanged(self.quorum_state, new, up, total, zone))
            self.quorum_state, self.disabled_by = new, zone
        return changes
