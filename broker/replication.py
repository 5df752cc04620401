"""Replicated mode: the I/O that feeds each partition's :class:`ha.replica.Replica`.

Every partition of every queue has a replication log on each node that holds
it, and the group has one more log, the *catalogue* (key ``(0, 0)``), whose
entries declare and delete queues.  What changes a partition (a publish batch,
settlements, delivery counts and marks, producer sequences) is a list of store
write ops; on the active those ops become one log entry per partition per turn
of the event loop, the entry is shipped to the replicas, and once the core says
it is committed (a quorum of voters, the active included, has it on disk) the
ops are applied to the local store on every node and the client is confirmed.

* **Persist before send.**  A Ready's log changes and hard state are one writer
  submission: ``local_sync`` on the active, ``remote_sync`` on replicas.  A
  replica's messages (votes, append replies) leave only once that write is
  committed, in order; the active ships appends at once and counts itself
  toward a commit only when :meth:`Replica.persisted` says its write is done.
* **Only the active holds messages in memory.**  Replicas apply committed ops
  to their store and nothing else.  A node that wins an election first commits
  its no-op (so everything earlier is applied), then loads the partition from
  its store and starts serving; a node that steps down drops the partition's
  in-memory state, fails what was waiting on it, and forgets its deliveries.
* **Compaction and snapshots.**  Applied entries are deleted from the log
  ``KEEP_ENTRIES`` (at most ``KEEP_BYTES``) behind; a replica that needs older ones gets a snapshot: the
  partition's state read from the store together with its applied position, in
  one read transaction.

Peer frames: ``Replicate`` carries the messages of any number of partitions to
one peer, one frame per peer per turn of the loop; ``Forward``/``ForwardOk``
carry client requests to the node that is active for them (location
transparency, docs/replication.md).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgpack

from client.clock import Cancellable
from client.errors import NotActiveError, TandemError, UnavailableError
from client.protocol.frames import PartitionInfo, ReplicaInfo
from ha.messages import (
    Alive,
    AppendEntries,
    AppendReply,
    EntriesDiscarded,
    Entry,
    Envelope,
    HandingOver,
    InstallSnapshot,
    Message,
    Ready,
    RequestVote,
    RoleChanged,
    TimeoutNow,
    VoteReply,
)
from ha.partition import PartitionChanged, PartitionLifecycle
from ha.partition import PartitionState as LifecycleState
from ha.membership import QuorumState
from ha.placement import DistributionPolicy, NodeList, ReplicaKind, place
from ha.replica import Replica, ReplicaConfig, Role
from storage.base import (
    Append,
    DropQueue,
    DurabilityPolicy,
    LogAppend,
    LogCompact,
    LogRecord,
    LogState,
    LogTruncate,
    MarkDelivered,
    MessageRecord,
    PackedRun,
    PartitionState,
    PutApplied,
    PutHardState,
    DropProducers,
    PutProducer,
    PutQueue,
    QueueMeta,
    ResetPartition,
    SetDeliveryCount,
    Settle,
    StoredMessage,
    WriteOp,
)

if TYPE_CHECKING:
    from broker.node import Node

log = logging.getLogger("tandem.ha")

Key = tuple[int, int]
CATALOGUE: Key = (0, 0)
Callback = Callable[[BaseException | None], None]

KEEP_ENTRIES = 1000  # applied entries kept in the log for replicas that fall a little behind
COMPACT_EVERY = 4000  # compact when this many applied entries have piled up
# ... and by size, as entries of big batches are big (256 x 1 KiB messages: 4,000 entries
# would be a gigabyte of log on disk and in memory per partition)
KEEP_BYTES = 8 * 1024 * 1024  # at most this much of applied entries kept
COMPACT_BYTES = 24 * 1024 * 1024  # compact when applied entries not compacted reach this (more than kept)
# ... but the active keeps what a replica that is answering still lacks, up to this much
# (beyond it, that replica gets a snapshot)
HOLD_BYTES = 256 * 1024 * 1024
MAX_APPEND_BYTES = 32 * 1024 * 1024  # entry data in one AppendEntries (a replica catching up)
MAX_EVENTS = 200
# Committed entries reach the store this long after they commit (or once this many bytes of
# them are waiting): the log has them on disk already, and a message acked in the meantime
# is never written to the store at all.  The log is the record until then: a restart
# applies again from the store's applied position; a node that becomes active applies what
# it holds at once.  0.2 s: long enough that a consumer keeping up acks its messages before
# they are written (publish, deliver, ack and the ack's commit take ~0.1 s under full load
# here); the writer commits such a batch in slices behind log appends (storage/writer.py), so
# a confirm does not wait for it (docs/replication.md, tenth session).
HOLD_APPLY = 0.2
HOLD_APPLY_BYTES = 8 * 1024 * 1024
# How often partitions that keep the log's oldest segment are compacted past it.
UNPIN_EVERY = 1.0
# Settlements (acks) are proposed lazily: they ride in the partition's next entry, a
# publish's most often, or go on their own after the node's ``ack_linger`` (or once this
# many ops wait).  An ack is answered before it commits in any case; a crash of the active
# in this window redelivers the message, as an OS crash does on a single node
# (docs/replication.md).
LAZY_PROPOSE_OPS = 4096
# While an entry of a partition this node proposed is not yet committed, what is staged for
# that partition waits for the commit (or until STAGE_BYTES of message bodies pile up) and
# then goes as one entry: under load, entries grow with the commit's round trip instead of
# one per turn of the loop, and every entry costs each node a write, a frame, a reply and an
# apply (docs/replication.md, "one entry in flight").
MAX_UNCOMMITTED = 1
STAGE_BYTES = 1024 * 1024
# A replica whose replies have been held this many non_response_timeouts by its log writes
# stops sending the active Alive (Replication._keep_alive): its disk or writer is stuck.
ALIVE_GIVE_UP = 10


# -- encoding: replication messages and log entries ------------------------------------------------


def _entry_out(e: Entry) -> list[Any]:
    return [e.term, e.index, e.data, e.origin, e.weak]


def _entry_in(a: list[Any]) -> Entry:
    return Entry(a[0], a[1], a[2], a[3], a[4])


class UnknownMessageKind(ValueError):
    """A replication message of a kind this build does not know (a newer build's)."""

    def __init__(self, kind: Any) -> None:
        super().__init__(f"unknown replication message kind {kind!r}")
        self.kind = kind


def encode_message(m: Message) -> list[Any]:
    if isinstance(m, AppendEntries):
        return [2, m.term, m.leader, m.prev_index, m.prev_term, m.prev_origin,
                [_entry_out(e) for e in m.entries], m.commit]
    if isinstance(m, AppendReply):
        return [3, m.term, m.replica, m.success, m.match_index]
    if isinstance(m, RequestVote):
        return [0, m.term, m.candidate, m.last_index, m.last_term, m.priority]
    if isinstance(m, VoteReply):
        return [1, m.term, m.voter, m.granted]
    if isinstance(m, TimeoutNow):
        return [5, m.term, m.leader, m.rank]
    if isinstance(m, Alive):
        return [6, m.term, m.replica]
    return [4, m.term, m.leader, m.index, m.last_term, m.last_origin, m.data]


def decode_message(a: list[Any]) -> Message:
    kind = a[0]
    if kind == 2:
        return AppendEntries(a[1], a[2], a[3], a[4], a[5], tuple(_entry_in(e) for e in a[6]), a[7])
    if kind == 3:
        return AppendReply(a[1], a[2], a[3], a[4])
    if kind == 0:
        return RequestVote(a[1], a[2], a[3], a[4], a[5])
    if kind == 1:
        return VoteReply(a[1], a[2], a[3])
    if kind == 4:
        return InstallSnapshot(a[1], a[2], a[3], a[4], a[5], a[6])
    if kind == 5:
        return TimeoutNow(a[1], a[2], a[3])
    if kind == 6:
        return Alive(a[1], a[2])
    raise UnknownMessageKind(kind)


def _meta_out(q: QueueMeta) -> list[Any]:
    return [q.id, q.name, q.partitions, q.mapper, q.ring_size, q.max_deliveries, q.dead_letter_queue, q.max_length]


def _meta_in(a: list[Any]) -> QueueMeta:
    return QueueMeta(id=a[0], name=a[1], partitions=a[2], mapper=a[3], ring_size=a[4], max_deliveries=a[5],
                     dead_letter_queue=a[6], max_length=a[7])


def _contiguous(messages: Sequence[MessageRecord]) -> bool:
    first = messages[0].offset
    return all(m.offset == first + i for i, m in enumerate(messages))


def encode_ops(ops: list[WriteOp]) -> tuple[bytes, list[WriteOp]]:
    """A log entry's payload: the ops of one partition (or of the catalogue); and the same
    ops with their appends packed (:class:`PackedRun`), to apply here without packing twice.

    An append of consecutive offsets travels as ``["C", next_offset, start, count, chunk]``:
    ``chunk`` is already the stores' chunk format, so a replica writes it as it comes,
    without decoding a message.  (``"A"``, a list of messages, is still read.)"""
    out: list[Any] = []
    applied: list[WriteOp] = []
    for op in ops:
        if isinstance(op, Append):
            msgs = op.messages
            if type(msgs) is not PackedRun and msgs and _contiguous(msgs):
                msgs = PackedRun.of(msgs)
                op = Append(op.queue_id, op.partition, msgs, op.next_offset)
            if type(msgs) is PackedRun:
                out.append(["C", op.next_offset, msgs.start, msgs.length, msgs.payload])
            else:
                out.append(["A", op.next_offset, [[m.offset, m.key, m.headers_blob, m.body, m.producer_id, m.seq,
                                                   m.ts] for m in msgs]])
            applied.append(op)
            continue
        applied.append(op)
        if isinstance(op, Settle):
            out.append(["S", op.offsets])
        elif isinstance(op, MarkDelivered):
            out.append(["M", op.upto])
        elif isinstance(op, SetDeliveryCount):
            out.append(["D", op.items])
        elif isinstance(op, PutProducer):
            out.append(["P", op.producer_id, op.last_seq])
        elif isinstance(op, DropProducers):
            out.append(["R", op.producer_ids])
        elif isinstance(op, PutQueue):
            out.append(["Q", _meta_out(op.queue)])
        elif isinstance(op, DropQueue):
            out.append(["X", op.queue_id])
        else:
            raise TypeError(f"{type(op).__name__} is not a replicated op")
    return msgpack.packb(out, use_bin_type=True), applied


def decode_ops(key: Key, data: bytes) -> list[WriteOp]:
    qid, p = key
    ops: list[WriteOp] = []
    for item in msgpack.unpackb(data, raw=False):
        kind = item[0]
        if kind == "C":
            ops.append(Append(qid, p, PackedRun(item[2], item[3], item[4]), item[1]))
        elif kind == "A":
            ops.append(Append(qid, p, [StoredMessage(*m) for m in item[2]], item[1]))
        elif kind == "S":
            ops.append(Settle(qid, p, item[1]))
        elif kind == "M":
            ops.append(MarkDelivered(qid, p, item[1]))
        elif kind == "D":
            ops.append(SetDeliveryCount(qid, p, [(o, dc) for o, dc in item[1]]))
        elif kind == "P":
            ops.append(PutProducer(qid, p, item[1], item[2]))
        elif kind == "R":
            ops.append(DropProducers(qid, p, list(item[1])))
        elif kind == "Q":
            ops.append(PutQueue(_meta_in(item[1])))
        elif kind == "X":
            ops.append(DropQueue(item[1]))
        else:
            raise ValueError(f"unknown log op {kind!r}")
    return ops


def encode_snapshot(st: PartitionState) -> bytes:
    return msgpack.packb([st.next_offset, st.delivered_upto, st.producers,
                          [[m.offset, m.key, m.headers_blob, m.body, m.producer_id, m.seq, m.ts, m.dc]
                           for m in st.messages]], use_bin_type=True)


def snapshot_ops(key: Key, data: bytes) -> list[WriteOp]:
    """What installing a snapshot writes: the partition replaced by its state."""
    qid, p = key
    nxt, delivered, producers, msgs = msgpack.unpackb(data, raw=False)
    stored = [StoredMessage(*m[:7]) for m in msgs]
    ops: list[WriteOp] = [ResetPartition(qid, p)]
    if stored or nxt:
        ops.append(Append(qid, p, stored, nxt))
    if delivered:
        ops.append(MarkDelivered(qid, p, delivered))
    # the stored count excludes the one the delivered mark adds back on load
    counts = [(m[0], m[7] - (1 if m[0] < delivered else 0)) for m in msgs]
    if any(dc for _o, dc in counts):
        ops.append(SetDeliveryCount(qid, p, [(o, dc) for o, dc in counts if dc]))
    ops.extend(PutProducer(qid, p, pid, seq) for pid, seq in producers.items())
    return ops


# -- one log ---------------------------------------------------------------------------------------


def _entry_bytes(r: Replica, first: int, last: int) -> int:
    """Bytes of the entries ``first..last`` in the core's log."""
    return sum(len(r.entry(i).data or b"") for i in range(first, last + 1))


def one_applied_position(ops: list[WriteOp]) -> list[WriteOp]:
    """Store writes held across several Readies, with one applied position: the newest.
    (A Ready that only compacted the log brings none, so the newest is not always last:
    dropping "the last one" there lost the position while its rows went in, and a restart
    applied those entries again over them.)"""
    out: list[WriteOp] = []
    newest: WriteOp | None = None
    for op in ops:
        if type(op) is PutApplied:
            newest = op
        else:
            out.append(op)
    if newest is not None:
        out.append(newest)
    return out


@dataclass(eq=False)
class PartLog:
    key: Key
    replica: Replica
    nodes: NodeList
    applied: tuple[int, int, str] = (0, 0, "")
    #: proposals of this node awaiting commit: index -> (ops, callbacks)
    waiters: dict[int, tuple[list[WriteOp], list[Callback]]] = field(default_factory=dict)
    staged_ops: list[WriteOp] = field(default_factory=list)
    staged_cbs: list[Callback] = field(default_factory=list)
    staged_bytes: int = 0  # message bodies in staged_ops (see STAGE_BYTES)
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
    must_sync: set[int] = field(default_factory=set)  # this active's entries that carry publishes
    #: store writes of committed entries, held back (see HOLD_APPLY)
    held_ops: list[WriteOp] = field(default_factory=list)
    held_bytes: int = 0
    held_since: float = 0.0  # when the oldest of them was held (while in Replication._held)
    lazy_since: float = 0.0  # when its oldest lazily staged op was staged (while in Replication._lazy)
    held_upto: int = 0  # the applied index they bring the store to
    promised: tuple[int, str | None] = (0, None)  # (term, voted_for) as last written
    #: messages waiting for log writes to commit: (write seq, envelopes, monotonic time
    #: queued), in order
    outbox: deque[tuple[int, list[Envelope], float]] = field(default_factory=deque)
    alive_at: float = -1e18  # when this replica last sent the active an Alive (_keep_alive)
    replied_at: float = -1e18  # when this replica's messages last went out (_keep_alive)
    write_seq: int = 0
    #: (index, monotonic time) of entries this node appended as the active, oldest first
    #: (replication lag in seconds: how long ago the first entry a replica lacks was written)
    appended_at: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=100_000))

    @property
    def name(self) -> str:
        return "catalogue" if self.key == CATALOGUE else f"{self.key[0]}/{self.key[1]}"


@dataclass(frozen=True, slots=True)
class HaEvent:
    at: float
    kind: str  # role, HA-1014, override
    partition: str
    text: str


def waits_for_commit(plog: PartLog) -> bool:
    """Whether what is staged for ``plog`` waits for this node's entry in flight to commit
    (MAX_UNCOMMITTED) rather than go now.  It goes now once it is big (STAGE_BYTES of bodies,
    or LAZY_PROPOSE_OPS ops), for the catalogue, and once the term has moved on since the
    entry in flight was proposed: an entry of an older term commits only with one of the
    current term, which only the next proposal can be.  (The core steps down whenever it
    raises its own term, ha/replica.py ``_follow``, which fails what waits; the term check is
    the second line, should an active's term ever move on without a step-down.)"""
    return (len(plog.waiters) >= MAX_UNCOMMITTED and plog.staged_bytes < STAGE_BYTES
            and len(plog.staged_ops) < LAZY_PROPOSE_OPS and plog.key != CATALOGUE
            and plog.proposed_term == plog.replica.term)


class Replication:
    def __init__(self, node: Node, logs: dict[Key, LogState]) -> None:
        self.node = node
        cfg = node.config
        self.me = cfg.name
        self.members = sorted([cfg.name, *cfg.peer_addresses()])
        self.policy = DistributionPolicy(replicas=cfg.replicas, sync_replicas=cfg.sync_replicas)
        self.priority = cfg.priority
        self.quorum_override: int | None = None
        self.designated_primary: str | None = cfg.name if cfg.designated_primary else None
        self.logs: dict[Key, PartLog] = {}
        self._stored = logs
        self._rng = random.Random()
        self._out: dict[str, list[Any]] = {}
        self._flush_scheduled = False
        self._stage_scheduled: set[PartLog] = set()
        self._deferred: set[PartLog] = set()  # logs whose staged ops wait for a commit (MAX_UNCOMMITTED)
        self._lazy: set[PartLog] = set()  # logs holding lazily staged ops only, for the timer
        self._lazy_timer: Cancellable | None = None
        self.linger = cfg.ack_linger
        self._held: set[PartLog] = set()  # logs holding store writes back
        self._stopping = False
        self._hold_timer: Cancellable | None = None
        self.changed = asyncio.Event()  # set (and replaced) whenever a role or an active changes
        self.events: deque[HaEvent] = deque(maxlen=MAX_EVENTS)
        self.discarded_total = 0
        self.discarded_messages = 0  # messages in those entries
        self.elections = 0  # times this node became active for a partition (metrics)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._broken = False
        self._unknown_kinds: set[tuple[str, str]] = set()  # (peer, repr of message kind) already logged
        #: partition state notifiers (Python callbacks), called in order of the changes
        self.partition_notifiers: list[Callable[[PartitionChanged], None]] = [self._log_partition_change]

    # -- set-up -------------------------------------------------------------------------------

    def start(self) -> None:
        self._open(CATALOGUE, NodeList(tuple(self.members), (ReplicaKind.SYNC,) * len(self.members)))
        for q in self.node.queues.values():
            self._open_queue(q.meta)

    def _open_queue(self, meta: QueueMeta) -> None:
        for p, nodes in enumerate(place(self.policy, meta.partitions, self.members)):
            if self.me in nodes.nodes and (meta.id, p) not in self.logs:
                self._open((meta.id, p), nodes)

    def _replica_config(self, nodes: NodeList) -> ReplicaConfig:
        cfg = self.node.config
        voters = nodes.voters
        dp = self.designated_primary if len(voters) == 2 and self.designated_primary in voters else None
        override = self.quorum_override if self.quorum_override is None or self.quorum_override <= len(voters) \
            else len(voters)
        return ReplicaConfig(node=self.me, voters=voters, learners=nodes.learners,
                             priorities={self.me: self.priority}, election_timeout=cfg.non_response_timeout,
                             heartbeat_interval=cfg.keepalive_interval, quorum_override=override,
                             designated_primary=dp, preferred=nodes.nodes[0], failback_after=cfg.failback_after,
                             max_append=256,
                             max_append_bytes=MAX_APPEND_BYTES)

    def _open(self, key: Key, nodes: NodeList) -> None:
        st = self._stored.pop(key, None) or LogState()
        entries = [Entry(r.term, r.index, r.data or None, r.origin, r.weak) for r in st.entries
                   if r.index > st.snapshot[0]]
        replica = Replica(self._replica_config(nodes), rng=random.Random(self._rng.random()),
                          now=self.node.clock.monotonic(), term=st.term, voted_for=st.voted_for, log=entries,
                          commit=max(st.commit, st.applied[0]), snapshot=st.snapshot, applied=st.applied[0])
        plog = PartLog(key, replica, nodes, applied=st.applied, promised=(st.term, st.voted_for),
                       durable_applied=st.applied[0],
                       applied_bytes=sum(len(e.data or b"") for e in entries if e.index <= st.applied[0]))
        self._start_lifecycle(plog)
        self.logs[key] = plog

    def _start_lifecycle(self, plog: PartLog) -> None:
        q = self.node.queue_by_id(plog.key[0])
        name = "(catalogue)" if plog.key == CATALOGUE else (q.name if q is not None else f"#{plog.key[0]}")
        plog.lifecycle = lc = PartitionLifecycle(name, plog.key[1], notifiers=[self._notify_partition])
        lc.set_status("define_local", "defined by the catalogue")
        lc.set_status("enable_local", "this node holds a replica")  # -> Unavailable until an active is known

    def _notify_partition(self, change: PartitionChanged) -> None:
        for cb in list(self.partition_notifiers):
            try:
                cb(change)
            except Exception:  # one bad notifier must not stop the others or replication
                log.exception("partition notifier failed")

    def add_partition_notifier(self, cb: Callable[[PartitionChanged], None]) -> None:
        """Install ``cb``; it is called at once with every partition's current state."""
        self.partition_notifiers.append(cb)
        for plog in self.logs.values():
            lc = plog.lifecycle
            if lc is not None:
                cb(PartitionChanged(lc.queue, lc.partition, lc.state, lc.state, lc.status, lc.status, "installed"))

    @staticmethod
    def _log_partition_change(c: PartitionChanged) -> None:
        if c.old_state is not c.new_state or c.reason.startswith("active"):
            log.info("partition %s/%d state %s -> %s (%s)", c.queue, c.partition, c.old_state.value,
                     c.new_state.value, c.reason)

    def _track_active(self, plog: PartLog) -> None:
        """Tell the partition's lifecycle when it gets, changes or loses its active."""
        lc = plog.lifecycle
        who = self.active_of(plog.key)
        if lc is None or who == plog.known_active:
            return
        plog.known_active = who
        if who is not None:
            lc.on("active_elected", f"active {who}")
        elif lc.state is not LifecycleState.UNAVAILABLE:
            lc.on("quorum_lost" if self._disabled() else "active_lost",
                  "this node has no quorum" if self._disabled() else "no active known")

    def _disabled(self) -> bool:
        peers = self.node.peers
        return peers is not None and peers.membership.quorum_state is QuorumState.DISABLED

    def reconfigure(self) -> None:
        """Priority, quorum_override or designated_primary changed: every log, at once."""
        for plog in list(self.logs.values()):
            self._guarded(plog, lambda: plog.replica.reconfigure(self._replica_config(plog.nodes)))

    async def run(self) -> None:
        interval = min(0.05, self.node.config.keepalive_interval / 2)
        clock = self.node.clock
        pins_at = clock.monotonic()
        while True:
            now = clock.monotonic()
            wake = now + interval
            for plog in list(self.logs.values()):
                self._guarded(plog, lambda: plog.replica.tick(now))
                r = plog.replica
                if plog.outbox and r.role is Role.FOLLOWER:  # (a learner's word counts for nothing)
                    self._keep_alive(plog, now)
                # Early only for an election timer: an active's heartbeats keep a phase of their
                # own each, and waking for every one would tick every log N times a round.
                if r.role is not Role.LEADER:
                    at = r.wake_at
                    if now < at < wake:  # (a log whose tick failed must not make this loop spin)
                        wake = at
            if now >= pins_at:
                pins_at = now + UNPIN_EVERY
                self._unpin_segments()
            # Round by round, but early for an election timer due before the next round: two
            # replicas whose random timers differ by 20 ms must not bid in the same round (that
            # split the vote again in one failover in six, at 50 ms rounds).  (A timer a message
            # sets, as a refusal's early stand, waits for the next round or message: <= 50 ms.)
            await clock.sleep(max(0.001, wake - clock.monotonic()))

    def _unpin_segments(self) -> None:
        """The oldest segment of the log's files goes once every entry in it is compacted
        (storage/segments.py).  A partition that keeps it (a quiet one: it compacts only
        every COMPACT_EVERY entries) is compacted past it here, once applied that far.  The
        log of a partition this node holds no replica of is dropped: of a queue placed
        elsewhere now, with its store rows; of a deleted queue (its deletion record did not
        reach the disk before a crash), once the catalogue here is caught up."""
        pins = getattr(self.node.engine, "log_pins", None)
        if pins is None or self._broken or self._stopping:
            return
        try:
            for key, top in pins().items():
                plog = self.logs.get(key)
                if plog is None:
                    self._drop_foreign_log(key)
                    continue
                r = plog.replica
                if r.snap_index >= top or r.applied < top:
                    continue  # compacted already (not yet durably), or not applied that far yet
                need = r.live_match()
                if need is not None and need < top and _entry_bytes(r, need + 1, r.applied) <= HOLD_BYTES:
                    continue  # a replica that answers still lacks them: it catches up first (as _compact_upto)
                r.compact(top)
                plog.applied_bytes = _entry_bytes(r, r.snap_index + 1, r.applied)
                # with the store writes it depends on, in order (see _hold)
                self._hold(plog, [LogCompact(key[0], key[1], r.snap_index, r.snap_term, r.snap_origin)], 0)
        except Exception as exc:
            log.exception("compacting the partitions that keep the oldest log segment failed")
            self._fatal(f"log compaction failed: {exc!r}")

    def _drop_foreign_log(self, key: Key) -> None:
        if key == CATALOGUE:
            return
        qid, p = key
        if self.node.queue_by_id(qid) is not None:
            log.info("partition %d/%d: dropping its log and store rows on %s, which no longer holds a replica",
                     qid, p, self.me)
            self.node.writer.submit([ResetPartition(qid, p), LogCompact(qid, p, 0, 0, ""), PutApplied(qid, p, 0, 0, ""),
                                     LogTruncate(qid, p, 0)], sync=False)
            return
        cat = self.logs[CATALOGUE].replica
        if cat.leader is not None and not cat.recovering and cat.applied >= cat.commit:
            log.info("partition %d/%d: dropping the log of a deleted queue on %s", qid, p, self.me)
            self.node.writer.submit([LogTruncate(qid, p, 0)], sync=False)

    def stop(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        if self._hold_timer is not None:
            self._hold_timer.cancel()
            self._hold_timer = None
        if self._lazy_timer is not None:
            self._lazy_timer.cancel()
            self._lazy_timer = None
        self._lazy.clear()
        for plog in self.logs.values():
            self._release_held(plog)
            self._fail_waiters(plog, UnavailableError(f"node {self.me} is shutting down"))
        self._stopping = True

    # -- the core's Ready ------------------------------------------------------------------------

    def _handle(self, plog: PartLog, ready: Ready) -> None:
        """Carry out one Ready: one writer submission, then (or at once, on the active)
        the messages, then the callbacks of confirmed proposals."""
        if self._broken or self.logs.get(plog.key) is not plog:
            return  # a log that was replaced (resync) or dropped (queue deleted)
        r = plog.replica
        key = plog.key
        if r.leader != plog.known_leader:
            plog.known_leader = r.leader
            self._notify()
        self._track_active(plog)
        self._undefer(plog)  # (should the term move on without a step-down: see waits_for_commit)
        if key != CATALOGUE and any(isinstance(ev, EntriesDiscarded) and ev.committed for ev in ready.events):
            # It had applied entries the group discarded: its store is wrong for this partition.
            # Nothing of this Ready is carried out (its replies would promise a log about to go).
            for ev in ready.events:
                self._event(plog, ev)
            self._resync(plog)
            return
        ops: list[WriteOp] = []
        sync = False
        leader = r.role is Role.LEADER
        policy = self.node.config.sync if leader else self.node.config.remote_sync
        if ready.truncate_from is not None or ready.snapshot is not None:
            self._release_held(plog)  # what is held goes to the store first, in order
        if ready.truncate_from is not None:
            ops.append(LogTruncate(key[0], key[1], ready.truncate_from))
        if ready.snapshot is not None:
            m = ready.snapshot
            ops.extend(self._install(plog, m))
            ops.append(LogCompact(key[0], key[1], m.index, m.last_term, m.last_origin))
            ops.append(PutApplied(key[0], key[1], m.index, m.last_term, m.last_origin))
            sync = True
        if ready.append:
            ops.append(LogAppend(key[0], key[1], [LogRecord(e.index, e.term, e.origin, e.weak, e.data or b"")
                                                  for e in ready.append]))
            if leader:
                now = self.node.clock.monotonic()
                stamps = plog.appended_at
                if stamps and stamps[-1][0] >= ready.append[0].index:
                    stamps.clear()  # a new term rewrote the log's tail
                stamps.extend((e.index, now) for e in ready.append)
            # The active fsyncs (SYNC) entries that carry publishes; settlements and delivery
            # marks are written without: losing one in an OS crash means a redelivery, as on
            # a single node.  (Replicas follow remote_sync for all.)
            if policy is DurabilityPolicy.SYNC:
                sync = sync or not leader or any(e.index in plog.must_sync for e in ready.append)
            if plog.must_sync:
                plog.must_sync.difference_update([e.index for e in ready.append])
        promise = False  # a new term or vote: on disk before anyone hears of it
        if ready.hard_state is not None:
            hs = ready.hard_state
            # Written when the term or vote changes.  A commit index that only moved is not
            # written on its own: the applied position, written with the applies, stands
            # for it on restart (a row rewrite per entry would double the WAL traffic).
            if (hs.term, hs.voted_for) != plog.promised:
                ops.append(PutHardState(key[0], key[1], hs.term, hs.voted_for, hs.commit))
                plog.promised = (hs.term, hs.voted_for)
                promise = True
                sync = True
        for ev in ready.events:
            self._event(plog, ev)
        # Applying committed entries to the store can wait for the next commit (lazy): the
        # log already has them durably, and a restart re-applies from the applied position.
        callbacks: list[list[Callback]] = []
        apply_ops: list[WriteOp] = []
        applied_size = plog.applied_bytes
        if ready.committed:
            apply_ops = self._apply(plog, ready.committed, callbacks)
        applied_size = plog.applied_bytes - applied_size  # (before compaction recounts it)
        if r.applied - r.snap_index >= COMPACT_EVERY or plog.applied_bytes >= plog.compact_at:
            upto, plog.applied_bytes = self._compact_upto(r)
            # next time once COMPACT_BYTES - KEEP_BYTES more are applied (not at every Ready
            # while a slow replica holds more than COMPACT_BYTES back)
            plog.compact_at = plog.applied_bytes + COMPACT_BYTES - KEEP_BYTES
            if upto > r.snap_index:
                r.compact(upto)
                apply_ops.append(LogCompact(key[0], key[1], r.snap_index, r.snap_term, r.snap_origin))
        last = ready.append[-1] if ready.append else None
        # Messages of a replica wait for the write (they promise what is on disk); the
        # active's appends go at once (it counts itself only once persisted), except
        # right after it won: its term must be on disk first.
        wait = bool(ops) and (promise or (not leader and policy is not DurabilityPolicy.NO_SYNC))
        if ops:
            plog.write_seq += 1
            seq = plog.write_seq
            snapshot_upto = plog.applied[0] if ready.snapshot is not None else 0

            def written(err: BaseException | None) -> None:
                if err is not None:
                    self._fatal(f"replication log write of {plog.name} failed: {err}")
                    return
                if self.logs.get(key) is not plog:
                    return
                if plog.outbox and plog.outbox[0][0] <= seq:
                    plog.replied_at = self.node.clock.monotonic()
                while plog.outbox and plog.outbox[0][0] <= seq:
                    for env in plog.outbox.popleft()[1]:
                        self._send(key, env)
                if last is not None and (policy is not DurabilityPolicy.NO_SYNC or not leader):
                    self._guarded(plog, lambda: plog.replica.persisted(last))
                self._stored_upto(plog, snapshot_upto)

            self.node.writer.submit(ops, sync=sync, callback=written)
            if last is not None and leader and policy is DurabilityPolicy.NO_SYNC:
                self._guarded(plog, lambda: r.persisted(last))
        if apply_ops:
            self._hold(plog, apply_ops, applied_size)
        if ready.messages:
            if wait or plog.outbox:
                target = plog.write_seq
                if plog.outbox and plog.outbox[-1][0] == target:
                    plog.outbox[-1][1].extend(ready.messages)
                else:
                    plog.outbox.append((target, list(ready.messages), self.node.clock.monotonic()))
            else:
                if not leader:
                    plog.replied_at = self.node.clock.monotonic()
                for env in ready.messages:
                    self._send(key, env)
        for cbs in callbacks:
            for cb in cbs:
                try:
                    cb(None)
                except Exception:  # a confirm callback must not stop replication
                    log.exception("partition %s: a commit callback failed", plog.name)

    def _keep_alive(self, plog: PartLog, now: float) -> None:
        """A replica's replies wait for its log write, and that write can wait for long: behind
        this node's own fsyncs in the one writer thread, or for a disk that stalls (the
        twelfth session saw this machine's disk stop for up to half a second).  While the
        active has heard nothing from this replica for half a keep-alive interval and a reply
        is held, it is told that this replica is up, every half interval (from the ticks, not
        from the active's messages: their spacing would leave gaps of up to three intervals;
        now at most an interval and 0.1 s, where the config allows anything below
        ``non_response_timeout``): else, hearing nothing for
        ``non_response_timeout``, it steps down, and a disk's hiccup costs the partition an
        election (docs/replication.md, "a slow disk is not a dead node").  Not for ever: a
        disk stuck for ALIVE_GIVE_UP timeouts is a node that cannot serve, and the active must
        step down so that its clients hear UNAVAILABLE instead of waiting."""
        r = plog.replica
        half = self.node.config.keepalive_interval / 2
        held = now - plog.outbox[0][2]
        quiet = now - max(plog.replied_at, plog.alive_at)  # since the active last heard from us
        if r.leader is None or r.leader == self.me or held < min(half, 0.05) or quiet < half:
            return  # (held: not for the millisecond a reply waits for a healthy disk)
        if held > ALIVE_GIVE_UP * self.node.config.non_response_timeout:
            if plog.alive_at > plog.outbox[0][2]:  # (said once per stuck write)
                plog.alive_at = -1e18
                log.error("partition %s: replies to %s held %.1f s by this node's log writes: no longer "
                          "telling it this replica is up (its disk or writer is stuck?)", plog.name, r.leader, held)
            return
        plog.alive_at = now
        self._send(plog.key, Envelope(self.me, r.leader, Alive(r.term, self.me)))

    def _hold(self, plog: PartLog, ops: list[WriteOp], size: int) -> None:
        """Store writes of committed entries: held back for HOLD_APPLY, or written at once
        while a new active waits for them to start serving (and for the catalogue)."""
        if self._stopping:
            return  # the writer is closing; the log has them, a restart applies them
        plog.held_ops.extend(ops)
        plog.held_bytes += size
        plog.held_upto = plog.applied[0]
        if plog.serve_from or plog.key == CATALOGUE or plog.held_bytes >= HOLD_APPLY_BYTES:
            self._release_held(plog, eager=bool(plog.serve_from))
            return
        if plog not in self._held:
            plog.held_since = self.node.clock.monotonic()
            self._held.add(plog)
            if self._hold_timer is None:
                self._hold_timer = self.node.clock.call_later(HOLD_APPLY, self._release_due)

    def _release_due(self) -> None:
        self._hold_timer = None
        now = self.node.clock.monotonic()
        for plog in list(self._held):
            if now - plog.held_since >= HOLD_APPLY:
                self._release_held(plog)
        if self._held:
            wait = min(plog.held_since for plog in self._held) + HOLD_APPLY - now
            self._hold_timer = self.node.clock.call_later(max(0.001, wait), self._release_due)

    def _release_held(self, plog: PartLog, *, eager: bool = False) -> None:
        """Submit the store writes ``plog`` holds (eager: commit them now).  A log that was
        replaced (resync) or dropped (queue deleted) writes nothing: its rows are reset."""
        held, plog.held_ops = plog.held_ops, []
        plog.held_bytes = 0
        self._held.discard(plog)
        key = plog.key
        if not held or self.logs.get(key) is not plog:
            return
        ops = one_applied_position(held)
        applied_upto = plog.held_upto

        def applied(err: BaseException | None) -> None:
            if err is not None:
                self._fatal(f"applying {plog.name} to the store failed: {err}")
            elif self.logs.get(key) is plog:
                self._stored_upto(plog, applied_upto)

        self.node.writer.submit(ops, sync=False, callback=applied, lazy=not eager)

    def _stored_upto(self, plog: PartLog, index: int) -> None:
        """The store has every entry up to ``index`` applied: a new active waiting for
        that starts serving."""
        plog.durable_applied = max(plog.durable_applied, index)
        if plog.serve_from and not plog.serving and plog.durable_applied >= plog.serve_from:
            self._start_serving(plog)

    def _guarded(self, plog: PartLog, step: Callable[[], Ready]) -> None:
        """Feed the core and handle its Ready; an unexpected error stops this node (its
        state may be inconsistent) rather than the replication task or a peer link."""
        try:
            self._handle(plog, step())
        except Exception as exc:
            log.exception("partition %s: replication failed", plog.name)
            self._fatal(f"replication of {plog.name} failed: {exc!r}")

    def _fatal(self, why: str) -> None:
        if self._broken:
            return
        self._broken = True
        log.critical("%s: this node stops, its replicas elect another active", why)
        self._spawn(self.node.stop())

    def _spawn(self, coro: Any) -> None:
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    @staticmethod
    def _compact_upto(r: Replica) -> tuple[int, int]:
        """Where to compact, and the bytes of applied entries kept: the last KEEP_ENTRIES
        applied entries, or fewer if they hold more than KEEP_BYTES; on the active also
        every entry a replica that answers still lacks, up to HOLD_BYTES."""
        need = r.live_match()  # entries after it are still wanted
        i, kept = r.applied, 0
        floor = max(r.snap_index, r.applied - KEEP_ENTRIES)
        while i > r.snap_index:
            size = len(r.entry(i).data or b"")
            if not ((i > floor and kept + size <= KEEP_BYTES)
                    or (need is not None and i > need and kept + size <= HOLD_BYTES)):
                break
            kept += size
            i -= 1
        return i, kept

    # -- applying committed entries ------------------------------------------------------------

    def _apply(self, plog: PartLog, entries: list[Entry], callbacks: list[list[Callback]]) -> list[WriteOp]:
        ops: list[WriteOp] = []
        key = plog.key
        for e in entries:
            waiting = plog.waiters.pop(e.index, None)
            if e.data is not None:
                if waiting is not None and waiting[0] is not None:
                    entry_ops = waiting[0]
                else:
                    entry_ops = decode_ops(key, e.data)
                if key == CATALOGUE:
                    entry_ops = self._apply_catalogue(entry_ops)
                ops.extend(entry_ops)
            if waiting is not None:
                callbacks.append(waiting[1])
            plog.applied = (e.index, e.term, e.origin)
            plog.applied_bytes += len(e.data or b"")
        self._undefer(plog)  # what waited for these commits goes now
        if key == CATALOGUE and entries and all(e.data is None for e in entries):
            # A new active's no-op moves the catalogue's applied position too, and
            # Node.catch_up_catalogue waits on that (entries with data notify in
            # _apply_catalogue; the waiters look once this call is over).
            self._notify()
        ops.append(PutApplied(key[0], key[1], *plog.applied))
        return ops

    def _apply_catalogue(self, ops: list[WriteOp]) -> list[WriteOp]:
        """Apply committed catalogue ops here; the ops to store (a declare that lost a race
        for its name is a no-op everywhere)."""
        out: list[WriteOp] = []
        for op in ops:
            if isinstance(op, PutQueue):
                if self.node.catalogue_put(op.queue):
                    self._open_queue(op.queue)
                    out.append(op)
            elif isinstance(op, DropQueue):
                self.node.catalogue_drop(op.queue_id)
                for key in [k for k in self.logs if k[0] == op.queue_id]:
                    plog = self.logs.pop(key)
                    self._fail_waiters(plog, UnavailableError("the queue was deleted"))
                out.append(op)
        self._notify()
        return out

    def _install(self, plog: PartLog, m: InstallSnapshot) -> list[WriteOp]:
        log.info("partition %s: installing a snapshot from %s at index %d", plog.name, m.leader, m.index)
        plog.applied = (m.index, m.last_term, m.last_origin)
        plog.applied_bytes = 0  # the log before it is gone
        if plog.key == CATALOGUE:
            metas = [_meta_in(a) for a in msgpack.unpackb(m.data, raw=False)]
            ops: list[WriteOp] = []
            have = {q.meta.id for q in self.node.queues.values()}
            for meta in metas:
                if meta.id not in have:
                    ops.append(PutQueue(meta))
            for qid in have - {meta.id for meta in metas}:
                ops.append(DropQueue(qid))
            return self._apply_catalogue(ops)
        return snapshot_ops(plog.key, m.data)

    # -- roles -------------------------------------------------------------------------------------

    def _event(self, plog: PartLog, ev: RoleChanged | EntriesDiscarded | HandingOver) -> None:
        """Log it, record it, act on a role change."""
        now = self.node.clock.time()
        if isinstance(ev, HandingOver):
            log.warning("partition %s on %s: failback: handing it to %s, its placement's choice, back and "
                        "answering (term %d; writes wait until it has taken over, or given up after an "
                        "election timeout)", plog.name, self.me, ev.to, ev.term)
            self.events.append(HaEvent(now, "failback", plog.name, f"{self.me}: handing over to {ev.to} "
                                                                   f"in term {ev.term}"))
            return
        if isinstance(ev, RoleChanged):
            level = logging.WARNING if ev.old == "active" or ev.new == "active" else logging.DEBUG
            log.log(level, "partition %s on %s: %s -> %s in term %d (%s)", plog.name, self.me, ev.old, ev.new,
                    ev.term, ev.reason)
            if ev.new == "active" or ev.old == "active":
                self.events.append(HaEvent(now, "role", plog.name, f"{self.me}: {ev.old} -> {ev.new} in term "
                                                                   f"{ev.term} ({ev.reason})"))
            if ev.new == "active":
                self.elections += 1
                plog.serve_from = plog.replica.last_index  # its no-op
                plog.serve_term = ev.term
            elif ev.old == "active":
                self._stop_serving(plog, f"partition {plog.name} is no longer active on {self.me} ({ev.reason})")
            self._notify()
            return
        self.discarded_total += ev.count
        messages = self._messages_in(plog.key, ev.payloads)
        self.discarded_messages += messages
        log.error("HA-1014 partition %s on %s: %d entries (%d messages) from index %d discarded in term %d "
                  "(never committed by the group)%s", plog.name, self.me, ev.count, messages, ev.first_index,
                  ev.term, f"; {ev.committed} of them had been confirmed under a weak override" if ev.committed
                  else "")
        self.events.append(HaEvent(now, "HA-1014", plog.name, f"{self.me}: {ev.count} entries ({messages} "
                                   f"messages) discarded from index {ev.first_index}, {ev.committed} confirmed"))

    @staticmethod
    def _messages_in(key: Key, payloads: tuple[bytes | None, ...]) -> int:
        """How many published messages these log entries carried."""
        n = 0
        for data in payloads:
            if data is None or key == CATALOGUE:
                continue
            try:
                n += sum(len(op.messages) for op in decode_ops(key, data) if isinstance(op, Append))
            except (ValueError, TypeError, msgpack.UnpackException):
                log.warning("HA-1014 on %s: a discarded entry could not be decoded to count its messages", key)
        return n

    def _resync(self, plog: PartLog) -> None:
        """Entries this node had applied were discarded (it confirmed them under a weak
        override): its store is wrong for this partition.  Start the partition over
        empty, after everything already submitted; the active sends it all again (or a
        snapshot).  Until then it neither votes nor stands (``recovering``)."""
        key = plog.key
        r = plog.replica
        log.error("partition %s on %s: rebuilding from the active after HA-1014", plog.name, self.me)
        self._stop_serving(plog, f"partition {plog.name} is being rebuilt on {self.me}")
        self._fail_waiters(plog, UnavailableError(f"partition {plog.name} is being rebuilt on {self.me}"))
        self.node.writer.submit([ResetPartition(*key), LogTruncate(key[0], key[1], 0),
                                 LogCompact(key[0], key[1], 0, 0, ""), PutApplied(key[0], key[1], 0, 0, ""),
                                 PutHardState(key[0], key[1], r.term, r.voted_for, 0)], sync=True)
        replica = Replica(self._replica_config(plog.nodes), rng=random.Random(self._rng.random()),
                          now=self.node.clock.monotonic(), term=r.term, voted_for=r.voted_for, recovering=True)
        new = PartLog(key, replica, plog.nodes, promised=(r.term, r.voted_for))
        self._start_lifecycle(new)
        self.logs[key] = new

    def _notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()
        self.node.map_changed()

    def _start_serving(self, plog: PartLog) -> None:
        r = plog.replica
        if r.role is not Role.LEADER or r.term != plog.serve_term:
            return
        plog.serve_from = 0
        if plog.key == CATALOGUE:
            plog.serving = True
            self._track_active(plog)
            self._notify()
            return
        term = r.term

        async def load() -> None:
            st = await asyncio.to_thread(self.node.engine.load_partition, *plog.key)
            if r.role is not Role.LEADER or r.term != term or self.logs.get(plog.key) is not plog:
                return
            self.node.partition_loaded(plog.key, st)
            plog.serving = True
            log.warning("partition %s active on %s in term %d (%d messages)", plog.name, self.me, term,
                        len(st.messages))
            self._track_active(plog)
            self._notify()

        self._spawn(load())

    def _stop_serving(self, plog: PartLog, why: str) -> None:
        was = plog.serving
        plog.serving = False
        plog.serve_from = 0
        self._track_active(plog)
        self._fail_waiters(plog, NotActiveError(why, active_hint=None))
        if was and plog.key != CATALOGUE:
            self.node.partition_unloaded(plog.key)

    def _fail_waiters(self, plog: PartLog, err: TandemError) -> None:
        waiters, plog.waiters = plog.waiters, {}
        staged, plog.staged_cbs = plog.staged_cbs, []
        plog.staged_ops = []
        plog.staged_bytes = 0
        self._deferred.discard(plog)
        for _ops, cbs in waiters.values():
            for cb in cbs:
                cb(err)
        for cb in staged:
            cb(err)

    # -- proposals ----------------------------------------------------------------------------------

    def serving(self, key: Key) -> bool:
        plog = self.logs.get(key)
        return plog is not None and plog.serving

    def propose(self, ops: list[WriteOp], callback: Callback | None, *, lazy: bool = False) -> None:
        """Replicate partition ops; ``callback(err)`` once all of them are committed (or not).

        Ops of partitions not served here fail with NotActiveError (their messages are
        the new active's business: a settlement lost this way means a redelivery).
        ``lazy``: no hurry (settlements): they wait for the partition's next entry, at
        most the node's ``ack_linger``."""
        by_key: dict[Key, list[WriteOp]] = {}
        for op in ops:
            by_key.setdefault((op.queue_id, op.partition), []).append(op)  # type: ignore[union-attr]
        if not by_key:
            if callback is not None:
                callback(None)
            return
        remaining = [len(by_key)]
        first_error: list[BaseException | None] = [None]

        def one(err: BaseException | None) -> None:
            if err is not None and first_error[0] is None:
                first_error[0] = err
            remaining[0] -= 1
            if remaining[0] == 0 and callback is not None:
                callback(first_error[0])

        for key, kops in by_key.items():
            plog = self.logs.get(key)
            if plog is None or not plog.serving:
                one(NotActiveError(f"partition {key[0]}/{key[1]} is not active on {self.me}"))
                continue
            self.stage(plog, kops, one, lazy=lazy)

    def stage(self, plog: PartLog, ops: list[WriteOp], callback: Callback, *, lazy: bool = False) -> None:
        """Ops become one entry per log per turn of the event loop.  Lazy ops wait for the
        log's next eager ones (one entry for both, in the order they were staged) or for
        the lazy timer: at 2,000 publishes a second with consumers on, an ack per
        message had doubled the entries every node writes, ships and applies."""
        plog.staged_ops.extend(ops)
        plog.staged_cbs.append(callback)
        for op in ops:
            if type(op) is Append:
                msgs = op.messages
                plog.staged_bytes += len(msgs.payload) if type(msgs) is PackedRun else sum(len(m.body) for m in msgs)
        if plog in self._deferred:
            if waits_for_commit(plog):
                return  # it goes once the entry in flight commits (_apply)
            self._deferred.discard(plog)
        if lazy and self.linger > 0 and len(plog.staged_ops) < LAZY_PROPOSE_OPS:
            if plog not in self._stage_scheduled and plog not in self._lazy:
                plog.lazy_since = self.node.clock.monotonic()
                self._lazy.add(plog)
                if self._lazy_timer is None:
                    self._lazy_timer = self.node.clock.call_later(self.linger, self._lazy_due)
            return
        self._lazy.discard(plog)
        if not self._stage_scheduled:
            asyncio.get_running_loop().call_soon(self._flush_staged)
        self._stage_scheduled.add(plog)

    def _lazy_due(self) -> None:
        """The timer: propose the logs whose oldest lazy op has waited ``ack_linger`` (each
        its full wait, as ``_release_due`` does for held writes), and re-arm for the rest."""
        self._lazy_timer = None
        now = self.node.clock.monotonic()
        due = {plog for plog in self._lazy if now - plog.lazy_since >= self.linger}
        if due:
            self._lazy -= due
            self._stage_scheduled |= due
            self._flush_staged()
        if self._lazy:
            wait = min(plog.lazy_since for plog in self._lazy) + self.linger - now
            self._lazy_timer = self.node.clock.call_later(max(0.001, wait), self._lazy_due)

    async def flush_lazy(self, timeout: float) -> None:
        """Propose every staged op now (lazy ones, and those waiting for an entry in flight
        to commit) and wait, at most ``timeout`` seconds, until their entries are committed
        or failed (a clean stop, so that the acks of its last ``ack_linger`` are not lost
        with it)."""
        if self._lazy_timer is not None:
            self._lazy_timer.cancel()
            self._lazy_timer = None
        lazy, self._lazy = self._lazy | self._deferred, set()
        self._deferred = set()
        if not lazy or self._broken:
            return  # (broken: nothing more is written; the waiters fail with the stop)
        # one more callback in each entry about to go: it runs once the entry commits or fails
        loop = asyncio.get_running_loop()
        settled: list[asyncio.Future[None]] = []
        def settle(fut: asyncio.Future[None]) -> Callback:
            return lambda _err: None if fut.done() else fut.set_result(None)

        for plog in lazy:
            if plog.staged_cbs:
                settled.append(loop.create_future())
                plog.staged_cbs.append(settle(settled[-1]))
        self._stage_scheduled |= lazy
        self._flush_staged(force=True)
        try:
            async with asyncio.timeout(timeout):
                await asyncio.gather(*settled)
        except TimeoutError:
            log.warning("stopping with acks not yet committed on %d partition(s): their messages "
                        "will be delivered again", sum(not f.done() for f in settled))

    def _undefer(self, plog: PartLog) -> None:
        """Schedule what ``plog`` holds back for its entry in flight, once it need wait no more."""
        if plog in self._deferred and not waits_for_commit(plog) and not plog.replica.handing_over:
            self._deferred.discard(plog)
            if not self._stage_scheduled:
                asyncio.get_running_loop().call_soon(self._flush_staged)
            self._stage_scheduled.add(plog)

    def _flush_staged(self, *, force: bool = False) -> None:
        """Propose what is staged, an entry per log; a log with an entry of its own in flight
        waits for its commit instead (MAX_UNCOMMITTED), unless ``force``."""
        plogs, self._stage_scheduled = self._stage_scheduled, set()
        for plog in plogs:
            if not plog.staged_cbs:
                continue
            if plog.replica.handing_over or (not force and waits_for_commit(plog)):
                # (handing over, failback: they go once it gives up, or fail with the step-down
                # that unloads the partition, never while it goes on serving: found in review)
                self._deferred.add(plog)
                continue
            self._deferred.discard(plog)
            ops, cbs = plog.staged_ops, plog.staged_cbs
            plog.staged_ops, plog.staged_cbs = [], []
            plog.staged_bytes = 0
            if self.logs.get(plog.key) is not plog:
                continue
            data, ops = encode_ops(ops)
            ready, entry = plog.replica.propose(data)
            if entry is None:
                err = NotActiveError(f"partition {plog.name} is not active on {self.me}")
                for cb in cbs:
                    cb(err)
            else:
                plog.waiters[entry.index] = (ops, cbs)
                plog.proposed_term = entry.term
                if any(isinstance(op, (Append, PutQueue, DropQueue)) for op in ops):
                    plog.must_sync.add(entry.index)
            self._guarded(plog, lambda: ready)

    def propose_catalogue(self, op: WriteOp, callback: Callback) -> None:
        plog = self.logs[CATALOGUE]
        if not plog.serving:
            callback(NotActiveError(f"the catalogue is not active on {self.me}"))
            return
        self.stage(plog, [op], callback)

    # -- who is active --------------------------------------------------------------------------------

    def catalogue_commit(self) -> int:
        """On the catalogue's active: how far the catalogue is committed (every change
        confirmed so far).  NotActiveError elsewhere: another member's answer could name
        entries a new active will truncate, which nobody would ever apply."""
        plog = self.logs[CATALOGUE]
        if not plog.serving:
            raise NotActiveError(f"the catalogue is not active on {self.me}")
        return plog.replica.commit

    def catalogue_applied(self) -> int:
        """How far the catalogue is applied here (queues declared and deleted)."""
        return self.logs[CATALOGUE].applied[0]

    def active_of(self, key: Key) -> str | None:
        """The node serving ``key`` as far as this node knows (None without node quorum)."""
        plog = self.logs.get(key)
        if plog is None or self._disabled():
            return None
        r = plog.replica
        if r.role is Role.LEADER:
            return self.me if plog.serving else None
        return r.leader

    async def wait_change(self, timeout: float) -> None:
        """Until a role or an active changes, or ``timeout``."""
        try:
            async with asyncio.timeout(timeout):
                await self.changed.wait()
        except TimeoutError:
            pass  # nothing changed: the caller looks again

    async def wait_active(self, key: Key, timeout: float) -> str:
        """The node serving ``key``, waiting up to ``timeout`` for an election."""
        if key not in self.logs:
            # not a replica of it (a group larger than the copies): ask one that is
            q = self.node.queue_by_id(key[0])
            peers = self.node.peers
            if q is not None and peers is not None and key[1] < q.meta.partitions:
                holders = place(self.policy, q.meta.partitions, self.members)[key[1]].nodes
                for n in holders:
                    if n in peers.links:
                        return n
            raise UnavailableError(f"partition {key[0]}/{key[1]}: no member holding it is reachable from {self.me}")
        try:
            async with asyncio.timeout(timeout):
                while True:
                    who = self.active_of(key)
                    if who is not None and (who != self.me or self.serving(key)):
                        return who
                    await self.changed.wait()
        except TimeoutError:
            raise UnavailableError(f"partition {key[0]}/{key[1]} has no active (waited {timeout:.1f} s): "
                                   f"too few nodes up for a quorum?") from None

    def partition_infos(self) -> list[PartitionInfo]:
        names = {q.meta.id: q.name for q in self.node.queues.values()}
        out = []
        for key in sorted(self.logs):
            plog = self.logs[key]
            r = plog.replica
            active = self.active_of(key) or ""
            state = plog.lifecycle.state.value if plog.lifecycle is not None else "Unavailable"
            progress = r.progress()
            replicas = []
            now = self.node.clock.monotonic()
            for n, kind in zip(plog.nodes.nodes, plog.nodes.kinds):
                if n == self.me:
                    continue
                match = progress.get(n, 0)
                lag = max(0, r.last_index - match) if progress else 0
                replicas.append(ReplicaInfo(n, kind.value, match, lag,
                                            self._lag_seconds(plog, match, now) if lag else 0.0))
            out.append(PartitionInfo("" if key == CATALOGUE else names.get(key[0], f"#{key[0]}"), key[1], state,
                                     r.role.value, active, r.term, r.commit, r.applied, r.last_index, replicas))
        return out

    @staticmethod
    def _lag_seconds(plog: PartLog, match: int, now: float) -> float:
        """How long ago the active wrote the first entry the replica lacks (0 if unknown)."""
        stamps = plog.appended_at
        if not stamps:
            return 0.0
        i = bisect.bisect_right(stamps, (match + 1, float("inf"))) - 1
        if i < 0:
            i = 0  # older than what is remembered: at least this old
        return round(max(0.0, now - stamps[i][1]), 3)

    # -- transport ------------------------------------------------------------------------------------

    def _send(self, key: Key, env: Envelope) -> None:
        msg = env.msg
        if isinstance(msg, InstallSnapshot) and msg.data is None:
            self._spawn(self._send_snapshot(key, env.dst, msg))
            return
        self._out.setdefault(env.dst, []).append([key[0], key[1], encode_message(msg)])
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    async def _send_snapshot(self, key: Key, dst: str, m: InstallSnapshot) -> None:
        if key == CATALOGUE:
            data = msgpack.packb([_meta_out(q.meta) for q in self.node.queues.values()], use_bin_type=True)
            pos = self.logs[key].applied
        else:
            plog = self.logs.get(key)
            if plog is not None:
                # a snapshot of the store as up to date as the log allows: what is held, and
                # what was released but not yet committed, first
                self._release_held(plog)
                await self.node.write([], sync=False)
            st = await asyncio.to_thread(self.node.engine.load_partition, *key)
            data = encode_snapshot(st)
            pos = st.applied
        log.info("partition %d/%d: sending a snapshot at index %d to %s", key[0], key[1], pos[0], dst)
        full = InstallSnapshot(m.term, m.leader, pos[0], pos[1], pos[2], data)
        self._out.setdefault(dst, []).append([key[0], key[1], encode_message(full)])
        self._flush()

    def _flush(self) -> None:
        self._flush_scheduled = False
        out, self._out = self._out, {}
        peers = self.node.peers
        if peers is None:
            return
        from client.protocol.frames import Replicate

        for dst, items in out.items():
            link = peers.links.get(dst)
            if link is not None:
                link.send(Replicate(payload=msgpack.packb(items, use_bin_type=True)))

    def receive(self, src: str, payload: bytes) -> None:
        """A Replicate frame from peer ``src``."""
        if self._broken:
            return
        now = self.node.clock.monotonic()
        for qid, p, raw in msgpack.unpackb(payload, raw=False):
            plog = self.logs.get((qid, p))
            if plog is None:
                continue  # a queue this node does not know yet (the catalogue entry is on its way)
            try:
                msg = decode_message(raw)
            except UnknownMessageKind as exc:
                # a newer build's (as Alive is to a node of the eleventh session's): said once
                if (src, repr(exc.kind)) not in self._unknown_kinds:  # (repr: a kind may be a list)
                    self._unknown_kinds.add((src, repr(exc.kind)))
                    log.warning("%s sends replication messages of kind %r, which this build does not know "
                                "(a newer build's?): dropped, and not logged again", src, exc.kind)
                continue
            except (ValueError, TypeError, IndexError) as exc:
                log.warning("bad replication message from %s for %d/%d dropped: %r", src, qid, p, exc)
                continue
            r = plog.replica
            if now - r.now > 0.01:  # the core's clock moves only in tick()
                self._guarded(plog, lambda: r.tick(now))
            self._guarded(plog, lambda: plog.replica.step(Envelope(src, self.me, msg)))
