"""Torn and partial writes: recovery keeps every whole commit and never crashes on the rest.

The store is copied while the writer still holds it open (so the WAL has not
been checkpointed into the main file — the state a kill -9 leaves), then the
copy's WAL is cut or scribbled on, as a crash in the middle of a write would.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from storage.base import Append, PutProducer, PutQueue, QueueMeta, Settle, StoredMessage, WriteOp
from storage.sqlite import SqliteEngine
from storage.sqlite.reads import DamagedChunk, DamagedStore, unreadable
from storage.writer import GroupCommitWriter

Q = QueueMeta(id=1, name="q", partitions=1, mapper="round_robin", ring_size=1, max_deliveries=0,
              dead_letter_queue=None, max_length=0)


def _write_batches(d: Path, batches: int) -> SqliteEngine:
    e = SqliteEngine(d / "tandem.db")
    e.open()
    e.apply([PutQueue(Q)], sync=True)
    for b in range(batches):
        msgs = [StoredMessage(b * 10 + i, None, b"\x80", os.urandom(3000), None, None, 0.0) for i in range(10)]
        e.apply([Append(1, 0, msgs, b * 10 + 10)], sync=True)
    return e


def _snapshot(src: Path, dst: Path) -> None:
    dst.mkdir()
    for name in ("tandem.db", "tandem.db-wal"):
        shutil.copy(src / name, dst / name)


def _offsets(d: Path) -> list[int]:
    e = SqliteEngine(d / "tandem.db")
    try:
        rec = e.open()
    finally:
        e.close()
    st = rec.partitions.get((1, 0))
    return [m.offset for m in st.messages] if st else []


def test_wal_holds_the_commits_of_a_killed_writer(tmp_path: Path) -> None:
    live = _write_batches(tmp_path / "live", 5)
    _snapshot(tmp_path / "live", tmp_path / "crash")
    live.close()
    assert (tmp_path / "crash" / "tandem.db-wal").stat().st_size > 0
    assert _offsets(tmp_path / "crash") == list(range(50))


@pytest.mark.parametrize("cut", [1, 100, 2000, 4100])
def test_truncated_wal_recovers_a_prefix_of_whole_commits(tmp_path: Path, cut: int) -> None:
    live = _write_batches(tmp_path / "live", 5)
    _snapshot(tmp_path / "live", tmp_path / "crash")
    live.close()
    wal = tmp_path / "crash" / "tandem.db-wal"
    size = wal.stat().st_size
    with open(wal, "r+b") as f:
        f.truncate(size - cut)
    got = _offsets(tmp_path / "crash")
    # whole batches only: a prefix of the commits, ending on a batch boundary
    assert got == list(range(len(got))) and len(got) % 10 == 0
    assert len(got) < 50


def test_scribbled_last_frame_is_ignored(tmp_path: Path) -> None:
    live = _write_batches(tmp_path / "live", 5)
    _snapshot(tmp_path / "live", tmp_path / "crash")
    live.close()
    wal = tmp_path / "crash" / "tandem.db-wal"
    size = wal.stat().st_size
    with open(wal, "r+b") as f:
        f.seek(size - 500)
        f.write(os.urandom(200))
    got = _offsets(tmp_path / "crash")
    assert got == list(range(40))  # the torn last commit is dropped, the four before it kept


def test_a_read_transaction_sees_one_snapshot(tmp_path: Path) -> None:
    """load_partition reads several tables; a commit between two of its SELECTs must not
    show (pysqlite's implicit transactions would let it; the replication snapshot reads this way)."""
    from storage.base import Append, PutQueue, QueueMeta
    from storage.sqlite import SqliteEngine

    e = SqliteEngine(tmp_path / "t.db")
    e.open()
    q = QueueMeta(id=1, name="q", partitions=1, mapper="round_robin", ring_size=1, max_deliveries=0,
                  dead_letter_queue=None, max_length=0)
    e.apply([PutQueue(q)], sync=True)
    reader = e._reader()
    with reader.begin():
        before = reader.exec_driver_sql("SELECT count(*) FROM queues").scalar()
        e.apply([PutQueue(dataclasses.replace(q, id=2, name="q2"))], sync=True)  # another connection commits
        again = reader.exec_driver_sql("SELECT count(*) FROM queues").scalar()
        chunks = reader.exec_driver_sql("SELECT count(*) FROM partitions").scalar()
    assert before == again == 1 and chunks == 0
    assert e.load_partition(1, 0).next_offset == 0
    e.apply([Append(1, 0, [], 5)], sync=True)
    assert e.load_partition(1, 0).next_offset == 5
    e.close()


def test_the_wal_starts_over_under_a_steady_stream_of_commits(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Background checkpoints never copy the frame the next commit adds, and SQLite reuses
    the WAL from its start only once every frame is copied: without the writer finishing
    a checkpoint now and then, the WAL grows as long as commits keep coming."""
    import storage.sqlite.checkpoints as sq

    monkeypatch.setattr(sq, "WAL_RESTART_FRAMES", 64)  # 1 MiB of 16 KiB pages
    monkeypatch.setattr(sq, "WAL_RESTART_BYTES", 1024 * 1024)
    e = SqliteEngine(tmp_path / "tandem.db")
    e.open()
    e.apply([PutQueue(Q)], sync=True)
    written = 0
    offset = 0
    deadline = time.monotonic() + 120
    # 96 MiB of commits, each soon settled (the database itself stays small), and a few
    # restarts seen (or 512 MiB without): commits never pause for the background checkpointer
    while written < 96 * 1024 * 1024 or (e.wal_restarts < 3 and written < 512 * 1024 * 1024):
        assert time.monotonic() < deadline, f"only {written} bytes written in 120 s"
        msgs = [StoredMessage(offset + i, None, b"\x80", os.urandom(8000), None, None, 0.0) for i in range(8)]
        e.apply([Append(1, 0, msgs, offset + 8), Settle(1, 0, list(range(max(0, offset - 64), offset)))],
                sync=False)
        offset += 8
        written += 64000
    wal = (tmp_path / "tandem.db-wal").stat().st_size
    e.close()
    # it is reused from its start: its length is what is written between two restarts (the
    # background's interval at this rate, tens of MiB here), not everything written
    assert wal < written / 2, f"the WAL grew to {wal} bytes for {written} written"
    assert e.wal_restarts >= 3


def written_by_this_thread() -> int:
    """Bytes the calling thread has passed to write calls (Linux: /proc/thread-self/io)."""
    for line in Path("/proc/thread-self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise RuntimeError("/proc/thread-self/io has no wchar")


def test_a_chunk_settled_in_its_own_batch_is_never_written(tmp_path: Path) -> None:
    """Held-back store writes of a group often append and settle the same messages: such
    a chunk costs no write at all (the WAL grows by bookkeeping pages only), while a
    chunk with a live message is written."""
    e = SqliteEngine(tmp_path / "tandem.db")
    e.open()
    e.apply([PutQueue(Q)], sync=True)
    body = 400 * 2000
    msgs = [StoredMessage(i, None, b"\x80", os.urandom(2000), None, None, 0.0) for i in range(800)]
    # Bytes this thread (the one that commits) writes: the WAL's length says nothing once
    # the background checkpointer has let it start over from its beginning.
    before = written_by_this_thread()
    e.apply([Append(1, 0, msgs[:400], 400), Settle(1, 0, list(range(400)))], sync=False)
    grown = written_by_this_thread() - before
    assert grown < body / 4, f"{grown} bytes written for {body} bytes appended and settled at once"
    e.apply([Append(1, 0, msgs[400:], 800), Settle(1, 0, list(range(400, 799)))], sync=False)
    assert written_by_this_thread() - before - grown > body  # one live message: its chunk is written
    reader = e._reader()
    with reader.begin():
        rows = reader.exec_driver_sql("SELECT start, count FROM chunks ORDER BY start").fetchall()
    assert [tuple(r) for r in rows] == [(400, 400)]
    assert [m.offset for m in e.load_partition(1, 0).messages] == [799]
    e.close()


def test_a_batch_of_held_applies_writes_one_row_a_settled_range_and_a_producer(tmp_path: Path) -> None:
    """A batch of held-back applies carries an ack range and a producer position per
    publish: the store writes the merged ranges and each producer's last position, and the
    chunks it never wrote it does not delete either; what reopens is the same."""
    e = SqliteEngine(tmp_path / "tandem.db")
    e.open()
    e.apply([PutQueue(Q)], sync=True)
    msgs = [StoredMessage(i, "p", b"\x80", b"m%d" % i, "p", i, 0.0) for i in range(300)]
    e.apply([Append(1, 0, msgs[:100], 100)], sync=False)  # written: a chunk that stays for now
    statements: list[str] = []
    e._writer.connection.driver_connection.set_trace_callback(statements.append)  # type: ignore[union-attr]
    ops: list[WriteOp] = []
    for i in range(100, 300):  # publish entry by entry, each acked soon after, as a group applies them
        ops += [Append(1, 0, [msgs[i]], i + 1), PutProducer(1, 0, "p", i), Settle(1, 0, [i])]
    ops += [Settle(1, 0, list(range(0, 99)))]  # all but one of the chunk written before
    e.apply(ops, sync=False)
    e._writer.connection.driver_connection.set_trace_callback(None)  # type: ignore[union-attr]
    inserts = [s for s in statements if s.startswith("INSERT INTO settled")]
    upserts = [s for s in statements if s.startswith("INSERT INTO producers")]
    deletes = [s for s in statements if s.startswith("DELETE FROM chunks")]
    assert len(inserts) <= 2 and len(upserts) == 1 and deletes == [], (inserts, upserts, deletes)
    st = e.load_partition(1, 0)
    assert [m.offset for m in st.messages] == [99] and st.producers == {"p": 299} and st.next_offset == 300
    e.apply([Settle(1, 0, [99])], sync=False)  # the chunk written earlier goes now
    e.close()
    e = SqliteEngine(tmp_path / "tandem.db")
    e.open()
    st = e.load_partition(1, 0)
    assert st.messages == [] and st.producers == {"p": 299} and st.next_offset == 300
    reader = e._reader()
    with reader.begin():
        assert reader.exec_driver_sql("SELECT count(*) FROM chunks").fetchone()[0] == 0
    e.close()


def test_a_chunk_written_after_a_reset_in_the_same_batch_is_deleted_when_settled(tmp_path: Path) -> None:
    """One transaction: a chunk appended and settled (never written), the partition reset,
    the same offsets appended again and written (a flush comes between), then settled: that
    row must go: the first chunk's 'never written' mark must not skip its DELETE, or the acked
    messages would come back on reopen."""
    from storage.base import DropProducers, ResetPartition

    e = SqliteEngine(tmp_path / "tandem.db")
    e.open()
    e.apply([PutQueue(Q)], sync=True)
    old = [StoredMessage(i, None, b"\x80", b"old%d" % i, None, None, 0.0) for i in range(3)]
    new = [StoredMessage(i, None, b"\x80", b"new%d" % i, None, None, 0.0) for i in range(3)]
    e.apply([Append(1, 0, old, 3), Settle(1, 0, [0, 1, 2]), ResetPartition(1, 0), Append(1, 0, new, 3),
             DropProducers(1, 0, ["nobody"]), Settle(1, 0, [0, 1, 2])], sync=True)
    e.close()
    e = SqliteEngine(tmp_path / "tandem.db")
    e.open()
    assert e.load_partition(1, 0).messages == []
    reader = e._reader()
    with reader.begin():
        assert reader.exec_driver_sql("SELECT count(*) FROM chunks").fetchone()[0] == 0
    e.close()


def flip_stored_bit(db: Path, queue_id: int, partition: int, *, last: bool = False) -> int:
    """One bit of a stored chunk's payload flipped at rest (its checksum left as written), in the
    partition's second chunk (``last``: its newest): the chunk's start."""
    conn = sqlite3.connect(db, timeout=30)  # (the node may be running: its writer may hold the lock a moment)
    try:
        order = "start DESC LIMIT 1" if last else "start LIMIT 1 OFFSET 1"
        start, payload = conn.execute("SELECT start, payload FROM chunks WHERE queue_id = ? AND partition = ? "
                                      f"ORDER BY {order}", (queue_id, partition)).fetchone()
        damaged = bytearray(payload)
        damaged[len(damaged) // 2] ^= 0x04
        conn.execute("UPDATE chunks SET payload = ? WHERE queue_id = ? AND partition = ? AND start = ?",
                     (bytes(damaged), queue_id, partition, start))
        conn.commit()
    finally:
        conn.close()
    return int(start)


def test_a_bit_flipped_in_a_stored_body_is_found_and_none_of_its_partition_is_read(tmp_path: Path) -> None:
    e = _write_batches(tmp_path, 4)
    e.apply([PutQueue(dataclasses.replace(Q, id=2, name="other")),
             Append(2, 0, [StoredMessage(0, None, b"\x80", b"fine", None, None, 0.0)], 1)], sync=True)
    e.close()
    start = flip_stored_bit(tmp_path / "tandem.db", 1, 0)
    again = SqliteEngine(tmp_path / "tandem.db")
    rec = again.open()
    assert list(rec.store_damage) == [(1, 0)]
    assert f"the chunk of partition 1/0 from offset {start} (" in rec.store_damage[(1, 0)]
    assert "fails its checksum: damaged at rest" in rec.store_damage[(1, 0)]
    assert rec.partitions[(1, 0)].messages == [] and rec.logs[(1, 0)].store_damage == rec.store_damage[(1, 0)]
    assert [m.body for m in rec.partitions[(2, 0)].messages] == [b"fine"]  # (the other partition is read)
    with pytest.raises(DamagedChunk, match="fails its checksum"):
        again.read(1, 0, start, 10)
    with pytest.raises(DamagedChunk, match="fails its checksum"):
        again.load_partition(1, 0)
    assert [m.body for m in again.read(2, 0, 0, 10)] == [b"fine"]
    again.close()


def test_a_chunk_written_without_a_checksum_is_read_unchecked(tmp_path: Path) -> None:
    """A store an older build wrote (no ``crc``): its chunks read as they are."""
    e = _write_batches(tmp_path, 2)
    e.close()
    conn = sqlite3.connect(tmp_path / "tandem.db")
    conn.execute("UPDATE chunks SET crc = NULL")
    conn.commit()
    conn.close()
    again = SqliteEngine(tmp_path / "tandem.db")
    rec = again.open()
    assert not rec.store_damage and len(rec.partitions[(1, 0)].messages) == 20
    again.close()


def break_index_page(db: Path, index: str) -> None:
    """The root page of ``index`` overwritten with 0xff (a misdirected write landing there, or
    a page the disk gave back wrong), in a closed store: reading the tables needs no index page,
    a write through that index finds it malformed."""
    conn = sqlite3.connect(db)
    try:
        (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (index,)).fetchone()
        (size,) = conn.execute("PRAGMA page_size").fetchone()
    finally:
        conn.close()
    with open(db, "r+b") as f:
        f.seek((root - 1) * size)
        f.write(b"\xff" * size)


def test_a_write_the_damaged_file_refuses_is_never_tried_again(tmp_path: Path) -> None:
    """SQLite finding a page malformed (or unreadable) on a write: DamagedStore, which the writer
    does not retry; it tells its failure observers (the node stops on it) and the write's callback."""
    e = SqliteEngine(tmp_path / "tandem.db")
    e.open()
    e.apply([PutQueue(Q), PutProducer(1, 0, "p1", 1)], sync=True)
    e.close()
    break_index_page(tmp_path / "tandem.db", "sqlite_autoindex_producers_1")
    e = SqliteEngine(tmp_path / "tandem.db")
    assert e.open().partitions[(1, 0)].producers == {"p1": 1}
    done: list[BaseException | None] = []
    failures: list[BaseException] = []
    cv = threading.Condition()

    def notify(fn: Callable[[], None]) -> None:
        with cv:
            fn()
            cv.notify_all()

    writer = GroupCommitWriter(e, notify)
    writer.failure_observers.append(failures.append)
    try:
        writer.submit([PutProducer(1, 0, "p1", 2)], sync=True, callback=done.append)
        with cv:
            assert cv.wait_for(lambda: done, timeout=30)
    finally:
        writer.close()
        e.close()
    assert isinstance(done[0], DamagedStore) and "database disk image is malformed" in str(done[0])
    assert failures == done and unreadable(done[0]) and writer.stats.failed_commits == 1
