"""Quorum counting for a partition's core, pure (etcd-raft's ``quorum/``).

Which entry the voters' copies commit, what a majority of them holds, whether an active's
quorum is lowered or its writes weak, and how far a log with weak entries may be compacted.

The counts per member (who answered when, who holds what) are the active's
:class:`~ha.progress.PeerTracker`; the numbers they are held against are
:meth:`ha.replica_config.ReplicaConfig.quorum` (elect, commit) and ``majority``.

A *weak* active is one elected under a lowered quorum (``quorum_override``,
``designated_primary``) that has not heard from a majority of voters within the election
timeout: the entries it writes are flagged ``weak``, and a heal against a majority may
discard them (HA-1014).  The rules below keep such entries in the log until a majority is
known to hold them, so that they can still be compared with the active's log and handed
to the quarantine.
"""

from __future__ import annotations

from ha.log import EntryLog
from ha.progress import PeerTracker
from ha.replica_config import ReplicaConfig


def weak_active(cfg: ReplicaConfig, tracker: PeerTracker, me: str, now: float) -> bool:
    """The active ``me``'s writes are not backed by a majority: it needs fewer votes than a
    majority (override, designated primary) *and* has not heard from a majority of voters
    within the election timeout.  With its peers connected, an override active writes
    strong entries like any other."""
    majority = cfg.majority
    if cfg.quorum() >= majority:
        return False
    return tracker.acked_voters(cfg.voters, me, now, cfg.election_timeout) < majority


def lowered(cfg: ReplicaConfig) -> bool:
    """An active under these settings needs fewer voters than a majority (override,
    designated primary), and no outside arbiter decides who writes."""
    return not cfg.arbitrated and cfg.quorum() < cfg.majority


def counted_voters(cfg: ReplicaConfig, witness_counts: bool) -> tuple[str, ...]:
    """The voters whose copies a commit counts (a witness only while it counts:
    :func:`ha.witness.counts`)."""
    if cfg.witnesses and not witness_counts:
        return tuple(v for v in cfg.voters if v not in cfg.witnesses)
    return cfg.voters


def majority_holds(cfg: ReplicaConfig, voters: tuple[str, ...], me: str, persisted: int,
                   tracker: PeerTracker) -> int:
    """On the active ``me`` (whose disk has entries up to ``persisted``): the last entry a
    majority of ``voters`` is known to hold (counted as its commits are; with it, by log
    matching, every entry before it)."""
    marks = sorted(persisted if v == me else tracker.match.get(v, 0) for v in voters)
    return marks[len(marks) - cfg.majority] if len(marks) >= cfg.majority else 0


def commit_index(cfg: ReplicaConfig, voters: tuple[str, ...], me: str, tracker: PeerTracker, log: EntryLog,
                 term: int, persisted: int, commit: int) -> int:
    """On the active ``me`` of ``term``: the commit index its voters' copies make, at least
    ``commit``.  Its own write is part of every commit (a confirmed entry is on its disk,
    fsynced under SYNC: up to ``persisted``), and with it ``commit_quorum`` or a quorum of
    ``voters``.  Only entries of its own term commit by counting (Raft 5.4.2)."""
    need = cfg.commit_quorum or cfg.quorum()
    for n in range(min(log.last_index, persisted), commit, -1):
        if log.term_at(n) != term:
            break
        if tracker.holding(voters, me, persisted, n) >= need:
            return n
    return commit


def compactable(log: EntryLog, applied: int, *, arbitrated: bool, held: int | None, term_first: int) -> int:
    """How far a log applied up to ``applied`` may be compacted: not past an entry a weak
    active wrote that a majority is not known to hold.  ``held`` is, on an active under a
    lowered quorum (:func:`lowered`), what a majority holds (:func:`majority_holds`), None
    elsewhere: such an active counts that for the entries of its own term (from
    ``term_first``, its no-op) rather than their flags.  It flags them weak only once it has
    not heard from a majority within the election timeout, so those it wrote just after its
    peers went are flagged strong and yet committed by it alone.  Such an entry may yet be
    discarded when the group heals (HA-1014), and a compacted entry can be neither compared
    with the active's log nor handed to the quarantine: it stays until a committed entry of
    a strong active follows it (that active's majority holds the log before it too) or it
    is discarded."""
    if arbitrated:
        return applied  # (a lock decides the one writer: no heal discards the holder's entries)
    if held is not None:
        if held >= applied:
            return applied
        return max(held, _flagged(log, min(applied, term_first - 1)))
    return _flagged(log, applied)


def _flagged(log: EntryLog, upto: int) -> int:
    """``compactable`` by the weak flags of the entries up to ``upto``: not past one that
    no strong entry follows."""
    for e in reversed(log.slice(log.snap_index + 1, upto)):
        if not e.weak:
            return upto
        upto = e.index - 1
    return upto


def unheld_tail(log: EntryLog, applied: int, *, arbitrated: bool, held: int | None, term_first: int) -> bool:
    """Whether the applied log ends in entries no majority is known to hold (what
    :func:`compactable` keeps; ``held`` as there): O(voters)."""
    if arbitrated or applied <= log.snap_index:
        return False
    if held is not None:
        if held >= applied:
            return False
        if applied >= term_first:
            return True
    return log.entry(applied).weak


def state_weak(log: EntryLog, applied: int, *, arbitrated: bool) -> bool:
    """Whether the state applied up to ``applied`` ends in entries a weak active wrote that
    no majority is known to hold (what a snapshot of it carries: InstallSnapshot.weak)."""
    if arbitrated:
        return False
    if applied > log.snap_index:
        return log.entry(applied).weak
    return log.snap_weak


def refuses_weak_snapshot(log: EntryLog, commit: int, *, arbitrated: bool) -> bool:
    """Whether a snapshot of a weak active's state (InstallSnapshot.weak) would replace
    committed entries (up to ``commit``) a strong active wrote in ``log`` (a majority has
    them)."""
    if arbitrated:
        return False
    if any(not e.weak for e in log.slice(log.snap_index + 1, commit)):
        return True
    return log.snap_index > 0 and not log.snap_weak
