"""The replication log's records as they lie in its segment files: their framing, reading them
back, and telling damage from a write a crash cut short (the layout: storage.segments's doc).
:class:`storage.segments.SegmentLog` keeps the files."""

from __future__ import annotations

import os
import re
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack

from storage.logdamage import Cover

Key = tuple[int, int]

HEADER = struct.Struct("<II")
SUFFIX = ".seg"
#: a segment is read this much at a time, and a part the disk fails to read a sector at a time
READ = 1 << 20
SECTOR = 512


def read_segment(path: Path) -> tuple[bytes, list[tuple[int, int, str]]]:
    """A segment's bytes, and what the disk could not read of it: each run of sectors a read
    fails on (a latent sector error) as (offset, length, why), read as zeros so that the records
    after it are read on.  What the disk cannot read is damage, never a torn tail: it may hold
    acknowledged entries."""
    out = bytearray()
    unreadable: list[tuple[int, int, str]] = []
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        while len(out) < size:
            pos = len(out)
            try:
                chunk = os.pread(fd, min(READ, size - pos), pos)
            except OSError:
                chunk = _by_sector(fd, pos, min(READ, size - pos), unreadable)
            if not chunk:
                break  # (the file ends before its size said: it shrank meanwhile)
            out += chunk
    finally:
        os.close(fd)
    return bytes(out), unreadable


def _by_sector(fd: int, pos: int, n: int, unreadable: list[tuple[int, int, str]]) -> bytes:
    """``n`` bytes from ``pos`` read a sector at a time, those the disk cannot read as zeros
    (added to ``unreadable``, a run of them as one)."""
    out = bytearray()
    at = pos
    while at < pos + n:
        want = min(SECTOR - at % SECTOR, pos + n - at)  # (to the next sector boundary)
        try:
            got = os.pread(fd, want, at)
        except OSError as exc:
            got = bytes(want)
            last = unreadable[-1] if unreadable else None
            if last is not None and last[0] + last[1] == at:
                unreadable[-1] = (last[0], last[1] + want, last[2])
            else:
                unreadable.append((at, want, exc.strerror or str(exc)))
        out += got
        at += len(got)
        if len(got) < want:
            break
    return bytes(out)


def unreadable_said(length: int, why: str) -> str:
    """How a run of unreadable bytes is named in a damage line (after ``<segment> at byte N``)."""
    return f"unreadable: {length} B ({why}), read as zeros"


def records(data: bytes, last: bool, *, resume: bool = False, unread: bool = False
            ) -> Iterator[tuple[int, bytes, tuple[str, str | None] | None]]:
    """Each record of a segment's ``data`` (``last``: the newest segment) as (offset, payload,
    None), up to the first that fails its length or checksum, given as (offset, b"", (what,
    why it is damage)): why None for a torn tail (nothing readable after it, in the newest
    segment), else ", a readable record at byte N after it" or ", in a segment that is not the
    newest" (``unread``: ", in a segment part of which the disk could not read": never a torn
    tail either).  ``resume``: on from that readable record after damage, to the end."""
    pos = 0
    while pos < len(data):
        bad = None
        if pos + HEADER.size > len(data):
            bad = "a torn record header"
        else:
            length, crc = HEADER.unpack_from(data, pos)
            body = data[pos + HEADER.size:pos + HEADER.size + length]
            if len(body) < length:
                bad = "a torn record"
            elif length == 0:
                bad = "an empty record (zeros)"
            elif zlib.crc32(body) != crc:
                bad = "a record failing its checksum"
        if bad is not None:
            # a record failing its checksum with its length whole (a bit flipped in its payload): the
            # next record is where that length says, not somewhere inside the damaged payload
            end = pos + HEADER.size + length
            after = end if bad == "a record failing its checksum" and _record_at(data, end) else \
                _next_record(data, pos + 1)
            flipped = _one_bit_flipped(data, pos) if after is None and last and bad in (
                "a record failing its checksum", "a torn record", "an empty record (zeros)") else None
            why = (f", a readable record at byte {after} after it" if after is not None
                   else f", one bit flipped in {flipped}: damage at rest, not a write cut short" if flipped
                   else None if last else ", in a segment part of which the disk could not read" if unread
                   else ", in a segment that is not the newest")
            yield pos, b"", (bad, why)
            if not resume or after is None:
                return
            pos = after
            continue
        yield pos, body, None
        pos += HEADER.size + length


def scan(directory: str | os.PathLike[str]) -> tuple[int, list[str], list[str]]:
    """Read every record of the segments in ``directory`` without changing anything (``tandem
    scrub``): how many records passed their checks, the damage found (as
    :attr:`SegmentLog.damage` says it), and the torn tails a node's next open would cut off."""
    paths = sorted(p for p in Path(directory).glob(f"*{SUFFIX}") if p.stem.isdigit())
    good, damage, torn = 0, [], []
    latest = b""  # (the payload of the last record read)
    for n, path in enumerate(paths):
        data, unreadable = read_segment(path)
        damage += [f"{path} at byte {at} ({unreadable_said(length, why)})" for at, length, why in unreadable]
        last = n == len(paths) - 1 and not unreadable
        items = list(records(data, last=last, resume=True, unread=bool(unreadable)))
        holed = None
        if last and any(f is not None and f[1] is not None for _p, _b, f in items):
            first = read_first(path)
            before = seq_of(rec) if n and (rec := _unpacked(latest)) is not None else \
                None if n or first is None else first - 1
            holed = unsynced_cut(data, items, before)
        for pos, body, fault in items:
            if pos == holed:
                torn.append(f"{path} at byte {pos} (written after the last fdatasync the records read prove, not all "
                            f"of it on the disk: a torn tail, {len(data) - pos} bytes)")
                break
            if fault is None:
                good += 1
                latest = body
            elif fault[1] is not None:
                damage.append(f"{path} at byte {pos} ({fault[0]}{fault[1]})")
            else:
                torn.append(f"{path} at byte {pos} ({fault[0]}: a torn tail, {len(data) - pos} bytes)")
    return good, damage, torn


def _next_record(data: bytes, start: int) -> int | None:
    """The first offset at or after ``start`` where a whole record passes its checksum and reads
    as one (a record after damage: what tells damage from a torn tail); None if none.  One
    followed by the end or by another whole record comes first: a record framed inside
    another's payload (a client's bytes) seldom is."""
    first = None
    end = len(data) - HEADER.size
    # (only where a payload could begin as every record's does: a msgpack array whose first item
    # is the one-letter kind; the checksum of a candidate is what costs)
    for m in _RECORD_START.finditer(data, start + HEADER.size):
        pos = m.start() - HEADER.size
        if pos > end:
            break
        length, crc = HEADER.unpack_from(data, pos)
        if length == 0 or pos + HEADER.size + length > len(data):
            continue
        body = data[pos + HEADER.size:pos + HEADER.size + length]
        if zlib.crc32(body) != crc:
            continue
        try:
            rec = msgpack.unpackb(body, raw=False)
        except Exception:  # msgpack raises several types
            continue
        if not well_formed(rec):
            continue
        nxt = pos + HEADER.size + length
        if nxt == len(data) or _frame_ok(data, nxt):
            return pos
        first = pos if first is None else first
    return first


#: where a record's payload may begin: a msgpack array (fixarray, array 16 or 32) whose first
#: item is the one-letter string of its kind (module doc); a lookahead, so that starts overlap
_RECORD_START = re.compile(rb"(?=(?:[\x90-\x9f]|\xdc..|\xdd....)\xa1[ATX])", re.DOTALL)


def _one_bit_flipped(data: bytes, pos: int) -> str | None:
    """Where one flipped bit would make the record at ``pos`` pass its checks (its checksum, its
    length, or a byte of its payload: CRC-32 tells a single flipped bit and where it lies), or
    None.  What tells a bit flipped at rest in a log's newest record from a write a crash cut
    short: the bytes of a cut write fail by many bits, end early, or are zeros from a sector on
    (a bit that zeros to the end would explain is taken for that).  A cut write that one bit
    would explain otherwise is a chance of about 8 x its length in 2^32 (taken for damage: its
    partitions catch up from the group)."""
    length, crc = HEADER.unpack_from(data, pos)
    room = len(data) - pos - HEADER.size
    start = pos + HEADER.size
    if 0 < length <= room:
        s = zlib.crc32(data[start:start + length]) ^ crc
        if s and s & (s - 1) == 0:  # (one bit of the checksum itself)
            return "its checksum"
        for j in range(length - 1, -1, -1):  # (the syndrome of a flip at byte j, bit k, walked back)
            if s in _CRC_ONE_BIT:
                # a bit gone from bytes that are zeros to the end is a sector that never reached
                # the disk as well: that reads as a write cut short
                return f"its payload's byte {j}" if any(data[start + j:start + length]) else None
            i = _CRC_TOP[s >> 24]
            s = ((s ^ _CRC_TABLE[i]) << 8 | i) & 0xFFFFFFFF
    for b in range(32):
        n = length ^ (1 << b)
        if 0 < n <= room and zlib.crc32(data[start:start + n]) == crc:
            return "its length"
    return None


def _crc_table() -> list[int]:
    """zlib's CRC-32 table (reflected, polynomial 0xEDB88320)."""
    out = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        out.append(c)
    return out


_CRC_TABLE = _crc_table()
#: each table entry by its top byte (all 256 differ): undoes one zero byte of CRC-32
_CRC_TOP = {t >> 24: i for i, t in enumerate(_CRC_TABLE)}
#: the syndromes of a flip of one bit of a payload's last byte
_CRC_ONE_BIT = frozenset(_CRC_TABLE[1 << k] for k in range(8))


def _record_at(data: bytes, pos: int) -> bool:
    """A whole, well-formed record starts at ``pos``."""
    if not _frame_ok(data, pos):
        return False
    length, _crc = HEADER.unpack_from(data, pos)
    try:
        return well_formed(msgpack.unpackb(data[pos + HEADER.size:pos + HEADER.size + length], raw=False))
    except Exception:  # msgpack raises several types
        return False


def _frame_ok(data: bytes, pos: int) -> bool:
    if pos + HEADER.size > len(data):
        return False
    length, crc = HEADER.unpack_from(data, pos)
    return 0 < length <= len(data) - pos - HEADER.size and zlib.crc32(data[pos + HEADER.size:pos + HEADER.size
                                                                             + length]) == crc


def well_formed(rec: Any) -> bool:
    """A record of the module doc's shapes, its number (if any) an int in range."""
    if not isinstance(rec, list) or not rec or rec[0] not in _SEQ_AT or len(rec) < {"A": 4, "T": 4, "X": 2}[rec[0]]:
        return False
    if not all(isinstance(x, int) for x in rec[1:3 if rec[0] != "X" else 2]):
        return False
    number = seq_of(rec)
    if number is not None and not (isinstance(number, int) and 0 < number < 1 << 62):
        return False
    if rec[0] == "T":
        return isinstance(rec[3], int)
    return rec[0] != "A" or (isinstance(rec[3], list) and bool(rec[3]) and all(
        isinstance(it, list) and len(it) == 5 and isinstance(it[0], int) and isinstance(it[1], int) for it in rec[3]))


def first_path(segment: Path) -> Path:
    """The file beside a segment that keeps the number of its first record: what says, after
    damage at its start, how many records the oldest segment began with."""
    return segment.with_suffix(".first")


def write_first(segment: Path, number: int) -> None:
    text = f"{number} {zlib.crc32(str(number).encode())}\n".encode()
    fd = os.open(first_path(segment), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, text)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_first(segment: Path) -> int | None:
    """The number a segment's first record took, as kept beside it; None if that is not known
    (no such file, or one that fails its checksum)."""
    try:
        number, crc = first_path(segment).read_text().split()
        return int(number) if str(zlib.crc32(number.encode())) == crc else None
    except (OSError, ValueError):
        return None


def encode(item: list[Any], seq: int, cover: list[Any] | None = None, synced: int | None = None) -> bytes:
    """A record framed (storage.segments's doc); ``cover`` and ``synced`` go in a write's first."""
    if item[0] == "A" and len(item) == 4:
        item = [*item, 0]  # (the commit watermark's place, before the number)
    tail: list[Any] = [seq] if cover is None and synced is None else [seq, cover] if synced is None else \
        [seq, cover, synced]
    payload = msgpack.packb([*item, *tail], use_bin_type=True)
    return HEADER.pack(len(payload), zlib.crc32(payload)) + payload


_SEQ_AT = {"A": 5, "T": 4, "X": 2}


def seq_of(rec: list[Any]) -> int | None:
    """A record's number (module doc), or None for a record an older build wrote."""
    at = _SEQ_AT.get(rec[0], len(rec))
    return rec[at] if len(rec) > at else None


def cover_of(rec: list[Any]) -> Cover | None:
    """The cover a write's first record carries (storage.logdamage), or None."""
    at = _SEQ_AT.get(rec[0], len(rec)) + 1
    if len(rec) <= at:
        return None
    try:
        first, last, keys = rec[at]
        return int(first), int(last), tuple((int(q), int(p)) for q, p in keys)
    except (TypeError, ValueError):
        return None


def synced_of(rec: list[Any]) -> int | None:
    """The number of the last record an fdatasync had made durable when the write a record
    begins was made (what a write's first record carries), or None."""
    at = _SEQ_AT.get(rec[0], len(rec)) + 2
    mark = rec[at] if len(rec) > at else None
    return mark if type(mark) is int and mark >= 0 else None


def unsynced_cut(data: bytes, items: list[tuple[int, bytes, tuple[str, str | None] | None]],
                 before: int | None) -> int | None:
    """Where the newest segment of a log that was not closed holds a hole a power cut after
    reordered writes left: the offset of its first damage (``items``: its records as
    :func:`records` reads them on past damage) whose records no record read after it says were
    fdatasynced, and that one flipped bit does not explain; None for none.  ``before``: the
    number of the record read before the segment's first (None: not known, nor then any hole).

    A disk writes what came since the last fdatasync in an order of its own: a sector written
    later may be there and one written earlier not.  Nothing in that part had been made durable
    (an fdatasync that returns makes everything before it durable too: a write acknowledged as
    durable is never in it), so it is a write the machine did not finish, cut off there as a
    torn tail.
    A record of a write made after an fdatasync says how far that fdatasync reached
    (:func:`synced_of`): damage to records it reached is damage, whatever else was lost."""
    read = [(pos, None if fault is not None else _unpacked(body), fault) for pos, body, fault in items]
    if not any(rec is not None and synced_of(rec) is not None for _p, rec, _f in read):
        return None  # (written by a build that keeps no such marks: nothing is known)
    prev = before
    for i, (pos, rec, fault) in enumerate(read):
        if rec is not None:
            prev = seq_of(rec)
            continue
        if fault is None or fault[1] is None or prev is None:
            return None
        marks = [m for _p, r, _f in read[i + 1:] if r is not None and (m := synced_of(r)) is not None]
        if max(marks, default=0) <= prev and _one_bit_flipped(data, pos) is None:
            return pos
    return None


def _unpacked(body: bytes) -> list[Any] | None:
    """A record's payload read, or None for one that does not read as a record."""
    try:
        rec = msgpack.unpackb(body, raw=False)
    except Exception:  # msgpack raises several types
        return None
    return rec if well_formed(rec) else None


def key_of(rec: list[Any]) -> Key:
    return (rec[1], rec[2]) if rec[0] != "X" else (rec[1], -1)
