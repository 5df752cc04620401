"""Closing the SQLite store while a reader thread reads: close waits for the read (closing
the connection under it crashes the process), and later reads are refused."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from sqlalchemy import Connection

import storage.sqlite.engine as engine_mod
from client.errors import StorageError
from storage.base import PartitionState
from storage.sqlite import SqliteEngine


def test_close_waits_for_a_read_in_flight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    eng = SqliteEngine(tmp_path / "store.db")
    eng.open()
    reading, release = threading.Event(), threading.Event()
    real = engine_mod.read_partition

    def slow_read(conn: Connection, queue_id: int, partition: int, budget: int = 0) -> PartitionState:
        reading.set()
        assert release.wait(10)
        return real(conn, queue_id, partition, budget)

    monkeypatch.setattr(engine_mod, "read_partition", slow_read)
    results: list[PartitionState] = []
    reader = threading.Thread(target=lambda: results.append(eng.load_partition(1, 0)))
    reader.start()
    assert reading.wait(10)
    closer = threading.Thread(target=eng.close)
    closer.start()
    closer.join(0.2)
    assert closer.is_alive(), "close did not wait for the read in flight"
    release.set()
    reader.join(10)
    closer.join(10)
    assert not closer.is_alive() and len(results) == 1
    with pytest.raises(StorageError, match="closed"):
        eng.load_partition(1, 0)
