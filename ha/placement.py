"""Distribution policies: which nodes hold each partition of a queue, in priority order.

A partition's node list is ordered: the first available node is its active, the
rest are replicas, each ``sync`` (a voter) or ``async`` (a learner).

:func:`place` is the ``dynamic`` distribution: actives spread evenly over the group's
nodes (never a node of priority 0, which cannot be elected), replicas after them in
rotating order; recomputed when a node joins or leaves.  With ``zones`` (node -> zone
label, Kafka's racks, NATS's ``unique_tag``) each replica is taken from a zone the list
holds the fewest copies in so far: a partition's copies are in as many distinct zones as
there are, so losing a whole zone costs each partition at most its share of copies there.

A queue declared with explicit node lists (``static`` distribution, broker.partitions.moves) has
them instead, read by :func:`listed`, as a moved partition has its move's.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class ReplicaKind(Enum):
    SYNC = "sync"
    ASYNC = "async"


@dataclass(frozen=True, slots=True)
class NodeList:
    """``nodes[0]`` is the preferred active; ``kinds[i]`` says how ``nodes[i]`` replicates."""

    nodes: tuple[str, ...]
    kinds: tuple[ReplicaKind, ...]

    @property
    def voters(self) -> tuple[str, ...]:
        return tuple(n for n, k in zip(self.nodes, self.kinds) if k is ReplicaKind.SYNC)

    @property
    def learners(self) -> tuple[str, ...]:
        return tuple(n for n, k in zip(self.nodes, self.kinds) if k is ReplicaKind.ASYNC)

    def preferred(self, drained: frozenset[str] = frozenset()) -> str:
        """The node failback hands the partition to: the first voter of the list that is not
        drained (``tandem node drain``); the first node if every voter is drained."""
        return next((n for n in self.voters if n not in drained), self.nodes[0])


@dataclass(frozen=True, kw_only=True, slots=True)
class DistributionPolicy:
    replicas: int = 2  # copies besides the active
    sync_replicas: int = 2  # how many of them are sync (the rest async)
    #: (node, zone) for every node; empty: no zones (every node a zone of its own)
    zones: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.sync_replicas <= self.replicas:
            raise ValueError("sync_replicas must be 0..replicas")


def place(policy: DistributionPolicy, partitions: int, nodes: list[str],
          priorities: dict[str, int] | None = None) -> list[NodeList]:
    """Node lists for ``partitions`` partitions over ``nodes`` (the group's members, in a
    stable order) under ``policy``."""
    priorities = priorities or {}
    if not nodes:
        raise ValueError("no nodes to place partitions on")
    if len(set(nodes)) != len(nodes):
        raise ValueError("node names must be distinct")
    electable = [n for n in nodes if priorities.get(n, 1) > 0]
    if not electable:
        raise ValueError("every node has priority 0: no partition could ever have an active")
    zone_of = dict(policy.zones)
    if zone_of and set(zone_of) != set(nodes):
        missing, unknown = sorted(set(nodes) - set(zone_of)), sorted(set(zone_of) - set(nodes))
        raise ValueError("zones must name every node once" + (f"; no zone for {', '.join(missing)}" if missing else "")
                         + (f"; not a node: {', '.join(unknown)}" if unknown else ""))
    copies = min(policy.replicas, len(nodes) - 1)
    out = []
    for p in range(partitions):
        active = electable[p % len(electable)]
        start = nodes.index(active)
        rotation = [nodes[(start + k) % len(nodes)] for k in range(1, len(nodes))]
        rest = _spread(active, rotation, copies, zone_of) if zone_of else rotation[:copies]
        kinds = [ReplicaKind.SYNC] + [ReplicaKind.SYNC if i < policy.sync_replicas else ReplicaKind.ASYNC
                                      for i in range(len(rest))]
        out.append(NodeList(tuple([active] + rest), tuple(kinds)))
    return out


def listed(policy: DistributionPolicy, nodes: tuple[str, ...]) -> NodeList:
    """An explicit node list (``tandem partition move``): each entry a node name, or
    ``name:sync`` / ``name:async`` for its kind; without one, the kind ``place`` gives by
    position (the first node and the next ``sync_replicas`` sync, the rest async)."""
    names, kinds = [], []
    for i, spec in enumerate(nodes):
        name, _, kind = spec.partition(":")
        names.append(name)
        kinds.append(ReplicaKind(kind) if kind else
                     ReplicaKind.SYNC if i <= policy.sync_replicas else ReplicaKind.ASYNC)
    return NodeList(tuple(names), tuple(kinds))


def spec_of(nodes: NodeList) -> tuple[str, ...]:
    """``nodes`` as explicit entries, ``name:sync`` / ``name:async`` each."""
    return tuple(f"{n}:{k.value}" for n, k in zip(nodes.nodes, nodes.kinds))


def _spread(active: str, rotation: list[str], copies: int, zone_of: dict[str, str]) -> list[str]:
    """``copies`` replicas for a partition whose active is ``active``: each time the first node
    of ``rotation`` (the nodes after the active, in turn) among those in the zones the list
    holds the fewest copies in so far."""
    held = {z: 0 for z in zone_of.values()}
    held[zone_of[active]] += 1
    left = list(rotation)
    rest: list[str] = []
    for _ in range(copies):
        fewest = min(held[zone_of[n]] for n in left)
        pick = next(n for n in left if held[zone_of[n]] == fewest)
        left.remove(pick)
        held[zone_of[pick]] += 1
        rest.append(pick)
    return rest


def unsafe_to_replace(old: NodeList, new: NodeList) -> bool:
    """Whether a partition placed on ``old`` may not simply be opened on ``new`` instead (the
    group restarted with other members or settings, no copy moved).  An entry committed on a
    majority of the old voters may be missing on the rest of them, and is missing on every
    new voter that was not one: if those could make up a majority of the new voters, they
    could elect a node without it, and it would be lost."""
    old_voters, new_voters = set(old.voters), set(new.voters)
    if new_voters == old_voters:
        return False
    n = len(old_voters)
    kept = len(new_voters & old_voters)
    lacking = len(new_voters - old_voters) + min(kept, n - (n // 2 + 1))
    return lacking >= len(new_voters) // 2 + 1
