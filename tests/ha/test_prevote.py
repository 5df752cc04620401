"""Pre-vote (Raft's thesis 9.6): a replica raises its term only once a quorum would vote
for it, and a voter that hears from an active says no.  A node cut off from the others,
one way or both, keeps its term, and back, it does not depose the active.  Sans-IO: the
simulated cluster of tests/ha/sim.py, and single replicas driven by hand."""

from __future__ import annotations

import random

import pytest

from ha.messages import AppendEntries, Envelope, RequestVote, TimeoutNow, VoteReply
from ha.replica import Replica, ReplicaConfig, Role
from tests.ha.sim import Cluster

VOTERS3 = ("a", "b", "c")
VOTERS5 = ("a", "b", "c", "d", "e")


class _OneWay(Cluster):
    """A cluster whose links may also be cut one way: ``oneway`` holds (src, dst) pairs
    whose messages are lost."""

    oneway: set[tuple[str, str]]

    def post(self, env: Envelope) -> None:
        if (env.src, env.dst) in getattr(self, "oneway", ()):
            return
        super().post(env)


def _settle(c: Cluster, seconds: float, *, writes: bool = True) -> None:
    for i in range(round(seconds / 0.01)):
        c.step()
        if writes and i % 5 == 0:
            c.write()


def _elected(c: Cluster) -> tuple[str, int]:
    _settle(c, 4.0)
    leader = c.leader()
    assert leader is not None, f"seed {c.seed}: no active"
    r = c.nodes[leader]
    assert r is not None
    return leader, r.term


def _term(c: Cluster, n: str) -> int:
    r = c.nodes[n]
    assert r is not None
    return r.term


@pytest.mark.parametrize("voters", [VOTERS3, VOTERS5])
def test_a_follower_cut_off_keeps_its_term_and_the_active_keeps_its_role_after_the_heal(
        voters: tuple[str, ...]) -> None:
    for seed in range(5):
        c = Cluster(seed, voters, loss=0.0, max_delay=0.01)
        leader, term = _elected(c)
        cut = next(n for n in voters if n != leader)
        before = _term(c, cut)
        for p in voters:
            if p != cut:
                c.cut.add(frozenset((cut, p)))
        _settle(c, 20.0)  # 20 election timeouts
        assert _term(c, cut) == before, f"seed {seed}: the cut-off node raised its term"
        assert c.leader() == leader and _term(c, leader) == term
        c.cut.clear()
        _settle(c, 5.0)
        assert c.leader() == leader and _term(c, leader) == term, f"seed {seed}: the heal moved the active"
        r = c.nodes[cut]
        assert r is not None and r.leader == leader and r.role is Role.FOLLOWER
        assert max(c.leaders) == term  # no term of the whole run elected anyone else


def test_an_active_cut_off_steps_down_keeps_its_term_and_does_not_depose_its_successor() -> None:
    for seed in range(5):
        c = Cluster(seed, VOTERS3, loss=0.0, max_delay=0.01)
        old, term = _elected(c)
        for p in VOTERS3:
            if p != old:
                c.cut.add(frozenset((old, p)))
        _settle(c, 20.0)
        new = c.leader()
        assert new is not None and new != old, f"seed {seed}: the others elected nobody"
        new_term = _term(c, new)
        assert _term(c, old) == term, f"seed {seed}: the cut-off former active raised its term"
        c.cut.clear()
        _settle(c, 5.0)
        assert c.leader() == new and _term(c, new) == new_term, f"seed {seed}: the heal moved the active"
        assert _term(c, old) == new_term


@pytest.mark.parametrize("voters", [VOTERS3, VOTERS5])
@pytest.mark.parametrize("way", ["deaf", "mute"])
def test_a_one_way_cut_does_not_move_the_groups_term(voters: tuple[str, ...], way: str) -> None:
    """``deaf``: the node hears nothing but is heard (its bids reach the others); ``mute``:
    it hears everything and is not heard.  Either way the active and its term stay."""
    for seed in range(6):
        c = _OneWay(seed, voters, loss=0.0, max_delay=0.01)
        c.oneway = set()
        leader, term = _elected(c)
        node = next(n for n in voters if n != leader)
        for p in voters:
            if p != node:
                c.oneway.add((p, node) if way == "deaf" else (node, p))
        _settle(c, 20.0)
        assert c.leader() == leader and _term(c, leader) == term, f"seed {seed}: the active or its term moved"
        assert _term(c, node) == term, f"seed {seed}: the {way} node raised its term"
        c.oneway.clear()
        _settle(c, 5.0)
        assert c.leader() == leader and _term(c, leader) == term
        assert max(c.leaders) == term


def test_the_active_cut_one_way_is_replaced_once_and_the_term_settles() -> None:
    """The active hears nothing (its appends still go out): it steps down (check-quorum),
    the others elect another, and the terms stop moving."""
    for seed in range(6):
        c = _OneWay(seed, VOTERS3, loss=0.0, max_delay=0.01)
        c.oneway = set()
        old, term = _elected(c)
        c.oneway = {(p, old) for p in VOTERS3 if p != old}
        _settle(c, 10.0)
        new = c.leader()
        assert new is not None and new != old
        settled = _term(c, new)
        _settle(c, 20.0)
        assert c.leader() == new and _term(c, new) == settled, f"seed {seed}: the term kept moving"
        assert settled <= term + 3


def test_failback_still_hands_over() -> None:
    """Failback's TimeoutNow is sanctioned: the preferred node stands for real at once."""
    for seed in range(6):
        c = Cluster(seed, VOTERS3, loss=0.0, max_delay=0.01, preferred="a", failback_after=2.0)
        _elected(c)
        if c.leader() == "a":
            c.crash("a")
            _settle(c, 4.0)
            c.start("a")
        assert c.leader() not in (None, "a")
        _settle(c, 15.0)
        assert c.leader() == "a", f"seed {seed}: the partition was not handed back"


def _cfg(node: str, **kw: object) -> ReplicaConfig:
    return ReplicaConfig(node=node, voters=VOTERS3, election_timeout=1.0, heartbeat_interval=0.2, **kw)  # type: ignore[arg-type]


def test_a_pre_vote_casts_nothing_and_takes_up_no_term() -> None:
    b = Replica(_cfg("b"), rng=random.Random(1), term=3)
    ready = b.step(Envelope("a", "b", RequestVote(4, "a", 0, 0, 2, pre=True)))
    assert b.term == 3 and b.voted_for is None and ready.hard_state is None
    [reply] = ready.messages
    assert reply.msg == VoteReply(4, "b", True, pre=True)


def test_a_voter_that_hears_an_active_refuses_a_pre_vote() -> None:
    b = Replica(_cfg("b"), rng=random.Random(1), term=3)
    b.tick(10.0)
    b.step(Envelope("a", "b", AppendEntries(3, "a", 0, 0, "", (), 0)))
    [reply] = b.step(Envelope("c", "b", RequestVote(4, "c", 0, 0, 2, pre=True))).messages
    assert reply.msg == VoteReply(3, "b", False, pre=True) and b.term == 3 and b.leader == "a"
    b.tick(11.01)  # an election timeout without word from the active: it would vote now
    [reply] = b.step(Envelope("c", "b", RequestVote(4, "c", 0, 0, 2, pre=True))).messages
    assert reply.msg.granted


def test_a_candidate_raises_its_term_only_with_a_quorum_of_pre_votes() -> None:
    r = Replica(_cfg("a"), rng=random.Random(0), term=5)
    pre = r.tick(10.0).messages
    assert {e.dst for e in pre} == {"b", "c"} and all(e.msg == RequestVote(6, "a", 0, 0, 2, pre=True) for e in pre)
    assert r.term == 5 and r.role is Role.FOLLOWER
    r.step(Envelope("b", "a", VoteReply(5, "b", False, pre=True)))  # refused: nothing moves
    assert r.term == 5 and r.role is Role.FOLLOWER
    bid = r.step(Envelope("c", "a", VoteReply(6, "c", True, pre=True))).messages
    assert r.term == 6 and r.role is Role.CANDIDATE and r.voted_for == "a"
    assert all(e.msg == RequestVote(6, "a", 0, 0, 2) for e in bid)


def test_a_refused_pre_vote_of_a_later_term_is_taken_up_without_standing() -> None:
    r = Replica(_cfg("a"), rng=random.Random(0), term=5)
    r.tick(10.0)
    ready = r.step(Envelope("b", "a", VoteReply(9, "b", False, pre=True)))
    assert r.term == 9 and r.role is Role.FOLLOWER and not ready.messages
    r.step(Envelope("c", "a", VoteReply(6, "c", True, pre=True)))  # a yes for a term gone by
    assert r.term == 9 and r.role is Role.FOLLOWER


def test_a_hand_over_and_the_arbiter_skip_the_pre_vote() -> None:
    b = Replica(_cfg("b", priorities={"b": 3}), rng=random.Random(0), term=2)
    b.step(Envelope("a", "b", AppendEntries(2, "a", 0, 0, "", (), 0)))
    bid = b.step(Envelope("a", "b", TimeoutNow(2, "a", 2))).messages
    assert b.role is Role.CANDIDATE and b.term == 3 and all(not e.msg.pre for e in bid)  # type: ignore[union-attr]
    c = Replica(_cfg("c"), rng=random.Random(0), term=2)
    c.stand_now()
    bid = c.tick(0.0).messages
    assert c.role is Role.CANDIDATE and c.term == 3 and bid and all(not e.msg.pre for e in bid)  # type: ignore[union-attr]


def test_a_witness_answers_pre_votes() -> None:
    w = Replica(ReplicaConfig(node="w", voters=("a", "b", "w"), witnesses=("w",), election_timeout=1.0,
                              heartbeat_interval=0.2), rng=random.Random(0), term=2)
    w.tick(5.0)
    [reply] = w.step(Envelope("b", "w", RequestVote(3, "b", 0, 0, 2, pre=True))).messages
    assert reply.msg == VoteReply(3, "w", True, pre=True) and w.term == 2 and w.voted_for is None
    w.step(Envelope("a", "w", AppendEntries(2, "a", 0, 0, "", (), 0)))
    [reply] = w.step(Envelope("b", "w", RequestVote(3, "b", 0, 0, 2, pre=True))).messages
    assert not reply.msg.granted and w.term == 2  # it hears the active
