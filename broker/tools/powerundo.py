"""powerfs's model of a disk that loses power: each file's way back to its last fsync
(:class:`Undo`), and what a power cut leaves of the writes made since: none of them, a prefix
of them cut at a sector (a torn write), or any subset of their sectors (reordered writes).

A disk writes whole :data:`SECTOR`\\ s; what it had not written when the power went is lost.
Below the file's synced size a sector lost keeps its old bytes; past it, the file ends at the
last sector written, and a sector lost before that reads as zeros (an extent the file system
allotted and the data never reached, as ext4 and XFS give it back)."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator

#: the unit a torn write keeps whole: what a disk writes at once
SECTOR = 512


class Undo:
    """One file's way back to its last fsync: the size then, and the old bytes of the
    ranges overwritten since (sorted, disjoint, all below that size)."""

    __slots__ = ("size", "saved")

    def __init__(self, size: int) -> None:
        self.size = size
        self.saved: list[tuple[int, bytes]] = []

    def keep(self, fd: int, start: int, end: int) -> None:
        """Save the bytes of [start, end) below the synced size that are not saved yet."""
        end = min(end, self.size)
        if start >= end:
            return
        out: list[tuple[int, bytes]] = []
        pos = start
        for s, data in self.saved:
            e = s + len(data)
            if e <= pos or s >= end:
                out.append((s, data))
                continue
            if s > pos:
                out.append((pos, os.pread(fd, s - pos, pos)))
            out.append((s, data))
            pos = max(pos, e)
        if pos < end:
            out.append((pos, os.pread(fd, end - pos, pos)))
        out.sort(key=lambda r: r[0])
        merged: list[tuple[int, bytes]] = []
        for s, data in out:
            if merged and merged[-1][0] + len(merged[-1][1]) == s:
                merged[-1] = (merged[-1][0], merged[-1][1] + data)
            else:
                merged.append((s, data))
        self.saved = merged

    def restore(self, path: str, rng: random.Random | None = None, *, reorder: bool = False) -> tuple[int, int]:
        """Put the file at ``path`` back; how many bytes that changed, and how many written past
        its synced size were kept.

        With ``rng`` a torn write: of what was written past the synced size, a prefix the disk
        had already written is kept, cut at a random :data:`SECTOR` boundary (the bytes below
        the synced size are put back all the same).  With ``reorder`` too, the disk wrote the
        sectors in an order of its own: each sector written since the last fsync, past the synced
        size or over it, is kept or lost on its own (even odds, drawn from ``rng``)."""
        fd = os.open(path, os.O_RDWR)
        try:
            now = os.fstat(fd).st_size
            if rng is not None and reorder:
                return self._reordered(fd, now, rng)
            keep = 0
            if rng is not None and now > self.size:
                cut = self.size + rng.randrange(now - self.size + 1)
                keep = max(self.size, cut - cut % SECTOR) - self.size
            changed = max(0, now - self.size - keep)
            os.ftruncate(fd, self.size + keep)
            for s, data in self.saved:
                os.pwrite(fd, data, s)
                changed += len(data)
            return changed, keep
        finally:
            os.close(fd)

    def _reordered(self, fd: int, now: int, rng: random.Random) -> tuple[int, int]:
        """:meth:`restore` of a disk that wrote the sectors since the last fsync in its own order."""
        changed = 0
        for s, data in self.saved:  # (below the synced size: a sector lost keeps its old bytes)
            for a, b in _sectors(s, s + len(data)):
                if rng.random() < 0.5:
                    os.pwrite(fd, data[a - s:b - s], a)
                    changed += b - a
        tail = os.pread(fd, now - self.size, self.size) if now > self.size else b""
        kept = [(a, b) for a, b in _sectors(self.size, now) if rng.random() < 0.5]
        end = kept[-1][1] if kept else self.size
        os.ftruncate(fd, self.size)  # (and back out to the last sector kept: the ones lost read as zeros)
        os.ftruncate(fd, end)
        for a, b in kept:
            os.pwrite(fd, tail[a - self.size:b - self.size], a)
        written = sum(b - a for a, b in kept)
        return changed + len(tail) - written, written


def _sectors(start: int, end: int) -> Iterator[tuple[int, int]]:
    """[start, end) in the pieces the disk's sectors cut it into."""
    pos = start
    while pos < end:
        nxt = min(end, (pos // SECTOR + 1) * SECTOR)
        yield pos, nxt
        pos = nxt
