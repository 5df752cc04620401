"""From rowsums.APPLIED_LEVEL the store keeps a digest of its catalogue (storage.sqlite.catalogue_sum):
the queues, users and grants, and the catalogue's applied position. A lost write to the store's
file can leave a page with its older rows, each whole and passing its own checksum: a queue's
older settings, a revoked grant back, a deleted user back, or the catalogue's applied position
behind its rows. Each is found at the store's open (the node does not start, naming it) and by
``tandem scrub``; below the level such a store opens as if whole."""

from __future__ import annotations

import dataclasses
import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from storage.base import (AclRecord, DropQueue, DropUser, GrantAcl, PutApplied, PutMeta, PutQueue, PutUser, RevokeAcl,
                          UserRecord, WriteOp)
from storage.sqlite import SqliteEngine
from storage.sqlite.catalogue_sum import KEY, summed
from storage.sqlite.rowsums import APPLIED_LEVEL, DIGEST_LEVEL, LEVEL_KEY
from storage.sqlite.scrub import scrub_store
from tests.storage.test_recovery import Q

ALICE = UserRecord(name="alice", salt=b"s", hash=b"h" * 64, role="user", params="scram-sha-256:i=4096")
GRANT = AclRecord(user="alice", pattern="orders.*", permissions=("produce", "consume"))
MISFIT = ("the catalogue's rows (queues, users, grants) and its applied position are not those its digest in meta "
          f"({KEY}) sums up: a write to the store was lost or misdirected")


def _rows(db: Path, table: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute(f"SELECT * FROM {table}").fetchall()
    finally:
        conn.close()


def _put_back(db: Path, table: str, rows: list[tuple[Any, ...]]) -> None:
    """``table`` as it was (``rows``): what a page that kept its older rows holds. The store's
    triggers do not fire on a disk's lost write: they are dropped (the store makes them again)."""
    conn = sqlite3.connect(db)
    try:
        for (trigger,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
            conn.execute(f"DROP TRIGGER {trigger}")
        conn.execute(f"DELETE FROM {table}")
        for row in rows:
            conn.execute(f"INSERT INTO {table} VALUES ({', '.join('?' * len(row))})", row)
        conn.commit()
    finally:
        conn.close()


def _written(db: Path, *batches: list[WriteOp]) -> None:
    e = SqliteEngine(db)
    e.open()
    try:
        for ops in batches:
            e.apply(ops, sync=True)
    finally:
        e.close()


def _opened(db: Path) -> list[str]:
    """The catalogue damage the store's open finds."""
    e = SqliteEngine(db)
    try:
        return e.open().row_damage
    finally:
        e.close()


FIRST = [PutMeta(LEVEL_KEY, str(APPLIED_LEVEL)), PutQueue(Q), PutUser(ALICE), GrantAcl(GRANT),
         PutApplied(0, 0, 4, 2, "node1")]

#: table -> the write a lost write to its page undoes
LATER: dict[str, list[WriteOp]] = {
    "queues": [PutQueue(dataclasses.replace(Q, max_length=100)), PutApplied(0, 0, 5, 2, "node1")],
    "acls": [RevokeAcl(dataclasses.replace(GRANT, permissions=("produce",))), PutApplied(0, 0, 5, 2, "node1")],
    "users": [DropUser("alice"), PutApplied(0, 0, 5, 2, "node1")],
    "ha_state": [PutQueue(dataclasses.replace(Q, id=2, name="other")), PutApplied(0, 0, 5, 2, "node1")],
}


@pytest.mark.parametrize("table", list(LATER), ids=["a queue's older settings", "a revoked grant back",
                                                     "a deleted user back", "the applied position behind"])
def test_a_catalogue_row_one_write_old_is_found_at_the_open_and_by_scrub(tmp_path: Path, table: str) -> None:
    db = tmp_path / "tandem.db"
    _written(db, FIRST)
    before = _rows(db, table)
    _written(db, LATER[table])
    assert _opened(db) == [] and scrub_store(db).damage == []
    _put_back(db, table, before)
    assert _opened(db) == [f"store {db}: {MISFIT}"]
    assert scrub_store(db).damage == [f"store {db}: {MISFIT}"]


def test_below_the_level_the_catalogue_is_checked_row_by_row_only(tmp_path: Path) -> None:
    """The fault the level is for, at the level before it: the older row opens as whole."""
    db = tmp_path / "tandem.db"
    _written(db, [PutMeta(LEVEL_KEY, str(DIGEST_LEVEL)), *FIRST[1:]])
    before = _rows(db, "queues")
    _written(db, LATER["queues"])
    _put_back(db, "queues", before)
    assert _opened(db) == [] and scrub_store(db).damage == []


def test_the_store_reaching_the_level_sums_up_its_catalogue_as_it_stands(tmp_path: Path) -> None:
    db = tmp_path / "tandem.db"
    _written(db, [PutMeta(LEVEL_KEY, str(DIGEST_LEVEL)), *FIRST[1:]], [PutMeta(LEVEL_KEY, str(APPLIED_LEVEL))])
    assert _opened(db) == [] and scrub_store(db).damage == []
    before = _rows(db, "acls")
    _written(db, [RevokeAcl(GRANT)])
    _put_back(db, "acls", before)
    assert _opened(db) == [f"store {db}: {MISFIT}"]


def test_the_digest_follows_every_catalogue_write(tmp_path: Path) -> None:
    """A random walk over the catalogue's writes, with the store closed and opened again now and
    then: the digest kept always fits the rows, and equals what they sum up from scratch."""
    db = tmp_path / "tandem.db"
    rng = random.Random(5)
    e = SqliteEngine(db)
    e.open()
    try:
        e.apply([PutMeta(LEVEL_KEY, str(APPLIED_LEVEL))], sync=True)
        applied = 0
        for step in range(300):
            n = rng.randrange(6)
            user = f"u{rng.randrange(4)}"
            ops: list[WriteOp] = []
            if n == 0:
                qid = rng.randrange(1, 6)
                ops.append(PutQueue(dataclasses.replace(Q, id=qid, name=f"q{qid}", max_length=rng.randrange(3))))
            elif n == 1:
                ops.append(DropQueue(rng.randrange(1, 6)))
            elif n == 2:
                ops.append(PutUser(dataclasses.replace(ALICE, name=user, role=rng.choice(["user", "admin"]))))
            elif n == 3:
                ops.append(DropUser(user))
            else:
                perms = tuple(rng.sample(["produce", "consume", "browse"], rng.randrange(1, 3)))
                acl = AclRecord(user=user, pattern=rng.choice(["a.*", "*"]), permissions=perms)
                ops.append(GrantAcl(acl) if n == 4 else RevokeAcl(acl))
            if rng.random() < 0.5:
                applied += 1
                ops.append(PutApplied(0, 0, applied, 3, "node1"))
            e.apply(ops, sync=False)
            if step % 40 == 39:
                e.close()
                e = SqliteEngine(db)
                assert e.open().row_damage == [], step
    finally:
        e.close()
    assert scrub_store(db).damage == []
    conn = sqlite3.connect(db)
    try:
        kept = conn.execute("SELECT value FROM meta WHERE key = ?", (KEY,)).fetchone()[0]
        assert int(kept) == summed(conn.execute) != 0
    finally:
        conn.close()
