"""Shared mode's store factory: :func:`open_shared` picks the engine for a ``database`` URL.

``postgresql+psycopg://USER@HOST:PORT/DB`` opens :class:`~storage.postgres.PostgresShared`,
``sqlite:///PATH`` (nodes on one machine) :class:`~storage.sqlite.shared.SqliteShared`.  This
is the one module of ``storage`` that imports the shared-mode engines: the contract they
implement (:mod:`storage.shared`) imports none of them.
"""

from __future__ import annotations

from client.errors import StorageError
from storage.shared import SharedStore


def open_shared(url: str) -> SharedStore:
    """The shared store at ``url`` (nothing is connected until it is used)."""
    if url.startswith("postgresql+psycopg://"):
        from storage.postgres import PostgresShared
        return PostgresShared(url)
    if url.startswith("sqlite:///"):
        from storage.sqlite.shared import SqliteShared
        return SqliteShared(url.removeprefix("sqlite:///"))
    raise StorageError(f"database {url.split('@')[-1]!r}: expected postgresql+psycopg://... or sqlite:///PATH")
