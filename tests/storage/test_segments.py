"""The replication log's segment files (storage/segments.py), and the SQLite engine that
keeps its log in them: replay, torn writes, space reclaimed, the ha_log table carried over."""

from __future__ import annotations

import dataclasses
import os
import re
import sqlite3
import struct
import zlib
from pathlib import Path

import msgpack
import pytest

from client.errors import StorageError
from storage.base import DropQueue, LogAppend, LogCompact, LogRecord, LogTruncate, PutApplied, PutHardState, PutQueue
from storage.base import QueueMeta
from broker.tools.powerfs import PowerFS
from broker.tools.powerfs_mount import fuse_missing
from storage.segfiles import encode, read_segment, records, scan
from storage.segments import SegmentLog
from storage.sqlite import SqliteEngine

KIB = 1024


def append(qid: int, p: int, first: int, n: int, *, term: int = 1, size: int = 100) -> list[object]:
    return ["A", qid, p, [[i, term, "n1", False, bytes([i % 256]) * size] for i in range(first, first + n)]]


def indexes(recs: list[LogRecord]) -> list[int]:
    return [r.index for r in recs]


def test_entries_truncations_and_deleted_queues_come_back_across_segments(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path / "log", segment_bytes=1 * KIB)
    assert log.open() == {}
    log.write([append(1, 0, 1, 30)], sync=True)  # several segments' worth, in one record
    log.write([append(1, 1, 1, 5), append(2, 0, 1, 3)], sync=False)
    log.write([["T", 1, 0, 21], append(1, 0, 21, 4, term=2)], sync=True)  # a new active rewrote the tail
    log.write([["X", 2]], sync=False)
    log.write([append(1, 1, 6, 60)], sync=False)
    assert log.segments > 2
    log.close()

    again = SegmentLog(tmp_path / "log", segment_bytes=1 * KIB)
    got = again.open()
    assert set(got) == {(1, 0), (1, 1)}  # queue 2 was deleted
    assert indexes(got[(1, 0)]) == list(range(1, 25))
    assert [r.term for r in got[(1, 0)]][19:] == [1, 2, 2, 2, 2]
    assert got[(1, 0)][0].data == b"\x01" * 100
    assert indexes(got[(1, 1)]) == list(range(1, 66))
    # and it goes on appending where it stopped
    again.write([append(1, 0, 25, 1)], sync=True)
    again.close()
    third = SegmentLog(tmp_path / "log", segment_bytes=1 * KIB)
    assert indexes(third.open()[(1, 0)]) == list(range(1, 26))
    third.close()


def _newest(directory: Path) -> Path:
    return sorted(directory.glob("*.seg"))[-1]


@pytest.mark.parametrize("cut", [3, 11, 60])  # inside the header, inside the payload, near its end
def test_a_torn_last_record_is_cut_off_and_what_came_before_stays(tmp_path: Path, cut: int) -> None:
    log = SegmentLog(tmp_path / "log")
    log.open()
    log.write([append(1, 0, 1, 3)], sync=True)
    last = log.size()  # where the last record starts
    log.write([append(1, 0, 4, 1)], sync=True)
    log.close()
    seg = _newest(tmp_path / "log")
    whole = seg.read_bytes()
    assert len(whole) > last + cut
    seg.write_bytes(whole[:last + cut])  # a crash in the middle of the last write

    again = SegmentLog(tmp_path / "log")
    got = again.open()
    assert indexes(got[(1, 0)]) == [1, 2, 3]
    again.write([append(1, 0, 4, 2)], sync=True)  # appends go after the cut, not after the garbage
    again.close()
    assert indexes(SegmentLog(tmp_path / "log").open()[(1, 0)]) == [1, 2, 3, 4, 5]



@pytest.mark.parametrize("where", ["payload", "checksum", "length up", "length down", "length to zero"])
def test_one_bit_flipped_in_the_newest_record_is_damage_not_a_write_cut_short(tmp_path: Path, where: str) -> None:
    """After a crash (the log not closed cleanly) a newest record that fails its checks because
    of one flipped bit is damage at rest, never a torn tail to cut off (it may be an entry this
    node acknowledged): CRC-32 tells a single flipped bit, in the payload, the checksum or the
    length, from the bytes of a write a crash cut short.  Nothing is cut."""
    # (a payload whose length is a power of two: its one bit flipped reads as an empty record)
    size = next(n for n in range(100, 400) if len(encode(append(1, 0, 4, 1, size=n), 2, [1, 1, [(1, 0)]], 1)) - 8
                == 256)
    log = SegmentLog(tmp_path / "log")
    log.open()
    log.write([append(1, 0, 1, 3)], sync=True)
    last = log.size()  # where the newest record starts
    log.write([append(1, 0, 4, 1, size=size)], sync=True)
    log.close()
    seg = _newest(tmp_path / "log")
    data = bytearray(seg.read_bytes())
    assert struct.unpack_from("<I", data, last)[0] == 256
    at, bit = {"payload": (last + 8 + 40, 3), "checksum": (last + 6, 1), "length up": (last + 2, 4),
               "length down": (last, 2), "length to zero": (last + 1, 0)}[where]
    data[at] ^= 1 << bit
    seg.write_bytes(bytes(data))
    again = SegmentLog(tmp_path / "log")
    got = again.open()  # (not closed cleanly: a crash's log)
    [said] = again.damage
    assert said.startswith(f"{seg} at byte {last} (") and ", one bit flipped in its " in said, said
    assert said.endswith(": damage at rest, not a write cut short)"), said
    assert indexes(got[(1, 0)]) == [1, 2, 3] and not again.intact((1, 0), 0, got[(1, 0)])
    again.close()
    assert seg.stat().st_size == len(data)  # (not cut)


@pytest.mark.parametrize("seed", range(20))
def test_a_write_cut_short_or_torn_at_a_sector_is_still_cut_off(tmp_path: Path, seed: int) -> None:
    """The bytes of a newest write a crash cut short (a prefix), or whose later sectors never
    reached the disk (zeros from a sector boundary on), are not one flipped bit: cut off."""
    rng = __import__("random").Random(seed)
    log = SegmentLog(tmp_path / "log")
    log.open()
    log.write([append(1, 0, 1, 3)], sync=True)
    last = log.size()
    log.write([append(1, 0, 4, 1, size=3000)], sync=True)
    log.close()
    seg = _newest(tmp_path / "log")
    data = bytearray(seg.read_bytes())
    if seed % 2:
        data = data[:rng.randrange(last + 1, len(data))]
    else:
        start = last + 512 * rng.randrange(1, (len(data) - last) // 512)
        data[start:] = bytes(len(data) - start)
    seg.write_bytes(bytes(data))
    again = SegmentLog(tmp_path / "log")
    assert indexes(again.open()[(1, 0)]) == [1, 2, 3] and again.damage == []
    again.close()
    assert seg.stat().st_size == last


def test_a_last_byte_with_one_bit_that_never_reached_the_disk_is_a_write_cut_short(tmp_path: Path) -> None:
    """A record whose last byte held one set bit (the number of the last record an fdatasync had
    made durable, which a write's first record ends with: 1) and lies alone in a sector that never
    reached the disk: one flipped bit would explain the zeros as well, and zeros to the end read
    as a write cut short, not as damage."""
    log = SegmentLog(tmp_path / "log")
    log.open()
    log.write([append(1, 2, 1, 3)], sync=True)
    last = log.size()
    log.write([append(1, 0, 1, 1)], sync=True)  # (record 1 synced before it: it ends with 0x01)
    log.close()
    seg = _newest(tmp_path / "log")
    data = bytearray(seg.read_bytes())
    assert data[-1] == 1
    data[-1] = 0
    seg.write_bytes(bytes(data))
    again = SegmentLog(tmp_path / "log")
    got = again.open()
    assert indexes(got[(1, 2)]) == [1, 2, 3] and (1, 0) not in got and again.damage == []
    again.close()
    assert seg.stat().st_size == last


def test_a_read_that_fails_past_a_short_read_goes_on_a_sector_at_a_time(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk gives back part of a read, then fails: the rest is read a sector at a time from
    where the short read ended, every byte in its place, the unreadable sector as zeros."""
    path = tmp_path / "seg"
    payload = bytes(range(256)) * 16  # 4096 bytes
    path.write_bytes(payload)
    real = os.pread
    calls: list[tuple[int, int]] = []

    def pread(fd: int, n: int, at: int) -> bytes:
        calls.append((n, at))
        if len(calls) == 1:
            raise OSError(5, "Input/output error")  # (the whole read)
        if at <= 2048 < at + n:
            raise OSError(5, "Input/output error")  # (the bad sector at 2048)
        if at == 0:
            return real(fd, min(n, 300), at)  # (a short read)
        return real(fd, n, at)

    monkeypatch.setattr(os, "pread", pread)
    data, unreadable = read_segment(path)
    assert unreadable == [(2048, 512, "Input/output error")]
    assert data == payload[:2048] + bytes(512) + payload[2560:]

def _flip(seg: Path, at: int) -> None:
    data = bytearray(seg.read_bytes())
    data[at] ^= 0x10
    seg.write_bytes(bytes(data))


def test_a_damaged_record_in_an_older_segment_is_damage_and_nothing_is_used(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path / "log", segment_bytes=1 * KIB)
    log.open()
    for i in range(1, 40, 4):
        log.write([append(1, 0, i, 4)], sync=False)
    log.close()
    oldest = sorted((tmp_path / "log").glob("*.seg"))[0]
    _flip(oldest, 20)
    again = SegmentLog(tmp_path / "log", segment_bytes=1 * KIB)
    got = again.open()[(1, 0)]
    [where] = again.damage
    assert where.startswith(f"{oldest} at byte 0 (a record failing its checksum")
    assert indexes(got) == list(range(5, 41))  # (the first record's entries, 1-4, are what it took)
    assert not again.intact((1, 0), 0, got)  # (a store that applied none of them: the log lacks 1-4)
    assert again.intact((1, 0), 4, got)  # (one that applied them: what the log has above is all it had)
    assert oldest.stat().st_size > 20  # (not cut)
    again.close()


@pytest.mark.parametrize("part", ["body", "length"])
def test_damage_in_the_middle_of_the_newest_segment_is_told_from_a_torn_tail(tmp_path: Path, part: str) -> None:
    """A flipped bit in a record with records after it is damage: the segment is not cut there
    (that would drop the records after it), nothing of the log is used, and set_aside moves the
    segments read out of the way; the log goes on in a new segment."""
    log = SegmentLog(tmp_path / "log")
    log.open()
    starts = []
    for i in range(1, 97):
        starts.append(log.size())
        log.write([append(1, 0, i, 1)], sync=False)
    log.close()
    seg = _newest(tmp_path / "log")
    size = seg.stat().st_size
    _flip(seg, starts[45] + (20 if part == "body" else 1))  # record 46 of 96
    again = SegmentLog(tmp_path / "log")
    got = again.open()[(1, 0)]
    [where] = again.damage
    assert f"{seg} at byte {starts[45]} (" in where and f"a readable record at byte {starts[46]} after it" in where
    assert indexes(got) == [i for i in range(1, 97) if i != 46]  # (read on past it)
    assert not again.intact((1, 0), 0, got) and not again.intact((1, 0), 45, got)  # (46 is gone)
    assert again.intact((1, 0), 46, got)
    assert seg.stat().st_size == size
    again.write([append(1, 0, 1, 1)], sync=True)  # (a new segment: the damaged one is never appended to)
    assert seg.stat().st_size == size
    aside = again.set_aside()
    assert aside is not None and (aside / seg.name).exists() and not seg.exists() and again.damage == []
    again.close()
    third = SegmentLog(tmp_path / "log")
    assert indexes(third.open()[(1, 0)]) == [1] and third.damage == []
    third.close()


def test_zeros_after_the_last_record_are_a_torn_tail(tmp_path: Path) -> None:
    """A file the crash extended without its data (zeros) is cut back, not read as records."""
    log = SegmentLog(tmp_path / "log")
    log.open()
    log.write([append(1, 0, 1, 3)], sync=True)
    log.close()
    seg = _newest(tmp_path / "log")
    seg.write_bytes(seg.read_bytes() + bytes(4096))
    again = SegmentLog(tmp_path / "log")
    assert indexes(again.open()[(1, 0)]) == [1, 2, 3] and again.damage == []
    again.close()


def test_the_oldest_segment_goes_once_everything_in_it_is_compacted(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path / "log", segment_bytes=1 * KIB)
    log.open()
    log.write([append(1, 0, 1, 10), append(0, 0, 1, 1)], sync=False)  # over 1 KiB each: one segment
    log.write([append(1, 0, 11, 10)], sync=False)
    log.write([append(1, 0, 21, 10)], sync=False)
    assert log.segments == 3
    assert log.pins() == {}  # as of the last reclaim: none yet
    assert log.reclaim({}) == 0
    assert log.pins() == {(1, 0): 10, (0, 0): 1}
    assert log.reclaim({(1, 0): 10}) == 0  # (0, 0) still keeps it
    assert log.pins() == {(0, 0): 1}
    assert log.reclaim({(1, 0): 10, (0, 0): 1}) == 1
    assert log.segments == 2
    assert log.pins() == {(1, 0): 20}
    # entries truncated away keep nothing; nor does a deleted queue
    log.write([["T", 1, 0, 15], ["X", 0]], sync=False)  # (in a third segment)
    assert log.reclaim({(1, 0): 14}) == 2
    assert log.segments == 1 and log.pins() == {}
    log.close()
    assert SegmentLog(tmp_path / "log").open() == {}  # all compacted, truncated or deleted


def test_only_the_newest_segment_is_ever_written(tmp_path: Path) -> None:
    """A roll fsyncs the full segment first; the new one is where every later write goes."""
    log = SegmentLog(tmp_path / "log", segment_bytes=1 * KIB)
    log.open()
    sizes = []
    for i in range(1, 20, 2):
        log.write([append(1, 0, i, 2, size=200)], sync=False)
        sizes.append({p.name: p.stat().st_size for p in (tmp_path / "log").glob("*.seg")})
    for before, after in zip(sizes, sizes[1:], strict=False):
        changed = [n for n in after if before.get(n) != after[n]]
        assert changed == [max(after)], (before, after)
    log.close()


# -- the SQLite engine with its log in segments ------------------------------------------------

Q = QueueMeta(id=1, name="q", partitions=2, mapper="consistent_hash", ring_size=64, max_deliveries=3,
              dead_letter_queue=None, max_length=0)


def test_a_log_only_batch_does_not_touch_the_database(tmp_path: Path) -> None:
    e = SqliteEngine(tmp_path / "tandem.db")
    e.open()
    e.apply([PutQueue(Q)], sync=True)
    wal = tmp_path / "tandem.db-wal"
    before = wal.stat().st_size, wal.stat().st_mtime_ns
    e.apply([LogAppend(1, 0, [LogRecord(i, 1, "n1", False, b"x" * 1000) for i in range(1, 50)])], sync=True,
            store_sync=False)
    assert (wal.stat().st_size, wal.stat().st_mtime_ns) == before
    assert e.log.size() > 49_000
    e.close()
    again = SqliteEngine(tmp_path / "tandem.db")
    assert indexes(again.open().logs[(1, 0)].entries) == list(range(1, 50))
    again.close()


def test_compaction_through_the_engine_deletes_segments_and_reopens_from_the_point(tmp_path: Path) -> None:
    e = SqliteEngine(tmp_path / "tandem.db", log_segment_bytes=1024 * 1024)
    e.open()
    e.apply([PutQueue(Q)], sync=True)
    for first in range(1, 400, 10):  # ~4 MiB of entries of 10 KiB
        e.apply([LogAppend(1, 0, [LogRecord(i, 1, "n1", False, b"y" * 10_000) for i in range(first, first + 10)])],
                sync=False)
    assert e.log.segments >= 4
    e.apply([PutApplied(1, 0, 390, 1, "n1"), LogCompact(1, 0, 380, 1, "n1")], sync=False)
    assert e.log.segments == 1  # every older segment only held compacted entries
    e.close()
    assert len(list((tmp_path / "tandem.db-log").glob("*.seg"))) == 1  # (unlinked on a thread of their own)
    again = SqliteEngine(tmp_path / "tandem.db", log_segment_bytes=1024 * 1024)
    st = again.open().logs[(1, 0)]
    assert st.snapshot == (380, 1, "n1") and st.applied == (390, 1, "n1")
    assert indexes(st.entries) == list(range(381, 401))
    again.close()


def test_a_quiet_partition_is_named_as_keeping_the_oldest_segment(tmp_path: Path) -> None:
    e = SqliteEngine(tmp_path / "tandem.db", log_segment_bytes=1024 * 1024)
    e.open()
    e.apply([PutQueue(Q), LogAppend(1, 1, [LogRecord(1, 1, "n1", False, b"quiet")])], sync=True)
    for first in range(1, 300, 10):
        e.apply([LogAppend(1, 0, [LogRecord(i, 1, "n1", False, b"z" * 10_000) for i in range(first, first + 10)])],
                sync=False)
    e.apply([LogCompact(1, 0, 300, 1, "n1")], sync=False)
    assert e.log_pins() == {(1, 1): 1}
    e.apply([LogCompact(1, 1, 1, 1, "n1")], sync=False)
    assert e.log_pins() == {} and e.log.segments == 1
    e.close()


def test_a_deleted_queue_takes_its_log_along(tmp_path: Path) -> None:
    e = SqliteEngine(tmp_path / "tandem.db")
    e.open()
    e.apply([PutQueue(Q), LogAppend(1, 0, [LogRecord(1, 1, "n1", False, b"a")]), PutHardState(1, 0, 1, "n1", 1)],
            sync=True)
    e.apply([DropQueue(1)], sync=True)
    e.close()
    again = SqliteEngine(tmp_path / "tandem.db")
    assert (1, 0) not in again.open().logs
    again.close()


def test_entries_of_a_newer_term_than_the_hard_state_set_the_term(tmp_path: Path) -> None:
    """A batch's log part is written before its database part: a crash between them leaves
    entries of a term the hard state has not recorded.  The node takes the entries' term,
    with no vote in it (it answered nothing for that batch)."""
    e = SqliteEngine(tmp_path / "tandem.db")
    e.open()
    e.apply([PutQueue(Q), PutHardState(1, 0, 3, "n2", 0), LogAppend(1, 0, [LogRecord(1, 3, "n2", False, b"a")])],
            sync=True)
    e.log.write([["A", 1, 0, [[2, 4, "n3", False, b"b"]]]], sync=True)  # as if PutHardState(4) never made it
    e.close()
    again = SqliteEngine(tmp_path / "tandem.db")
    st = again.open().logs[(1, 0)]
    assert (st.term, st.voted_for) == (4, None)
    assert indexes(st.entries) == [1, 2]
    again.close()


def test_a_log_kept_in_the_ha_log_table_is_carried_over(tmp_path: Path) -> None:
    """A store written by the version before the segments: its log is in ha_log."""
    e = SqliteEngine(tmp_path / "tandem.db")
    e.open()
    e.apply([PutQueue(Q), PutHardState(1, 0, 2, "n1", 3), LogCompact(1, 0, 1, 1, "n1")], sync=True)
    e.close()
    db = sqlite3.connect(tmp_path / "tandem.db")
    db.executemany("INSERT INTO ha_log (queue_id, partition, idx, term, origin, weak, data) VALUES (?, ?, ?, ?, ?, ?, ?)",
                   [(1, 0, i, 2, "n1", 0, f"e{i}".encode()) for i in range(1, 6)]
                   + [(0, 0, 1, 1, "n1", 1, b"cat")])
    db.commit()
    db.close()
    for path in (tmp_path / "tandem.db-log").glob("*.seg"):
        os.unlink(path)

    again = SqliteEngine(tmp_path / "tandem.db")
    logs = again.open().logs
    assert indexes(logs[(1, 0)].entries) == [2, 3, 4, 5]  # after the compaction point
    assert logs[(1, 0)].entries[0].data == b"e2"
    assert logs[(0, 0)].entries == [LogRecord(1, 1, "n1", True, b"cat")]
    again.close()
    db = sqlite3.connect(tmp_path / "tandem.db")
    assert db.execute("SELECT count(*) FROM ha_log").fetchone()[0] == 0
    db.close()
    third = SqliteEngine(tmp_path / "tandem.db")
    assert indexes(third.open().logs[(1, 0)].entries) == [2, 3, 4, 5]
    third.close()


def test_a_truncation_then_a_rewrite_survive_reopen_through_the_engine(tmp_path: Path) -> None:
    e = SqliteEngine(tmp_path / "tandem.db")
    e.open()
    e.apply([PutQueue(Q), LogAppend(1, 0, [LogRecord(i, 1, "n1", False, b"old") for i in range(1, 6)])], sync=True)
    e.apply([LogTruncate(1, 0, 3), LogAppend(1, 0, [LogRecord(3, 2, "n2", False, b"new")])], sync=False)
    e.close()
    again = SqliteEngine(tmp_path / "tandem.db")
    entries = again.open().logs[(1, 0)].entries
    assert [(r.index, r.term, r.data) for r in entries] == [(1, 1, b"old"), (2, 1, b"old"), (3, 2, b"new")]
    again.close()


# -- power loss: what was not fsynced is gone ---------------------------------------------------


class PowerLoss:
    """A model of the OS losing its cache: each fsync / fdatasync of a segment records the
    file's size then; :meth:`image` copies a data directory with every segment cut back to
    its last synced size.  The database files are copied whole (as if every store commit had
    reached the disk: the worst case for a store ahead of its log)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.synced: dict[str, int] = {}
        real_fdatasync, real_fsync = os.fdatasync, os.fsync

        def record(fd: int) -> None:
            path = os.readlink(f"/proc/self/fd/{fd}")
            if path.endswith(".seg"):
                self.synced[path] = os.fstat(fd).st_size

        def fdatasync(fd: int) -> None:
            record(fd)
            real_fdatasync(fd)

        def fsync(fd: int) -> None:
            record(fd)
            real_fsync(fd)

        monkeypatch.setattr(os, "fdatasync", fdatasync)
        monkeypatch.setattr(os, "fsync", fsync)

    def image(self, src: Path, dst: Path) -> None:
        import shutil

        shutil.copytree(src, dst)
        for seg in dst.rglob("*.seg"):
            with open(seg, "r+b") as f:
                f.truncate(self.synced.get(str(src / seg.relative_to(dst)), 0))


def test_a_store_on_disk_ahead_of_its_log_stands_as_a_snapshot(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica (WRITE_NO_SYNC) writes entries without an fsync; the store's applies of them
    can still reach the disk (a checkpoint, the kernel's writeback) while the log's do not."""
    from storage.base import Append, StoredMessage

    power = PowerLoss(monkeypatch)
    e = SqliteEngine(tmp_path / "d" / "tandem.db")
    e.open()
    e.apply([PutQueue(Q)], sync=True)
    e.apply([LogAppend(1, 0, [LogRecord(i, 2, "n3", False, b"entry") for i in range(1, 3)])], sync=True)
    e.apply([LogAppend(1, 0, [LogRecord(i, 2, "n3", False, b"entry") for i in range(3, 5)])], sync=False)
    e.apply([Append(1, 0, [StoredMessage(o, None, b"\x80", b"m%d" % o, None, None, 0.0) for o in range(4)], 4),
             PutApplied(1, 0, 4, 2, "n3")], sync=False)
    power.image(tmp_path / "d", tmp_path / "after")
    e.close()

    again = SqliteEngine(tmp_path / "after" / "tandem.db")
    st = again.open().logs[(1, 0)]
    assert st.entries == []
    assert st.snapshot == st.applied == (4, 2, "n3")  # the active's append after 4 matches it, or a snapshot comes
    assert [m.body for m in again.read(1, 0, 0, 10)] == [b"m0", b"m1", b"m2", b"m3"]
    again.close()


def test_a_truncation_that_frees_the_oldest_segment_is_on_disk_first(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Entries 3..5 in the oldest segment, 6..8 after; a new active truncates from 3
    (unsynced, as on a replica): the oldest segment may go only with the truncation on disk,
    or a crash would leave 6..8 after a hole."""
    power = PowerLoss(monkeypatch)
    log = SegmentLog(tmp_path / "d" / "log", segment_bytes=1 * KIB)
    log.open()
    log.write([append(1, 0, 3, 3, size=400)], sync=False)
    log.write([append(1, 0, 6, 3, size=400)], sync=False)  # (the roll fsyncs the first)
    log.write([["T", 1, 0, 3], append(1, 0, 3, 1, term=2)], sync=False)
    assert log.reclaim({(1, 0): 2}) == 2  # nothing left above the compaction point in either
    log.wait_deletions()
    power.image(tmp_path / "d", tmp_path / "after")
    log.close()
    got = SegmentLog(tmp_path / "after" / "log", segment_bytes=1 * KIB).open()
    assert [(r.index, r.term) for r in got.get((1, 0), [])] == [(3, 2)]


def test_a_hole_or_an_older_term_ends_the_usable_log(tmp_path: Path) -> None:
    e = SqliteEngine(tmp_path / "tandem.db")
    e.open()
    e.apply([PutQueue(Q), LogCompact(1, 0, 2, 3, "n1"), PutApplied(1, 0, 2, 3, "n1")], sync=True)
    e.log.write([append(1, 0, 3, 2, term=3), append(1, 0, 6, 2, term=3)], sync=True)  # a hole at 5
    e.log.write([append(1, 1, 1, 3, term=1)], sync=True)
    e.apply([LogCompact(1, 1, 1, 2, "n1"), PutApplied(1, 1, 1, 2, "n1")], sync=True)  # entries of term 1 after it
    e.close()
    again = SqliteEngine(tmp_path / "tandem.db")
    logs = again.open().logs
    assert indexes(logs[(1, 0)].entries) == [3, 4]
    assert logs[(1, 1)].entries == []  # term 1 cannot follow a snapshot of term 2
    again.close()


def test_a_damaged_log_marks_the_partitions_under_repair_in_the_store_at_open(tmp_path: Path) -> None:
    """The mark is on disk before the damaged segments can go aside: a restart after that
    still knows the partition is under repair (broker.modes.replicated.reconcile); the other
    partition, whose records the damage spared (the next write's cover says so), is not."""
    e = SqliteEngine(tmp_path / "tandem.db")
    e.open()
    e.apply([PutQueue(Q), PutHardState(1, 0, 2, "n1", 0), PutHardState(1, 1, 2, "n1", 0)], sync=True)
    for i in range(1, 41, 4):
        e.log.write([append(1, 0, i, 4, term=2), append(1, 1, i, 4, term=2)], sync=False)
    e.close()
    seg = _newest(tmp_path / "tandem.db-log")
    read = [(pos, msgpack.unpackb(body)) for pos, body, _f in records(seg.read_bytes(), True)]
    pos, rec = read[len(read) // 2]
    _flip(seg, pos + 30)
    hit = (rec[1], rec[2])
    again = SqliteEngine(tmp_path / "tandem.db")
    rec2 = again.open()
    assert rec2.log_damage and {k for k, st in rec2.logs.items() if st.damaged} == {hit}
    assert not any(st.marked for st in rec2.logs.values())
    again.close()  # (stopped before a write set the segments aside)
    third = SqliteEngine(tmp_path / "tandem.db")
    rec3 = third.open()
    assert {key for key, st in rec3.logs.items() if st.marked} == {hit}
    assert rec3.meta[f"repairing.{hit[0]}.{hit[1]}"] == "1"
    third.close()


def test_after_damage_a_partition_whose_entries_it_cannot_have_touched_keeps_them(tmp_path: Path,
                                                                                   caplog: pytest.LogCaptureFixture
                                                                                   ) -> None:
    """A flipped bit in a record of partition 1's: partition 0, whose store has applied what it
    wrote before that record and whose later entries all follow it, keeps those entries, is not
    under repair, and has them in the new segment once the damaged ones are set aside; partition
    1 (a hole at 1-5) catches up from the group."""
    e = SqliteEngine(tmp_path / "tandem.db")
    e.open()
    e.apply([PutQueue(Q), PutHardState(1, 0, 2, "n1", 0), PutHardState(1, 1, 2, "n1", 0)], sync=True)
    e.log.write([append(1, 0, 1, 10, term=2)], sync=False)
    e.log.write([append(1, 1, 1, 5, term=2)], sync=False)
    e.log.write([append(1, 0, 11, 5, term=2), append(1, 1, 6, 2, term=2)], sync=True)
    e.apply([LogCompact(1, 0, 4, 2, "n1"), PutApplied(1, 0, 10, 2, "n1")], sync=True)
    e.close()
    seg = _newest(tmp_path / "tandem.db-log")
    [_, (second, _body, _fault), *_] = records(seg.read_bytes(), True)
    _flip(seg, second + 30)
    again = SqliteEngine(tmp_path / "tandem.db")
    rec = again.open()
    assert rec.log_damage
    p0, p1 = rec.logs[(1, 0)], rec.logs[(1, 1)]
    assert not p0.damaged and indexes(p0.entries) == [11, 12, 13, 14, 15] and p0.snapshot == (10, 2, "n1")
    assert p1.damaged and p1.entries == []
    again.set_aside_log()
    again.apply([LogAppend(1, 0, [LogRecord(16, 2, "n1", False, b"x")])], sync=True)
    again.close()
    assert [p.name for p in (tmp_path / "tandem.db-log").glob("damaged-*/*.seg")] == [seg.name]
    caplog.clear()
    third = SqliteEngine(tmp_path / "tandem.db")
    rec = third.open()
    assert not rec.log_damage and indexes(rec.logs[(1, 0)].entries) == [11, 12, 13, 14, 15, 16]
    assert rec.logs[(1, 0)].snapshot == (10, 2, "n1") and not rec.logs[(1, 0)].marked
    assert rec.logs[(1, 1)].marked
    assert not [r for r in caplog.records if "ends before" in r.getMessage()]
    third.close()


def test_quiet_partitions_are_marked_where_their_log_ends_and_the_marks_remove_nothing(tmp_path: Path) -> None:
    """After enough records, sweep writes a truncation record from one past each quiet
    partition's last index (its compaction point where that is past its entries): replayed,
    the log is what it was; and damage after a quiet partition's last append, before its
    mark, no longer leaves it unsure of where its log ended."""
    log = SegmentLog(tmp_path / "log", segment_bytes=4 * KIB)
    log.open()
    log.write([append(1, 0, 1, 10, size=10)], sync=False)  # partition 0: quiet from here on
    log.write([append(2, 0, 1, 3, size=10)], sync=False)
    for i in range(1, 601):
        log.write([append(1, 1, i, 1, size=10)], sync=False)
        log.sweep({(2, 0): 7})  # (a compaction point past its entries: the mark goes from there)
    log.close()
    read = [(seg, pos, msgpack.unpackb(body)) for seg in sorted((tmp_path / "log").glob("*.seg"))
            for pos, body, _f in records(seg.read_bytes(), True)]
    marks = [rec[1:4] for _seg, _pos, rec in read if rec[0] == "T"]
    assert {tuple(m) for m in marks} == {(1, 0, 11), (2, 0, 8)}
    again = SegmentLog(tmp_path / "log", segment_bytes=4 * KIB)
    got = again.open()
    assert indexes(got[(1, 0)]) == list(range(1, 11)) and indexes(got[(2, 0)]) == [1, 2, 3]
    assert indexes(got[(1, 1)]) == list(range(1, 601))
    again.close()
    # one bit flipped in a record of partition 1 written after partition 0's last append, before its mark
    first_mark = next(n for n, (_s, _p, rec) in enumerate(read) if rec[0] == "T" and rec[1] == 1)
    seg, pos, _rec = read[first_mark // 2]
    _flip(seg, pos + 20)
    third = SegmentLog(tmp_path / "log", segment_bytes=4 * KIB)
    got = third.open()
    assert third.damage and third.intact((1, 0), 10, got[(1, 0)])  # (the mark says its log ended at 10)
    assert not third.intact((1, 1), 0, got[(1, 1)])
    third.close()


def test_covers_name_the_partitions_of_the_records_damage_took(tmp_path: Path) -> None:
    """A record of partition 1 damaged: the next write's cover names partition 1 for it, so
    partition 0 (quiet, unmarked, none of its entries applied) keeps its log; damage longer
    than the covers reach (three writes zeroed) leaves only the partitions' own records to go
    by."""
    log = SegmentLog(tmp_path / "log")
    log.open()
    log.write([append(1, 0, 1, 10, size=10)], sync=False)
    starts = []
    for i in range(1, 21):
        starts.append(log.size())
        log.write([append(1, 1, i, 1, size=10)], sync=False)
    log.close()
    seg = _newest(tmp_path / "log")
    whole = seg.read_bytes()
    _flip(seg, starts[10] + 20)  # (partition 1's entry 11)
    again = SegmentLog(tmp_path / "log")
    got = again.open()
    assert again.damage and again.assessed.touched == {(1, 1)}
    assert again.intact((1, 0), 0, got[(1, 0)]) and not again.intact((1, 1), 0, got[(1, 1)])
    again.close()
    seg.write_bytes(whole[:starts[10]] + bytes(starts[13] - starts[10]) + whole[starts[13]:])  # (entries 11-13)
    third = SegmentLog(tmp_path / "log")
    got = third.open()
    assert third.damage and third.assessed.touched is None
    assert not third.intact((1, 0), 0, got[(1, 0)])  # (its last record lies before the damage)
    assert third.intact((1, 0), 10, got[(1, 0)]) is False
    third.close()


def _records_of(seg: Path) -> list[tuple[int, int]]:
    """(start, end) of each whole record of a segment."""
    return [(pos, pos + 8 + len(body)) for pos, body, fault in records(seg.read_bytes(), True) if fault is None]


def test_damage_with_a_cut_end_leaves_no_partition_sure(tmp_path: Path) -> None:
    """The newest record may be damage at rest rather than a write a crash cut short: with
    damage elsewhere, what was cut off is taken as lost too, and no partition keeps its log
    (its entry 2 was acknowledged)."""
    log = SegmentLog(tmp_path / "log")
    log.open()
    for rec in (append(2, 0, 1, 1), append(1, 0, 1, 1), append(1, 0, 2, 1)):
        log.write([rec], sync=True)
    log.close()
    seg = _newest(tmp_path / "log")
    (first, _), _, (last, _) = _records_of(seg)
    _flip(seg, first + 12)
    _flip(seg, last + 12)
    again = SegmentLog(tmp_path / "log")
    got = again.open()
    assert again.damage and indexes(got[(1, 0)]) == [1]
    assert not again.intact((1, 0), 0, got[(1, 0)]) and not again.intact((1, 0), 1, got[(1, 0)])
    again.close()


def test_a_record_missing_between_two_read_is_damage(tmp_path: Path) -> None:
    """A write misdirected exactly over the record before it, its own place (the end) left
    zeros: every record read passes its checksum and the zeros are cut off, but the numbers
    say a record is gone."""
    log = SegmentLog(tmp_path / "log")
    log.open()
    for rec in (append(1, 0, 1, 1), append(1, 0, 2, 1), ["T", 2, 0, 1]):
        log.write([rec], sync=True)
    log.close()
    seg = _newest(tmp_path / "log")
    _, (second, _), (third, end) = _records_of(seg)
    data = bytearray(seg.read_bytes())
    moved = bytes(data[third:end])
    data[third:end] = bytes(end - third)
    data[second:second + len(moved)] = moved
    seg.write_bytes(bytes(data))
    again = SegmentLog(tmp_path / "log")
    got = again.open()
    assert [d.split(": ", 1)[1] for d in again.damage] == [
        "no record numbered 2 between records 1 and 3 (a write lost or misdirected)"]
    assert not again.intact((1, 0), 0, got[(1, 0)])
    again.close()


def test_a_record_framed_inside_a_payload_is_not_taken_for_one_after_damage(tmp_path: Path) -> None:
    """After damage the scan looks for the next record; one framed inside an entry's data (a
    client's bytes) is not taken: the record after a real one frames on too."""
    body = msgpack.packb(["A", 1, 0, [[3, 1, "n1", False, b"EVIL"]], 0, 4], use_bin_type=True)
    fake = struct.pack("<II", len(body), zlib.crc32(body)) + body
    log = SegmentLog(tmp_path / "log")
    log.open()
    log.write([append(1, 0, 1, 1)], sync=True)
    log.write([append(2, 0, 1, 1)], sync=True)
    log.write([["A", 1, 0, [[2, 1, "n1", False, b"x" * 10 + fake + b"y" * 10]]]], sync=True)
    log.write([append(2, 0, 2, 1)], sync=True)
    log.close()
    seg = _newest(tmp_path / "log")
    _, (second, _), *_ = _records_of(seg)
    _flip(seg, second + 12)
    again = SegmentLog(tmp_path / "log")
    got = again.open()
    assert [(r.index, r.data[:1]) for r in got[(1, 0)]] == [(1, bytes([1])), (2, b"x")]
    again.close()


def test_records_a_misdirected_write_covered_at_the_start_of_the_oldest_segment_count_as_lost(
        tmp_path: Path) -> None:
    """Record 3 lands at byte 0, over record 1; its own place and record 4's are zeros.  Records 1
    and 2 are numbered below every record read: the number the segment's first record took
    (kept beside it) says they are gone too."""
    log = SegmentLog(tmp_path / "log")
    log.open()
    for rec in (append(2, 0, 1, 1, size=8), append(1, 0, 1, 1, size=8), append(1, 0, 2, 1, size=8),
                append(3, 0, 1, 1, size=8), append(1, 0, 3, 1, size=8), append(2, 0, 2, 1, size=8)):
        log.write([rec], sync=True)
    log.close()
    seg = _newest(tmp_path / "log")
    spans = _records_of(seg)
    data = bytearray(seg.read_bytes())
    third = bytes(data[spans[2][0]:spans[2][1]])
    data[spans[2][0]:spans[3][1]] = bytes(spans[3][1] - spans[2][0])
    data[0:len(third)] = third
    seg.write_bytes(bytes(data))
    again = SegmentLog(tmp_path / "log")
    got = again.open()
    assert again.damage and not again.intact((2, 0), 0, got[(2, 0)]) and not again.intact((1, 0), 0, got[(1, 0)])
    again.close()


def test_a_checksummed_frame_that_is_no_record_is_not_taken_for_one_after_damage(tmp_path: Path) -> None:
    """Damage that takes a record's header sends the scan looking for the next record; frames
    inside a message's bytes that pass their checksum but are no record are passed over (and
    would be named damage, never replayed, were one read where a record was due)."""
    body = msgpack.packb(1)
    junk = struct.pack("<II", len(body), zlib.crc32(body)) + body
    log = SegmentLog(tmp_path / "log")
    log.open()
    log.write([append(1, 0, 1, 1)], sync=True)
    log.write([["A", 2, 0, [[1, 1, "n1", False, junk * 3]]]], sync=True)
    log.write([append(1, 0, 2, 1)], sync=True)
    log.close()
    seg = _newest(tmp_path / "log")
    _, (second, _), (third, _) = _records_of(seg)
    data = bytearray(seg.read_bytes())
    data[second:second + 8] = bytes(8)  # (its header gone)
    seg.write_bytes(bytes(data))
    again = SegmentLog(tmp_path / "log")
    got = again.open()
    [where] = again.damage
    assert f"at byte {second} (an empty record (zeros), a readable record at byte {third} after it)" in where
    assert indexes(got[(1, 0)]) == [1, 2] and (2, 0) not in got
    again.close()


def test_a_bad_end_of_a_log_that_was_closed_is_damage_not_a_cut_write(tmp_path: Path) -> None:
    """No write was under way when the store and its log were closed: a record failing its
    checksum at the end is damage at rest (an acknowledged entry), not cut off, even where one
    flipped bit does not explain it (two here)."""
    e = SqliteEngine(tmp_path / "tandem.db")
    e.open()
    e.apply([PutQueue(Q), PutHardState(1, 0, 2, "n1", 0)], sync=True)
    e.log.write([append(1, 0, 1, 3, term=2)], sync=True)
    e.log.write([append(1, 0, 4, 1, term=2)], sync=True)
    e.close()
    seg = _newest(tmp_path / "tandem.db-log")
    [_, (last, _)] = _records_of(seg)
    _flip(seg, last + 12)
    _flip(seg, last + 20)
    again = SqliteEngine(tmp_path / "tandem.db")
    rec = again.open()
    assert rec.log_damage == [f"{seg} at byte {last} (a record failing its checksum, at the end of a log that was "
                              f"closed)"]
    assert rec.logs[(1, 0)].damaged and seg.stat().st_size > last + 8  # (not cut)
    again.close()


def test_a_deletion_record_removes_only_the_entries_before_it(tmp_path: Path) -> None:
    """A queue id can come back (a node that caught up through a catalogue snapshot does not
    know the ids used meanwhile): the entries of the new queue are not the deleted one's."""
    log = SegmentLog(tmp_path / "log", segment_bytes=1 * KIB)
    log.open()
    log.write([append(1, 0, 1, 12)], sync=False)
    log.write([["X", 1], append(1, 0, 1, 12, term=5)], sync=False)  # (a second segment)
    log.write([append(2, 0, 1, 1)], sync=False)  # (a third)
    assert log.segments == 3
    assert log.reclaim({}) == 1  # the old queue's segment
    assert log.pins() == {(1, 0): 12}  # the new queue's entries keep theirs
    log.close()
    got = SegmentLog(tmp_path / "log", segment_bytes=1 * KIB).open()
    assert [(r.index, r.term) for r in got[(1, 0)]] == [(i, 5) for i in range(1, 13)]


def test_a_store_without_queue_owners_gains_the_column_and_reads_none(tmp_path: Path) -> None:
    """A store written before queues kept who declared them: opened, it gains the column (the
    schema version stays), its queues read with no owner, and an owner written then comes back."""
    e = SqliteEngine(tmp_path / "tandem.db")
    e.open()
    e.apply([PutQueue(dataclasses.replace(Q, owner="alice"))], sync=True)
    e.close()
    db = sqlite3.connect(tmp_path / "tandem.db")
    db.execute("ALTER TABLE queues DROP COLUMN owner")
    db.commit()
    db.close()
    again = SqliteEngine(tmp_path / "tandem.db")
    rec = again.open()
    assert rec.queues == [dataclasses.replace(Q, owner=None)] and rec.meta["schema_version"] == "3"
    again.apply([PutQueue(dataclasses.replace(Q, owner="bob"))], sync=True)
    again.close()
    third = SqliteEngine(tmp_path / "tandem.db")
    assert [q.owner for q in third.open().queues] == ["bob"]
    third.close()


def test_a_store_without_the_snapshot_mark_columns_gains_them_and_reads_strong(tmp_path: Path) -> None:
    """A store written before ha_state kept the snapshot's weak mark: opened, it gains the
    columns (the schema version stays), its snapshots read as strong, and a weak mark written
    then comes back."""
    e = SqliteEngine(tmp_path / "tandem.db")
    e.open()
    e.apply([PutQueue(Q), LogCompact(1, 0, 4, 2, "n1"), PutApplied(1, 0, 4, 2, "n1")], sync=True)
    e.close()
    db = sqlite3.connect(tmp_path / "tandem.db")
    for column in ("snap_weak", "snap_recency_term", "snap_recency_index"):
        db.execute(f"ALTER TABLE ha_state DROP COLUMN {column}")
    db.commit()
    db.close()
    again = SqliteEngine(tmp_path / "tandem.db")
    rec = again.open()
    st = rec.logs[(1, 0)]
    assert (st.snapshot, st.snap_weak) == ((4, 2, "n1"), False) and rec.meta["schema_version"] == "3"
    again.apply([LogCompact(1, 0, 6, 3, "n3", True, (2, 4)), PutApplied(1, 0, 6, 3, "n3")], sync=True)
    again.close()
    third = SqliteEngine(tmp_path / "tandem.db")
    st = third.open().logs[(1, 0)]
    assert (st.snapshot, st.snap_weak, st.snap_recency) == ((6, 3, "n3"), True, (2, 4))
    third.close()


def test_an_fdatasync_that_fails_is_never_tried_again_on_that_file(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """After a failed fdatasync the kernel may have dropped the pages and marked them clean: a
    second fdatasync would succeed without them.  The log closes instead; every later write and
    sync fails, saying to restart."""
    log = SegmentLog(tmp_path / "log")
    log.open()
    log.write([append(1, 0, 1, 3)], sync=True)
    calls: list[int] = []

    def failing(fd: int) -> None:
        calls.append(fd)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", failing)
    with pytest.raises(StorageError, match="fdatasync failed: .*never retried on the same file"):
        log.write([append(1, 0, 4, 1)], sync=True)
    monkeypatch.undo()
    for attempt in (lambda: log.sync(), lambda: log.write([append(1, 0, 5, 1)], sync=True)):
        with pytest.raises(StorageError, match="an fdatasync failed before .*restart the node"):
            attempt()
    assert len(calls) == 1
    log.close()
    assert indexes(SegmentLog(tmp_path / "log").open()[(1, 0)])[:3] == [1, 2, 3]



def test_an_fdatasync_that_fails_at_close_says_so_and_closes_the_file(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A node stopping on a failing disk closes its log last: the fdatasync of close failing is
    the StorageError a stop logs and goes on from, with the file closed, never another error."""
    log = SegmentLog(tmp_path / "log")
    log.open()
    log.write([append(1, 0, 1, 3)], sync=False)
    closed: list[int] = []
    real_close = os.close

    def failing(fd: int) -> None:
        raise OSError(5, "Input/output error")

    def close(fd: int) -> None:
        closed.append(fd)
        real_close(fd)

    monkeypatch.setattr(os, "fdatasync", failing)
    monkeypatch.setattr(os, "close", close)
    with pytest.raises(StorageError, match="fdatasync failed: .*never retried on the same file"):
        log.close()
    assert len(closed) == 1
    log.close()  # (closed: nothing more to do)
    assert len(closed) == 1

@pytest.mark.asyncio
@pytest.mark.skipif(fuse_missing() is not None, reason=f"powerfs cannot run here: {fuse_missing()}")
async def test_a_sector_the_disk_cannot_read_is_damage_and_the_records_after_it_are_read(tmp_path: Path) -> None:
    """A latent sector error (powerfs's bad-sector) in the middle of the newest segment: opening
    reads it as zeros and on past it, names the unreadable bytes and the records they took, never
    cuts the segment there as a torn tail (the records past it may be acknowledged entries), and
    keeps a partition whose entries the store has applied past the damage; scan says the same."""
    async with PowerFS(tmp_path / "backing", tmp_path / "disk") as fs:
        log = SegmentLog(tmp_path / "disk" / "log")
        log.open()
        for i in range(1, 201):
            log.write([append(1, 0, i, 1)], sync=False)
        log.close()
        seg = _newest(tmp_path / "disk" / "log")
        size = seg.stat().st_size
        bad = fs.bad_sector(".seg", 5)
        assert 0 < bad["offset"] < size - 2 * 512, bad  # (this seed's sector has records after it)
        again = SegmentLog(tmp_path / "disk" / "log")
        got = again.open()[(1, 0)]
        unreadable, *records_taken = again.damage
        # (the kernel reads through its page cache a page at a time: the bad sector's whole page fails)
        at, length = (int(x) for x in re.fullmatch(rf"{re.escape(str(seg))} at byte (\d+) \(unreadable: (\d+) B "
                                                   r"\(Input/output error\), read as zeros\)", unreadable).groups())
        assert at <= bad["offset"] < at + length and length % 512 == 0, unreadable
        assert records_taken and all(", a readable record at byte " in d for d in records_taken), again.damage
        indexes = [e.index for e in got]
        assert indexes[-1] == 200 and len(indexes) < 200, indexes  # (read on past it; the records it took gone)
        hole = [i for i in range(1, 201) if i not in indexes]
        assert hole == list(range(hole[0], hole[-1] + 1)), hole
        assert not again.intact((1, 0), hole[0] - 1, got)  # (its store has not applied what the damage took)
        assert again.intact((1, 0), hole[-1], got)  # (it has: nothing it needs is gone)
        again.close()
        assert seg.stat().st_size == size  # (not cut)
        good, damage, torn = scan(tmp_path / "disk" / "log")
        assert damage == again.damage and torn == [] and good == len(indexes)
