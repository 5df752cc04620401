"""The PostgreSQL store's tables: SQLite's logical schema (``storage.sqlite.schema``, the
same version) without the replication log, plus the lease row (``storage.lease``).

Types: integers that grow (offsets, sequences, ids, epochs) are ``bigint``, blobs
``bytea``; a chunk's payload is the chunk format of ``storage.base.pack_run``, as in SQLite.
``ha_state`` is there (and stays empty: shared mode keeps no replication state) so that
the statements and reads SQLite's modules share with this engine find it.

Creation is one transaction under a transaction-level advisory lock: two nodes starting
together on an empty database would otherwise race in ``CREATE TABLE IF NOT EXISTS``
(which is not safe against a concurrent creation: one of them fails on a catalog row).
"""

from __future__ import annotations

from sqlalchemy import Connection

from storage.lease import TABLE
from storage.sqlite.schema import ADDED_COLUMNS, SCHEMA_VERSION

#: pg_advisory_xact_lock key for the schema's creation ("tandem" in ASCII)
SCHEMA_LOCK = 0x74616E64656D

DDL = [
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS queues (
        id BIGINT PRIMARY KEY, name TEXT NOT NULL UNIQUE, partitions INTEGER NOT NULL,
        mapper TEXT NOT NULL, ring_size INTEGER NOT NULL, max_deliveries INTEGER NOT NULL,
        dead_letter_queue TEXT, max_length BIGINT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS partitions (
        queue_id BIGINT NOT NULL, partition INTEGER NOT NULL, next_offset BIGINT NOT NULL DEFAULT 0,
        delivered_upto BIGINT NOT NULL DEFAULT 0, PRIMARY KEY (queue_id, partition))""",
    """CREATE TABLE IF NOT EXISTS chunks (
        queue_id BIGINT NOT NULL, partition INTEGER NOT NULL, start BIGINT NOT NULL,
        count INTEGER NOT NULL, payload BYTEA NOT NULL, PRIMARY KEY (queue_id, partition, start))""",
    """CREATE TABLE IF NOT EXISTS settled (
        queue_id BIGINT NOT NULL, partition INTEGER NOT NULL, start BIGINT NOT NULL, "end" BIGINT NOT NULL)""",
    'CREATE INDEX IF NOT EXISTS settled_end ON settled (queue_id, partition, "end")',
    """CREATE TABLE IF NOT EXISTS counts (
        queue_id BIGINT NOT NULL, partition INTEGER NOT NULL, "offset" BIGINT NOT NULL,
        dc INTEGER NOT NULL, PRIMARY KEY (queue_id, partition, "offset"))""",
    """CREATE TABLE IF NOT EXISTS producers (
        queue_id BIGINT NOT NULL, partition INTEGER NOT NULL, producer_id TEXT NOT NULL,
        last_seq BIGINT NOT NULL, PRIMARY KEY (queue_id, partition, producer_id))""",
    """CREATE TABLE IF NOT EXISTS users (
        name TEXT PRIMARY KEY, salt BYTEA NOT NULL, hash BYTEA NOT NULL, role TEXT NOT NULL,
        params TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS acls (
        username TEXT NOT NULL, pattern TEXT NOT NULL, permission TEXT NOT NULL,
        PRIMARY KEY (username, pattern, permission))""",
    """CREATE TABLE IF NOT EXISTS ha_state (
        queue_id BIGINT NOT NULL, partition INTEGER NOT NULL, term BIGINT NOT NULL DEFAULT 0,
        voted_for TEXT, commit_idx BIGINT NOT NULL DEFAULT 0,
        snap_index BIGINT NOT NULL DEFAULT 0, snap_term BIGINT NOT NULL DEFAULT 0,
        snap_origin TEXT NOT NULL DEFAULT '',
        applied_index BIGINT NOT NULL DEFAULT 0, applied_term BIGINT NOT NULL DEFAULT 0,
        applied_origin TEXT NOT NULL DEFAULT '', PRIMARY KEY (queue_id, partition))""",
    *(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {decl}" for table, column, decl in ADDED_COLUMNS),
    f"""CREATE TABLE IF NOT EXISTS {TABLE} (
        id INTEGER PRIMARY KEY CHECK (id = 1), holder TEXT, epoch BIGINT NOT NULL,
        address TEXT NOT NULL, until DOUBLE PRECISION)""",
    f"INSERT INTO {TABLE} (id, holder, epoch, address, until) VALUES (1, NULL, 0, '', 0) ON CONFLICT DO NOTHING",
]


def create_schema(conn: Connection) -> None:
    """Create what is missing and stamp the schema version, in one transaction under the
    schema lock (a node finding everything there only reads).  What is there is looked at
    again once the lock is held: a node that waited for it while another created the tables
    must not alter them again (an ALTER TABLE waits for the readers of a node already
    loading, which may wait for this transaction's locks: a deadlock)."""
    with conn.begin():
        if not _present(conn):
            conn.exec_driver_sql("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
            if not _present(conn):
                for ddl in DDL:
                    conn.exec_driver_sql(ddl)
        conn.exec_driver_sql("INSERT INTO meta (key, value) VALUES ('schema_version', %s) ON CONFLICT DO NOTHING",
                             (SCHEMA_VERSION,))


def _present(conn: Connection) -> bool:
    """Whether every table and added column is there."""
    return bool(conn.exec_driver_sql(
        f"SELECT to_regclass('{TABLE}') IS NOT NULL AND to_regclass('ha_state') IS NOT NULL "
        "AND to_regclass('acls') IS NOT NULL AND (SELECT count(*) FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND table_name || '.' || column_name = ANY(%s)) = %s",
        ([f"{table}.{column}" for table, column, _decl in ADDED_COLUMNS], len(ADDED_COLUMNS))).scalar())
