""":class:`PostgresShared`: the engine and the lease of one PostgreSQL database."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
from sqlalchemy import URL, Connection, Engine, make_url, text
from sqlalchemy.exc import ArgumentError

from client.errors import StorageError
from storage.lease import TABLE, SqlLease
from storage.postgres.engine import PostgresEngine, describe, make_engine, where
from storage.postgres.schema import create_schema

#: the database's clock in seconds since 1970 (clock_timestamp: now, not the transaction's start)
NOW = "extract(epoch from clock_timestamp())::float8"

DRIVER = "postgresql+psycopg"

log = logging.getLogger("tandem.storage")
T = TypeVar("T")

#: ends the sessions whose transactions lock the lease table (a write transaction's FOR SHARE)
#: and that have not moved for longer than :idle seconds (their node is stopped).  Whatever
#: their state: a node stopped in the middle of sending a batch leaves its session "active",
#: waiting for the rest, where ``idle_in_transaction_session_timeout`` does not apply.
_STUCK = text(
    "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
    f"AND pid IN (SELECT pid FROM pg_locks WHERE relation = to_regclass('{TABLE}') AND granted) "
    "AND pid <> pg_backend_pid() AND state <> 'idle' "
    "AND clock_timestamp() - state_change > make_interval(secs => :idle)")
#: whether the lease has run out (a plain read: it never waits for the row's locks)
_EXPIRED = text(f"SELECT holder IS NULL OR until < {NOW} FROM {TABLE} WHERE id = 1")


def parse_url(url: str) -> URL:
    """``url`` as SQLAlchemy's URL; StorageError (without the password) if it is not one of
    PostgreSQL with psycopg."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise StorageError(f"database {url.split('@')[-1]!r}: not a URL "
                           "(postgresql+psycopg://USER@HOST:PORT/DB)") from None
    if parsed.drivername != DRIVER:
        raise StorageError(f"database {where(parsed)}: expected {DRIVER}://...")
    return parsed


class PgLease(SqlLease):
    """The lease row on PostgreSQL, whose takeover ends the transactions of a stopped node.

    A takeover (``acquire``, ``claim``) waits for the write transactions holding the lease row (``FOR SHARE``).
    A node stopped inside one holds it for as long as it is stopped; the server ends a
    transaction idle for ``idle_timeout`` (``idle_in_transaction_session_timeout``), but
    not always: after a pipelined ``executemany`` psycopg's trailing flush leaves that timer
    unarmed.  So the takeover waits at most ``idle_timeout`` (``lock_timeout``), then ends
    the sessions blocking it that have been idle in their transaction for longer than that,
    and tries once more.  (It needs the right to: the same database user as those sessions,
    or ``pg_signal_backend``.)"""

    def __init__(self, engine: Engine, *, now: str, prepare: Callable[[Connection], None], where: str,
                 describe: Callable[[BaseException], str], idle_timeout: float) -> None:
        super().__init__(engine, now=now, prepare=prepare, where=where, describe=describe)
        self._idle_timeout = idle_timeout

    def acquire(self, node: str, address: str, lease: float) -> int | None:
        return self._takeover(lambda: super(PgLease, self).acquire(node, address, lease), None, expired_only=True)

    def claim(self, node: str, address: str, epoch: int) -> bool:
        # the file lock was won: its old holder is gone whatever the row says
        return self._takeover(lambda: super(PgLease, self).claim(node, address, epoch), False, expired_only=False)

    def _takeover(self, attempt: Callable[[], T], refused: T, *, expired_only: bool) -> T:
        try:
            return attempt()
        except StorageError as exc:
            orig = getattr(exc.orig, "orig", None)
            if not isinstance(orig, psycopg.errors.LockNotAvailable):
                raise
        # A write transaction holds the row.  Only if the lease has run out is its node
        # stopped (a live active renews): then end its session; never a live active's.
        if expired_only and not self._run("takeover", lambda c: bool(c.execute(_EXPIRED).scalar())):
            return refused
        ended = self._run("takeover", lambda c: c.execute(_STUCK, {"idle": self._idle_timeout}).fetchall())
        for pid, _ok in ended:
            log.warning("lease takeover: ended session %d, idle inside a transaction holding the lease row for "
                        "over %.1fs (its node stopped?) database=%s", pid, self._idle_timeout, self._where)
        return attempt()

    def _attempt(self, conn: Connection, statement: Any, params: dict[str, Any]) -> Any:
        conn.exec_driver_sql(f"SET LOCAL lock_timeout = {max(1, int(self._idle_timeout * 1000))}")
        return conn.execute(statement, params)


class PostgresShared:
    """:class:`storage.shared.SharedStore` on PostgreSQL.  Nothing connects until used.

    ``idle_timeout``: seconds after which the server ends a write transaction left idle (a
    node stopped inside one), so that it cannot hold up a takeover longer (see the package
    docstring)."""

    def __init__(self, url: str, *, idle_timeout: float = 2.0) -> None:
        self.url = parse_url(url)
        self.where = where(self.url)
        self.idle_timeout = idle_timeout

    def engine(self) -> PostgresEngine:
        return PostgresEngine(self.url, idle_timeout=self.idle_timeout)

    def lease(self) -> SqlLease:
        engine = make_engine(self.url, pool_size=1)

        def prepare(conn: Connection) -> None:
            create_schema(conn)

        return PgLease(engine, now=NOW, prepare=prepare, where=self.where,
                       describe=lambda exc: describe(exc, self.url), idle_timeout=self.idle_timeout)
