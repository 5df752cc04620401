"""Read a SQLite store without changing it and check what it can (``tandem scrub``): SQLite's
own page structure (``PRAGMA quick_check``), every chunk of messages against its CRC-32
(storage.sqlite.reads.check_chunk), every other checked row against its checksums and each
partition's chunks (and applied position, producer positions, settled ranges and delivery
counts) against the digest its row keeps (storage.sqlite.rowsums, storage.sqlite.booksum), and
the catalogue's rows against theirs (storage.sqlite.catalogue_sum)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from storage.sqlite import booksum, catalogue_sum, rowsums
from storage.sqlite.reads import DamagedChunk, check_chunk


@dataclass
class StoreScrub:
    chunks: int = 0  # chunks that passed their checksum
    unchecked: int = 0  # chunks and rows written without one
    rows: int = 0  # other rows that passed their checksums
    damage: list[str] = field(default_factory=list)


def scrub_store(path: Path) -> StoreScrub:
    """What the store at ``path`` holds that passes its checks, and the damage found; the file
    is opened read-only."""
    out = StoreScrub()
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        out.damage = [f"store {path}: SQLite's quick_check: {'; '.join(found.splitlines())}"
                      for found in _quick_check(conn)]
        crc_column = "crc" if "crc" in _columns(conn, "chunks") else "NULL"  # (no build with checksums opened it)
        digests: dict[tuple[int, int], int] = {}
        for qid, p, start, count, payload, crc in conn.execute(
                f"SELECT queue_id, partition, start, count, payload, {crc_column} FROM chunks "
                f"ORDER BY queue_id, partition, start"):
            if type(start) is not int or type(count) is not int:
                out.damage.append(f"store {path}: {rowsums.not_numbers(qid, p)}")
                continue
            digests[(qid, p)] = digests.get((qid, p), 0) ^ rowsums.chunk_hash(start, count)
            if crc is None:
                out.unchecked += 1
                continue
            try:
                check_chunk((qid, p), start, payload, crc)
            except DamagedChunk as exc:
                out.damage.append(f"store {path}: {exc.message}")
                continue
            out.chunks += 1
        for table, sums in rowsums.CHECKED.items():
            if not set(sums) <= _columns(conn, table):
                continue  # (a store no build with these checksums has opened yet: nothing to check)
            for row in conn.execute(rowsums.select(table)):
                if all(v is None for v in row[-len(sums):]):
                    out.unchecked += 1
                    continue
                bad = rowsums.damaged(table, row)
                out.damage.extend(f"store {path}: {why}" for why in bad.values())
                out.rows += not bad
        if "digest" in _columns(conn, "partitions"):
            row = conn.execute("SELECT value FROM meta WHERE key = ?", (rowsums.LEVEL_KEY,)).fetchone()
            level = rowsums.level_of(row[0] if row else None)
            applied = None
            if level >= booksum.LEVEL:
                for key, h in booksum.summed(conn.execute).items():
                    digests[key] = digests.get(key, 0) ^ h
            if level >= rowsums.APPLIED_LEVEL:
                applied = {(qid, p): (idx, term) for qid, p, idx, term in conn.execute(
                    "SELECT queue_id, partition, applied_index, applied_term FROM ha_state WHERE queue_id != 0")}
                for qid, p, pid, seq in conn.execute("SELECT queue_id, partition, producer_id, last_seq FROM producers"):
                    digests[(qid, p)] = digests.get((qid, p), 0) ^ rowsums.producer_hash(pid, seq)
            rows = conn.execute("SELECT queue_id, partition, digest FROM partitions")
            out.damage.extend(f"store {path}: {why}" for why in rowsums.misfits(
                rows, digests, applied, books=level >= booksum.LEVEL).values())
            catalogue = catalogue_sum.misfit(conn.execute) if applied is not None else None
            if catalogue:
                out.damage.append(f"store {path}: {catalogue}")
    finally:
        conn.close()
    return out


def page_check(path: Path) -> list[str]:
    """What SQLite's ``PRAGMA quick_check`` finds wrong with the pages of the store at ``path``,
    before the node opens it (broker.node.store); [] for nothing."""
    conn = sqlite3.connect(path)
    try:
        return [line for found in _quick_check(conn) for line in found.splitlines()]
    except sqlite3.DatabaseError as exc:  # (too damaged to check)
        return [str(exc)]
    finally:
        conn.close()


def _quick_check(conn: sqlite3.Connection) -> list[str]:
    """What ``PRAGMA quick_check`` reports wrong, one item per row it returns."""
    return [row[0] for row in conn.execute("PRAGMA quick_check") if row[0] != "ok"]


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
