"""PostgreSQL for tests: a database of its own per test session and xdist worker on the local
server (127.0.0.1:5432, user postgres, trust auth; ``TANDEM_TEST_PG`` overrides the server
as ``USER@HOST:PORT``), dropped afterwards, and a fresh schema of it per test that asks.

``pg_database``: ``postgresql+psycopg://postgres@127.0.0.1:5432/tandem_test_<worker>_<hex>``.
``pg_url``: that URL with a schema of its own as the search path (empty tables, cheaply).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import psycopg
import pytest

SERVER = os.environ.get("TANDEM_TEST_PG", "postgres@127.0.0.1:5432")


def _admin() -> psycopg.Connection[tuple[object, ...]]:
    user, _, hostport = SERVER.rpartition("@")
    host, _, port = hostport.partition(":")
    return psycopg.connect(host=host, port=int(port or 5432), user=user or "postgres", dbname="postgres",
                           autocommit=True, connect_timeout=5)


@pytest.fixture(scope="session")
def pg_database(worker_id: str) -> Iterator[str]:
    try:
        admin = _admin()
    except psycopg.OperationalError as exc:
        pytest.skip(f"PostgreSQL not reachable at {SERVER} ({str(exc).strip().splitlines()[0]}): "
                    "start it (.ci/run does)")
    name = f"tandem_test_{worker_id}_{secrets.token_hex(4)}"
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://{SERVER}/{name}"
    finally:
        with _admin() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg_url(pg_database: str) -> str:
    """The session's database with a fresh schema of this test's as its search path."""
    schema = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(pg_database.replace("postgresql+psycopg", "postgresql"), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    return f"{pg_database}?options=-csearch_path%3D{schema}"
