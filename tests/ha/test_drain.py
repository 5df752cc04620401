"""The drain (``tandem node drain``) in the election core: a drained node ranks below
every node that is not, is never a partition's preferred node while a voter is not
drained, and an active on it hands its partition over; undrained, failback brings the
partition back.  Simulated clusters (tests/ha/sim.py) check safety at every step."""

from __future__ import annotations

import random

import pytest

from ha.placement import NodeList, ReplicaKind
from ha.replica import Role
from ha.replica_config import ReplicaConfig
from tests.ha.sim import Cluster

S, A = ReplicaKind.SYNC, ReplicaKind.ASYNC


def test_the_preferred_node_is_the_first_voter_not_drained() -> None:
    nodes = NodeList(("n1", "n2", "n3", "n4"), (S, S, A, S))
    assert nodes.preferred() == "n1"
    assert nodes.preferred(frozenset({"n1"})) == "n2"
    assert nodes.preferred(frozenset({"n1", "n2"})) == "n4"  # n3 is a learner: never active
    assert nodes.preferred(frozenset({"n1", "n2", "n4"})) == "n1"  # all drained: the placement's first


def test_a_drained_node_ranks_below_every_node_that_can_stand_and_above_priority_0() -> None:
    cfg = ReplicaConfig(node="a", voters=("a", "b", "c"), priorities={"a": 3, "b": 1, "c": 0}, preferred="b",
                        drained=frozenset({"a"}))
    assert cfg.rank("a") == 1  # priority 3, drained
    assert cfg.rank("b") == 3  # priority 1, preferred
    assert cfg.rank("c") == 0  # priority 0 never stands, drained or not
    assert ReplicaConfig(node="a", voters=("a", "b"), drained=frozenset({"b"})).rank("b") == 1


def _elect(c: Cluster, seconds: float = 10.0) -> str | None:
    for _ in range(int(seconds / 0.01)):
        c.step()
        if c.leader() is not None:
            return c.leader()
    return None


def _run(c: Cluster, seconds: float, until: str | None = None) -> None:
    for _ in range(int(seconds / 0.01)):
        c.write()
        c.step()
        if until is not None and c.leader() == until:
            return


@pytest.mark.parametrize("failback_after", [0.0, 2.0])
@pytest.mark.parametrize("seed", range(20))
def test_a_drained_active_hands_its_partition_over_and_undrained_gets_it_back(seed: int,
                                                                            failback_after: float) -> None:
    """Writes all along: drained, the active hands over within a second or two (failback
    on or off), stays a replica that keeps up, and nothing confirmed is lost; undrained,
    failback (when on) hands the partition back to it."""
    c = Cluster(seed, ("a", "b", "c"), loss=0.0, preferred="a", failback_after=failback_after)
    assert _elect(c) == "a", f"seed {seed}"
    _run(c, 1.0)
    c.set_drained(frozenset({"a"}))
    moved_at = c.now
    for _ in range(300):
        c.write()
        c.step()
        if c.leader() not in (None, "a"):
            break
    assert c.leader() == "b", f"seed {seed}: {c.leader()} is active (b: the first node not drained)"
    assert c.now - moved_at < 2.0, f"seed {seed}: the hand-over took {c.now - moved_at:.2f} s"
    before = len(c.confirmed)
    _run(c, 3.0)
    assert c.leader() == "b", f"seed {seed}: the partition went back to {c.leader()} while a is drained"
    assert len(c.confirmed) > before + 200, f"seed {seed}: writes did not go on"
    a = c.nodes["a"]
    assert a is not None and a.role is Role.FOLLOWER and a.commit >= c.nodes["b"].commit - 10  # type: ignore[union-attr]
    assert c.discarded == 0, f"seed {seed}: the hand-over discarded entries (HA-1014)"
    c.set_drained(frozenset())
    _run(c, 3 * failback_after + 3.0, until="a")
    assert c.leader() == ("a" if failback_after else "b"), f"seed {seed}"
    assert c.discarded == 0


def test_an_undrained_node_that_learns_of_it_last_is_handed_its_partition_back() -> None:
    """The undrain reaches the active first and the node a moment later: asked at once, the
    node would still rank as drained and decline (once per return); the active waits
    ``failback_after`` from the change, and the partition comes back."""
    for seed in range(10):
        c = Cluster(seed, ("a", "b", "c"), loss=0.0, preferred="a", failback_after=1.0)
        assert _elect(c) == "a", f"seed {seed}"
        c.set_drained(frozenset({"a"}))
        _run(c, 3.0)
        assert c.leader() == "b", f"seed {seed}"
        c.set_drained(frozenset(), only=("b", "c"))
        _run(c, 0.3)
        c.set_drained(frozenset(), only=("a",))
        _run(c, 5.0, until="a")
        assert c.leader() == "a", f"seed {seed}: the partition stayed on {c.leader()}"


def test_a_drained_node_is_not_elected_while_a_node_that_is_not_can_be() -> None:
    """The active (not drained) dies: of the two left, the one not drained wins, unless
    the drained one alone had the active's last entries (the vote rule comes first); then
    it hands the partition over at once, and the other ends up active every seed."""
    first_b = 0
    for seed in range(30):
        c = Cluster(seed, ("a", "b", "c"), loss=0.0, preferred="a", drained=frozenset({"b"}))
        assert _elect(c) == "a", f"seed {seed}"
        _run(c, 1.0)
        c.crash("a")
        if _elect(c) == "b":  # (c's vote went to b: b's log was more recent, appends of a's in flight)
            first_b += 1
        for _ in range(300):
            c.step()
        assert c.leader() == "c", f"seed {seed}: {c.leader()} active"
        assert c.discarded == 0
    assert first_b < 15, f"drained b elected first in {first_b} seeds of 30"


def test_a_drained_node_is_elected_when_no_other_node_can_be() -> None:
    """Availability over the drain: the only other node that could stand is gone (c has
    priority 0), so the drained node takes the partition."""
    for seed in range(10):
        c = Cluster(seed, ("a", "b", "c"), loss=0.0, preferred="b", priorities={"c": 0}, drained=frozenset({"a"}))
        assert _elect(c) == "b", f"seed {seed}"
        _run(c, 1.0)
        for _ in range(100):  # (no writes: a and c equally recent, else c, priority 0, blocks any election)
            c.step()
        c.crash("b")
        assert _elect(c) == "a", f"seed {seed}"
        before = len(c.confirmed)
        _run(c, 1.0)
        assert c.leader() == "a" and len(c.confirmed) > before, f"seed {seed}"


def test_a_drained_active_asks_a_node_that_declines_rarely() -> None:
    """b (priority 0) declines; c is down: the drained active keeps its partition and its
    writes, asking b again only after a growing wait."""
    c = Cluster(4, ("a", "b", "c"), loss=0.0, preferred="a", priorities={"b": 0})
    assert _elect(c) == "a"
    c.crash("c")
    c.set_drained(frozenset({"a"}))
    _run(c, 20.0)
    assert c.leader() == "a"
    r = c.nodes["a"]
    assert r is not None and 1 <= r._failback.declined.get("b", 0) <= 3, r._failback.declined


@pytest.mark.parametrize("chunk", range(2))
def test_random_schedules_with_drains_keep_every_confirmed_entry(chunk: int) -> None:
    """Random loss, delays, crashes and drains that come and go: the simulation's safety
    checks hold at every step (one active per term, every confirmed entry on later actives)."""
    for seed in range(chunk * 10, chunk * 10 + 10):
        rng = random.Random(f"drain-{seed}")
        voters = ("a", "b", "c")
        c = Cluster(seed, voters, loss=rng.choice([0.0, 0.05]), max_delay=rng.choice([0.01, 0.05]),
                    preferred="a", failback_after=rng.choice([0.0, 0.5]))
        down: str | None = None
        for step in range(1500):
            if step % 100 == 0:
                c.set_drained(frozenset(n for n in voters if rng.random() < 0.3))
            if step % 250 == 0:
                if down is not None:
                    c.start(down)
                    down = None
                elif rng.random() < 0.5:
                    down = rng.choice(voters)
                    c.crash(down)
            c.write()
            c.step()
