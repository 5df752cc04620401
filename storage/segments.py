"""The replication log's own files: append-only segments, beside the SQLite store.

Why not a table: SQLite writes whole pages.  In a table a log entry would go to the WAL
as 16 KiB pages (an entry of 30 KiB: its leaf page and two overflow pages), be copied
again into the database by the checkpoint, and its delete at compaction would rewrite the
pages once more: a 3-node group would write ~17 KiB to disk per 1 KiB message (all
nodes), against ~10 KiB with the log here, for about a fifth less throughput.  The log
is what an append-only file is for.

Layout: ``<dir>/<seq>.seg``, ``seq`` rising, each beside a ``<seq>.first`` holding the number
of its first record and a CRC-32 of it (storage.segfiles).  Each record is ``<u32 length><u32
crc32>`` then ``length`` bytes of msgpack:

* ``["A", queue_id, partition, [[index, term, origin, weak, data], ...], commit, seq(, cover, synced)]``:
  entries (a later record of the same index replaces the earlier one); ``commit`` is the
  writer's commit index then: a watermark of what it knew committed;
* ``["T", queue_id, partition, from_index, seq(, cover, synced)]``: entries from ``from_index`` on are gone;
* ``["X", queue_id, seq(, cover, synced)]``: the queue was deleted, with every entry of its partitions
  before it.

``seq`` numbers the records one by one, in the order they were written, across segments; the
first record of each write carries a ``cover``, ``[from_seq, to_seq, [[queue_id, partition],
...]]``: the partition of each record of the two writes before it, in order (a deletion
record's as partition -1), and ``synced``, the number of the last record an fdatasync of the
writing process had made durable when the write was made (0 before its first; ``cover`` nil
where there is none yet).  A record of an older build has none of these
(nor ``commit`` where it was 0); a build that does not know the trailing fields reads the
record without them.  The covers say what damage took (storage.logdamage); ``synced`` says how
far the log was durable (below).

Durability: :meth:`SegmentLog.write` with ``sync`` fdatasyncs the segment; a segment is
fsynced when the next one starts, and a new segment's directory entry is fsynced.  So only
the newest segment holds what no fdatasync reached, and a disk may keep any of that when the
power goes (it writes those sectors in an order of its own): a later record can outlive an
earlier one there.  What opening keeps is always a prefix of what was written, all the same
(a lost truncation under surviving appends would leave a log the Raft rules do not allow).
Opening scans every segment in order.  A torn or corrupt record with nothing readable after
it, at the end of the newest segment, is a write the crash cut short: cut off there (not so in
a log that was closed: then it is damage; and with damage elsewhere, what was cut off counts as
lost).  So is one with readable records after it where no record read says an fdatasync
reached it (their ``synced``) and one flipped bit does not explain it: nothing from there on
had been made durable (storage.segfiles.unsynced_cut).  Anywhere else, a record that fails its length or
checksum is *damage* (a bit flipped at rest, a lost or misdirected write), and so is a segment
the disk cannot read to its end (a latent sector error), a record number missing, or numbers
that go back (a misdirected write that kept the records' framing).  :attr:`SegmentLog.damage` says where; the records after it are
read on, and replayed in the order of their numbers.  A partition keeps its entries where the
damage cannot have taken any it still needs (:meth:`SegmentLog.intact`); the others catch up
from the group's actives (storage.sqlite.recovery).  :meth:`SegmentLog.set_aside` then moves
the segments aside, kept for a look (docs/reliability.md, "Storage faults").

Space: the store (SQLite) keeps each partition's compaction point (``LogCompact``).  The
oldest segment is deleted once every entry in it is at or below its partition's point as
the store has *durably* committed it, or was truncated or deleted by a later record (which
is fsynced first).  Only the oldest goes, so a truncation or deletion record never goes
before the entries it removes.
A partition whose old entries keep the oldest segment (a quiet one) is named by
:meth:`SegmentLog.pins`: the replication driver compacts it.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from client.errors import StorageError
from storage.base import LogRecord
from storage.logdamage import Damage, assess
from storage.segfiles import (SUFFIX, cover_of, encode, first_path, key_of, read_first, read_segment, records,
                              seq_of, unreadable_said, unsynced_cut, well_formed, write_first)

log = logging.getLogger("tandem.storage")

Key = tuple[int, int]

SEGMENT_BYTES = 64 * 1024 * 1024
#: the store's mark (``meta``, value "1") of a partition under repair: its log was found damaged,
#: or its copy started over, and it neither votes nor stands until an active has caught it up.
#: Kept until then, so a restart mid-repair (the damaged segments already set aside) still knows
#: it may have acknowledged entries it no longer holds.
REPAIR_KEY = "repairing."


@dataclass(slots=True)
class _Segment:
    seq: int
    path: Path
    size: int = 0
    #: per partition, the highest index of an entry in this segment not since truncated
    tops: dict[Key, int] = field(default_factory=dict)


def repair_key(key: Key) -> str:
    return f"{REPAIR_KEY}{key[0]}.{key[1]}"


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory: the names made or removed in it survive a crash."""
    dfd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def make_dir(path: Path) -> None:
    """``mkdir -p`` whose new directories survive a crash (each parent fsynced)."""
    if path.is_dir():
        return
    make_dir(path.parent)
    try:
        path.mkdir()
    except FileExistsError:
        return
    fsync_dir(path.parent)


class SegmentLog:
    """The replication log of every partition of one node.  Not thread-safe: the store's
    writer thread owns it after :meth:`open` (``pins`` excepted, see there)."""

    def __init__(self, directory: str | os.PathLike[str], *, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.dir = Path(directory)
        self.segment_bytes = segment_bytes
        self._segments: list[_Segment] = []
        self._fd: int | None = None  # the newest segment, open for appending
        self._dirty = False  # written since the last fdatasync
        #: the number of the last record an fdatasync of this process has made durable: each
        #: write's first record says it (storage.segfiles.unsynced_cut)
        self._synced = 0
        self._pins: dict[Key, int] = {}  # what keeps the oldest segment (copied for other threads)
        self._doomed: queue.SimpleQueue[Path | None] = queue.SimpleQueue()
        self._deleter: threading.Thread | None = None
        self.deleted_segments = 0
        #: per partition, the highest commit watermark replayed (``A`` records), capped by
        #: later truncations
        self.commits: dict[Key, int] = {}
        #: where :meth:`open` found damage ("<segment> at byte N (what)")
        self.damage: list[str] = []
        #: after damage: what it took, as far as the records' numbers and covers say
        self.assessed = Damage(None, None)
        self._next_seq = 1
        #: the last two writes: the number of each one's first record, and its records' partitions
        self._recent: deque[tuple[int, list[Key]]] = deque(maxlen=2)
        self._entry_seq: dict[Key, dict[int, int]] = {}  # after damage: index -> its record's number
        #: per partition, its last ``A`` or ``T`` record's number (0: none) and the log's last index
        #: after that record (an append's highest index; a truncation's first, less one)
        self._tail: dict[Key, tuple[int, int]] = {}
        self._sweep_at = 0  # the record number at which :meth:`sweep` looks again
        self._dropped: set[int] = set()  # queues a deletion record removed (and none written since)
        self._sync_failed: str | None = None  # (sync)

    # -- open: replay --------------------------------------------------------------------

    def open(self, *, clean: bool = False) -> dict[Key, list[LogRecord]]:
        """Scan the segments; every partition's entries, in index order (after damage, what was
        read: :meth:`intact` says which partitions' entries are whole).  ``clean``: the log was
        closed (no write was cut short), so a bad record at its end is damage too."""
        make_dir(self.dir)
        seqs = sorted(int(p.stem) for p in self.dir.glob(f"*{SUFFIX}") if p.stem.isdigit())
        for orphan in self.dir.glob("*.first"):  # (its segment's deletion was cut short)
            if not orphan.with_suffix(SUFFIX).exists():
                orphan.unlink(missing_ok=True)
        found: list[tuple[int | None, _Segment, list[Any]]] = []
        damaged_at: list[int] = []  # how many records were read before each damage
        cut = False
        for n, seq in enumerate(seqs):
            seg = _Segment(seq, self._path(seq))
            cut = self._read(seg, found, damaged_at, last=n == len(seqs) - 1, clean=clean) or cut
            self._segments.append(seg)
        numbers = [f[0] for f in found]
        known = [n for n in numbers if n is not None]
        floor = read_first(self._path(seqs[0])) if seqs else None  # (the oldest segment's first record)
        if floor is not None and known and floor < min(known) and not self.damage:
            self.damage.append(f"{self._path(seqs[0])}: no record numbered {floor}-{min(known) - 1} at its start "
                               f"(a write lost or misdirected)")
        back = next((i for i in range(1, len(known)) if known[i] <= known[i - 1]), None)
        if back is not None:
            self.damage.append(f"{self.dir}: record {known[back]} after record {known[back - 1]} (records out of "
                               f"order: a misdirected write)")
        elif not self.damage and (gap := next(((a, b) for a, b in zip(known, known[1:]) if b > a + 1), None)):
            self.damage.append(f"{self.dir}: no record numbered {gap[0] + 1}" + (f"-{gap[1] - 1}" if gap[1] > gap[0] + 2
                               else "") + f" between records {gap[0]} and {gap[1]} (a write lost or misdirected)")
        if self.damage and cut:
            damaged_at.append(len(found))  # (the end cut off may be damage too: nothing known past it)
        self._next_seq = max(known, default=0) + 1
        covers = [c for _n, _s, rec in found if (c := cover_of(rec)) is not None]
        entries: dict[Key, dict[int, LogRecord]] = {}
        if self.damage:
            self.assessed = assess([(n, key_of(rec)) for n, _s, rec in found], damaged_at, covers, floor)
            if self.assessed.lost_upto is not None:
                found.sort(key=lambda f: f[0] or 0)  # (the order they were written in)
        else:  # the records no cover names yet: the first write's cover names them
            since = max((c[1] for c in covers), default=0)
            tail = [(n, key_of(rec)) for n, _s, rec in found if n is not None and n > since]
            if tail and tail[-1][0] - tail[0][0] == len(tail) - 1:
                self._recent.append((tail[0][0], [k for _n, k in tail]))
        for number, seg, rec in found:
            self._apply_record(seg, rec, entries, number, track=bool(self.damage))
        if self.damage:
            log.error("replication log %s is damaged: %s", self.dir, "; ".join(self.damage))
            self._start_segment(self._segments[-1].seq + 1)  # (never appended to a damaged one)
            return {key: [recs[i] for i in sorted(recs)] for key, recs in entries.items() if recs}
        if not self._segments:
            self._start_segment(1)
        else:
            self._fd = os.open(self._segments[-1].path, os.O_WRONLY | os.O_APPEND)
        self._update_pins()
        return {key: [recs[i] for i in sorted(recs)] for key, recs in entries.items() if recs}

    def set_aside(self) -> Path | None:
        """After :meth:`open` found damage: move every segment it read into ``damaged-<seq>/``
        beside them (kept for a look, never read again); the new directory, or None."""
        if not self.damage or len(self._segments) < 2:
            return None
        read, self._segments = self._segments[:-1], self._segments[-1:]
        aside = self.dir / f"damaged-{read[-1].seq:016d}"
        aside.mkdir(exist_ok=True)
        for seg in read:
            seg.path.rename(aside / seg.path.name)
            if first_path(seg.path).exists():
                first_path(seg.path).rename(aside / first_path(seg.path).name)
        fsync_dir(aside)
        fsync_dir(self.dir)
        self.damage = []
        return aside

    def _path(self, seq: int) -> Path:
        return self.dir / f"{seq:016d}{SUFFIX}"

    def intact(self, key: Key, applied: int, entries: list[LogRecord]) -> bool:
        """After damage: whether partition ``key``'s entries above ``applied`` (its store's
        applied index), as :meth:`open` gave them, are all it had (storage.logdamage)."""
        return self.assessed.intact(key, applied, [e.index for e in entries], self._tail.get(key, (0, 0)),
                                    self._entry_seq.get(key, {}))

    def sweep(self, snaps: Mapping[Key, int]) -> None:
        """Write a mark for each quiet partition: a truncation record from one past its last
        index (it removes nothing, and a build that does not know the marks reads it so), so
        that damage to an older record cannot hide where its log ended (:meth:`intact`).  A
        partition is quiet when its last record is older than a number of records (32, or
        four per partition known, whichever is more); ``snaps``: each partition's compaction
        point (its last index when none of its entries is left in the files).  Looks again
        after that many more records."""
        if self._next_seq < self._sweep_at:
            return
        keys = set(self._tail) | {k for k in snaps if k[0] not in self._dropped}
        every = max(32, 4 * len(keys))
        self._sweep_at = self._next_seq + every
        quiet = [key for key in keys if self._tail.get(key, (0, 0))[0] < self._next_seq - every]
        if not quiet:
            return
        tops: dict[Key, int] = {}
        for seg in self._segments:
            for key, top in seg.tops.items():
                tops[key] = max(tops.get(key, 0), top)
        self.write([["T", key[0], key[1], max(tops.get(key, 0), snaps.get(key, 0)) + 1] for key in sorted(quiet)],
                   sync=False)

    def _read(self, seg: _Segment, found: list[tuple[int | None, _Segment, list[Any]]], damaged_at: list[int], *,
              last: bool, clean: bool) -> bool:
        """Read ``seg``'s records into ``found``; whether a torn end was cut off."""
        data, unreadable = read_segment(seg.path)
        seg.size = len(data)
        # (what the disk cannot read is damage, never a torn tail: it may hold acknowledged entries;
        # it reads as zeros, so the records it took fail their checks below, and those after it are read)
        self.damage += [f"{seg.path} at byte {at} ({unreadable_said(n, why)})" for at, n, why in unreadable]
        items = list(records(data, last and not unreadable, resume=True, unread=bool(unreadable)))
        holed = None
        if last and not clean and not unreadable and any(f is not None and f[1] is not None for _p, _b, f in items):
            before = found[-1][0] if found else (None if (first := read_first(seg.path)) is None else first - 1)
            holed = unsynced_cut(data, items, before)
        for pos, body, fault in items:
            if pos == holed:
                log.warning("replication log %s: from byte %d of %d on, what was written after the last fdatasync "
                            "the records read prove did not all reach the disk (a power cut after writes the disk "
                            "made out of order): cut off there, as a write the machine did not finish", seg.path,
                            pos, len(data))
                self._cut(seg, pos)
                return True
            if fault is None:
                rec = msgpack.unpackb(body, raw=False)
                if well_formed(rec):
                    found.append((seq_of(rec), seg, rec))
                else:  # (checksummed, yet not a record: framed inside a payload, or written by no build)
                    self.damage.append(f"{seg.path} at byte {pos} (a record that does not read as one)")
                    damaged_at.append(len(found))
                continue
            bad, damaged = fault
            if damaged is not None:
                self.damage.append(f"{seg.path} at byte {pos} ({bad}{damaged})")
                damaged_at.append(len(found))
                continue
            if clean:
                self.damage.append(f"{seg.path} at byte {pos} ({bad}, at the end of a log that was closed)")
                damaged_at.append(len(found))
                return False
            log.warning("replication log %s: %s at byte %d of %d, cut off there (a write the process "
                        "or the machine did not finish)", seg.path, bad, pos, len(data))
            self._cut(seg, pos)
            return True
        return False

    @staticmethod
    def _cut(seg: _Segment, pos: int) -> None:
        """``seg`` ends at ``pos`` from now on, durably."""
        with open(seg.path, "r+b") as f:
            f.truncate(pos)
            f.flush()
            os.fsync(f.fileno())
        seg.size = pos

    def _apply_record(self, seg: _Segment, rec: list[Any], entries: dict[Key, dict[int, LogRecord]] | None,
                      number: int | None, *, track: bool = False) -> None:
        """``number``: the record's (None: an older build's); ``track``: each entry's kept for
        :meth:`intact` (after damage)."""
        kind = rec[0]
        if kind == "A":
            key = (rec[1], rec[2])
            items: list[list[Any]] = rec[3]
            if entries is not None:
                mine = entries.setdefault(key, {})
                for i, t, o, w, d in items:
                    mine[i] = LogRecord(i, t, o, bool(w), d)
                if track and number is not None:
                    self._entry_seq.setdefault(key, {}).update((it[0], number) for it in items)
            top = max(it[0] for it in items)
            self._tail[key] = (number or 0, top)
            self._dropped.discard(key[0])
            if top > seg.tops.get(key, 0):
                seg.tops[key] = top
            if entries is not None and len(rec) > 4 and rec[4] > self.commits.get(key, 0):
                self.commits[key] = rec[4]
        elif kind == "T":
            key = (rec[1], rec[2])
            start = rec[3]
            self._tail[key] = (number or 0, start - 1)
            self._dropped.discard(key[0])
            if entries is not None and key in entries:
                mine = entries[key]
                for i in [i for i in mine if i >= start]:
                    del mine[i]
            if entries is not None and self.commits.get(key, 0) >= start:
                self.commits[key] = start - 1
            for s in (*self._segments, seg):
                if s.tops.get(key, 0) >= start:
                    s.tops[key] = start - 1
        elif kind == "X":
            # Only the entries before it: a queue id could come back (a node that caught
            # up through a catalogue snapshot does not know the ids used meanwhile).
            qid = rec[1]
            for s in (*self._segments, seg):
                for key in s.tops:
                    if key[0] == qid:
                        s.tops[key] = -1
            for key in [k for k in self._tail if k[0] == qid]:
                del self._tail[key]
            self._dropped.add(qid)
            if entries is not None:
                for key in [k for k in entries if k[0] == qid]:
                    del entries[key]
                for key in [k for k in self.commits if k[0] == qid]:
                    del self.commits[key]
        else:
            raise StorageError(f"replication log record of unknown kind {kind!r}")

    # -- writes ------------------------------------------------------------------------

    def write(self, records: list[list[Any]], *, sync: bool) -> None:
        """Append ``records`` (kinds as in the module doc) in one write; with ``sync``,
        fdatasync before returning (everything before them is then durable too)."""
        if self._fd is None:
            raise StorageError("replication log is closed" if self._sync_failed is None else
                               f"replication log: an fdatasync failed before ({self._sync_failed}): restart the node")
        seg = self._segments[-1]
        if records:
            if seg.size >= self.segment_bytes:
                seg = self._roll()
            first = self._next_seq
            cover = None
            if self._recent:  # (the writes before this one, numbered on without a gap)
                keys = [k for c in self._recent for k in c[1]]
                cover = [self._recent[0][0], first - 1, keys]
            buf = b"".join(encode(r, first + n, cover, self._synced) if n == 0 else encode(r, first + n)
                           for n, r in enumerate(records))
            try:
                done = os.write(self._fd, buf)
                while done < len(buf):
                    done += os.write(self._fd, memoryview(buf)[done:])
            except OSError as exc:
                # Cut off the part written: a later record must never follow a torn one
                # (opening would stop at it and lose what came after).
                try:
                    os.ftruncate(self._fd, seg.size)
                except OSError as exc2:
                    self._close_fd()  # no further writes: the segment's end is unknown
                    raise StorageError(f"replication log write to {seg.path} failed ({exc}), and cutting "
                                       f"it back failed too ({exc2}): restart the node", orig=exc) from exc
                raise StorageError(f"replication log write to {seg.path} failed: {exc}", orig=exc) from exc
            seg.size += len(buf)
            self._next_seq += len(records)
            self._recent.append((first, [key_of(r) for r in records]))
            self._dirty = True
            for n, r in enumerate(records):
                self._apply_record(seg, r, None, self._next_seq - len(records) + n)
        if sync and self._dirty:
            self.sync()

    def sync(self) -> None:
        """fdatasync the newest segment.  One that fails is never tried again on that file: the
        kernel may have dropped the pages it could not write and a retry would report success
        (PostgreSQL's "fsyncgate"), so the log closes and every later write or sync fails; the
        node stops (broker.modes.replicated), and its restart reads what the disk really has."""
        if self._sync_failed is not None:
            raise StorageError(f"replication log: an fdatasync failed before ({self._sync_failed}): restart the node")
        if self._fd is not None and self._dirty:
            try:
                os.fdatasync(self._fd)
            except OSError as exc:
                self._sync_failed = str(exc)
                self._close_fd()
                raise StorageError(f"replication log fdatasync failed: {exc}: the log is closed (an fdatasync is "
                                   f"never retried on the same file)", orig=exc) from exc
            self._dirty = False
            self._synced = self._next_seq - 1

    def _roll(self) -> _Segment:
        """The next segment; the full one is made durable first (prefix durability)."""
        self.sync()
        self._close_fd()
        return self._start_segment(self._segments[-1].seq + 1)

    def _start_segment(self, seq: int) -> _Segment:
        seg = _Segment(seq, self._path(seq))
        write_first(seg.path, self._next_seq)
        self._fd = os.open(seg.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        fsync_dir(self.dir)  # the new names survive a crash with what is written in the segment
        self._segments.append(seg)
        return seg

    # -- space ---------------------------------------------------------------------------

    def _live(self, seg: _Segment, snaps: Mapping[Key, int]) -> dict[Key, int]:
        return {key: top for key, top in seg.tops.items() if top > snaps.get(key, 0)}

    def reclaimable(self, snaps: Mapping[Key, int]) -> bool:
        """Would the oldest segment go, were these the durable compaction points?"""
        return len(self._segments) > 1 and not self._live(self._segments[0], snaps)

    def reclaim(self, durable_snaps: Mapping[Key, int], committed_snaps: Mapping[Key, int] | None = None) -> int:
        """Delete the oldest segments while nothing in them is live, given the compaction
        points the store has durably committed; how many went.  :meth:`pins` then names
        what keeps the oldest by ``committed_snaps`` (default: the durable ones)."""
        gone = 0
        while len(self._segments) > 1 and not self._live(self._segments[0], durable_snaps):
            if not gone:
                # What made it deletable may be a truncation or a deletion record still in
                # the OS's cache: on disk first, or a crash would bring back the entries
                # after this segment without it (a log with a hole).
                self.sync()
            self._doom(self._segments.pop(0).path)
            gone += 1
        if gone:
            self.deleted_segments += gone
            log.debug("replication log: %d old segment(s) deleted, %d left", gone, len(self._segments))
        self._update_pins(durable_snaps if committed_snaps is None else committed_snaps)
        return gone

    def _doom(self, path: Path) -> None:
        """Unlink on a thread of its own: freeing 64 MiB took ~16 ms here (the file system
        discards the blocks), a stall for every commit behind it.  A segment a crash keeps
        from going comes back on open with nothing live in it, and goes again."""
        if self._deleter is None:
            self._deleter = threading.Thread(target=self._delete_doomed, name="tandem-log-deleter", daemon=True)
            self._deleter.start()
        self._doomed.put(path)

    def _delete_doomed(self) -> None:
        while True:
            path = self._doomed.get()
            if path is None:
                return
            try:
                path.unlink()
                first_path(path).unlink(missing_ok=True)
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("replication log segment %s not deleted (open deletes it again): %s", path, exc)

    def _update_pins(self, snaps: Mapping[Key, int] | None = None) -> None:
        self._pins = self._live(self._segments[0], snaps or {}) if len(self._segments) > 1 else {}

    def pins(self) -> dict[Key, int]:
        """The partitions (and their highest entry there) that keep the oldest segment,
        as of the last :meth:`reclaim`: compacting them past it lets it go.  Safe to call
        from another thread (it reads a dict that is replaced, never changed)."""
        return self._pins

    @property
    def segments(self) -> int:
        return len(self._segments)

    def size(self) -> int:
        """Bytes in every segment."""
        return sum(s.size for s in self._segments)

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def wait_deletions(self) -> None:
        """Until the segments :meth:`reclaim` let go are unlinked."""
        if self._deleter is not None:
            self._doomed.put(None)
            self._deleter.join()
            self._deleter = None

    def close(self) -> None:
        """Sync and close; wait for the segments being deleted."""
        self.wait_deletions()
        if self._fd is not None:
            try:
                self.sync()
            finally:
                self._close_fd()  # (a failed sync closed it already)
