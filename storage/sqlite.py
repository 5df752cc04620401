"""The embedded default engine: one SQLite database per node, WAL mode, via SQLAlchemy Core.

Layout: the log is stored in *chunks*, one row per appended batch of a
partition (as a publish frame is one batch), not one row per message; a
message is settled by recording its offset range, and a chunk is deleted once
every message in it is settled.  So a batch of 256 messages costs one row
insert and, later, one range row and one delete, instead of 256 inserts, 256
deletes and 256 updates: SQLite's per-row cost (and the GIL hand-offs of the
``sqlite3`` module, one per row) leave the hot path.

Schema (version 2, in ``meta.schema_version``)::

    meta(key TEXT PK, value TEXT)
    queues(id INT PK, name TEXT UNIQUE, partitions, mapper, ring_size,
           max_deliveries, dead_letter_queue, max_length)
    partitions(queue_id, partition, next_offset, delivered_upto)   PK (queue_id, partition)
    chunks(queue_id, partition, start, count, payload BLOB)         PK (queue_id, partition, start)
    settled(queue_id, partition, start, end)                        ranges [start, end), index (.., end)
    counts(queue_id, partition, "offset", dc)                       PK (queue_id, partition, offset)
    producers(queue_id, partition, producer_id, last_seq)           PK (queue_id, partition, producer_id)
    users(name TEXT PK, salt BLOB, hash BLOB, role, params)

Chunk payload: a msgpack array with one item per message, offsets
``start .. start+count-1`` in order; each item is the array
``[key: str|nil, headers: bin (msgpack map str->str), body: bin,
producer_id: str|nil, seq: uint|nil, ts: float]``.

Checkpoints: not SQLite's automatic one, which runs inside a commit and stalled the
writer for tens of ms; a background thread copies the WAL into the database
(PASSIVE, every 50 ms), and the writer, between two commits, copies the rest
once ~8 MiB of messages have been committed since the WAL last started over.
Without that last step a steady stream of commits never lets every frame be
copied, and SQLite reuses the WAL from its start only then: the file grew
without bound (``test_the_wal_starts_over_under_a_steady_stream_of_commits``).

The replication log is not in the database: it is kept in append-only segment files
beside it (``tandem.db-log/``, ``storage/segments.py``, which says why).  The ``ha_log``
table remains only to carry a log written by an earlier version over into them, on open.
``ha_state`` keeps each partition's hard state, compaction point and applied position:
they change with the store's own rows and commit with them.

Commits go through the driver connection (``_Driver``), not SQLAlchemy's statement
layer; reads, recovery and the schema use SQLAlchemy Core.

Durability maps onto SQLite's own machinery: ``sync=True`` commits with
``PRAGMA synchronous=FULL`` (the WAL is fsynced before the commit returns);
``sync=False`` with ``synchronous=NORMAL`` (WAL frames written to the OS,
fsynced at the next checkpoint).  Torn writes: every WAL frame carries a
checksum chained over the frames before it and a commit is a frame with the
commit flag; on open SQLite replays the WAL only up to the last intact commit,
so a partial last write is ignored (``tests/storage/test_recovery.py``).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections import ChainMap
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import msgpack
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from client.errors import StorageError
from storage.base import (
    Append,
    Capabilities,
    DropQueue,
    DropUser,
    MarkDelivered,
    MessageRecord,
    PackedRun,
    PartitionState,
    LogAppend,
    LogCompact,
    LogRecord,
    LogState,
    LogTruncate,
    PutApplied,
    PutHardState,
    DropProducers,
    PutProducer,
    PutQueue,
    ResetPartition,
    PutUser,
    QueueMeta,
    Recovered,
    SetDeliveryCount,
    Settle,
    StoredMessage,
    UserRecord,
    WriteOp,
    pack_run,
    unpack_run,
)
from storage.intervals import ChunkIndex, IntervalSet, ranges_of
from storage.segments import SEGMENT_BYTES, SegmentLog

log = logging.getLogger("tandem.storage")

CHECKPOINT_INTERVAL = 0.05  # seconds between background WAL checkpoints
#: WAL frames (as the background last saw), or message and log bytes written, after which
#: the writer finishes a checkpoint itself, between two commits, so that the WAL starts
#: over (see _finish_checkpoint)
WAL_RESTART_FRAMES = 2048
WAL_RESTART_BYTES = 8 * 1024 * 1024
SCHEMA_VERSION = "3"  # 3 adds the replication tables ha_log, ha_state; 2 is upgraded in place
_UPGRADABLE = {"2"}

_DDL = [
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS queues (
        id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, partitions INTEGER NOT NULL,
        mapper TEXT NOT NULL, ring_size INTEGER NOT NULL, max_deliveries INTEGER NOT NULL,
        dead_letter_queue TEXT, max_length INTEGER NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS partitions (
        queue_id INTEGER NOT NULL, partition INTEGER NOT NULL, next_offset INTEGER NOT NULL DEFAULT 0,
        delivered_upto INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (queue_id, partition))""",
    """CREATE TABLE IF NOT EXISTS chunks (
        queue_id INTEGER NOT NULL, partition INTEGER NOT NULL, start INTEGER NOT NULL,
        count INTEGER NOT NULL, payload BLOB NOT NULL, PRIMARY KEY (queue_id, partition, start))""",
    """CREATE TABLE IF NOT EXISTS settled (
        queue_id INTEGER NOT NULL, partition INTEGER NOT NULL, start INTEGER NOT NULL,
        "end" INTEGER NOT NULL)""",
    'CREATE INDEX IF NOT EXISTS settled_end ON settled (queue_id, partition, "end")',
    """CREATE TABLE IF NOT EXISTS counts (
        queue_id INTEGER NOT NULL, partition INTEGER NOT NULL, "offset" INTEGER NOT NULL,
        dc INTEGER NOT NULL, PRIMARY KEY (queue_id, partition, "offset"))""",
    """CREATE TABLE IF NOT EXISTS producers (
        queue_id INTEGER NOT NULL, partition INTEGER NOT NULL, producer_id TEXT NOT NULL,
        last_seq INTEGER NOT NULL, PRIMARY KEY (queue_id, partition, producer_id))""",
    """CREATE TABLE IF NOT EXISTS users (
        name TEXT PRIMARY KEY, salt BLOB NOT NULL, hash BLOB NOT NULL, role TEXT NOT NULL,
        params TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS ha_log (
        queue_id INTEGER NOT NULL, partition INTEGER NOT NULL, idx INTEGER NOT NULL, term INTEGER NOT NULL,
        origin TEXT NOT NULL, weak INTEGER NOT NULL, data BLOB NOT NULL,
        PRIMARY KEY (queue_id, partition, idx))""",
    """CREATE TABLE IF NOT EXISTS ha_state (
        queue_id INTEGER NOT NULL, partition INTEGER NOT NULL, term INTEGER NOT NULL DEFAULT 0,
        voted_for TEXT, commit_idx INTEGER NOT NULL DEFAULT 0,
        snap_index INTEGER NOT NULL DEFAULT 0, snap_term INTEGER NOT NULL DEFAULT 0,
        snap_origin TEXT NOT NULL DEFAULT '',
        applied_index INTEGER NOT NULL DEFAULT 0, applied_term INTEGER NOT NULL DEFAULT 0,
        applied_origin TEXT NOT NULL DEFAULT '', PRIMARY KEY (queue_id, partition))""",
]
_UPSERT_HARD = (
    "INSERT INTO ha_state (queue_id, partition, term, voted_for, commit_idx) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (queue_id, partition) DO UPDATE SET term = excluded.term, voted_for = excluded.voted_for, "
    "commit_idx = excluded.commit_idx"
)
_UPSERT_SNAP = (
    "INSERT INTO ha_state (queue_id, partition, snap_index, snap_term, snap_origin) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (queue_id, partition) DO UPDATE SET snap_index = excluded.snap_index, "
    "snap_term = excluded.snap_term, snap_origin = excluded.snap_origin"
)
_UPSERT_APPLIED = (
    "INSERT INTO ha_state (queue_id, partition, applied_index, applied_term, applied_origin) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (queue_id, partition) DO UPDATE SET applied_index = excluded.applied_index, "
    "applied_term = excluded.applied_term, applied_origin = excluded.applied_origin"
)

_INSERT_CHUNK = "INSERT INTO chunks (queue_id, partition, start, count, payload) VALUES (?, ?, ?, ?, ?)"
_UPSERT_END = (
    "INSERT INTO partitions (queue_id, partition, next_offset) VALUES (?, ?, ?) "
    "ON CONFLICT (queue_id, partition) DO UPDATE SET next_offset = max(next_offset, excluded.next_offset)"
)
_UPSERT_DELIVERED = (
    "INSERT INTO partitions (queue_id, partition, delivered_upto) VALUES (?, ?, ?) "
    "ON CONFLICT (queue_id, partition) DO UPDATE SET "
    "delivered_upto = max(delivered_upto, excluded.delivered_upto)"
)
_INSERT_SETTLED = 'INSERT INTO settled (queue_id, partition, start, "end") VALUES (?, ?, ?, ?)'
_UPSERT_COUNT = (
    'INSERT INTO counts (queue_id, partition, "offset", dc) VALUES (?, ?, ?, ?) '
    'ON CONFLICT (queue_id, partition, "offset") DO UPDATE SET dc = excluded.dc'
)
_UPSERT_PRODUCER = (
    "INSERT INTO producers (queue_id, partition, producer_id, last_seq) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (queue_id, partition, producer_id) DO UPDATE SET last_seq = excluded.last_seq"
)
_DELETE_CHUNK = "DELETE FROM chunks WHERE queue_id = ? AND partition = ? AND start = ?"
_DELETE_COUNTS = 'DELETE FROM counts WHERE queue_id = ? AND partition = ? AND "offset" >= ? AND "offset" < ?'
_DELETE_SETTLED_BELOW = 'DELETE FROM settled WHERE queue_id = ? AND partition = ? AND "end" <= ?'

Key = tuple[int, int]  # (queue_id, partition)


def _runs(messages: Sequence[MessageRecord]) -> Iterator[Sequence[MessageRecord]]:
    """Split into runs of consecutive offsets (one chunk each)."""
    begin = 0
    for i in range(1, len(messages)):
        if messages[i].offset != messages[i - 1].offset + 1:
            yield messages[begin:i]
            begin = i
    if messages:
        yield messages[begin:]


class _Driver:
    """The writer's statements on the driver connection, spelled like SQLAlchemy's
    ``exec_driver_sql``: a list of rows is ``executemany``, a tuple one ``execute``."""

    __slots__ = ("_raw",)

    def __init__(self, raw: sqlite3.Connection) -> None:
        self._raw = raw

    def exec_driver_sql(self, sql: str, params: list[Any] | tuple[Any, ...] = ()) -> sqlite3.Cursor:
        if type(params) is list:
            return self._raw.executemany(sql, params)
        return self._raw.execute(sql, params)


class SqliteEngine:
    """SQLite in WAL mode, one file per node (``<data_dir>/tandem.db``)."""

    capabilities = Capabilities(shared=False, fsync=True)

    def __init__(self, path: str | os.PathLike[str], *, log_segment_bytes: int = SEGMENT_BYTES) -> None:
        self.path = Path(path)
        self._engine: Engine | None = None  # created in open(), off the event loop
        self._writer: Connection | None = None
        self._local = threading.local()
        self._readers: list[Connection] = []  # one per reader thread, closed with the store
        self._readers_lock = threading.Lock()
        self._broken: str | None = None
        self._sync_mode: str | None = None
        self._index: dict[Key, ChunkIndex] = {}
        self._ends: dict[Key, int] = {}
        self._checkpointer: threading.Thread | None = None
        self._wal_frames = 0  # the WAL's length in frames at the last background checkpoint
        self._wal_bytes = 0  # message and log bytes committed since the WAL last started over
        self.wal_restarts = 0  # writer checkpoints that copied every frame (the WAL may start over)
        self._stop_checkpoints = threading.Event()
        self.log = SegmentLog(self.path.with_name(self.path.name + "-log"), segment_bytes=log_segment_bytes)
        #: each partition's compaction point as far as it is known to be on disk (the log's
        #: segments go by these), and the points committed since (not yet fsynced)
        self._durable_snaps: dict[Key, int] = {}
        self._pending_snaps: dict[Key, int] = {}
        self._check_segments = False
        self._segments_seen = 0

    @staticmethod
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        # 16 KiB pages: about twice the write throughput of the 4 KiB default for
        # 1 KiB messages (docs/benchmarks.md).  Effective only when the file is
        # created, so it must come before journal_mode.
        cur.execute("PRAGMA page_size=16384")
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=FULL")
        cur.execute("PRAGMA busy_timeout=10000")
        # Checkpoints run on a thread of their own (_checkpoints), not inside a commit:
        # an automatic one stalls the writer for tens of ms every ~1000 pages.
        cur.execute("PRAGMA wal_autocheckpoint=0")
        cur.close()
        # pysqlite opens a transaction only before DML, so each SELECT of a "read
        # transaction" would see its own snapshot.  SQLAlchemy's recipe: no implicit
        # transactions in the driver, an explicit BEGIN on every begin (see _on_begin).
        dbapi_conn.isolation_level = None

    @staticmethod
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN")

    # -- lifecycle ----------------------------------------------------------------------

    def open(self) -> Recovered:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._engine = create_engine(f"sqlite:///{self.path}", poolclass=NullPool)
        event.listen(self._engine, "connect", self._on_connect)
        event.listen(self._engine, "begin", self._on_begin)
        try:
            self._writer = self._engine.connect()
            with self._writer.begin():
                for ddl in _DDL:
                    self._writer.exec_driver_sql(ddl)
                self._writer.exec_driver_sql(
                    "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)", (SCHEMA_VERSION,)
                )
                old = self._writer.exec_driver_sql("SELECT value FROM meta WHERE key = 'schema_version'").scalar()
                if old in _UPGRADABLE:  # only tables were added since: created above
                    log.info("store %s upgraded from schema version %s to %s", self.path, old, SCHEMA_VERSION)
                    self._writer.exec_driver_sql("UPDATE meta SET value = ? WHERE key = 'schema_version'",
                                                 (SCHEMA_VERSION,))
            recovered = self._load(self._writer)
            self._writer.rollback()  # end the read transaction autobegun by _load
            self._open_log(recovered)
            self._stop_checkpoints.clear()
            self._checkpointer = threading.Thread(target=self._checkpoints, name="tandem-checkpoint", daemon=True)
            self._checkpointer.start()
            return recovered
        except SQLAlchemyError as exc:
            raise StorageError(f"cannot open store {self.path}: {exc.__class__.__name__}: {exc}", orig=exc) from exc

    def _checkpoints(self) -> None:
        """Copy the WAL into the database in the background (PASSIVE: never waits for,
        nor blocks, the writer or readers), every CHECKPOINT_INTERVAL seconds."""
        assert self._engine is not None  # started by open()
        try:
            conn = self._engine.connect()
        except SQLAlchemyError as exc:
            log.error("checkpoint thread cannot connect: %s", exc)
            return
        try:
            raw = conn.connection.driver_connection
            assert raw is not None  # an open connection has one
            while not self._stop_checkpoints.wait(CHECKPOINT_INTERVAL):
                try:
                    busy, frames, _copied = raw.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                except sqlite3.Error as exc:  # locked: the next round tries again
                    log.debug("checkpoint skipped: %s", exc)
                    continue
                if not busy and frames >= 0:  # (busy: the writer's own checkpoint holds the lock)
                    self._wal_frames = frames  # the writer finishes the job once the WAL is big
        finally:
            conn.close()

    def close(self) -> None:
        self._stop_checkpoints.set()
        if self._checkpointer is not None:
            self._checkpointer.join()
            self._checkpointer = None
        with self._readers_lock:
            readers, self._readers = self._readers, []
        for conn in readers:
            conn.close()
        if self._writer is not None:
            try:
                raw = self._writer.connection.driver_connection
                if raw is not None:
                    raw.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            except (sqlite3.Error, SQLAlchemyError) as exc:
                log.warning("final checkpoint failed (the WAL stays, nothing is lost): %s", exc)
            self._writer.close()
            self._writer = None
        self.log.close()
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

        def state(key: Key) -> PartitionState:
            st = parts.get(key)
            if st is None:
                st = parts[key] = PartitionState()
            return st

        for qid, p, nxt, delivered in conn.exec_driver_sql(
            "SELECT queue_id, partition, next_offset, delivered_upto FROM partitions"
        ):
            st = state((qid, p))
            st.next_offset, st.delivered_upto = nxt, delivered
        self._rebuild_index(conn)
        counts: dict[Key, dict[int, int]] = {}
        for qid, p, off, dc in conn.exec_driver_sql('SELECT queue_id, partition, "offset", dc FROM counts'):
            counts.setdefault((qid, p), {})[off] = dc
        for qid, p, start, payload in conn.exec_driver_sql(
            "SELECT queue_id, partition, start, payload FROM chunks ORDER BY queue_id, partition, start"
        ):
            key = (qid, p)
            st = state(key)
            settled = self._index[key].settled
            dcs = counts.get(key, {})
            for m in unpack_run(start, payload):
                if settled.contains(m.offset):
                    continue
                m.dc = dcs.get(m.offset, 0) + (1 if m.offset < st.delivered_upto else 0)
                st.messages.append(m)
            if st.messages and st.messages[-1].offset >= st.next_offset:
                st.next_offset = st.messages[-1].offset + 1
        for qid, p, pid, last in conn.exec_driver_sql(
            "SELECT queue_id, partition, producer_id, last_seq FROM producers"
        ):
            state((qid, p)).producers[pid] = last
        for name, salt, hsh, role, params in conn.exec_driver_sql(
            "SELECT name, salt, hash, role, params FROM users ORDER BY name"
        ):
            rec.users.append(UserRecord(name=name, salt=salt, hash=hsh, role=role, params=params))
        for row in conn.exec_driver_sql(
            "SELECT queue_id, partition, term, voted_for, commit_idx, snap_index, snap_term, snap_origin, "
            "applied_index, applied_term, applied_origin FROM ha_state"
        ):
            rec.logs[(row[0], row[1])] = LogState(row[2], row[3], row[4], (row[5], row[6], row[7]),
                                                  (row[8], row[9], row[10]))
        return rec

    def _open_log(self, rec: Recovered) -> None:
        """Replay the log's segments into ``rec.logs``; first carry over a log an earlier
        version kept in the ``ha_log`` table."""
        assert self._writer is not None
        raw = self._writer.connection.driver_connection
        assert raw is not None
        replayed = self.log.open()
        rows: dict[Key, list[LogRecord]] = {}
        for qid, p, idx, term, origin, weak, data in raw.execute(
            "SELECT queue_id, partition, idx, term, origin, weak, data FROM ha_log ORDER BY queue_id, partition, idx"
        ):
            rows.setdefault((qid, p), []).append(LogRecord(idx, term, origin, bool(weak), data))
        if rows:
            # Each partition's rows go in one record: after a crash here a partition is in
            # the segments whole or not at all, and the rows are still there either way.
            fresh = {key: recs for key, recs in rows.items() if key not in replayed}
            self.log.write([["A", key[0], key[1], [[r.index, r.term, r.origin, r.weak, r.data] for r in recs]]
                            for key, recs in fresh.items()], sync=True)
            raw.execute("DELETE FROM ha_log")
            log.info("store %s: replication log of %d partition(s) moved from the ha_log table to %s",
                     self.path, len(fresh), self.log.dir)
            replayed.update(fresh)
        for key, entries in replayed.items():
            st = rec.logs.setdefault(key, LogState())
            st.entries = self._usable(key, st, entries)
            if st.entries and st.entries[-1].term > st.term:
                # The entries of a new term reached the log, its hard state did not (a crash
                # between the two writes of one batch; nothing was answered for it): the
                # term is the entries', and no vote was cast in it.
                st.term, st.voted_for = st.entries[-1].term, None
        for key, st in rec.logs.items():
            if key not in replayed and st.applied[0] > st.snapshot[0]:
                st.snapshot = st.applied  # (a log lost whole: the store is its own snapshot)
        self._pending_snaps = {key: st.snapshot[0] for key, st in rec.logs.items()}
        self._make_durable()

    @staticmethod
    def _usable(key: Key, st: LogState, entries: list[LogRecord]) -> list[LogRecord]:
        """What of a replayed log a node can go on from, given its store's compaction point
        and applied position (``st.snapshot`` may move up to ``st.applied``).

        The log and the store are two files: after an OS crash the store can be on disk
        ahead of the log (its applied position past entries the log lost).  The store then
        stands as a snapshot at its applied position: the active's next append matches it
        by (index, term, origin) or, if the group went another way, sends a snapshot.  A
        hole or a term going back (stale entries after an installed snapshot whose log
        truncation did not reach the disk) ends the usable log: the active sends the rest
        again."""
        have = {e.index for e in entries}
        base, base_term = st.snapshot[0], st.snapshot[1]
        if st.applied[0] > base and any(i not in have for i in range(base + 1, st.applied[0] + 1)):
            log.warning("replication log of %d/%d ends before the store's applied position %d: the store stands "
                        "as the snapshot there", key[0], key[1], st.applied[0])
            st.snapshot = st.applied
            base, base_term = st.applied[0], st.applied[1]
        out: list[LogRecord] = []
        for e in entries:
            if e.index <= base:
                continue
            if e.index != base + 1 + len(out) or e.term < (out[-1].term if out else base_term):
                log.warning("replication log of %d/%d: entries from %d on do not follow on (a hole or an older "
                            "term); they are dropped, the active sends them again", key[0], key[1], e.index)
                break
            out.append(e)
        return out

    def load_partition(self, queue_id: int, partition: int) -> PartitionState:
        conn = self._reader()
        st = PartitionState()
        key = (queue_id, partition)
        try:
            with conn.begin():
                row = conn.exec_driver_sql(
                    "SELECT next_offset, delivered_upto FROM partitions WHERE queue_id = ? AND partition = ?",
                    key).first()
                if row is not None:
                    st.next_offset, st.delivered_upto = row
                settled = IntervalSet(conn.exec_driver_sql(
                    'SELECT start, "end" FROM settled WHERE queue_id = ? AND partition = ?', key).all())
                dcs: dict[int, int] = dict(conn.exec_driver_sql(
                    'SELECT "offset", dc FROM counts WHERE queue_id = ? AND partition = ?', key).all())
                for start, payload in conn.exec_driver_sql(
                        "SELECT start, payload FROM chunks WHERE queue_id = ? AND partition = ? ORDER BY start", key):
                    for m in unpack_run(start, payload):
                        if not settled.contains(m.offset):
                            m.dc = dcs.get(m.offset, 0) + (1 if m.offset < st.delivered_upto else 0)
                            st.messages.append(m)
                if st.messages and st.messages[-1].offset >= st.next_offset:
                    st.next_offset = st.messages[-1].offset + 1
                st.producers = dict(conn.exec_driver_sql(
                    "SELECT producer_id, last_seq FROM producers WHERE queue_id = ? AND partition = ?", key).all())
                pos = conn.exec_driver_sql("SELECT applied_index, applied_term, applied_origin FROM ha_state "
                                           "WHERE queue_id = ? AND partition = ?", key).first()
                if pos is not None:
                    st.applied = (pos[0], pos[1], pos[2])
        except SQLAlchemyError as exc:
            raise StorageError(f"read failed: {exc}", orig=exc) from exc
        return st

    def _reader(self) -> Connection:
        """This thread's read connection."""
        if self._engine is None:
            raise StorageError("store is not open")
        conn: Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._engine.connect()
            with self._readers_lock:
                self._readers.append(conn)
        return conn

    def _rebuild_index(self, conn: Connection) -> None:
        """Load the writer's chunk/settled index from the tables (open, or after a failed commit)."""
        index: dict[Key, ChunkIndex] = {}
        for qid, p, start, count in conn.exec_driver_sql(
            "SELECT queue_id, partition, start, count FROM chunks ORDER BY queue_id, partition, start"
        ):
            index.setdefault((qid, p), ChunkIndex()).add_chunk(start, count)
        for qid, p, s, e in conn.exec_driver_sql('SELECT queue_id, partition, start, "end" FROM settled'):
            index.setdefault((qid, p), ChunkIndex()).settled.add(s, e)
        ends = {(qid, p): nxt for qid, p, nxt in conn.exec_driver_sql(
            "SELECT queue_id, partition, next_offset FROM partitions")}
        for key, idx in index.items():
            if idx.starts:
                last = idx.starts[-1]
                ends[key] = max(ends.get(key, 0), last + idx.counts[last])
        self._index = index
        self._ends = ends

    # -- writes (writer thread) ------------------------------------------------------------

    def apply(self, ops: list[WriteOp], *, sync: bool, store_sync: bool | None = None) -> None:
        """``store_sync``: whether the database's part needs a synced commit (default
        ``sync``); the log's part is synced with ``sync``."""
        conn = self._writer
        if conn is None:
            raise StorageError("store is closed")
        if self._broken:
            raise StorageError(f"store state unknown after a failed commit ({self._broken}); restart the node")
        # Commits go straight to the driver connection (SQLAlchemy's statement layer cost
        # ~6 us a statement, a tenth of a commit's own work for a small batch); reads and
        # recovery keep SQLAlchemy.
        raw = conn.connection.driver_connection
        assert raw is not None  # an open connection has one
        records: list[list[Any]] = []
        store_ops: list[WriteOp] = []
        compacted: dict[Key, int] = {}
        for op in ops:
            kind = type(op)
            if kind is LogAppend:
                records.append(["A", op.queue_id, op.partition,  # type: ignore[union-attr]
                                [[e.index, e.term, e.origin, e.weak, e.data] for e in op.entries]])  # type: ignore[union-attr]
            elif kind is LogTruncate:
                records.append(["T", op.queue_id, op.partition, op.from_index])  # type: ignore[union-attr]
                self._check_segments = True  # (it may free the oldest segment)
            else:
                if kind is DropQueue:
                    records.append(["X", op.queue_id])  # type: ignore[union-attr]
                    self._check_segments = True
                elif kind is LogCompact:
                    compacted[(op.queue_id, op.partition)] = op.upto  # type: ignore[union-attr]
                store_ops.append(op)
        # The store first, then the log.  A crash between the two: a reset partition
        # (_resync) or an installed snapshot with the log not yet truncated (the stale
        # entries conflict with the active's and go); a store applied beyond its log, which
        # opening takes as a snapshot at the applied position (_open_log).  The other
        # order could leave a truncated log under a store still holding what was discarded.
        if store_ops:
            synced = sync if store_sync is None else store_sync
            self._commit_store(conn, raw, store_ops, synced)
            if compacted:
                self._pending_snaps.update(compacted)
                self._check_segments = True
            if synced and self._pending_snaps:
                self._durable_snaps.update(self._pending_snaps)
                self._pending_snaps.clear()
        self.log.write(records, sync=sync)
        if self._check_segments or self.log.segments != self._segments_seen:
            self._reclaim_segments()

    def log_pins(self) -> dict[Key, int]:
        """The partitions that keep the replication log's oldest segment, with their
        highest entry in it: compacting them past it lets it go (any thread)."""
        return self.log.pins()

    def _reclaim_segments(self) -> None:
        """Delete log segments that only hold compacted entries, once the compaction
        points that make them so are on disk (an fsync of the database first, if needed)."""
        self._check_segments = False
        committed = ChainMap(self._pending_snaps, self._durable_snaps)
        if self.log.segments > 1 and (self._pending_snaps and not self.log.reclaimable(self._durable_snaps)
                                      and self.log.reclaimable(committed)):
            self._make_durable()
        self.log.reclaim(self._durable_snaps, committed)
        self._segments_seen = self.log.segments

    def _make_durable(self) -> None:
        """Every commit so far on disk: the WAL's frames and the database fsynced (the log
        first, so that the store is not on disk ahead of it)."""
        self.log.sync()
        for path in (self.path.with_name(self.path.name + "-wal"), self.path):
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self._durable_snaps.update(self._pending_snaps)
        self._pending_snaps.clear()

    def _commit_store(self, conn: Connection, raw: sqlite3.Connection, ops: list[WriteOp], sync: bool) -> None:
        try:
            mode = "FULL" if sync else "NORMAL"
            if mode != self._sync_mode:
                if conn.in_transaction():
                    conn.rollback()
                raw.execute(f"PRAGMA synchronous={mode}")  # not inside a transaction: SQLite refuses
                self._sync_mode = mode
            raw.execute("BEGIN")
            try:
                self._apply(_Driver(raw), ops)
                raw.execute("COMMIT")
            except BaseException:
                if raw.in_transaction:
                    raw.execute("ROLLBACK")
                raise
        except (SQLAlchemyError, sqlite3.Error) as exc:
            self._recover_index(conn)
            raise StorageError(f"write failed: {exc.__class__.__name__}: {exc}", orig=exc) from exc
        except BaseException:
            self._recover_index(conn)
            raise
        if self._wal_frames >= WAL_RESTART_FRAMES or self._wal_bytes >= WAL_RESTART_BYTES:
            self._finish_checkpoint(raw)

    def _finish_checkpoint(self, raw: sqlite3.Connection) -> None:
        """The background checkpoints copy the WAL into the database, but under a steady
        stream of commits they never catch up with the last frame, and SQLite starts the
        WAL over only once every frame is copied: the file would grow without bound (and
        every new page of it costs the kernel a fresh page).  So once the WAL is big, the
        writer copies the remainder itself, between two commits (PASSIVE: it neither waits
        for nor blocks readers); its next transaction then writes from the WAL's start.
        The background has copied all but its last round, so this is short."""
        try:
            busy, frames, copied = raw.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except sqlite3.Error as exc:
            log.debug("writer checkpoint skipped: %s", exc)
            return
        # busy (the background's round holds the checkpoint lock) reads (1, -1, -1): after
        # the next commit.  Every frame copied: the next transaction starts the WAL over,
        # unless a reader still uses it (then the background's next report asks again).
        if not busy and frames >= 0 and frames == copied:
            self._wal_frames = self._wal_bytes = 0
            self.wal_restarts += 1

    def _recover_index(self, conn: Connection) -> None:
        """After a failed transaction, make the in-memory index match the disk again."""
        try:
            if conn.in_transaction():
                conn.rollback()
            self._rebuild_index(conn)
            conn.rollback()
        except SQLAlchemyError as exc:
            # Without a trustworthy index, compaction could delete live chunks: stop writing.
            self._broken = f"{exc.__class__.__name__}: {exc}"
            log.error("store index reload failed; refusing further writes: %s", self._broken)

    def _part(self, key: Key) -> ChunkIndex:
        idx = self._index.get(key)
        if idx is None:
            idx = self._index[key] = ChunkIndex()
        return idx

    def _apply(self, conn: _Driver, ops: list[WriteOp]) -> None:
        chunks: list[tuple[int, int, int, int, bytes]] = []
        ends: dict[Key, int] = {}
        delivered: dict[Key, int] = {}
        # Settlements and producer positions of a batch are merged before they are written:
        # a batch of held applies (broker/replication.py, HOLD_APPLY) carries hundreds of
        # acks, mostly consecutive, and a position per publish of each producer; a row per
        # range and one per producer say the same.
        settled: dict[Key, IntervalSet] = {}
        touched: dict[Key, list[tuple[int, int]]] = {}  # settled ranges, for _compact
        counts: list[tuple[int, int, int, int]] = []
        producers: dict[tuple[int, int, str], int] = {}
        unwritten: set[tuple[int, int, int]] = set()  # chunks of this batch never written
        wrote_counts = False

        def flush() -> None:
            nonlocal wrote_counts
            if chunks:
                # a chunk settled whole in this same batch is never written (compaction would
                # delete it in this transaction anyway), nor deleted
                live = []
                for c in chunks:
                    if self._index[(c[0], c[1])].settled.covers(c[2], c[2] + c[3]):
                        unwritten.add((c[0], c[1], c[2]))
                    else:
                        live.append(c)
                        # (the same start again after a reset in this batch: this one has a row)
                        unwritten.discard((c[0], c[1], c[2]))
                if live:
                    self._wal_bytes += sum(len(c[4]) for c in live)
                    conn.exec_driver_sql(_INSERT_CHUNK, live)
                chunks.clear()
            if ends:
                conn.exec_driver_sql(_UPSERT_END, [(q, p, e) for (q, p), e in ends.items()])
                ends.clear()
            if delivered:
                conn.exec_driver_sql(_UPSERT_DELIVERED, [(q, p, e) for (q, p), e in delivered.items()])
                delivered.clear()
            if counts:
                conn.exec_driver_sql(_UPSERT_COUNT, counts)
                counts.clear()
                wrote_counts = True
            if settled:
                conn.exec_driver_sql(_INSERT_SETTLED, [(q, p, s, e) for (q, p), ranges in settled.items()
                                                       for s, e in ranges])
                for key, ranges in settled.items():
                    touched.setdefault(key, []).extend(ranges)
                settled.clear()
            if producers:
                conn.exec_driver_sql(_UPSERT_PRODUCER, [(q, p, pid, seq) for (q, p, pid), seq in producers.items()])
                producers.clear()

        for op in ops:
            kind = type(op)
            if kind is Append:
                key = (op.queue_id, op.partition)  # type: ignore[union-attr]
                idx = self._part(key)
                msgs = op.messages  # type: ignore[union-attr]
                if type(msgs) is PackedRun:  # from a log entry: already in the chunk format
                    if msgs.length:
                        chunks.append((key[0], key[1], msgs.start, msgs.length, msgs.payload))
                        idx.add_chunk(msgs.start, msgs.length)
                else:
                    for run in _runs(msgs):
                        start = run[0].offset
                        chunks.append((key[0], key[1], start, len(run), pack_run(run)))
                        idx.add_chunk(start, len(run))
                ends[key] = max(ends.get(key, 0), op.next_offset)  # type: ignore[union-attr]
                self._ends[key] = max(self._ends.get(key, 0), op.next_offset)  # type: ignore[union-attr]
            elif kind is Settle:
                key = (op.queue_id, op.partition)  # type: ignore[union-attr]
                idx = self._part(key)
                mine = settled.get(key)
                if mine is None:
                    mine = settled[key] = IntervalSet()
                for s, e in ranges_of(op.offsets):  # type: ignore[union-attr]
                    mine.add(s, e)
                    idx.settled.add(s, e)
            elif kind is MarkDelivered:
                key = (op.queue_id, op.partition)  # type: ignore[union-attr]
                delivered[key] = max(delivered.get(key, 0), op.upto)  # type: ignore[union-attr]
            elif kind is SetDeliveryCount:
                q, p = op.queue_id, op.partition  # type: ignore[union-attr]
                counts.extend((q, p, o, dc) for o, dc in op.items)  # type: ignore[union-attr]
            elif kind is PutProducer:
                producers[(op.queue_id, op.partition, op.producer_id)] = op.last_seq  # type: ignore[union-attr]
            else:
                flush()
                self._apply_structural(conn, op)
        flush()
        if touched:
            self._compact(conn, touched, unwritten, wrote_counts)

    def _compact(self, conn: _Driver, touched: dict[Key, list[tuple[int, int]]],
                 unwritten: set[tuple[int, int, int]], wrote_counts: bool) -> None:
        """Delete chunks whose messages are all settled, and the bookkeeping below the log's start.
        ``unwritten``: chunks this transaction did not write (no row to delete; and no delivery
        counts either, unless it wrote some: a chunk's counts come after it)."""
        drop_chunks: list[tuple[int, int, int]] = []
        drop_counts: list[tuple[int, int, int, int]] = []
        drop_settled: list[tuple[int, int, int]] = []
        for key, ranges in touched.items():
            idx = self._index.get(key)
            if idx is None:
                continue
            for s, e in ranges:
                for start in idx.settled_chunks(s, e):
                    n = idx.counts[start]
                    idx.drop_chunk(start)
                    if (key[0], key[1], start) not in unwritten:
                        drop_chunks.append((key[0], key[1], start))
                    elif not wrote_counts:
                        continue
                    drop_counts.append((key[0], key[1], start, start + n))
            low = idx.low(self._ends.get(key, 0))
            if len(idx.settled) and next(iter(idx.settled))[0] < low:
                idx.settled.drop_below(low)
                drop_settled.append((key[0], key[1], low))
        if drop_chunks:
            conn.exec_driver_sql(_DELETE_CHUNK, drop_chunks)
        if drop_counts:
            conn.exec_driver_sql(_DELETE_COUNTS, drop_counts)
        if drop_settled:
            # rows wholly below the log's start go; a row straddling it stays (harmless)
            conn.exec_driver_sql(_DELETE_SETTLED_BELOW, drop_settled)

    def _apply_structural(self, conn: _Driver, op: WriteOp) -> None:
        if isinstance(op, DropProducers):
            conn.exec_driver_sql("DELETE FROM producers WHERE queue_id = ? AND partition = ? AND producer_id = ?",
                                 [(op.queue_id, op.partition, pid) for pid in op.producer_ids])
            return
        if isinstance(op, PutQueue):
            q = op.queue
            conn.exec_driver_sql(
                "INSERT OR REPLACE INTO queues (id, name, partitions, mapper, ring_size, "
                "max_deliveries, dead_letter_queue, max_length) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (q.id, q.name, q.partitions, q.mapper, q.ring_size, q.max_deliveries,
                 q.dead_letter_queue, q.max_length),
            )
            # queue ids are never reused, even after the newest queue is deleted
            conn.exec_driver_sql(
                "INSERT INTO meta (key, value) VALUES ('queue_id_hwm', ?) ON CONFLICT (key) DO UPDATE SET "
                "value = CAST(max(CAST(value AS INTEGER), CAST(excluded.value AS INTEGER)) AS TEXT)",
                (str(q.id),),
            )
        elif isinstance(op, DropQueue):
            for table in ("chunks", "settled", "counts", "partitions", "producers", "ha_state"):
                conn.exec_driver_sql(f"DELETE FROM {table} WHERE queue_id = ?", (op.queue_id,))
            conn.exec_driver_sql("DELETE FROM queues WHERE id = ?", (op.queue_id,))
            for key in [k for k in self._index if k[0] == op.queue_id]:
                del self._index[key]
                self._ends.pop(key, None)
        elif isinstance(op, LogCompact):
            conn.exec_driver_sql(_UPSERT_SNAP, (op.queue_id, op.partition, op.upto, op.term, op.origin))
        elif isinstance(op, PutHardState):
            conn.exec_driver_sql(_UPSERT_HARD, (op.queue_id, op.partition, op.term, op.voted_for, op.commit))
        elif isinstance(op, PutApplied):
            conn.exec_driver_sql(_UPSERT_APPLIED, (op.queue_id, op.partition, op.index, op.term, op.origin))
        elif isinstance(op, ResetPartition):
            key = (op.queue_id, op.partition)
            for table in ("chunks", "settled", "counts", "partitions", "producers"):
                conn.exec_driver_sql(f"DELETE FROM {table} WHERE queue_id = ? AND partition = ?", key)
            self._index.pop(key, None)
            self._ends.pop(key, None)
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

    # -- reads (reader threads) ----------------------------------------------------------------

    def stored_end(self, queue_id: int, partition: int) -> int:
        conn = self._reader()
        try:
            with conn.begin():
                end = conn.exec_driver_sql("SELECT next_offset FROM partitions WHERE queue_id = ? AND partition = ?",
                                           (queue_id, partition)).scalar()
        except SQLAlchemyError as exc:
            raise StorageError(f"read failed: {exc}", orig=exc) from exc
        return int(end or 0)

    def read(self, queue_id: int, partition: int, offset: int, limit: int) -> list[StoredMessage]:
        conn = self._reader()
        out: list[StoredMessage] = []
        try:
            with conn.begin():
                settled = IntervalSet(conn.exec_driver_sql(
                    'SELECT start, "end" FROM settled WHERE queue_id = ? AND partition = ? AND "end" > ?',
                    (queue_id, partition, offset)).all())
                first = conn.exec_driver_sql(
                    "SELECT start FROM chunks WHERE queue_id = ? AND partition = ? AND start <= ? "
                    "ORDER BY start DESC LIMIT 1", (queue_id, partition, offset)).scalar()
                rows = conn.exec_driver_sql(
                    "SELECT start, payload FROM chunks WHERE queue_id = ? AND partition = ? AND start >= ? "
                    "ORDER BY start", (queue_id, partition, offset if first is None else first))
                for start, payload in rows:
                    for m in unpack_run(start, payload):
                        if m.offset >= offset and not settled.contains(m.offset):
                            out.append(m)
                            if len(out) >= limit:
                                return out
        except SQLAlchemyError as exc:
            raise StorageError(f"read failed: {exc}", orig=exc) from exc
        return out
