"""A fresh database for each shared-mode group a drill or a bench run starts.

A shared-mode group keeps everything in its database: queues, users (the admin password of
that group), the lease and its epoch.  A group started afresh for a run therefore gets a
database of its own, next to the one the operator named, and it is dropped afterwards:

* ``postgresql+psycopg://USER@HOST:PORT/DB``: ``CREATE DATABASE DB_<tag>_<random>`` on that
  server (the user needs the CREATEDB right), ``DROP DATABASE ... WITH (FORCE)`` after;
* ``sqlite:///PATH``: the file ``<PATH's stem>-<tag>-<random>.db`` in PATH's directory,
  deleted after (with the files beside it that start with its name: WAL, locks).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from broker.config import redact_url
from client.errors import InvalidArgumentError, UnavailableError

log = logging.getLogger("tandem.tools")


@asynccontextmanager
async def fresh_database(url: str, tag: str) -> AsyncIterator[str]:
    """The URL of a new, empty database beside ``url`` (dropped when the block ends)."""
    suffix = f"{tag}_{secrets.token_hex(4)}"
    if url.startswith("sqlite:///"):
        given = Path(url.removeprefix("sqlite:///"))
        path = given.with_name(f"{given.stem or 'tandem'}-{suffix}.db")
        if not path.parent.is_dir():
            raise InvalidArgumentError(f"--database {url}: the directory {path.parent} does not exist")
        try:
            yield f"sqlite:///{path}"
        finally:
            for p in path.parent.glob(f"{path.name}*"):  # its journal, WAL, lock files
                if p.is_dir():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
        return
    if not url.startswith("postgresql+psycopg://"):
        raise InvalidArgumentError(f"--database {redact_url(url)}: expected postgresql+psycopg://USER@HOST:PORT/DB "
                                   "or sqlite:///PATH")
    from sqlalchemy.engine import make_url

    base = make_url(url)
    name = f"{base.database or 'tandem'}_{suffix}"[-63:].lower()
    await asyncio.to_thread(_pg_admin, url, "create", name)
    log.info("scratch database %s created", name)
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        try:
            await asyncio.to_thread(_pg_admin, url, "drop", name)
            log.info("scratch database %s dropped", name)
        except UnavailableError as exc:
            log.warning("scratch database %s left behind: %s", name, exc)


def _pg_admin(url: str, verb: str, name: str) -> None:
    """Create or drop the database ``name`` on the server of ``url`` (connected to its own)."""
    import psycopg
    from psycopg import sql
    from sqlalchemy.engine import make_url

    statement = sql.SQL("CREATE DATABASE {}" if verb == "create" else "DROP DATABASE IF EXISTS {} WITH (FORCE)")
    u = make_url(url)
    try:
        with psycopg.connect(host=u.host or "127.0.0.1", port=u.port or 5432, user=u.username,
                             password=u.password, dbname=u.database or "postgres", autocommit=True,
                             connect_timeout=10) as conn:
            conn.execute(statement.format(sql.Identifier(name)))
    except psycopg.Error as exc:
        where = f"{u.host or '127.0.0.1'}:{u.port or 5432}"
        raise UnavailableError(f"{verb} database {name} on {where} failed: {str(exc).strip()}") from exc
