"""Shared mode's lease row, one implementation for SQLite and PostgreSQL (SQLAlchemy Core).

The row (``tandem_lease``, always ``id = 1``)::

    id      1
    holder  the node holding the lease; NULL once released (or never taken)
    epoch   the activation epoch: each takeover adds one; the fenced engines check it
    address the holder's client address (host:port)
    until   when the lease runs out, in seconds since 1970 *by the database's clock*;
            NULL: it does not run out (a file lock decides, see ``claim``)

Every operation is one ``UPDATE ... WHERE`` (or ``SELECT``) evaluated by the database with
its own clock: who holds the lease is decided there, never by comparing nodes' clocks.
A takeover (``acquire``) is an UPDATE of the row, so it waits for the write transactions
in flight that locked it (see the engines' fencing) and every later one sees its epoch.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import SQLAlchemyError

from client.errors import StorageError
from storage.base import AclRecord, UserRecord
from storage.shared import LeaseHolder

log = logging.getLogger("tandem.storage")

TABLE = "tandem_lease"


class SqlLease:
    """:class:`storage.shared.Lease` on a SQLAlchemy engine.

    ``now``: the database's clock as seconds since 1970 (an SQL expression); ``prepare``:
    creates the table and its row if missing, race-free between nodes (run once, before
    the first operation); ``where``: the database as error messages name it (no password);
    ``describe``: an exception as error messages say it (no password either); ``errors``: the
    driver's own exceptions ``prepare`` may raise (besides SQLAlchemy's)."""

    def __init__(self, engine: Engine, *, now: str, prepare: Callable[[Connection], None], where: str,
                 describe: Callable[[BaseException], str], errors: tuple[type[Exception], ...] = ()) -> None:
        self._engine = engine
        self._errors: tuple[type[Exception], ...] = (SQLAlchemyError, *errors)
        self._prepare = prepare
        self._prepared = False
        self._lock = threading.Lock()
        self._where = where
        self._describe = describe
        self._acquire = text(
            f"UPDATE {TABLE} SET holder = :node, epoch = epoch + 1, address = :address, until = {now} + :lease "
            f"WHERE id = 1 AND (holder IS NULL OR until < {now}) RETURNING epoch")
        self._renew = text(f"UPDATE {TABLE} SET until = {now} + :lease "
                           "WHERE id = 1 AND holder = :node AND epoch = :epoch")
        self._release = text(f"UPDATE {TABLE} SET holder = NULL, until = {now} "
                             "WHERE id = 1 AND holder = :node AND epoch = :epoch")
        self._claim = text(f"UPDATE {TABLE} SET holder = :node, epoch = :epoch, address = :address, until = NULL "
                           "WHERE id = 1 AND (epoch < :epoch OR (epoch = :epoch AND holder = :node))")
        self._holder = text(f"SELECT holder, epoch, address, until - {now} FROM {TABLE} WHERE id = 1")
        self._users = text("SELECT name, salt, hash, role, params FROM users")
        self._acls = text("SELECT username, pattern, permission FROM acls ORDER BY username, pattern, permission")

    def _run(self, what: str, fn: Callable[[Connection], Any]) -> Any:
        try:
            with self._lock:
                if not self._prepared:
                    with self._engine.connect() as conn:
                        self._prepare(conn)
                    self._prepared = True
            with self._engine.begin() as conn:
                return fn(conn)
        except self._errors as exc:
            raise StorageError(f"lease {what} on {self._where} failed: {self._describe(exc)}", orig=exc) from exc

    def acquire(self, node: str, address: str, lease: float) -> int | None:
        epoch = self._run("acquire", lambda c: self._attempt(
            c, self._acquire, {"node": node, "address": address, "lease": float(lease)}).scalar())
        if epoch is not None:
            log.info("lease acquired node=%s epoch=%d database=%s", node, epoch, self._where)
        return None if epoch is None else int(epoch)

    def _attempt(self, conn: Connection, statement: Any, params: dict[str, Any]) -> Any:
        """A takeover's UPDATE (``acquire``, ``claim``): a dialect may set a lock timeout first."""
        return conn.execute(statement, params)

    def renew(self, node: str, epoch: int, lease: float) -> bool:
        return bool(self._run("renew", lambda c: c.execute(
            self._renew, {"node": node, "epoch": epoch, "lease": float(lease)}).rowcount == 1))

    def release(self, node: str, epoch: int) -> None:
        if self._run("release", lambda c: c.execute(self._release, {"node": node, "epoch": epoch}).rowcount):
            log.info("lease released node=%s epoch=%d database=%s", node, epoch, self._where)

    def claim(self, node: str, address: str, epoch: int) -> bool:
        done = bool(self._run("claim", lambda c: self._attempt(
            c, self._claim, {"node": node, "address": address, "epoch": epoch}).rowcount == 1))
        if done:
            log.info("lease claimed node=%s epoch=%d database=%s", node, epoch, self._where)
        return done

    def holder(self) -> LeaseHolder:
        row = self._run("read", lambda c: c.execute(self._holder).one())
        remaining = math.inf if row[3] is None else float(row[3])
        return LeaseHolder(node=row[0], epoch=int(row[1]), address=row[2], remaining=remaining)

    def users(self) -> list[UserRecord]:
        try:
            rows = self._run("users", lambda c: c.execute(self._users).all())
        except StorageError as exc:  # no store yet (never activated), or the database is away
            log.debug("users not read: %s", exc)
            return []
        return [UserRecord(name=r[0], salt=bytes(r[1]), hash=bytes(r[2]), role=r[3], params=r[4]) for r in rows]

    def acls(self) -> list[AclRecord]:
        try:
            rows = self._run("acls", lambda c: c.execute(self._acls).all())
        except StorageError as exc:  # as users()
            log.debug("acls not read: %s", exc)
            return []
        grouped: dict[tuple[str, str], list[str]] = {}
        for user, pattern, permission in rows:
            grouped.setdefault((user, pattern), []).append(permission)
        return [AclRecord(user=u, pattern=p, permissions=tuple(perms)) for (u, p), perms in grouped.items()]

    def close(self) -> None:
        self._engine.dispose()
