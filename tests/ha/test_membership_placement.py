from __future__ import annotations

from collections import Counter

import pytest

from ha.membership import (
    Membership,
    NodeIdentity,
    QuorumPolicy,
    QuorumState,
    QuorumStateChanged,
    RemoteState,
    RemoteStateChanged,
    location_code,
)
from ha.placement import DistributionPolicy, ReplicaKind, place


def ident(name: str, stamp: str | None = None, votes: int = 1) -> NodeIdentity:
    return NodeIdentity(name=name, store_stamp=stamp or f"stamp-{name}", votes=votes)


def group(**kw: object) -> Membership:
    return Membership(me=ident("a"), peers=("a", "b", "c"), non_response_timeout=1.0, **kw)  # type: ignore[arg-type]


def test_location_code_is_stable_and_64_bit() -> None:
    assert location_code("node1") == location_code("node1") != location_code("node2")
    assert 0 <= location_code("node1") < 2**64


def test_states_keepalive_and_quorum() -> None:
    m = group()
    assert m.state("b") is RemoteState.UNDISCOVERED and m.quorum_state is QuorumState.DISABLED
    changes = m.handshake(ident("b"), now=0.0)
    assert [c.new for c in changes if isinstance(c, RemoteStateChanged)] == [RemoteState.DISCOVERED, RemoteState.UP]
    assert m.quorum_state is QuorumState.PARTIAL  # a + b of 3: majority, but c not up
    m.handshake(ident("c"), now=0.0)
    assert m.quorum_state is QuorumState.ACTIVE
    m.heard("b", 0.8)
    changes = m.tick(1.5)  # c silent for 1.5 s > 1.0
    assert m.state("c") is RemoteState.DOWN and m.state("b") is RemoteState.UP
    assert any(isinstance(c, QuorumStateChanged) and c.new is QuorumState.PARTIAL for c in changes)
    m.link_lost("b")
    assert m.quorum_state is QuorumState.DISABLED
    m.heard("c", 2.0)
    assert m.state("c") is RemoteState.UP and m.quorum_state is QuorumState.PARTIAL


def test_duplicates_and_unsupported_protocol_are_refused() -> None:
    m = group()
    m.handshake(ident("b", stamp="same"), now=0.0)
    m.handshake(ident("c", stamp="same"), now=0.0)
    assert m.state("c") is RemoteState.DUPLICATE_TIMESTAMP
    m2 = group()
    m2.handshake(ident("b"), now=0.0, protocol_ok=False)
    assert m2.state("b") is RemoteState.UNSUPPORTED_PROTOCOL
    m3 = Membership(me=ident("a"), peers=("a", "a2"))
    m3.handshake(NodeIdentity(name="a2", store_stamp="x"), now=0)
    assert m3.state("a2") is RemoteState.UP  # different name, different location code
    m4 = group()
    m4.handshake(ident("b", stamp="stamp-a"), now=0.0)  # our own store, copied
    assert m4.state("b") is RemoteState.DUPLICATE_TIMESTAMP


def test_notifiers_see_already_up_nodes_then_changes_in_order() -> None:
    m = group()
    m.handshake(ident("b"), now=0.0)
    seen: list[tuple[str, str]] = []
    m.add_notifier(lambda c: seen.append((c.node, c.new.value)))
    assert seen == [("b", "Up")]
    m.tick(5.0)
    assert seen == [("b", "Up"), ("b", "Down")]


@pytest.mark.parametrize("policy, up, holds", [
    ("majority", 1, False), ("majority", 2, True), ("percentage:66", 2, True), ("percentage:67", 2, False),
    ("min_votes:3", 2, False), ("disabled", 1, True),
])
def test_quorum_policies(policy: str, up: int, holds: bool) -> None:
    assert QuorumPolicy.parse(policy).holds(up, 3) is holds


def test_quorum_policy_parse_errors_and_override() -> None:
    for bad in ["most", "percentage:0", "percentage:x", "min_votes:0", "majority:2"]:
        with pytest.raises(ValueError):
            QuorumPolicy.parse(bad)
    m = group()
    assert m.quorum_state is QuorumState.DISABLED
    m.set_quorum_override(1)
    assert m.quorum_state is QuorumState.PARTIAL
    with pytest.raises(ValueError):
        m.set_quorum_override(4)


def test_votes_weigh_in_quorum() -> None:
    m = Membership(me=ident("a", votes=3), peers=("a", "b", "c"))
    assert m.quorum_state is QuorumState.PARTIAL  # 3 of 5 votes with nobody else up


def test_dynamic_placement_spreads_actives_and_rotates_replicas() -> None:
    lists = place(DistributionPolicy(replicas=2, sync_replicas=1), 6, ["a", "b", "c"])
    assert Counter(nl.nodes[0] for nl in lists) == {"a": 2, "b": 2, "c": 2}
    assert lists[0].nodes == ("a", "b", "c") and lists[1].nodes == ("b", "c", "a")
    assert lists[0].kinds == (ReplicaKind.SYNC, ReplicaKind.SYNC, ReplicaKind.ASYNC)
    assert lists[0].voters == ("a", "b") and lists[0].learners == ("c",)


def test_dynamic_placement_never_makes_priority_zero_active_and_shrinks() -> None:
    lists = place(DistributionPolicy(), 4, ["a", "b", "c"], {"b": 0})
    assert all(nl.nodes[0] != "b" for nl in lists)
    small = place(DistributionPolicy(replicas=2), 2, ["a", "b"])
    assert all(len(nl.nodes) == 2 for nl in small)
    with pytest.raises(ValueError):
        place(DistributionPolicy(), 1, ["a"], {"a": 0})


def test_refused_peers_still_count_towards_the_quorum_total() -> None:
    m = group()
    m.handshake(ident("b"), now=0.0, protocol_ok=False)
    m.handshake(ident("c"), now=0.0, protocol_ok=False)
    assert m.quorum_state is QuorumState.DISABLED  # 1 of 3, not "1 of 1"


def test_placement_and_replica_config_refuse_nonsense() -> None:
    from ha.replica import ReplicaConfig

    with pytest.raises(ValueError, match="distinct"):
        place(DistributionPolicy(), 1, ["a", "a"])
    for bad in [dict(designated_primary="z"), dict(priorities={"a": 7}), dict(max_append=0),
                dict(heartbeat_interval=2.0)]:
        with pytest.raises(ValueError):
            ReplicaConfig(node="a", voters=("a", "b"), **bad)  # type: ignore[arg-type]
