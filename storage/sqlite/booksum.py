"""The sum of a partition's bookkeeping rows: its settlements (``settled``) and delivery counts
(``counts``), which its digest covers from feature level :data:`LEVEL`.

Each of those rows carries its own checksum (storage.sqlite.rowsums), which a lost write to the
store's file passes: a page that kept its older rows leaves a settled range missing (a message
acknowledged would be delivered again) or a delivery count one write old (a message would be
delivered more times than its queue's ``max_deliveries`` before it is dead-lettered). From
:data:`LEVEL` a partition's digest (its row of ``partitions``) also XORs in the sum, modulo
2^63, of a 63-bit hash of each such row (:func:`settled_hash`, :func:`count_hash`): a sum, not
an XOR, because ``settled`` may hold the same range twice and two equal hashes would cancel.

The writer keeps each partition's rows in memory (:class:`Books`), as the store holds them, and
moves the sum with each row it writes or deletes, in the same transaction; the store's open and
``tandem scrub`` sum the rows up again (:func:`summed`).
"""

from __future__ import annotations

import hashlib
import heapq
import struct
from collections.abc import Callable, Iterable
from typing import Any

from storage.sqlite.schema import Key

#: the feature level from which a partition's digest covers its settled ranges and delivery counts
LEVEL = 12

#: a query: SQL -> rows
Query = Callable[[str], Iterable[Any]]

_MASK = (1 << 63) - 1
_SETTLED = 'SELECT queue_id, partition, start, "end" FROM settled'
_COUNTS = 'SELECT queue_id, partition, "offset", dc FROM counts'
_PAIR = struct.Struct("<qq")


def settled_hash(start: int, end: int) -> int:
    """What a settled range [start, end) adds to its partition's sum: 63 bits of BLAKE2b of the two
    as little-endian int64s (personalized apart from the digest's other hashes)."""
    return int.from_bytes(hashlib.blake2b(_PAIR.pack(start, end), digest_size=8, person=b"tandem.settled").digest(),
                          "little") >> 1


def count_hash(offset: int, dc: int) -> int:
    """What a delivery count adds to its partition's sum (personalized apart from the others)."""
    return int.from_bytes(hashlib.blake2b(_PAIR.pack(offset, dc), digest_size=8, person=b"tandem.counts").digest(),
                          "little") >> 1


def summed(query: Query) -> dict[Key, int]:
    """Each partition's sum as its stored rows make it (the store's open, ``tandem scrub``)."""
    out: dict[Key, int] = {}
    for qid, p, start, end in query(_SETTLED):
        out[(qid, p)] = (out.get((qid, p), 0) + settled_hash(start, end)) & _MASK
    for qid, p, offset, dc in query(_COUNTS):
        out[(qid, p)] = (out.get((qid, p), 0) + count_hash(offset, dc)) & _MASK
    return out


class Books:
    """The writer's copy of each partition's settled ranges (a heap by end, as the store deletes
    them) and delivery counts, and their sums (:meth:`sum`).  Each method says what a statement
    the writer runs did to the rows, and names the partitions whose sum it moved in ``moved``."""

    def __init__(self) -> None:
        self.settled: dict[Key, list[tuple[int, int]]] = {}  # (end, start)
        self.counts: dict[Key, dict[int, int]] = {}
        self.sums: dict[Key, int] = {}
        self.moved: set[Key] = set()

    def load(self, query: Query) -> None:
        """The rows as the store holds them (on open, or after a failed commit)."""
        self.settled, self.counts, self.sums = {}, {}, {}
        for qid, p, start, end in query(_SETTLED):
            self.settle((qid, p), [(start, end)])
        for qid, p, offset, dc in query(_COUNTS):
            self.count((qid, p), offset, dc)
        self.moved.clear()

    def sum(self, key: Key) -> int:
        return self.sums.get(key, 0)

    def _add(self, key: Key, h: int) -> None:
        self.sums[key] = (self.sums.get(key, 0) + h) & _MASK
        self.moved.add(key)

    def settle(self, key: Key, ranges: Iterable[tuple[int, int]]) -> None:
        """Rows [start, end) inserted."""
        heap = self.settled.setdefault(key, [])
        for start, end in ranges:
            heapq.heappush(heap, (end, start))
            self._add(key, settled_hash(start, end))

    def settled_below(self, key: Key, low: int) -> None:
        """The rows whose end is at most ``low`` deleted."""
        heap = self.settled.get(key)
        while heap and heap[0][0] <= low:
            end, start = heapq.heappop(heap)
            self._add(key, -settled_hash(start, end))

    def count(self, key: Key, offset: int, dc: int) -> None:
        """The row of ``offset`` now says ``dc`` (inserted or updated)."""
        mine = self.counts.setdefault(key, {})
        was = mine.get(offset)
        if was is not None:
            self._add(key, -count_hash(offset, was))
        mine[offset] = dc
        self._add(key, count_hash(offset, dc))

    def counts_between(self, key: Key, start: int, end: int) -> None:
        """The rows of offsets [start, end) deleted."""
        mine = self.counts.get(key)
        if not mine:
            return
        gone = [o for o in mine if start <= o < end] if len(mine) < end - start else \
            [o for o in range(start, end) if o in mine]
        for offset in gone:
            self._add(key, -count_hash(offset, mine.pop(offset)))

    def drop(self, key: Key) -> None:
        """Every row of the partition deleted."""
        self.settled.pop(key, None)
        self.counts.pop(key, None)
        if self.sums.pop(key, 0):
            self.moved.add(key)

    def drop_queue(self, qid: int) -> None:
        for key in [k for k in self.settled.keys() | self.counts.keys() | self.sums.keys() if k[0] == qid]:
            self.drop(key)
        self.moved = {k for k in self.moved if k[0] != qid}
