"""Checksums of the store's rows besides its messages (whose chunks carry their own:
storage.sqlite.reads.check_chunk).

Each checked row carries the CRC-32 of its values (:func:`row_crc`), written with it by the
writer (storage.sqlite.apply) and checked wherever the row is read: on open
(storage.sqlite.recovery), when a partition is loaded (storage.sqlite.reads) and by ``tandem
scrub``. A row written by a build without the column has NULL there and is read unchecked.

What a damaged row means depends on what it holds (:data:`CHECKED`):

* a partition's settlements, delivery counts, producer positions, snapshot mark and applied
  position are that partition's copy: in a group it starts over and its active sends it whole;
  a node alone does not start, naming the row (as for a damaged chunk);
* a partition's hard state (its term, its vote, its commit index) cannot be taken from the
  group: a node that no longer knows whom it voted for could vote twice in one term and help
  elect two actives. The node does not start, naming the row;
* the catalogue's rows (queues, users, grants) are not rebuilt either: the node does not start,
  naming the row; from :data:`APPLIED_LEVEL` the catalogue has a digest of its own, which finds
  a row a lost write left whole but one write old (storage.sqlite.catalogue_sum).

* a partition's end and delivered mark (``partitions``) are part of its copy too: repaired so;
  so is a partition whose chunks are not those its row's digest sums up (:func:`chunk_hash`,
  from feature level :data:`DIGEST_LEVEL`): a write to the store was lost (a page kept its
  older rows, each whole and passing its own checksum) or landed on another page. From
  :data:`APPLIED_LEVEL` the digest also covers the partition's applied position
  (:func:`applied_hash`) and its producer positions (:func:`producer_hash`): a lost write that
  left the chunks and the row both as they were one write earlier while ``ha_state`` moved on
  (or ``ha_state`` as it was while they moved on), or a producer's row one write old, no longer
  fits it either. From storage.sqlite.booksum.LEVEL it covers the partition's settled ranges and
  delivery counts too (storage.sqlite.booksum);
* the store's ``meta`` rows (its schema version, the group's feature level, the highest queue
  id, the group's settings kept there) stop the node's start, naming the row.

The other rows carry checksums once the store's group is at feature level :data:`LEVEL`
(ha.upgrade.LEVELS): a member of an older build updates a row without its
checksum, so until no member can run one, rows are written with NULL there (unchecked), as such
a build writes them. The rows of ``partitions`` and ``meta`` carry theirs always: a trigger in
the store (storage.sqlite.schema.TRIGGERS) clears the checksum of a row whose values an older
build changes without it, and the row then reads unchecked until it is written again. Shared
mode (one PostgreSQL database) has no feature level and writes none: PostgreSQL's own page
checksums (``initdb --data-checksums``) are its check.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgpack

from client.errors import StorageError

#: the feature level from which rows carry checksums, and the ``meta`` key the store keeps the
#: group's level under (broker.partitions.upgrade.LEVEL_KEY)
LEVEL = 9
LEVEL_KEY = "feature_level"

#: table -> its checksum column -> the columns that checksum covers, in order
CHECKED: dict[str, dict[str, tuple[str, ...]]] = {
    "settled": {"crc": ("queue_id", "partition", "start", '"end"')},
    "counts": {"crc": ("queue_id", "partition", '"offset"', "dc")},
    "producers": {"crc": ("queue_id", "partition", "producer_id", "last_seq")},
    "queues": {"crc": ("id", "name", "partitions", "mapper", "ring_size", "max_deliveries", "dead_letter_queue",
                       "max_length", "owner", "max_length_bytes", "overflow", "message_ttl", "expires", "type",
                       "max_age", "max_bytes", "dead_letter_exchange", "dead_letter_routing_key")},
    "users": {"crc": ("name", "salt", "hash", "role", "params")},
    "acls": {"crc": ("username", "pattern", "permission")},
    "ha_state": {
        "hard_crc": ("queue_id", "partition", "term", "voted_for", "commit_idx"),
        "snap_crc": ("queue_id", "partition", "snap_index", "snap_term", "snap_origin", "snap_weak",
                     "snap_recency_term", "snap_recency_index"),
        "applied_crc": ("queue_id", "partition", "applied_index", "applied_term", "applied_origin"),
    },
    "partitions": {"crc": ("queue_id", "partition", "next_offset", "delivered_upto", "digest")},
    "meta": {"crc": ("key", "value")},
}
#: the feature level from which each partition's row of ``partitions`` keeps the digest of its chunks
DIGEST_LEVEL = 10
#: the feature level from which that digest also covers the partition's applied position (ha_state's)
APPLIED_LEVEL = 11

_PAIR = struct.Struct("<qq")


class DamagedRow(StorageError):
    """A stored row whose values fail its checksum: damaged at rest."""


def as_stored(v: Any) -> Any:
    """A value as the database gives it back: a whole float or a bool as the integer an
    INTEGER column keeps, a buffer as bytes."""
    if type(v) is bool or (type(v) is float and v.is_integer()):
        return int(v)
    if isinstance(v, (memoryview, bytearray)):
        return bytes(v)
    return v


def at_level(meta_value: str | None) -> bool:
    """Whether a store whose ``meta`` says ``meta_value`` for :data:`LEVEL_KEY` writes checksums."""
    return level_of(meta_value) >= LEVEL


def hash63(data: bytes, person: bytes = b"") -> int:
    """63 bits of BLAKE2b of ``data``, personalized with ``person``: each part of a digest (a
    chunk, an applied position, a producer position, a settled range, a delivery count, a
    catalogue row) is one, its kind's personalization keeping the kinds apart."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8, person=person).digest(), "little") >> 1


def pair(a: int, b: int) -> bytes:
    """Two integers as little-endian int64s, as the digests hash them."""
    return _PAIR.pack(a, b)


def chunk_hash(start: int, count: int) -> int:
    """What a chunk row adds to its partition's digest: the partition's digest is the XOR of its
    chunks' hashes (63 bits of BLAKE2b of the two as little-endian int64s), so a chunk written or
    deleted changes it by its own hash alone."""
    return hash63(pair(start, count))


def applied_hash(index: int, term: int) -> int:
    """What a partition's applied position adds to its digest from :data:`APPLIED_LEVEL`: 63 bits
    of BLAKE2b of the index and term as little-endian int64s (kept apart from :func:`chunk_hash`'s
    by BLAKE2b's personalization), 0 for nothing applied (a partition outside any group)."""
    if not index:
        return 0
    return hash63(pair(index, term), b"tandem.applied")


def producer_hash(producer_id: str, last_seq: int) -> int:
    """What a partition's stored position of a producer adds to its digest from
    :data:`APPLIED_LEVEL`: 63 bits of BLAKE2b of the two (personalized apart from the others)."""
    data = msgpack.packb([producer_id, last_seq], use_bin_type=True)
    return hash63(data, b"tandem.producer")


def level_of(meta_value: str | None) -> int:
    """The feature level a store's ``meta`` value for :data:`LEVEL_KEY` says (absent: 1)."""
    return int(meta_value) if meta_value is not None and meta_value.isdigit() else 1


def misfit(qid: int, p: int, applied: tuple[int, int] | None, *, books: bool = False) -> str:
    """Why partition ``qid``/``p`` is damaged when its row's digest does not fit what it sums up
    (``applied``: the applied position it covers, from :data:`APPLIED_LEVEL`; None below;
    ``books``: it covers the settled ranges and delivery counts too, storage.sqlite.booksum.LEVEL)."""
    what = f"the chunks of partition {qid}/{p}"
    if applied is not None:
        what += f" and its applied position (entry {applied[0]}, term {applied[1]})"
        what += ", producer positions, settled ranges and delivery counts" if books else " and producer positions"
    return (f"{what} are not those its row of partitions sums up (its digest): a write to the store was lost "
            f"or misdirected")


def misfits(rows: Iterable[tuple[int, int, int | None]], digests: Mapping[tuple[int, int], int],
            applied: Mapping[tuple[int, int], tuple[int, int]] | None, *,
            books: bool = False) -> dict[tuple[int, int], str]:
    """Each partition whose copy its row of ``partitions`` does not sum up, with why.

    ``rows``: each row's (queue id, partition, digest); ``digests``: what the chunk rows stored
    make (the XOR of their :func:`chunk_hash`; from :data:`APPLIED_LEVEL` with the producer
    rows' :func:`producer_hash` too, and with ``books`` the sum of the settled and count rows,
    storage.sqlite.booksum); ``applied``: from :data:`APPLIED_LEVEL`, each partition's
    applied position (index, term) as ``ha_state`` keeps it, which the digest covers too, and
    every partition with any of those rows or an applied position then has a row (None
    below)."""
    out: dict[tuple[int, int], str] = {}
    have = set()
    for qid, p, digest in rows:
        have.add((qid, p))
        covered = None if applied is None else applied.get((qid, p), (0, 0))
        if digest is not None and digest != digests.get((qid, p), 0) ^ applied_hash(*covered or (0, 0)):
            out[(qid, p)] = misfit(qid, p, covered, books=books)
    if applied is not None:
        held = "chunks, producer positions, settled ranges, delivery counts" if books else "chunks, producer positions"
        for qid, p in sorted((digests.keys() | {k for k, a in applied.items() if a[0]}) - have):
            out[(qid, p)] = (f"partition {qid}/{p} has {held} or an applied position but no row "
                             f"of partitions to sum them up: a write to the store was lost or misdirected")
    return out


def not_numbers(qid: int, p: int) -> str:
    """Why partition ``qid``/``p`` is damaged when a chunk row's start or count is not a number
    (a flipped bit in a record's header changed the value's type)."""
    return f"a row of chunks (partition {qid}/{p}) has a start or count that is not a number: damaged at rest"


def row_crc(*values: Any) -> int:
    """The CRC-32 of a row's values (ints, strings, bytes, None), as the ``crc`` columns keep it."""
    return zlib.crc32(msgpack.packb([as_stored(v) for v in values], use_bin_type=True))


def check_row(table: str, values: Sequence[Any], crc: int | None, *, column: str = "crc") -> None:
    """DamagedRow if ``values`` fail ``crc`` (None: a row written without one, unchecked)."""
    if crc is not None and row_crc(*values) != crc:
        raise DamagedRow(f"a row of {table} ({describe(table, values)}) fails its checksum ({column}): "
                         f"damaged at rest")


def describe(table: str, values: Sequence[Any]) -> str:
    """The row's key, for a reader: ``partition 3/0 from offset 20``, ``user alice``."""
    if table in ("settled", "counts", "producers", "ha_state", "partitions"):
        what = {"settled": "settled range from", "counts": "delivery count of offset",
                "producers": "position of producer", "ha_state": "", "partitions": ""}[table]
        return f"partition {values[0]}/{values[1]}" + (f", {what} {values[2]}" if what else "")
    if table == "queues":
        return f"queue {values[1]!r} (id {values[0]})"
    if table == "users":
        return f"user {values[0]!r}"
    if table == "meta":
        return f"key {values[0]!r}"
    return f"grant of {values[2]} on {values[1]!r} to {values[0]!r}"


def select(table: str, where: str = "") -> str:
    """``SELECT`` of every column the table's checksums cover, then each checksum, in
    :data:`CHECKED`'s order."""
    sums = CHECKED[table]
    cols = list(dict.fromkeys(c for covered in sums.values() for c in covered))
    return f"SELECT {', '.join(cols + list(sums))} FROM {table}{' WHERE ' + where if where else ''}"


def damaged(table: str, row: Sequence[Any]) -> dict[str, str]:
    """Each checksum of a row read with :func:`select` that its values fail, with why."""
    sums = CHECKED[table]
    cols = list(dict.fromkeys(c for covered in sums.values() for c in covered))
    at = {c: i for i, c in enumerate(cols)}
    out: dict[str, str] = {}
    for n, (column, covered) in enumerate(sums.items()):
        try:
            check_row(table, [row[at[c]] for c in covered], row[len(cols) + n], column=column)
        except DamagedRow as exc:
            out[column] = exc.message
    return out


def stamp_all(conn: Any) -> int:
    """Give every checked row its checksums (the store reaching :data:`LEVEL`: what was written
    before it, by this build or an older one, is summed as it stands); the rows stamped.
    ``conn``: an executor with ``exec_driver_sql`` (storage.sqlite.apply.Executor), SQLite's."""
    stamped = 0
    for table, sums in CHECKED.items():
        cols = list(dict.fromkeys(c for covered in sums.values() for c in covered))
        at = {c: i for i, c in enumerate(cols)}
        rows = list(conn.exec_driver_sql(f"SELECT rowid, {', '.join(cols)} FROM {table}"))
        if rows:
            sets = ", ".join(f"{column} = ?" for column in sums)
            conn.exec_driver_sql(f"UPDATE {table} SET {sets} WHERE rowid = ?", [
                (*(row_crc(*(r[1 + at[c]] for c in covered)) for covered in sums.values()), r[0]) for r in rows])
            stamped += len(rows)
    return stamped
