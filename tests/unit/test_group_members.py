"""broker.partitions.members: what a member does with a committed change of the group's members (what
goes to its store, what it recovers), a re-spread's rounds (which moves it starts, when it
ends the change), the quorum over a changed list (ha.membership) and the peer handshake's
placement check once the list is the group's (broker.peers.placement)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path

import pytest

from broker.config import NodeConfig
from broker.node.placement import GroupPlacement
from broker.partitions.members import GROUP_KEY, MAX_MOVES, GroupMembers
from broker.peers.placement import placement_mismatch
from client.testing import FakeClock
from ha.membership import Membership, NodeIdentity, QuorumState
from storage.base import PutMeta, SetGroup

Key = tuple[int, int]


class Member:
    """What GroupMembers reads of its node here: where partitions are, where the policy puts
    them, the moves it starts."""

    def __init__(self, placed: dict[Key, tuple[str, ...]], targets: dict[Key, tuple[str, ...]]) -> None:
        self.placed, self.targets = placed, targets
        self.moving_now: set[Key] = set()
        self.started: list[tuple[Key, tuple[str, ...]]] = []
        self.changes = 0

    def members_changed(self) -> None:
        self.changes += 1

    def policy_targets(self) -> dict[Key, tuple[str, ...]]:
        return self.targets

    def nodes_of(self, key: Key) -> tuple[str, ...]:
        return self.placed[key]

    @property
    def moving(self) -> Collection[Key]:
        return self.moving_now

    async def start(self, key: Key, nodes: tuple[str, ...], by: str) -> None:
        self.started.append((key, nodes))
        self.moving_now.add(key)


def group(placed: dict[Key, tuple[str, ...]] | None = None, targets: dict[Key, tuple[str, ...]] | None = None,
          zones: Mapping[str, str] | None = None) -> tuple[GroupMembers, Member]:
    m = Member(placed or {}, targets or {})
    return GroupMembers(None, m, m, ("node2", "node1", "node3"), zones or {}), m  # type: ignore[arg-type]


ADD = SetGroup(("node1", "node2", "node3", "node4"), ("node4=10.0.0.4:7781",), (), (), True)


def test_until_a_change_the_list_is_the_settings_then_the_committed_one() -> None:
    g, m = group(zones={"node1": "a", "node2": "b", "node3": "c"})
    assert not g.changed() and g.members == ("node1", "node2", "node3") and g.placing == g.members
    assert g.zones == {"node1": "a", "node2": "b", "node3": "c"} and g.addresses == {}
    ops = g.apply(SetGroup(ADD.members, ADD.addresses, ("node1=a", "node2=b", "node3=c", "node4=a"), (), True))
    assert g.changed() and m.changes == 1 and g.respread
    assert g.members == ("node1", "node2", "node3", "node4") and g.addresses == {"node4": ("10.0.0.4", 7781)}
    assert g.zones["node4"] == "a"
    assert len(ops) == 1 and isinstance(ops[0], PutMeta) and ops[0].key == GROUP_KEY


def test_a_leaving_member_is_a_member_but_not_placed_on() -> None:
    g, _m = group()
    g.apply(SetGroup(("node1", "node2", "node3"), (), (), ("node1",), True))
    assert g.members == ("node1", "node2", "node3") and g.placing == ("node2", "node3")
    assert g.leaving == {"node1"}


def test_the_stored_list_is_what_a_restart_recovers() -> None:
    g, _m = group()
    (op,) = g.apply(ADD)
    assert isinstance(op, PutMeta)
    again, m2 = group()
    again.load({op.key: op.value})
    assert again.current == ADD and m2.changes == 0  # (loading acts on nothing: the node starts from it)
    broken, _ = group()
    broken.load({GROUP_KEY: "{not json"})
    assert not broken.changed()  # (logged; the settings' list holds)


def test_the_same_change_twice_acts_once() -> None:
    g, m = group()
    g.apply(ADD)
    g.apply(ADD)
    assert m.changes == 1


@pytest.mark.asyncio
async def test_a_respread_round_starts_at_most_max_moves_and_skips_the_moving() -> None:
    old, new = ("node1:sync", "node2:sync"), ("node4:sync", "node2:sync")
    placed = {(1, p): old for p in range(5)}
    g, m = group(placed, {(1, p): new for p in range(5)})
    g.apply(ADD)
    m.moving_now.add((1, 0))  # (an operator's move, under way)
    await g.step(settled=True)
    assert [k for k, _ in m.started] == [(1, p) for p in range(1, MAX_MOVES)]
    assert all(nodes == new for _, nodes in m.started)


@pytest.mark.asyncio
async def test_a_respread_ends_once_everything_is_placed_and_the_catalogue_settled() -> None:
    where = {(1, 0): ("node4:sync", "node2:sync")}
    g, m = group(dict(where), dict(where))
    g.apply(ADD)
    ended: list[bool] = []

    async def settle(hops: int = 0) -> None:
        ended.append(True)

    g.settle = settle  # type: ignore[method-assign]  # (the commit through the catalogue is the node's)
    await g.step(settled=False)
    assert ended == [] and m.started == []  # the catalogue's members are still changing
    m.moving_now.add((1, 0))
    await g.step(settled=True)
    assert ended == []  # a move is under way
    m.moving_now.clear()
    await g.step(settled=True)
    assert ended == [True]


def test_the_quorum_counts_the_changed_list_at_once() -> None:
    me = NodeIdentity("node1", "s1")
    m = Membership(me=me, peers=("node2", "node3"))
    m.handshake(NodeIdentity("node2", "s2"), 0.0)
    m.handshake(NodeIdentity("node3", "s3"), 0.0)
    assert m.quorum_state is QuorumState.ACTIVE
    m.set_peers(("node2", "node3", "node4", "node5"))  # two new members, not up yet: 3 of 5
    assert m.quorum_state is QuorumState.PARTIAL
    m.link_lost("node3")  # 2 of 5
    assert m.quorum_state is QuorumState.DISABLED
    m.set_peers(("node2", "node3"))  # back to three: 2 of 3
    assert m.quorum_state is QuorumState.PARTIAL
    with pytest.raises(KeyError):
        m.state("node4")


def test_once_the_list_is_the_groups_only_replicas_must_agree_in_the_handshake() -> None:
    group_text = "group=changed replicas=2 sync_replicas=2"
    settings = "members=node1,node2,node3 replicas=2 sync_replicas=2 zones="
    assert placement_mismatch(group_text, settings, "node1", "node4") == ""
    assert placement_mismatch(settings, group_text, "node4", "node1") == ""
    assert "replicas 2 on node1, 1 on node4" in placement_mismatch(
        group_text, "group=changed replicas=1 sync_replicas=1", "node1", "node4")
    assert placement_mismatch(settings, "members=node1,node2 replicas=2 sync_replicas=2 zones=", "node1", "node2")


ADDRESSES = {"node1": ("127.0.0.1", 7781), "node2": ("127.0.0.1", 7791), "node3": ("127.0.0.1", 7801)}


@pytest.mark.parametrize("me", sorted(ADDRESSES))
def test_each_member_knows_every_members_peer_address_its_own_too(me: str, tmp_path: Path) -> None:
    """``group add`` refuses an address a member has, checked on whichever member holds the
    catalogue: that member's own address counts too (its settings' ``peers`` list the others)."""
    cfg = NodeConfig(name=me, data_dir=tmp_path, peer_port=ADDRESSES[me][1],
                     peers=tuple(f"{n}={h}:{p}" for n, (h, p) in sorted(ADDRESSES.items()) if n != me))
    m = Member({}, {})
    placing = GroupPlacement(lambda: cfg, FakeClock(), group=lambda: g, replication=lambda: None, peers=lambda: None,
                             priority=lambda: 1, refusal=lambda: None, map_changed=lambda: None, sessions=set(),
                             learned={})
    g = GroupMembers.founded(None, placing, m, cfg)  # type: ignore[arg-type]
    assert {n: g.address_of(n) for n in g.members} == {n: f"{h}:{p}" for n, (h, p) in ADDRESSES.items()}
