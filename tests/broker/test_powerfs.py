"""powerfs: a rollback leaves exactly what was fsynced; strict mode forgets unsynced directory
entries; the error mode fails writes and fsyncs with EIO; SQLite in WAL mode works on it; no
mount outlives the wrapper."""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
from pathlib import Path

import pytest

from broker.tools.powerfs import PowerFS, PowerFSError, mounted
from broker.tools.powerfs_mount import fuse_missing

pytestmark = [pytest.mark.asyncio,
              pytest.mark.skipif(fuse_missing() is not None, reason=f"powerfs cannot run here: {fuse_missing()}")]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


async def test_rollback_restores_the_synced_content(tmp_path: Path) -> None:
    async with PowerFS(tmp_path / "b", tmp_path / "m") as fs:
        f = tmp_path / "m" / "data"
        fd = os.open(f, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.write(fd, b"A" * 10000)
            os.fsync(fd)
            os.pwrite(fd, b"B" * 3000, 2000)  # overwrites synced bytes
            os.pwrite(fd, b"C" * 500, 9800)  # over the synced end, and past it
            os.fdatasync(fd)
            os.pwrite(fd, b"D" * 100, 0)
            os.pwrite(fd, b"E" * 5000, 12000)  # a hole, then bytes past the end
            os.ftruncate(fd, 5000)
        finally:
            os.close(fd)
        synced = b"A" * 2000 + b"B" * 3000 + b"A" * 4800 + b"C" * 500
        out = fs.rollback()
        assert f.read_bytes() == synced
        assert out["files"] == 1 and out["bytes"] > 0
        st = fs.stats()
        assert st["syncs"] == 2 and st["bytes_rolled_back"] == out["bytes"]
        assert (tmp_path / "b" / "data").read_bytes() == synced  # the backing file itself


async def test_an_unsynced_new_file_keeps_its_entry_unless_strict(tmp_path: Path) -> None:
    async with PowerFS(tmp_path / "b", tmp_path / "m") as fs:
        (tmp_path / "m" / "new").write_bytes(b"x" * 100)
        fs.rollback()
        assert (tmp_path / "m" / "new").read_bytes() == b""  # its name stays, its bytes go


async def test_strict_mode_forgets_directory_entries_since_the_directory_fsync(tmp_path: Path) -> None:
    async with PowerFS(tmp_path / "b", tmp_path / "m", strict=True) as fs:
        m = tmp_path / "m"
        (m / "kept").write_bytes(b"k")
        (m / "gone").write_bytes(b"g")
        (m / "sub").mkdir()
        _fsync_dir(m)
        fd = os.open(m / "kept", os.O_RDWR)
        os.fsync(fd)
        os.close(fd)
        (m / "unsynced").write_bytes(b"u" * 10)  # never in a synced directory
        (m / "gone").unlink()  # the unlink not synced: it comes back
        os.rename(m / "kept", m / "sub" / "moved")  # neither directory synced: undone
        out = fs.rollback()
        assert sorted(os.listdir(m)) == ["gone", "kept", "sub"]
        assert (m / "kept").read_bytes() == b"k"
        assert os.listdir(m / "sub") == []
        assert out["entries"] >= 3
        (m / "synced").write_bytes(b"s")
        _fsync_dir(m)
        fs.rollback()
        assert (m / "synced").exists() and (m / "synced").read_bytes() == b""  # its bytes never synced


async def test_error_mode_fails_writes_and_fsyncs_with_eio(tmp_path: Path) -> None:
    async with PowerFS(tmp_path / "b", tmp_path / "m") as fs:
        fd = os.open(tmp_path / "m" / "f", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.write(fd, b"before")
            fs.fail_io("write")
            with pytest.raises(OSError) as e:
                os.write(fd, b"during")
            assert e.value.errno == errno.EIO
            os.fsync(fd)  # only writes fail
            fs.fail_io("fsync")
            with pytest.raises(OSError) as e:
                os.fsync(fd)
            assert e.value.errno == errno.EIO
            fs.fail_io("off")
            os.write(fd, b"after")
            os.fsync(fd)
        finally:
            os.close(fd)
        assert (tmp_path / "m" / "f").read_bytes() == b"beforeafter"
        assert fs.stats()["failed_ios"] == 2
        with pytest.raises(PowerFSError, match="unknown command"):
            fs.command("fail-io sometimes")


def _read_at(path: Path, offset: int, size: int) -> bytes:
    fd = os.open(path, os.O_RDONLY)  # (a fresh open: FUSE drops the file's cached pages)
    try:
        return os.pread(fd, size, offset)
    finally:
        os.close(fd)


async def test_a_bad_sector_fails_the_reads_that_cover_it_until_written_whole(tmp_path: Path) -> None:
    async with PowerFS(tmp_path / "b", tmp_path / "m") as fs:
        f = tmp_path / "m" / "data.seg"
        content = bytes(range(256)) * 1024  # 512 sectors
        f.write_bytes(content)
        (tmp_path / "m" / "other").write_bytes(b"x" * 4096)
        bad = fs.bad_sector(".seg", 7)
        at = bad["offset"]
        assert bad["path"] == "/data.seg" and at % 512 == 0 and 0 <= at < len(content)
        assert bad == fs.bad_sector(".seg", 7) and fs.stats()["bad_sectors"] == [{"path": "/data.seg", "offset": at}]
        for offset, size in ((at, 1), (at + 511, 1), (max(0, at - 100), 200)):
            with pytest.raises(OSError) as e:
                _read_at(f, offset, size)
            assert e.value.errno == errno.EIO
        if at >= 4096:  # (a read from before it ends short, before its page: the next read fails)
            assert len(_read_at(f, 0, len(content))) <= at
        with pytest.raises(OSError):
            f.read_bytes()
        far = 0 if at >= len(content) // 2 else len(content) - 4096  # (a page half the file away reads)
        assert _read_at(f, far, 4096) == content[far:far + 4096]
        assert (tmp_path / "m" / "other").read_bytes() == b"x" * 4096
        fd = os.open(f, os.O_WRONLY)
        try:
            os.pwrite(fd, b"y" * 100, at)  # (part of the sector: still unreadable)
            with pytest.raises(OSError):
                _read_at(f, at, 1)
            os.pwrite(fd, b"z" * 512, at)  # (all of it: remapped)
        finally:
            os.close(fd)
        assert _read_at(f, at, 512) == b"z" * 512
        st = fs.stats()
        assert st["bad_sectors"] == [] and st["failed_reads"] >= 5
        with pytest.raises(PowerFSError, match="no file ending with"):
            fs.bad_sector(".nothing", 1)


async def test_the_read_error_mode_fails_every_read(tmp_path: Path) -> None:
    async with PowerFS(tmp_path / "b", tmp_path / "m") as fs:
        (tmp_path / "m" / "f").write_bytes(b"data")
        fs.fail_io("read")
        with pytest.raises(OSError) as e:
            _read_at(tmp_path / "m" / "f", 0, 4)
        assert e.value.errno == errno.EIO
        (tmp_path / "m" / "g").write_bytes(b"written")  # (writes go on)
        fs.fail_io("off")
        assert _read_at(tmp_path / "m" / "f", 0, 4) == b"data"


async def test_the_lying_mode_answers_fsyncs_and_a_rollback_goes_back_past_them(tmp_path: Path) -> None:
    async with PowerFS(tmp_path / "b", tmp_path / "m") as fs:
        fd = os.open(tmp_path / "m" / "f", os.O_RDWR | os.O_CREAT, 0o644)
        sync_fd = -1
        try:
            os.write(fd, b"kept")
            os.fsync(fd)
            fs.lie_fsync(True)
            os.write(fd, b"-lied")
            os.fsync(fd)  # success, and nothing synced
            os.fdatasync(fd)
            sync_fd = os.open(tmp_path / "m" / "g", os.O_RDWR | os.O_CREAT | os.O_DSYNC, 0o644)
            os.write(sync_fd, b"not durable either")
            assert fs.stats()["lie"] is True
            fs.lie_fsync(False)
            fs.rollback()
        finally:
            os.close(fd)
            if sync_fd >= 0:
                os.close(sync_fd)
        assert (tmp_path / "m" / "f").read_bytes() == b"kept"
        assert (tmp_path / "m" / "g").read_bytes() == b""
        st = fs.stats()
        assert (st["syncs"], st["lie"]) == (1, False) and st["lied_syncs"] >= 3, st  # (and any the kernel asked)
        with pytest.raises(PowerFSError, match="unknown command"):
            fs.command("lie-fsync maybe")


async def test_a_lost_write_is_acknowledged_leaves_zeros_and_later_appends_land_after_it(tmp_path: Path) -> None:
    async with PowerFS(tmp_path / "b", tmp_path / "m") as fs:
        seg, other = tmp_path / "m" / "1.seg", tmp_path / "m" / "store"
        fd = os.open(seg, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, b"first")
            fs.lose_write(".seg")
            other.write_bytes(b"other files keep theirs")
            assert os.write(fd, b"LOST") == 4  # (acknowledged)
            os.write(fd, b"after")
            os.fsync(fd)
        finally:
            os.close(fd)
        assert seg.read_bytes() == b"first" + bytes(4) + b"after"
        assert other.read_bytes() == b"other files keep theirs"
        st = fs.stats()
        assert st["lost_writes"] == 1 and st["lost"] == [{"path": "/1.seg", "offset": 5, "bytes": 4}], st
        fd = os.open(seg, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, b"+")  # (once: the next write lands)
        finally:
            os.close(fd)
        assert seg.read_bytes().endswith(b"after+")
        fs.lose_write(".seg")
        fs.lose_write("off")  # (disarmed before any write)
        seg.write_bytes(b"kept")
        assert seg.read_bytes() == b"kept" and fs.stats()["lost_writes"] == 1


async def test_a_misdirected_write_lands_sectors_earlier_and_its_own_range_keeps_zeros(tmp_path: Path) -> None:
    async with PowerFS(tmp_path / "b", tmp_path / "m") as fs:
        seg = tmp_path / "m" / "1.seg"
        fd = os.open(seg, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, b"s" * 4096)
            fs.misdirect_write(".seg", 5)
            assert os.write(fd, b"M" * 100) == 100
            os.write(fd, b"after")
        finally:
            os.close(fd)
        [w] = fs.stats()["lost"]
        to = w["to"]
        assert (w["path"], w["offset"], w["bytes"]) == ("/1.seg", 4096, 100) and 0 <= to <= 4096 - 512, w
        assert to % 512 == 0
        data = seg.read_bytes()
        assert data[to:to + 100] == b"M" * 100 and data[4096:4196] == bytes(100) and data.endswith(b"after")
        assert data[:to] == b"s" * to and data[to + 100:4096] == b"s" * (4096 - to - 100)
        with pytest.raises(PowerFSError, match="unknown command"):
            fs.command("misdirect-write .seg soon")


def _synced_then_written(f: Path, over: int) -> Path:
    """``f``: 1000 bytes ``S`` fsynced, then ``over`` bytes ``x`` written over them from byte 100
    and 5000 bytes ``T`` after them, none of it fsynced."""
    fd = os.open(f, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"S" * 1000)
        os.fsync(fd)
        os.pwrite(fd, b"x" * over, 100)
        os.pwrite(fd, b"T" * 5000, 1000)
    finally:
        os.close(fd)
    return f


async def test_a_torn_rollback_keeps_a_prefix_of_the_unsynced_tail_cut_at_a_sector(tmp_path: Path) -> None:
    kept = set()
    for seed in range(8):
        async with PowerFS(tmp_path / f"b{seed}", tmp_path / f"m{seed}") as fs:
            f = _synced_then_written(tmp_path / f"m{seed}" / "log", 10)  # (its overwrite: always undone)
            out = fs.rollback_torn(seed)
            data = f.read_bytes()
            assert data[:1000] == b"S" * 1000 and data[1000:] == b"T" * (len(data) - 1000)
            assert len(data) % 512 == 0 or len(data) == 1000, len(data)
            assert out["kept"] == len(data) - 1000 and out["files"] == 1
            kept.add(out["kept"])
    assert len(kept) > 2, kept  # (the seed draws where the tear falls)


async def test_a_reordered_rollback_keeps_any_of_the_sectors_written_since_the_last_fsync(tmp_path: Path) -> None:
    """The disk wrote the sectors in an order of its own: each one written since the last fsync
    is there whole or not at all, an overwrite below the synced size included; the file ends at
    the last sector kept past its synced size, and one lost before that reads as zeros (a hole,
    which a torn write never leaves)."""
    holes = 0
    undone = set()
    for seed in range(12):
        async with PowerFS(tmp_path / f"b{seed}", tmp_path / f"m{seed}") as fs:
            # (its overwrite of synced bytes: the pieces [100, 512) and [512, 700))
            f = _synced_then_written(tmp_path / f"m{seed}" / "log", 600)
            out = fs.rollback_reordered(seed)
            data = f.read_bytes()
            pieces = [(100, 512), (512, 700)]
            assert data[:100] == b"S" * 100 and data[700:1000] == b"S" * 300
            assert all(data[a:b] in (b"S" * (b - a), b"x" * (b - a)) for a, b in pieces), data[:1000]
            undone.add(tuple(data[a] == ord("S") for a, _b in pieces))
            tail = data[1000:]
            cuts = [1000, *range(1024, 6000, 512), 6000]
            sectors = [data[a:b] for a, b in zip(cuts, cuts[1:]) if a < len(data)]
            assert all(sec in (b"T" * len(sec), b"\0" * len(sec)) for sec in sectors), tail
            assert not tail or tail.endswith(b"T"), "the file ends at the last sector written"
            assert len(data) in cuts
            assert out["kept"] == tail.count(b"T") and out["files"] == 1
            holes += b"\0" in tail
    assert holes and len(undone) > 2, (holes, undone)  # (the seed draws which sectors made it)


async def test_sqlite_in_wal_mode_works_and_keeps_its_synced_commits(tmp_path: Path) -> None:
    async with PowerFS(tmp_path / "b", tmp_path / "m", strict=True) as fs:
        path = str(tmp_path / "m" / "t.db")
        db = sqlite3.connect(path, isolation_level=None)
        try:
            assert db.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
            db.execute("PRAGMA synchronous=FULL")
            db.execute("CREATE TABLE t (x INTEGER)")
            for i in range(200):
                db.execute("INSERT INTO t VALUES (?)", (i,))
            db.execute("PRAGMA synchronous=OFF")  # from here on nothing is fsynced
            for i in range(200, 300):
                db.execute("INSERT INTO t VALUES (?)", (i,))
            assert db.execute("SELECT count(*) FROM t").fetchone()[0] == 300
            assert os.path.exists(path + "-shm")
        finally:
            db.close()  # (closing checkpoints: a real crash would not; the rollback undoes it)
        fs.rollback()
        db = sqlite3.connect(path)
        try:
            assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            assert db.execute("SELECT count(*) FROM t").fetchone()[0] >= 200
        finally:
            db.close()


async def test_no_mount_is_left_behind(tmp_path: Path) -> None:
    fs = PowerFS(tmp_path / "b", tmp_path / "m")
    with pytest.raises(RuntimeError):
        async with fs:
            held = open(tmp_path / "m" / "open-file", "w")  # busy: the unmount must be lazy
            raise RuntimeError("the caller fails")
    with contextlib.suppress(OSError):  # its file system is gone (ENOTCONN): nothing to flush
        held.close()
    assert not mounted(tmp_path / "m")
    # the process dies under it: still unmounted
    fs = PowerFS(tmp_path / "b", tmp_path / "m")
    await fs.mount()
    try:
        assert fs.proc is not None
        fs.proc.kill()
        await fs.proc.wait()
    finally:
        await fs.unmount()
    assert not mounted(tmp_path / "m")
    # a second mount on the same point is refused, and the first one still goes
    async with PowerFS(tmp_path / "b", tmp_path / "m"):
        with pytest.raises(PowerFSError, match="already mounted"):
            await PowerFS(tmp_path / "b2", tmp_path / "m").mount()
    assert not mounted(tmp_path / "m")


async def test_a_file_open_across_a_rollback_writes_no_more(tmp_path: Path) -> None:
    """What a dead node left open must not write after its power loss."""
    async with PowerFS(tmp_path / "b", tmp_path / "m") as fs:
        fd = os.open(tmp_path / "m" / "f", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.write(fd, b"synced")
            os.fsync(fd)
            fs.rollback()
            with pytest.raises(OSError) as e:
                os.pwrite(fd, b"late", 0)
            assert e.value.errno == errno.EBADF
            assert os.pread(fd, 100, 0) == b"synced"  # reading is harmless
        finally:
            os.close(fd)
        assert (tmp_path / "m" / "f").read_bytes() == b"synced"


async def test_a_store_closes_on_a_disk_that_fails(tmp_path: Path) -> None:
    """A node stopping because its disk fails must still stop: closing its store on a disk
    whose every write and fsync fails with EIO raises nothing (its open mark may stay: the
    next start then calls the stop unclean)."""
    from storage.base import PutQueue, QueueMeta
    from storage.sqlite import SqliteEngine

    async with PowerFS(tmp_path / "b", tmp_path / "m") as fs:
        e = SqliteEngine(tmp_path / "m" / "tandem.db")
        e.open()
        e.apply([PutQueue(QueueMeta(id=1, name="q", partitions=1, mapper="round_robin", ring_size=0,
                                    max_deliveries=0, dead_letter_queue=None, max_length=0))], sync=True)
        fs.fail_io("all")
        e.close()
        fs.fail_io("off")
