"""Data mappers: message -> partition.

* ``consistent_hash``: a hash ring of ``ring_size`` points, spread evenly over
  the partitions (each partition owns ``ring_size / partitions`` points placed
  by hashing ``(partition, i)``).  A message's key hashes to a ring position;
  the owner of the next point clockwise gets it.  The same key always lands on
  the same partition, and changing the partition count moves only about
  ``1/partitions`` of the keys.  Messages without a key go round-robin.
* ``round_robin``: partitions in turn, regardless of key.

A message that spreads (no key, or the ``round_robin`` mapper) and carries an *anchor* (the
node gives ``crc32(producer id) + seq`` for a message from an idempotent producer) goes to
partition ``anchor % partitions`` instead of the next in turn: consecutive sequences still take
the partitions in turn, and a resend of the same (producer id, seq) to any node lands in the
partition the first send went to, where it is recognised as a repeat (stored once).

Hashes are CRC-32 (zlib): stable across processes and versions, unlike ``hash()``.
"""

from __future__ import annotations

import bisect
import zlib
from typing import Protocol

from client.errors import InvalidArgumentError

MAPPERS = ("consistent_hash", "round_robin")


class DataMapper(Protocol):
    def partition(self, key: str | None, anchor: int | None = None) -> int: ...


class RoundRobinMapper:
    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self._next = 0

    def partition(self, key: str | None, anchor: int | None = None) -> int:
        if anchor is not None:
            return anchor % self.partitions
        p = self._next
        self._next = (p + 1) % self.partitions
        return p


class ConsistentHashMapper:
    def __init__(self, partitions: int, ring_size: int) -> None:
        if ring_size < partitions:
            raise InvalidArgumentError(f"ring_size {ring_size} is smaller than partitions {partitions}")
        points: list[tuple[int, int]] = []
        per = ring_size // partitions
        extra = ring_size - per * partitions
        for p in range(partitions):
            for i in range(per + (1 if p < extra else 0)):
                points.append((zlib.crc32(f"{p}:{i}".encode()), p))
        points.sort()
        self._hashes = [h for h, _ in points]
        self._owners = [p for _, p in points]
        self._keyless = RoundRobinMapper(partitions)
        self.partitions = partitions
        self._cache: dict[str, int] = {}

    def partition(self, key: str | None, anchor: int | None = None) -> int:
        if key is None:
            return self._keyless.partition(None, anchor)
        p = self._cache.get(key)
        if p is None:
            i = bisect.bisect_right(self._hashes, zlib.crc32(key.encode()))
            p = self._owners[i % len(self._owners)]
            if len(self._cache) < 65536:
                self._cache[key] = p
        return p


def make_mapper(name: str, partitions: int, ring_size: int) -> DataMapper:
    if name == "consistent_hash":
        return ConsistentHashMapper(partitions, ring_size)
    if name == "round_robin":
        return RoundRobinMapper(partitions)
    raise InvalidArgumentError(f"unknown data mapper {name!r} (choose {', '.join(MAPPERS)})")
