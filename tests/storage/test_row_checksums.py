"""Checksums of the store's rows besides its messages (storage.sqlite.rowsums): one bit flipped
at rest in a value of each checked kind of row, its checksum left as written, is found when the
store opens. A partition's copy (its end and delivered mark, settlements, delivery counts,
producer positions, snapshot mark, applied position) is marked for repair from the group and none
of it is served; a catalogue row (queue, user, grant), a ``meta`` row or a partition's hard state
(term, vote, commit) stops the node's start."""

from __future__ import annotations

import dataclasses
import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from broker.partitions import upgrade
from ha.upgrade import LEVELS
from storage.base import (AclRecord, Append, DropQueue, GrantAcl, LogCompact, PutApplied, PutHardState, PutMeta,
                          PutProducer, PutQueue, PutUser, ResetPartition, SetDeliveryCount, Settle, StoredMessage, Trim,
                          UserRecord)
from storage.sqlite import SqliteEngine
from storage.sqlite.rowsums import DIGEST_LEVEL, LEVEL, LEVEL_KEY, DamagedRow, row_crc
from storage.sqlite.scrub import scrub_store
from tests.storage.test_recovery import Q, flip_stored_bit


def _store(d: Path, level: int = LEVEL) -> Path:
    """A store at feature ``level`` holding a row of every checked kind for partition 1/0, and a
    healthy queue 2."""
    e = SqliteEngine(d / "tandem.db")
    e.open()
    msgs = [StoredMessage(i, None, b"\x80", f"body {i}".encode(), "p1", i + 1, 0.0) for i in range(10)]
    e.apply([PutMeta(LEVEL_KEY, str(level)), PutQueue(Q), PutQueue(dataclasses.replace(Q, id=2, name="other")),
             PutUser(UserRecord(name="alice", salt=b"salt", hash=b"hash", role="user", params="scram-sha-256:i=4096")),
             GrantAcl(AclRecord(user="alice", pattern="q", permissions=("consume",))),
             Append(1, 0, msgs, 10), Append(2, 0, [StoredMessage(0, None, b"\x80", b"fine", None, None, 0.0)], 1),
             Settle(1, 0, [0, 1, 2]), SetDeliveryCount(1, 0, [(5, 2)]), PutProducer(1, 0, "p1", 10),
             PutHardState(1, 0, 7, "node2", 4), LogCompact(1, 0, 3, 7, "node2"), PutApplied(1, 0, 4, 7, "node2")],
            sync=True)
    e.close()
    return d / "tandem.db"


def _flip(db: Path, table: str, column: str, where: str = "") -> None:
    """One bit of ``column`` flipped in the rows of ``table`` (``where``), as a disk would flip
    it: the checksum stays as it was written."""
    conn = sqlite3.connect(db)
    try:
        # (not as an older build's update, which the store's triggers see: those are created
        # again when the store opens, storage.sqlite.schema.TRIGGERS)
        for (trigger,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = ?",
                                       (table,)).fetchall():
            conn.execute(f"DROP TRIGGER {trigger}")
        rows = conn.execute(f"SELECT rowid, {column} FROM {table}{' WHERE ' + where if where else ''}").fetchall()
        assert rows, (table, where)
        for rowid, value in rows:
            if isinstance(value, int):
                flipped: object = value ^ 0x10
            elif isinstance(value, bytes):
                flipped = bytes([value[0] ^ 0x01]) + value[1:]
            else:
                flipped = chr(ord(value[0]) ^ 0x01) + value[1:]
            conn.execute(f"UPDATE {table} SET {column} = ? WHERE rowid = ?", (flipped, rowid))
        conn.commit()
    finally:
        conn.close()


def test_an_undamaged_store_opens_with_every_row_and_scrub_passes_them(tmp_path: Path) -> None:
    db = _store(tmp_path)
    e = SqliteEngine(db)
    rec = e.open()
    try:
        assert not rec.store_damage and not rec.row_damage
        assert [m.offset for m in rec.partitions[(1, 0)].messages] == list(range(3, 10))
        assert rec.partitions[(1, 0)].producers == {"p1": 10}
        assert (rec.logs[(1, 0)].term, rec.logs[(1, 0)].voted_for, rec.logs[(1, 0)].commit) == (7, "node2", 4)
        assert rec.logs[(1, 0)].applied == (4, 7, "node2")
        assert [u.name for u in rec.users] == ["alice"] and [a.permissions for a in rec.acls] == [("consume",)]
        assert e.load_partition(1, 0).producers == {"p1": 10}
    finally:
        e.close()
    report = scrub_store(db)
    assert report.damage == [] and report.unchecked == 0
    # queues 2, user 1, grant 1, settled 1, count 1, producer 1, ha_state 1, partitions 2,
    # meta 3 (schema version, feature level, highest queue id)
    assert report.rows == 13


@pytest.mark.parametrize(("table", "column"), [
    ("settled", '"end"'), ("counts", "dc"), ("producers", "last_seq"),
    ("ha_state", "snap_index"), ("ha_state", "applied_origin"),
    ("partitions", "next_offset"), ("partitions", "delivered_upto"),
])
def test_a_flipped_bit_in_a_partitions_copy_marks_it_for_repair_and_serves_none_of_it(
        tmp_path: Path, table: str, column: str) -> None:
    db = _store(tmp_path)
    _flip(db, table, column, "queue_id = 1")
    e = SqliteEngine(db)
    rec = e.open()
    try:
        assert list(rec.store_damage) == [(1, 0)] and not rec.row_damage
        why = rec.store_damage[(1, 0)]
        assert f"a row of {table} (partition 1/0" in why and "fails its checksum" in why, why
        assert rec.logs[(1, 0)].store_damage == why
        assert rec.partitions[(1, 0)].messages == []  # (none of a damaged copy is served)
        assert [m.body for m in rec.partitions[(2, 0)].messages] == [b"fine"]  # (the other partition is read)
        with pytest.raises(DamagedRow, match="fails its checksum"):
            e.load_partition(1, 0)
    finally:
        e.close()
    assert any(f"a row of {table}" in line for line in scrub_store(db).damage)


@pytest.mark.parametrize(("table", "column", "named"), [
    ("queues", "max_length", "a row of queues (queue 'q' (id 1))"),
    ("users", "role", "a row of users (user 'alice')"),
    ("acls", "permission", "a row of acls (grant of"),
    ("ha_state", "term", "a row of ha_state (partition 1/0) fails its checksum (hard_crc)"),
    ("ha_state", "voted_for", "a row of ha_state (partition 1/0) fails its checksum (hard_crc)"),
    ("meta", "value", "a row of meta (key 'feature_level') fails its checksum"),
    ("meta", "value", "a row of meta (key 'queue_id_hwm') fails its checksum"),
])
def test_a_flipped_bit_in_a_catalogue_row_or_a_hard_state_is_named_for_the_node_to_refuse(
        tmp_path: Path, table: str, column: str, named: str) -> None:
    db = _store(tmp_path)
    where = "queue_id = 1" if table == "ha_state" else "rowid = 1"
    if table == "meta":
        where = "key = '" + named.split("'")[1] + "'"
    _flip(db, table, column, where)
    e = SqliteEngine(db)
    rec = e.open()
    e.close()
    assert len(rec.row_damage) == 1 and named in rec.row_damage[0], rec.row_damage
    assert str(db) in rec.row_damage[0]


def test_rows_written_without_checksums_are_read_unchecked(tmp_path: Path) -> None:
    """A store an older build wrote (the columns NULL): its rows read as they are."""
    db = _store(tmp_path)
    conn = sqlite3.connect(db)
    for table in ("settled", "counts", "producers", "queues", "users", "acls"):
        conn.execute(f"UPDATE {table} SET crc = NULL")
    conn.execute("UPDATE ha_state SET hard_crc = NULL, snap_crc = NULL, applied_crc = NULL")
    conn.commit()
    conn.close()
    _flip(db, "counts", "dc")
    e = SqliteEngine(db)
    rec = e.open()
    e.close()
    assert not rec.store_damage and not rec.row_damage
    assert scrub_store(db).unchecked == 8


def test_a_value_is_summed_as_the_database_gives_it_back() -> None:
    """A whole float or a bool written into an INTEGER column reads back as an integer, a buffer
    as bytes: neither reads as damage."""
    assert row_crc(1, 2.0, True, bytearray(b"x")) == row_crc(1, 2, 1, b"x")
    assert row_crc(1, 2) != row_crc(1, 3) and row_crc("a", None) != row_crc("a", "")


def test_below_the_level_rows_are_written_without_checksums_as_an_older_build_writes_them(tmp_path: Path) -> None:
    """Until the group is finalized at rowsums.LEVEL a member may go back to an older build, which
    updates rows without their checksums: none is written, and none is checked."""
    db = _store(tmp_path, LEVEL - 1)
    conn = sqlite3.connect(db)
    sums = [conn.execute(f"SELECT count(*) FROM {t} WHERE crc IS NOT NULL").fetchone()[0]
            for t in ("settled", "counts", "producers", "queues", "users", "acls")]
    hard = conn.execute("SELECT hard_crc, snap_crc, applied_crc FROM ha_state").fetchall()
    conn.close()
    assert sums == [0] * 6 and hard == [(None, None, None)]
    _flip(db, "producers", "last_seq")  # (what an older build's update looks like to this one)
    e = SqliteEngine(db)
    rec = e.open()
    e.close()
    assert not rec.store_damage and not rec.row_damage


def test_the_level_and_its_key_are_the_groups() -> None:
    assert LEVEL_KEY == upgrade.LEVEL_KEY and "checksums of the store's rows" in LEVELS[LEVEL]


def test_reaching_the_level_sums_every_row_written_before_it(tmp_path: Path) -> None:
    db = _store(tmp_path, LEVEL - 1)
    e = SqliteEngine(db)
    e.open()
    e.apply([PutMeta(LEVEL_KEY, str(LEVEL))], sync=True)  # (what a finalize stores)
    e.close()
    report = scrub_store(db)
    assert (report.rows, report.unchecked, report.damage) == (13, 0, [])
    _flip(db, "settled", '"end"')
    e = SqliteEngine(db)
    rec = e.open()
    e.close()
    assert list(rec.store_damage) == [(1, 0)] and "a row of settled" in rec.store_damage[(1, 0)]


def test_a_partitions_or_meta_row_an_older_build_changes_reads_unchecked(tmp_path: Path) -> None:
    """Those rows carry checksums at every level: a build without them updates a row's values and
    leaves its checksum as it was, and the store's trigger clears it (a stale one would read as
    damage). A value rewritten as it was keeps its checksum; this build's next write sums the row
    again."""
    db = _store(tmp_path, LEVEL - 1)
    conn = sqlite3.connect(db)
    # (what an older build's statements do: the values only)
    conn.execute("INSERT INTO partitions (queue_id, partition, next_offset) VALUES (1, 0, 12) "
                 "ON CONFLICT (queue_id, partition) DO UPDATE SET next_offset = max(next_offset, excluded.next_offset)")
    conn.execute("UPDATE partitions SET delivered_upto = delivered_upto WHERE queue_id = 2")
    conn.execute("INSERT INTO meta (key, value) VALUES ('queue_id_hwm', '5') "
                 "ON CONFLICT (key) DO UPDATE SET value = excluded.value")
    conn.commit()
    sums = dict(conn.execute("SELECT queue_id, crc FROM partitions").fetchall())
    hwm = conn.execute("SELECT crc FROM meta WHERE key = 'queue_id_hwm'").fetchone()[0]
    conn.close()
    assert sums[1] is None and sums[2] is not None and hwm is None
    e = SqliteEngine(db)
    rec = e.open()
    try:
        assert not rec.store_damage and not rec.row_damage
        assert rec.partitions[(1, 0)].next_offset == 12 and rec.meta["queue_id_hwm"] == "5"
        e.apply([PutQueue(dataclasses.replace(Q, id=3, name="third")),
                 Append(1, 0, [StoredMessage(12, None, b"\x80", b"more", None, None, 0.0)], 13)], sync=True)
    finally:
        e.close()
    conn = sqlite3.connect(db)
    unsummed = conn.execute("SELECT (SELECT count(*) FROM partitions WHERE crc IS NULL) "
                            "+ (SELECT count(*) FROM meta WHERE crc IS NULL)").fetchone()[0]
    conn.close()
    assert unsummed == 0 and scrub_store(db).damage == []
    _flip(db, "partitions", "next_offset", "queue_id = 1")
    e = SqliteEngine(db)
    rec = e.open()
    e.close()
    assert list(rec.store_damage) == [(1, 0)] and "a row of partitions (partition 1/0)" in rec.store_damage[(1, 0)]


def _chunk_rows(db: Path) -> list[tuple[int, int, int]]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT queue_id, partition, start FROM chunks ORDER BY 1, 2, 3").fetchall()
    finally:
        conn.close()


@pytest.mark.parametrize("lost", ["a chunk row gone", "a deleted chunk row back"])
def test_chunks_that_are_not_those_the_partitions_digest_sums_up_are_damage(tmp_path: Path, lost: str) -> None:
    """At DIGEST_LEVEL each partition's row keeps the digest of its chunk rows. A lost write to the
    store's file leaves a page with its older rows, each whole and passing its own checksum: a
    chunk row missing, or one deleted since still there. The partition is marked for repair."""
    db = _store(tmp_path, DIGEST_LEVEL)
    e = SqliteEngine(db)
    e.open()
    e.apply([Append(1, 0, [StoredMessage(10, None, b"\x80", b"eleventh", None, None, 0.0)], 11)], sync=True)
    e.apply([Settle(1, 0, [10])], sync=True)  # (the chunk of offset 10 settled whole: its row deleted)
    e.close()
    assert [r[2] for r in _chunk_rows(db) if r[0] == 1] == [0]
    assert scrub_store(db).damage == []
    conn = sqlite3.connect(db)
    if lost == "a chunk row gone":
        conn.execute("DELETE FROM chunks WHERE queue_id = 1 AND start = 0")
    else:
        conn.execute("INSERT INTO chunks (queue_id, partition, start, count, payload, crc) "
                     "SELECT 1, 0, 10, 1, payload, crc FROM chunks WHERE queue_id = 2")
    conn.commit()
    conn.close()
    e = SqliteEngine(db)
    rec = e.open()
    e.close()
    assert list(rec.store_damage) == [(1, 0)] and not rec.row_damage, rec.store_damage
    why = rec.store_damage[(1, 0)]
    assert "the chunks of partition 1/0 are not those its row of partitions sums up (its digest)" in why, why
    assert rec.partitions[(1, 0)].messages == []
    assert any("the chunks of partition 1/0" in line for line in scrub_store(db).damage)


def test_below_the_digest_level_no_digest_is_kept_or_checked(tmp_path: Path) -> None:
    db = _store(tmp_path, DIGEST_LEVEL - 1)
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT count(*) FROM partitions WHERE digest IS NOT NULL").fetchone()[0] == 0
    conn.execute("DELETE FROM chunks WHERE queue_id = 1")
    conn.commit()
    conn.close()
    e = SqliteEngine(db)
    rec = e.open()
    e.close()
    assert not rec.store_damage


def test_every_write_keeps_the_digest_of_the_chunks_it_leaves(tmp_path: Path) -> None:
    """Appends, settlements that delete whole chunks, a stream's trims, resets, a dropped queue,
    and the level reached with chunks already stored, drawn from a seed: after each,
    the digests the writer wrote are those of the chunks the store holds."""
    rng = random.Random(5)
    db = _store(tmp_path, DIGEST_LEVEL - 1)
    e = SqliteEngine(db)
    e.open()
    ends = {1: 10, 2: 1}
    queues = {1: Q, 2: dataclasses.replace(Q, id=2, name="other")}
    try:
        for step in range(300):
            qid = rng.choice([1, 2])
            roll = rng.random()
            if step == 100:
                ops: list[Any] = [PutMeta(LEVEL_KEY, str(DIGEST_LEVEL))]
            elif roll < 0.45:
                n = rng.randint(1, 4)
                ops = [Append(qid, 0, [StoredMessage(ends[qid] + i, None, b"\x80", b"x", None, None, 0.0)
                                       for i in range(n)], ends[qid] + n)]
                ends[qid] += n
            elif roll < 0.8:
                ops = [Settle(qid, 0, rng.sample(range(max(0, ends[qid] - 12), ends[qid] + 1),
                                                 k=min(6, ends[qid])))]
            elif roll < 0.9:
                ops = [Trim(qid, 0, rng.randint(0, ends[qid]))]
            elif roll < 0.95:
                ops = [ResetPartition(qid, 0)]
                ends[qid] = 0
            else:
                ops = [DropQueue(qid), PutQueue(queues[qid])]
                ends[qid] = 0
            e.apply(ops, sync=False)
            if step % 50 == 49:
                e = reopened_whole(e, db, step)
    finally:
        e.close()
    assert_summed(db, "digest IS NULL")


def reopened_whole(e: SqliteEngine, db: Path, step: int) -> SqliteEngine:
    """``e`` closed and its store opened again: no partition reads as damaged."""
    e.close()
    e = SqliteEngine(db)
    rec = e.open()
    assert not rec.store_damage, (step, rec.store_damage)
    return e


def assert_summed(db: Path, unfit: str) -> None:
    """``tandem scrub`` finds nothing wrong with the store, and no row of partitions is ``unfit``."""
    assert scrub_store(db).damage == []
    conn = sqlite3.connect(db)
    try:
        assert conn.execute(f"SELECT count(*) FROM partitions WHERE {unfit}").fetchone()[0] == 0
    finally:
        conn.close()


def test_every_damaged_chunk_is_named_even_in_a_partition_already_damaged(tmp_path: Path,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    """A partition whose digest no longer fits (found first) and which also holds a chunk failing
    its checksum: both are logged, so an operator (or a drill) sees each fault."""
    db = _store(tmp_path, DIGEST_LEVEL)
    e = SqliteEngine(db)
    e.open()
    e.apply([Append(1, 0, [StoredMessage(10 + i, None, b"\x80", b"more", None, None, 0.0) for i in range(2)], 12)],
            sync=True)
    e.close()
    conn = sqlite3.connect(db)
    conn.execute("DELETE FROM chunks WHERE queue_id = 1 AND start = 10")
    conn.commit()
    conn.close()
    start = flip_stored_bit(db, 1, 0, last=True)  # (the one chunk left)
    e = SqliteEngine(db)
    rec = e.open()
    e.close()
    assert list(rec.store_damage) == [(1, 0)] and "its digest" in rec.store_damage[(1, 0)]
    assert f"the chunk of partition 1/0 from offset {start} (" in caplog.text, caplog.text
