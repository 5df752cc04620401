"""The catalogue's digest: a lost write to the store's queues, users or grants found.

Each row of the catalogue (``queues``, ``users``, ``acls``) carries its own checksum
(storage.sqlite.rowsums), and a write to the store that was lost, or landed on another page, can
leave a row whole as it was some writes earlier, or gone, or back: a queue's older settings, a
deleted user, a revoked grant. Each such row passes its own check. From feature level
:data:`~storage.sqlite.rowsums.APPLIED_LEVEL` the store keeps in ``meta`` (key :data:`KEY`,
checksummed like every ``meta`` row) the XOR of a hash of every catalogue row's checked values
(:func:`row_hash`) and of the catalogue's applied position (rowsums.applied_hash): the writer
(:class:`Digest`, in storage.sqlite.apply) moves it with every row it writes or deletes, in the
same transaction, and the store's open and ``tandem scrub`` sum the rows up again. A digest that
does not fit them is damage to the catalogue: the node does not start, as for a damaged
catalogue row (the group does not rebuild a member's catalogue; docs/reliability.md).

Every write to those tables goes through the writer. A change of their checked columns (a new
schema version) changes every row's hash: the store must then sum its catalogue up again
(:meth:`Digest.start`), as it stamps the rows' checksums again (rowsums.stamp_all).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import msgpack

from storage.base import DropQueue, DropUser, GrantAcl, PutApplied, PutQueue, PutUser, RevokeAcl, WriteOp
from storage.sqlite import rowsums

#: the ``meta`` key the digest is kept under
KEY = "catalogue_digest"

#: a query: (SQL, parameters) -> rows
Query = Callable[[str, tuple[Any, ...]], Iterable[Any]]

#: the catalogue's tables and the values of a row its digest covers (those its checksum covers)
TABLES = {table: rowsums.CHECKED[table]["crc"] for table in ("queues", "users", "acls")}

#: the applied position of a partition of the catalogue (queue 0)
_APPLIED = "SELECT applied_index, applied_term FROM ha_state WHERE queue_id = 0 AND partition = ?"


def row_hash(table: str, values: Iterable[Any]) -> int:
    """What a catalogue row adds to the digest: 63 bits of BLAKE2b (personalized apart from the
    partitions' digests) of its table and its values as the store gives them back."""
    data = msgpack.packb([table, *(rowsums.as_stored(v) for v in values)], use_bin_type=True)
    return rowsums.hash63(data, b"tandem.catalog")


def _rows(query: Query, table: str, where: str = "", params: tuple[Any, ...] = ()) -> int:
    """The XOR of the hashes of ``table``'s rows (those ``where`` selects)."""
    cols = ", ".join(TABLES[table])
    out = 0
    for row in query(f"SELECT {cols} FROM {table}{' WHERE ' + where if where else ''}", params):
        out ^= row_hash(table, row)
    return out


def _applied(query: Query, partition: int) -> int:
    out = 0
    for index, term in query(_APPLIED, (partition,)):
        out ^= rowsums.applied_hash(index or 0, term or 0)
    return out


def summed(query: Query) -> int:
    """The digest the store's catalogue rows and its applied position make."""
    out = 0
    for table in TABLES:
        out ^= _rows(query, table)
    for (partition,) in query("SELECT partition FROM ha_state WHERE queue_id = 0", ()):
        out ^= _applied(query, partition)
    return out


def misfit(query: Query, have: int | None = None) -> str | None:
    """Why the store's catalogue does not fit the digest its ``meta`` keeps (None: it fits);
    ``have``: what its rows sum up to, if summed already. Only for a store at
    rowsums.APPLIED_LEVEL, which keeps one."""
    kept = [value for (value,) in query("SELECT value FROM meta WHERE key = ?", (KEY,))]
    if not kept or not kept[0].isdigit():
        return (f"the catalogue (queues, users, grants) has no digest in meta ({KEY}) to sum it up: "
                f"a write to the store was lost or misdirected")
    if int(kept[0]) != (summed(query) if have is None else have):
        return ("the catalogue's rows (queues, users, grants) and its applied position are not those its digest "
                f"in meta ({KEY}) sums up: a write to the store was lost or misdirected")
    return None


def _scope(op: WriteOp) -> list[tuple[str, str, tuple[Any, ...]]]:
    """The catalogue rows ``op`` may write or delete: (table, where, parameters)."""
    if isinstance(op, PutQueue):  # (INSERT OR REPLACE: a row of the same id or name goes)
        return [("queues", "id = ? OR name = ?", (op.queue.id, op.queue.name))]
    if isinstance(op, DropQueue):
        return [("queues", "id = ?", (op.queue_id,))]
    if isinstance(op, PutUser):
        return [("users", "name = ?", (op.user.name,))]
    if isinstance(op, DropUser):
        return [("users", "name = ?", (op.name,)), ("acls", "username = ?", (op.name,))]
    if isinstance(op, (GrantAcl, RevokeAcl)):
        return [("acls", "username = ? AND pattern = ?", (op.acl.user, op.acl.pattern))]
    return []


class Digest:
    """The writer's copy of the digest, moved with each op that writes a catalogue row; ``None``
    below the level."""

    def __init__(self) -> None:
        self.value: int | None = None
        self.moved = False  # the batch in hand moved it: written at its end

    def load(self, query: Query, on: bool) -> str | None:
        """Sum the store up (``on``: it is at the level); why it misfits what ``meta`` keeps."""
        self.moved = False
        self.value = summed(query) if on else None
        return None if self.value is None else misfit(query, self.value)

    def start(self, query: Query) -> None:
        """The store reaches the level: its rows as they stand are summed up, and written."""
        self.value, self.moved = summed(query), True

    def around(self, query: Query, op: WriteOp, write: Callable[[], None]) -> None:
        """``write()`` the op, moving the digest by what it changed of the rows it may touch."""
        if self.value is None:
            write()
            return
        if isinstance(op, PutApplied):
            if op.queue_id:
                write()
                return
            was = _applied(query, op.partition)
            write()
            self.value ^= was ^ _applied(query, op.partition)
            self.moved = True
            return
        scope = _scope(op)
        old = [_rows(query, *s) for s in scope]
        write()
        for s, had in zip(scope, old):
            self.value ^= had ^ _rows(query, *s)
        self.moved = self.moved or bool(scope)
