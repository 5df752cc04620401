"""The witness's store (terms, votes, positions: what it reloads after a restart), its
command line (clear one-line errors), and the tasks it starts (all ended by its stop)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from broker.config import ConfigError
from broker.arbiters.witness import Witness, WitnessConfig, WitnessStore
from broker.peers.codec import encode_message, encode_replicate
from ha.messages import Entry, RequestVote
from storage.sqlite.rowsums import DamagedRow
from tests.helpers import group_secret_file, wait_until


def test_the_store_gives_back_terms_votes_commit_and_positions_after_a_reopen(tmp_path: Path) -> None:
    s = WitnessStore(tmp_path / "witness.db")
    stamp = s.stamp("witness-1")
    key = (3, 1)
    s.write([("hard", key, 4, "node1", 2),
             ("append", key, [Entry(4, i, None, "node1", False) for i in range(1, 6)])])
    s.write([("truncate", key, 5), ("append", key, [Entry(5, 5, None, "node2", True)]),
             ("snapshot", key, 2, 4, "node1"), ("hard", key, 5, None, 3)])
    s.close()
    s = WitnessStore(tmp_path / "witness.db")
    assert s.stamp("witness-2") == stamp
    saved = s.load()[key]
    assert (saved.term, saved.voted_for, saved.commit, saved.snapshot) == (5, None, 3, (2, 4, "node1"))
    assert [(e.index, e.term, e.origin, e.weak) for e in saved.entries] == [
        (3, 4, "node1", False), (4, 4, "node1", False), (5, 5, "node2", True)]
    s.close()


def _filled(path: Path) -> None:
    s = WitnessStore(path)
    s.write([("hard", (3, 1), 6, "node1", 4), ("snapshot", (3, 1), 2, 5, "node1"),
             ("append", (3, 1), [Entry(6, i, None, "node1", False) for i in range(3, 8)])])
    s.close()


def _damage(path: Path, statement: str) -> None:
    """``statement`` run as damage at rest would leave it: the checksums' triggers (which the
    store makes again when it opens) dropped first, so the row keeps its checksum."""
    db = sqlite3.connect(path)
    db.executescript("DROP TRIGGER hard_unsummed; DROP TRIGGER entry_unsummed; DROP TRIGGER entry_gone;")
    db.execute(statement)
    db.commit()
    db.close()


@pytest.mark.parametrize("flip, named", [
    ("UPDATE hard SET term = (term | 4) - (term & 4)", "the term, vote and commit index of log 3/1 (table hard)"),
    ("UPDATE hard SET voted_for = 'node3'", "the term, vote and commit index of log 3/1 (table hard)"),
    ("UPDATE hard SET snap_index = (snap_index | 1) - (snap_index & 1)", "the term, vote and commit index of log 3/1 (table hard)"),
    ("UPDATE entries SET term = (term | 2) - (term & 2) WHERE idx = 5", "the position of entry 5 of log 3/1 (table entries)"),
    ("UPDATE entries SET origin = 'node2' WHERE idx = 7", "the position of entry 7 of log 3/1 (table entries)"),
], ids=["term", "vote", "snapshot-mark", "entry-term", "entry-origin"])
def test_a_row_damaged_at_rest_is_named_and_never_loaded(tmp_path: Path, flip: str, named: str) -> None:
    """A value changed under its checksum, as a bit flipped at rest leaves it, stops the load,
    naming the file and the row."""
    path = tmp_path / "witness.db"
    _filled(path)
    _damage(path, flip)
    s = WitnessStore(path)
    with pytest.raises(DamagedRow) as err:
        s.load()
    s.close()
    assert named in err.value.message and str(path) in err.value.message and "does not start" in err.value.message


def test_rows_an_older_build_wrote_or_changed_read_unchecked(tmp_path: Path) -> None:
    """A store of a build before the checksums (no ``crc`` column, no ``entry_sums``) opens and
    loads; a row changed without its checksum (that build, after a rollback) is read unchecked
    until the next write sums it again."""
    path = tmp_path / "witness.db"
    old = sqlite3.connect(path)
    old.executescript("""
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE hard (qid INTEGER, part INTEGER, term INTEGER NOT NULL, voted_for TEXT,
            commit_index INTEGER NOT NULL, snap_index INTEGER NOT NULL DEFAULT 0, snap_term INTEGER NOT NULL
            DEFAULT 0, snap_origin TEXT NOT NULL DEFAULT '', PRIMARY KEY (qid, part));
        CREATE TABLE entries (qid INTEGER, part INTEGER, idx INTEGER, term INTEGER NOT NULL,
            origin TEXT NOT NULL, weak INTEGER NOT NULL, PRIMARY KEY (qid, part, idx));
        INSERT INTO hard (qid, part, term, voted_for, commit_index) VALUES (3, 1, 2, 'node1', 1);
        INSERT INTO entries VALUES (3, 1, 2, 2, 'node1', 0);""")
    old.commit()
    old.close()
    s = WitnessStore(path)
    assert s.load()[(3, 1)].term == 2
    s.write([("hard", (3, 1), 3, "node2", 2), ("append", (3, 1), [Entry(3, 3, None, "node2", False)])])
    s.close()
    older = sqlite3.connect(path)  # what an older build's statements do to the rows it writes
    older.execute("INSERT INTO hard (qid, part, term, voted_for, commit_index) VALUES (3, 1, 4, 'node1', 3) "
                  "ON CONFLICT (qid, part) DO UPDATE SET term = excluded.term, voted_for = excluded.voted_for, "
                  "commit_index = excluded.commit_index")
    older.execute("INSERT OR REPLACE INTO entries VALUES (3, 1, 3, 4, 'node1', 0)")
    older.commit()
    assert older.execute("SELECT crc FROM hard").fetchall() == [(None,)]
    assert older.execute("SELECT idx FROM entry_sums").fetchall() == []
    older.close()
    s = WitnessStore(path)
    saved = s.load()[(3, 1)]
    assert (saved.term, saved.voted_for, [(e.index, e.term) for e in saved.entries]) == (4, "node1", [(2, 2), (3, 4)])
    s.write([("hard", (3, 1), 5, "node1", 3), ("append", (3, 1), [Entry(5, 4, None, "node1", False)])])
    s.close()
    db = sqlite3.connect(path)
    assert db.execute("SELECT crc IS NOT NULL FROM hard").fetchall() == [(1,)]
    assert [r[0] for r in db.execute("SELECT idx FROM entry_sums ORDER BY idx")] == [4]
    db.close()


def test_scrub_names_each_damaged_row_of_a_witness_store_and_changes_nothing(tmp_path: Path) -> None:
    d = tmp_path / "w1"
    _filled(d / "witness.db")
    scrub = [sys.executable, "-m", "broker.cli", "scrub", "--data-dir", str(d)]
    clean = subprocess.run(scrub, capture_output=True, text=True, timeout=60)
    assert clean.returncode == 0 and "6 row(s) of the witness's store passed their checks; nothing damaged" in clean.stdout
    _damage(d / "witness.db", "UPDATE entries SET origin = 'node2' WHERE idx = 6")
    before = (d / "witness.db").read_bytes()
    found = subprocess.run([*scrub, "--json"], capture_output=True, text=True, timeout=60)
    assert found.returncode == 1, found.stderr
    report = json.loads(found.stdout)
    assert report["witness_rows"] == 5 and report["damage"] == [
        f"{d / 'witness.db'}: the position of entry 6 of log 3/1 (table entries) fails its checksum: damaged at rest"]
    assert (d / "witness.db").read_bytes() == before


@pytest.mark.asyncio
async def test_a_witness_whose_vote_took_damage_does_not_start_and_says_why_in_one_line(tmp_path: Path) -> None:
    cfg = WitnessConfig(name="w1", peer_port=0, peers=("node1=127.0.0.1:1", "node2=127.0.0.1:2"),
                        data_dir=tmp_path / "w1", cluster_secret_file=group_secret_file(tmp_path))
    _filled(cfg.data_dir / "witness.db")
    _damage(cfg.data_dir / "witness.db", "UPDATE hard SET voted_for = 'node2'")
    with pytest.raises(ConfigError, match="fails its checksum: damaged at rest") as err:
        await Witness(cfg).start()
    assert "\n" not in err.value.message


def test_config_wants_the_two_data_nodes_and_a_name_of_its_own() -> None:
    with pytest.raises(ConfigError, match="two-node group"):
        WitnessConfig(name="w1", peer_port=7781, peers=("node1=h:7771",))
    with pytest.raises(ConfigError, match="also the name of a data node"):
        WitnessConfig(name="node1", peer_port=7781, peers=("node1=h:7771", "node2=h:7772"))
    with pytest.raises(ConfigError, match="keepalive_interval"):
        WitnessConfig(name="w1", peer_port=7781, peers=("node1=h:7771", "node2=h:7772"), keepalive_interval=5)


@pytest.mark.parametrize("args, message", [
    (["--peers", "node1=h:1"], "two-node group"),
    (["--peers", "node1=h:1,node2"], "'node2' is not NAME=HOST:PORT"),
    (["--peers", "node1=h:1,node2=h:2", "--peer-port", "70000"], "--peer-port 70000"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    base = {"--name": "w1", "--peer-port": "7781"}
    for i in range(0, len(args), 2):
        base[args[i]] = args[i + 1]
    cmd = [sys.executable, "-m", "broker.cli", "witness", "start", *[x for kv in base.items() for x in kv]]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_one_witness_per_data_dir(tmp_path: Path) -> None:
    s = WitnessStore(tmp_path / "witness.db")
    with pytest.raises(ConfigError, match="another witness is running on it"):
        WitnessStore(tmp_path / "witness.db")
    s.close()
    WitnessStore(tmp_path / "witness.db").close()


@pytest.mark.asyncio
async def test_stop_ends_every_task_the_witness_started(tmp_path: Path) -> None:
    """Its links (an accepted one that says nothing), its vote loop and a vote's write in
    flight: after stop none is alive."""
    before = asyncio.all_tasks()
    cfg = WitnessConfig(name="w1", peer_port=0, peers=("node1=127.0.0.1:1", "node2=127.0.0.1:2"),
                        data_dir=tmp_path / "w1", cluster_secret_file=group_secret_file(tmp_path))
    w = Witness(cfg)
    await w.start()
    assert w.peers is not None and w.peers.address is not None
    _reader, writer = await asyncio.open_connection(*w.peers.address)
    vote = encode_replicate([[3, 0, encode_message(RequestVote(1, "node1", 0, 0, 1))]])
    w.receive("node1", vote)  # its answer is written before it goes: a write on a thread
    await wait_until(lambda: w._writing is not None or bool(w.logs), what="the vote taken")
    await w.stop()
    assert [t for t in asyncio.all_tasks() if t not in before and not t.done()] == []
    writer.close()
