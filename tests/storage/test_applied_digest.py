"""From rowsums.APPLIED_LEVEL a partition's digest (its row of ``partitions``) covers its applied
position as well as its chunks. A lost write to the store's file can leave a page with its older
rows, each whole and passing its own checksum: the partition's chunks and its row both as they
were one write earlier while ``ha_state`` (another page) moved on, or the other way round. Either
way the copy is not what the applied position says it is, and the partition is marked for
repair; below the level such a store opens as if whole."""

from __future__ import annotations

import dataclasses
import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from ha.upgrade import LEVELS
from storage.base import (Append, DropProducers, DropQueue, PutApplied, PutMeta, PutProducer, PutQueue, ResetPartition,
                          Settle, StoredMessage, Trim)
from storage.sqlite import SqliteEngine
from storage.sqlite.rowsums import APPLIED_LEVEL, DIGEST_LEVEL, LEVEL_KEY
from storage.sqlite.scrub import scrub_store
from tests.storage.test_recovery import Q
from tests.storage.test_row_checksums import assert_summed, reopened_whole

#: the tables whose rows of partition 1/0 a lost write may leave one write old
_COPY = ("chunks", "partitions", "ha_state")


def _msgs(start: int, n: int) -> list[StoredMessage]:
    return [StoredMessage(start + i, None, b"\x80", f"body {start + i}".encode(), None, None, 0.0) for i in range(n)]


def rows_of(db: Path, table: str, key: tuple[int, int] = (1, 0)) -> list[tuple[Any, ...]]:
    """Partition ``key``'s rows of ``table`` (the store may be open in a running node)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute(f"SELECT * FROM {table} WHERE queue_id = ? AND partition = ?", key).fetchall()
    finally:
        conn.close()


def put_back(db: Path, table: str, rows: list[tuple[Any, ...]], key: tuple[int, int] = (1, 0)) -> None:
    """Partition ``key``'s rows of ``table`` as they were (``rows``): what a page that kept its
    older rows holds. The store's triggers do not fire on a disk's lost write: they are dropped
    (the store creates them again when it opens)."""
    conn = sqlite3.connect(db)
    try:
        for (trigger,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
            conn.execute(f"DROP TRIGGER {trigger}")
        conn.execute(f"DELETE FROM {table} WHERE queue_id = ? AND partition = ?", key)
        for row in rows:
            conn.execute(f"INSERT INTO {table} VALUES ({', '.join('?' * len(row))})", row)
        conn.commit()
    finally:
        conn.close()


def _two_writes(d: Path, level: int) -> tuple[Path, dict[str, list[tuple[Any, ...]]]]:
    """A store at ``level`` where partition 1/0 applied entry 5, then entry 6 (two more
    messages); its rows of each table as they were after the first write."""
    e = SqliteEngine(d / "tandem.db")
    e.open()
    e.apply([PutMeta(LEVEL_KEY, str(level)), PutQueue(Q), PutQueue(dataclasses.replace(Q, id=2, name="other")),
             Append(1, 0, _msgs(0, 4), 4), PutApplied(1, 0, 5, 7, "node2"),
             Append(2, 0, _msgs(0, 1), 1), PutApplied(2, 0, 3, 7, "node2")], sync=True)
    e.close()
    before = {t: rows_of(d / "tandem.db", t) for t in _COPY}
    e = SqliteEngine(d / "tandem.db")
    e.open()
    e.apply([Append(1, 0, _msgs(4, 2), 6), PutApplied(1, 0, 6, 7, "node2")], sync=True)
    e.close()
    return d / "tandem.db", before


@pytest.mark.parametrize("older", [("chunks", "partitions"), ("ha_state",)],
                         ids=["its copy one write old, its applied position on", "its applied position one write old"])
def test_a_copy_that_is_not_at_its_applied_position_is_damage(tmp_path: Path, older: tuple[str, ...]) -> None:
    db, before = _two_writes(tmp_path, APPLIED_LEVEL)
    assert scrub_store(db).damage == []
    for table in older:
        put_back(db, table, before[table])
    e = SqliteEngine(db)
    rec = e.open()
    e.close()
    assert list(rec.store_damage) == [(1, 0)] and not rec.row_damage, rec.store_damage
    applied = 5 if older == ("ha_state",) else 6
    why = rec.store_damage[(1, 0)]
    assert (f"the chunks of partition 1/0 and its applied position (entry {applied}, term 7) and producer positions "
            f"are not those its row of partitions sums up (its digest): a write to the store was lost or misdirected"
            ) in why, why
    assert rec.partitions[(1, 0)].messages == []  # (none of it served)
    assert [m.offset for m in rec.partitions[(2, 0)].messages] == [0]
    assert [line.split(": ", 1)[1] for line in scrub_store(db).damage] == [why.split(": ", 1)[1]]


def test_below_the_level_the_digest_covers_the_chunks_only(tmp_path: Path) -> None:
    """The fault the level is for, at the level before it: the copy one write old opens as whole
    (its chunks fit its row), which is why a group is finalized to it."""
    db, before = _two_writes(tmp_path, DIGEST_LEVEL)
    put_back(db, "chunks", before["chunks"])
    put_back(db, "partitions", before["partitions"])
    e = SqliteEngine(db)
    rec = e.open()
    e.close()
    assert not rec.store_damage and len(rec.partitions[(1, 0)].messages) == 4
    assert "applied position" in LEVELS[APPLIED_LEVEL]


def test_a_producer_position_one_write_old_is_damage(tmp_path: Path) -> None:
    """A lost write that left a producer's row as it was one write earlier (it passes its own
    checksum) while its partition's applied position moved on: a resend of what the lost write
    recorded would be stored twice. The digest covers producer positions: the partition is
    marked for repair and none of it served."""
    db = tmp_path / "tandem.db"
    e = SqliteEngine(db)
    e.open()
    e.apply([PutMeta(LEVEL_KEY, str(APPLIED_LEVEL)), PutQueue(Q), Append(1, 0, _msgs(0, 2), 2),
             PutProducer(1, 0, "orders-writer", 1), PutApplied(1, 0, 2, 7, "node2")], sync=True)
    e.close()
    before = rows_of(db, "producers")
    e = SqliteEngine(db)
    e.open()
    e.apply([Append(1, 0, _msgs(2, 2), 4), PutProducer(1, 0, "orders-writer", 3), PutApplied(1, 0, 3, 7, "node2")],
            sync=True)
    e.close()
    assert scrub_store(db).damage == []
    put_back(db, "producers", before)
    e = SqliteEngine(db)
    rec = e.open()
    e.close()
    assert list(rec.store_damage) == [(1, 0)] and not rec.row_damage, rec.store_damage
    assert "and producer positions are not those its row of partitions sums up" in rec.store_damage[(1, 0)]
    assert rec.partitions[(1, 0)].messages == []
    assert len(scrub_store(db).damage) == 1


def test_a_partition_applied_without_its_row_is_damage(tmp_path: Path) -> None:
    db, _before = _two_writes(tmp_path, APPLIED_LEVEL)
    put_back(db, "partitions", [])
    e = SqliteEngine(db)
    rec = e.open()
    e.close()
    assert list(rec.store_damage) == [(1, 0)], rec.store_damage
    assert ("partition 1/0 has chunks, producer positions or an applied position but no row of partitions to sum "
            "them up"
            in rec.store_damage[(1, 0)])
    assert any("no row of partitions" in line for line in scrub_store(db).damage)


def test_every_write_keeps_the_digest_of_the_chunks_and_applied_position_it_leaves(tmp_path: Path) -> None:
    """Appends with their applied positions, applied positions alone, settlements that delete
    whole chunks, trims, resets (with and without a new applied position), a dropped queue, and
    the two levels reached with rows already stored, drawn from a seed: reopened after one write in ten,
    no partition reads as damaged, and the catalogue (queue 0) keeps no row of partitions."""
    rng = random.Random(11)
    db = tmp_path / "tandem.db"
    e = SqliteEngine(db)
    e.open()
    queues = {1: Q, 2: dataclasses.replace(Q, id=2, name="other")}
    e.apply([PutMeta(LEVEL_KEY, str(DIGEST_LEVEL - 1)), *(PutQueue(q) for q in queues.values())], sync=True)
    ends = {1: 0, 2: 0}
    applied = {1: 0, 2: 0}
    try:
        for step in range(320):
            qid = rng.choice([1, 2])
            roll = rng.random()
            applied[qid] += 1
            moved = PutApplied(qid, 0, applied[qid], 3, "node1")
            if step in (80, 160):
                ops: list[Any] = [PutMeta(LEVEL_KEY, str(DIGEST_LEVEL if step == 80 else APPLIED_LEVEL))]
            elif roll < 0.4:
                n = rng.randint(1, 4)
                ops = [Append(qid, 0, _msgs(ends[qid], n), ends[qid] + n), moved]
                if rng.random() < 0.6:  # (a producer's position with it, or one forgotten)
                    pid = f"p{rng.randrange(3)}"
                    ops.append(PutProducer(qid, 0, pid, step) if rng.random() < 0.8 else DropProducers(qid, 0, [pid]))
                ends[qid] += n
            elif roll < 0.55:
                ops = [moved, PutApplied(0, 0, step + 1, 3, "node1")]
            elif roll < 0.8:
                ops = [Settle(qid, 0, rng.sample(range(max(0, ends[qid] - 12), ends[qid] + 1),
                                                 k=min(6, ends[qid]))), moved]
            elif roll < 0.88:
                ops = [Trim(qid, 0, rng.randint(0, ends[qid])), moved]
            elif roll < 0.94:
                ops = [ResetPartition(qid, 0)] + ([moved] if rng.random() < 0.5 else [])
                ends[qid] = 0
            else:
                ops = [DropQueue(qid), PutQueue(queues[qid])]
                ends[qid] = applied[qid] = 0
            e.apply(ops, sync=False)
            if rng.random() < 0.1:
                e = reopened_whole(e, db, step)
    finally:
        e.close()
    assert_summed(db, "digest IS NULL OR queue_id = 0")
