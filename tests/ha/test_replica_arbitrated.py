"""ha.replica under an outside arbiter (the LockFile): the holder is elected on its own vote
and commits with its peer unless told it is alone (``commit_quorum``); ``stand_now`` and
``step_down``; a replica of an arbitrated log never fences the holder's weak entries."""

from __future__ import annotations

import random

import pytest

from ha.errors import IllegalTransition
from ha.messages import AppendEntries, AppendReply, Entry, Envelope, Ready
from ha.replica import Replica, ReplicaConfig, Role
from ha.roles import RoleEvent, next_role


def holder_config(*, alone: bool, arbitrated: bool = True) -> ReplicaConfig:
    return ReplicaConfig(node="a", voters=("a", "b"), priorities={"a": 1}, election_timeout=1.0,
                         heartbeat_interval=0.2, designated_primary="a", commit_quorum=1 if alone else 2,
                         arbitrated=arbitrated)


def passive_config(*, arbitrated: bool = True) -> ReplicaConfig:
    return ReplicaConfig(node="b", voters=("a", "b"), priorities={"b": 0}, election_timeout=1.0,
                         heartbeat_interval=0.2, arbitrated=arbitrated)


def elected(cfg: ReplicaConfig) -> Replica:
    r = Replica(cfg, rng=random.Random(0))
    r.stand_now()
    ready = r.tick(0.0)
    assert r.role is Role.LEADER  # its own vote: the lock decided
    r.persisted(ready.append[-1])
    return r


def test_stand_now_makes_the_next_tick_stand() -> None:
    r = Replica(holder_config(alone=True), rng=random.Random(0), now=0.0)
    assert r.wake_at > 0.0
    r.stand_now()
    assert r.wake_at == 0.0
    r.tick(0.0)
    assert r.role is Role.LEADER


def test_with_the_peer_in_step_an_entry_commits_only_once_the_peer_has_it() -> None:
    r = elected(holder_config(alone=False))
    assert r.commit == 0  # even its no-op waits for b
    _ready, e = r.propose(b"x")
    assert e is not None
    r.persisted(e)
    assert r.commit == 0
    r.step(Envelope("b", "a", AppendReply(r.term, "b", True, e.index)))
    assert r.commit == e.index


def test_alone_it_commits_on_its_own_write_and_reconfigured_with_the_peer_it_waits_again() -> None:
    r = elected(holder_config(alone=True))
    _ready, e = r.propose(b"x")
    assert e is not None
    r.persisted(e)
    assert r.commit == e.index
    r.reconfigure(holder_config(alone=False))
    _ready, e2 = r.propose(b"y")
    assert e2 is not None
    r.persisted(e2)
    assert r.commit == e.index  # the next one needs b


def test_a_pending_entry_commits_at_once_when_the_holder_is_told_it_is_alone() -> None:
    r = elected(holder_config(alone=False))
    _ready, e = r.propose(b"x")
    assert e is not None
    r.persisted(e)
    assert r.commit == 0
    ready = r.reconfigure(holder_config(alone=True))
    assert r.commit == e.index and [x.index for x in ready.committed][-1] == e.index


def test_step_down_leaves_the_active_role_at_once_and_is_a_no_op_elsewhere() -> None:
    r = elected(holder_config(alone=True))
    ready = r.step_down("lock lost")
    assert r.role is Role.FOLLOWER and r.leader is None
    assert [(ev.old, ev.new) for ev in ready.events] == [("active", "follower")]
    assert r.step_down("again").events == []
    _ready, e = r.propose(b"x")
    assert e is None


def test_deposed_is_in_the_role_table() -> None:
    assert next_role(Role.LEADER, RoleEvent.DEPOSED) is Role.FOLLOWER
    assert next_role(Role.CANDIDATE, RoleEvent.DEPOSED) is Role.FOLLOWER
    for role in (Role.FOLLOWER, Role.LEARNER):
        with pytest.raises(IllegalTransition):
            next_role(role, RoleEvent.DEPOSED)


@pytest.mark.parametrize("arbitrated", [True, False])
def test_the_holders_weak_entries_replace_a_replicas_strong_ones_only_when_arbitrated(arbitrated: bool) -> None:
    """b holds a strong entry, never committed, that the new holder lacks (it came from an
    old holder: here b's own term-1 append stands for it); the new holder's entry is weak
    (it wrote it alone)."""
    b = Replica(passive_config(arbitrated=arbitrated), rng=random.Random(0))
    old = Entry(1, 1, b"old", "b", False)
    b.step(Envelope("b", "b", AppendEntries(1, "b", 0, 0, "", (old,), 0)))
    assert b.last_index == 1
    new = Entry(2, 1, None, "a", True)
    ready: Ready = b.step(Envelope("a", "b", AppendEntries(2, "a", 0, 0, "", (new,), 1)))
    replies = [env.msg for env in ready.messages if isinstance(env.msg, AppendReply)]
    if arbitrated:
        assert b.entry(1).origin == "a" and replies[-1].success  # replaced: the lock holder's log wins
        assert b.term == 2
    else:
        assert b.term == 3 and not replies[-1].success  # fenced: the weak active is deposed
