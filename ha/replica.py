"""The election and replication core of one partition on one node.  Sans-IO.

Raft's safety rules with Qpid's preferences (DESIGN.md, "Replicated mode"):

* voters are the partition's sync members; async members are *learners*: fed
  the log, never vote, never stand;
* a vote goes only to a candidate whose log is at least as recent (last term,
  then last index); a voter whose log is as recent and whose ``priority`` is
  higher refuses and stands itself; priority 0 never stands;
* a candidate needs a majority of voters, or ``quorum_override`` votes, or in a
  two-voter group only its own if it is the ``designated_primary``;
* the active commits an entry of its own term once that many voters (itself
  included) have it; a new active first appends a no-op so earlier terms commit;
* an active that has not heard from enough voters for ``election_timeout``
  steps down (a cut-off active stops taking writes); a replica's :class:`Alive`
  counts as word from it (its replies may wait for a slow disk; it is not cut off);
* a replica that finds entries of a deposed term beyond the active's log
  truncates them and reports ``HA-1014`` with the count.

The driver calls :meth:`Replica.tick` with the time, :meth:`Replica.step` with
each message, and :meth:`Replica.propose` for client writes on the active;
each returns a :class:`~ha.messages.Ready` saying what to persist, send, apply.
Time is whatever the driver passes in; randomness comes from the ``rng`` given.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ha.messages import (
    Alive,
    AppendEntries,
    AppendReply,
    EntriesDiscarded,
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
from ha.errors import IllegalTransition


FAILBACK_MEMORY = 600.0  # seconds a hand-over to a node counts toward its next wait (_maybe_hand_back)


class Role(Enum):
    __hash__ = object.__hash__  # members are singletons: identity, in C (Enum's own hashes the name in Python, per lookup)
    FOLLOWER = "follower"  # a sync replica
    CANDIDATE = "candidate"
    LEADER = "active"
    LEARNER = "learner"  # an async replica


# (role, event) -> role.  Every role change goes through this table.
TRANSITIONS: dict[tuple[Role, str], Role] = {
    (Role.FOLLOWER, "election_timeout"): Role.CANDIDATE,
    (Role.CANDIDATE, "election_timeout"): Role.CANDIDATE,
    (Role.CANDIDATE, "won"): Role.LEADER,
    (Role.FOLLOWER, "higher_term"): Role.FOLLOWER,
    (Role.CANDIDATE, "higher_term"): Role.FOLLOWER,
    (Role.LEADER, "higher_term"): Role.FOLLOWER,
    (Role.CANDIDATE, "active_seen"): Role.FOLLOWER,
    (Role.LEADER, "lost_quorum"): Role.FOLLOWER,
    (Role.LEADER, "rival_active"): Role.FOLLOWER,  # only under a weak override, see _on_append
    (Role.LEARNER, "higher_term"): Role.LEARNER,
}


@dataclass(frozen=True, kw_only=True)
class ReplicaConfig:
    node: str
    voters: tuple[str, ...]
    learners: tuple[str, ...] = ()
    priorities: dict[str, int] = field(default_factory=dict)  # 0 never stands; default 1
    election_timeout: float = 1.0  # non_response_timeout
    heartbeat_interval: float = 0.25  # keepalive_interval
    quorum_override: int | None = None
    designated_primary: str | None = None
    max_append: int = 512  # entries per AppendEntries
    max_append_bytes: int = 0  # and at most this much entry data in one (0: no limit); one entry always goes
    #: the placement's first node: among voters of equal priority it is preferred, so
    #: that actives spread over the group as placement intends
    preferred: str | None = None
    #: failback: the active hands the partition to ``preferred`` once that node has answered
    #: without a gap for this long (0: never); see ``_maybe_hand_back``
    failback_after: float = 0.0

    def __post_init__(self) -> None:
        if self.node not in self.voters and self.node not in self.learners:
            raise ValueError(f"node {self.node!r} is neither a voter nor a learner")
        if set(self.voters) & set(self.learners):
            raise ValueError("a node cannot be both voter and learner")
        if self.quorum_override is not None and not 1 <= self.quorum_override <= len(self.voters):
            raise ValueError(f"quorum_override must be 1..{len(self.voters)}")
        if self.designated_primary is not None and self.designated_primary not in self.voters:
            raise ValueError("designated_primary must be one of the voters")
        if any(not 0 <= p <= 3 for p in self.priorities.values()):
            raise ValueError("priorities are 0..3")
        if self.failback_after < 0:
            raise ValueError("failback_after >= 0")
        if self.max_append < 1 or not 0 < self.heartbeat_interval < self.election_timeout:
            raise ValueError("max_append >= 1 and 0 < heartbeat_interval < election_timeout")

    def priority(self, node: str) -> int:
        return self.priorities.get(node, 1)

    def rank(self, node: str) -> int:
        """Priority, then placement preference: what elections prefer (0 never stands)."""
        p = self.priority(node)
        return 2 * p + (1 if p and node == self.preferred else 0)

    def quorum(self) -> int:
        """Voters (self included) needed to elect or to commit."""
        if self.designated_primary is not None and len(self.voters) == 2 and self.designated_primary == self.node:
            return 1
        if self.quorum_override is not None:
            return self.quorum_override
        return len(self.voters) // 2 + 1


class Replica:
    def __init__(self, config: ReplicaConfig, *, rng: random.Random, now: float = 0.0,
                 term: int = 0, voted_for: str | None = None, log: list[Entry] | None = None,
                 commit: int = 0, snapshot: tuple[int, int, str] = (0, 0, ""), applied: int | None = None,
                 recovering: bool = False) -> None:
        """``snapshot`` is (index, term, origin) of the last entry compacted away (its effect
        is in the driver's applied state); ``log`` the entries after it.  ``applied`` is
        how far the driver's state goes (default: ``commit``); committed entries after it
        come out of the first Ready to be applied again."""
        self.cfg = config
        self.id = config.node
        self.rng = rng
        self.term = term
        self.voted_for = voted_for
        self.snap_index, self.snap_term, self.snap_origin = snapshot
        self.log: list[Entry] = list(log or [])  # log[i] has index snap_index + i + 1
        if self.log and self.log[0].index != self.snap_index + 1:
            raise ValueError(f"log starts at {self.log[0].index}, snapshot ends at {self.snap_index}")
        # What was confirmed before a restart counts as committed.
        self.commit = max(self.snap_index, min(commit, self.last_index))
        self.applied = self.commit if applied is None else max(self.snap_index, min(applied, self.commit))
        self._persisted = self.last_index  # what the driver has on disk (see persisted())
        #: rebuilt empty after losing state (HA-1014 of confirmed entries): neither votes nor
        #: stands until an active has brought it up to that active's commit index
        self.recovering = recovering
        self._snapshot_sent: dict[str, float] = {}
        self.role = Role.LEARNER if config.node in config.learners else Role.FOLLOWER
        self.leader: str | None = None
        self._votes: set[str] = set()
        self._next: dict[str, int] = {}
        self._match: dict[str, int] = {}
        self._heard: dict[str, float] = {}  # replies in this term (a grace period at election)
        self._acked: dict[str, float] = {}  # last successful append reply in this term
        self._live_since: dict[str, float] = {}  # answering without a gap since (failback)
        self._handing_to: str | None = None  # failback under way: no writes until _handing_until
        self._handing_until = 0.0
        self._handing_sent = False
        self._timeout_now_at = -1e18  # when it last told a node to stand (_observe_term)
        self._handed: dict[str, float] = {}  # when the active last asked a node to take over
        self._handovers: dict[str, list[float]] = {}  # when it did, within FAILBACK_MEMORY
        # Until then this node does not press its priority (no refusals, ordinary timeouts):
        # set after a refusal and after a lost election, so a preference never blocks progress.
        self._deferring_until = -1.0
        self._stand_early_after = -1.0  # see _on_vote: a less recent candidate asked us
        self._active_seen = -1e18  # the last message this node took from an active (_follow)
        self._now = now
        self._election_at = now + self._timeout()
        if config.preferred is not None and config.preferred != self.id:
            # the first election of a new partition: let the placement's choice stand first
            self._election_at += config.election_timeout / 2
        elif (config.preferred == self.id and term == 0 and not self.log and self.snap_index == 0 and not recovering
              and config.quorum() > 1):
            # A partition that never had an active (a new queue's): there is none to wait
            # for, so the placement's choice stands within a heartbeat or two.  Its head
            # start over the others (1.5-2 timeouts) then outlasts the time the members take
            # to learn of the queue (up to a heartbeat each); with the head start alone it
            # did not, and a new queue's actives came out unevenly spread (docs/replication.md).
            # Not where one vote elects (an override, a designated primary): a node that lost
            # its store, or was down when the queue was made, looks new too, and must first
            # hear of the active it does not know (found in review).
            self._election_at = now + config.heartbeat_interval * (1.0 + self.rng.random())
        self._heartbeat_at = now
        self._ready = Ready()

    @property
    def handing_over(self) -> bool:
        """Failback under way: this active takes no writes until it has handed over or given
        up (the driver keeps what clients send meanwhile, rather than fail it)."""
        return self.role is Role.LEADER and self._handing_to is not None

    @property
    def wake_at(self) -> float:
        """When ``tick`` next has something to do (a heartbeat, or an election): a driver
        that ticks then, not on its next round, keeps two rivals' random timers apart."""
        if self.role is Role.LEADER:
            return self._heartbeat_at
        return float("inf") if self.role is Role.LEARNER else self._election_at

    # -- helpers --------------------------------------------------------------------------

    def live_match(self) -> int | None:
        """On the active: the lowest last index on the other members (learners included)
        that acknowledged an append within the election timeout; None if there is none.
        Compaction keeps what they still need (they are catching up, not gone)."""
        if self.role is not Role.LEADER:
            return None
        live = [self._match.get(n, 0) for n, t in self._acked.items()
                if n != self.id and self._now - t <= self.cfg.election_timeout]
        return min(live) if live else None

    def progress(self) -> dict[str, int]:
        """On the active: the last index known to be on each other member."""
        return dict(self._match) if self.role is Role.LEADER else {}

    @property
    def now(self) -> float:
        """The time of the last tick."""
        return self._now

    @property
    def last_index(self) -> int:
        return self.snap_index + len(self.log)

    def entry(self, index: int) -> Entry:
        return self.log[index - self.snap_index - 1]

    def entries(self, first: int, last: int) -> list[Entry]:
        """Entries first..last (inclusive) still in the log."""
        lo = max(first, self.snap_index + 1) - self.snap_index - 1
        return self.log[lo:max(lo, last - self.snap_index)]

    def _term_at(self, index: int) -> int:
        if index == self.snap_index:
            return self.snap_term
        return self.entry(index).term if self.snap_index < index <= self.last_index else 0

    @property
    def last_term(self) -> int:
        return self._term_at(self.last_index)

    def _recency(self) -> tuple[int, int]:
        """(term, index) of the last entry written under a real quorum: what elections compare."""
        for e in reversed(self.log):
            if not e.weak:
                return e.term, e.index
        return self.snap_term, self.snap_index  # compacted entries were committed

    def _origin_at(self, index: int) -> str:
        if index == self.snap_index:
            return self.snap_origin
        return self.entry(index).origin if self.snap_index < index <= self.last_index else ""

    def _weak_active(self) -> bool:
        """This active's writes are not backed by a majority: it needs fewer votes than a
        majority (override, designated primary) *and* has not heard from a majority of
        voters within the election timeout.  With its peers connected, an override
        active writes strong entries like any other."""
        majority = len(self.cfg.voters) // 2 + 1
        if self.cfg.quorum() >= majority:
            return False
        acked = 1 + sum(1 for v in self.cfg.voters if v != self.id
                        and self._now - self._acked.get(v, -1e18) < self.cfg.election_timeout)
        return acked < majority

    def _new_entry(self, data: Any) -> Entry:
        return Entry(self.term, self.last_index + 1, data, self.id, self._weak_active())

    def _peers(self) -> list[str]:
        return [n for n in self.cfg.voters + self.cfg.learners if n != self.id]

    def _timeout(self) -> float:
        # Higher priority -> shorter waits, so the preferred node usually stands first; a node
        # that just failed to win waits like everyone else, so it cannot starve the others.
        spread = 0.5 if self._now < self._deferring_until else 0.5 * (8 - min(7, max(2, self.cfg.rank(self.id)))) / 6
        return self.cfg.election_timeout * (1.0 + self.rng.random() * spread)

    def _send(self, dst: str, msg: Message) -> None:
        self._ready.messages.append(Envelope(self.id, dst, msg))

    def _hard_state_changed(self) -> None:
        self._ready.hard_state = HardState(self.term, self.voted_for, self.commit)

    def _become(self, event: str, reason: str) -> None:
        new = TRANSITIONS.get((self.role, event))
        if new is None:
            raise IllegalTransition(f"{self.role.name} cannot take {event!r}")
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
            handing = self.role is Role.LEADER and self._now - self._timeout_now_at < 2 * self.cfg.election_timeout
            self.term = term
            self.voted_for = None
            self._hard_state_changed()
            if self.role is not Role.FOLLOWER or leader is None:
                self._become("higher_term", f"saw term {term}")
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
                if self._handing_to is not None and now >= self._handing_until:
                    self._handing_to = None  # it did not take over: carry on taking writes
                elif self._handing_to is None and self.cfg.failback_after:
                    self._maybe_hand_back(now)
        elif self.role is not Role.LEARNER and now >= self._election_at:
            self._campaign()
        return self._take_ready()

    def propose(self, data: Any) -> tuple[Ready, Entry | None]:
        """Append a client write (on the active only); the entry, or None if not active
        (or handing the partition over: the client tries again, and finds the new active)."""
        if self.role is not Role.LEADER or self._handing_to is not None:
            return self._take_ready(), None
        entry = self._new_entry(data)
        self.log.append(entry)
        self._ready.append.append(entry)
        for p in self._peers():
            self._send_append(p)
        return self._take_ready(), entry

    def persisted(self, entry: Entry) -> Ready:
        """The driver's log write up to ``entry`` is durable.  The active counts itself
        toward a commit only for entries it has on disk."""
        i = entry.index
        if self.snap_index < i <= self.last_index and self.entry(i).term == entry.term \
                and self.entry(i).origin == entry.origin and i > self._persisted:
            self._persisted = i
            if self.role is Role.LEADER:
                self._advance_commit()
        return self._take_ready()

    def compact(self, upto: int) -> None:
        """Forget entries up to ``upto`` (at most what is applied): the driver's state has
        them.  A replica that needs them later gets a snapshot instead."""
        upto = min(upto, self.applied)
        if upto <= self.snap_index:
            return
        last = self.entry(upto)
        del self.log[:upto - self.snap_index]
        self.snap_index, self.snap_term, self.snap_origin = upto, last.term, last.origin

    def reconfigure(self, config: ReplicaConfig) -> Ready:
        """New priorities, ``quorum_override`` or ``designated_primary``: effective at once."""
        if config.node != self.id or config.voters != self.cfg.voters or config.learners != self.cfg.learners:
            raise ValueError("reconfigure changes settings, not members")
        self.cfg = config
        if self.role is Role.LEADER:
            self._advance_commit()
        return self._take_ready()

    def step(self, env: Envelope) -> Ready:
        msg = env.msg
        if isinstance(msg, RequestVote):
            self._on_vote(msg)
        elif isinstance(msg, VoteReply):
            self._on_vote_reply(msg)
        elif isinstance(msg, AppendEntries):
            self._on_append(msg)
        elif isinstance(msg, AppendReply):
            self._on_append_reply(msg)
        elif isinstance(msg, InstallSnapshot):
            self._on_snapshot(msg)
        elif isinstance(msg, TimeoutNow):
            self._on_timeout_now(msg)
        elif isinstance(msg, Alive):
            self._on_alive(msg)
        return self._take_ready()

    # -- elections ------------------------------------------------------------------------------

    def _campaign(self, reason: str = "no word from an active") -> None:
        first_bid = self.role is not Role.CANDIDATE
        if self.role is Role.CANDIDATE:
            # Our last bid failed: stop pressing our priority for a while (see _on_vote).
            self._deferring_until = self._now + 4 * self.cfg.election_timeout
        self._election_at = self._now + self._timeout()
        if self.cfg.priority(self.id) == 0 or self.id not in self.cfg.voters or self.recovering:
            return
        self._become("election_timeout", reason)
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
        last_term, last_index = self._recency()
        for v in self.cfg.voters:
            if v != self.id:
                self._send(v, RequestVote(self.term, self.id, last_index, last_term, self.cfg.rank(self.id)))

    def _on_vote(self, m: RequestVote) -> None:
        if m.term > self.term:
            self._observe_term(m.term)
        granted = False
        if (m.term == self.term and self.voted_for in (None, m.candidate) and self.id in self.cfg.voters
                and not self.recovering):
            ours = self._recency()
            theirs = (m.last_term, m.last_index)
            mine = self.cfg.rank(self.id)  # m.priority is the candidate's rank
            preferred = mine > m.priority and self._now >= self._deferring_until
            if theirs > ours or (theirs == ours and (not preferred or self.voted_for == m.candidate)):
                granted = True
                self.voted_for = m.candidate
                self._hard_state_changed()
                self._election_at = self._now + self._timeout()
            elif theirs == ours and mine > m.priority and self.role is Role.FOLLOWER:
                # As recent and preferred: refuse and stand at the next tick.  Only once per
                # two election timeouts: if this node cannot win (it may reach too few voters),
                # the next candidate gets its vote, so a preference never blocks an election.
                self._election_at = self._now
                self._deferring_until = self._now + 2 * self.cfg.election_timeout
            elif (theirs < ours and self.cfg.priority(self.id) > 0 and self._now >= self._stand_early_after
                  and self._now - self._active_seen >= self.cfg.election_timeout - self.cfg.heartbeat_interval):
                # The candidate's log is behind ours: it cannot win with our vote, and its bid
                # says the active is gone.  We can win with its vote, so stand now rather than
                # wait out our own timer (with a little jitter, in case a peer as recent as we
                # are heard the same bid).  Once per two election timeouts, as above.  Not while
                # an active was heard within a heartbeat of a timeout: then the bid says only
                # that the candidate cannot hear (a one-way cut), the deposed active stands
                # again by itself, and a second early candidate would split the vote with it.
                self._election_at = min(self._election_at,
                                        self._now + self.cfg.election_timeout * 0.05 * self.rng.random())
                self._stand_early_after = self._now + 2 * self.cfg.election_timeout
        self._send(m.candidate, VoteReply(self.term, self.id, granted))

    def _on_vote_reply(self, m: VoteReply) -> None:
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
        """On the active: hand the partition to the placement's choice once it is back and
        has answered without a gap for ``failback_after``: stop taking writes, bring it up to
        the last entry, then tell it to stand (Raft's leadership transfer).  Once each time it
        comes back; never under an override, a designated primary or a weak active.  The node
        takes over only if elections prefer it anyway (a higher rank than this one's, which
        the message carries: an active knows only its own priority); if it declines, writes
        resume after an election timeout."""
        to = self.cfg.preferred
        if (to is None or to == self.id or to not in self.cfg.voters or self._weak_active()
                or self.cfg.quorum_override is not None or self.cfg.designated_primary is not None):
            return  # (an operator's override or primary decides who may go on: not moved under it)
        since = self._live_since.get(to)
        if since is None or now - since < self.cfg.failback_after:
            return
        # A node that keeps leaving waits twice as long each time it was handed over in the
        # last ten minutes (at most 64 times): a flaky node does not drag the partition along.
        recent = [t for t in self._handovers.get(to, ()) if now - t < FAILBACK_MEMORY]
        self._handovers[to] = recent
        wait = self.cfg.failback_after * 2 ** min(6, len(recent))
        if (now - since < wait
                or self._handed.get(to, -1e18) >= since  # once each time it comes back: it may decline
                or now - self._acked.get(to, -1e18) > 2 * self.cfg.heartbeat_interval
                or self._match.get(to, 0) < self.last_index - self.cfg.max_append):
            return
        # No writes from here; the node is sent what it lacks, then told to stand.
        self._handing_to = to
        self._handing_until = now + self.cfg.election_timeout  # to catch up, then again to take over
        self._handing_sent = False
        self._handed[to] = now
        self._handovers[to].append(now)
        self._ready.events.append(HandingOver(self.id, self.term, to))
        self._hand_over_if_caught_up()

    def _hand_over_if_caught_up(self) -> None:
        to = self._handing_to
        if to is not None and not self._handing_sent and self._match.get(to, 0) == self.last_index:
            self._handing_sent = True
            self._timeout_now_at = self._now
            self._handing_until = self._now + self.cfg.election_timeout
            self._send(to, TimeoutNow(self.term, self.id, self.cfg.rank(self.id)))

    def _on_timeout_now(self, m: TimeoutNow) -> None:
        """The active hands this node the partition: stand at once (the vote rules still
        decide; the active takes no writes meanwhile, so this log is as recent as its)."""
        if (m.term != self.term or m.leader != self.leader or self.role is not Role.FOLLOWER
                or self.cfg.priority(self.id) == 0 or self.recovering or self.cfg.rank(self.id) <= m.rank):
            return  # (the active takes writes again after an election timeout)
        self._campaign(f"{m.leader} handed over (failback)")

    def _win(self) -> None:
        self._become("won", f"{len(self._votes)} vote(s) in term {self.term}")
        self.leader = self.id
        self._next = {p: self.last_index + 1 for p in self._peers()}
        self._match = {p: 0 for p in self._peers()}
        self._heard = {p: self._now for p in self._peers()}
        self._acked = {}
        self._live_since = {}
        self._handing_to = None
        self._snapshot_sent = {}
        noop = self._new_entry(None)
        self.log.append(noop)
        self._ready.append.append(noop)
        self._heartbeat_at = self._now + self.cfg.heartbeat_interval
        for p in self._peers():
            self._send_append(p)
        self._advance_commit()

    def _check_quorum(self, now: float) -> None:
        heard = 1 + sum(1 for v in self.cfg.voters
                        if v != self.id and now - self._heard.get(v, -1e18) < self.cfg.election_timeout)
        if heard < self.cfg.quorum():
            self._become("lost_quorum", f"heard from {heard} of {len(self.cfg.voters)} voters")
            self.leader = None
            self._election_at = now + self._timeout()

    # -- replication --------------------------------------------------------------------------------

    def _send_append(self, p: str) -> None:
        nxt = self._next.get(p, self.last_index + 1)
        if nxt <= self.snap_index:
            # The entries it needs are compacted: a snapshot (at most one per election
            # timeout in flight), and meanwhile a keep-alive it cannot match.
            if self._now - self._snapshot_sent.get(p, -1e18) >= self.cfg.election_timeout:
                self._snapshot_sent[p] = self._now
                self._send(p, InstallSnapshot(self.term, self.id))
            nxt = self.snap_index + 1
            entries: tuple[Entry, ...] = ()
        else:
            entries = tuple(self.entries(nxt, nxt + self.cfg.max_append - 1))
            cap = self.cfg.max_append_bytes
            if cap and len(entries) > 1:  # a replica catching up on big entries: frames stay bounded
                total = 0
                for k, e in enumerate(entries):
                    total += len(e.data) if e.data is not None else 0
                    if total > cap and k:
                        entries = entries[:k]
                        break
            if entries:
                # Pipelining: the next send starts after these.  A lost message shows up as
                # a mismatch on the next append, whose failure reply moves _next back.
                self._next[p] = entries[-1].index + 1
        prev = nxt - 1
        self._send(p, AppendEntries(self.term, self.id, prev, self._term_at(prev), self._origin_at(prev), entries,
                                    self.commit))

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
            # election gives this node that (its no-op).  Staying active in the raised term
            # left a new active whose no-op had not committed unable ever to serve.
            if (self._recency() + (self.id,)) > recency + (leader,) and not self._weak_active():
                self.term += 1
                self._hard_state_changed()
                self._send(leader, AppendReply(self.term, self.id, False, 0))
                self._become("rival_active", f"{leader} was also active in term {term}: standing again")
                self.leader = None
                self._election_at = self._now  # its log is the more recent: the next tick stands
                return False
            self._become("rival_active", f"{leader} is also active in term {term}")
        if self.role is Role.CANDIDATE:
            self._become("active_seen", f"{leader} is active in term {term}")
        self.leader = leader
        self._active_seen = self._now
        self._election_at = self._now + self._timeout()
        return True

    def _on_append(self, m: AppendEntries) -> None:
        # (prev_term, prev_index) is a lower bound of the sender's recency
        if not self._follow(m.term, m.leader, (m.prev_term, m.prev_index)):
            return
        if m.prev_index < self.snap_index:
            # It resends what we have compacted (committed, so identical): skip those.
            skip = self.snap_index - m.prev_index
            m = AppendEntries(m.term, m.leader, self.snap_index, self.snap_term, self.snap_origin,
                              m.entries[skip:], m.commit)
        if (m.prev_index > self.last_index or self._term_at(m.prev_index) != m.prev_term
                or self._origin_at(m.prev_index) != m.prev_origin):
            hint = min(self.last_index, m.prev_index - 1)
            self._send(m.leader, AppendReply(self.term, self.id, False, max(0, hint)))
            return
        for e in m.entries:
            if e.index <= self.last_index:
                mine = self.entry(e.index)
                if mine.term == e.term and mine.origin == e.origin:
                    continue
                if e.weak and not mine.weak:
                    self._fence_weak_active(m)
                    return
                self._truncate(e.index)
            self.log.append(e)
            self._ready.append.append(e)
        match = m.prev_index + len(m.entries)
        if self.recovering and match >= m.commit:
            self.recovering = False  # it has all the active had committed
        if m.commit > self.commit:
            self.commit = max(self.commit, min(m.commit, match))  # a late, shorter append never lowers it
        self._send(m.leader, AppendReply(self.term, self.id, True, match))

    def _on_snapshot(self, m: InstallSnapshot) -> None:
        if not self._follow(m.term, m.leader, (m.last_term, m.index)):
            return
        matches = (m.index <= self.last_index and self._term_at(m.index) == m.last_term
                   and self._origin_at(m.index) == m.last_origin) or m.index < self.snap_index
        if matches and m.index <= self.commit:
            self._send(m.leader, AppendReply(self.term, self.id, True, m.index))
            return  # we already have (and applied) all of it
        if matches:
            del self.log[:m.index - self.snap_index]  # keep what follows: it matches too
        else:
            # Entries after the snapshot's position cannot be the active's (log matching):
            # they are discarded.  (Uncommitted entries before it that differ are replaced
            # too, uncounted: this replica cannot tell them from the active's.)
            dropped = self.log[max(0, m.index - self.snap_index):]
            lost_committed = max(0, self.commit - m.index)
            if dropped:
                self._ready.events.append(EntriesDiscarded(self.id, self.term, dropped[0].index, len(dropped),
                                                           lost_committed, payloads=tuple(e.data for e in dropped)))
            self.log = []
            self._ready.truncate_from = self.snap_index + 1
            self._ready.append = []
            self._persisted = m.index
            self.commit = m.index
        self.snap_index, self.snap_term, self.snap_origin = m.index, m.last_term, m.last_origin
        self.commit = max(self.commit, m.index)
        self.applied = m.index
        self._persisted = max(self._persisted, m.index)
        self._ready.snapshot = m
        self.recovering = False
        self._ready.committed = [e for e in self._ready.committed if e.index > m.index]
        self._hard_state_changed()
        self._send(m.leader, AppendReply(self.term, self.id, True, m.index))

    def _fence_weak_active(self, m: AppendEntries) -> None:
        """An active elected under a weak override would overwrite entries a majority wrote:
        refuse, and depose it with a higher term; an election among the majority follows."""
        self.term = m.term + 1
        self.voted_for = None
        self.leader = None
        self._hard_state_changed()
        self._election_at = self._now
        self._send(m.leader, AppendReply(self.term, self.id, False, 0))

    def _truncate(self, index: int) -> None:
        """Drop entries from ``index`` on: the group never committed them (HA-1014).

        Entries this node counted as committed can only be among them if it was
        active under a weak override (``quorum_override``, ``designated_primary``)
        while cut off: those confirmed writes are lost, reported in
        ``committed``, and the driver must roll back what it applied.
        """
        count = self.last_index - index + 1
        payloads = tuple(e.data for e in self.log[index - self.snap_index - 1:])
        lost_committed = max(0, self.commit - index + 1)
        if lost_committed:
            self.commit = index - 1
            self.applied = min(self.applied, index - 1)
        del self.log[index - self.snap_index - 1:]
        self._persisted = min(self._persisted, index - 1)
        self._ready.truncate_from = index if self._ready.truncate_from is None else min(
            index, self._ready.truncate_from)
        self._ready.append = [e for e in self._ready.append if e.index < index]
        self._ready.events.append(EntriesDiscarded(self.id, self.term, index, count, lost_committed,
                                                   payloads=payloads))

    def _on_append_reply(self, m: AppendReply) -> None:
        if m.term > self.term:
            self._observe_term(m.term)
            return
        if self.role is not Role.LEADER or m.term != self.term:
            return
        self._heard[m.replica] = self._now
        if m.success:
            if self._now - self._acked.get(m.replica, -1e18) > self.cfg.election_timeout:
                self._live_since[m.replica] = self._now  # back (or new): failback counts from here
            self._acked[m.replica] = self._now
            if m.match_index > self._match.get(m.replica, 0):
                self._match[m.replica] = m.match_index
            self._next[m.replica] = max(self._next.get(m.replica, 1), m.match_index + 1)
            self._advance_commit()
            if m.replica == self._handing_to:
                self._hand_over_if_caught_up()
            if self._next[m.replica] <= self.last_index:
                self._send_append(m.replica)
        else:
            self._next[m.replica] = max(1, min(self._next.get(m.replica, 1) - 1, m.match_index + 1))
            self._send_append(m.replica)

    def _on_alive(self, m: Alive) -> None:
        """The replica is up, its replies held back by its disk: word from it for the
        check of quorum (_check_quorum), nothing more."""
        if m.term > self.term:
            self._observe_term(m.term)
            return
        if self.role is Role.LEADER and m.term == self.term:
            self._heard[m.replica] = self._now

    def _advance_commit(self) -> None:
        """The active's own write is part of every commit (a confirmed entry is on its disk,
        fsynced under SYNC), and with it a quorum of voters."""
        need = self.cfg.quorum()
        for n in range(min(self.last_index, self._persisted), self.commit, -1):
            if self._term_at(n) != self.term:
                break  # only entries of our own term commit by counting (Raft 5.4.2)
            have = sum(1 for v in self.cfg.voters if (self._persisted if v == self.id else self._match.get(v, 0)) >= n)
            if have >= need:
                self.commit = n
                break
