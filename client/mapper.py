"""Data mappers: message -> partition.

* ``jump_hash`` (the default for new queues): the key's 64-bit BLAKE2b hash, then jump
  consistent hashing (Lamping and Veach, "A Fast, Minimal Memory, Consistent Hash
  Algorithm", 2014) to a partition.  Keys spread as evenly as a uniform random choice
  would, and going from N to N+1 partitions moves exactly the keys that land in the new
  partition (about 1/(N+1) of them) and no others.  ``ring_size`` plays no part.
* ``consistent_hash``: a hash ring of ``ring_size`` points, spread evenly over
  the partitions (each partition owns ``ring_size / partitions`` points placed
  by hashing ``(partition, i)``).  A message's key hashes to a ring position;
  the owner of the next point clockwise gets it.  The same key always lands on
  the same partition, and changing the partition count moves only about
  ``1/partitions`` of the keys.  Messages without a key go round-robin.
* ``round_robin``: partitions in turn, regardless of key.
* a custom mapper: an installed package's entry point in the group ``tandem.mappers``; its name
  is the mapper's name and it loads to a factory ``(partitions, ring_size) -> object`` whose
  ``partition(key: str) -> int`` places keyed messages (keyless ones spread as with the
  built-in mappers).  What it answers is checked: an exception or a partition out of range is
  an ``InvalidArgumentError`` naming the mapper and the key, never a crash.  It must be
  installed on every node and every client that publishes to its queues (a client maps
  messages itself); a queue whose mapper is missing refuses keyed publishes with that error.

A message that spreads (no key, or the ``round_robin`` mapper) and carries an *anchor* (the
node gives ``crc32(producer id) + seq`` for a message from an idempotent producer) goes to
partition ``anchor % partitions`` instead of the next in turn: consecutive sequences still take
the partitions in turn, and a resend of the same (producer id, seq) to any node lands in the
partition the first send went to, where it is recognised as a repeat (stored once).

A queue keeps the mapper it was declared with (its name is in the queue's metadata), so
no key moves under a running queue when the default changes; a declare that names no mapper
gets the default for a new queue and matches an existing queue's mapper, whatever it is.

Hashes are BLAKE2b (``jump_hash``) and CRC-32 (``consistent_hash``): stable across processes
and versions, unlike ``hash()``.  CRC-32 spreads similar short keys poorly (``k0``..``k63``
over 3 partitions with a ring of 1,024: 0 / 20 / 44), which is why it is not the default.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import importlib.metadata
import zlib
from typing import Any, Protocol

from client.errors import InvalidArgumentError

MAPPERS = ("jump_hash", "consistent_hash", "round_robin")
DEFAULT_MAPPER = "jump_hash"  # a new queue's, when its declare names none
ENTRY_POINTS = "tandem.mappers"  # custom mappers: entry points of installed packages

_MASK64 = (1 << 64) - 1


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


def key_hash(key: str) -> int:
    """A key's 64-bit hash (BLAKE2b; the same in every process and version)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


def jump(h: int, buckets: int) -> int:
    """Jump consistent hash of the 64-bit ``h`` to ``0..buckets-1`` (Lamping and Veach)."""
    b, j = -1, 0
    while j < buckets:
        b = j
        h = (h * 2862933555777941757 + 1) & _MASK64
        j = int((b + 1) * (float(1 << 31) / float((h >> 33) + 1)))
    return b


class JumpHashMapper:
    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self._keyless = RoundRobinMapper(partitions)
        self._cache: dict[str, int] = {}

    def partition(self, key: str | None, anchor: int | None = None) -> int:
        if key is None:
            return self._keyless.partition(None, anchor)
        p = self._cache.get(key)
        if p is None:
            p = jump(key_hash(key), self.partitions)
            if len(self._cache) < 65536:
                self._cache[key] = p
        return p


@functools.cache
def custom_mappers() -> dict[str, importlib.metadata.EntryPoint]:
    """Installed custom mappers by name (a built-in name is never overridden), read once per
    process (it scans the import path): a package installed later counts after a restart."""
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINTS) if ep.name not in MAPPERS}


def mapper_names() -> tuple[str, ...]:
    """Every mapper a declare may name here: the built-in ones, then the installed ones."""
    return MAPPERS + tuple(sorted(custom_mappers()))


class CustomMapper:
    """A mapper from an entry point: keyed messages go where it says (checked), keyless
    ones spread as with the built-in mappers."""

    def __init__(self, name: str, impl: Any, partitions: int) -> None:
        self.name = name
        self.partitions = partitions
        self._impl = impl
        self._keyless = RoundRobinMapper(partitions)

    def partition(self, key: str | None, anchor: int | None = None) -> int:
        if key is None:
            return self._keyless.partition(None, anchor)
        return self._keyed(key)

    def _keyed(self, key: str) -> int:
        try:
            p = self._impl.partition(key)
        except Exception as exc:  # a plug-in's error, whatever its type: the caller's, not ours
            raise InvalidArgumentError(f"data mapper {self.name!r} failed on key {key!r}: {exc!r}") from None
        if type(p) is not int or not 0 <= p < self.partitions:
            raise InvalidArgumentError(f"data mapper {self.name!r} put key {key!r} in partition {p!r} "
                                       f"(the queue has 0..{self.partitions - 1})")
        return p


class MissingMapper(CustomMapper):
    """A queue's mapper that is not installed here: keyless messages spread as usual, keyed
    ones are refused with the reason."""

    def __init__(self, name: str, partitions: int, reason: str) -> None:
        super().__init__(name, None, partitions)
        self.reason = reason

    def _keyed(self, key: str) -> int:
        raise InvalidArgumentError(self.reason)


def _custom(name: str, partitions: int, ring_size: int) -> DataMapper:
    ep = custom_mappers().get(name)
    if ep is None:
        raise InvalidArgumentError(f"unknown data mapper {name!r} (choose {', '.join(mapper_names())}; a custom "
                                   f"mapper is an installed package's {ENTRY_POINTS!r} entry point)")
    try:
        impl = ep.load()(partitions, ring_size)
    except Exception as exc:  # importing or building a plug-in can raise anything
        raise InvalidArgumentError(f"data mapper {name!r} ({ep.value}) could not be loaded: {exc!r}") from None
    if not callable(getattr(impl, "partition", None)):
        raise InvalidArgumentError(f"data mapper {name!r} ({ep.value}) gave an object without partition(key)")
    return CustomMapper(name, impl, partitions)


def make_mapper(name: str, partitions: int, ring_size: int) -> DataMapper:
    if name == "jump_hash":
        return JumpHashMapper(partitions)
    if name == "consistent_hash":
        return ConsistentHashMapper(partitions, ring_size)
    if name == "round_robin":
        return RoundRobinMapper(partitions)
    return _custom(name, partitions, ring_size)
