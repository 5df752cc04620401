"""From storage.sqlite.booksum.LEVEL a partition's digest (its row of ``partitions``) covers its
settled ranges and delivery counts too. A lost write to the store's file can leave a page with its
older rows, each whole and passing its own checksum: a settled range gone (an acknowledged message
would be delivered again) or a delivery count one write old (a message delivered more times than
``max_deliveries`` allows). Either way the partition is marked for repair; below the level such a
store opens as if whole."""

from __future__ import annotations

import dataclasses
import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from ha.upgrade import LEVELS
from storage.base import (Append, DropQueue, PutApplied, PutMeta, PutQueue, ResetPartition, SetDeliveryCount, Settle,
                          Trim)
from storage.sqlite import SqliteEngine
from storage.sqlite.booksum import LEVEL as BOOKS_LEVEL
from storage.sqlite.booksum import Books, summed
from storage.sqlite.rowsums import APPLIED_LEVEL, LEVEL_KEY
from storage.sqlite.scrub import scrub_store
from tests.storage.test_applied_digest import _msgs, put_back, rows_of
from tests.storage.test_recovery import Q
from tests.storage.test_row_checksums import assert_summed, reopened_whole


def _two_writes(d: Path, level: int, second: list[Any]) -> tuple[Path, dict[str, list[tuple[Any, ...]]]]:
    """A store at ``level`` where partition 1/0 holds ten messages, the first two settled and
    offset 5 delivered once, applied at entry 3; then ``second`` (with entry 4); its settled and
    counts rows as they were after the first write."""
    e = SqliteEngine(d / "tandem.db")
    e.open()
    e.apply([PutMeta(LEVEL_KEY, str(level)), PutQueue(Q), Append(1, 0, _msgs(0, 10), 10), PutApplied(1, 0, 2, 7, "n2"),
             Settle(1, 0, [0, 1]), SetDeliveryCount(1, 0, [(5, 1)]), PutApplied(1, 0, 3, 7, "n2")], sync=True)
    e.close()
    before = {t: rows_of(d / "tandem.db", t) for t in ("settled", "counts")}
    e = SqliteEngine(d / "tandem.db")
    e.open()
    e.apply([*second, PutApplied(1, 0, 4, 7, "n2")], sync=True)
    e.close()
    return d / "tandem.db", before


_LEFT = {
    "a settled range gone": ("settled", [Settle(1, 0, [3, 4])]),
    "a delivery count one write old": ("counts", [SetDeliveryCount(1, 0, [(5, 2)])]),
    "a delivery count gone": ("counts", [SetDeliveryCount(1, 0, [(7, 1)])]),
}


@pytest.mark.parametrize("left", list(_LEFT))
def test_a_settlement_or_delivery_count_one_write_old_is_damage(tmp_path: Path, left: str) -> None:
    table, second = _LEFT[left]
    db, before = _two_writes(tmp_path, BOOKS_LEVEL, second)
    assert scrub_store(db).damage == []
    put_back(db, table, before[table])
    e = SqliteEngine(db)
    rec = e.open()
    e.close()
    assert list(rec.store_damage) == [(1, 0)] and not rec.row_damage, rec.store_damage
    why = rec.store_damage[(1, 0)]
    assert ("the chunks of partition 1/0 and its applied position (entry 4, term 7), producer positions, settled "
            "ranges and delivery counts are not those its row of partitions sums up (its digest): a write to the store "
            "was lost or misdirected") in why, why
    assert rec.partitions[(1, 0)].messages == []  # (none of it served)
    assert [line.split(": ", 1)[1] for line in scrub_store(db).damage] == [why.split(": ", 1)[1]]


def test_below_the_level_the_digest_does_not_cover_them(tmp_path: Path) -> None:
    """The fault the level is for, at the level before it: the settled range gone opens as whole,
    and the two settled messages are served again, which is why a group is finalized to it."""
    db, before = _two_writes(tmp_path, APPLIED_LEVEL, [Settle(1, 0, [3, 4])])
    put_back(db, "settled", before["settled"])
    e = SqliteEngine(db)
    rec = e.open()
    e.close()
    assert not rec.store_damage
    assert {3, 4} <= {m.offset for m in rec.partitions[(1, 0)].messages}
    assert "settled ranges" in LEVELS[BOOKS_LEVEL]


def test_a_partition_with_settlements_but_no_row_is_damage(tmp_path: Path) -> None:
    db, _before = _two_writes(tmp_path, BOOKS_LEVEL, [Settle(1, 0, [3])])
    put_back(db, "partitions", [])
    put_back(db, "chunks", [])
    put_back(db, "ha_state", [])
    e = SqliteEngine(db)
    rec = e.open()
    e.close()
    assert list(rec.store_damage) == [(1, 0)], rec.store_damage
    assert ("partition 1/0 has chunks, producer positions, settled ranges, delivery counts or an applied position but "
            "no row of partitions" in rec.store_damage[(1, 0)])


def test_the_writers_sums_follow_each_statement() -> None:
    """Books moves its sum by exactly the rows each statement writes or deletes: a range settled
    twice counts twice (a sum, not an XOR), an updated count replaces the value it held, and a
    value that is not a number (damage) is left out, as the from-scratch sum leaves it out."""
    b = Books()
    b.settled((1, 2), [(3, 5), (3, 5), (6, 9)])
    b.counted((1, 2), 7, 1, None)
    b.counted((1, 2), 7, 2, 1)
    b.counted((1, 2), 8, 1, None)
    table = {"settled": [(1, 2, 3, 5), (1, 2, 3, 5), (1, 2, 6, 9), (1, 2, b"", 12)],
             "counts": [(1, 2, 7, 2), (1, 2, 8, 1), (1, 2, 9, b"")]}

    def query(sql: str) -> list[tuple[Any, ...]]:
        return table["settled" if "FROM settled" in sql else "counts"]

    assert b.sum((1, 2)) == summed(query)[(1, 2)] != 0
    b.settled((1, 2), [(3, 5), (3, 5), (b"", 12)], deleted=True)
    b.counts_deleted((1, 2), [(8, 1), (9, b"")])
    b.counted((1, 2), 9, 1, b"")
    table = {"settled": [(1, 2, 6, 9)], "counts": [(1, 2, 7, 2), (1, 2, 9, 1)]}
    assert b.sum((1, 2)) == summed(query)[(1, 2)]
    b.moved.clear()
    b.drop((1, 2))
    assert b.sum((1, 2)) == 0 and b.moved == {(1, 2)}


@pytest.mark.parametrize("table,column", [("settled", "start"), ("counts", "dc"), ("chunks", "start")])
def test_a_value_whose_type_changed_at_rest_is_damage_not_a_crash(tmp_path: Path, table: str, column: str) -> None:
    """A flipped bit in a SQLite record's header can turn a stored integer into a blob (serial
    type 4 into 12). The row fails its checksum (or, for a chunk, its start or count is not a
    number): the partition is damaged, named by the store's open and by ``tandem scrub``, which
    neither stops on it."""
    db, _before = _two_writes(tmp_path, BOOKS_LEVEL, [SetDeliveryCount(1, 0, [(6, 2)])])
    conn = sqlite3.connect(db)
    for (trigger,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        conn.execute(f"DROP TRIGGER {trigger}")
    conn.execute(f"UPDATE {table} SET {column} = x'' WHERE queue_id = 1")
    conn.commit()
    conn.close()
    e = SqliteEngine(db)
    rec = e.open()
    e.close()
    assert list(rec.store_damage) == [(1, 0)], rec.store_damage
    assert rec.partitions[(1, 0)].messages == []
    damage = scrub_store(db).damage
    assert damage and all("partition 1/0" in line for line in damage), damage


def test_every_write_keeps_the_digest_of_the_settlements_and_counts_it_leaves(tmp_path: Path) -> None:
    """Appends, settlements (whole chunks deleted, ranges below the log's start deleted, the same
    range twice), delivery counts set and set again, trims, resets, a dropped queue, and the level
    reached with rows already stored, with and without an applied position, drawn from a seed: reopened after one write in five, no
    partition reads as damaged and every row of partitions is summed."""
    rng = random.Random(12)
    db = tmp_path / "tandem.db"
    e = SqliteEngine(db)
    e.open()
    queues = {1: Q, 2: dataclasses.replace(Q, id=2, name="other")}
    e.apply([PutMeta(LEVEL_KEY, str(APPLIED_LEVEL)), *(PutQueue(q) for q in queues.values())], sync=True)
    ends = {1: 0, 2: 0}
    applied = {1: 0, 2: 0}
    summed_rows = 0
    try:
        for step in range(400):
            qid = rng.choice([1, 2])
            roll = rng.random()
            applied[qid] += 1
            # (a node without a group applies no entries: no applied position moves with its writes)
            moved = [PutApplied(qid, 0, applied[qid], 3, "node1")] if rng.random() < 0.6 else []
            low = max(0, ends[qid] - 15)
            if step == 100:
                ops: list[Any] = [PutMeta(LEVEL_KEY, str(BOOKS_LEVEL))]
            elif roll < 0.35:
                n = rng.randint(1, 5)
                ops = [Append(qid, 0, _msgs(ends[qid], n), ends[qid] + n), *moved]
                ends[qid] += n
            elif roll < 0.6 and ends[qid]:
                picked = rng.sample(range(low, ends[qid]), k=min(4, ends[qid] - low))
                ops = [Settle(qid, 0, picked)] + ([Settle(qid, 0, picked)] if rng.random() < 0.2 else []) + moved
            elif roll < 0.8 and ends[qid]:
                ops = [SetDeliveryCount(qid, 0, [(rng.randrange(low, ends[qid]), rng.randint(1, 4))
                                                 for _ in range(rng.randint(1, 3))]), *moved]
            elif roll < 0.88:
                ops = [Trim(qid, 0, rng.randint(0, ends[qid])), *moved]
            elif roll < 0.95:
                ops = [ResetPartition(qid, 0), *moved]
                ends[qid] = 0
            else:
                ops = [DropQueue(qid), PutQueue(queues[qid])]
                ends[qid] = applied[qid] = 0
            e.apply(ops, sync=False)
            if rng.random() < 0.2:
                e = reopened_whole(e, db, step)
                if step > 100:
                    summed_rows += sum(len(rows_of(db, t, (q, 0))) for t in ("settled", "counts") for q in queues)
    finally:
        e.close()
    assert_summed(db, "digest IS NULL OR queue_id = 0")
    assert summed_rows > 100, summed_rows  # (the walk's reopens at the level found rows to sum)
