"""The sum of a partition's bookkeeping rows: its settlements (``settled``) and delivery counts
(``counts``), which its digest covers from feature level :data:`LEVEL`.

Each of those rows carries its own checksum (storage.sqlite.rowsums), which a lost write to the
store's file passes: a page that kept its older rows leaves a settled range missing (a message
acknowledged would be delivered again) or a delivery count one write old (a message would be
delivered more times than its queue's ``max_deliveries`` before it is dead-lettered). From
:data:`LEVEL` a partition's digest (its row of ``partitions``) also XORs in the sum, modulo
2^63, of a 63-bit hash of each such row (:func:`settled_hash`, :func:`count_hash`): a sum, not
an XOR, because ``settled`` may hold the same range twice and two equal hashes would cancel.

The writer keeps each partition's sum (:class:`Books`), not its rows (a partition whose oldest
message is never acked keeps a settled row for each batch of acks after it): it adds what each
statement inserts, takes out what each delete returns (``RETURNING``) and, for a delivery count
it updates, the value the row held (read before the update), in the same transaction; the
store's open and ``tandem scrub`` sum the rows up again (:func:`summed`). A row whose values
are not integers is damage (its own checksum fails): the sums leave it out, so its partition's
digest does not fit either.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from storage.sqlite.rowsums import hash63, pair
from storage.sqlite.schema import Key

#: the feature level from which a partition's digest covers its settled ranges and delivery counts
LEVEL = 12

#: a query: SQL -> rows
Query = Callable[[str], Iterable[Any]]

_MASK = (1 << 63) - 1
_SETTLED = 'SELECT queue_id, partition, start, "end" FROM settled'
_COUNTS = 'SELECT queue_id, partition, "offset", dc FROM counts'


def settled_hash(start: int, end: int) -> int:
    """What a settled range [start, end) adds to its partition's sum: 63 bits of BLAKE2b of the two
    as little-endian int64s (personalized apart from the digest's other hashes)."""
    return hash63(pair(start, end), b"tandem.settled")


def count_hash(offset: int, dc: int) -> int:
    """What a delivery count adds to its partition's sum (personalized apart from the others)."""
    return hash63(pair(offset, dc), b"tandem.counts")


def summed(query: Query) -> dict[Key, int]:
    """Each partition's sum as its stored rows make it (the store's open, ``tandem scrub``)."""
    out: dict[Key, int] = {}
    for qid, p, start, end in query(_SETTLED):
        if _ints(start, end):
            out[(qid, p)] = (out.get((qid, p), 0) + settled_hash(start, end)) & _MASK
    for qid, p, offset, dc in query(_COUNTS):
        if _ints(offset, dc):
            out[(qid, p)] = (out.get((qid, p), 0) + count_hash(offset, dc)) & _MASK
    return out


def _ints(*values: Any) -> bool:
    return all(type(v) is int for v in values)


class Books:
    """The writer's running sum of each partition's settled and counts rows (:meth:`sum`).  Each
    method says what a statement the writer ran did to the rows, and names the partitions whose
    sum it moved in ``moved``."""

    def __init__(self) -> None:
        self.sums: dict[Key, int] = {}
        self.moved: set[Key] = set()

    def load(self, query: Query) -> None:
        """The sums of the rows as the store holds them (on open, or after a failed commit)."""
        self.sums = summed(query)
        self.moved.clear()

    def sum(self, key: Key) -> int:
        return self.sums.get(key, 0)

    def _add(self, key: Key, h: int) -> None:
        self.sums[key] = (self.sums.get(key, 0) + h) & _MASK
        self.moved.add(key)

    def settled(self, key: Key, ranges: Iterable[tuple[Any, Any]], *, deleted: bool = False) -> None:
        """Rows [start, end) inserted (or, ``deleted``, a delete's returned rows)."""
        for start, end in ranges:
            if _ints(start, end):
                self._add(key, -settled_hash(start, end) if deleted else settled_hash(start, end))

    def counted(self, key: Key, offset: int, dc: int, was: Any) -> None:
        """The row of ``offset`` now says ``dc``; it said ``was`` (None: it had no row)."""
        if was is not None and _ints(offset, was):
            self._add(key, -count_hash(offset, was))
        self._add(key, count_hash(offset, dc))

    def counts_deleted(self, key: Key, rows: Iterable[tuple[Any, Any]]) -> None:
        """A delete's returned rows (offset, dc)."""
        for offset, dc in rows:
            if _ints(offset, dc):
                self._add(key, -count_hash(offset, dc))

    def drop(self, key: Key) -> None:
        """Every row of the partition deleted."""
        if self.sums.pop(key, 0):
            self.moved.add(key)

    def drop_queue(self, qid: int) -> None:
        for key in [k for k in self.sums if k[0] == qid]:
            self.drop(key)
        self.moved = {k for k in self.moved if k[0] != qid}
