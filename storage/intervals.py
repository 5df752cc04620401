"""Half-open integer ranges, merged (the settled offsets of a partition), and the
index of a partition's log chunks built on them.

Pure data structures, no I/O; the SQLite engine keeps one ChunkIndex per
partition to know when a whole chunk of the log is settled and can be deleted.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator


def ranges_of(offsets: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted, merged half-open ranges covering ``offsets``: [3,4,5,9] -> [(3,6),(9,10)]."""
    ordered = sorted(offsets)
    if not ordered:
        return []
    if ordered[-1] - ordered[0] + 1 == len(ordered) == len(set(ordered)):
        return [(ordered[0], ordered[-1] + 1)]  # the common case: one run (acks in order)
    out: list[tuple[int, int]] = []
    start = end = None
    for o in ordered:
        if end is not None and o == end:
            end += 1
        elif end is not None and o < end:
            continue  # duplicate
        else:
            if start is not None and end is not None:
                out.append((start, end))
            start, end = o, o + 1
    if start is not None and end is not None:
        out.append((start, end))
    return out


class IntervalSet:
    """Disjoint, non-adjacent [start, end) ranges kept sorted."""

    __slots__ = ("_starts", "_ends")

    def __init__(self, ranges: Iterable[tuple[int, int]] = ()) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        for s, e in ranges:
            self.add(s, e)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(zip(self._starts, self._ends))

    def __len__(self) -> int:
        return len(self._starts)

    def add(self, start: int, end: int) -> None:
        if end <= start:
            return
        starts, ends = self._starts, self._ends
        # first range that could touch [start, end): its end >= start
        i = bisect.bisect_left(ends, start)
        j = i
        while j < len(starts) and starts[j] <= end:
            start = min(start, starts[j])
            end = max(end, ends[j])
            j += 1
        starts[i:j] = [start]
        ends[i:j] = [end]

    def covers(self, start: int, end: int) -> bool:
        """True if every offset of [start, end) is in the set."""
        if end <= start:
            return True
        i = bisect.bisect_right(self._starts, start) - 1
        return i >= 0 and self._ends[i] >= end

    def contains(self, offset: int) -> bool:
        return self.covers(offset, offset + 1)

    def count_in(self, start: int, end: int) -> int:
        """How many offsets of [start, end) are in the set."""
        n = 0
        i = max(0, bisect.bisect_right(self._ends, start))
        starts, ends = self._starts, self._ends
        while i < len(starts) and starts[i] < end:
            n += max(0, min(end, ends[i]) - max(start, starts[i]))
            i += 1
        return n

    def drop_below(self, low: int) -> None:
        """Forget everything below ``low``."""
        i = bisect.bisect_right(self._ends, low)
        del self._starts[:i]
        del self._ends[:i]
        if self._starts and self._starts[0] < low:
            self._starts[0] = low


class ChunkIndex:
    """A partition's live log chunks (start, count) and its settled ranges: enough to
    tell when a chunk is wholly settled and can be deleted."""

    __slots__ = ("starts", "counts", "settled")

    def __init__(self) -> None:
        self.starts: list[int] = []  # sorted chunk starts
        self.counts: dict[int, int] = {}
        self.settled = IntervalSet()

    def add_chunk(self, start: int, count: int) -> None:
        if not self.starts or start > self.starts[-1]:
            self.starts.append(start)
        else:
            bisect.insort(self.starts, start)
        self.counts[start] = count

    def settled_chunks(self, start: int, end: int) -> list[int]:
        """Starts of live chunks overlapping [start, end) that are now wholly settled."""
        starts = self.starts
        i = max(0, bisect.bisect_right(starts, start) - 1)
        done = []
        while i < len(starts) and starts[i] < end:
            s = starts[i]
            if self.settled.covers(s, s + self.counts[s]):
                done.append(s)
            i += 1
        return done

    def drop_chunk(self, start: int) -> None:
        i = bisect.bisect_left(self.starts, start)
        if i < len(self.starts) and self.starts[i] == start:
            del self.starts[i]
        self.counts.pop(start, None)

    def low(self, default: int) -> int:
        """Offsets below this are in no live chunk."""
        return self.starts[0] if self.starts else default
