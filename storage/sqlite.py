"""The embedded default engine: one SQLite database per node, WAL mode, via SQLAlchemy Core.

Durability maps onto SQLite's own machinery:

* ``sync=True`` commits with ``PRAGMA synchronous=FULL``: the WAL is fsynced
  before the commit returns.
* ``sync=False`` commits with ``synchronous=NORMAL``: the WAL frames are
  written to the OS (they survive a kill of the process), fsync happens at the
  next checkpoint.

Torn writes: every WAL frame carries a checksum chained over the frames before
it, and a commit is a frame with the commit flag.  On open SQLite replays the
WAL only up to the last frame whose checksum holds, so a partial last write is
ignored rather than read (tested in ``tests/storage/test_recovery.py``).

Schema (version 1, in ``meta.schema_version``)::

    meta(key TEXT PK, value TEXT)
    queues(id INT PK, name TEXT UNIQUE, partitions, mapper, ring_size,
           max_deliveries, dead_letter_queue, max_length)
    partitions(queue_id, partition, next_offset)           PK (queue_id, partition)
    messages(queue_id, partition, offset, key, headers BLOB, body BLOB,
             producer_id, seq, ts REAL, dc INT)             PK (queue_id, partition, offset)
    producers(queue_id, partition, producer_id, last_seq)  PK (queue_id, partition, producer_id)
    users(name TEXT PK, salt BLOB, hash BLOB, role, params)

The hot path uses ``exec_driver_sql`` with parameter tuples (``executemany``):
SQLAlchemy Core without per-row dict building.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from client.errors import StorageError
from storage.base import (
    Append,
    Capabilities,
    DropQueue,
    DropUser,
    PartitionState,
    PurgePartition,
    PutProducer,
    PutQueue,
    PutUser,
    QueueMeta,
    Recovered,
    Remove,
    SetDeliveryCount,
    StoredMessage,
    UserRecord,
    WriteOp,
)

log = logging.getLogger("tandem.storage")

SCHEMA_VERSION = "1"

_DDL = [
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS queues (
        id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, partitions INTEGER NOT NULL,
        mapper TEXT NOT NULL, ring_size INTEGER NOT NULL, max_deliveries INTEGER NOT NULL,
        dead_letter_queue TEXT, max_length INTEGER NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS partitions (
        queue_id INTEGER NOT NULL, partition INTEGER NOT NULL, next_offset INTEGER NOT NULL,
        PRIMARY KEY (queue_id, partition))""",
    """CREATE TABLE IF NOT EXISTS messages (
        queue_id INTEGER NOT NULL, partition INTEGER NOT NULL, "offset" INTEGER NOT NULL,
        key TEXT, headers BLOB NOT NULL, body BLOB NOT NULL, producer_id TEXT, seq INTEGER,
        ts REAL NOT NULL, dc INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (queue_id, partition, "offset"))""",
    """CREATE TABLE IF NOT EXISTS producers (
        queue_id INTEGER NOT NULL, partition INTEGER NOT NULL, producer_id TEXT NOT NULL,
        last_seq INTEGER NOT NULL, PRIMARY KEY (queue_id, partition, producer_id))""",
    """CREATE TABLE IF NOT EXISTS users (
        name TEXT PRIMARY KEY, salt BLOB NOT NULL, hash BLOB NOT NULL, role TEXT NOT NULL,
        params TEXT NOT NULL)""",
]

_INSERT_MSG = (
    'INSERT OR REPLACE INTO messages (queue_id, partition, "offset", key, headers, body, '
    "producer_id, seq, ts, dc) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_UPSERT_PART = (
    "INSERT INTO partitions (queue_id, partition, next_offset) VALUES (?, ?, ?) "
    "ON CONFLICT (queue_id, partition) DO UPDATE SET next_offset = "
    "max(next_offset, excluded.next_offset)"
)
_DELETE_MSG = 'DELETE FROM messages WHERE queue_id = ? AND partition = ? AND "offset" = ?'
_SET_DC = 'UPDATE messages SET dc = ? WHERE queue_id = ? AND partition = ? AND "offset" = ?'
_UPSERT_PRODUCER = (
    "INSERT INTO producers (queue_id, partition, producer_id, last_seq) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (queue_id, partition, producer_id) DO UPDATE SET last_seq = excluded.last_seq"
)


class SqliteEngine:
    """SQLite in WAL mode, one file per node (``<data_dir>/tandem.db``)."""

    capabilities = Capabilities(shared=False, fsync=True)

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._engine: Engine | None = None  # created in open(), off the event loop
        self._writer: Connection | None = None
        self._local = threading.local()
        self._sync_mode: str | None = None

    @staticmethod
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        # 16 KiB pages: ~2x the write throughput of the 4 KiB default for 1 KiB
        # messages (fewer pages per batch; docs/benchmarks.md).  Takes effect
        # only when the file is created, so it must come before journal_mode.
        cur.execute("PRAGMA page_size=16384")
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=FULL")
        cur.execute("PRAGMA busy_timeout=10000")
        cur.execute("PRAGMA foreign_keys=OFF")
        cur.close()

    # -- lifecycle ------------------------------------------------------------------

    def open(self) -> Recovered:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._engine = create_engine(f"sqlite:///{self.path}", poolclass=NullPool)
        event.listen(self._engine, "connect", self._on_connect)
        try:
            self._writer = self._engine.connect()
            with self._writer.begin():
                for ddl in _DDL:
                    self._writer.exec_driver_sql(ddl)
                self._writer.exec_driver_sql(
                    "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)",
                    (SCHEMA_VERSION,),
                )
            recovered = self._load(self._writer)
            self._writer.rollback()  # end the read transaction autobegun by _load
            return recovered
        except SQLAlchemyError as exc:
            raise StorageError(f"cannot open store {self.path}: {exc.__class__.__name__}: {exc}", orig=exc) from exc

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._engine is not None:
            self._engine.dispose()

    def _load(self, conn: Connection) -> Recovered:
        rec = Recovered()
        rec.meta = {k: v for k, v in conn.exec_driver_sql("SELECT key, value FROM meta")}
        version = rec.meta.get("schema_version")
        if version != SCHEMA_VERSION:
            raise StorageError(f"store {self.path} has schema version {version}, this build reads {SCHEMA_VERSION}")
        for row in conn.exec_driver_sql(
            "SELECT id, name, partitions, mapper, ring_size, max_deliveries, dead_letter_queue, "
            "max_length FROM queues ORDER BY id"
        ):
            rec.queues.append(QueueMeta(
                id=row[0], name=row[1], partitions=row[2], mapper=row[3], ring_size=row[4],
                max_deliveries=row[5], dead_letter_queue=row[6], max_length=row[7],
            ))
        parts = rec.partitions
        for qid, p, nxt in conn.exec_driver_sql("SELECT queue_id, partition, next_offset FROM partitions"):
            parts[(qid, p)] = PartitionState(next_offset=nxt)
        for row in conn.exec_driver_sql(
            'SELECT queue_id, partition, "offset", key, headers, body, producer_id, seq, ts, dc '
            'FROM messages ORDER BY queue_id, partition, "offset"'
        ):
            st = parts.get((row[0], row[1]))
            if st is None:
                st = parts[(row[0], row[1])] = PartitionState()
            st.messages.append(StoredMessage(row[2], row[3], row[4], row[5], row[6], row[7], row[8], row[9]))
            if row[2] >= st.next_offset:
                st.next_offset = row[2] + 1
        for qid, p, pid, last in conn.exec_driver_sql(
            "SELECT queue_id, partition, producer_id, last_seq FROM producers"
        ):
            st = parts.get((qid, p))
            if st is None:
                st = parts[(qid, p)] = PartitionState()
            st.producers[pid] = last
        for name, salt, hsh, role, params in conn.exec_driver_sql(
            "SELECT name, salt, hash, role, params FROM users ORDER BY name"
        ):
            rec.users.append(UserRecord(name=name, salt=salt, hash=hsh, role=role, params=params))
        return rec

    # -- writes (writer thread) -------------------------------------------------------------

    def apply(self, ops: list[WriteOp], *, sync: bool) -> None:
        conn = self._writer
        if conn is None:
            raise StorageError("store is closed")
        try:
            mode = "FULL" if sync else "NORMAL"
            if mode != self._sync_mode:
                conn.exec_driver_sql(f"PRAGMA synchronous={mode}")
                conn.commit()
                self._sync_mode = mode
            with conn.begin():
                self._apply(conn, ops)
        except SQLAlchemyError as exc:
            raise StorageError(f"write failed: {exc.__class__.__name__}: {exc}", orig=exc) from exc

    @staticmethod
    def _apply(conn: Connection, ops: list[WriteOp]) -> None:
        inserts: list[tuple[Any, ...]] = []
        ends: list[tuple[int, int, int]] = []
        deletes: list[tuple[int, int, int]] = []
        counts: list[tuple[int, int, int, int]] = []
        producers: list[tuple[int, int, str, int]] = []

        def flush() -> None:
            # Keep op order where it matters: buffered rows go out before a
            # structural op (purge, drop) that may remove them.
            if inserts:
                conn.exec_driver_sql(_INSERT_MSG, inserts)
                inserts.clear()
            if ends:
                conn.exec_driver_sql(_UPSERT_PART, ends)
                ends.clear()
            if counts:
                conn.exec_driver_sql(_SET_DC, counts)
                counts.clear()
            if deletes:
                conn.exec_driver_sql(_DELETE_MSG, deletes)
                deletes.clear()
            if producers:
                conn.exec_driver_sql(_UPSERT_PRODUCER, producers)
                producers.clear()

        for op in ops:
            if type(op) is Append:
                q, p = op.queue_id, op.partition
                inserts.extend(
                    (q, p, m.offset, m.key, m.headers, m.body, m.producer_id, m.seq, m.timestamp, m.delivery_count)
                    for m in op.messages
                )
                ends.append((q, p, op.next_offset))
            elif type(op) is Remove:
                if inserts or counts:
                    flush()
                q, p = op.queue_id, op.partition
                deletes.extend((q, p, o) for o in op.offsets)
            elif type(op) is SetDeliveryCount:
                if inserts or deletes:
                    flush()
                q, p = op.queue_id, op.partition
                counts.extend((dc, q, p, o) for o, dc in op.items)
            elif type(op) is PutProducer:
                producers.append((op.queue_id, op.partition, op.producer_id, op.last_seq))
            else:
                flush()
                SqliteEngine._apply_structural(conn, op)
        flush()

    @staticmethod
    def _apply_structural(conn: Connection, op: WriteOp) -> None:
        if isinstance(op, PutQueue):
            q = op.queue
            conn.exec_driver_sql(
                "INSERT OR REPLACE INTO queues (id, name, partitions, mapper, ring_size, "
                "max_deliveries, dead_letter_queue, max_length) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (q.id, q.name, q.partitions, q.mapper, q.ring_size, q.max_deliveries,
                 q.dead_letter_queue, q.max_length),
            )
        elif isinstance(op, DropQueue):
            for table in ("messages", "partitions", "producers"):
                conn.exec_driver_sql(f"DELETE FROM {table} WHERE queue_id = ?", (op.queue_id,))
            conn.exec_driver_sql("DELETE FROM queues WHERE id = ?", (op.queue_id,))
        elif isinstance(op, PurgePartition):
            conn.exec_driver_sql(
                "DELETE FROM messages WHERE queue_id = ? AND partition = ?", (op.queue_id, op.partition)
            )
        elif isinstance(op, PutUser):
            u = op.user
            conn.exec_driver_sql(
                "INSERT OR REPLACE INTO users (name, salt, hash, role, params) VALUES (?, ?, ?, ?, ?)",
                (u.name, u.salt, u.hash, u.role, u.params),
            )
        elif isinstance(op, DropUser):
            conn.exec_driver_sql("DELETE FROM users WHERE name = ?", (op.name,))
        else:
            raise StorageError(f"unknown write op {type(op).__name__}")

    def set_meta(self, key: str, value: str) -> None:
        conn = self._writer
        if conn is None:
            raise StorageError("store is closed")
        try:
            with conn.begin():
                conn.exec_driver_sql("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))
        except SQLAlchemyError as exc:
            raise StorageError(f"write failed: {exc}", orig=exc) from exc

    # -- reads (reader threads) --------------------------------------------------------------

    def read(self, queue_id: int, partition: int, offset: int, limit: int) -> list[StoredMessage]:
        conn: Connection | None = getattr(self._local, "conn", None)
        if self._engine is None:
            raise StorageError("store is not open")
        try:
            if conn is None:
                conn = self._local.conn = self._engine.connect()
            with conn.begin():
                rows = conn.exec_driver_sql(
                    'SELECT "offset", key, headers, body, producer_id, seq, ts, dc FROM messages '
                    'WHERE queue_id = ? AND partition = ? AND "offset" >= ? ORDER BY "offset" LIMIT ?',
                    (queue_id, partition, offset, limit),
                ).all()
        except SQLAlchemyError as exc:
            raise StorageError(f"read failed: {exc}", orig=exc) from exc
        return [StoredMessage(*row) for row in rows]
