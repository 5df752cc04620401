"""The durable connection's local send buffer (FioranoMQ's durable connection).

A send made while no node is reachable is written here, in a SQLite file on the
client's disk, and drained in order once a node answers.  Each row belongs to
one (producer id, queue).  Before a buffered message is sent for the first
time its partition and sequence are written to its row, so a client that
restarts mid-drain resends it under the same sequence (the broker drops the
copy it already has) instead of storing it twice.  A row is deleted once the
message is confirmed.

Plain :mod:`sqlite3` with ``synchronous=FULL``: a buffered send survives a
crash of the client's machine, not just of its process.  Calls block; the
durable producer runs them in a worker thread.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

from client.errors import BufferFull, InvalidArgumentError

SCHEMA = """
CREATE TABLE IF NOT EXISTS buffered (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    producer_id TEXT NOT NULL,
    queue TEXT NOT NULL,
    key TEXT,
    headers TEXT NOT NULL,
    body BLOB NOT NULL,
    partition INTEGER,
    seq INTEGER
);
CREATE INDEX IF NOT EXISTS buffered_owner ON buffered (producer_id, queue, id);
"""
ROW_OVERHEAD = 64  # bytes counted per row besides key, headers and body


@dataclass(slots=True)
class Buffered:
    """One buffered message; ``partition`` and ``seq`` are None until first sent."""

    id: int
    key: str | None
    headers: dict[str, str]
    body: bytes
    partition: int | None
    seq: int | None


class SendBuffer:
    """The rows of one (producer id, queue) in the SQLite file at ``path``."""

    def __init__(self, path: str | Path, producer_id: str, queue: str, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise InvalidArgumentError("buffer_max_bytes must be > 0")
        self.path = Path(path)
        self.producer_id = producer_id
        self.queue = queue
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(SCHEMA)
        row = self._db.execute(
            "SELECT COUNT(*), COALESCE(SUM(LENGTH(body) + LENGTH(headers) + COALESCE(LENGTH(key), 0)), 0) "
            "FROM buffered WHERE producer_id = ? AND queue = ?", (producer_id, queue)).fetchone()
        self.count = int(row[0])
        self.bytes = int(row[1]) + ROW_OVERHEAD * self.count

    @staticmethod
    def _size(key: str | None, headers_json: str, body: bytes) -> int:
        return len(body) + len(headers_json) + (len(key) if key else 0) + ROW_OVERHEAD

    def append(self, key: str | None, headers: dict[str, str], body: bytes) -> int:
        """Store one message durably; its row id.  BufferFull past ``max_bytes``."""
        hj = json.dumps(headers, separators=(",", ":"))
        size = self._size(key, hj, body)
        with self._lock:
            if self.bytes + size > self.max_bytes:
                raise BufferFull(f"send buffer {self.path} holds {self.bytes} bytes; this message of {len(body)} "
                                 f"bytes would pass buffer_max_bytes={self.max_bytes}")
            cur = self._db.execute("INSERT INTO buffered (producer_id, queue, key, headers, body) VALUES (?,?,?,?,?)",
                                   (self.producer_id, self.queue, key, hj, body))
            self.bytes += size
            self.count += 1
            assert cur.lastrowid is not None
            return cur.lastrowid

    def load(self, after: int = 0) -> list[Buffered]:
        """The rows with an id above ``after``, oldest first."""
        with self._lock:
            rows = self._db.execute("SELECT id, key, headers, body, partition, seq FROM buffered "
                                    "WHERE producer_id = ? AND queue = ? AND id > ? ORDER BY id",
                                    (self.producer_id, self.queue, after)).fetchall()
        return [Buffered(r[0], r[1], json.loads(r[2]), bytes(r[3]), r[4], r[5]) for r in rows]

    def assign(self, numbered: list[tuple[int, int, int]]) -> None:
        """Record ``(row id, partition, seq)`` before those messages are sent."""
        if not numbered:
            return
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany("UPDATE buffered SET partition = ?, seq = ? WHERE id = ?",
                                     [(p, s, i) for i, p, s in numbered])
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def remove(self, ids: list[int]) -> None:
        """These messages are confirmed: forget them."""
        if not ids:
            return
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                freed = 0
                for i in ids:
                    row = self._db.execute("SELECT key, headers, body FROM buffered WHERE id = ?", (i,)).fetchone()
                    if row is None:
                        continue
                    freed += self._size(row[0], row[1], bytes(row[2]))
                    self._db.execute("DELETE FROM buffered WHERE id = ?", (i,))
                    self.count -= 1
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self.bytes -= freed

    def close(self) -> None:
        with self._lock:
            self._db.close()
