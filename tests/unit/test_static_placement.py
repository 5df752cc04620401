"""A declare's explicit node lists (``static`` distribution, broker.partitions.moves): how they are
read and checked, and how a list changes when a member leaves the group."""

from __future__ import annotations

import pytest

from broker.messaging.mapper import parse_static
from broker.partitions.moves import check_nodes, without_leaving
from client.errors import InvalidArgumentError
from client.protocol.frames import placement_text


def test_lists_are_read_one_per_partition() -> None:
    assert parse_static("node1, node2,node3:async ;node2,node1", 2) == (
        ("node1", "node2", "node3:async"), ("node2", "node1"))
    with pytest.raises(InvalidArgumentError, match=r"placement: 3 node list\(s\) for 2 partition\(s\)"):
        parse_static("a;b;c", 2)
    with pytest.raises(InvalidArgumentError, match="placement: partition 1 has no nodes"):
        parse_static("a; ,", 2)


def test_a_client_gives_lists_or_their_text() -> None:
    assert placement_text([["node1", "node2:async"], ["node2"]]) == "node1,node2:async;node2"
    assert placement_text("node1;node2") == "node1;node2"
    assert placement_text(None) == ""


@pytest.mark.parametrize(("nodes", "why"), [
    ((), "no nodes given"),
    (("n1", "n9"), "no member n9 (members: n1, n2, n3)"),
    (("n1", "n1:async"), "a node appears twice in n1,n1:async"),
    (("n1:quick",), "'n1:quick': a node's kind is sync or async"),
    (("n2:async", "n1"), "the first node, n2, is the active: it cannot be async"),
])
def test_a_list_is_checked_against_the_members(nodes: tuple[str, ...], why: str) -> None:
    with pytest.raises(InvalidArgumentError, match=f"^placement: {why.replace('(', '.').replace(')', '.')}"):
        check_nodes("placement", nodes, ("n1", "n2", "n3"))
    check_nodes("placement", ("n2", "n1:async", "n3:sync"), ("n1", "n2", "n3"))


def test_a_list_keeps_its_nodes_while_none_leaves() -> None:
    nodes = ("n3:sync", "n1:async")
    assert without_leaving(nodes, ["n1", "n2", "n3", "n4"], {}) is nodes


def test_a_leaving_node_is_replaced_in_its_place_and_kind() -> None:
    members = ["n1", "n2", "n4"]  # n3 is leaving
    assert without_leaving(("n3:sync", "n1:async"), members, {}) == ("n2:sync", "n1:async")
    assert without_leaving(("n1:sync", "n3:async"), members, {}) == ("n1:sync", "n2:async")
    assert without_leaving(("n2:sync", "n1:sync", "n3:sync"), members, {}) == ("n2:sync", "n1:sync", "n4:sync")


def test_with_zones_the_replacement_comes_from_the_leaving_nodes_zone() -> None:
    zones = {"n1": "a", "n2": "b", "n3": "c", "n4": "a", "n5": "c"}
    members = ["n1", "n2", "n4", "n5"]
    assert without_leaving(("n1:sync", "n3:sync"), members, zones) == ("n1:sync", "n5:sync")
    # no member is left in that zone: one from the zone the list holds fewest copies in
    zones = {"n1": "a", "n2": "b", "n3": "c", "n4": "a"}
    assert without_leaving(("n1:sync", "n3:sync"), ["n1", "n2", "n4"], zones) == ("n1:sync", "n2:sync")


def test_a_list_shrinks_where_every_member_is_on_it_and_its_active_stays_a_voter() -> None:
    assert without_leaving(("n3:sync", "n1:async", "n2:sync"), ["n1", "n2"], {}) == ("n1:sync", "n2:sync")


class _Host:
    def __init__(self) -> None:
        self.changed: list[tuple[int, int]] = []

    def placement_changed(self, key: tuple[int, int]) -> None:
        self.changed.append(key)


def test_the_mark_is_stored_kept_through_a_move_and_read_back() -> None:
    from broker.partitions.moves import Moves
    from storage.base import PutMeta, SetPlacement

    host = _Host()
    moves = Moves(None, host, None)  # type: ignore[arg-type]  # (no proposal, no task)
    (stored,) = moves.apply(SetPlacement(4, 0, ("n3:sync", "n1:async"), False, True))
    assert stored == PutMeta("placed.4.0", "placed n3:sync,n1:async static") and moves.static == {(4, 0)}
    moves.apply(SetPlacement(4, 1, ("n1", "n2"), True))
    again = Moves(None, host, None)  # type: ignore[arg-type]
    again.load({"placed.4.0": "placed n3:sync,n1:async static", "placed.4.1": "moving n1,n2",
                "placed.5.0": "placed n1 static"}, {4})
    assert again.static == {(4, 0)} and again.moving == {(4, 1)}
    assert again.snapshot() == moves.snapshot() == [SetPlacement(4, 0, ("n3:sync", "n1:async"), False, True),
                                                    SetPlacement(4, 1, ("n1", "n2"), True)]
    again.forget(4)
    assert not again.static and not again.placed
