"""The statements the writer (storage.sqlite.apply) runs to write its ops into the store's
tables: portable SQL with ``?`` placeholders, SQLite's (a dialect overrides the few
storage.sqlite.apply.OpApplier names)."""

UPSERT_HARD = (
    "INSERT INTO ha_state (queue_id, partition, term, voted_for, commit_idx, hard_crc) VALUES (?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (queue_id, partition) DO UPDATE SET term = excluded.term, voted_for = excluded.voted_for, "
    "commit_idx = excluded.commit_idx, hard_crc = excluded.hard_crc"
)
UPSERT_SNAP = (
    "INSERT INTO ha_state (queue_id, partition, snap_index, snap_term, snap_origin, snap_weak, snap_recency_term, "
    "snap_recency_index, snap_crc) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (queue_id, partition) DO UPDATE SET snap_index = excluded.snap_index, "
    "snap_term = excluded.snap_term, snap_origin = excluded.snap_origin, snap_weak = excluded.snap_weak, "
    "snap_recency_term = excluded.snap_recency_term, snap_recency_index = excluded.snap_recency_index, "
    "snap_crc = excluded.snap_crc"
)
UPSERT_APPLIED = (
    "INSERT INTO ha_state (queue_id, partition, applied_index, applied_term, applied_origin, applied_crc) "
    "VALUES (?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (queue_id, partition) DO UPDATE SET applied_index = excluded.applied_index, "
    "applied_term = excluded.applied_term, applied_origin = excluded.applied_origin, "
    "applied_crc = excluded.applied_crc"
)

INSERT_CHUNK = "INSERT INTO chunks (queue_id, partition, start, count, payload, crc) VALUES (?, ?, ?, ?, ?, ?)"
UPSERT_END = (
    "INSERT INTO partitions (queue_id, partition, next_offset) VALUES (?, ?, ?) "
    "ON CONFLICT (queue_id, partition) DO UPDATE SET next_offset = max(next_offset, excluded.next_offset)"
)
UPSERT_DELIVERED = (
    "INSERT INTO partitions (queue_id, partition, delivered_upto) VALUES (?, ?, ?) "
    "ON CONFLICT (queue_id, partition) DO UPDATE SET "
    "delivered_upto = max(delivered_upto, excluded.delivered_upto)"
)
# (SQLite's: with the row's checksum, computed from the writer's copy of the row, OpApplier._marks)
UPSERT_MARKS = (
    "INSERT INTO partitions (queue_id, partition, next_offset, delivered_upto, digest, crc) VALUES (?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (queue_id, partition) DO UPDATE SET next_offset = excluded.next_offset, "
    "delivered_upto = excluded.delivered_upto, digest = excluded.digest, crc = excluded.crc"
)
INSERT_SETTLED = 'INSERT INTO settled (queue_id, partition, start, "end", crc) VALUES (?, ?, ?, ?, ?)'
UPSERT_COUNT = (
    'INSERT INTO counts (queue_id, partition, "offset", dc, crc) VALUES (?, ?, ?, ?, ?) '
    'ON CONFLICT (queue_id, partition, "offset") DO UPDATE SET dc = excluded.dc, crc = excluded.crc'
)
UPSERT_PRODUCER = (
    "INSERT INTO producers (queue_id, partition, producer_id, last_seq, crc) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (queue_id, partition, producer_id) DO UPDATE SET last_seq = excluded.last_seq, crc = excluded.crc"
)
DELETE_CHUNK = "DELETE FROM chunks WHERE queue_id = ? AND partition = ? AND start = ?"
DELETE_COUNTS = 'DELETE FROM counts WHERE queue_id = ? AND partition = ? AND "offset" >= ? AND "offset" < ?'
TRIM_CHUNKS = "DELETE FROM chunks WHERE queue_id = ? AND partition = ? AND start + count <= ?"
DELETE_SETTLED_BELOW = 'DELETE FROM settled WHERE queue_id = ? AND partition = ? AND "end" <= ?'
# (with the store's row sums, storage.sqlite.booksum: what a delete took, a count's value before it changes)
DELETE_COUNTS_RETURNING = DELETE_COUNTS + ' RETURNING "offset", dc'
DELETE_SETTLED_BELOW_RETURNING = DELETE_SETTLED_BELOW + ' RETURNING start, "end"'
SELECT_COUNT = 'SELECT dc FROM counts WHERE queue_id = ? AND partition = ? AND "offset" = ?'
