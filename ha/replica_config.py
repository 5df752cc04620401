"""The settings of one partition's replica on one node (see :mod:`ha.replica`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ha.members import Members


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
    #: voters (self included) an entry needs to commit, when it differs from the election
    #: quorum: a LockFile holder is elected alone (the lock decides) but commits with its
    #: peer while the peer is in step (see broker.arbiters.lockfile)
    commit_quorum: int | None = None
    #: an arbiter outside the log (the LockFile) decides who may be active: a replica does
    #: not fence an active whose entries are weak (the lock holder's log wins; a stale holder
    #: is fenced by the lock's epoch instead)
    arbitrated: bool = False
    max_append: int = 512  # entries per AppendEntries
    max_append_bytes: int = 0  # and at most this much entry data in one (0: no limit); one entry always goes
    #: the placement's first node: among voters of equal priority it is preferred, so
    #: that actives spread over the group as placement intends
    preferred: str | None = None
    #: failback: the active hands the partition to ``preferred`` once that node has answered
    #: without a gap for this long (0: never); see :mod:`ha.failback`
    failback_after: float = 0.0
    #: voters that hold no data (a group's witness, ``tandem witness start``): they vote and
    #: acknowledge entry positions, never stand, and are sent entries without their data;
    #: an active counts a witness toward a commit only while no other data voter is in
    #: sync (see :meth:`ha.replica.Replica.witness_counts`)
    witnesses: tuple[str, ...] = ()
    #: members drained for maintenance (``tandem node drain``, the group's state): below
    #: every other node that can stand in elections, and an active among them hands its
    #: partition to a node that is not (:mod:`ha.failback`)
    drained: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if not self.voters:
            raise ValueError("a partition needs at least one voter")
        if set(self.voters) & set(self.learners):
            raise ValueError("a node cannot be both voter and learner")
        if self.quorum_override is not None and not 1 <= self.quorum_override <= len(self.voters):
            raise ValueError(f"quorum_override must be 1..{len(self.voters)}")
        if self.designated_primary is not None and self.designated_primary not in self.voters:
            raise ValueError("designated_primary must be one of the voters")
        if self.commit_quorum is not None and not 1 <= self.commit_quorum <= len(self.voters):
            raise ValueError(f"commit_quorum must be 1..{len(self.voters)}")
        if not set(self.witnesses) <= set(self.voters):
            raise ValueError("a witness must be one of the voters")
        if self.preferred is not None and self.preferred in self.witnesses:
            raise ValueError("a witness cannot be the preferred node (it holds no data)")
        if any(not 0 <= p <= 3 for p in self.priorities.values()):
            raise ValueError("priorities are 0..3")
        if self.failback_after < 0:
            raise ValueError("failback_after >= 0")
        if self.max_append < 1 or not 0 < self.heartbeat_interval < self.election_timeout:
            raise ValueError("max_append >= 1 and 0 < heartbeat_interval < election_timeout")

    def with_members(self, m: Members) -> ReplicaConfig:
        """These settings for the members ``m`` (a membership change, :mod:`ha.members`): what
        names a node no longer a voter is dropped, and counts are capped at the voters."""
        n = len(m.voters)
        return replace(self, voters=m.voters, learners=m.learners,
                       quorum_override=None if self.quorum_override is None else min(self.quorum_override, n),
                       commit_quorum=None if self.commit_quorum is None else min(self.commit_quorum, n),
                       designated_primary=self.designated_primary if self.designated_primary in m.voters else None,
                       witnesses=tuple(w for w in self.witnesses if w in m.voters))

    def priority(self, node: str) -> int:
        """0 for a witness, whatever the settings say: it holds no data, so it never stands."""
        return 0 if node in self.witnesses else self.priorities.get(node, 1)

    def rank(self, node: str) -> int:
        """Priority, then placement preference: what elections prefer (0 never stands).  A
        drained node ranks 1, below every node of priority 1 or more that is not: it still
        stands where no such node with the data can (availability over the drain)."""
        p = self.priority(node)
        if p and node in self.drained:
            return 1
        return 2 * p + (1 if p and node == self.preferred else 0)

    def quorum(self) -> int:
        """Voters (self included) needed to elect or to commit."""
        if self.designated_primary is not None and len(self.voters) == 2 and self.designated_primary == self.node:
            return 1
        if self.quorum_override is not None:
            return self.quorum_override
        return len(self.voters) // 2 + 1

    @property
    def majority(self) -> int:
        """Voters that make a majority (a quorum may be fewer, under an override)."""
        return len(self.voters) // 2 + 1
