"""Where the active compacts a partition's log (broker.modes.replicated.compaction.compact_upto):
by count and size, but not past what a replica that answers still lacks, up to a cap."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

import broker.modes.replicated.compaction as compaction
from broker.modes.replicated import compact_upto, one_applied_position
from broker.modes.replicated.partlog import compacted
from storage.base import PutQueue, QueueMeta
from storage.sqlite.engine import SqliteEngine
from ha.messages import AppendReply, Envelope, VoteReply
from ha.replica import Replica, ReplicaConfig
from tests.helpers import active_replica


@pytest.fixture
def small(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compaction, "KEEP_ENTRIES", 1000)
    monkeypatch.setattr(compaction, "KEEP_BYTES", 100)
    monkeypatch.setattr(compaction, "HOLD_BYTES", 1000)


def test_compaction_keeps_what_an_answering_replica_lacks(small: None) -> None:
    r = active_replica(20, 50)  # the no-op is index 1, the entries 2..21
    r.step(Envelope("b", "a", AppendReply(r.term, "b", True, 21)))
    r.step(Envelope("c", "a", AppendReply(r.term, "c", True, 5)))  # c is behind, and answering
    assert r.applied == 21
    assert compact_upto(r) == (5, 16 * 50)  # c still gets entries 6.. from the log


def test_compaction_holds_at_most_hold_bytes(small: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compaction, "HOLD_BYTES", 300)
    r = active_replica(20, 50)
    r.step(Envelope("b", "a", AppendReply(r.term, "b", True, 21)))
    r.step(Envelope("c", "a", AppendReply(r.term, "c", True, 5)))
    assert compact_upto(r) == (15, 6 * 50)  # beyond that c gets a snapshot


def test_compaction_by_size_when_every_replica_has_it(small: None) -> None:
    r = active_replica(20, 50)
    for n in "bc":
        r.step(Envelope(n, "a", AppendReply(r.term, n, True, 21)))
    assert compact_upto(r) == (19, 2 * 50)  # KEEP_BYTES: the last two


def test_a_catching_up_replica_gets_appends_of_bounded_size() -> None:
    cfg = ReplicaConfig(node="a", voters=("a", "b", "c"), election_timeout=1.0, heartbeat_interval=0.2,
                        max_append_bytes=120)
    r = Replica(cfg, rng=random.Random(0))
    r.tick(5.0)
    r.step(Envelope("b", "a", VoteReply(r.term + 1, "b", True, pre=True)))  # its pre-vote, then its vote
    ready = r.step(Envelope("b", "a", VoteReply(r.term, "b", True)))
    r.persisted(ready.append[-1])
    for _ in range(6):
        r.propose(b"x" * 50)
    # c answers that it has nothing: the next append to it carries at most 120 bytes of entries
    ready = r.step(Envelope("c", "a", AppendReply(r.term, "c", False, 0)))
    sent = [env.msg for env in ready.messages if env.dst == "c"]
    assert sent and all(sum(len(e.data or b"") for e in m.entries) <= 120 or len(m.entries) == 1  # type: ignore[union-attr]
                        for m in sent)
    assert any(len(m.entries) >= 2 for m in sent)  # type: ignore[union-attr]


def test_held_store_writes_keep_the_newest_applied_position() -> None:
    """Store writes held across Readies carry one applied position, the newest, even when
    the last Ready only compacted the log (it brings a LogCompact and no position)."""
    from storage.base import Append, LogCompact, PutApplied, Settle

    first = [Append(1, 0, [], 5), PutApplied(1, 0, 5, 1, "a")]
    second = [Settle(1, 0, [0, 1]), PutApplied(1, 0, 7, 1, "a"), LogCompact(1, 0, 3, 1, "a")]
    compaction_only = [LogCompact(1, 0, 6, 1, "a")]
    ops = one_applied_position(first + second + compaction_only)
    assert ops == [Append(1, 0, [], 5), Settle(1, 0, [0, 1]), LogCompact(1, 0, 3, 1, "a"),
                   LogCompact(1, 0, 6, 1, "a"), PutApplied(1, 0, 7, 1, "a")]
    assert one_applied_position(compaction_only) == compaction_only


def _weak_active(strong: int, weak: int, size: int) -> Replica:
    """Node a: ``strong`` entries every voter has, then, its peers silent past the election
    timeout and ``quorum_override 1`` set, ``weak`` entries it commits alone."""
    r = active_replica(strong, size)
    for n in "bc":
        r.step(Envelope(n, "a", AppendReply(r.term, n, True, r.last_index)))
    r.reconfigure(dataclasses.replace(r.cfg, quorum_override=1))
    r.tick(9.0)  # (b and c silent past the election timeout)
    for _ in range(weak):
        _ready, e = r.propose(b"w" * size)
        assert e is not None and e.weak
        r.persisted(e)
    assert r.applied == r.last_index == 1 + strong + weak  # (committed alone)
    return r


def test_what_a_weak_active_wrote_alone_is_not_compacted(small: None) -> None:
    """Entries written under a weak override may be discarded when the group heals (HA-1014),
    and only entries still in the log can be compared with the active's and handed to the
    quarantine: compaction stops before the first of them."""
    r = _weak_active(20, 10, 50)
    assert r.compactable() == 21
    assert compact_upto(r) == (21, 10 * 50)
    assert compaction.weak_cap(r) == (21, False)


def test_past_twice_weak_hold_bytes_a_weak_actives_entries_are_compacted_and_said(small: None) -> None:
    """At weak_hold_bytes the active refuses publishes (WeakHold); acks and deliveries go on,
    and only past twice as much are the weak entries compacted."""
    r = _weak_active(20, 10, 50)  # 500 bytes of weak entries
    assert compaction.weak_bytes(r) == 500
    assert compaction.weak_cap(r, 240) == (31, True)  # (the caller logs it, once)
    assert compaction.weak_cap(r, 250) == (21, False)  # (the node's weak_hold_bytes: all 10 of 50 bytes kept)
    assert compact_upto(r, None, 240) == (29, 2 * 50)
    assert compact_upto(r, None, 250) == (21, 10 * 50)


def test_a_weak_active_refuses_a_publish_that_would_take_its_weak_writes_past_weak_hold_bytes() -> None:
    """WeakHold: asked at every publish (with its bytes), it says full once the entries a weak
    active wrote that no majority holds, and the publish, would pass the node's
    weak_hold_bytes; it counts the entries again only once the applied bytes moved by a 32nd
    of it; a strong log is never full."""
    r = _weak_active(20, 10, 50)  # 500 bytes of weak entries, 1,500 applied in all
    hold = compaction.WeakHold(640)
    assert not hold.reached(r, 1500, 100) and hold.reached(r, 1500, 141)
    for _ in range(2):
        _ready, e = r.propose(b"w" * 50)
        assert e is not None
        r.persisted(e)
    assert not hold.reached(r, 1510, 100)  # (600 now, but counted again only 20 bytes later)
    assert hold.reached(r, 1600, 41) and not hold.reached(r, 1600, 40)
    assert compaction.WeakHold(500).reached(r, 1600, 1) and compaction.WeakHold(0).reached(r, 1600, 1)
    assert not compaction.WeakHold(640).reached(r, 600, 40)  # (the applied log and the publish hold no more)
    assert not compaction.WeakHold(0).reached(active_replica(20, 50), 1000, 1000)  # (a strong active's)
    for n in "bc":  # its peers are back and hold it all: nothing unheld, the publish goes
        r.step(Envelope(n, "a", AppendReply(r.term, n, True, r.last_index)))
    assert r.entry(r.applied).weak and r.compactable() == r.applied and not r.unheld_tail()
    assert not hold.reached(r, 1600, 41)


def test_what_an_override_active_wrote_just_after_its_peers_went_is_not_compacted(small: None) -> None:
    """Within the election timeout after its peers last answered, an active under
    ``quorum_override 1`` still flags its entries strong, and commits them alone: compaction
    stops before the first of them a majority does not hold (Replica._unheld_from), and they
    count toward weak_hold_bytes; once a peer has them, they may go."""
    r = active_replica(20, 50)
    for n in "bc":
        r.step(Envelope(n, "a", AppendReply(r.term, n, True, r.last_index)))
    r.reconfigure(dataclasses.replace(r.cfg, quorum_override=1))
    for _ in range(10):  # (no tick: b and c answered a moment ago)
        _ready, e = r.propose(b"s" * 50)
        assert e is not None and not e.weak
        r.persisted(e)
    assert r.applied == r.last_index == 31  # (committed alone)
    assert r.compactable() == 21 and r.unheld_tail() and compaction.weak_bytes(r) == 500
    assert compact_upto(r) == (21, 10 * 50)
    assert compaction.WeakHold(520).reached(r, 1550, 21)
    r.step(Envelope("b", "a", AppendReply(r.term, "b", True, 31)))
    assert r.compactable() == 31 and not r.unheld_tail()


def test_compacted_past_its_weak_entries_a_log_still_knows_what_a_majority_wrote(small: None) -> None:
    """Past the bound the weak entries are compacted: elections still compare the last entry a
    majority wrote (not the snapshot's last, a weak one), and a snapshot of the state says
    it ends in weak entries (InstallSnapshot.weak), as it does while they are in the log."""
    r = _weak_active(20, 10, 50)
    strong = r.entry(21)
    assert not strong.weak and r.entry(31).weak
    assert r._log.recency() == (strong.term, 21) and r._state_weak()
    r.compact(31)
    assert r.snap_index == 31 and r._log.snap_weak
    assert r._log.recency() == (strong.term, 21) and r._state_weak()
    r.compact(31)  # (again: nothing changes)
    assert r._log.recency() == (strong.term, 21)


def test_a_strong_entry_after_weak_ones_makes_them_compactable() -> None:
    """A committed entry of an active with a majority follows them: that majority holds the
    log before it too, so no heal can discard them."""
    r = _weak_active(5, 3, 10)
    for n in "bc":  # (back: its writes are strong again)
        r.step(Envelope(n, "a", AppendReply(r.term, n, True, r.last_index)))
    r.reconfigure(dataclasses.replace(r.cfg, quorum_override=None))
    _ready, e = r.propose(b"s")
    assert e is not None and not e.weak
    r.persisted(e)
    r.step(Envelope("b", "a", AppendReply(r.term, "b", True, e.index)))
    assert r.applied == e.index and r.compactable() == e.index


def test_the_weak_mark_goes_to_the_store_with_the_snapshot_and_comes_back_on_a_restart(small: None,
                                                                                        tmp_path: Path) -> None:
    """A node restarted after compacting past its weak entries still knows its snapshot ends
    in them, and still compares the last entry a majority wrote in elections."""
    r = _weak_active(20, 10, 50)
    r.compact(31)
    op = compacted((1, 0), r)
    assert (op.upto, op.weak, op.recency) == (31, True, r._log.recency()) and r._log.recency()[1] == 21
    e = SqliteEngine(tmp_path / "tandem.db")
    e.open()
    e.apply([PutQueue(QueueMeta(id=1, name="q", partitions=1, mapper="jump_hash", ring_size=1024,
                                         max_deliveries=0, dead_letter_queue=None, max_length=0)), op], sync=True)
    e.close()
    again = SqliteEngine(tmp_path / "tandem.db")
    st = again.open().logs[(1, 0)]
    again.close()
    assert (st.snapshot[0], st.snap_weak, st.snap_recency) == (31, True, r._log.recency())
    back = Replica(r.cfg, rng=random.Random(1), snapshot=st.snapshot, snap_mark=(st.snap_weak, st.snap_recency))
    assert back._log.snap_weak and back._log.recency() == r._log.recency() and back._state_weak()
    # a strong snapshot keeps no mark: its recency is its own position
    strong = Replica(r.cfg, rng=random.Random(1), snapshot=(9, 2, "a"), snap_mark=(False, (0, 0)))
    assert not strong._log.snap_weak and strong._log.recency() == (2, 9)


def test_the_bytes_a_replica_lacks_count_only_what_the_log_still_holds(small: None) -> None:
    """A replica that answers but lacks entries compacted already (it gets a snapshot): the
    entries it lacks are counted from the log's first, never read below it (the oldest
    segment's compaction asks this of every partition that keeps it)."""
    r = active_replica(20, 50)
    for n in "bc":
        r.step(Envelope(n, "a", AppendReply(r.term, n, True, 21)))
    r.compact(15)
    r.step(Envelope("c", "a", AppendReply(r.term, "c", False, 5)))  # c lost its log: it is at 5
    assert compaction.entry_bytes(r, 6, r.applied) == 6 * 50
    assert compaction.entry_bytes(r, 1, 15) == 0
