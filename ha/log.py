"""A replica's log as the election and replication core sees it: the position of the
last entry compacted away (the snapshot: index, term, origin) and the entries after it.

Pure bookkeeping: what is on disk is the driver's business (it is told through
:class:`~ha.messages.Ready`); the core keeps only what it needs to answer and compare.
"""

from __future__ import annotations

from ha.messages import Entry


class EntryLog:
    """``entries[i]`` has index ``snap_index + i + 1``."""

    __slots__ = ("entries", "snap_index", "snap_term", "snap_origin", "snap_weak", "snap_recency")

    def __init__(self, snapshot: tuple[int, int, str], entries: list[Entry]) -> None:
        self.snap_index, self.snap_term, self.snap_origin = snapshot
        #: the snapshot ends in an entry a weak active wrote (compacted past the driver's bound
        #: of such entries, unless a strong one follows in the log), and the position of its
        #: last entry written under a real quorum, what elections compare (:meth:`recency`); the
        #: store keeps both with the snapshot (storage.base.LogCompact, :meth:`mark`)
        self.snap_weak = False
        self.snap_recency = (self.snap_term, self.snap_index)
        self.entries = list(entries)
        if self.entries and self.entries[0].index != self.snap_index + 1:
            raise ValueError(f"log starts at {self.entries[0].index}, snapshot ends at {self.snap_index}")

    def mark(self) -> tuple[bool, tuple[int, int]]:
        """The snapshot's weak mark and recency, as the store keeps them (a strong snapshot's
        recency is its own position)."""
        return self.snap_weak, self.snap_recency

    def set_mark(self, weak: bool, recency: tuple[int, int]) -> None:
        """The mark a store kept (:meth:`mark`; a store without one: strong)."""
        self.snap_weak = weak
        self.snap_recency = recency if weak else (self.snap_term, self.snap_index)

    @property
    def last_index(self) -> int:
        return self.snap_index + len(self.entries)

    def entry(self, index: int) -> Entry:
        return self.entries[index - self.snap_index - 1]

    def slice(self, first: int, last: int) -> list[Entry]:
        """Entries first..last (inclusive) still in the log."""
        lo = max(first, self.snap_index + 1) - self.snap_index - 1
        return self.entries[lo:max(lo, last - self.snap_index)]

    def batch(self, first: int, count: int, max_bytes: int) -> tuple[Entry, ...]:
        """Up to ``count`` entries from ``first`` on, and at most ``max_bytes`` of entry data
        (0: no limit; one entry always goes): a replica catching up on big entries gets
        frames of a bounded size."""
        entries = tuple(self.slice(first, first + count - 1))
        if max_bytes and len(entries) > 1:
            total = 0
            for k, e in enumerate(entries):
                total += len(e.data) if e.data is not None else 0
                if total > max_bytes and k:
                    return entries[:k]
        return entries

    def term_at(self, index: int) -> int:
        if index == self.snap_index:
            return self.snap_term
        return self.entry(index).term if self.snap_index < index <= self.last_index else 0

    def origin_at(self, index: int) -> str:
        if index == self.snap_index:
            return self.snap_origin
        return self.entry(index).origin if self.snap_index < index <= self.last_index else ""

    def has(self, index: int, term: int, origin: str) -> bool:
        """Whether the entry at ``index`` (or the snapshot's position) is (term, origin)."""
        return index <= self.last_index and self.term_at(index) == term and self.origin_at(index) == origin

    def recency(self) -> tuple[int, int]:
        """(term, index) of the last entry written under a real quorum: what elections compare."""
        for e in reversed(self.entries):
            if not e.weak:
                return e.term, e.index
        return self.snap_recency  # (compacted: as of the snapshot)

    def compact(self, upto: int) -> None:
        """Forget the entries up to ``upto`` (in the log): they become the snapshot."""
        last = self.entry(upto)
        strong = next((e for e in reversed(self.entries[:upto - self.snap_index]) if not e.weak), None)
        if strong is not None:
            self.snap_recency = (strong.term, strong.index)
        self.snap_weak = last.weak
        del self.entries[:upto - self.snap_index]
        self.snap_index, self.snap_term, self.snap_origin = upto, last.term, last.origin

    def truncate(self, index: int) -> list[Entry]:
        """Drop the entries from ``index`` on; the dropped ones."""
        dropped = self.entries[index - self.snap_index - 1:]
        del self.entries[index - self.snap_index - 1:]
        return dropped

    def install(self, index: int, term: int, origin: str, *, keep: bool, weak: bool = False) -> list[Entry]:
        """A snapshot at (index, term, origin) replaces the log up to ``index``; with
        ``keep`` the entries after it stay (they match the sender's), otherwise every entry
        goes.  The dropped entries after ``index``."""
        if keep:
            dropped: list[Entry] = []
            del self.entries[:index - self.snap_index]
        else:
            dropped = self.entries[max(0, index - self.snap_index):]
            self.entries = []
        self.snap_index, self.snap_term, self.snap_origin = index, term, origin
        self.snap_weak, self.snap_recency = weak, ((term, index) if not weak else self.snap_recency)
        return dropped
