"""The PostgreSQL engine: its connections, its commit path (fenced), and the dialect
adapter through which it shares SQLite's statements, reads and recovery."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import psycopg
from sqlalchemy import URL, Connection, Engine, create_engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import PoolProxiedConnection

from client.errors import StorageError
from storage.base import REPLICATION_OPS, Capabilities, PartitionState, Recovered, StoredMessage, WriteOp
from storage.lease import TABLE
from storage.postgres.schema import create_schema
from storage.shared import FencedError
from storage.sqlite.apply import OpApplier
from storage.sqlite.reads import read_chunks, read_messages, read_partition, read_stored_end
from storage.sqlite.recovery import load

log = logging.getLogger("tandem.storage")

_translated: dict[str, str] = {}


def pg_sql(sql: str) -> str:
    """A statement written with ``?`` placeholders (SQLite's), as psycopg takes it (``%s``)."""
    out = _translated.get(sql)
    if out is None:
        out = _translated[sql] = sql.replace("%", "%%").replace("?", "%s")
    return out


class PgApplier(OpApplier):
    """SQLite's op applier with PostgreSQL's spelling of the statements that differ; shared
    mode has no feature level, so no row checksums (PostgreSQL's page checksums are its own)."""

    ROW_SUMS = False

    UPSERT_END = (
        "INSERT INTO partitions (queue_id, partition, next_offset) VALUES (?, ?, ?) "
        "ON CONFLICT (queue_id, partition) DO UPDATE SET "
        "next_offset = greatest(partitions.next_offset, excluded.next_offset)"
    )
    UPSERT_DELIVERED = (
        "INSERT INTO partitions (queue_id, partition, delivered_upto) VALUES (?, ?, ?) "
        "ON CONFLICT (queue_id, partition) DO UPDATE SET "
        "delivered_upto = greatest(partitions.delivered_upto, excluded.delivered_upto)"
    )
    PUT_QUEUE = (
        "INSERT INTO queues (id, name, partitions, mapper, ring_size, max_deliveries, dead_letter_queue, "
        "max_length, owner, max_length_bytes, overflow, message_ttl, expires, type, max_age, max_bytes, "
        "dead_letter_exchange, dead_letter_routing_key, crc) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (id) DO UPDATE SET "
        "name = excluded.name, partitions = excluded.partitions, mapper = excluded.mapper, "
        "ring_size = excluded.ring_size, max_deliveries = excluded.max_deliveries, "
        "dead_letter_queue = excluded.dead_letter_queue, max_length = excluded.max_length, owner = excluded.owner, "
        "max_length_bytes = excluded.max_length_bytes, overflow = excluded.overflow, "
        "message_ttl = excluded.message_ttl, expires = excluded.expires, type = excluded.type, "
        "max_age = excluded.max_age, max_bytes = excluded.max_bytes, "
        "dead_letter_exchange = excluded.dead_letter_exchange, "
        "dead_letter_routing_key = excluded.dead_letter_routing_key, crc = excluded.crc"
    )
    QUEUE_ID_HWM = (
        "INSERT INTO meta (key, value) VALUES ('queue_id_hwm', ?) ON CONFLICT (key) DO UPDATE SET "
        "value = greatest(meta.value::bigint, excluded.value::bigint)::text"
    )
    PUT_USER = (
        "INSERT INTO users (name, salt, hash, role, params, crc) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (name) "
        "DO UPDATE SET salt = excluded.salt, hash = excluded.hash, role = excluded.role, params = excluded.params, "
        "crc = excluded.crc"
    )


class PgCursor:
    """The writer's statements on a psycopg cursor, spelled like ``exec_driver_sql`` (a list
    of rows is ``executemany``, pipelined by psycopg; a tuple one ``execute``)."""

    __slots__ = ("_cur",)

    def __init__(self, cur: psycopg.Cursor[Any]) -> None:
        self._cur = cur

    def exec_driver_sql(self, sql: str, params: list[Any] | tuple[Any, ...] = ()) -> psycopg.Cursor[Any]:
        if type(params) is list:
            self._cur.executemany(pg_sql(sql), params)
            return self._cur
        return self._cur.execute(pg_sql(sql), params)


class PgConnection:
    """A SQLAlchemy connection that takes SQLite's ``?`` placeholders: SQLite's reads and
    recovery (``storage.sqlite.reads``, ``recovery``) run on it unchanged."""

    __slots__ = ("_conn",)

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def exec_driver_sql(self, sql: str, params: Any = None) -> Any:
        if params is None:
            return self._conn.exec_driver_sql(pg_sql(sql))
        return self._conn.exec_driver_sql(pg_sql(sql), params)

    def begin(self) -> Any:
        return self._conn.begin()

    def rollback(self) -> None:
        self._conn.rollback()

    def in_transaction(self) -> bool:
        return self._conn.in_transaction()


def where(url: URL) -> str:
    """``url`` for messages and logs: without its password, in the user part or as a
    ``password=`` option."""
    return url.difference_update_query(["password"]).render_as_string(hide_password=True)


def describe(exc: BaseException, url: URL) -> str:
    """An exception as an error message says it: the driver's own words (first line), and
    never the password."""
    orig = getattr(exc, "orig", None) or exc
    lines = str(orig).strip().splitlines()
    text = f"{orig.__class__.__name__}: {lines[0] if lines else ''}".rstrip(": ")
    for password in (url.password, url.query.get("password")):
        if password and isinstance(password, str):
            text = text.replace(password, "***")
    return text


#: libpq connection settings: a server that does not answer (a cut network, no reset) fails a
#: connect in 5 s and an established connection within ~10 s (TCP keepalives, unacknowledged
#: sends), instead of the kernel's minutes
CONNECT_ARGS = {"connect_timeout": 5, "application_name": "tandem", "keepalives": 1, "keepalives_idle": 5,
                "keepalives_interval": 2, "keepalives_count": 3, "tcp_user_timeout": 10000}


def make_engine(url: URL, *, pool_size: int = 4) -> Engine:
    """A SQLAlchemy engine on ``url`` (psycopg 3), its connections checked before use."""
    return create_engine(url, pool_size=pool_size, max_overflow=8, pool_pre_ping=True, connect_args=CONNECT_ARGS)


class PostgresEngine:
    """:class:`storage.base.Engine` on PostgreSQL (with :meth:`fence`): one writer
    connection, pooled reader connections."""

    capabilities = Capabilities(shared=True, fsync=True, replication_log=False)
    load_budget = 0  # Engine.load_budget

    def __init__(self, url: URL, *, idle_timeout: float = 2.0) -> None:
        self.url = url
        self.where = where(url)
        self._idle_timeout = idle_timeout
        self._engine: Engine | None = None
        self._writer: PoolProxiedConnection | None = None
        self._applier = PgApplier()
        self._stale = False  # the applier's index must be reloaded before the next write
        self._epoch: int | None = None
        self._closed = False

    def fence(self, epoch: int | None) -> None:
        if epoch != self._epoch:
            # another node may have written since this one last did: read the index again
            self._stale = True
        self._epoch = epoch

    def _error(self, what: str, exc: BaseException) -> StorageError:
        return StorageError(f"{what} ({self.where}): {describe(exc, self.url)}", orig=exc)

    # -- lifecycle ------------------------------------------------------------------------

    def open(self) -> Recovered:
        self._engine = make_engine(self.url)
        try:
            with self._engine.connect() as conn:
                create_schema(conn)
                # one snapshot; rows fetched as they are read (a server-side cursor), not all first
                conn.execution_options(isolation_level="REPEATABLE READ", stream_results=True, max_row_buffer=256)
                rec = load(cast(Connection, PgConnection(conn)), self.where, self._applier, self.load_budget)  # type: ignore[arg-type]
                conn.rollback()
            self._stale = False
            return rec
        except (SQLAlchemyError, psycopg.Error) as exc:
            raise self._error("cannot open store", exc) from exc

    def close(self) -> None:
        """(After the writer thread has stopped.)"""
        self._closed = True
        if self._writer is not None:
            try:
                self._writer.close()
            except (SQLAlchemyError, psycopg.Error) as exc:
                log.warning("closing the writer connection to %s: %s", self.where, describe(exc, self.url))
            self._writer = None
        if self._engine is not None:
            self._engine.dispose()

    # -- writes (writer thread) -----------------------------------------------------------

    def _raw_writer(self) -> psycopg.Connection[Any]:
        """The writer's connection, (re)connected if it is missing or broken."""
        if self._engine is None or self._closed:
            raise StorageError("store is closed")
        w = self._writer
        if w is not None:
            raw = cast(psycopg.Connection[Any], w.dbapi_connection)
            if raw is not None and not raw.closed and not raw.broken:
                return raw
            try:
                w.invalidate()
            except (SQLAlchemyError, psycopg.Error):
                pass  # (invalidating a dead connection: nothing to give back)
            self._writer = None
            self._stale = True
        self._writer = self._engine.raw_connection()
        raw = cast(psycopg.Connection[Any], self._writer.driver_connection)
        self._writer.detach()  # its session's settings are its own: never back to the pool
        # The server ends a write transaction left idle this long (its node stopped inside it,
        # holding the lease row): the writer's alone, reads and loads may take their time.
        raw.execute(f"SET idle_in_transaction_session_timeout = {max(1, int(self._idle_timeout * 1000))}")
        raw.commit()
        return raw

    def _reload(self) -> None:
        assert self._engine is not None
        with self._engine.connect() as conn:
            self._applier.reload(cast(Connection, PgConnection(conn)))
            conn.rollback()
        self._stale = False

    def apply(self, ops: list[WriteOp], *, sync: bool, store_sync: bool | None = None) -> None:
        """One transaction; with ``sync``, committed with ``synchronous_commit = on`` (the WAL
        flushed before the commit returns), else ``off`` (flushed within the server's
        ``wal_writer_delay``).  Fenced: the epoch check is its first statement."""
        for op in ops:
            if type(op) in REPLICATION_OPS:
                raise StorageError(f"{type(op).__name__}: shared mode keeps no replication log")
        try:
            raw = self._raw_writer()
            if self._stale:
                self._reload()
        except (SQLAlchemyError, psycopg.Error) as exc:
            raise self._error("write failed", exc) from exc
        self._transaction(raw, lambda cur: self._applier.apply(cur, ops), sync)

    def _transaction(self, raw: psycopg.Connection[Any], body: Any, sync: bool) -> None:
        try:
            with raw.cursor() as cur:
                try:
                    if not sync:
                        cur.execute("SET LOCAL synchronous_commit = off")
                    if self._epoch is not None:
                        self._check_epoch(cur)
                    body(PgCursor(cur))
                    raw.commit()
                except BaseException:
                    self._stale = True  # the index went ahead of the database
                    if not raw.closed and not raw.broken:
                        raw.rollback()
                    raise
        except psycopg.Error as exc:
            raise self._error("write failed", exc) from exc

    def _check_epoch(self, cur: psycopg.Cursor[Any]) -> None:
        # FOR SHARE, not FOR KEY SHARE: see the package's docstring
        row = cur.execute(f"SELECT epoch FROM {TABLE} WHERE id = 1 FOR SHARE").fetchone()
        in_db = -1 if row is None else int(row[0])
        if in_db != self._epoch:
            raise FencedError(f"write refused: the database's activation epoch is {in_db}, this node's "
                              f"{self._epoch}", epoch=in_db)

    def set_meta(self, key: str, value: str) -> None:
        try:
            raw = self._raw_writer()
        except (SQLAlchemyError, psycopg.Error) as exc:
            raise self._error("write failed", exc) from exc
        stale = self._stale
        self._transaction(raw, lambda cur: cur.exec_driver_sql(
            "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, value)), sync=True)
        self._stale = stale  # (no chunk or range written: the index is as it was)

    # -- reads (reader threads) ------------------------------------------------------------

    @contextmanager
    def _reading(self) -> Iterator[Connection]:
        if self._engine is None or self._closed:
            raise StorageError("store is closed")
        try:
            with self._engine.connect() as conn:
                # a read is one snapshot, as in SQLite (READ COMMITTED: one per statement)
                conn.execution_options(isolation_level="REPEATABLE READ")
                yield cast(Connection, PgConnection(conn))
        except SQLAlchemyError as exc:
            raise self._error("read failed", exc) from exc

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
