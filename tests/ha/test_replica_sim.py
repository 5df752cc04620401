"""The election + replication core under thousands of random schedules, and the
operator overrides under scripted ones.  Every failure names its seed, which replays."""

from __future__ import annotations

import dataclasses
import os
import random

import pytest

from ha.messages import Alive, AppendReply, Entry, Envelope, RequestVote, VoteReply
from ha.replica import Replica, ReplicaConfig, Role
from tests.ha.sim import Cluster

SEEDS = int(os.environ.get("TANDEM_SIM_SEEDS", "200"))  # make test; make test-long runs 20,000
CHUNKS = 20


def run_random_schedule(seed: int, steps: int = 1000) -> Cluster:
    rng = random.Random(seed)
    voters = ("a", "b", "c") if rng.random() < 0.7 else ("a", "b", "c", "d", "e")
    learners = ("l",) if rng.random() < 0.3 else ()
    priorities = {n: rng.choice([0, 1, 1, 2, 3]) for n in voters}
    c = Cluster(seed, voters, learners=learners, priorities=priorities, loss=rng.choice([0.0, 0.05, 0.2]),
                max_delay=rng.choice([0.01, 0.05, 0.3]), compaction=rng.choice([0.0, 0.01, 0.1]),
                preferred=rng.choice(voters) if rng.random() < 0.5 else None,
                failback_after=rng.choice([0.0, 0.5, 2.0]),
                # (its own stream: the other draws, and so the seeds found before, replay as they were)
                alive=random.Random(f"alive-{seed}").choice([0.0, 0.02, 0.2]))
    names = list(voters + learners)
    for _ in range(steps):
        roll = rng.random()
        if roll < 0.3:
            c.write()
        elif roll < 0.303:
            c.crash(rng.choice(names))
        elif roll < 0.33:
            down = [n for n, r in c.nodes.items() if r is None]
            if down:
                c.start(rng.choice(down))
        elif roll < 0.335:
            a, b = rng.sample(names, 2)
            c.cut.add(frozenset((a, b)))
        elif roll < 0.345:
            c.cut.clear()
        c.step()
    return c


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_random_schedules_keep_every_safety_rule(chunk: int) -> None:
    """One active per term, confirmed entries on every later active, committed prefixes agree
    (checked after every step), over many seeded schedules of crashes, loss, delay and cuts.
    A failure raises SafetyViolation naming the seed: ``run_random_schedule(seed)`` replays it."""
    seeds = range(chunk, SEEDS, CHUNKS)
    confirmed = 0
    for seed in seeds:
        c = run_random_schedule(seed)
        confirmed += len(c.confirmed)
    assert confirmed > len(seeds) * 10  # the schedules did real work, not just elections


def heal_and_settle(c: Cluster, seconds: float = 20.0) -> None:
    c.cut.clear()
    for n, r in c.nodes.items():
        if r is None:
            c.start(n)
    for _ in range(int(seconds / 0.01)):
        c.step()


@pytest.mark.parametrize("seed", range(20))
def test_after_faults_heal_an_active_is_elected_and_writes_commit(seed: int) -> None:
    c = run_random_schedule(1000 + seed, steps=600)
    c.loss = 0.0
    heal_and_settle(c)
    leader = c.leader()
    assert leader is not None, f"seed {1000 + seed}: no active after healing"
    before = len(c.confirmed)
    for _ in range(5):
        c.write()
        c.step()
    for _ in range(300):
        c.step()
    assert len(c.confirmed) >= before + 5, f"seed {1000 + seed}: writes did not commit"
    states = {n: tuple(c.stable[n].state) for n, r in c.nodes.items() if r is not None}
    assert len(set(states.values())) == 1, f"seed {1000 + seed}: a replica did not catch up"


def test_priority_zero_never_stands_and_highest_is_preferred() -> None:
    for seed in range(30):
        c = Cluster(seed, ("a", "b", "c"), priorities={"a": 0, "b": 1, "c": 3}, loss=0.0)
        for _ in range(2000):
            c.step()
            if seed % 3 == 0 and c.now > 5 and c.nodes["c"] is not None and c.leader() == "c":
                c.crash("c")  # make the others elect too
        assert "a" not in c.leaders.values(), f"seed {seed}"
    firsts = []
    for seed in range(30):
        c = Cluster(seed, ("a", "b", "c"), priorities={"a": 1, "b": 1, "c": 3}, loss=0.0)
        for _ in range(3000):  # 30 s at most
            if c.leaders:
                break
            c.step()
        assert c.leaders, f"seed {seed}: no active in 30 s"
        firsts.append(c.leaders[min(c.leaders)])
    assert firsts.count("c") > len(firsts) // 2  # the preferred node usually wins the first election


@pytest.mark.parametrize("voters", [("a", "b", "c"), ("a", "b", "c", "d", "e")])
def test_a_new_partitions_preferred_node_wins_its_first_election_even_when_it_learns_of_it_last(
        voters: tuple[str, ...]) -> None:
    """Placement's choice becomes the first active of a new partition, so a new queue's
    actives come out spread.  The members learn of a new queue up to a heartbeat or so
    apart (the catalogue's commit rides the active's next message); with the preferred
    node the last to learn, 0-0.3 s late, it still stands first and wins."""
    for seed in range(200):
        rng = random.Random(seed)
        preferred = voters[seed % len(voters)]
        c = Cluster(seed, voters, loss=0.0, max_delay=0.02, preferred=preferred)
        c.crash(preferred)  # it has not created the partition yet
        late = rng.random() * 0.3
        while c.now < late:
            c.step()
        c.start(preferred)
        first = _elect(c)
        assert first == preferred, f"seed {seed}: {first} became the first active, not {preferred} ({late:.2f} s late)"


@pytest.mark.parametrize("seed", range(40))
def test_failback_the_preferred_node_takes_its_partition_back_and_nothing_confirmed_is_lost(seed: int) -> None:
    """The placed active dies, another takes over and confirms writes; back and caught up,
    the placed one is handed the partition within ``failback_after`` and a little, and
    every confirmed entry is in its log (the simulation checks that at every step)."""
    c = Cluster(seed, ("a", "b", "c"), loss=0.0, preferred="a", failback_after=2.0)
    assert _elect(c) == "a", f"seed {seed}"
    c.crash("a")
    for _ in range(300):  # writes all along: through the failover, the return and the hand-over
        c.write()
        c.step()
    other = c.leader()
    assert other in ("b", "c"), f"seed {seed}: {other}"
    c.start("a")
    before = len(c.confirmed)
    for _ in range(600):  # 6 s: it must answer for 2 s, then the hand-over
        c.write()
        c.step()
        if c.leader() == "a":
            break
    assert c.leader() == "a", f"seed {seed}: {other} kept the partition"
    for _ in range(100):
        c.write()
        c.step()
    assert len(c.confirmed) > before, f"seed {seed}: no writes confirmed after the hand-over"
    assert c.discarded == 0, f"seed {seed}: the hand-over discarded entries (HA-1014)"


def test_failback_is_declined_by_a_node_elections_would_not_prefer_and_asked_once() -> None:
    """A preferred node of priority 0 never becomes active; the active asks it once per
    return, and writes go on after the one pause."""
    for seed in range(20):
        c = Cluster(seed, ("a", "b", "c"), priorities={"a": 0}, loss=0.0, preferred="a", failback_after=0.5)
        leader = _elect(c)
        assert leader in ("b", "c"), f"seed {seed}"
        for _ in range(500):  # 5 s: "a" answers for 0.5 s, is asked, declines; writes wait 1 s
            c.write()
            c.step()
        assert "a" not in c.leaders.values(), f"seed {seed}"
        r = c.nodes[leader]
        assert r is not None and r.role is Role.LEADER and r._failback.handed.keys() == {"a"}, f"seed {seed}"
        assert r._failback.handing_to is None, f"seed {seed}: still holding writes"
        done = len(c.confirmed)
        for _ in range(300):  # and it is not asked again while it stays
            c.write()
            c.step()
        assert len(c.confirmed) >= done + 250, f"seed {seed}: writes paused again"


def _back_after(c: Cluster, node: str, limit: float = 60.0) -> float:
    """Seconds from now until ``node`` is the active again (writes all along)."""
    t0 = c.now
    while c.now - t0 < limit:
        c.write()
        c.step()
        if c.leader() == node:
            return c.now - t0
    raise AssertionError(f"seed {c.seed}: {node} not handed back within {limit} s")


def test_failback_to_a_node_that_keeps_leaving_waits_twice_as_long_each_time() -> None:
    """A flaky preferred node does not drag its partition along: each hand-over to it in the
    last ten minutes doubles the time it must answer before the next.  (The active that hands
    over keeps that count: here "c" never stands, so "b" takes over each time.)"""
    for seed in range(10):
        c = Cluster(seed, ("a", "b", "c"), priorities={"c": 0}, loss=0.0, preferred="a", failback_after=1.0)
        assert _elect(c) == "a"
        waits = []
        for _ in range(3):
            c.crash("a")
            assert _elect(c) == "b", f"seed {seed}"
            c.start("a")
            waits.append(_back_after(c, "a"))
        assert 1.0 <= waits[0] < 2.0 and 2.0 <= waits[1] < 3.5 and 4.0 <= waits[2] < 6.0, f"seed {seed}: {waits}"


def _away_and_back(c: Cluster, node: str, seconds: float) -> str | None:
    """Crash ``node``, elect another, bring ``node`` back and let ``seconds`` pass; the
    active that took over."""
    c.crash(node)
    other = _elect(c)
    c.start(node)
    for _ in range(int(seconds / 0.01)):
        c.step()
    return other


def test_no_failback_under_an_override_or_a_designated_primary() -> None:
    c = Cluster(5, ("a", "b", "c"), loss=0.0, preferred="a", failback_after=0.5, quorum_override=2)
    assert _elect(c) == "a"
    other = _away_and_back(c, "a", 5.0)
    assert other is not None and c.leader() == other
    c = Cluster(6, ("a", "b"), loss=0.0, preferred="a", failback_after=0.5, designated_primary="b")
    assert _elect(c) == "a"
    assert _away_and_back(c, "a", 5.0) == "b" and c.leader() == "b"


def test_a_new_partition_stands_fast_only_where_one_vote_cannot_elect() -> None:
    """Where one vote elects (an override of 1), a node that looks new may have lost its
    store: it waits a full timeout, to hear of an active first."""
    for override, fast in ((None, True), (2, True), (1, False)):
        cfg = ReplicaConfig(node="a", voters=("a", "b", "c"), preferred="a", quorum_override=override,
                            election_timeout=1.0, heartbeat_interval=0.2)
        r = Replica(cfg, rng=random.Random(1), now=0.0)
        assert (r.wake_at < 0.5) is fast, (override, r.wake_at)


def test_the_only_voter_stands_at_once_new_or_restarted() -> None:
    """A group of one node (or a partition whose other nodes are learners): no other node can
    be active, so it stands at its first tick, with or without a log; a voter among others
    that did not lose its state waits for an active as before."""
    for voters, learners, term, fast in ((("a",), (), 0, True), (("a",), (), 3, True), (("a",), ("b",), 3, True),
                                         (("a", "b", "c"), (), 3, False)):
        cfg = ReplicaConfig(node="a", voters=voters, learners=learners, preferred="a", election_timeout=1.0,
                            heartbeat_interval=0.2)
        r = Replica(cfg, rng=random.Random(1), now=0.0, term=term)
        assert (r.wake_at == 0.0) is fast, (voters, learners, term, r.wake_at)
    c = Cluster(7, ("a",), loss=0.0)
    c.step()
    assert c.leader() == "a"


def test_no_failback_when_it_is_off() -> None:
    c = Cluster(3, ("a", "b", "c"), loss=0.0, preferred="a", failback_after=0.0)
    assert _elect(c) == "a"
    other = _away_and_back(c, "a", 10.0)
    assert other is not None and c.leader() == other


def _elect(c: Cluster, seconds: float = 10.0) -> str | None:
    for _ in range(int(seconds / 0.01)):
        c.step()
        if c.leader() is not None:
            return c.leader()
    return None


def test_two_voters_stop_when_one_dies_unless_designated_primary() -> None:
    c = Cluster(1, ("a", "b"), loss=0.0)
    first = _elect(c)
    assert first is not None
    other = "b" if first == "a" else "a"
    c.crash(first)
    for _ in range(1000):
        c.step()
    assert c.leader() is None  # the survivor alone is no majority of two
    c2 = Cluster(1, ("a", "b"), loss=0.0, designated_primary=other)
    first = _elect(c2)
    assert first is not None
    if first != other:
        c2.crash(first)
        assert _elect(c2) == other
    n = len(c2.confirmed)
    c2.write()
    for _ in range(50):
        c2.step()
    assert len(c2.confirmed) == n + 1  # the designated primary commits on its own


def test_quorum_override_restores_service_from_one_of_three() -> None:
    c = Cluster(2, ("a", "b", "c"), loss=0.0)
    first = _elect(c)
    assert first is not None
    for n in ("a", "b", "c"):
        if n != "c":
            c.crash(n)
    for _ in range(500):
        c.step()
    assert c.leader() is None
    c.quorum_override = 1  # the operator's override, then c restarts with it
    c.start("c")
    assert _elect(c) == "c"
    n = len(c.confirmed)
    c.write()
    for _ in range(50):
        c.step()
    assert len(c.confirmed) == n + 1


def _cut_off(c: Cluster) -> tuple[str, list[str], Replica]:
    """An active elected and writing, then cut off from the others: (it, the others, its core).
    Safety is not checked from here on: a weak override gives it up by design."""
    old = _elect(c)
    assert old is not None
    for _ in range(3):
        c.write()
    for _ in range(100):
        c.step()
    others = [n for n in ("a", "b", "c") if n != old]
    c.cut |= {frozenset((old, o)) for o in others}
    c.strict = False
    r = c.nodes[old]
    assert r is not None
    return old, others, r


def _override_alone(c: Cluster, old: str, r: Replica) -> None:
    """The operator forces the isolated node to go on alone (``quorum_override 1``, at runtime):
    it elects itself."""
    c.handle(old, r.reconfigure(dataclasses.replace(c.config(old), quorum_override=1)))
    for _ in range(1000):
        c.step()
        if r.role is Role.LEADER:
            break
    assert r.role is Role.LEADER


def _write_alone(c: Cluster, old: str, r: Replica) -> None:
    """The isolated active writes 6 "solo" entries alone (under its override), and the
    cluster runs on a while."""
    for _ in range(6):
        ready, _entry = r.propose("solo")
        c.handle(old, ready)
    for _ in range(300):
        c.step()


def test_isolated_active_under_override_reports_ha_1014_on_rejoin() -> None:
    c = Cluster(3, ("a", "b", "c"), loss=0.0)
    old, others, r = _cut_off(c)
    _override_alone(c, old, r)  # it re-elects itself alone
    for _ in range(4):
        ready, entry = c.nodes[old].propose("solo")  # type: ignore[union-attr]
        c.handle(old, ready)
        assert entry is not None
    for _ in range(300):
        c.step()  # the majority side elects its own active meanwhile
    assert any(c.nodes[o] is not None and c.nodes[o].role is Role.LEADER for o in others)  # type: ignore[union-attr]
    # the operator removes the override (at runtime), then the cut heals
    c.handle(old, r.reconfigure(c.config(old)))
    heal_and_settle(c, 10)
    assert c.discarded >= 4  # its solo entries were truncated and reported as HA-1014
    assert c.discarded_committed >= 4  # ... and they had been confirmed to clients: transaction loss
    assert all("solo" not in [e.data for e in r.log] for r in c.nodes.values() if r is not None)


def test_an_override_active_that_compacted_what_it_wrote_alone_is_found_out_and_rebuilt() -> None:
    """As above, but the isolated active compacts its solo entries before the heal (the driver
    does past twice weak_hold_bytes of them: broker.modes.replicated.compaction.weak_cap), so they cannot
    be compared entry by entry.  The majority's log differs at its snapshot's last entry: it
    reports HA-1014 reaching into its compacted log, the driver starts it over, and it comes
    back with the majority's log and state, the majority's confirmed entries all there."""
    for seed in range(10):
        c = Cluster(seed, ("a", "b", "c"), loss=0.0)
        old, others, r = _cut_off(c)
        _override_alone(c, old, r)
        _write_alone(c, old, r)
        assert r.applied >= 9 and r.entry(r.applied).data == "solo", seed
        c.compact(old, r, r.applied)  # the driver compacts past them (more than it keeps of a weak active's writes)
        leader = next(c.nodes[o] for o in others if c.nodes[o] is not None and c.nodes[o].role is Role.LEADER)
        assert leader is not None
        majority = []
        for i in range(12):  # past the isolated node's snapshot
            ready, entry = leader.propose(f"maj{i}")
            c.handle(leader.id, ready)
            majority.append(entry)
            c.step()
        for _ in range(200):
            c.step()
        c.handle(old, r.reconfigure(c.config(old)))
        heal_and_settle(c, 10)
        assert c.compacted_discards >= 1, seed
        assert c.discarded_committed >= 1, seed
        back = c.nodes[old]
        assert back is not None and back is not r, seed  # (started over)
        states = {n: tuple(c.stable[n].state) for n in ("a", "b", "c")}
        assert len(set(states.values())) == 1, f"seed {seed}: {old} did not come back with the group's state"
        assert all(any(s[3] == f"maj{i}" for s in states[old]) for i in range(12)), seed
        assert not any(s[3] == "solo" for s in states[old]), seed


def _higher_term_split(seed: int) -> tuple[Cluster, str, list[str]]:
    """The isolated active under the override goes through more elections than the majority
    (its term ends higher), writes alone and compacts it (past the driver's bound of a weak
    active's entries); the majority writes 12 entries meanwhile: (cluster, it, the others)."""
    c = Cluster(100 + seed, ("a", "b", "c"), loss=0.0)
    old, others, r = _cut_off(c)
    for _round in range(3):  # off and on again: each time it stands alone in a new term
        c.handle(old, r.reconfigure(c.config(old)))
        for _ in range(300):
            c.step()
        _override_alone(c, old, r)
    _write_alone(c, old, r)
    c.compact(old, r, r.applied)
    leader = next(c.nodes[o] for o in others if c.nodes[o] is not None and c.nodes[o].role is Role.LEADER)
    assert leader is not None and r.term > leader.term, (seed, r.term, leader.term)
    for i in range(12):
        ready, _entry = leader.propose(f"maj{i}")
        c.handle(leader.id, ready)
        c.step()
    for _ in range(200):
        c.step()
    return c, old, others


def _majority_kept(c: Cluster, old: str, others: list[str], seed: int) -> None:
    """The isolated node found its compacted log different and came back with the majority's
    state: every node alike, the majority's 12 entries there, its solo ones nowhere."""
    assert c.compacted_discards >= 1, seed
    states = {n: tuple(c.stable[n].state) for n in ("a", "b", "c")}
    assert len(set(states.values())) == 1, f"seed {100 + seed}: the nodes disagree"
    assert all(any(s[3] == f"maj{i}" for s in states[old]) for i in range(12)), seed
    assert not any(s[3] == "solo" for s in states[others[0]]), seed


def test_an_override_active_with_a_higher_term_cannot_push_its_compacted_writes_over_the_majoritys() -> None:
    """The cut heals with the override still on: the isolated node is the active the others
    hear, in the higher term, and it can only send a snapshot, marked weak: a replica whose
    log a majority wrote refuses it and deposes it (as it refuses weak entries), the majority
    elects one of its own (a weak snapshot does not count in an election's recency), and the
    isolated node finds its compacted log different and starts over."""
    for seed in range(10):
        c, old, others = _higher_term_split(seed)
        heal_and_settle(c, 20)  # (the override still on: it is active in its term when the others hear it)
        _majority_kept(c, old, others, seed)


def test_restarted_after_compacting_its_writes_alone_a_node_still_cannot_push_them_over_the_majoritys() -> None:
    """As above, but the isolated node is restarted before the heal (the override, set at
    runtime, is gone): it comes back from its store, whose snapshot keeps the weak mark, in
    its higher term.  Its snapshot does not count in an election's recency, so it cannot win
    over the majority's log: it finds its compacted log different and starts over."""
    for seed in range(10):
        c, old, others = _higher_term_split(seed)
        c.crash(old)
        c.start(old)  # from its stable state, the override gone
        assert c.stable[old].snap_mark[0], seed
        heal_and_settle(c, 20)
        _majority_kept(c, old, others, seed)


def test_config_is_validated() -> None:
    with pytest.raises(ValueError):
        ReplicaConfig(node="x", voters=())
    with pytest.raises(ValueError):
        ReplicaConfig(node="a", voters=("a", "b"), quorum_override=3)
    with pytest.raises(ValueError):
        ReplicaConfig(node="a", voters=("a",), learners=("a",))


def test_a_preferred_node_that_cannot_win_does_not_block_the_others() -> None:
    """5 voters, d and e down, b-c cut: {a, b, c} can elect a; c (priority 3, as recent)
    may refuse once but must not keep a from winning."""
    for seed in range(20):
        c = Cluster(seed, ("a", "b", "c", "d", "e"), loss=0.0, max_delay=0.02, priorities={"c": 3})
        for n in "de":
            c.crash(n)
        c.cut.add(frozenset(("b", "c")))
        for _ in range(6000):
            c.step()
            if c.leader() is not None:
                break
        assert c.leader() == "a", f"seed {seed}: no active in 60 s"


def test_two_actives_of_one_term_resolve_under_a_weak_override() -> None:
    for seed in range(50):
        c = Cluster(seed, ("a", "b", "c"), loss=0.0, quorum_override=1)
        c.strict = False  # a weak override gives up single-active safety by design
        for _ in range(1500):
            c.step()
            if seed % 5 == 0:
                c.write()
        live = [n for n, r in c.nodes.items() if r is not None and r.role.value == "active"]
        assert len(live) <= 1 or len({c.nodes[n].term for n in live}) == len(live)  # type: ignore[union-attr]


def test_designated_primary_keeps_writes_confirmed_while_its_peer_was_connected() -> None:
    """Entries a designated primary writes while its peer acks it are strong: after a link
    blip and a restart of the primary, the peer cannot win with a shorter log and truncate
    them (strict checks on)."""
    for seed in range(40):
        c = Cluster(seed, ("a", "b"), loss=0.0, designated_primary="a")
        c.crash("b")
        for _ in range(300):
            c.step()  # a elects itself alone
        c.start("b")
        for _ in range(100):
            c.step()  # b follows and acks
        assert c.leader() == "a"
        c.cut.add(frozenset(("a", "b")))  # a 10 ms blip
        c.write()
        c.write()  # confirmed at once (quorum 1)
        c.step()
        c.cut.clear()
        c.crash("a")
        for _ in range(30):
            c.step()
        c.start("a")
        for _ in range(600):
            c.step()  # SafetyViolation here if b's log won


def test_a_weak_active_cannot_overwrite_what_the_majority_confirmed() -> None:
    """A cut-off follower is forced active with quorum_override=1 and wins a higher term
    alone; on healing it must not overwrite the entries the majority's active confirmed
    meanwhile: the majority fences it, and its own weak entries are what gets discarded."""
    checked = 0
    for seed in range(30):
        c = Cluster(seed, ("a", "b", "c"), loss=0.0, priorities={"a": 1, "b": 3, "c": 1})
        for _ in range(300):
            c.step()
        majority_active = c.leader()
        if majority_active in (None, "a"):
            continue
        c.cut |= {frozenset(("a", "b")), frozenset(("a", "c"))}
        c.strict = False  # two actives for a while, by the operator's choice
        r = c.nodes["a"]
        assert r is not None
        c.handle("a", r.reconfigure(dataclasses.replace(c.config("a"), quorum_override=1)))
        for _ in range(300):
            c.step()
        for _ in range(5):
            c.write()  # both actives take writes
        for _ in range(100):
            c.step()
        confirmed_by_majority = {e.index: e for e, _term in c.confirmed.values() if e.origin == majority_active}
        c.cut.clear()
        for _ in range(1000):
            c.step()
        final = c.nodes[majority_active].log  # type: ignore[union-attr]
        lost = [e for i, e in confirmed_by_majority.items() if i > len(final) or final[i - 1] != e]
        assert not lost, f"seed {seed}: {len(lost)} majority-confirmed entries overwritten"
        checked += 1
    assert checked >= 10


def test_a_replica_behind_the_compacted_log_catches_up_from_a_snapshot() -> None:
    c = Cluster(7, ("a", "b", "c"), loss=0.0)
    leader = _elect(c)
    assert leader is not None
    behind = next(n for n in ("a", "b", "c") if n != leader)
    c.crash(behind)
    for _ in range(20):
        c.write()
        c.step()
    for n, r in c.nodes.items():
        if r is not None:
            c.compact(n, r)
            assert r.snap_index > 0
    c.start(behind)
    for _ in range(300):
        c.step()
    assert c.snapshots >= 1
    states = {tuple(c.stable[n].state) for n in ("a", "b", "c")}
    assert len(states) == 1 and len(next(iter(states))) >= 21  # no-op + 20 writes, everywhere


def test_the_active_counts_itself_only_for_what_it_has_on_disk() -> None:
    cfg = ReplicaConfig(node="a", voters=("a",), election_timeout=1.0, heartbeat_interval=0.2)
    r = Replica(cfg, rng=random.Random(0))
    ready = r.tick(5.0)
    assert r.role is Role.LEADER and ready.append and not ready.committed  # the no-op is not on disk yet
    ready = r.persisted(ready.append[-1])
    assert [e.data for e in ready.committed] == [None]
    ready, entry = r.propose("x")
    assert entry is not None and not ready.committed
    assert [e.data for e in r.persisted(entry).committed] == ["x"]


def test_a_write_is_confirmed_only_once_the_active_has_it_on_disk_too() -> None:
    """Acks from both replicas are a majority without the active, but the active's own
    write (fsynced under SYNC) is part of the commit rule: a confirmed entry is on its disk."""
    cfg = ReplicaConfig(node="a", voters=("a", "b", "c"), election_timeout=1.0, heartbeat_interval=0.2)
    r = Replica(cfg, rng=random.Random(0))
    r.tick(5.0)
    r.step(Envelope("b", "a", VoteReply(r.term + 1, "b", True, pre=True)))  # pre-vote
    ready = r.step(Envelope("b", "a", VoteReply(r.term, "b", True)))
    assert r.role is Role.LEADER and ready.append
    noop = ready.append[-1]
    r.persisted(noop)
    for v in "bc":
        r.step(Envelope(v, "a", AppendReply(r.term, v, True, noop.index)))
    assert r.commit == noop.index
    ready, entry = r.propose("x")
    assert entry is not None
    for v in "bc":
        ready = r.step(Envelope(v, "a", AppendReply(r.term, v, True, entry.index)))
        assert not ready.committed and r.commit < entry.index  # not on the active's disk yet
    assert [e.data for e in r.persisted(entry).committed] == ["x"]


def test_alive_keeps_an_active_whose_replicas_disks_stall_and_never_commits() -> None:
    """Replicas whose replies wait for a stalled disk send Alive: the active goes on hearing
    from them (no step-down past the election timeout), but Alive counts toward no commit;
    one of a later term deposes it."""
    cfg = ReplicaConfig(node="a", voters=("a", "b", "c"), election_timeout=1.0, heartbeat_interval=0.2)
    r = Replica(cfg, rng=random.Random(0))
    r.tick(5.0)
    r.step(Envelope("b", "a", VoteReply(r.term + 1, "b", True, pre=True)))  # pre-vote
    ready = r.step(Envelope("b", "a", VoteReply(r.term, "b", True)))
    noop = ready.append[-1]
    r.persisted(noop)
    ready, entry = r.propose("x")
    assert entry is not None
    r.persisted(entry)
    t = 5.0
    for _ in range(30):  # 3 s of Alive and no reply: still the active, nothing committed
        t += 0.1
        r.tick(t)
        for v in "bc":
            r.step(Envelope(v, "a", Alive(r.term, v)))
        assert r.role is Role.LEADER and r.commit < noop.index
    r.tick(t + 1.01)  # and without it, the usual step-down
    assert r.role is Role.FOLLOWER
    r2 = Replica(cfg, rng=random.Random(0))
    r2.tick(5.0)
    r2.step(Envelope("b", "a", VoteReply(r2.term + 1, "b", True, pre=True)))  # pre-vote
    r2.step(Envelope("b", "a", VoteReply(r2.term, "b", True)))
    r2.step(Envelope("c", "a", Alive(r2.term + 1, "c")))
    assert r2.role is Role.FOLLOWER and r2.term == 2


def test_alive_is_word_for_the_check_of_quorum_only() -> None:
    """An Alive of an older term, or from a learner, does not keep an active; it is not a
    reply (failback's "answering", the replicas' progress); a follower ignores it."""
    cfg = ReplicaConfig(node="a", voters=("a", "b", "c"), learners=("l",), election_timeout=1.0,
                        heartbeat_interval=0.2)
    r = Replica(cfg, rng=random.Random(0))
    r.tick(5.0)
    r.step(Envelope("b", "a", VoteReply(r.term + 1, "b", True, pre=True)))  # pre-vote
    r.step(Envelope("b", "a", VoteReply(r.term, "b", True)))
    assert r.role is Role.LEADER and r.term == 1
    t = 5.0
    for _ in range(15):
        t += 0.1
        r.tick(t)
        r.step(Envelope("b", "a", Alive(0, "b")))  # an older term's
        r.step(Envelope("l", "a", Alive(r.term, "l")))  # a learner's: never a voter
    assert r.role is Role.FOLLOWER and r.term == 1  # stepped down: heard from 1 of 3 voters
    r3 = Replica(cfg, rng=random.Random(0))
    r3.tick(5.0)
    r3.step(Envelope("b", "a", VoteReply(r3.term + 1, "b", True, pre=True)))  # pre-vote
    r3.step(Envelope("b", "a", VoteReply(r3.term, "b", True)))
    r3.step(Envelope("b", "a", Alive(r3.term, "b")))
    assert r3._tracker.acked == {} and r3._tracker.live_since == {} and r3.progress() == {"b": 0, "c": 0, "l": 0}
    f = Replica(ReplicaConfig(node="b", voters=("a", "b", "c"), election_timeout=1.0, heartbeat_interval=0.2),
                rng=random.Random(0))
    ready = f.step(Envelope("c", "b", Alive(0, "c")))
    assert f.role is Role.FOLLOWER and not ready.messages and f.term == 0


def test_a_split_vote_is_retried_well_within_an_election_timeout() -> None:
    """Two replicas time out at once after the active died: each votes for itself and
    refuses the other. The next bid comes within half an election timeout (a full one
    again made failovers of ~2.7 s in drills), and it wins."""
    import random

    from ha.replica import Replica, ReplicaConfig, Role

    for seed in range(20):
        cfg = {n: ReplicaConfig(node=n, voters=("a", "b", "c"), election_timeout=1.0, heartbeat_interval=0.2)
               for n in "bc"}
        rs = {n: Replica(cfg[n], rng=random.Random(seed * 2 + i)) for i, n in enumerate("bc")}
        now = 5.0
        inbox = [m for n in "bc" for m in rs[n].tick(now).messages]
        assert all(r.role is Role.FOLLOWER and r.term == 0 for r in rs.values())  # asking for pre-votes
        while inbox:  # each grants the other's pre-vote; then refuses its vote: it voted for itself
            env = inbox.pop(0)
            if env.dst in rs:
                inbox.extend(rs[env.dst].step(env).messages)
        assert all(r.role is Role.CANDIDATE and r.term == 1 for r in rs.values()), f"seed {seed}: no split"
        leader = None
        while leader is None and now < 5.0 + 0.5:
            now += 0.01
            for n in "bc":  # a tick's messages arrive before the next node's tick (they take < 10 ms)
                inbox = list(rs[n].tick(now).messages)
                while inbox:
                    env = inbox.pop(0)
                    if env.dst in rs:
                        inbox.extend(rs[env.dst].step(env).messages)
            leader = next((n for n, r in rs.items() if r.role is Role.LEADER), None)
        assert leader is not None, f"seed {seed}: still no active half an election timeout after the split"


def test_a_more_recent_replica_stands_as_soon_as_a_less_recent_one_asks_for_its_vote() -> None:
    """The active died; c, whose log is behind b's, times out first and asks b for its
    vote.  b refuses (its log is more recent), and it must stand at once rather than wait
    out its own timer: c can never win, so every bid of c's until then was a second of
    failover lost (drills showed pauses of 2.7-3.2 s from this)."""
    late = 0
    for seed in range(30):
        cfgs = {n: ReplicaConfig(node=n, voters=("a", "b", "c"), election_timeout=1.0, heartbeat_interval=0.2)
                for n in "bc"}
        e1, e2 = Entry(1, 1, "x", "a"), Entry(1, 2, "y", "a")
        rs = {"b": Replica(cfgs["b"], rng=random.Random(seed), term=1, log=[e1, e2], commit=1),
              "c": Replica(cfgs["c"], rng=random.Random(seed + 1000), term=1, log=[e1], commit=1)}
        now = rs["c"]._election_at  # c's timer fires first
        if rs["b"]._election_at > now + 0.3:
            late += 1  # b's own timer would have kept the partition without an active for longer
        inbox = list(rs["c"].tick(now).messages)
        assert inbox and all(isinstance(e.msg, RequestVote) and e.msg.pre for e in inbox)  # a pre-vote first
        start = now
        while rs["b"].role is not Role.LEADER and now < start + 0.2:
            while inbox:
                env = inbox.pop(0)
                if env.dst in rs:
                    inbox.extend(rs[env.dst].step(env).messages)
            now += 0.01
            inbox.extend(m for n in "bc" for m in rs[n].tick(now).messages)
        assert rs["b"].role is Role.LEADER, f"seed {seed}: b not active 0.2 s after c's first bid"
    assert late >= 5  # the seeds do exercise a late timer on b


def test_wake_at_is_when_tick_next_acts() -> None:
    """The driver sleeps until ``wake_at`` (when sooner than its next round): a tick just
    before it does nothing, a tick at it campaigns (a follower) or sends heartbeats."""
    for seed in range(10):
        cfg = ReplicaConfig(node="b", voters=("a", "b", "c"), election_timeout=1.0, heartbeat_interval=0.2)
        r = Replica(cfg, rng=random.Random(seed), term=1)
        at = r.wake_at
        assert 1.0 <= at <= 1.5 + 1e-9
        assert not r.tick(at - 1e-6).messages and r.role is Role.FOLLOWER
        pre = r.tick(at).messages
        assert len(pre) == 2 and r.role is Role.FOLLOWER and r.term == 1  # a pre-vote for term 2
        assert all(isinstance(e.msg, RequestVote) and e.msg.pre and e.msg.term == 2 for e in pre)
        assert r.wake_at >= at + 1.0  # the pre-vote's answers are due within an election timeout
        bid = r.step(Envelope("a", "b", VoteReply(2, "a", True, pre=True))).messages
        assert len(bid) == 2 and r.role is Role.CANDIDATE and r.term == 2
        retry = r.wake_at  # a first bid that fails is retried sooner
        assert at + 0.2 - 1e-9 <= retry <= at + 0.5 + 1e-9
        for voter in "ac":
            r.step(Envelope(voter, "b", VoteReply(r.term, voter, True)))
        assert r.role is Role.LEADER
        beat = r.wake_at
        assert not r.tick(beat - 1e-6).messages
        assert {e.dst for e in r.tick(beat).messages} == {"a", "c"}


class _DeafCluster(Cluster):
    """A cluster in which the nodes in ``deaf`` receive nothing but still send (a one-way cut)."""

    deaf: frozenset[str] = frozenset()

    def step(self, dt: float = 0.01) -> None:
        import heapq

        self.now += dt
        while self.net and self.net[0][0] <= self.now:
            _t, _s, env = heapq.heappop(self.net)
            r = self.nodes.get(env.dst)
            if r is not None and env.dst not in self.deaf and frozenset((env.src, env.dst)) not in self.cut:
                self.handle(env.dst, r.step(env))
        for n, r in self.nodes.items():
            if r is not None:
                self.handle(n, r.tick(self.now))
        self.check()


@pytest.mark.parametrize("voters", [("a", "b", "c"), ("a", "b", "c", "d", "e")])
def test_a_voter_that_cannot_hear_does_not_split_the_others_votes(voters: tuple[str, ...]) -> None:
    """A voter cut one way falls behind and bids again and again; each bid deposes the active
    (no pre-vote).  The deposed active stands again and wins at once: the other replicas,
    which heard that active a moment ago, must not stand early against it: standing early,
    they would split the vote, and terms would pass electing nobody."""
    wasted = 0
    for seed in range(10):
        c = _DeafCluster(seed, voters, loss=0.0, max_delay=0.005)
        for i in range(400):
            c.step()
            if i % 5 == 0:
                c.write()
        assert c.leader() is not None
        deaf = voters[-1] if c.leader() != voters[-1] else voters[0]
        c.deaf = frozenset({deaf})
        won: set[int] = set()
        stood: set[int] = set()
        for i in range(3000):  # 30 s
            c.step()
            if i % 5 == 0:
                c.write()
            for n, r in c.nodes.items():
                if n != deaf and r is not None:
                    if r.role is Role.LEADER:
                        won.add(r.term)
                    elif r.role is Role.CANDIDATE:
                        stood.add(r.term)
        wasted += len(stood - won)
    assert wasted <= 2, f"{wasted} terms in which the hearing replicas stood and nobody won"
