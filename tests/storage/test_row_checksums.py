"""Checksums of the store's rows besides its messages (storage.sqlite.rowsums): one bit flipped
at rest in a value of each checked kind of row, its checksum left as written, is found when the
store opens. A partition's copy (settlements, delivery counts, producer positions, snapshot mark,
applied position) is marked for repair from the group and none of it is served; a catalogue row
(queue, user, grant) or a partition's hard state (term, vote, commit) stops the node's start."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

import pytest

from broker.partitions import upgrade
from ha.upgrade import LEVELS
from storage.base import (AclRecord, Append, GrantAcl, LogCompact, PutApplied, PutHardState, PutMeta, PutProducer,
                          PutQueue, PutUser, SetDeliveryCount, Settle, StoredMessage, UserRecord)
from storage.sqlite import SqliteEngine
from storage.sqlite.rowsums import LEVEL, LEVEL_KEY, DamagedRow, row_crc
from storage.sqlite.scrub import scrub_store
from tests.storage.test_recovery import Q


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
    # queues 2, user 1, grant 1, settled 1, count 1, producer 1, ha_state 1
    assert report.rows == 8


@pytest.mark.parametrize(("table", "column"), [
    ("settled", '"end"'), ("counts", "dc"), ("producers", "last_seq"),
    ("ha_state", "snap_index"), ("ha_state", "applied_origin"),
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
])
def test_a_flipped_bit_in_a_catalogue_row_or_a_hard_state_is_named_for_the_node_to_refuse(
        tmp_path: Path, table: str, column: str, named: str) -> None:
    db = _store(tmp_path)
    _flip(db, table, column, "queue_id = 1" if table == "ha_state" else "rowid = 1")
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
    assert (report.rows, report.unchecked, report.damage) == (8, 0, [])
    _flip(db, "settled", '"end"')
    e = SqliteEngine(db)
    rec = e.open()
    e.close()
    assert list(rec.store_damage) == [(1, 0)] and "a row of settled" in rec.store_damage[(1, 0)]
