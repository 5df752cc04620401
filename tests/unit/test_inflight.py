"""When an active holds a partition's next proposals back for its entry in flight
(broker.modes.replicated.commit.waits_for_commit, docs/replication.md "one entry in flight"), and when
it must not: a held-back proposal must never wait for a commit that cannot come."""

from __future__ import annotations

import broker.modes.replicated as rep
from ha.messages import AppendEntries, AppendReply, Envelope, VoteReply
from ha.replica import Replica, Role
from storage.base import Settle
from tests.helpers import active_replica


def _in_flight(r: Replica, plog: rep.PartLog, data: bytes) -> int:
    """Propose ``data`` as Replication does (its waiter, its term); the entry's index."""
    _ready, e = r.propose(data)
    assert e is not None
    r.persisted(e)
    plog.waiters[e.index] = ([], [])
    plog.proposed_term = e.term
    return e.index


def _commit(r: Replica, index: int) -> None:
    for peer in ("b", "c"):
        r.step(Envelope(peer, "a", AppendReply(r.term, peer, True, index)))


def test_what_is_staged_waits_for_the_entry_in_flight_unless_it_is_big() -> None:
    r = active_replica()
    plog = rep.PartLog((1, 0), r, None)  # type: ignore[arg-type]
    plog.staged_ops.append(Settle(1, 0, [0]))
    assert not rep.waits_for_commit(plog)  # nothing in flight: it goes
    index = _in_flight(r, plog, b"first")
    assert rep.waits_for_commit(plog)
    plog.staged_bytes = rep.STAGE_BYTES  # a megabyte of bodies goes without waiting
    assert not rep.waits_for_commit(plog)
    plog.staged_bytes = 0
    plog.staged_ops = [Settle(1, 0, [i]) for i in range(rep.LAZY_PROPOSE_OPS)]  # and so do many ops
    assert not rep.waits_for_commit(plog)
    plog.staged_ops = [Settle(1, 0, [0])]
    _commit(r, index)
    assert r.commit == index
    del plog.waiters[index]  # (Replication._apply)
    assert not rep.waits_for_commit(plog)


def test_the_catalogue_never_waits() -> None:
    r = active_replica()
    plog = rep.PartLog(rep.CATALOGUE, r, None)  # type: ignore[arg-type]
    plog.staged_ops.append(Settle(1, 0, [0]))
    _in_flight(r, plog, b"a declare")
    assert not rep.waits_for_commit(plog)


def test_an_active_past_its_term_holds_nothing_back() -> None:
    """Entries of an older term commit only with one of the current term: once the term has
    moved on since the entry in flight was proposed, what is staged goes."""
    r = active_replica()
    plog = rep.PartLog((1, 0), r, None)  # type: ignore[arg-type]
    plog.staged_ops.append(Settle(1, 0, [0]))
    _in_flight(r, plog, b"proposed in this term")
    assert rep.waits_for_commit(plog)
    plog.proposed_term = r.term - 1
    assert not rep.waits_for_commit(plog)


def test_an_active_that_meets_a_rival_stands_again_and_commits_its_old_entries() -> None:
    """A rival active in the same term (possible under a weak override) with a less recent
    log: this active fences it with a higher term, steps down and stands again at once, and
    the new term's no-op commits what it had not committed yet, its own no-op included.  (An
    active that stayed active in the raised term would never commit the old term's entries,
    and a new active whose no-op had not committed could never serve.)"""
    r = active_replica()  # its no-op (index 1) persisted, not committed
    _ready, e = r.propose(b"proposed in the old term")
    assert e is not None
    r.persisted(e)
    term = r.term
    ready = r.step(Envelope("b", "a", AppendEntries(term, "b", 0, 0, "", (), 0)))
    assert r.term == term + 1 and r.role is Role.FOLLOWER
    assert [(ev.old, ev.new) for ev in ready.events] == [("active", "follower")]  # type: ignore[union-attr]
    assert r.commit == 0
    r.tick(5.01)  # it stands at the next tick
    assert r.role is Role.CANDIDATE
    ready = r.step(Envelope("b", "a", VoteReply(r.term, "b", True)))
    assert r.role is Role.LEADER
    noop = ready.append[-1]
    r.persisted(noop)
    _commit(r, noop.index)
    assert r.commit == noop.index > e.index  # the old no-op and entry with it
