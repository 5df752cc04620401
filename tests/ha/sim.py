"""A deterministic simulated cluster for the partition replication core.

Simulated clock, network (delay, loss, reordering, partitions) and crashes, all
driven by one seeded ``random.Random``: a failing seed replays exactly.
Persistence is synchronous: what a replica had when it crashed (log, term,
vote) is what it restarts with; its commit index is volatile.
"""

from __future__ import annotations

import heapq
import itertools
import random
from dataclasses import dataclass, field

from ha.messages import EntriesDiscarded, Entry, Envelope, Ready
from ha.replica import Replica, ReplicaConfig, Role


@dataclass
class Stable:
    term: int = 0
    voted_for: str | None = None
    commit: int = 0
    log: list[Entry] = field(default_factory=list)


class SafetyViolation(AssertionError):
    pass


class Cluster:
    def __init__(self, seed: int, voters: tuple[str, ...], *, learners: tuple[str, ...] = (),
                 priorities: dict[str, int] | None = None, loss: float = 0.05, max_delay: float = 0.05,
                 quorum_override: int | None = None, designated_primary: str | None = None) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 0.0
        self.voters, self.learners = voters, learners
        self.priorities = priorities or {}
        self.loss, self.max_delay = loss, max_delay
        self.quorum_override, self.designated_primary = quorum_override, designated_primary
        self.stable = {n: Stable() for n in voters + learners}
        self.nodes: dict[str, Replica | None] = {}
        self.net: list[tuple[float, int, Envelope]] = []
        self._seq = itertools.count()
        self.cut: set[frozenset[str]] = set()
        self.leaders: dict[int, str] = {}  # term -> the one active of that term
        self.confirmed: dict[int, tuple[Entry, int]] = {}  # index -> (entry, term of the active that confirmed it)
        self.discarded = 0  # HA-1014 entries
        self.discarded_committed = 0  # of those, confirmed by the node that lost them
        self.writes = 0
        #: check the safety rules; off only for scripted runs of a weak override, which
        #: gives them up by design (what it costs is what HA-1014 reports)
        self.strict = True
        for n in self.stable:
            self.start(n)

    def config(self, n: str) -> ReplicaConfig:
        return ReplicaConfig(node=n, voters=self.voters, learners=self.learners, priorities=self.priorities,
                             election_timeout=1.0, heartbeat_interval=0.2, max_append=8,
                             quorum_override=self.quorum_override, designated_primary=self.designated_primary)

    def start(self, n: str) -> None:
        st = self.stable[n]
        self.nodes[n] = Replica(self.config(n), rng=random.Random(self.rng.random()), now=self.now,
                                term=st.term, voted_for=st.voted_for, log=list(st.log), commit=st.commit)

    def crash(self, n: str) -> None:
        self.nodes[n] = None

    def handle(self, n: str, ready: Ready) -> None:
        st = self.stable[n]
        if ready.hard_state is not None:
            st.term, st.voted_for, st.commit = (ready.hard_state.term, ready.hard_state.voted_for,
                                                ready.hard_state.commit)
        if ready.truncate_from is not None:
            del st.log[ready.truncate_from - 1:]
        for e in ready.append:
            if e.index != len(st.log) + 1:
                raise SafetyViolation(f"seed {self.seed}: {n} appends index {e.index} after {len(st.log)}")
            st.log.append(e)
        for ev in ready.events:
            if isinstance(ev, EntriesDiscarded):
                self.discarded += ev.count
                self.discarded_committed += ev.committed
        for env in ready.messages:
            if self.rng.random() < self.loss or frozenset((env.src, env.dst)) in self.cut:
                continue
            heapq.heappush(self.net, (self.now + self.rng.random() * self.max_delay, next(self._seq), env))
        r = self.nodes[n]
        if r is not None and r.role is Role.LEADER:
            for e in ready.committed:
                if e.data is not None and e.index not in self.confirmed:
                    self.confirmed[e.index] = (e, r.term)

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
        self.check()

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
                if self.leaders.setdefault(r.term, n) != n:
                    raise SafetyViolation(f"seed {self.seed}: two actives in term {r.term}: "
                                          f"{self.leaders[r.term]} and {n}")
                for idx, (e, when) in self.confirmed.items():
                    # every active of a term after the one that confirmed it must have it
                    if when < r.term and (idx > r.last_index or r.log[idx - 1] != e):
                        raise SafetyViolation(f"seed {self.seed}: active {n} (term {r.term}) lacks confirmed "
                                              f"entry {e}")
            if r.commit > r.last_index:
                raise SafetyViolation(f"seed {self.seed}: {n} commits past its log")
        committed = [(r.log[: r.commit]) for r in self.nodes.values() if r is not None]
        for a, b in itertools.combinations(committed, 2):
            k = min(len(a), len(b))
            if a[:k] != b[:k]:
                raise SafetyViolation(f"seed {self.seed}: committed prefixes disagree")
