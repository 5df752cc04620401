"""Zone-aware placement (``zones``): every partition's copies in as many distinct zones as
there are, actives still spread evenly, and the same lists on every node."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from ha.placement import DistributionPolicy, NodeList, ReplicaKind, place, unsafe_to_replace


def zoned(nodes: list[str], zones: str, **kw: object) -> DistributionPolicy:
    return DistributionPolicy(zones=tuple(zip(nodes, zones)), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("n", range(3, 10))
@pytest.mark.parametrize("zone_count", [2, 3, 4])
def test_copies_are_in_distinct_zones_and_actives_spread_evenly(n: int, zone_count: int) -> None:
    nodes = [f"n{i}" for i in range(1, n + 1)]
    labels = "".join("abcd"[i % zone_count] for i in range(n))  # round robin, as tandem cluster up --zones
    zone_of = dict(zip(nodes, labels))
    lists = place(zoned(nodes, labels), 60, nodes)
    for nl in lists:
        copies = Counter(zone_of[x] for x in nl.nodes)
        assert len(nl.nodes) == min(3, n) and len(set(nl.nodes)) == len(nl.nodes)
        # as many distinct zones as copies allow, and never two copies in a zone while one is empty
        assert len(copies) == min(len(nl.nodes), zone_count), (nl.nodes, labels)
        assert max(copies.values()) - min(copies.values()) <= 1
    actives = Counter(nl.nodes[0] for nl in lists)
    assert max(actives.values()) - min(actives.values()) <= 1
    held = Counter(x for nl in lists for x in nl.nodes)
    assert min(held.values()) > 0


def test_a_whole_zone_lost_leaves_every_partition_a_majority() -> None:
    nodes = ["n1", "n2", "n3", "n4", "n5"]
    labels = "abcab"
    lists = place(zoned(nodes, labels), 30, nodes)
    for zone in "abc":
        down = {x for x, z in zip(nodes, labels) if z == zone}
        assert all(sum(x not in down for x in nl.voters) >= 2 for nl in lists), zone


def test_one_zone_per_node_places_as_without_zones() -> None:
    for n in range(2, 8):
        nodes = [f"n{i}" for i in range(n)]
        assert place(zoned(nodes, "abcdefgh"[:n]), 12, nodes) == place(DistributionPolicy(), 12, nodes)


def test_the_lists_depend_only_on_the_members_and_their_zones() -> None:
    nodes = ["a", "b", "c", "d"]
    first = place(zoned(nodes, "xxyy"), 8, nodes)
    for order in itertools.permutations(zip(nodes, "xxyy")):
        assert place(DistributionPolicy(zones=tuple(order)), 8, nodes) == first


def test_zones_must_name_every_node() -> None:
    with pytest.raises(ValueError, match="no zone for c"):
        place(DistributionPolicy(zones=(("a", "x"), ("b", "y"))), 1, ["a", "b", "c"])
    with pytest.raises(ValueError, match="not a node: z"):
        place(DistributionPolicy(zones=(("a", "x"), ("b", "y"), ("c", "x"), ("z", "y"))), 1, ["a", "b", "c"])


def nl(*nodes: str) -> NodeList:
    return NodeList(nodes, (ReplicaKind.SYNC,) * len(nodes))


def test_which_placements_may_replace_another_without_moving_a_copy() -> None:
    assert not unsafe_to_replace(nl("a", "b", "c"), nl("c", "a", "b"))  # another order: the same voters
    assert not unsafe_to_replace(nl("a", "b", "c"), nl("a", "b"))  # 3 -> 2: both of them must vote
    assert not unsafe_to_replace(nl("a", "b", "c"), nl("a", "b", "c", "d"))  # d and one lagging: 2 of 4
    assert unsafe_to_replace(nl("a", "b", "c"), nl("d", "e", "a"))  # d and e elect d, empty
    assert unsafe_to_replace(nl("a", "b", "c"), nl("a", "b", "d"))  # d and a lagging b
    assert unsafe_to_replace(nl("a", "b", "c", "d", "e"), nl("a", "b", "c"))  # a, b may both lack it
    assert not unsafe_to_replace(nl("a", "b", "c", "d", "e"), nl("a", "b", "c", "d"))  # 3 of 4 hold one
