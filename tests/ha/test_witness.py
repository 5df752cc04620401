"""A two-node group with a witness (``ReplicaConfig.witnesses``): the witness's vote rules,
when its acknowledgement counts toward a commit, and the safety rules under many seeded
schedules of crashes, loss, delay and cuts (tests/ha/sim.py)."""

from __future__ import annotations

import os
import random

import pytest

from ha.messages import AppendEntries, AppendReply, Entry, Envelope, RequestVote, VoteReply
from ha.replica import Replica, ReplicaConfig, Role
from tests.ha.sim import Cluster

SEEDS = int(os.environ.get("TANDEM_SIM_SEEDS", "200")) // 2  # make test: 100; make test-long: 10,000
CHUNKS = 10
VOTERS = ("a", "b", "w")


def witness(**kw: object) -> Replica:
    cfg = ReplicaConfig(node="w", voters=VOTERS, witnesses=("w",), election_timeout=1.0, heartbeat_interval=0.2)
    return Replica(cfg, rng=random.Random(1), **kw)  # type: ignore[arg-type]


def votes(r: Replica, env: Envelope) -> list[VoteReply]:
    return [e.msg for e in r.step(env).messages if isinstance(e.msg, VoteReply)]


def test_a_witness_never_stands_whatever_its_priority_setting() -> None:
    cfg = ReplicaConfig(node="w", voters=VOTERS, witnesses=("w",), priorities={"w": 3})
    r = Replica(cfg, rng=random.Random(0))
    for t in range(1, 200):
        ready = r.tick(t * 0.1)
        assert not ready.messages and r.role is Role.FOLLOWER and r.term == 0
    assert cfg.priority("w") == 0 and cfg.rank("w") == 0


def test_config_refuses_a_witness_outside_the_voters_or_preferred() -> None:
    with pytest.raises(ValueError, match="witness must be one of the voters"):
        ReplicaConfig(node="a", voters=("a", "b"), witnesses=("w",))
    with pytest.raises(ValueError, match="preferred"):
        ReplicaConfig(node="a", voters=VOTERS, witnesses=("w",), preferred="w")


def test_the_witness_votes_once_per_term_and_only_for_a_log_as_recent_as_the_positions_it_holds() -> None:
    r = witness()
    # it was shown entries 1..3 of term 1 (positions only)
    r.step(Envelope("a", "w", AppendEntries(1, "a", 0, 0, "", tuple(Entry(1, i, None, "a") for i in (1, 2, 3)), 2)))
    assert r.last_index == 3 and all(e.data is None for e in r.log)
    # b's log stops at 2: refused (entry 3 may be confirmed with the witness's ack alone)
    assert votes(r, Envelope("b", "w", RequestVote(2, "b", 2, 1, 2))) == [VoteReply(1, "w", False)]
    # a's log is as recent: granted, and only once in the term
    assert votes(r, Envelope("a", "w", RequestVote(3, "a", 3, 1, 2))) == [VoteReply(3, "w", True)]
    assert votes(r, Envelope("b", "w", RequestVote(3, "b", 3, 1, 2))) == [VoteReply(3, "w", False)]
    assert r.voted_for == "a" and r.term == 3


def _two_nodes_and_witness(seed: int = 0) -> Cluster:
    c = Cluster(seed, VOTERS, witnesses=("w",), loss=0.0, max_delay=0.01, preferred="a")
    for _ in range(400):
        c.step()
        if c.leader() is not None:
            break
    assert c.leader() == "a"
    return c


def _run(c: Cluster, seconds: float, writes: bool = True) -> None:
    for _ in range(int(seconds / 0.01)):
        if writes:
            c.write()
        c.step()


def test_with_both_data_nodes_up_every_commit_is_on_both_and_the_witness_gets_positions_up_to_commit() -> None:
    c = _two_nodes_and_witness()
    c.cut.add(frozenset(("a", "b")))  # b cannot answer for a moment: nothing commits with the witness alone
    a = c.nodes["a"]
    assert a is not None
    before = a.commit
    for _ in range(30):  # 0.3 s, below the election timeout
        c.write()
        c.step()
    assert a.commit == before and c.stable["w"].last() <= before
    c.cut.clear()
    _run(c, 1.0)
    b = c.nodes["b"]
    assert b is not None and a.commit > before and b.last_index >= a.commit
    assert all(e.data is None for e in c.stable["w"].log)


@pytest.mark.parametrize("victim", ["a", "b"])
def test_kill_either_data_node_the_other_serves_with_the_witness_and_nothing_confirmed_is_lost(victim: str) -> None:
    for seed in range(20):
        c = _two_nodes_and_witness(seed)
        _run(c, 1.0)
        c.crash(victim)
        _run(c, 5.0)
        other = "b" if victim == "a" else "a"
        assert c.leader() == other, f"seed {seed}"
        done = len(c.confirmed)
        _run(c, 1.0)
        assert len(c.confirmed) > done + 50, f"seed {seed}: the survivor does not confirm with the witness"
        # (Cluster.check, after every step: every confirmed entry is on every later active)


def test_after_commits_with_the_witness_alone_the_stale_node_cannot_win_and_the_group_waits() -> None:
    for seed in range(20):
        c = _two_nodes_and_witness(seed)
        c.crash("b")
        _run(c, 3.0)
        confirmed = len(c.confirmed)
        assert confirmed > 50, f"seed {seed}"
        c.crash("a")  # the active goes too: b comes back with a log the witness knows is behind
        c.start("b")
        _run(c, 5.0)
        assert c.leader() is None and len(c.confirmed) == confirmed, f"seed {seed}: b won without a's entries"
        w = c.nodes["w"]
        assert w is not None and w.role is Role.FOLLOWER
        c.start("a")  # a is back: it wins, and b catches up from it
        _run(c, 5.0)
        assert c.leader() == "a", f"seed {seed}"
        _run(c, 1.0, writes=False)
        b = c.nodes["b"]
        a = c.nodes["a"]
        assert a is not None and b is not None and b.commit == a.commit, f"seed {seed}"


def test_a_data_node_answering_again_is_waited_for_once_it_has_caught_up() -> None:
    c = _two_nodes_and_witness()
    c.crash("b")
    _run(c, 3.0)
    a = c.nodes["a"]
    assert a is not None and a.witness_counts()
    c.start("b")
    _run(c, 2.0)
    c.step()
    b = c.nodes["b"]
    assert b is not None and not a.witness_counts() and b.last_index >= a.commit


def test_a_witness_reply_does_not_commit_while_the_other_data_node_is_in_sync() -> None:
    cfg = ReplicaConfig(node="a", voters=VOTERS, witnesses=("w",), election_timeout=1.0, heartbeat_interval=0.2)
    a = Replica(cfg, rng=random.Random(0))
    a.tick(2.0)  # stands: asks for pre-votes
    a.step(Envelope("b", "a", VoteReply(1, "b", True, pre=True)))  # then for votes
    a.step(Envelope("b", "a", VoteReply(1, "b", True)))
    assert a.role is Role.LEADER
    noop = a.log[-1]
    a.persisted(noop)
    a.step(Envelope("w", "a", AppendReply(1, "w", True, noop.index)))
    assert a.commit == 0  # b voted a moment ago and has not answered an append: it is waited for
    a.step(Envelope("b", "a", AppendReply(1, "b", True, noop.index)))
    assert a.commit == noop.index
    ready, entry = a.propose(b"x")
    assert entry is not None
    sent = [e.msg for e in ready.messages if e.dst == "w" and isinstance(e.msg, AppendEntries)]
    assert sent and all(m.prev_index + len(m.entries) <= a.commit for m in sent)  # not past the commit index


def run_random_schedule(seed: int, steps: int = 1000) -> Cluster:
    rng = random.Random(seed)
    c = Cluster(seed, VOTERS, witnesses=("w",), priorities={n: rng.choice([1, 1, 2, 3]) for n in ("a", "b")},
                loss=rng.choice([0.0, 0.05, 0.2]), max_delay=rng.choice([0.01, 0.05, 0.3]),
                compaction=rng.choice([0.0, 0.01, 0.1]), preferred=rng.choice(["a", "b", None]),
                failback_after=rng.choice([0.0, 0.5, 2.0]), alive=rng.choice([0.0, 0.02, 0.2]))
    for _ in range(steps):
        roll = rng.random()
        if roll < 0.3:
            c.write()
        elif roll < 0.304:
            c.crash(rng.choice(VOTERS))
        elif roll < 0.33:
            down = [n for n, r in c.nodes.items() if r is None]
            if down:
                c.start(rng.choice(down))
        elif roll < 0.335:
            x, y = rng.sample(VOTERS, 2)
            c.cut.add(frozenset((x, y)))
        elif roll < 0.345:
            c.cut.clear()
        c.step()
    return c


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_random_schedules_with_a_witness_keep_every_safety_rule(chunk: int) -> None:
    """One active per term, never the witness, no data ever sent to it, confirmed entries on
    every later active, applied prefixes agree (checked after every step)."""
    seeds = range(chunk, SEEDS, CHUNKS)
    confirmed = 0
    for seed in seeds:
        c = run_random_schedule(seed)
        confirmed += len(c.confirmed)
    assert confirmed > len(seeds) * 10


@pytest.mark.parametrize("seed", range(20))
def test_after_faults_heal_a_data_node_is_active_and_both_catch_up(seed: int) -> None:
    c = run_random_schedule(5000 + seed, steps=600)
    c.cut.clear()
    for n, r in c.nodes.items():
        if r is None:
            c.start(n)
    _run(c, 20.0, writes=False)
    leader = c.leader()
    assert leader in ("a", "b"), f"seed {5000 + seed}: no active after healing"
    before = len(c.confirmed)
    _run(c, 1.0)
    assert len(c.confirmed) >= before + 5, f"seed {5000 + seed}: writes did not commit"
    _run(c, 3.0, writes=False)
    assert c.stable["a"].state == c.stable["b"].state, f"seed {5000 + seed}: a data node did not catch up"


def test_a_witness_hearing_from_an_active_ignores_the_term_of_a_candidate_that_could_not_win() -> None:
    r = witness()
    r.tick(0.0)
    r.step(Envelope("a", "w", AppendEntries(3, "a", 0, 0, "", tuple(Entry(3, i, None, "a") for i in (1, 2)), 1)))
    r.tick(0.3)
    # b, cut off from a, stands with a log behind: refused, and the term stays (a is not deposed)
    assert votes(r, Envelope("b", "w", RequestVote(9, "b", 1, 3, 2))) == [VoteReply(3, "w", False)]
    assert r.term == 3 and r.leader == "a"
    # as recent (a hand-over, or a's entries reached b): the term is taken up, the vote granted
    assert votes(r, Envelope("b", "w", RequestVote(10, "b", 2, 3, 2))) == [VoteReply(10, "w", True)]
    # once a has been silent for an election timeout, a candidate's term is taken up even if refused
    r2 = witness()
    r2.step(Envelope("a", "w", AppendEntries(3, "a", 0, 0, "", (Entry(3, 1, None, "a"),), 0)))
    r2.tick(1.5)
    assert votes(r2, Envelope("b", "w", RequestVote(9, "b", 0, 0, 2))) == [VoteReply(9, "w", False)]
    assert r2.term == 9


def test_a_witness_granting_a_vote_tells_the_active_it_followed_at_once() -> None:
    r = witness()
    r.step(Envelope("a", "w", AppendEntries(3, "a", 0, 0, "", (Entry(3, 1, None, "a"),), 1)))
    r.tick(0.1)
    ready = r.step(Envelope("b", "w", RequestVote(4, "b", 1, 3, 2)))  # as recent: granted
    sent = {(e.dst, type(e.msg).__name__, e.msg.term) for e in ready.messages}
    assert sent == {("b", "VoteReply", 4), ("a", "AppendReply", 4)}
