"""Shared mode on one machine: nodes (processes) sharing one SQLite file (``sqlite:///PATH``).

SQLite has one writer at a time per file, across processes: a write transaction holds the
file's write lock from ``BEGIN IMMEDIATE`` to its end.  Fencing uses that: a fenced engine
begins every write transaction with ``BEGIN IMMEDIATE`` and reads the lease row's epoch
inside it, before any write; a takeover (the lease's ``UPDATE``) needs the same lock, so it
is granted either before the transaction begins (which then reads the new epoch and raises
:class:`~storage.shared.FencedError`, with nothing written) or after it has committed, never
in between.

The lease row (``storage.lease``) keeps time by SQLite's clock (``julianday('now')``: the
machine's, to the millisecond), which all the nodes on the machine share.

Limits: a process stopped (SIGSTOP) inside a write transaction holds the write lock until it
resumes or dies, and until then no other node can take the lease (nor write): safe, since
nothing else commits meanwhile, but no failover either; PostgreSQL ends such a transaction
(``storage.postgres``).  Shared mode keeps no replication log: the replication ops
(:data:`storage.base.REPLICATION_OPS`) are refused, and the engine's log segment directory
beside the file stays empty.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any, cast

import filelock
from sqlalchemy import Connection, create_engine, event
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from client.errors import StorageError
from storage.base import REPLICATION_OPS, Capabilities, WriteOp
from storage.lease import TABLE, SqlLease
from storage.shared import FencedError
from storage.sqlite import rowsums
from storage.sqlite.apply import Driver
from storage.sqlite.engine import SqliteEngine

#: the database's clock in seconds since 1970 (julianday: days since noon, 24 Nov 4714 BC)
NOW = "((julianday('now') - 2440587.5) * 86400.0)"

LEASE_DDL = [
    f"""CREATE TABLE IF NOT EXISTS {TABLE} (
        id INTEGER PRIMARY KEY CHECK (id = 1), holder TEXT, epoch INTEGER NOT NULL,
        address TEXT NOT NULL, until REAL)""",
    f"INSERT OR IGNORE INTO {TABLE} (id, holder, epoch, address, until) VALUES (1, NULL, 0, '', 0)",
]


def create_lease_table(raw: sqlite3.Connection) -> None:
    """The lease table and its row, in one write transaction (two processes doing this at
    once: one creates, the other finds them); no transaction if they are there."""
    if raw.execute(f"SELECT count(*) FROM sqlite_master WHERE name = '{TABLE}'").fetchone()[0] and \
            raw.execute(f"SELECT count(*) FROM {TABLE}").fetchone()[0]:
        return
    raw.execute("BEGIN IMMEDIATE")
    try:
        for ddl in LEASE_DDL:
            raw.execute(ddl)
        raw.execute("COMMIT")
    except BaseException:
        if raw.in_transaction:
            raw.execute("ROLLBACK")
        raise


class SharedSqliteEngine(SqliteEngine):
    """The SQLite engine of a shared-mode node: fenced writes, no replication log."""

    capabilities = Capabilities(shared=True, fsync=True, replication_log=False)
    _final_checkpoint = "PASSIVE"  # other processes use the file: do not wait for them
    _open_mark = False  # (nor does one process's stop say anything of the others')

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path)
        self._epoch: int | None = None
        self._stale = False  # the writer's index must be read again before the next write
        self._immediate = False  # the writer's next transaction takes the write lock at once

    def fence(self, epoch: int | None) -> None:
        if epoch != self._epoch:
            # another node may have written since this one last did: read the index again
            self._stale = True
        self._epoch = epoch

    def _make_durable(self) -> None:
        # The base engine fsyncs the database file through a descriptor of its own, and
        # closing any descriptor of a file drops every POSIX lock the process holds on it,
        # SQLite's included: with another process using the file that corrupts it.  Here
        # there is no replication log to keep ahead of the store, so nothing to do.
        self._durable_snaps.update(self._pending_snaps)
        self._pending_snaps.clear()

    def _on_begin(self, conn: Any) -> None:  # type: ignore[override]
        # The schema's creation takes the write lock at once: a deferred transaction that
        # reads first may find at its first write that another process wrote meanwhile, and
        # fail (SQLITE_BUSY_SNAPSHOT) without waiting.  Loading is a read transaction: it must
        # not hold up the active's writes and lease renewals for as long as it takes.
        conn.exec_driver_sql("BEGIN IMMEDIATE" if self._immediate and conn is self._writer else "BEGIN")

    def _create_schema(self, conn: Connection) -> None:
        self._immediate = True
        try:
            super()._create_schema(conn)
            create_lease_table(self._raw(conn))
        finally:
            self._immediate = False

    def _begin_write(self, raw: sqlite3.Connection) -> None:
        raw.execute("BEGIN IMMEDIATE")
        try:
            if self._epoch is not None:
                self._check_epoch(raw)
            if self._stale:  # (under the write lock: nobody writes meanwhile)
                self._applier.reload(cast(Connection, Driver(raw)))
                self._stale = False
        except BaseException:
            raw.execute("ROLLBACK")
            raise

    def _check_epoch(self, raw: sqlite3.Connection) -> None:
        row = raw.execute(f"SELECT epoch FROM {TABLE} WHERE id = 1").fetchone()
        in_db = -1 if row is None else int(row[0])
        if in_db != self._epoch:
            raise FencedError(f"write refused: the database's activation epoch is {in_db}, this node's "
                              f"{self._epoch}", epoch=in_db)

    def apply(self, ops: list[WriteOp], *, sync: bool, store_sync: bool | None = None) -> None:
        for op in ops:
            if type(op) in REPLICATION_OPS:
                raise StorageError(f"{type(op).__name__}: shared mode keeps no replication log")
        super().apply(ops, sync=sync, store_sync=store_sync)

    def set_meta(self, key: str, value: str) -> None:
        conn = self._writer
        if conn is None:
            raise StorageError("store is closed")
        try:
            if conn.in_transaction():
                conn.rollback()
            raw = self._raw(conn)
            self._begin_write(raw)
            try:
                raw.execute("INSERT OR REPLACE INTO meta (key, value, crc) VALUES (?, ?, ?)",
                            (key, value, rowsums.row_crc(key, value)))
                raw.execute("COMMIT")
            except BaseException:
                if raw.in_transaction:
                    raw.execute("ROLLBACK")
                raise
        except (SQLAlchemyError, sqlite3.Error) as exc:
            raise StorageError(f"write failed: {exc}", orig=exc) from exc


class SqliteShared:
    """:class:`storage.shared.SharedStore` for nodes on one machine sharing ``path``."""

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout: float = 10.0) -> None:
        self.path = Path(path)
        #: seconds a lease operation waits for another process's write transaction
        self.busy_timeout = busy_timeout

    def engine(self) -> SharedSqliteEngine:
        self._create_file()
        return SharedSqliteEngine(self.path)

    def _create_file(self) -> None:
        """Create the file, in WAL mode with the engine's page size and the lease table, one
        process at a time (a lock file beside it).  Two processes setting up a new file at
        once can each write a first page of their own and leave a malformed database."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with filelock.FileLock(str(self.path) + ".create-lock", timeout=self.busy_timeout):
            raw = sqlite3.connect(self.path, isolation_level=None, timeout=self.busy_timeout)
            try:
                if raw.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                    raw.execute("PRAGMA page_size=16384")
                    raw.execute("PRAGMA journal_mode=WAL")
                create_lease_table(raw)
            except sqlite3.Error as exc:
                raise StorageError(f"cannot create shared store {self.path}: {exc.__class__.__name__}: {exc}",
                                   orig=exc) from exc
            finally:
                raw.close()

    def lease(self) -> SqlLease:
        try:
            self._create_file()
        except filelock.Timeout:
            raise StorageError(f"cannot create shared store {self.path}: another process holds "
                               f"{self.path}.create-lock") from None
        engine = create_engine(f"sqlite:///{self.path}", poolclass=NullPool)
        # SQLite's settings as the engine's (WAL: the lease and the engine share the file);
        # no BEGIN of SQLAlchemy's: each statement commits on its own (one UPDATE each)
        event.listen(engine, "connect", SqliteEngine._on_connect)
        busy_ms = int(self.busy_timeout * 1000)

        @event.listens_for(engine, "connect")
        def _patience(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.execute(f"PRAGMA busy_timeout={busy_ms}")

        def prepare(conn: Connection) -> None:
            raw = conn.connection.driver_connection
            assert raw is not None  # an open connection has one
            create_lease_table(raw)

        return SqlLease(engine, now=NOW, prepare=prepare, where=str(self.path), errors=(sqlite3.Error,),
                        describe=lambda exc: f"{exc.__class__.__name__}: {exc}")
