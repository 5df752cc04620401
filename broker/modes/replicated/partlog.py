"""One partition's replication log on this node, and what it carries besides the core."""

from __future__ import annotations

import bisect
import random
from collections import deque
from dataclasses import dataclass, field

from broker.config import NodeConfig
from broker.messaging.window import Window, learn
from broker.peers.codec import CATALOGUE, Key, decode_ops
from broker.modes.replicated.compaction import COMPACT_BYTES, WeakHold
from broker.modes.replicated.host import Callback
from ha.members import is_change
from ha.messages import Entry, Envelope
from ha.partition import PartitionLifecycle
from ha.placement import NodeList
from ha.replica import Replica, ReplicaConfig
from storage.base import LogCompact, LogState, WriteOp

MAX_APPEND_BYTES = 32 * 1024 * 1024  # entry data in one AppendEntries (a replica catching up)


STAMP_EVERY = 0.05  # seconds between two samples of AppendTimes
STAMPS = 4096  # samples kept: at least STAMPS x STAMP_EVERY (~3.4 minutes) of appends


class AppendTimes:
    """When the active appended its log's entries, as (first index, monotonic time) samples
    at most one per STAMP_EVERY seconds, the last STAMPS of them: a few hundred kilobytes
    per partition whatever the rate.  An entry between two samples is dated by the earlier
    one, so a lag read from it is at most STAMP_EVERY too long, never too short."""

    __slots__ = ("_samples",)

    def __init__(self) -> None:
        self._samples: deque[tuple[int, float]] = deque(maxlen=STAMPS)

    def __len__(self) -> int:
        return len(self._samples)

    def appended(self, first: int, now: float) -> None:
        """Entries from index ``first`` on were appended at ``now``."""
        samples = self._samples
        if samples and samples[-1][0] >= first:
            samples.clear()  # a new term rewrote the log's tail
        if not samples or now - samples[-1][1] >= STAMP_EVERY:
            samples.append((first, now))

    def written_at(self, index: int) -> float | None:
        """When entry ``index`` was appended (or a little earlier; the oldest sample if the
        entry is older than every sample), None if nothing is recorded."""
        samples = self._samples
        if not samples:
            return None
        i = bisect.bisect_right(samples, (index, float("inf"))) - 1
        return samples[max(i, 0)][1]


@dataclass(eq=False)
class PartLog:
    """The core (:class:`ha.replica.Replica`) of one partition (or of the catalogue) and
    the driver's state around it: proposals waiting for their commit, ops staged for the
    next entry, whether this node serves it, store writes held back, messages waiting
    for the log write they promise."""

    key: Key
    replica: Replica
    nodes: NodeList
    applied: tuple[int, int, str] = (0, 0, "")
    #: proposals of this node awaiting commit: index -> (ops, callbacks)
    waiters: dict[int, tuple[list[WriteOp], list[Callback]]] = field(default_factory=dict)
    staged_ops: list[WriteOp] = field(default_factory=list)
    staged_cbs: list[Callback] = field(default_factory=list)
    staged_bytes: int = 0  # message bodies in staged_ops (see commit.STAGE_BYTES)
    proposed_term: int = 0  # the term of this node's last proposal to the log
    serving: bool = False  # active here, caught up, in-memory state loaded
    serve_from: int = 0  # the index of this active's no-op: serving once it is applied
    serve_term: int = 0
    known_leader: str | None = None  # to notice when the active changes
    known_active: str | None = None  # the serving active last reported to the lifecycle
    lifecycle: PartitionLifecycle | None = None  # state (Active, Unavailable, ...) and status
    durable_applied: int = 0  # applied entries whose store writes have committed
    applied_bytes: int = 0  # size of the applied entries still in the log (compaction by size)
    compact_at: int = COMPACT_BYTES  # compact when applied_bytes reaches it
    weak_compacted: bool = False  # said that a weak active's entries were compacted (compaction.weak_cap)
    weak_hold: WeakHold | None = None  # whether its publishes are refused (Proposals.propose), once asked
    must_sync: set[int] = field(default_factory=set)  # this active's entries that carry publishes
    #: store writes of committed entries, held back (see apply.HOLD_APPLY)
    held_ops: list[WriteOp] = field(default_factory=list)
    #: producer id -> the seqs of it this member applied (broker.messaging.sequences)
    windows: dict[str, Window] = field(default_factory=dict)
    held_bytes: int = 0
    held_since: float = 0.0  # when the oldest of them was held (while in HeldWrites)
    lazy_since: float = 0.0  # when its oldest lazily staged op was staged (while in Proposals' lazy set)
    held_upto: int = 0  # the applied index they bring the store to
    promised: tuple[int, str | None] = (0, None)  # (term, voted_for) as last written
    #: messages waiting for log writes to commit: (write seq, envelopes, monotonic time
    #: queued), in order
    outbox: deque[tuple[int, list[Envelope], float]] = field(default_factory=deque)
    alive_at: float = -1e18  # when this replica last sent the active an Alive (keep-alive)
    replied_at: float = -1e18  # when this replica's messages last went out (keep-alive)
    write_seq: int = 0
    #: under repair, marked so in the store (storage.segments.REPAIR_KEY) until the core has caught
    #: up (``replica.recovering`` False) and the mark's removal is written
    repairing: bool = False
    #: when this node, as the active, appended its entries (replication lag in seconds)
    appended_at: AppendTimes = field(default_factory=lambda: AppendTimes())

    @property
    def name(self) -> str:
        return "catalogue" if self.key == CATALOGUE else f"{self.key[0]}/{self.key[1]}"


def replica_config(cfg: NodeConfig, nodes: NodeList, *, priority: int, designated_primary: str | None,
                   quorum_override: int | None, lock: tuple[bool, bool] | None = None,
                   drained: frozenset[str] = frozenset()) -> ReplicaConfig:
    """The core's configuration for a log placed on ``nodes``: a designated primary counts
    only in a two-voter log, and a quorum override never exceeds the voters.  ``drained``:
    the group's drained members (``tandem node drain``), never the preferred node while a
    voter is not drained.

    ``lock``: the LockFile arbiter's say, (holds the lock, commits alone).  The holder is
    elected on its own vote (the lock decides, not a majority) and commits with its peer,
    or alone while the peer is gone (STANDALONE); the other node never stands (priority
    0).  No failback: the lock, not the placement, says who is active."""
    voters = nodes.voters
    if lock is not None:
        holder, alone = lock
        me = cfg.name
        return ReplicaConfig(node=me, voters=voters, learners=nodes.learners,
                             priorities={me: max(priority, 1) if holder else 0},
                             election_timeout=cfg.non_response_timeout, heartbeat_interval=cfg.keepalive_interval,
                             designated_primary=me if holder and me in voters else None,
                             commit_quorum=(1 if alone else len(voters)) if holder and me in voters else None,
                             preferred=nodes.nodes[0], failback_after=0.0, arbitrated=True, max_append=256,
                             max_append_bytes=MAX_APPEND_BYTES)
    witness = cfg.witness_address()
    witnesses = (witness[0],) if witness is not None else ()
    voters += witnesses  # the witness votes in every log and holds none of its data
    dp = designated_primary if len(voters) == 2 and designated_primary in voters else None
    override = quorum_override if quorum_override is None or quorum_override <= len(voters) else len(voters)
    return ReplicaConfig(node=cfg.name, voters=voters, learners=nodes.learners,
                         priorities={cfg.name: priority}, election_timeout=cfg.non_response_timeout,
                         heartbeat_interval=cfg.keepalive_interval, quorum_override=override,
                         designated_primary=dp, preferred=nodes.preferred(drained),
                         failback_after=cfg.failback_after, max_append=256, max_append_bytes=MAX_APPEND_BYTES,
                         witnesses=witnesses, drained=drained & set(voters))


def compacted(key: Key, r: Replica) -> LogCompact:
    """The store's record of ``r``'s snapshot: its position and its weak mark."""
    weak, recency = r.snapshot_mark()
    return LogCompact(key[0], key[1], r.snap_index, r.snap_term, r.snap_origin, weak, recency)


def open_log(key: Key, nodes: NodeList, st: LogState, config: ReplicaConfig, *, rng: random.Random,
             now: float, recovering: bool = False) -> PartLog:
    """A log as the store recovered it (``st``: hard state, entries, snapshot, applied);
    ``recovering``: started over empty, it neither votes nor stands until caught up."""
    entries = [Entry(r.term, r.index, r.data or None, r.origin, r.weak) for r in st.entries
               if r.index > st.snapshot[0]]
    replica = Replica(config, rng=rng, now=now, term=st.term, voted_for=st.voted_for, log=entries,
                      commit=max(st.commit, st.applied[0]), snapshot=st.snapshot, applied=st.applied[0],
                      recovering=recovering, snap_mark=(st.snap_weak, st.snap_recency))
    plog = PartLog(key, replica, nodes, applied=st.applied, promised=(st.term, st.voted_for),
                   durable_applied=st.applied[0],
                   applied_bytes=sum(len(e.data or b"") for e in entries if e.index <= st.applied[0]))
    if key != CATALOGUE:  # the seqs the applied entries still in the log took (broker.messaging.sequences)
        for e in entries:
            if e.index <= st.applied[0] and e.data is not None and not is_change(e.data):
                learn(plog.windows, decode_ops(key, e.data))
    return plog
