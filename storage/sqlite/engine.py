"""The SQLite engine: its connections, its commit path and the durability of the
replication log's compaction points; the tables are written by ``apply``, read by
``reads``, recovered by ``recovery``, checkpointed by ``checkpoints``."""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
from collections import ChainMap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from client.errors import StorageError
from storage.base import (
    Capabilities,
    DropQueue,
    LogAppend,
    LogCompact,
    LogTruncate,
    PartitionState,
    PutMeta,
    Recovered,
    StoredMessage,
    WriteOp,
)
from storage.segments import SEGMENT_BYTES, SegmentLog, fsync_dir, make_dir, repair_key
from storage.sqlite import rowsums
from storage.sqlite.apply import Driver, OpApplier
from storage.sqlite.checkpoints import Checkpointer
from storage.sqlite.reads import (DamagedStore, driver_error, read_chunks, read_messages, read_partition,
                                  read_stored_end, unreadable)
from storage.sqlite.recovery import load, replay_log
from storage.sqlite.schema import Key, create_schema

log = logging.getLogger("tandem.storage")


def _opening_error(exc: SQLAlchemyError, path: Path) -> str:
    """Why opening failed, in one line, and what to do when the disk gave back damaged or
    unreadable pages."""
    why = driver_error(exc)
    if unreadable(exc):
        why += (f" (the disk gave back damaged or unreadable pages: tandem scrub --data-dir {path.parent} says "
                f"what it can read; this node does not start: restore its data directory, or take it out of its "
                f"group and add it back on an empty one, docs/operations.md#remove-a-member)")
    return why


class SqliteEngine:
    """SQLite in WAL mode, one file per node (``<data_dir>/tandem.db``)."""

    capabilities = Capabilities(shared=False, fsync=True)
    load_budget = 0  # Engine.load_budget
    #: the checkpoint on close: TRUNCATE empties the WAL (it waits for other connections,
    #: so an engine sharing the file with other processes copies what it can: PASSIVE)
    _final_checkpoint = "TRUNCATE"
    #: a file ``<db>-open`` says the store is open: found on open, the last stop was not a
    #: clean close (Recovered.unclean_stop)
    _open_mark = True

    def __init__(self, path: str | os.PathLike[str], *, log_segment_bytes: int = SEGMENT_BYTES) -> None:
        self.path = Path(path)
        self._engine: Engine | None = None  # created in open(), off the event loop
        self._writer: Connection | None = None
        self._local = threading.local()
        self._readers: list[Connection] = []  # one per reader thread, closed with the store
        self._readers_lock = threading.Lock()
        # reads in flight on reader threads: close() waits for them, since closing a
        # connection another thread is reading on crashes the process
        self._reads = threading.Condition(threading.Lock())
        self._reads_in_flight = 0
        self._closing = False
        self._broken: str | None = None
        self._sync_mode: str | None = None
        self._applier = OpApplier()
        self._checkpointer = Checkpointer()
        self.log = SegmentLog(self.path.with_name(self.path.name + "-log"), segment_bytes=log_segment_bytes)
        #: each partition's compaction point as far as it is known to be on disk (the log's
        #: segments go by these), and the points committed since (not yet fsynced)
        self._durable_snaps: dict[Key, int] = {}
        self._pending_snaps: dict[Key, int] = {}
        self._set_aside = False  # (set_aside_log: at the writer's next write)
        self._check_segments = False
        self._segments_seen = 0
        self._marked = False  # this open wrote (or found) the open mark: a clean close removes it

    @property
    def wal_restarts(self) -> int:
        """Writer checkpoints that copied every frame (the WAL may start over)."""
        return self._checkpointer.restarts

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
        # Checkpoints run on a thread of their own (storage/sqlite/checkpoints.py), not
        # inside a commit: an automatic one stalls the writer for tens of ms every ~1000 pages.
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
        make_dir(self.path.parent)
        new = not self.path.exists()
        self._engine = create_engine(f"sqlite:///{self.path}", poolclass=NullPool)
        event.listen(self._engine, "connect", self._on_connect)
        event.listen(self._engine, "begin", self._on_begin)
        try:
            self._writer = self._engine.connect()
            self._create_schema(self._writer)
            recovered = load(self._writer, self.path, self._applier, self.load_budget)
            self._writer.rollback()  # end the read transaction autobegun by load
            moved = replay_log(self.log, self._raw(self._writer), recovered, self.path,
                               clean=self._open_mark and not new and not self._mark.exists())
            self._mark_repairs(recovered, moved)
            self._pending_snaps = {key: st.snapshot[0] for key, st in recovered.logs.items()}
            self._make_durable()
            if new:
                fsync_dir(self.path.parent)  # the database's and the WAL's names
            if self._open_mark:
                recovered.unclean_stop = self._mark_open()
            self._checkpointer.start(self._engine)
            return recovered
        except SQLAlchemyError as exc:
            if self._writer is not None:  # (no final checkpoint into a store that did not open)
                with contextlib.suppress(SQLAlchemyError):
                    self._writer.close()
                self._writer = None
            raise StorageError(f"cannot open store {self.path}: {_opening_error(exc, self.path)}", orig=exc) from exc

    @property
    def _mark(self) -> Path:
        return self.path.with_name(self.path.name + "-open")

    def _mark_open(self) -> bool:
        """Say on disk that the store is open; whether it already said so (not closed)."""
        mark = self._mark
        found = mark.exists()
        if not found:
            fd = os.open(mark, os.O_WRONLY | os.O_CREAT, 0o644)
            os.close(fd)
            fsync_dir(mark.parent)
        self._marked = True
        return found

    def _create_schema(self, conn: Connection) -> None:
        create_schema(conn, self.path)

    def close(self) -> None:
        self._checkpointer.stop()
        with self._reads:
            self._closing = True
            while self._reads_in_flight:
                self._reads.wait()
        with self._readers_lock:
            readers, self._readers = self._readers, []
        for conn in readers:
            conn.close()
        if self._writer is not None:
            try:
                raw = self._writer.connection.driver_connection
                if raw is not None:
                    raw.execute(f"PRAGMA wal_checkpoint({self._final_checkpoint})").fetchall()
            except (sqlite3.Error, SQLAlchemyError) as exc:
                log.warning("final checkpoint failed (the WAL stays, nothing is lost): %s", exc)
            self._writer.close()
            self._writer = None
        self.log.close()
        if self._engine is not None:
            self._engine.dispose()
            if self._marked and self._broken is None:
                try:
                    self._mark.unlink()
                    fsync_dir(self._mark.parent)
                except FileNotFoundError:
                    pass
                except OSError as exc:  # a failing disk: the next start may call this stop unclean
                    log.warning("the store's open mark %s could not be removed: %s", self._mark, exc)

    @staticmethod
    def _raw(conn: Connection) -> sqlite3.Connection:
        raw = conn.connection.driver_connection
        assert raw is not None  # an open connection has one
        return raw

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

    # -- writes (writer thread) ------------------------------------------------------------

    def apply(self, ops: list[WriteOp], *, sync: bool, store_sync: bool | None = None) -> None:
        """``store_sync``: whether the database's part needs a synced commit (default
        ``sync``); the log's part is synced with ``sync``."""
        conn = self._writer
        if conn is None:
            raise StorageError("store is closed")
        if self._broken:
            raise StorageError(f"store state unknown after a failed commit ({self._broken}); restart the node")
        records: list[list[Any]] = []
        store_ops: list[WriteOp] = []
        compacted: dict[Key, int] = {}
        for op in ops:
            kind = type(op)
            if kind is LogAppend:
                rec = ["A", op.queue_id, op.partition,  # type: ignore[union-attr]
                       [[e.index, e.term, e.origin, e.weak, e.data] for e in op.entries]]  # type: ignore[union-attr]
                if op.commit:  # type: ignore[union-attr]
                    rec.append(op.commit)  # type: ignore[union-attr]
                records.append(rec)
            elif kind is LogTruncate:
                records.append(["T", op.queue_id, op.partition, op.from_index])  # type: ignore[union-attr]
                self._check_segments = True  # (it may free the oldest segment)
            else:
                if kind is DropQueue:
                    records.append(["X", op.queue_id])  # type: ignore[union-attr]
                    self._check_segments = True
                    for snaps in (self._pending_snaps, self._durable_snaps):  # (its log is gone with it)
                        for key in [k for k in snaps if k[0] == op.queue_id]:  # type: ignore[union-attr]
                            del snaps[key]
                elif kind is LogCompact:
                    compacted[(op.queue_id, op.partition)] = op.upto  # type: ignore[union-attr]
                store_ops.append(op)
        # The store first, then the log.  A crash between the two: a reset partition
        # (_resync) or an installed snapshot with the log not yet truncated (the stale
        # entries conflict with the active's and go); a store applied beyond its log, which
        # opening takes as a snapshot at the applied position (recovery.replay_log).  The
        # other order could leave a truncated log under a store still holding what was
        # discarded.
        if store_ops:
            synced = sync if store_sync is None else store_sync
            self._commit_store(conn, store_ops, synced)
            if compacted:
                self._pending_snaps.update(compacted)
                self._check_segments = True
            if synced and self._pending_snaps:
                self._durable_snaps.update(self._pending_snaps)
                self._pending_snaps.clear()
        self.log.write(records, sync=sync)
        if records:
            self.log.sweep(ChainMap(self._pending_snaps, self._durable_snaps))
        if self._set_aside:
            self._set_aside = False
            aside = self.log.set_aside()
            if aside is not None:
                log.warning("replication log: the damaged segments moved to %s (kept for a look, never read)", aside)
        if self._check_segments or self.log.segments != self._segments_seen:
            self._reclaim_segments()

    def _commit_store(self, conn: Connection, ops: list[WriteOp], sync: bool) -> None:
        # Commits go straight to the driver connection (apply.Driver); reads and recovery
        # keep SQLAlchemy.
        raw = self._raw(conn)
        try:
            mode = "FULL" if sync else "NORMAL"
            if mode != self._sync_mode:
                if conn.in_transaction():
                    conn.rollback()
                raw.execute(f"PRAGMA synchronous={mode}")  # not inside a transaction: SQLite refuses
                self._sync_mode = mode
            self._begin_write(raw)
            try:
                written = self._applier.apply(Driver(raw), ops)
                raw.execute("COMMIT")
            except BaseException:
                if raw.in_transaction:
                    raw.execute("ROLLBACK")
                raise
        except (SQLAlchemyError, sqlite3.Error) as exc:
            self._recover_index(conn)
            failed = DamagedStore if unreadable(exc) else StorageError
            raise failed(f"write failed: {exc.__class__.__name__}: {exc}", orig=exc) from exc
        except BaseException:
            self._recover_index(conn)
            raise
        self._checkpointer.wal_bytes += written
        if self._checkpointer.due():
            self._checkpointer.finish(raw)

    def _begin_write(self, raw: sqlite3.Connection) -> None:
        """Start the writer's transaction (a subclass may check something inside it)."""
        raw.execute("BEGIN")

    def _recover_index(self, conn: Connection) -> None:
        """After a failed transaction, make the in-memory index match the disk again."""
        try:
            if conn.in_transaction():
                conn.rollback()
            self._applier.reload(conn)
            conn.rollback()
        except SQLAlchemyError as exc:
            # Without a trustworthy index, compaction could delete live chunks: stop writing.
            self._broken = f"{exc.__class__.__name__}: {exc}"
            log.error("store index reload failed; refusing further writes: %s", self._broken)

    def _mark_repairs(self, rec: Recovered, ops: list[WriteOp]) -> None:
        """The partitions a damaged log leaves under repair are marked so in the store, durably,
        before the damaged segments go aside (storage.segments.REPAIR_KEY), with ``ops``."""
        marks: list[WriteOp] = [PutMeta(repair_key(key), "1") for key, st in rec.logs.items()
                                if st.damaged and not st.marked]
        if (marks or ops) and self._writer is not None:
            self._commit_store(self._writer, [*ops, *marks], True)

    def set_aside_log(self) -> None:
        """The node goes on without the damaged log :meth:`open` found (Recovered.log_damage):
        its segments are moved aside at the writer's next write, so a restart does not find
        the damage again."""
        self._set_aside = True

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

    def set_meta(self, key: str, value: str) -> None:
        conn = self._writer
        if conn is None:
            raise StorageError("store is closed")
        try:
            with conn.begin():
                conn.exec_driver_sql("INSERT OR REPLACE INTO meta (key, value, crc) VALUES (?, ?, ?)",
                                     (key, value, rowsums.row_crc(key, value)))
        except SQLAlchemyError as exc:
            raise StorageError(f"write failed: {exc}", orig=exc) from exc

    # -- reads (reader threads) ----------------------------------------------------------------

    @contextmanager
    def _reading(self) -> Iterator[Connection]:
        """This thread's read connection, counted in flight so that close() waits for it."""
        with self._reads:
            if self._closing:
                raise StorageError("store is closed")
            self._reads_in_flight += 1
        try:
            yield self._reader()
        finally:
            with self._reads:
                self._reads_in_flight -= 1
                if not self._reads_in_flight:
                    self._reads.notify_all()

    def load_partition(self, queue_id: int, partition: int, budget: int = 0) -> PartitionState:
        with self._reading() as conn:
            return read_partition(conn, queue_id, partition, budget)

    def stored_end(self, queue_id: int, partition: int) -> int:
        with self._reading() as conn:
            return read_stored_end(conn, queue_id, partition)

    def chunks(self, queue_id: int, partition: int) -> list[tuple[int, int, int]]:
        with self._reading() as conn:
            return read_chunks(conn, queue_id, partition)

    def read(self, queue_id: int, partition: int, offset: int, limit: int) -> list[StoredMessage]:
        with self._reading() as conn:
            return read_messages(conn, queue_id, partition, offset, limit)
