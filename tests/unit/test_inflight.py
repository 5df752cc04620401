"""When an active holds a partition's next proposals back for its entry in flight
(broker.replication.waits_for_commit, docs/replication.md "one entry in flight"), and when
it must not: a held-back proposal must never wait for a commit that cannot come."""

from __future__ import annotations

import broker.replication as rep
from ha.messages import AppendEntries, AppendReply, Envelope
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


def test_an_active_that_raises_its_own_term_holds_nothing_back() -> None:
    """A rival active in the same term (possible under a weak override) with a less recent
    log makes this active raise its term and stay active.  Its entry of the old term then
    commits only with an entry of the new term: what is staged must go, or nothing would
    ever commit again (a review found this stall)."""
    r = active_replica()
    plog = rep.PartLog((1, 0), r, None)  # type: ignore[arg-type]
    plog.staged_ops.append(Settle(1, 0, [0]))
    old = _in_flight(r, plog, b"proposed in the old term")
    assert rep.waits_for_commit(plog)
    term = r.term
    r.step(Envelope("b", "a", AppendEntries(term, "b", 0, 0, "", (), 0)))
    assert r.role is Role.LEADER and r.term == term + 1
    _commit(r, old)
    assert r.commit < old  # an entry of the old term does not commit by itself
    assert not rep.waits_for_commit(plog)
    new = _in_flight(r, plog, b"the next proposal")
    _commit(r, new)
    assert r.commit == new  # and carries the old one with it
