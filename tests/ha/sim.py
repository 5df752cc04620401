"""A deterministic simulated cluster for the partition replication core.

Simulated clock, network (delay, loss, reordering, partitions) and crashes, all
driven by one seeded ``random.Random``: a failing seed replays exactly.
Persistence is synchronous: what a replica had when it crashed (log, term,
vote, commit index, applied state) is what it restarts with.  The log is
compacted at random points, so replicas that fall behind catch up from
snapshots of the applied state.  With ``alive`` > 0 followers also send their
active ``Alive`` at random (as replicas whose replies wait for a slow disk do),
over the same lossy network.
"""

from __future__ import annotations

import heapq
import itertools
import random
from dataclasses import dataclass, field

from ha.members import Members
from ha.messages import Alive, EntriesDiscarded, Entry, Envelope, InstallSnapshot, Ready, ReplicaWentBack
from ha.replica import Replica, ReplicaConfig, Role


@dataclass
class Stable:
    term: int = 0
    voted_for: str | None = None
    commit: int = 0
    log: list[Entry] = field(default_factory=list)  # entries after snap
    snap: tuple[int, int, str] = (0, 0, "")
    #: the applied state: every committed entry as (index, term, origin, data), no-ops included
    state: list[tuple[int, int, str, object]] = field(default_factory=list)
    #: the members as of the snapshot (Replica.snapshot_members), kept with the state; None: the cluster's first
    members: Members | None = None
    #: the snapshot's weak mark and recency (Replica.snapshot_mark), kept with it as the store does
    snap_mark: tuple[bool, tuple[int, int]] = (False, (0, 0))

    def last(self) -> int:
        return self.log[-1].index if self.log else self.snap[0]


class SafetyViolation(AssertionError):
    pass


class Cluster:
    def __init__(self, seed: int, voters: tuple[str, ...], *, learners: tuple[str, ...] = (),
                 priorities: dict[str, int] | None = None, loss: float = 0.05, max_delay: float = 0.05,
                 quorum_override: int | None = None, designated_primary: str | None = None,
                 compaction: float = 0.0, preferred: str | None = None, failback_after: float = 0.0,
                 alive: float = 0.0, witnesses: tuple[str, ...] = (), drained: frozenset[str] = frozenset()) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 0.0
        self.voters, self.learners = voters, learners
        self.priorities = priorities or {}
        self.loss, self.max_delay = loss, max_delay
        self.compaction = compaction  # chance per node and step of compacting the log
        self.snapshots = 0
        self.quorum_override, self.designated_primary = quorum_override, designated_primary
        self.preferred = preferred  # the placement's first node (ReplicaConfig.preferred)
        self.failback_after = failback_after
        self.alive = alive  # chance per follower and step of an Alive to its active
        self.witnesses = witnesses  # voters without data (ReplicaConfig.witnesses)
        self.drained = drained  # members drained for maintenance (ReplicaConfig.drained)
        self.stable = {n: Stable() for n in voters + learners}
        self.nodes: dict[str, Replica | None] = {}
        self.net: list[tuple[float, int, Envelope]] = []
        self._seq = itertools.count()
        self.cut: set[frozenset[str]] = set()
        self.leaders: dict[int, str] = {}  # term -> the one active of that term
        self.confirmed: dict[int, tuple[Entry, int]] = {}  # index -> (entry, term of the active that confirmed it)
        #: node -> (its core, the term it is active in, how many of ``confirmed`` it was found to
        #: hold): an active's entries change only by a truncation, a snapshot, a rollback or a
        #: compaction, each of which forgets the node here, so :meth:`check` looks again at
        #: everything only after one of those, and otherwise at the newly confirmed entries
        self._held: dict[str, tuple[Replica, int, int]] = {}
        self.discarded = 0  # HA-1014 entries
        self.discarded_committed = 0  # of those, confirmed by the node that lost them
        self.compacted_discards = 0  # HA-1014 reports that reached into a node's compacted log
        self.writes = 0
        self.went_back: list[ReplicaWentBack] = []  # an active's word that a replica lost acknowledged entries
        #: check the safety rules; off only for scripted runs of a weak override, which
        #: gives them up by design (what it costs is what HA-1014 reports)
        self.strict = True
        for n in self.stable:
            self.start(n)

    def config(self, n: str) -> ReplicaConfig:
        m = self.stable[n].members if n in self.stable else None
        voters, learners = (m.voters, m.learners) if m is not None else (self.voters, self.learners)
        return ReplicaConfig(node=n, voters=voters, learners=learners, priorities=self.priorities,
                             election_timeout=1.0, heartbeat_interval=0.2, max_append=8,
                             quorum_override=self.quorum_override, designated_primary=self.designated_primary,
                             preferred=self._preferred(), failback_after=self.failback_after,
                             witnesses=self.witnesses, drained=self.drained)

    def _preferred(self) -> str | None:
        """The placement's first node, or, drained, the first voter after it that is not
        (as broker.modes.replicated.partlog.replica_config chooses)."""
        if self.preferred is None or self.preferred not in self.drained:
            return self.preferred
        order = self.voters[self.voters.index(self.preferred):] + self.voters[:self.voters.index(self.preferred)]
        return next((n for n in order if n not in self.drained and n not in self.witnesses), self.preferred)

    def set_drained(self, drained: frozenset[str], only: tuple[str, ...] | None = None) -> None:
        """The group's drained set changes (a committed catalogue entry): every live node is
        reconfigured at once, as the driver does (``only``: just these, the others later)."""
        self.drained = drained
        for n, r in self.nodes.items():
            if r is not None and (only is None or n in only):
                self.handle(n, r.reconfigure(self.config(n)))

    def start(self, n: str) -> None:
        st = self.stable[n]
        self.nodes[n] = Replica(self.config(n), rng=random.Random(self.rng.random()), now=self.now,
                                term=st.term, voted_for=st.voted_for, log=list(st.log), commit=st.commit,
                                snapshot=st.snap, applied=None if n in self.witnesses else len(st.state),
                                snap_mark=st.snap_mark)

    def add_node(self, n: str, members: Members) -> None:
        """A node new to the partition, with an empty store and ``members`` (the change that
        adds it) as what it starts from: the active brings it the log, or a snapshot."""
        self.stable[n] = Stable(members=members)
        self.start(n)

    def start_over(self, n: str, ready: Ready) -> None:
        """What the driver does when the group's log differs from what ``n`` compacted: it
        counts the loss and starts the partition over empty (term and vote kept), recovering
        until an active has brought it up to that active's commit."""
        st = self.stable[n]
        for ev in ready.events:
            if isinstance(ev, EntriesDiscarded):
                self.discarded += ev.count
                self.discarded_committed += ev.committed
                self.compacted_discards += ev.compacted
        self._held.pop(n, None)
        core = self.nodes[n]
        assert core is not None
        self.stable[n] = Stable(term=st.term, voted_for=st.voted_for, members=core.members)
        self.nodes[n] = Replica(self.config(n), rng=random.Random(self.rng.random()), now=self.now, term=st.term,
                                voted_for=st.voted_for, recovering=True)

    def crash(self, n: str) -> None:
        self.nodes[n] = None

    def handle(self, n: str, ready: Ready) -> None:
        st = self.stable[n]
        if any(isinstance(ev, EntriesDiscarded) and ev.compacted for ev in ready.events):
            self.start_over(n, ready)
            return
        if (ready.truncate_from is not None or ready.snapshot is not None
                or any(isinstance(ev, EntriesDiscarded) for ev in ready.events)):
            self._held.pop(n, None)
        if ready.hard_state is not None:
            st.term, st.voted_for, st.commit = (ready.hard_state.term, ready.hard_state.voted_for,
                                                ready.hard_state.commit)
        if ready.truncate_from is not None:
            st.log = [e for e in st.log if e.index < ready.truncate_from]
        for ev in ready.events:
            if isinstance(ev, EntriesDiscarded) and ev.committed:
                del st.state[ev.first_index - 1:]  # the driver rolls back what it applied of them
        if ready.snapshot is not None:
            m = ready.snapshot
            st.snap = (m.index, m.last_term, m.last_origin)
            core = self.nodes[n]
            st.snap_mark = core.snapshot_mark() if core is not None else (m.weak, (0, 0))
            if m.members is not None:
                st.members = m.members
            st.log = [e for e in st.log if e.index > m.index]
            if n in self.witnesses:
                if m.data != b"":
                    raise SafetyViolation(f"seed {self.seed}: witness {n} was sent a snapshot with data")
            else:
                st.state = list(m.data)
            self.snapshots += 1
        for e in ready.append:
            if e.index != st.last() + 1:
                raise SafetyViolation(f"seed {self.seed}: {n} appends index {e.index} after {st.last()}")
            if n in self.witnesses and e.data is not None:
                raise SafetyViolation(f"seed {self.seed}: witness {n} was sent an entry's data")
            st.log.append(e)
        for e in ready.committed if n not in self.witnesses else ():
            if e.index != len(st.state) + 1:
                raise SafetyViolation(f"seed {self.seed}: {n} applies index {e.index} after {len(st.state)}")
            st.state.append((e.index, e.term, e.origin, e.data))
        for ev in ready.events:
            if isinstance(ev, EntriesDiscarded):
                self.discarded += ev.count
                self.discarded_committed += ev.committed
            elif isinstance(ev, ReplicaWentBack):
                self.went_back.append(ev)
        for env in ready.messages:
            if isinstance(env.msg, InstallSnapshot) and env.msg.data is None:
                i, t, o, _d = st.state[-1] if st.state else (0, 0, "", None)
                me = self.nodes[n]
                env = Envelope(env.src, env.dst, InstallSnapshot(env.msg.term, env.msg.leader, i, t, o,
                                                                 tuple(st.state),
                                                                 me.members_at(i) if me is not None else None,
                                                                 env.msg.weak))
            self.post(env)
        r = self.nodes[n]
        if r is not None and r.role is Role.LEADER:
            for e in ready.committed:
                if e.data is not None and e.index not in self.confirmed:
                    self.confirmed[e.index] = (e, r.term)
        if r is not None and ready.append:
            self.handle(n, r.persisted(ready.append[-1]))  # the write is durable: tell the core

    def post(self, env: Envelope) -> None:
        """Put a message on the network: lost, cut off, or delivered after a random delay."""
        if self.rng.random() < self.loss or frozenset((env.src, env.dst)) in self.cut:
            return
        heapq.heappush(self.net, (self.now + self.rng.random() * self.max_delay, next(self._seq), env))

    def step(self, dt: float = 0.01) -> None:
        """Advance time by ``dt``: deliver what is due, tick every live node, maybe act."""
        self.now += dt
        while self.net and self.net[0][0] <= self.now:
            _t, _s, env = heapq.heappop(self.net)
            r = self.nodes.get(env.dst)
            if r is not None and frozenset((env.src, env.dst)) not in self.cut:
                self.handle(env.dst, r.step(env))
        for n, r in self.nodes.items():
            if r is not None:
                self.handle(n, r.tick(self.now))
                if self.compaction and self.rng.random() < self.compaction:
                    self.compact(n, r)
                if (self.alive and r.role is Role.FOLLOWER and r.leader not in (None, n)
                        and self.rng.random() < self.alive):
                    self.post(Envelope(n, r.leader, Alive(r.term, n)))
        self.check()

    def compact(self, n: str, r: Replica, upto: int | None = None) -> None:
        """Compact ``n``'s log to ``upto`` (default: a little short of what it applied), as the
        driver does, the stable state with it."""
        self._held.pop(n, None)
        st = self.stable[n]
        if upto is None:
            upto = r.applied - self.rng.randint(0, 3)
        r.compact(upto)
        st.snap = (r.snap_index, r.snap_term, r.snap_origin)
        st.snap_mark = r.snapshot_mark()
        st.members = r.snapshot_members
        st.log = [e for e in st.log if e.index > r.snap_index]

    def write(self) -> None:
        for n, r in self.nodes.items():
            if r is not None and r.role is Role.LEADER:
                self.writes += 1
                ready, _entry = r.propose(f"w{self.writes}")
                self.handle(n, ready)

    def leader(self) -> str | None:
        live = [n for n, r in self.nodes.items() if r is not None and r.role is Role.LEADER]
        return max(live, key=lambda n: self.nodes[n].term) if live else None  # type: ignore[union-attr]

    def check(self) -> None:
        if not self.strict:
            return
        for n, r in self.nodes.items():
            if r is None:
                continue
            if r.role is Role.LEADER:
                if n in self.witnesses:
                    raise SafetyViolation(f"seed {self.seed}: witness {n} became active in term {r.term}")
                if self.leaders.setdefault(r.term, n) != n:
                    raise SafetyViolation(f"seed {self.seed}: two actives in term {r.term}: "
                                          f"{self.leaders[r.term]} and {n}")
                state = self.stable[n].state
                held = self._held.get(n)
                start = held[2] if held is not None and held[0] is r and held[1] == r.term else 0
                for idx, (e, when) in itertools.islice(self.confirmed.items(), start, None):
                    # every active of a term after the one that confirmed it must have it
                    if when >= r.term:
                        continue
                    if idx <= r.snap_index:
                        have = state[idx - 1] == (e.index, e.term, e.origin, e.data)
                    else:
                        have = idx <= r.last_index and r.entry(idx) == e
                    if not have:
                        raise SafetyViolation(f"seed {self.seed}: active {n} (term {r.term}) lacks confirmed "
                                              f"entry {e}")
                self._held[n] = (r, r.term, len(self.confirmed))
            if r.commit > r.last_index:
                raise SafetyViolation(f"seed {self.seed}: {n} commits past its log")
        # applied states are prefixes of one history: of the longest
        states = [self.stable[n].state for n, r in self.nodes.items() if r is not None and n not in self.witnesses]
        if states:
            longest = max(states, key=len)
            for a in states:
                if a is not longest and a != longest[:len(a)]:
                    raise SafetyViolation(f"seed {self.seed}: applied states disagree")
