"""ha.moves: the steps from a partition's members to a new node list, each one a change
the core accepts (voters differ by one node, never the active removed), ending at the list."""

from __future__ import annotations

import random

from ha.members import Members
from ha.moves import arrived, copying, leaving, next_members
from ha.placement import DistributionPolicy, NodeList, ReplicaKind, listed, spec_of


def walk(current: Members, target: Members, me: str) -> list[Members]:
    """Every step, the copies caught up at once and the active handing over to the list's
    first voter when it must (as the driver does)."""
    steps = [current]
    for _ in range(50):
        match = {n: 10 for n in current.voters + current.learners}
        nxt = next_members(current, target, me, match, commit=10)
        if nxt is None:
            if me not in target.voters:
                me = next(v for v in target.voters if v in current.voters)  # the hand-over
                continue
            break
        assert len(set(current.voters) ^ set(nxt.voters)) <= 1, (current, nxt)
        assert me in nxt.voters, (me, nxt)
        current = nxt
        steps.append(current)
    assert arrived(current, target), (current, target)
    return steps


def test_a_move_onto_a_new_node_adds_it_as_a_learner_promotes_it_then_removes_the_old_one() -> None:
    steps = walk(Members(("n1", "n2")), Members(("n3", "n1")), "n1")
    assert steps == [Members(("n1", "n2")), Members(("n1", "n2"), ("n3",)), Members(("n1", "n2", "n3")),
                     Members(("n1", "n3"))]


def test_a_copy_behind_is_not_made_a_voter_and_the_partition_is_replicating() -> None:
    current, target = Members(("n1", "n2"), ("n3",)), Members(("n3", "n1"))
    assert next_members(current, target, "n1", {"n2": 10, "n3": 4}, commit=10) is None
    assert copying(current, target, {"n2": 10, "n3": 4}, 10)
    assert not copying(current, target, {"n2": 10, "n3": 10}, 10)


def test_the_active_is_never_removed_and_hands_over_once_the_lists_first_node_votes() -> None:
    current, target = Members(("n1", "n2", "n3")), Members(("n2", "n3"))
    assert next_members(current, target, "n1", {}, commit=5) is None  # it must hand over first
    assert leaving(current, "n2") == {"n1", "n3"}
    # before the list's first node votes, the active stays where it is
    assert leaving(Members(("n1", "n2"), ("n3",)), "n3") == set()


def test_async_members_and_demotions() -> None:
    walk(Members(("n1", "n2", "n3"), ("n4",)), Members(("n1", "n2"), ("n3",)), "n1")
    walk(Members(("n1", "n2"), ("n3",)), Members(("n3", "n2"), ("n1",)), "n1")


def test_any_move_between_random_lists_is_reached_by_safe_steps() -> None:
    rng = random.Random(5)
    nodes = [f"n{i}" for i in range(6)]
    for _ in range(500):
        a = rng.sample(nodes, rng.randint(1, 5))
        b = rng.sample(nodes, rng.randint(1, 5))
        ca, cb = rng.randint(1, len(a)), rng.randint(1, len(b))
        current, target = Members(tuple(a[:ca]), tuple(a[ca:])), Members(tuple(b[:cb]), tuple(b[cb:]))
        walk(current, target, a[0])


def test_a_list_gives_each_node_its_kind_or_the_one_its_position_gives() -> None:
    policy = DistributionPolicy(replicas=2, sync_replicas=1)
    S, A = ReplicaKind.SYNC, ReplicaKind.ASYNC
    assert listed(policy, ("n3", "n1", "n2")) == NodeList(("n3", "n1", "n2"), (S, S, A))
    assert listed(policy, ("n3", "n1:async", "n2:sync")) == NodeList(("n3", "n1", "n2"), (S, A, S))
    assert spec_of(listed(policy, ("n3", "n1"))) == ("n3:sync", "n1:sync")
