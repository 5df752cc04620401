"""``tandem scrub`` (broker.tools.scrub_cli over storage.segfiles.scan and
storage.sqlite.scrub): every record of a node's files read and checked, nothing changed; damage
named by file and offset, exit 1; a torn tail named as such; a clean directory exit 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from storage.base import Append, LogAppend, LogRecord, PutMeta, PutQueue, StoredMessage
from storage.segfiles import records, scan
from storage.sqlite import SqliteEngine
from storage.sqlite.rowsums import LEVEL, LEVEL_KEY
from storage.sqlite.scrub import scrub_store
from tests.storage.test_recovery import Q, flip_stored_bit


def _node_dir(d: Path) -> Path:
    e = SqliteEngine(d / "tandem.db")
    e.open()
    e.apply([PutMeta(LEVEL_KEY, str(LEVEL)), PutQueue(Q)], sync=True)  # (a level whose rows carry checksums)
    for b in range(3):
        msgs = [StoredMessage(b * 5 + i, None, b"\x80", os.urandom(500), None, None, 0.0) for i in range(5)]
        e.apply([Append(1, 0, msgs, b * 5 + 5),
                 LogAppend(1, 0, [LogRecord(b * 2 + i + 1, 1, "n1", False, os.urandom(200)) for i in range(2)])],
                sync=True)
    e.close()
    return d


def tandem_scrub(d: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "broker.cli", "scrub", "--data-dir", str(d), *args],
                          capture_output=True, text=True, timeout=60)


def test_a_clean_directory_passes_and_nothing_is_changed(tmp_path: Path) -> None:
    d = _node_dir(tmp_path)
    kept = [d / "tandem.db", *sorted((d / "tandem.db-log").glob("*.seg"))]  # (SQLite may make its -shm to read)
    before = {p: p.read_bytes() for p in kept}
    out = tandem_scrub(d)
    assert out.returncode == 0, out
    assert out.stdout.strip() == "3 log record(s), 3 chunk(s) and 5 other row(s) passed their checks; nothing damaged"
    assert {p: p.read_bytes() for p in kept} == before


def test_damage_in_the_log_and_the_store_is_named_and_a_torn_tail_told_apart(tmp_path: Path) -> None:
    d = _node_dir(tmp_path)
    start = flip_stored_bit(d / "tandem.db", 1, 0)
    seg = sorted((d / "tandem.db-log").glob("*.seg"))[-1]
    data = bytearray(seg.read_bytes())
    second = [pos for pos, _body, _fault in records(bytes(data), True)][1]
    data[20] ^= 0x01  # (the first record's payload: records follow it)
    seg.write_bytes(bytes(data))
    good, damage, torn = scan(d / "tandem.db-log")
    assert (good, torn) == (2, []) and damage == [  # (read on past it)
        f"{seg} at byte 0 (a record failing its checksum, a readable record at byte {second} after it)"]
    store = scrub_store(d / "tandem.db")
    store_damage = store.damage
    assert (store.chunks, store.unchecked) == (2, 0) and len(store_damage) == 1
    assert f"from offset {start} (" in store_damage[0]
    out = tandem_scrub(d, "--json")
    assert out.returncode == 1, out
    report = json.loads(out.stdout)
    assert report["damage"] == damage + store_damage and report["chunks"] == 2

    clean = _node_dir(tmp_path / "other")
    seg = sorted((clean / "tandem.db-log").glob("*.seg"))[-1]
    seg.write_bytes(seg.read_bytes()[:-7])  # (the last write cut short)
    out = tandem_scrub(clean)
    assert out.returncode == 0, out
    assert "torn " in out.stdout and "a torn record: a torn tail" in out.stdout
    assert out.stdout.splitlines()[-1] == "2 log record(s), 3 chunk(s) and 5 other row(s) passed their checks; nothing damaged"


def test_not_a_data_directory_is_said(tmp_path: Path) -> None:
    out = tandem_scrub(tmp_path)
    assert out.returncode == 2 and "not found: is" in out.stdout
