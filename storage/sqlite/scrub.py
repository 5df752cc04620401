"""Read a SQLite store without changing it and check what it can (``tandem scrub``): SQLite's
own page structure (``PRAGMA quick_check``) and every chunk of messages against its CRC-32
(storage.sqlite.reads.check_chunk)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from storage.sqlite.reads import DamagedChunk, check_chunk


def scrub_store(path: Path) -> tuple[int, int, list[str]]:
    """(chunks that passed their checksum, chunks written without one, the damage found); the
    file is opened read-only."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        damage = [f"store {path}: SQLite's quick_check: {row[0]}" for row in conn.execute("PRAGMA quick_check")
                  if row[0] != "ok"]
        good = unchecked = 0
        has_crc = any(row[1] == "crc" for row in conn.execute("PRAGMA table_info(chunks)"))
        crc_column = "crc" if has_crc else "NULL"  # (a store no build with checksums has opened yet)
        for qid, p, start, payload, crc in conn.execute(
                f"SELECT queue_id, partition, start, payload, {crc_column} FROM chunks "
                f"ORDER BY queue_id, partition, start"):
            if crc is None:
                unchecked += 1
                continue
            try:
                check_chunk((qid, p), start, payload, crc)
            except DamagedChunk as exc:
                damage.append(f"store {path}: {exc.message}")
                continue
            good += 1
    finally:
        conn.close()
    return good, unchecked, damage
