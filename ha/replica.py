"""The election and replication core of one partition on one node.  Sans-IO.

Raft's safety rules with Qpid's preferences (docs/replication.md):

* voters are the partition's sync members; async members are *learners*: fed
  the log, never vote, never stand;
* a vote goes only to a candidate whose log is at least as recent (last term,
  then last index); a voter whose log is as recent and whose ``priority`` is
  higher refuses and stands itself; priority 0 never stands;
* pre-vote (Raft's thesis 9.6): a replica whose election timer runs out first asks the
  voters whether they would vote for it in the next term, and raises its term and
  stands for real only once a quorum said yes; a voter says no while it hears from an
  active.  A replica cut off from the others (or one way) keeps its term, and does not
  depose the active when it is back.  A hand-over (failback's :class:`TimeoutNow`) and
  the arbiter's :meth:`Replica.stand_now` skip it: they are sanctioned;
* a candidate needs a majority of voters, or ``quorum_override`` votes, or in a
  two-voter group only its own if it is the ``designated_primary``;
* the active commits an entry of its own term once that many voters (itself
  included) have it; a new active first appends a no-op so earlier terms commit;
* an active that has not heard from enough voters for ``election_timeout``
  steps down (a cut-off active stops taking writes); a replica's :class:`Alive`
  counts as word from it (its replies may wait for a slow disk; it is not cut off);
* a replica that finds entries of a deposed term beyond the active's log
  truncates them and reports ``HA-1014`` with the count;
* a *witness* (``ReplicaConfig.witnesses``) is a voter without data: it is sent
  entry positions only, never stands, and the active counts it toward a commit only
  while no other data voter is in sync (:mod:`ha.witness`).

The driver calls :meth:`Replica.tick` with the time, :meth:`Replica.step` with
each message, and :meth:`Replica.propose` for client writes on the active;
each returns a :class:`~ha.messages.Ready` saying what to persist, send, apply.
Time is whatever the driver passes in; randomness comes from the ``rng`` given.

Every role change goes through the table in :mod:`ha.roles`; every message goes to its
handler through ``_HANDLERS``.  This module holds terms, roles, elections, membership
changes and failback; the log's replication both ways is :mod:`ha.replication` (the
class's other half).  The rules live beside them: :mod:`ha.elections` (how long to wait
before standing, how to answer a vote request), :mod:`ha.quorum` (what commits, what a
majority holds, weak actives), :mod:`ha.confchange` (when the members may change, which
are in effect), :mod:`ha.log` (the log and its snapshot position), :mod:`ha.progress`
(what the active knows of each member), :mod:`ha.discards` (the HA-1014 reports),
:mod:`ha.failback` (handing the partition back to the placement's choice).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from ha import confchange, witness
from ha.elections import Ballot, Voter, ballot, election_wait, first_election_at, pre_ballot
from ha.failback import Failback
from ha.log import EntryLog
from ha.members import Members, encode
from ha.messages import (
    Alive,
    AppendEntries,
    AppendReply,
    Entry,
    Envelope,
    HandingOver,
    HardState,
    InstallSnapshot,
    Message,
    Ready,
    RequestVote,
    RoleChanged,
    TimeoutNow,
    VoteReply,
)
from ha.progress import NEVER, PeerTracker
from ha.replica_config import ReplicaConfig
from ha.replication import LogReplication
from ha.roles import Role, RoleEvent, next_role

__all__ = ["Replica", "ReplicaConfig", "Role", "RoleEvent"]


class Replica(LogReplication):
    """One partition's election and replication core on one node (the module says how)."""

    def __init__(self, config: ReplicaConfig, *, rng: random.Random, now: float = 0.0,
                 term: int = 0, voted_for: str | None = None, log: list[Entry] | None = None,
                 commit: int = 0, snapshot: tuple[int, int, str] = (0, 0, ""), applied: int | None = None,
                 recovering: bool = False, snap_mark: tuple[bool, tuple[int, int]] = (False, (0, 0))) -> None:
        """``snapshot`` is (index, term, origin) of the last entry compacted away (its effect
        is in the driver's applied state), ``snap_mark`` its weak mark and recency as the
        store kept them (:meth:`snapshot_mark`); ``log`` the entries after it.  ``applied`` is
        how far the driver's state goes (default: ``commit``); committed entries after it
        come out of the first Ready to be applied again."""
        self.cfg = config
        self.id = config.node
        self.rng = rng
        self.term = term
        self.voted_for = voted_for
        self._log = EntryLog(snapshot, log or [])
        self._log.set_mark(*snap_mark)
        # What was confirmed before a restart counts as committed.
        self.commit = max(self.snap_index, min(commit, self.last_index))
        self.applied = self.commit if applied is None else max(self.snap_index, min(applied, self.commit))
        self._persisted = self.last_index  # what the driver has on disk (see persisted())
        #: rebuilt empty after losing state (HA-1014 of confirmed entries): neither votes nor
        #: stands until an active has brought it up to that active's commit index
        self.recovering = recovering
        #: the members as of the snapshot (the driver's, kept with its state); the log's last
        #: membership change, if any, overrides them (ha.members)
        self._base = Members(config.voters, config.learners)
        members, self._members_index = confchange.last_change(self._log.entries, self._base)  # (0: the base's)
        self.cfg = config.with_members(members)
        self.role = Role.FOLLOWER if self.id in self.cfg.voters else Role.LEARNER
        self.leader: str | None = None
        self._votes: set[str] = set()
        #: a pre-vote under way (for term + 1): who said yes, this node included; None: none
        self._pre_votes: set[str] | None = None
        #: the next stand skips the pre-vote: the arbiter chose this node (stand_now), it fenced
        #: another active with a term of its own, or it refused a real candidate and stands against it
        self._sanctioned = False
        self._tracker = PeerTracker()  # the active's view of the other members, in its term
        self._term_first = 0  # the active's no-op: the first entry of its term
        self._failback = Failback()  # the active's hand-over to the placement's choice
        # Until then this node does not press its priority (no refusals, ordinary timeouts):
        # set after a refusal and after a lost election, so a preference never blocks progress.
        self._deferring_until = -1.0
        self._stand_early_after = -1.0  # see _on_vote: a less recent candidate asked us
        self._active_seen = NEVER  # the last message this node took from an active (_follow)
        self._heard_from: dict[str, float] = {}  # member -> when its last message arrived (any term)
        self._now = now
        fresh = term == 0 and not self.log and self.snap_index == 0 and not recovering
        self._election_at = first_election_at(self.cfg, now, self._timeout(), fresh, self.rng)
        self._heartbeat_at = now
        self._ready = Ready()

    @property
    def handing_over(self) -> bool:
        """Failback under way: this active takes no writes until it has handed over or given
        up (the driver keeps what clients send meanwhile, rather than fail it)."""
        return self.role is Role.LEADER and self._failback.handing_to is not None

    @property
    def members(self) -> Members:
        """The partition's members as this replica uses them now: the last membership change
        in its log (committed or not), else the snapshot's (:mod:`ha.members`)."""
        return Members(self.cfg.voters, self.cfg.learners)

    @property
    def members_committed(self) -> bool:
        """The members in effect are committed (their change is, or they are the snapshot's)."""
        return self._members_index <= self.commit

    @property
    def snapshot_members(self) -> Members:
        """The members as of the snapshot: what the driver keeps with its state (a restart
        passes them back as the config's voters and learners)."""
        return self._base

    def members_at(self, index: int) -> Members:
        """The members as of ``index`` (>= the snapshot's): what a snapshot of the state up to
        there carries (the driver fills in :attr:`InstallSnapshot.members` with it)."""
        return confchange.last_change(self._log.slice(self.snap_index + 1, index), self._base)[0]

    @property
    def wake_at(self) -> float:
        """When ``tick`` next has something to do (a heartbeat, or an election): a driver
        that ticks then, not on its next round, keeps two rivals' random timers apart."""
        if self.role is Role.LEADER:
            return self._heartbeat_at
        return float("inf") if self.role is Role.LEARNER else self._election_at

    @property
    def now(self) -> float:
        """The time of the last tick."""
        return self._now

    # -- helpers --------------------------------------------------------------------------

    def _new_entry(self, data: Any) -> Entry:
        return Entry(self.term, self.last_index + 1, data, self.id, self._weak_active())

    def _peers(self) -> list[str]:
        return [n for n in self.cfg.voters + self.cfg.learners if n != self.id]

    def _timeout(self) -> float:
        return election_wait(self.cfg, self._now < self._deferring_until, self.rng)

    def _send(self, dst: str, msg: Message) -> None:
        self._ready.messages.append(Envelope(self.id, dst, msg))

    def _hard_state_changed(self) -> None:
        self._ready.hard_state = HardState(self.term, self.voted_for, self.commit)

    def _become(self, event: RoleEvent, reason: str) -> None:
        new = next_role(self.role, event)
        if new is not self.role:
            self._ready.events.append(RoleChanged(self.id, self.term, self.role.value, new.value, reason))
        self.role = new

    def _take_ready(self) -> Ready:
        if self.commit > self.applied or (self._ready.hard_state is not None
                                          and self._ready.hard_state.commit != self.commit):
            self._hard_state_changed()
        self._apply_committed()
        ready, self._ready = self._ready, Ready()
        return ready

    def _apply_committed(self) -> None:
        if self.commit > self.applied:
            self._ready.committed.extend(self.entries(self.applied + 1, self.commit))
            self.applied = self.commit

    def _observe_term(self, term: int, leader: str | None = None) -> None:
        if term > self.term:
            handing = (self.role is Role.LEADER
                       and self._now - self._failback.timeout_now_at < 2 * self.cfg.election_timeout)
            self.term = term
            self.voted_for = None
            self._pre_votes = None
            self._hard_state_changed()
            if self.role is not Role.FOLLOWER or leader is None:
                self._become(RoleEvent.HIGHER_TERM, f"saw term {term}")
            self.leader = leader
            if handing:
                # It told a node to stand: its own election timer ran out long ago, and it would
                # stand at once against that node (seen first in a reply of that node's, before
                # its vote request).  Only then: elsewhere a deposed active standing at once is
                # how a failover is quick (_on_vote).
                self._election_at = self._now + self._timeout()

    # -- inputs -----------------------------------------------------------------------------

    def tick(self, now: float) -> Ready:
        self._now = now
        if self.role is Role.LEADER:
            if now >= self._heartbeat_at:
                self._heartbeat_at = now + self.cfg.heartbeat_interval
                for p in self._peers():
                    self._send_append(p)
            self._check_quorum(now)
            if self.role is Role.LEADER:
                fb = self._failback
                if fb.handing_to is not None and now >= fb.handing_until:
                    fb.gave_up()  # it did not take over: carry on taking writes
                elif fb.handing_to is None and (self.cfg.failback_after or self.id in self.cfg.drained):
                    self._maybe_hand_back(now)
        elif self.role is not Role.LEARNER and now >= self._election_at:
            self._stand()
        return self._take_ready()

    def propose(self, data: Any) -> tuple[Ready, Entry | None]:
        """Append a client write (on the active only); the entry, or None if not active
        (or handing the partition over: the client tries again, and finds the new active)."""
        if self.role is not Role.LEADER or self._failback.handing_to is not None:
            return self._take_ready(), None
        entry = self._new_entry(data)
        self._log.entries.append(entry)
        self._ready.append.append(entry)
        for p in self._peers():
            self._send_append(p)
        return self._take_ready(), entry

    def change_members(self, new: Members) -> tuple[Ready, Entry]:
        """On the active: append the membership change to ``new`` (:mod:`ha.members`), in
        effect here at once and on each replica once it has the entry.  MembershipRefused
        unless it is safe now: the voters differ by one node at most, the previous change is
        committed, this active has committed an entry of its term, it stays a voter itself
        (hand the partition over first), and a node that becomes a voter is caught up."""
        confchange.check(self.members, new, me=self.id,
                         active=self.role is Role.LEADER and self._failback.handing_to is None,
                         change_index=self._members_index, commit=self.commit,
                         own_term_committed=self._log.term_at(self.commit) == self.term, match=self._tracker.match)
        return self._append_change(new)

    def _append_change(self, new: Members) -> tuple[Ready, Entry]:
        """Append the change to ``new`` and send it (change_members has checked it is safe)."""
        entry = self._new_entry(encode(new))
        self._log.entries.append(entry)
        self._ready.append.append(entry)
        self._set_members(new, entry.index)
        for p in self._peers():
            self._send_append(p)
        return self._take_ready(), entry

    def _refresh_members(self) -> None:
        """The log changed where a membership change is (appended, truncated, replaced by a
        snapshot): the last change in it, else the base, is in effect."""
        self._set_members(*confchange.last_change(self._log.entries, self._base))

    def _set_members(self, m: Members, index: int) -> None:
        self._members_index = index
        old = self.members
        if m == old:
            return
        self.cfg = self.cfg.with_members(m)
        self._ready.members = m
        if self.role is Role.LEARNER and self.id in m.voters:
            self._become(RoleEvent.PROMOTED, "made a voter")
            self._election_at = self._now + self._timeout()
        elif self.role in (Role.FOLLOWER, Role.CANDIDATE) and self.id not in m.voters:
            self._become(RoleEvent.DEMOTED, "made a learner" if self.id in m.learners else "no longer a member")
            self._pre_votes = None
            self._votes = set()
        elif self.role is Role.LEADER:
            gone = set(old.voters + old.learners) - set(m.voters + m.learners)
            confchange.retrack(self._tracker, self._peers(), gone, index, self._now)
            self._advance_commit()

    def compact(self, upto: int) -> None:
        """Forget entries up to ``upto`` (at most what is applied): the driver's state has
        them.  A replica that needs them later gets a snapshot instead.  The driver keeps
        what :meth:`compactable` holds back, up to a bound (broker.modes.replicated.compaction)."""
        upto = min(upto, self.applied)
        if upto <= self.snap_index:
            return
        if self._members_index:  # (none in the log: the base stays)
            self._base = self.members if self._members_index <= upto else self.members_at(upto)
        self._log.compact(upto)
        if self._members_index <= upto:
            self._members_index = 0

    def reconfigure(self, config: ReplicaConfig) -> Ready:
        """New priorities, ``quorum_override`` or ``designated_primary``: effective at once.
        Its voters and learners are not taken: the members are the log's (:meth:`change_members`)."""
        if config.node != self.id:
            raise ValueError("reconfigure changes settings, not the node")
        config = config.with_members(self.members)
        if config.preferred != self.cfg.preferred:
            self._failback.preferred_at = self._now  # (failback waits from here: see Failback._failback_to)
        self.cfg = config
        if self.role is Role.LEADER:
            self._advance_commit()
        return self._take_ready()

    def step_down(self, reason: str) -> Ready:
        """The group's arbiter no longer lets this node be active (a LockFile holder that lost
        its lock): an active or a candidate stops at once and waits an election timeout."""
        if self.role in (Role.LEADER, Role.CANDIDATE):
            self._become(RoleEvent.DEPOSED, reason)
            self.leader = None
            self._election_at = self._now + self._timeout()
        self._sanctioned = False
        return self._take_ready()

    def stand_now(self) -> None:
        """The group's arbiter made this node the one to be active: stand at the next tick
        rather than after an election timeout, and without a pre-vote (the arbiter decided)."""
        if self.role in (Role.FOLLOWER, Role.CANDIDATE):
            self._election_at = self._now
            self._sanctioned = True

    def step(self, env: Envelope) -> Ready:
        """A message from another replica, handed to its handler (``_HANDLERS``)."""
        handler = _HANDLERS.get(type(env.msg))
        if handler is not None:
            self._heard_from[env.src] = self._now
            handler(self, env.msg)
        return self._take_ready()

    # -- elections ------------------------------------------------------------------------------

    def _may_stand(self) -> bool:
        return self.cfg.priority(self.id) > 0 and self.id in self.cfg.voters and not self.recovering

    def _stand(self) -> None:
        """The election timer ran out: ask the voters for pre-votes (the real bid follows
        once a quorum would vote for this node: _on_vote_reply), or, sanctioned by the
        arbiter (stand_now), or where this node's own vote elects, stand at once."""
        if self.role is Role.CANDIDATE or self._pre_votes is not None:
            # Our last bid failed: stop pressing our priority for a while (see _on_vote).
            self._deferring_until = self._now + 4 * self.cfg.election_timeout
        self._pre_votes = None
        if self._sanctioned:
            self._sanctioned = False
            self._campaign()
            return
        self._election_at = self._now + self._timeout()  # the pre-vote's answers are due by then
        if not self._may_stand():
            return
        if self.cfg.quorum() <= 1:
            self._campaign()
            return
        self._pre_votes = {self.id}
        last_term, last_index = self._log.recency()
        for v in self.cfg.voters:
            if v != self.id:
                self._send(v, RequestVote(self.term + 1, self.id, last_index, last_term, self.cfg.rank(self.id),
                                          pre=True))

    def _campaign(self, reason: str = "no word from an active") -> None:
        first_bid = self.role is not Role.CANDIDATE
        self._pre_votes = None
        self._election_at = self._now + self._timeout()
        if not self._may_stand():
            return
        self._become(RoleEvent.ELECTION_TIMEOUT, reason)
        if first_bid:
            # If the first bid fails (two candidates split the votes), bid again sooner than
            # a full timeout: the others know the active is gone by now.  Random, so two
            # rivals part.  Only once: a node that keeps failing (it cannot reach a quorum)
            # and kept bidding fast would keep moving the term under the one that can win.
            self._election_at = self._now + self.cfg.election_timeout * (0.2 + self.rng.random() * 0.3)
        self.term += 1
        self.voted_for = self.id
        self.leader = None
        self._votes = {self.id}
        self._hard_state_changed()
        if len(self._votes) >= self.cfg.quorum():
            self._win()
            return
        last_term, last_index = self._log.recency()
        for v in self.cfg.voters:
            if v != self.id:
                self._send(v, RequestVote(self.term, self.id, last_index, last_term, self.cfg.rank(self.id)))

    def _voter(self) -> Voter:
        """This node as a voter (:func:`ha.elections.ballot`)."""
        et, now = self.cfg.election_timeout, self._now
        return Voter(
            term=self.term, voted_for=self.voted_for, may_vote=self.id in self.cfg.voters and not self.recovering,
            recency=self._log.recency(), rank=self.cfg.rank(self.id), deferring=now < self._deferring_until,
            follower=self.role is Role.FOLLOWER,
            may_stand_early=(self.cfg.priority(self.id) > 0 and now >= self._stand_early_after
                             and now - self._active_seen >= et - self.cfg.heartbeat_interval))

    def _stand_on(self, answer: Ballot) -> None:
        """What refusing a candidate makes this node do (:class:`~ha.elections.Ballot`)."""
        et, now = self.cfg.election_timeout, self._now
        if answer is Ballot.REFUSE_AND_STAND:
            self._election_at = now
            self._deferring_until = now + 2 * et
        elif answer is Ballot.STAND_EARLY:
            self._election_at = min(self._election_at, now + et * 0.05 * self.rng.random())
            self._stand_early_after = now + 2 * et

    def _on_pre_vote(self, m: RequestVote) -> None:
        """Would this node vote for ``m.candidate`` in ``m.term``?  Nothing is cast and no term
        taken up (:func:`ha.elections.pre_ballot`); a refusal carries this node's term, which
        the candidate takes up if it is behind."""
        active_heard = self.role is Role.LEADER or (
            self.leader not in (None, m.candidate) and self._now - self._active_seen < self.cfg.election_timeout)
        answer = pre_ballot(self._voter(), m, active_heard=active_heard)
        self._stand_on(answer)
        granted = answer is Ballot.GRANT
        self._send(m.candidate, VoteReply(m.term if granted else self.term, self.id, granted, pre=True))

    def _on_vote(self, m: RequestVote) -> None:
        if m.pre:
            self._on_pre_vote(m)
            return
        if witness.ignores_term(self.cfg, self.id, m, term=self.term, recency=self._log.recency(),
                                active_heard=(self.leader is not None and
                                              self._now - self._active_seen < self.cfg.election_timeout)):
            self._send(m.candidate, VoteReply(self.term, self.id, False))  # (ha.witness)
            return
        deposed = self.leader if m.term > self.term else None
        if m.term > self.term:
            self._observe_term(m.term)
        answer = ballot(self._voter(), m)
        if answer is Ballot.GRANT:
            self.voted_for = m.candidate
            self._hard_state_changed()
            self._election_at = self._now + self._timeout()
            if deposed is not None and witness.tells_deposed(self.cfg, self.id, deposed, m.candidate):
                self._send(deposed, AppendReply(self.term, self.id, False, 0))
        self._stand_on(answer)
        if answer in (Ballot.REFUSE_AND_STAND, Ballot.STAND_EARLY):
            # An election is under way already (the candidate raised its term): this node stands
            # against it without a pre-vote, as it would have before pre-votes existed
            self._sanctioned = True
        self._send(m.candidate, VoteReply(self.term, self.id, answer is Ballot.GRANT))

    def _on_vote_reply(self, m: VoteReply) -> None:
        if m.pre:
            if not m.granted:
                if m.term > self.term:
                    self._observe_term(m.term)  # a term this node missed: taken up, nobody deposed
                return
            if self._pre_votes is not None and m.term == self.term + 1 and self.role is not Role.LEADER:
                self._pre_votes.add(m.voter)
                if len(self._pre_votes) >= self.cfg.quorum():
                    self._campaign()
            return
        if m.term > self.term:
            self._observe_term(m.term)
            return
        if self.role is not Role.CANDIDATE or m.term != self.term or not m.granted:
            return
        self._votes.add(m.voter)
        if len(self._votes) >= self.cfg.quorum():
            self._win()

    # -- failback --------------------------------------------------------------------------------

    def _maybe_hand_back(self, now: float) -> None:
        """On the active: start handing the partition back to the placement's choice if it
        is time (:mod:`ha.failback`).  No writes from here; the node is sent what it lacks,
        then told to stand."""
        to = self._failback.start(self.cfg, self.id, now, self._tracker, self.last_index, self._weak_active())
        if to is not None:
            self._ready.events.append(HandingOver(self.id, self.term, to, drained=self.id in self.cfg.drained))
            self._hand_over_if_caught_up()

    def _hand_over_if_caught_up(self) -> None:
        to = self._failback.caught_up(self._tracker, self.last_index, self._now, self.cfg.election_timeout)
        if to is not None:
            self._send(to, TimeoutNow(self.term, self.id, self.cfg.rank(self.id)))

    def _on_timeout_now(self, m: TimeoutNow) -> None:
        """The active hands this node the partition: stand at once (the vote rules still
        decide; the active takes no writes meanwhile, so this log is as recent as its)."""
        if (m.term != self.term or m.leader != self.leader or self.role is not Role.FOLLOWER
                or self.cfg.priority(self.id) == 0 or self.recovering or self.cfg.rank(self.id) <= m.rank):
            return  # (the active takes writes again after an election timeout)
        self._campaign(f"{m.leader} handed over (failback)")

    def _win(self) -> None:
        self._become(RoleEvent.WON, f"{len(self._votes)} vote(s) in term {self.term}")
        self.leader = self.id
        self._tracker = PeerTracker.elected(self._peers(), self.last_index, self._now)
        self._failback.handing_to = None
        noop = self._new_entry(None)
        self._term_first = noop.index
        self._log.entries.append(noop)
        self._ready.append.append(noop)
        self._heartbeat_at = self._now + self.cfg.heartbeat_interval
        for p in self._peers():
            self._send_append(p)
        self._advance_commit()

    def _check_quorum(self, now: float) -> None:
        heard = self._tracker.heard_voters(self.cfg.voters, self.id, now, self.cfg.election_timeout)
        if heard < self.cfg.quorum():
            self._become(RoleEvent.LOST_QUORUM, f"heard from {heard} of {len(self.cfg.voters)} voters")
            self.leader = None
            self._election_at = now + self._timeout()

    # -- following an active (the log itself: ha.replication) -----------------------------------

    def _follow(self, term: int, leader: str, recency: tuple[int, int]) -> bool:
        """A message from ``leader`` of ``term``: follow it, or refuse it (False)."""
        if term < self.term:
            self._send(leader, AppendReply(self.term, self.id, False, 0))
            return False
        if term > self.term:
            self._observe_term(term, leader)
        if self.role is Role.LEADER:
            # Two actives in one term: only possible when a weak override let one be elected
            # without a majority.  The one whose log is less recent (then: whose name sorts
            # later) yields; the other fences it with a higher term and stands again at once:
            # an entry of the old term commits only through one of a later term, and only an
            # election gives this node that (its no-op): staying active in the raised term, a
            # new active whose no-op has not committed could never serve.
            if (self._log.recency() + (self.id,)) > recency + (leader,) and not self._weak_active():
                self.term += 1
                self._hard_state_changed()
                self._send(leader, AppendReply(self.term, self.id, False, 0))
                self._become(RoleEvent.RIVAL_ACTIVE, f"{leader} was also active in term {term}: standing again")
                self.leader = None
                self._election_at = self._now  # its log is the more recent: the next tick stands
                self._sanctioned = True  # (its term is raised already: no pre-vote)
                return False
            self._become(RoleEvent.RIVAL_ACTIVE, f"{leader} is also active in term {term}")
        if self.role is Role.CANDIDATE:
            self._become(RoleEvent.ACTIVE_SEEN, f"{leader} is active in term {term}")
        self.leader = leader
        self._active_seen = self._now
        self._election_at = self._now + self._timeout()
        self._pre_votes = None
        self._sanctioned = False
        return True

    def _fence_weak_active(self, term: int, leader: str) -> None:
        """An active elected under a weak override would overwrite entries a majority wrote:
        refuse, and depose it with a higher term; an election among the majority follows."""
        self.term = term + 1
        self.voted_for = None
        self.leader = None
        self._hard_state_changed()
        self._election_at = self._now
        self._sanctioned = True  # (its term is raised already: no pre-vote)
        self._send(leader, AppendReply(self.term, self.id, False, 0))


#: message type -> the handler :meth:`Replica.step` gives it to
_HANDLERS: dict[type[Message], Callable[[Replica, Any], None]] = {
    RequestVote: Replica._on_vote,
    VoteReply: Replica._on_vote_reply,
    AppendEntries: Replica._on_append,
    AppendReply: Replica._on_append_reply,
    InstallSnapshot: Replica._on_snapshot,
    TimeoutNow: Replica._on_timeout_now,
    Alive: Replica._on_alive,
}
