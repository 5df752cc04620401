"""HA-1014 counts what a node discards on rejoin: entries it had counted as committed
(confirmed to clients, if it was their active) are reported as confirmed and lost, an
override is named only where one wrote them, and a snapshot that replaces them is no
excuse to say nothing.

The case these stand for: every node's power cut under a weak ``remote_sync``; the two
replicas lost their unsynced tail, came back first and elected one of themselves; the old
active, back last, holds entries it had confirmed that the new active's log lacks."""

from __future__ import annotations

import random
from collections.abc import Sequence

from broker.modes.replicated.events import discarded_text
from ha.messages import AppendEntries, EntriesDiscarded, Entry, Envelope, InstallSnapshot
from ha.replica import Replica, ReplicaConfig, Role

CFG = ReplicaConfig(node="a", voters=("a", "b", "c"), election_timeout=1.0, heartbeat_interval=0.2)


def old_active(entries: list[Entry], commit: int, snapshot: tuple[int, int, str] = (0, 0, "")) -> Replica:
    """Node a, restarted with ``entries`` in its log, knowing them committed up to ``commit``
    (the log's commit watermark)."""
    return Replica(CFG, rng=random.Random(1), term=entries[-1].term, voted_for="a", log=entries, commit=commit,
                   snapshot=snapshot)


def log_of(term: int, first: int, last: int, origin: str = "a", weak: bool = False) -> list[Entry]:
    return [Entry(term, i, f"x{i}".encode(), origin, weak) for i in range(first, last + 1)]


def discarded(events: Sequence[object]) -> list[EntriesDiscarded]:
    return [ev for ev in events if isinstance(ev, EntriesDiscarded)]


def test_entries_it_had_confirmed_and_the_new_active_lacks_are_confirmed_and_lost_with_no_override() -> None:
    r = old_active(log_of(2, 1, 50), commit=48)  # 1..48 confirmed; 49, 50 written, not yet committed
    # b was elected in term 3 from a log that ends at 40 (it lost 41..50 to the power cut)
    new = tuple(log_of(3, 41, 45, origin="b"))
    ready = r.step(Envelope("b", "a", AppendEntries(3, "b", 40, 2, "a", new, 45)))
    assert r.role is Role.FOLLOWER and r.last_index == 45
    [ev] = discarded(ready.events)
    assert (ev.first_index, ev.count, ev.committed, ev.weak, ev.upto) == (41, 10, 8, 0, False)
    assert ev.payloads[:ev.committed] == tuple(f"x{i}".encode() for i in range(41, 49))
    text = discarded_text(ev, 10, 8)
    assert "8 of them (8 messages) had been confirmed (confirmed and lost)" in text
    assert "override" not in text and "never committed" not in text
    assert "the other 2 were not known here as committed" in text


def test_entries_it_never_counted_as_committed_are_not_called_confirmed() -> None:
    r = old_active(log_of(2, 1, 50), commit=40)
    ready = r.step(Envelope("b", "a", AppendEntries(3, "b", 40, 2, "a", tuple(log_of(3, 41, 41, "b")), 41)))
    [ev] = discarded(ready.events)
    assert (ev.count, ev.committed) == (10, 0)
    assert "none of them was confirmed by this node" in discarded_text(ev, 10, 0)


def test_an_override_is_named_only_for_the_entries_written_under_one() -> None:
    entries = log_of(2, 1, 40) + log_of(3, 41, 44, weak=True)  # a alone under quorum_override in term 3
    r = old_active(entries, commit=44)
    new = tuple(log_of(4, 41, 41, origin="b"))  # the majority went on in term 4
    ready = r.step(Envelope("b", "a", AppendEntries(4, "b", 40, 2, "a", new, 41)))
    [ev] = discarded(ready.events)
    assert (ev.count, ev.committed, ev.weak) == (4, 4, 4)
    assert "4 of those were written by an active under a weak override" in discarded_text(ev, 4, 4)
    assert ev.written == (("a", 3),) * 4  # (who wrote each, in which term: the quarantine keeps it)


def test_a_snapshot_that_replaces_confirmed_entries_reports_them_at_most_and_those_of_a_later_term_for_certain() -> None:
    # a holds 1..50 of term 2 and 51..55 of term 4 (an override it has no more), all committed
    entries = log_of(2, 1, 50) + log_of(4, 51, 55)
    r = old_active(entries, commit=55)
    # b's snapshot at 200, term 3: b's history holds a's term-2 entries up to some point it
    # does not say, and none of term 4
    ready = r.step(Envelope("b", "a", InstallSnapshot(5, "b", 200, 3, "b", b"state")))
    assert ready.snapshot is not None and r.snap_index == 200
    [ev] = discarded(ready.events)
    assert ev.upto and (ev.count, ev.committed, ev.certain) == (55, 55, 5)
    text = discarded_text(ev, 55, 55)
    assert "up to 55 of them" in text and "5 for certain" in text


def test_a_snapshot_reports_the_confirmed_entries_after_its_index_for_certain() -> None:
    r = old_active(log_of(2, 1, 60), commit=58)
    ready = r.step(Envelope("b", "a", InstallSnapshot(3, "b", 50, 3, "b", b"state")))
    [ev] = discarded(ready.events)
    # 1..50 of term 2, under a snapshot of term 3: may or may not be in it; 51..60 are not
    assert ev.upto and ev.first_index == 1 and (ev.count, ev.committed, ev.certain) == (60, 58, 8)


def test_a_snapshot_of_the_same_term_as_the_confirmed_entries_holds_them() -> None:
    r = old_active(log_of(2, 1, 30), commit=30)
    ready = r.step(Envelope("b", "a", InstallSnapshot(2, "b", 80, 2, "a", b"state")))
    assert ready.snapshot is not None and not discarded(ready.events)


def test_a_snapshot_over_entries_it_never_committed_reports_only_those_after_its_index() -> None:
    r = old_active(log_of(2, 11, 30), commit=10, snapshot=(10, 2, "a"))
    ready = r.step(Envelope("b", "a", InstallSnapshot(3, "b", 25, 3, "b", b"state")))
    [ev] = discarded(ready.events)
    assert not ev.upto and (ev.first_index, ev.count, ev.committed) == (26, 5, 0)


def test_a_snapshot_of_the_same_term_by_another_active_may_not_hold_them() -> None:
    # two actives in term 3 (an override on each side of a cut): b's snapshot does not vouch for a's
    r = old_active(log_of(2, 1, 10) + log_of(3, 11, 20, weak=True), commit=20)
    ready = r.step(Envelope("b", "a", InstallSnapshot(4, "b", 60, 3, "b", b"state")))
    [ev] = discarded(ready.events)
    assert ev.upto and (ev.first_index, ev.count, ev.committed, ev.weak) == (1, 20, 20, 10)
