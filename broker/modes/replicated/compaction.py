"""Where a partition's log is compacted: how much of the applied log is kept, and why.

Applied entries are deleted from the log ``KEEP_ENTRIES`` (at most ``KEEP_BYTES``)
behind; a replica that needs older ones gets a snapshot.  The active keeps more for a
replica that answers and still lacks them (up to ``HOLD_BYTES``): sending it entries is
cheaper than a snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass

from ha.replica import Replica

KEEP_ENTRIES = 1000  # applied entries kept in the log for replicas that fall a little behind
COMPACT_EVERY = 4000  # compact when this many applied entries have piled up
# ... and by size, as entries of big batches are big (256 x 1 KiB messages: 4,000 entries
# would be a gigabyte of log on disk and in memory per partition)
KEEP_BYTES = 8 * 1024 * 1024  # at most this much of applied entries kept
COMPACT_BYTES = 24 * 1024 * 1024  # compact when applied entries not compacted reach this (more than kept)
# ... but the active keeps what a replica that is answering still lacks, up to this much
# (beyond it, that replica gets a snapshot)
HOLD_BYTES = 256 * 1024 * 1024

#: entries a weak active wrote that no majority is known to hold are kept in the log
#: (Replica.compactable): on a heal against another active they are discarded (HA-1014) and
#: their messages go to the quarantine.  The active takes no publish for the partition that
#: would take them past this much by default (NodeConfig.weak_hold_bytes; WeakHold: clients
#: are told to retry); what else it writes there (acks, deliveries) goes on.  Only past
#: WEAK_COMPACT_FACTOR times as much are they compacted (the log says so when it happens),
#: and a heal finds the log different there and reports them lost, not kept
#: (Replica._diverged_below_snapshot)
WEAK_HOLD_BYTES = 256 * 1024 * 1024
WEAK_COMPACT_FACTOR = 2


def entry_bytes(r: Replica, first: int, last: int) -> int:
    """Bytes of the entries ``first..last`` the core's log still holds (those compacted count
    nothing: a replica that lacks them gets a snapshot)."""
    return sum(len(r.entry(i).data or b"") for i in range(max(first, r.snap_index + 1), last + 1))


def weak_bytes(r: Replica) -> int:
    """Bytes of the applied entries a weak active wrote that no majority is known to hold."""
    keep = r.compactable()
    return entry_bytes(r, keep + 1, r.applied) if keep < r.applied else 0


def weak_cap(r: Replica, hold: int = WEAK_HOLD_BYTES) -> tuple[int, bool]:
    """(how far the log may be compacted, whether that passes entries of a weak active no
    majority is known to hold: more than WEAK_COMPACT_FACTOR x ``hold`` bytes of them,
    ``hold`` being the node's weak_hold_bytes)."""
    keep = r.compactable()
    if keep >= r.applied:
        return r.applied, False
    if entry_bytes(r, keep + 1, r.applied) <= WEAK_COMPACT_FACTOR * hold:
        return keep, False
    return r.applied, True


@dataclass(slots=True)
class WeakHold:
    """Whether a publish of ``adding`` bytes would take what a partition's log holds of
    writes under a weak override that no majority is known to hold past ``hold`` (its active
    refuses it then; Replica.compactable says which they are).  Once a majority holds them
    (its peers back and caught up) they count no more.  Asked at every publish: O(voters)
    unless the applied log ends in such entries and, with the publish, reaches ``hold``; the
    entries are counted again only once the applied bytes moved by a 32nd of ``hold`` since
    the last count (about 32 entries looked at per entry written), so a count may lag by that
    much."""

    hold: int
    counted_at: int = -1  # the applied bytes at the last count
    weak: int = 0  # what it counted

    def reached(self, r: Replica, applied_bytes: int, adding: int) -> bool:
        if applied_bytes + adding <= self.hold or not r.unheld_tail():
            return False
        if self.counted_at < 0 or abs(applied_bytes - self.counted_at) >= max(1, self.hold // 32):
            self.counted_at, self.weak = applied_bytes, weak_bytes(r)
        return self.weak + adding > self.hold


def still_needed(r: Replica, streamed: int | None) -> int | None:
    """On the active: the entries after this index are still wanted, by a replica that answers
    and lacks them, or by one a snapshot as of ``streamed`` went to (None: by none)."""
    need = r.live_match()
    if streamed is None:
        return need
    return streamed if need is None else min(need, streamed)


def compact_upto(r: Replica, streamed: int | None = None, hold: int = WEAK_HOLD_BYTES) -> tuple[int, int]:
    """Where to compact, and the bytes of applied entries kept: the last KEEP_ENTRIES
    applied entries, or fewer if they hold more than KEEP_BYTES; on the active also
    every entry a replica that answers still lacks, or that a snapshot streamed to a replica
    is followed by (``streamed``: its index), up to HOLD_BYTES."""
    need = still_needed(r, streamed)  # entries after it are still wanted
    top, _past = weak_cap(r, hold)
    i, kept = r.applied, 0
    floor = max(r.snap_index, r.applied - KEEP_ENTRIES)
    while i > r.snap_index:
        size = len(r.entry(i).data or b"")
        if not ((i > floor and kept + size <= KEEP_BYTES)
                or (need is not None and i > need and kept + size <= HOLD_BYTES)):
            break
        kept += size
        i -= 1
    while i > top:  # (entries a weak active wrote stay: weak_cap)
        kept += len(r.entry(i).data or b"")
        i -= 1
    return i, kept
