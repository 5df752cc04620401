"""What replicas of a partition say to each other, and what the core asks its driver to do.

Pure values: the election/replication core (:mod:`ha.replica`) takes these in
and hands these out; ``broker/`` turns them into peer-link frames and disk
writes.  Nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ha.members import Members


@dataclass(frozen=True, slots=True)
class Entry:
    """One log entry, stamped (term, index).  ``data`` None is the no-op a new active
    appends to commit what earlier terms left uncommitted.

    ``origin`` is the active that wrote it: under a weak override two actives can
    share a term, and (term, origin) still tells their entries apart.  ``weak``
    marks entries written by an active that needed fewer than a majority; they
    do not make a log "more recent" in an election, so on healing the majority
    side's log wins and the weak entries are truncated (HA-1014).
    """

    term: int
    index: int
    data: Any = None
    origin: str = ""
    weak: bool = False


@dataclass(frozen=True, slots=True)
class RequestVote:
    """A candidate's bid for votes in ``term``.  ``pre``: a pre-vote (Raft's, thesis 9.6):
    would the voter vote for it in ``term``?  Asked before the candidate raises its own
    term; the voter answers without taking up ``term`` or casting a vote."""

    term: int
    candidate: str
    last_index: int
    last_term: int
    priority: int
    pre: bool = False


@dataclass(frozen=True, slots=True)
class VoteReply:
    """``pre``: the answer to a pre-vote; granted, it carries the term asked about, refused,
    the voter's own."""

    term: int
    voter: str
    granted: bool
    pre: bool = False


@dataclass(frozen=True, slots=True)
class AppendEntries:
    """From the active: entries after (prev_index, prev_term), and its commit index.
    Empty ``entries`` is the keep-alive."""

    term: int
    leader: str
    prev_index: int
    prev_term: int
    prev_origin: str
    entries: tuple[Entry, ...]
    commit: int


@dataclass(frozen=True, slots=True)
class AppendReply:
    term: int
    replica: str
    success: bool
    match_index: int  # success: last index now known to match; failure: a hint where to retry


@dataclass(frozen=True, slots=True)
class InstallSnapshot:
    """From the active to a replica that needs entries the active has compacted away:
    the partition's applied state as of ``index``.  The core emits it with
    ``index`` 0 and ``data`` None; the driver fills in the position and the state it
    has applied (it alone knows exactly what that is) before sending."""

    term: int
    leader: str
    index: int = 0
    last_term: int = 0
    last_origin: str = ""
    data: Any = None
    #: the partition's members as of ``index`` (:mod:`ha.members`); the driver fills it in
    #: with :meth:`ha.replica.Replica.members_at` (None: the receiver keeps its own)
    members: Members | None = None
    #: the state ends in entries a weak active wrote that no majority is known to hold: a
    #: replica whose log a majority wrote refuses it (Replica._on_snapshot), as it refuses
    #: such entries
    weak: bool = False


@dataclass(frozen=True, slots=True)
class TimeoutNow:
    """From the active to the partition's preferred node, caught up: stand now (Raft's
    leadership transfer, used for failback).  The active takes no writes meanwhile."""

    term: int
    leader: str
    rank: int  # the active's (ReplicaConfig.rank): the node stands only if its own is higher


@dataclass(frozen=True, slots=True)
class Alive:
    """From a replica whose replies to the active wait for its disk: it is up and follows
    ``term``.  The active counts it as word from the replica when it checks that it still
    hears from a quorum, never toward a commit (a reply promises what is on disk; this
    promises nothing)."""

    term: int
    replica: str


Message = RequestVote | VoteReply | AppendEntries | AppendReply | InstallSnapshot | TimeoutNow | Alive


@dataclass(frozen=True, slots=True)
class SnapshotChunk:
    """Part ``seq`` (from 0) of a snapshot the active streams to a replica, its messages
    (``data``: the driver's encoding) before the :class:`InstallSnapshot` that ends the
    stream, for the snapshot of the state as of ``index``.  The drivers carry it (each
    part is written as it arrives); the core never sees one."""

    term: int
    leader: str
    index: int
    seq: int
    data: bytes
    #: the snapshot is weak (InstallSnapshot.weak): a replica whose log a majority wrote
    #: refuses the stream at its first part, before it would start the partition over
    weak: bool = False


@dataclass(frozen=True, slots=True)
class SnapshotAck:
    """From the replica taking a streamed snapshot: part ``seq`` of the one as of ``index`` is
    written.  The active keeps at most a few parts ahead of it (the replica's writes, not
    its memory, set the pace).  Drivers only, like :class:`SnapshotChunk`."""

    term: int
    replica: str
    index: int
    seq: int


@dataclass(frozen=True, slots=True)
class Envelope:
    src: str
    dst: str
    msg: Message


@dataclass(frozen=True, slots=True)
class HardState:
    """What must be on disk before any message of the same Ready is sent.  ``commit``
    rides along so a restarted replica knows what it had confirmed (HA-1014 counts)."""

    term: int
    voted_for: str | None
    commit: int = 0


# -- events for operators ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RoleChanged:
    node: str
    term: int
    old: str
    new: str
    reason: str


@dataclass(frozen=True, slots=True)
class EntriesDiscarded:
    """HA-1014: entries this replica had and the group's active does not, discarded on
    rejoin (truncated, or replaced by a snapshot).

    ``committed`` of them (the first ones: ``payloads[:committed]``) this node had counted
    as committed: confirmed to their clients, and lost.  That happens when the active was
    elected under a weak override (``weak`` of them were written by such an active), or
    when a majority lost unsynced writes (every node's power cut under a weak
    ``remote_sync``) and elected one of itself.  With ``upto`` the entries were replaced by
    a snapshot that does not say which of them it holds: ``committed`` is then at most what
    was lost (those of a term after the snapshot's are lost for certain: ``certain``).

    With ``compacted`` the active's log differs from what this node had compacted already
    (entries a weak active wrote past what the driver keeps of them): the first entry
    counted is this node's snapshot's last (its payload unknown, None), and an unknown number
    before it went too, neither counted nor kept.  The driver rebuilds the partition from
    the active."""

    node: str
    term: int
    first_index: int
    count: int
    committed: int = 0
    code: str = "HA-1014"
    payloads: tuple[bytes | None, ...] = ()  # the discarded entries' data (the driver counts messages)
    weak: int = 0
    upto: bool = False
    certain: int = 0
    compacted: bool = False
    #: who wrote each discarded entry, in which term: ``(origin, term)`` beside ``payloads``
    #: (two nodes that discard the same entries discard the same writes)
    written: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class HandingOver:
    """Failback: the active asked ``to`` (the placement's choice, back and caught up) to
    take the partition over, and takes no writes until it has or ``ReplicaConfig.election_timeout``
    has passed."""

    node: str
    term: int
    to: str
    drained: bool = False  # the active's node is drained (tandem node drain), not a failback


@dataclass(frozen=True, slots=True)
class ReplicaWentBack:
    """``replica`` answered the active that its log ends at ``ends``, before ``acknowledged``,
    which it had acknowledged holding in this term: it lost entries it had written (a disk that
    answered an fsync without syncing, a data directory restored from an older copy).  The
    active no longer counts them as on it, and sends them again."""

    node: str
    term: int
    replica: str
    acknowledged: int
    ends: int


Event = RoleChanged | EntriesDiscarded | HandingOver | ReplicaWentBack


@dataclass(slots=True)
class Ready:
    """What one call into the core asks of its driver, in this order: install
    ``snapshot`` (replacing the partition's applied state), persist ``hard_state``
    and the log change (truncate at ``truncate_from``, then append ``append``),
    apply ``committed`` in order, send ``messages``, report ``events``.  When the
    log write is durable, tell the core with :meth:`ha.replica.Replica.persisted`.

    Messages of a replica that is not active must wait for the write (a vote or an
    append reply promises what is on disk); the active may send its appends while
    its own write is in flight, since it counts itself only once persisted."""

    snapshot: InstallSnapshot | None = None
    hard_state: HardState | None = None
    truncate_from: int | None = None
    append: list[Entry] = field(default_factory=list)
    messages: list[Envelope] = field(default_factory=list)
    committed: list[Entry] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    #: the partition's members changed (an entry of :mod:`ha.members` appended or truncated,
    #: or a snapshot's): whom the driver links and sends to
    members: Members | None = None
