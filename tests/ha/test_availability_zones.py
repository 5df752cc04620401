"""Availability zones (ha.membership): a node counts the quorum of every zone it is in
besides the group's, and is Disabled while any of them fails."""

from __future__ import annotations

import pytest

from broker.config import ConfigError, build_config
from ha.membership import AvailabilityZone, Membership, NodeIdentity, QuorumPolicy, QuorumState, QuorumStateChanged


def ident(name: str, votes: int = 1) -> NodeIdentity:
    return NodeIdentity(name=name, store_stamp=f"stamp-{name}", votes=votes)


def five(me: str = "c", **kw: object) -> Membership:
    """a..e; c is in both zones: east = a, b, c and west = c, d, e."""
    zones = (AvailabilityZone.parse("east=a,b,c"), AvailabilityZone.parse("west=c,d,e:min_votes:3"))
    m = Membership(me=ident(me), peers=("a", "b", "c", "d", "e"), zones=zones, **kw)  # type: ignore[arg-type]
    for n in "abcde":
        if n != me:
            m.handshake(ident(n), now=0.0)
    return m


def test_a_node_is_disabled_when_any_zone_it_is_in_loses_quorum_though_the_group_has_it() -> None:
    m = five()
    assert m.quorum_state is QuorumState.ACTIVE and m.disabled_by == ""
    m.link_lost("a")
    assert m.quorum_state is QuorumState.PARTIAL  # east: c, b of 3 up
    changes = m.link_lost("b")
    # The group has c, d, e of 5: a majority.  east has c alone of 3: no quorum there.
    assert m.quorum_state is QuorumState.DISABLED and m.disabled_by == "east"
    change = next(c for c in changes if isinstance(c, QuorumStateChanged))
    assert (change.zone, change.up_votes, change.total_votes) == ("east", 1, 3)
    assert [(zq.zone.name, zq.state) for zq in m.zone_quorums()] == [
        ("east", QuorumState.DISABLED), ("west", QuorumState.ACTIVE)]
    m.heard("b", 0.1)
    assert m.quorum_state is QuorumState.PARTIAL and m.disabled_by == ""


def test_each_zone_counts_by_its_own_policy() -> None:
    m = five()
    m.link_lost("d")  # west's min_votes:3 fails with c and e up, though that is a majority of three
    assert m.disabled_by == "west"
    assert next(zq for zq in m.zone_quorums() if zq.zone.name == "west").up_votes == 2


def test_zones_a_node_is_not_in_do_not_gate_it() -> None:
    m = five(me="a")
    m.link_lost("d")
    m.link_lost("e")  # west has no quorum, but a is not in west
    assert m.quorum_state is QuorumState.PARTIAL and [zq.zone.name for zq in m.zone_quorums()] == ["east"]


def test_the_groups_own_policy_comes_first_and_names_no_zone() -> None:
    m = five()
    for n in "abd":
        m.link_lost(n)
    assert m.quorum_state is QuorumState.DISABLED and m.disabled_by == ""


def test_an_override_sets_the_zones_aside_with_the_groups_policy() -> None:
    m = five()
    m.link_lost("a")
    m.link_lost("b")
    assert m.disabled_by == "east"
    m.set_quorum_override(1)
    assert m.quorum_state is QuorumState.PARTIAL and m.disabled_by == ""
    m.set_quorum_override(None)
    assert m.disabled_by == "east"


def test_a_member_removed_from_the_group_leaves_its_zones() -> None:
    m = five()
    m.link_lost("a")
    m.link_lost("b")
    assert m.disabled_by == "east"
    m.set_peers(("c", "d", "e"))  # a and b removed: east is c alone, which holds
    assert m.quorum_state is QuorumState.ACTIVE and m.disabled_by == ""
    assert m.zone_quorums()[0].members == ("c",)


def test_votes_weigh_in_a_zone() -> None:
    zones = (AvailabilityZone.parse("east=a,b,c"),)
    m = Membership(me=ident("a", votes=3), peers=("a", "b", "c"), zones=zones)
    m.handshake(ident("b"), now=0.0)
    assert m.quorum_state is QuorumState.PARTIAL  # 4 of 5 votes in the group and in east


@pytest.mark.parametrize("spec,why", [
    ("east", "expected NAME=MEMBER"),
    ("east=", "expected NAME=MEMBER"),
    ("east=a,,b", "expected NAME=MEMBER"),
    ("east=a,a", "named twice"),
    ("east=a,b:sometimes", "use majority, percentage:P"),
    ("east=a,b:percentage:0", "percentage must be 1..100"),
])
def test_a_bad_zone_is_refused_by_name(spec: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        AvailabilityZone.parse(spec)


def test_a_zone_reads_back_as_it_was_written() -> None:
    z = AvailabilityZone.parse("west=c,d,e:percentage:60")
    assert (z.members, z.policy) == (("c", "d", "e"), QuorumPolicy("percentage", 60))
    assert str(z) == "west=c,d,e:percentage:60"
    assert str(AvailabilityZone.parse("east=a")) == "east=a:majority"


def _cfg(**kw: object) -> None:
    build_config({"name": "a", "peer_port": 0, "peers": ["b=127.0.0.1:1", "c=127.0.0.1:2"], **kw})


def test_the_setting_is_checked_at_start() -> None:
    _cfg(availability_zones=["east=a,b", "west=a,c:min_votes:2"])
    _cfg(availability_zones="east=a,b,c")  # one zone as a string: its commas separate members
    with pytest.raises(ConfigError, match="east: not a member of the group: x"):
        _cfg(availability_zones=["east=a,x"])
    with pytest.raises(ConfigError, match="east is named twice"):
        _cfg(availability_zones=["east=a,b", "east=a,c"])
    with pytest.raises(ConfigError, match="availability_zones: availability zone east: quorum policy 'nope'"):
        _cfg(availability_zones=["east=a:nope"])
    with pytest.raises(ConfigError, match="only in a replicated group"):
        build_config({"name": "a", "availability_zones": ["east=a"]})
    with pytest.raises(ConfigError, match="expected a list"):
        _cfg(availability_zones=[1])
