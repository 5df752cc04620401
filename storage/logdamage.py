"""What damage to the replication log took, and which partitions it cannot have touched.

storage.segments reads the records on past damage and numbers them (each record's ``seq``);
the numbers missing between those read are the records the damage took.  Two things say a
partition lost none of what it still needs (:meth:`Damage.intact`; storage.sqlite.recovery then
keeps its entries, and the others catch up from the group):

* **Covers.** The first record of each write names the partition of each record of the two
  writes before it (``[from, to, [[queue id, partition], ...]]`` in the records' order, a
  deleted queue as partition -1).  Where covers read name the partition of every record the
  damage took, a partition none of those is of lost no record: its records were all read, and
  are replayed in the order written.
* **Its own records.** Otherwise (damage longer than two writes, before the first record read,
  after the last, or in a log an older build wrote): a partition whose last record (an append,
  or a truncation, which fixes where its log ended) is numbered above every record the damage
  took, whose entries above its store's applied index all came from records numbered above
  them too, and run from that index + 1 to where that last record says its log ended, without a
  hole.  An entry is only ever written right after the log's last one, or after a truncation
  record that removed everything from its index on; so an entry the damage took that the
  partition still had is either missing (a hole) or was read in an older version, from an older
  record; one past its end was truncated by a record read after it.  Quiet partitions get a
  mark of where their log ends now and then (``SegmentLog.sweep``) so that this holds for them
  too.

docs/replication.md, "Decision: damage costs only the partitions it can have touched".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

Key = tuple[int, int]
#: (first record number, last record number, the partition of each record between in order, a
#: deleted queue as (queue id, -1))
Cover = tuple[int, int, tuple[Key, ...]]


@dataclass(frozen=True, slots=True)
class Damage:
    #: the highest record number the damage may have taken; None: unknown (a record without a
    #: number, or one twice): no partition is intact
    lost_upto: int | None
    #: the partitions the records the damage took may concern, as covers name them; None: not
    #: every record it took is covered
    touched: frozenset[Key] | None

    def intact(self, key: Key, applied: int, indexes: Sequence[int], tail: tuple[int, int],
               numbers: Mapping[int, int]) -> bool:
        """Whether partition ``key`` lost none of what it still needs: ``applied``, its store's
        applied index; ``indexes``, its entries as read (in order); ``tail``, the number of its
        last ``A`` or ``T`` record and where that record says its log ended; ``numbers``, the
        number of the record each entry came from."""
        number, top = tail
        above = [i for i in indexes if i > applied]
        whole = above == list(range(applied + 1, max(top, applied) + 1))  # (no hole, up to its end)
        if self.touched is not None and key not in self.touched and (key[0], -1) not in self.touched:
            return whole
        lost = self.lost_upto
        if lost is None or number <= lost:
            return False
        return whole and all(numbers.get(i, 0) > lost for i in above)


def assess(read: Sequence[tuple[int | None, Key]], damaged_at: Iterable[int], covers: Iterable[Cover],
           floor: int | None = None) -> Damage:
    """The damage, from the number and partition of each record read, in the order they lie in
    the files, how many had been read at each damage, the covers read, and the number the oldest
    file's first record took (None: not known, so any number below those read may be lost)."""
    where = set(damaged_at)
    numbers = [n for n, _key in read]
    if not numbers or any(n is None for n in numbers):
        return Damage(None, None)
    ns = sorted(n for n in numbers if n is not None)
    if any(b == a for a, b in zip(ns, ns[1:])) or (floor is not None and floor > ns[0]):
        return Damage(None, None)
    gaps = [(a + 1, b - 1) for a, b in zip(ns, ns[1:]) if b > a + 1]
    if floor is not None and floor < ns[0]:
        gaps.insert(0, (floor, ns[0] - 1))
    unbounded = floor is None and ns[0] > 1  # (records before those read: reclaimed, or lost)
    lost = ns[0] - 1 if unbounded else 0
    if gaps:
        lost = gaps[-1][1]
    if len(numbers) in where or not lost:  # (after the last record read, or no number missing: nothing known)
        return Damage(ns[-1], None)
    return Damage(lost, None if unbounded else _touched(gaps, list(covers), {n: key for n, key in read if n}))


def _touched(gaps: list[tuple[int, int]], covers: list[Cover], read: Mapping[int, Key]) -> frozenset[Key] | None:
    """The partitions the covers name for the numbers in ``gaps``; None where a number is in no
    cover, or where a cover does not name the partition of a record read (it cannot be trusted:
    a record framed inside a payload is one way to read a wrong one)."""
    whole = [c for c in covers if len(c[2]) == c[1] - c[0] + 1]
    if any(read.get(first + i, key) != key for first, _last, keys in whole for i, key in enumerate(keys)):
        return None
    out: set[Key] = set()
    for lo, hi in gaps:
        for number in range(lo, hi + 1):
            first, _last, keys = next((c for c in whole if c[0] <= number <= c[1]), (0, 0, ()))
            if not keys:
                return None
            out.add(keys[number - first])
    return frozenset(out)
