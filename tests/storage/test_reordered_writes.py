"""A power cut after writes the disk made in an order of its own (powerfs's ``rollback-reordered``):
of what the replication log wrote since its last fdatasync any sectors may have made it, so its
newest segment can hold a hole with whole records after it. Nothing there was acknowledged, and
the records written after an fdatasync say how far it reached (storage.segfiles.unsynced_cut):
opening keeps every record synced before and cuts the log off at the first hole past that, as a
torn tail, never as damage (which would send the partitions to repair, on every node a power cut
of the group hit); ``tandem scrub`` reads the same. A hole in what an fdatasync reached stays
damage. Real powerfs, a real process that dies without closing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from broker.tools.powerfs import PowerFS
from broker.tools.powerfs_mount import fuse_missing
from storage.segfiles import read_segment, records, scan
from storage.segments import SegmentLog
from tests.storage.test_segments import append

FUSE = pytest.mark.skipif(fuse_missing() is not None, reason=f"powerfs cannot run here: {fuse_missing()}")

ROOT = Path(__file__).resolve().parents[2]

#: 40 records synced, 30 more written and never synced, then the process dies (os._exit: no close)
WRITER = """
import os, sys
from storage.segments import SegmentLog
from tests.storage.test_segments import append
log = SegmentLog(sys.argv[1])
log.open()
for i in range(1, 71):
    log.write([append(1, 0, i, 1, size=300)], sync=i == 40)
os._exit(0)
"""


@pytest.mark.asyncio
@FUSE
async def test_a_power_cut_after_reordered_writes_keeps_what_was_synced_and_cuts_off_the_rest(tmp_path: Path) -> None:
    seen: dict[str, int] = {}
    for seed in range(16):
        async with PowerFS(tmp_path / f"b{seed}", tmp_path / f"d{seed}") as fs:
            d = tmp_path / f"d{seed}" / "log"
            subprocess.run([sys.executable, "-c", WRITER, str(d)], check=True, cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
            seg = next(d.glob("*.seg"))
            synced = [pos for pos, _body, _f in records(read_segment(seg)[0], True)][40]  # (where record 41 began)
            out = fs.rollback_reordered(seed)
            assert out["files"] >= 1 and 0 <= out["kept"] <= max(0, seg.stat().st_size - synced)
            good, damage, torn = scan(d)
            log = SegmentLog(d)
            got = [e.index for e in log.open().get((1, 0), [])]
            log.close()
            assert got[:40] == list(range(1, 41)) and set(got) <= set(range(1, 71)), (seed, got)
            assert damage == [] == log.damage, damage
            assert got == list(range(1, got[-1] + 1)), got  # (a prefix: the tail from the first hole cut off)
            kind = "cut" if torn else "whole"
            if torn:
                at = int(re.search(r" at byte (\d+) ", torn[0]).group(1))
                assert at >= synced and seg.stat().st_size == at, (torn, synced)
            seen[kind] = seen.get(kind, 0) + 1
            assert good == len(got)
    assert seen.get("cut", 0) >= 12, seen  # (most seeds leave a hole with records after it)


def test_a_hole_in_what_an_fdatasync_reached_is_damage_and_one_past_it_is_cut_off(tmp_path: Path) -> None:
    """Zeros over record 20, which an fdatasync made durable (the records of the writes after it
    say so): damage, the records after it read on. Zeros over record 50, written after the last
    fdatasync, with records after it: cut off there."""
    for hole, damaged in ((20, True), (50, False)):
        d = tmp_path / str(hole)
        log = SegmentLog(d)
        log.open()
        for i in range(1, 71):
            log.write([append(1, 0, i, 1, size=300)], sync=i <= 40)
        seg = next(d.glob("*.seg"))
        at = [pos for pos, _b, _f in records(read_segment(seg)[0], True)][hole - 1]
        data = bytearray(seg.read_bytes())
        data[at:at + 8] = bytes(8)  # (its length and checksum gone: an empty record)
        seg.write_bytes(bytes(data))
        again = SegmentLog(d)
        got = [e.index for e in again.open()[(1, 0)]]
        if damaged:
            assert again.damage and f"at byte {at} (an empty record (zeros), a readable record" in again.damage[0]
            assert got == [i for i in range(1, 71) if i != hole]
        else:
            assert again.damage == [] and got == list(range(1, hole)) and seg.stat().st_size == at
        again.close()
