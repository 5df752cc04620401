"""The log-replication half of a partition's core (:class:`ha.replica.Replica`), sans-IO.

:class:`LogReplication` is a mixin of the replica: the attributes it declares are the
replica's, set by its constructor.

* The active sends each member the entries it lacks from its next index, pipelined; a
  snapshot where they are compacted; a witness only their positions, and no further than
  the commit index while it does not count (:mod:`ha.witness`).  Each successful reply
  moves the member's match index (:class:`~ha.progress.PeerTracker`) and may commit
  (:func:`ha.quorum.commit_index`).
* A replica takes entries and snapshots from the active it follows: what it has already it
  keeps, what differs it truncates and reports (HA-1014, :mod:`ha.discards`); an active
  elected under a weak override that would overwrite entries a majority wrote is fenced.
* The driver reads the log here, says what is on its disk (:meth:`persisted`), and asks how
  far the log may be compacted (:meth:`compactable`: not past weak entries no majority is
  known to hold, :mod:`ha.quorum`).
"""

from __future__ import annotations

from ha import discards, quorum, witness
from ha.failback import Failback
from ha.log import EntryLog
from ha.members import Members, is_change
from ha.messages import Alive, AppendEntries, AppendReply, Entry, InstallSnapshot, Message, Ready, ReplicaWentBack
from ha.progress import PeerTracker
from ha.replica_config import ReplicaConfig
from ha.roles import Role


class LogReplication:
    """Log replication, both ways, and the driver's view of the log."""

    cfg: ReplicaConfig
    id: str
    term: int
    role: Role
    commit: int
    applied: int
    recovering: bool
    _log: EntryLog
    _persisted: int
    _base: Members
    _members_index: int
    _tracker: PeerTracker
    _term_first: int
    _failback: Failback
    _heard_from: dict[str, float]
    _now: float
    _ready: Ready

    # Defined by Replica: terms, roles and members.

    def _follow(self, term: int, leader: str, recency: tuple[int, int]) -> bool:
        raise NotImplementedError

    def _fence_weak_active(self, term: int, leader: str) -> None:
        raise NotImplementedError

    def _observe_term(self, term: int, leader: str | None = None) -> None:
        raise NotImplementedError

    def _refresh_members(self) -> None:
        raise NotImplementedError

    def _hand_over_if_caught_up(self) -> None:
        raise NotImplementedError

    def _send(self, dst: str, msg: Message) -> None:
        raise NotImplementedError

    def _hard_state_changed(self) -> None:
        raise NotImplementedError

    def _take_ready(self) -> Ready:
        raise NotImplementedError

    # -- the log, read-only to the driver (ha.log.EntryLog) -------------------------------------

    @property
    def log(self) -> list[Entry]:
        """The entries after the snapshot: ``log[i]`` has index ``snap_index + i + 1``."""
        return self._log.entries

    @property
    def snap_index(self) -> int:
        return self._log.snap_index

    @property
    def snap_term(self) -> int:
        return self._log.snap_term

    @property
    def snap_origin(self) -> str:
        return self._log.snap_origin

    @property
    def last_index(self) -> int:
        return self._log.last_index

    def entry(self, index: int) -> Entry:
        return self._log.entry(index)

    def entries(self, first: int, last: int) -> list[Entry]:
        """Entries first..last (inclusive) still in the log."""
        return self._log.slice(first, last)

    def persisted(self, entry: Entry) -> Ready:
        """The driver's log write up to ``entry`` is durable.  The active counts itself
        toward a commit only for entries it has on disk."""
        i = entry.index
        if self._persisted < i and self.snap_index < i and self._log.has(i, entry.term, entry.origin):
            self._persisted = i
            if self.role is Role.LEADER:
                self._advance_commit()
        return self._take_ready()

    def compactable(self) -> int:
        """How far the log may be compacted: what is applied, but not past an entry a weak
        active wrote (``quorum_override``, ``designated_primary``) that a majority is not
        known to hold (:func:`ha.quorum.compactable`)."""
        return quorum.compactable(self._log, self.applied, arbitrated=self.cfg.arbitrated, held=self._held(),
                                  term_first=self._term_first)

    def snapshot_mark(self) -> tuple[bool, tuple[int, int]]:
        """The snapshot's weak mark and recency, for the store to keep with it."""
        return self._log.mark()

    def unheld_tail(self) -> bool:
        """Whether the applied log ends in entries no majority is known to hold (what
        ``compactable`` keeps): O(voters)."""
        return quorum.unheld_tail(self._log, self.applied, arbitrated=self.cfg.arbitrated, held=self._held(),
                                  term_first=self._term_first)

    def live_match(self) -> int | None:
        """On the active: the lowest last index on the other members (learners included)
        that acknowledged an append within the election timeout; None if there is none.
        Compaction keeps what they still need (they are catching up, not gone)."""
        if self.role is not Role.LEADER:
            return None
        return self._tracker.live_match(self.id, self._now, self.cfg.election_timeout)

    def progress(self) -> dict[str, int]:
        """On the active: the last index known to be on each other member."""
        return dict(self._tracker.match) if self.role is Role.LEADER else {}

    # -- quorum counting (ha.quorum) ----------------------------------------------------------

    def _weak_active(self) -> bool:
        """This active's writes are not backed by a majority (:func:`ha.quorum.weak_active`)."""
        return quorum.weak_active(self.cfg, self._tracker, self.id, self._now)

    def _held(self) -> int | None:
        """On the active under a lowered quorum (override, designated primary): the last entry
        a majority of the voters a commit counts is known to hold; None elsewhere."""
        if self.role is not Role.LEADER or not quorum.lowered(self.cfg):
            return None
        return quorum.majority_holds(self.cfg, self._counted_voters(), self.id, self._persisted, self._tracker)

    def _counted_voters(self) -> tuple[str, ...]:
        return quorum.counted_voters(self.cfg, self.witness_counts())

    def witness_counts(self) -> bool:
        """On the active: whether a witness's acknowledgement counts toward a commit now
        (:func:`ha.witness.counts`)."""
        return witness.counts(self.cfg, self.id, self._now, self._heard_from, self._tracker, self.commit)

    def _state_weak(self) -> bool:
        """Whether the applied state ends in entries a weak active wrote that no majority is
        known to hold (what a snapshot of it carries: InstallSnapshot.weak)."""
        return quorum.state_weak(self._log, self.applied, arbitrated=self.cfg.arbitrated)

    def _advance_commit(self) -> None:
        """What the voters' copies commit (:func:`ha.quorum.commit_index`)."""
        self.commit = quorum.commit_index(self.cfg, self._counted_voters(), self.id, self._tracker, self._log,
                                          self.term, self._persisted, self.commit)

    # -- the active: sending, and the replies --------------------------------------------------

    def _send_append(self, p: str) -> None:
        if p in self.cfg.witnesses:
            self._send_append_to_witness(p)
            return
        nxt = self._tracker.next.get(p, self.last_index + 1)
        if nxt <= self.snap_index:
            # The entries it needs are compacted: a snapshot (at most one per election
            # timeout in flight), and meanwhile a keep-alive it cannot match.
            if self._tracker.snapshot_due(p, self._now, self.cfg.election_timeout):
                self._send(p, InstallSnapshot(self.term, self.id, weak=self._state_weak()))
            nxt = self.snap_index + 1
            entries: tuple[Entry, ...] = ()
        else:
            entries = self._log.batch(nxt, self.cfg.max_append, self.cfg.max_append_bytes)
            if entries:
                # Pipelining: the next send starts after these.  A lost message shows up as
                # a mismatch on the next append, whose failure reply moves ``next`` back.
                self._tracker.next[p] = entries[-1].index + 1
        prev = nxt - 1
        self._send(p, AppendEntries(self.term, self.id, prev, self._log.term_at(prev), self._log.origin_at(prev), entries,
                                    self.commit))

    def _send_limit(self, p: str) -> int:
        """The last index ``p`` is sent now: a witness that does not count gets no further
        than the commit index."""
        if p in self.cfg.witnesses and not self.witness_counts():
            return self.commit
        return self.last_index

    def _send_append_to_witness(self, p: str) -> None:
        """The witness gets entry positions (term, index, origin, weak), never data, and
        only up to the commit index while it does not count toward commits
        (:meth:`witness_counts`); what it needs of the compacted log is the snapshot's
        position alone."""
        nxt = self._tracker.next.get(p, self.last_index + 1)
        entries: tuple[Entry, ...] = ()
        if nxt <= self.snap_index:
            if self._tracker.snapshot_due(p, self._now, self.cfg.election_timeout):
                self._send(p, InstallSnapshot(self.term, self.id, self.snap_index, self.snap_term,
                                              self.snap_origin, b"", self._base))
            nxt = self.snap_index + 1
        else:
            batch = self._log.slice(nxt, min(self._send_limit(p), nxt + 4 * self.cfg.max_append - 1))
            if batch:
                entries = witness.positions(batch)
                self._tracker.next[p] = entries[-1].index + 1
        prev = nxt - 1
        self._send(p, AppendEntries(self.term, self.id, prev, self._log.term_at(prev), self._log.origin_at(prev),
                                    entries, self.commit))

    def _on_append_reply(self, m: AppendReply) -> None:
        if m.term > self.term:
            self._observe_term(m.term)
            return
        if self.role is not Role.LEADER or m.term != self.term:
            return
        went_back = self._tracker.record_reply(m, self._now, self.cfg.election_timeout)
        if went_back is not None:
            self._ready.events.append(ReplicaWentBack(self.id, self.term, m.replica, went_back, m.match_index))
        if m.success:
            self._advance_commit()
            if m.replica == self._failback.handing_to:
                self._hand_over_if_caught_up()
            if self._tracker.next[m.replica] <= self._send_limit(m.replica):
                self._send_append(m.replica)
        else:
            self._send_append(m.replica)

    def _on_alive(self, m: Alive) -> None:
        """The replica is up, its replies held back by its disk: word from it for the
        check of quorum (_check_quorum), nothing more."""
        if m.term > self.term:
            self._observe_term(m.term)
            return
        if self.role is Role.LEADER and m.term == self.term:
            self._tracker.heard[m.replica] = self._now

    # -- a replica: taking entries and snapshots from the active --------------------------------

    def _on_append(self, m: AppendEntries) -> None:
        # (prev_term, prev_index) is a lower bound of the sender's recency
        if not self._follow(m.term, m.leader, (m.prev_term, m.prev_index)):
            return
        if m.prev_index < self.snap_index:
            # It resends what we have compacted: committed, so identical, unless a weak active
            # wrote it here and the driver had to compact it (broker.modes.replicated.compaction).
            # What reaches the snapshot's last entry is compared with it; an entry of a later
            # term than that cannot be in it.  Short of it, only the entries sent are promised.
            skip = self.snap_index - m.prev_index
            compacted = m.entries[:skip]  # (the entries sent that this node compacted)
            if any(e.term > self.snap_term for e in compacted) or (
                    len(compacted) == skip and (compacted[-1].term, compacted[-1].origin)
                    != (self.snap_term, self.snap_origin)):
                self._diverged_below_snapshot()
                return
            if len(compacted) < skip:
                self._send(m.leader, AppendReply(self.term, self.id, True, m.prev_index + len(compacted)))
                return
            m = AppendEntries(m.term, m.leader, self.snap_index, self.snap_term, self.snap_origin,
                              m.entries[skip:], m.commit)
        if not self._log.has(m.prev_index, m.prev_term, m.prev_origin):
            hint = min(self.last_index, m.prev_index - 1)
            self._send(m.leader, AppendReply(self.term, self.id, False, max(0, hint)))
            return
        changed = False
        for e in m.entries:
            if e.index <= self.last_index:
                mine = self.entry(e.index)
                if mine.term == e.term and mine.origin == e.origin:
                    continue
                if e.weak and not mine.weak and not self.cfg.arbitrated:
                    self._fence_weak_active(m.term, m.leader)
                    return
                self._truncate(e.index)
            self._log.entries.append(e)
            self._ready.append.append(e)
            changed = changed or is_change(e.data)
        if changed:
            self._refresh_members()
        match = m.prev_index + len(m.entries)
        if self.recovering and match >= m.commit:
            self.recovering = False  # it has all the active had committed
        if m.commit > self.commit:
            self.commit = max(self.commit, min(m.commit, match))  # a late, shorter append never lowers it
        self._send(m.leader, AppendReply(self.term, self.id, True, match))

    def _on_snapshot(self, m: InstallSnapshot) -> None:
        if not self._follow(m.term, m.leader, (m.last_term, m.index)):
            return
        if m.weak and self.refuses_weak_snapshot() and not self._log.has(m.index, m.last_term, m.last_origin):
            # As with its entries (_on_append): an active elected under a weak override,
            # that compacted what it wrote alone, would replace what a majority wrote
            self._fence_weak_active(m.term, m.leader)
            return
        matches = self._log.has(m.index, m.last_term, m.last_origin) or m.index < self.snap_index
        if matches and m.index <= self.commit:
            self._send(m.leader, AppendReply(self.term, self.id, True, m.index))
            return  # we already have (and applied) all of it
        # Matching, what follows the snapshot's position stays: it matches too.  Otherwise
        # the entries after it cannot be the active's (log matching): they are discarded,
        # and so are the entries before it that differ (_replaced_by_snapshot).
        first = self.snap_index + 1
        replaced = [] if matches else self._log.slice(first, min(m.index, self.last_index))
        dropped = self._log.install(m.index, m.last_term, m.last_origin, keep=matches, weak=m.weak)
        if m.members is not None:
            self._base = m.members
        self._refresh_members()
        if not matches:
            report = discards.replaced_by_snapshot(self.id, self.term, self.commit, m, replaced, dropped)
            if report is not None:
                self._ready.events.append(report)  # (HA-1014)
            self._ready.truncate_from = first
            self._ready.append = []
            self._persisted = m.index
            self.commit = m.index
        self.commit = max(self.commit, m.index)
        self.applied = m.index
        self._persisted = max(self._persisted, m.index)
        self._ready.snapshot = m
        self.recovering = False
        self._ready.committed = [e for e in self._ready.committed if e.index > m.index]
        self._hard_state_changed()
        self._send(m.leader, AppendReply(self.term, self.id, True, m.index))

    def refuses_weak_snapshot(self) -> bool:
        """Whether a snapshot of a weak active's state (InstallSnapshot.weak) would replace
        committed entries a strong active wrote here (a majority has them): refused, and its
        sender deposed (the driver asks before it starts a partition over for a stream)."""
        return quorum.refuses_weak_snapshot(self._log, self.commit, arbitrated=self.cfg.arbitrated)

    def _diverged_below_snapshot(self) -> None:
        """The active's log differs from what this node has compacted: reported (HA-1014,
        :func:`ha.discards.below_snapshot`), and nothing is answered: the driver starts the
        partition over empty, and the active brings it everything again."""
        self._ready.events.append(discards.below_snapshot(self.id, self.term, self._log, self.commit))

    def _truncate(self, index: int) -> None:
        """Drop entries from ``index`` on: the active's log has others there (HA-1014).

        Entries this node counted as committed are among them when it was active under
        a weak override (``quorum_override``, ``designated_primary``) while cut off, or
        when the nodes that acknowledged them lost them (unsynced writes, every node's
        power cut) and elected one of themselves before this node was back: those
        confirmed writes are lost, reported in ``committed``, and the driver must roll
        back what it applied.
        """
        dropped = self._log.truncate(index)
        lost_committed = max(0, self.commit - index + 1)
        if lost_committed:
            self.commit = index - 1
            self.applied = min(self.applied, index - 1)
        self._persisted = min(self._persisted, index - 1)
        self._ready.truncate_from = index if self._ready.truncate_from is None else min(
            index, self._ready.truncate_from)
        self._ready.append = [e for e in self._ready.append if e.index < index]
        if self._members_index >= index:
            self._refresh_members()  # the change in effect was among them: the one before it is
        self._ready.events.append(discards.discarded(self.id, self.term, dropped, lost_committed))
