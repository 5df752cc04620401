"""The SQLite store's tables, and their creation and upgrade on open.

Schema (version 3, in ``meta.schema_version``)::

    meta(key TEXT PK, value TEXT)
    queues(id INT PK, name TEXT UNIQUE, partitions, mapper, ring_size,
           max_deliveries, dead_letter_queue, max_length, owner,
           max_length_bytes, overflow, message_ttl, expires, type, max_age, max_bytes,
           dead_letter_exchange, dead_letter_routing_key)
    partitions(queue_id, partition, next_offset, delivered_upto,   PK (queue_id, partition)
               digest, crc)
    chunks(queue_id, partition, start, count, payload BLOB, crc)    PK (queue_id, partition, start)
    settled(queue_id, partition, start, end)                        ranges [start, end), index (.., end)
    counts(queue_id, partition, "offset", dc)                       PK (queue_id, partition, offset)
    producers(queue_id, partition, producer_id, last_seq)           PK (queue_id, partition, producer_id)
    users(name TEXT PK, salt BLOB, hash BLOB, role, params)
    acls(username, pattern, permission)                             PK (username, pattern, permission)
    ha_state(queue_id, partition, term, voted_for, commit_idx,      PK (queue_id, partition)
             snap_index, snap_term, snap_origin,
             applied_index, applied_term, applied_origin,
             snap_weak, snap_recency_term, snap_recency_index)
    ha_log(queue_id, partition, idx, term, origin, weak, data)      PK (queue_id, partition, idx)

Chunk payload: a msgpack array with one item per message, offsets
``start .. start+count-1`` in order; each item is the array
``[key: str|nil, headers: bin (msgpack map str->str), body: bin,
producer_id: str|nil, seq: uint|nil, ts: float]`` (``storage.base.pack_run``).

``acls`` (one row per permission granted) is created on open when missing, and so are
``ha_state``'s snapshot mark columns (``snap_weak``, ``snap_recency_*``: the snapshot ends in
entries a weak override's active wrote, ``storage.base.LogCompact``) and ``queues.owner`` (the
user who declared the queue, NULL for the node's own queues and those stored without one) and
``queues.max_length_bytes`` / ``overflow`` / ``message_ttl`` / ``expires`` (a queue's overflow,
its messages' time to live and its own when unused: 0, 'reject-publish', 0 and 0 for a queue
stored without them) and ``queues.type`` / ``max_age`` / ``max_bytes`` (a stream and its
retention: 'classic', 0 and 0 for a queue stored without them) and
``queues.dead_letter_exchange`` / ``dead_letter_routing_key`` (where its dead letters are
published: NULL for a queue stored without them) and ``chunks.crc`` (the CRC-32 of the chunk's
payload, checked on every read: NULL for a chunk written without it, read unchecked) and the other
rows' checksums (``crc`` on every checked table, ``hard_crc`` / ``snap_crc`` / ``applied_crc`` on
``ha_state``: storage.sqlite.rowsums) with the triggers that clear a checksum an older build left
stale (:data:`TRIGGERS`), so a store of version 3 written without them gains them as it is: the
version stays.

``ha_state`` keeps each partition's hard state, compaction point and applied position:
they change with the store's own rows and commit with them.  The replication log itself
is in segment files beside the database (``storage/segments.py``); the ``ha_log`` table
is only read on open, and a log found there is moved into the segments
(``storage.sqlite.recovery.replay_log``).
"""

from __future__ import annotations

import logging
from pathlib import Path

from sqlalchemy import Connection

from storage.sqlite.rowsums import row_crc

log = logging.getLogger("tandem.storage")

#: version 3 has the replication tables ha_log and ha_state; a version 2 store (without
#: them) is upgraded in place, as they are only added
SCHEMA_VERSION = "3"
UPGRADABLE = {"2"}
#: the versions a store may have and this build reads: 3 as created, 4 once its group is
#: finalized at feature level 2 (broker.partitions.upgrade stamps it; the tables are alike,
#: the version keeps a first-release build from opening a store it may not understand)
READABLE = {"3", "4"}

Key = tuple[int, int]  # (queue_id, partition)

DDL = [
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
    """CREATE TABLE IF NOT EXISTS acls (
        username TEXT NOT NULL, pattern TEXT NOT NULL, permission TEXT NOT NULL,
        PRIMARY KEY (username, pattern, permission))""",
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
        applied_origin TEXT NOT NULL DEFAULT '', snap_weak INTEGER NOT NULL DEFAULT 0,
        snap_recency_term INTEGER NOT NULL DEFAULT 0, snap_recency_index INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (queue_id, partition))""",
]

#: columns added to a table after it was first released: (table, column, declaration)
ADDED_COLUMNS = [
    ("ha_state", "snap_weak", "INTEGER NOT NULL DEFAULT 0"),
    ("ha_state", "snap_recency_term", "INTEGER NOT NULL DEFAULT 0"),
    ("ha_state", "snap_recency_index", "INTEGER NOT NULL DEFAULT 0"),
    ("queues", "owner", "TEXT"),
    ("queues", "max_length_bytes", "BIGINT NOT NULL DEFAULT 0"),
    ("queues", "overflow", "TEXT NOT NULL DEFAULT 'reject-publish'"),
    ("queues", "message_ttl", "BIGINT NOT NULL DEFAULT 0"),
    ("queues", "expires", "BIGINT NOT NULL DEFAULT 0"),
    ("queues", "type", "TEXT NOT NULL DEFAULT 'classic'"),
    ("queues", "max_age", "BIGINT NOT NULL DEFAULT 0"),
    ("queues", "max_bytes", "BIGINT NOT NULL DEFAULT 0"),
    ("queues", "dead_letter_exchange", "TEXT"),
    ("queues", "dead_letter_routing_key", "TEXT"),
    ("chunks", "crc", "BIGINT"),
    ("settled", "crc", "BIGINT"),
    ("counts", "crc", "BIGINT"),
    ("producers", "crc", "BIGINT"),
    ("queues", "crc", "BIGINT"),
    ("users", "crc", "BIGINT"),
    ("acls", "crc", "BIGINT"),
    ("ha_state", "hard_crc", "BIGINT"),
    ("ha_state", "snap_crc", "BIGINT"),
    ("ha_state", "applied_crc", "BIGINT"),
    ("partitions", "digest", "BIGINT"),
    ("partitions", "crc", "BIGINT"),
    ("meta", "crc", "BIGINT"),
]

#: a row of ``partitions`` or ``meta`` whose values a build without their checksums changes
#: (leaving ``crc`` as it was) has it cleared: the row then reads unchecked
#: (storage.sqlite.rowsums), where a stale checksum would read as damage
TRIGGERS = [
    """CREATE TRIGGER IF NOT EXISTS partitions_unsummed AFTER UPDATE OF next_offset, delivered_upto ON partitions
        WHEN NEW.crc IS OLD.crc AND (NEW.next_offset IS NOT OLD.next_offset
                                     OR NEW.delivered_upto IS NOT OLD.delivered_upto)
        BEGIN UPDATE partitions SET crc = NULL WHERE queue_id = NEW.queue_id AND partition = NEW.partition; END""",
    """CREATE TRIGGER IF NOT EXISTS meta_unsummed AFTER UPDATE OF value ON meta
        WHEN NEW.crc IS OLD.crc AND NEW.value IS NOT OLD.value
        BEGIN UPDATE meta SET crc = NULL WHERE key = NEW.key; END""",
]


def create_schema(conn: Connection, path: Path) -> None:
    """Create the tables that are missing and stamp or upgrade the schema version, in
    one transaction.  A version this build cannot read is left as it is: opening
    (``recovery.load``) then refuses the store."""
    with conn.begin():
        for ddl in DDL:
            conn.exec_driver_sql(ddl)
        for table, column, decl in ADDED_COLUMNS:
            have = {row[1] for row in conn.exec_driver_sql(f"PRAGMA table_info({table})")}
            if column not in have:
                conn.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
        for ddl in TRIGGERS:
            conn.exec_driver_sql(ddl)
        conn.exec_driver_sql("INSERT OR IGNORE INTO meta (key, value, crc) VALUES ('schema_version', ?, ?)",
                             (SCHEMA_VERSION, row_crc("schema_version", SCHEMA_VERSION)))
        old = conn.exec_driver_sql("SELECT value FROM meta WHERE key = 'schema_version'").scalar()
        if old in UPGRADABLE:  # only tables were added since: created above
            log.info("store %s upgraded from schema version %s to %s", path, old, SCHEMA_VERSION)
            conn.exec_driver_sql("UPDATE meta SET value = ?, crc = ? WHERE key = 'schema_version'",
                                 (SCHEMA_VERSION, row_crc("schema_version", SCHEMA_VERSION)))
