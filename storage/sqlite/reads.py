"""Reads of the SQLite store on a reader thread's connection, each in one read
transaction (one snapshot of the database, whatever the writer commits meanwhile)."""

from __future__ import annotations

import errno
import sqlite3
import zlib
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import SQLAlchemyError

from client.errors import StorageError
from collections.abc import Iterable

from storage.base import PartitionState, StoredMessage, unpack_run
from storage.budget import message_cost
from storage.intervals import IntervalSet
from storage.sqlite import rowsums


class DamagedChunk(StorageError):
    """A chunk of messages whose payload fails its checksum: damaged at rest (a flipped bit, a
    lost or misdirected write), never served."""


#: what SQLite says of a page it cannot read, or that is not what it wrote
DAMAGE_WORDS = ("malformed", "disk I/O error", "not a database")


class DamagedStore(StorageError):
    """A write the store's file refused as damaged, or its disk failed (SQLite's words above: a
    page malformed or unreadable, a failed read, write or sync): never tried again
    (storage.writer). After a failed sync the kernel may have dropped what it could not write,
    and a second try could say success."""

    permanent = True


def driver_error(exc: BaseException) -> str:
    """A database error in one line: the driver's own words (without the statement and the link
    SQLAlchemy adds)."""
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).splitlines()
    return f"{orig.__class__.__name__}: {text[0] if text else ''}"


def unreadable(exc: BaseException) -> bool:
    """Whether a failed read, write or open says the store's file is damaged or its disk failed
    (no passing condition: trying again gives the same): a chunk or a row failing its checksum, a
    page SQLite finds malformed or cannot read, a failed sync, a read the disk failed (EIO)."""
    if isinstance(exc, (DamagedChunk, DamagedStore, rowsums.DamagedRow)):
        return True
    if isinstance(exc, OSError):
        return exc.errno == errno.EIO
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, sqlite3.Error):
        cause = getattr(cause, "orig", None)  # (StorageError, then SQLAlchemy's, wrap the driver's)
    return cause is not None and any(w in str(cause) for w in DAMAGE_WORDS)


def check_chunk(key: tuple[int, int], start: int, payload: bytes, crc: int | None) -> None:
    """DamagedChunk if ``payload`` fails ``crc`` (None: a chunk written without one, unchecked)."""
    if crc is not None and zlib.crc32(payload) != crc:
        raise DamagedChunk(f"the chunk of partition {key[0]}/{key[1]} from offset {start} ({len(payload)} bytes) "
                           f"fails its checksum: damaged at rest")


def run_length(payload: bytes) -> int:
    """How many messages a packed run holds, from its msgpack array header alone."""
    b = payload[0]
    if 0x90 <= b <= 0x9F:
        return b & 0x0F
    if b == 0xDC:
        return int.from_bytes(payload[1:3], "big")
    if b == 0xDD:
        return int.from_bytes(payload[1:5], "big")
    return len(unpack_run(0, payload))


class PartitionFiller:
    """Fills a PartitionState from its chunks in offset order: unsettled messages while
    they fit ``share`` bytes (0: all), then only a count of the rest (the cold region),
    without decoding their chunks."""

    __slots__ = ("st", "settled", "dcs", "share", "held")

    def __init__(self, st: PartitionState, settled: IntervalSet, dcs: dict[int, int], share: int) -> None:
        self.st, self.settled, self.dcs, self.share = st, settled, dcs, share
        self.held = 0

    def add(self, start: int, payload: bytes) -> None:
        st, settled = self.st, self.settled
        if st.cold_count:
            self.add_cold(start, run_length(payload), len(payload))
            return
        share, dcs = self.share, self.dcs
        msgs = unpack_run(start, payload)
        for i, m in enumerate(msgs):
            if settled.contains(m.offset):
                continue
            if share:
                cost = message_cost(m)
                if self.held + cost > share and st.messages:
                    rest = [r for r in msgs[i:] if not settled.contains(r.offset)]
                    st.cold_start = m.offset
                    st.cold_count = len(rest)
                    st.cold_bytes = sum(len(r.body) + len(r.headers_blob) for r in rest)
                    break
                self.held += cost
            m.dc = dcs.get(m.offset, 0) + (1 if m.offset < st.delivered_upto else 0)
            st.messages.append(m)
        self._end(start + len(msgs))

    def add_cold(self, start: int, n: int, size: int) -> None:
        """A chunk past the budget, by its message count and size alone (its payload unread)."""
        st = self.st
        live = n - self.settled.count_in(start, start + n)
        if live:
            st.cold_count += live
            st.cold_bytes += size * live // n
        self._end(start + n)

    def _end(self, end: int) -> None:
        st = self.st
        if end > st.next_offset:
            st.next_offset = end
        if st.cold_count:
            st.cold_end = st.next_offset

    def finish(self) -> None:
        self._end(self.st.next_offset)


def fill(st: PartitionState, chunks: Iterable[tuple[int, bytes]], settled: IntervalSet, dcs: dict[int, int],
         share: int) -> None:
    filler = PartitionFiller(st, settled, dcs, share)
    for start, payload in chunks:
        filler.add(start, payload)
    filler.finish()


def _checked(conn: Connection, table: str, where: str, params: tuple[int, ...]) -> list[Any]:
    """The rows of ``table`` matching ``where``, in storage.sqlite.rowsums.select's columns;
    DamagedRow at the first that fails a checksum."""
    rows = list(conn.exec_driver_sql(rowsums.select(table, where), params))
    for row in rows:
        bad = rowsums.damaged(table, row)
        if bad:
            raise rowsums.DamagedRow(next(iter(bad.values())))
    return rows


def read_partition(conn: Connection, queue_id: int, partition: int, budget: int = 0) -> PartitionState:
    st = PartitionState()
    key = (queue_id, partition)
    try:
        with conn.begin():
            where = "queue_id = ? AND partition = ?"
            for r in _checked(conn, "partitions", where, key):
                st.next_offset, st.delivered_upto = r[2:4]
            settled = IntervalSet(r[2:4] for r in _checked(conn, "settled", where, key))
            dcs: dict[int, int] = {r[2]: r[3] for r in _checked(conn, "counts", where, key)}
            filler = PartitionFiller(st, settled, dcs, budget)
            rows = conn.exec_driver_sql(
                "SELECT start, payload, crc FROM chunks WHERE queue_id = ? AND partition = ? ORDER BY start", key)
            for start, payload, crc in rows:
                check_chunk(key, start, payload, crc)
                filler.add(start, payload)
                if st.cold_count:
                    rows.close()
                    # past the budget only counts matter: the chunks' counts and sizes, their
                    # payloads unread (a large backlog is counted in milliseconds)
                    for cold in conn.exec_driver_sql(
                            "SELECT start, count, length(payload) FROM chunks WHERE queue_id = ? AND partition = ? "
                            "AND start > ? ORDER BY start", (*key, start)):
                        filler.add_cold(*cold)
                    break
            filler.finish()
            st.producers = {r[2]: r[3] for r in _checked(conn, "producers", where, key)}
            for r in _checked(conn, "ha_state", where, key):
                st.applied = (r[11], r[12], r[13])
    except SQLAlchemyError as exc:
        raise StorageError(f"read failed: {driver_error(exc)}", orig=exc) from exc
    return st


def read_stored_end(conn: Connection, queue_id: int, partition: int) -> int:
    try:
        with conn.begin():
            end = conn.exec_driver_sql("SELECT next_offset FROM partitions WHERE queue_id = ? AND partition = ?",
                                       (queue_id, partition)).scalar()
    except SQLAlchemyError as exc:
        raise StorageError(f"read failed: {driver_error(exc)}", orig=exc) from exc
    return int(end or 0)


def read_chunks(conn: Connection, queue_id: int, partition: int) -> list[tuple[int, int, int]]:
    try:
        with conn.begin():
            rows = conn.exec_driver_sql("SELECT start, count, length(payload) FROM chunks WHERE queue_id = ? "
                                        "AND partition = ? ORDER BY start", (queue_id, partition)).all()
    except SQLAlchemyError as exc:
        raise StorageError(f"read failed: {driver_error(exc)}", orig=exc) from exc
    return [(int(s), int(n), int(b)) for s, n, b in rows]


def read_messages(conn: Connection, queue_id: int, partition: int, offset: int, limit: int) -> list[StoredMessage]:
    out: list[StoredMessage] = []
    try:
        with conn.begin():
            above = 'queue_id = ? AND partition = ? AND "end" > ?'
            settled = IntervalSet(r[2:4] for r in _checked(conn, "settled", above, (queue_id, partition, offset)))
            first = conn.exec_driver_sql(
                "SELECT start FROM chunks WHERE queue_id = ? AND partition = ? AND start <= ? "
                "ORDER BY start DESC LIMIT 1", (queue_id, partition, offset)).scalar()
            rows = conn.exec_driver_sql(
                "SELECT start, payload, crc FROM chunks WHERE queue_id = ? AND partition = ? AND start >= ? "
                "ORDER BY start", (queue_id, partition, offset if first is None else first))
            for start, payload, crc in rows:
                check_chunk((queue_id, partition), start, payload, crc)
                for m in unpack_run(start, payload):
                    if m.offset >= offset and not settled.contains(m.offset):
                        out.append(m)
                        if len(out) >= limit:
                            break
                if len(out) >= limit:
                    break
            rows.close()
            if out:
                by_offset = {m.offset: m for m in out}
                for off, dc in conn.exec_driver_sql(
                        'SELECT "offset", dc FROM counts WHERE queue_id = ? AND partition = ? AND "offset" >= ? '
                        'AND "offset" <= ?', (queue_id, partition, out[0].offset, out[-1].offset)):
                    hit = by_offset.get(off)
                    if hit is not None:
                        hit.dc = dc
    except SQLAlchemyError as exc:
        raise StorageError(f"read failed: {driver_error(exc)}", orig=exc) from exc
    return out
