"""WAL checkpoints of the SQLite store, outside of its commits.

SQLite's automatic checkpoint runs inside a commit and stalls the writer for tens of
ms every ~1000 pages, so it is off (``PRAGMA wal_autocheckpoint=0``).  Instead a
background thread copies the WAL into the database (PASSIVE, every
``CHECKPOINT_INTERVAL``), and the writer, between two commits, copies the rest once the
WAL is long (``Checkpointer.due``, then ``Checkpointer.finish``).  That last step is
what lets the WAL start over: under a steady stream of commits the background never
copies the frame the next commit adds, and SQLite reuses the WAL from its start only
once every frame is copied, so without it the file would grow without bound
(``test_the_wal_starts_over_under_a_steady_stream_of_commits``).
"""

from __future__ import annotations

import logging
import sqlite3
import threading

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

log = logging.getLogger("tandem.storage")

CHECKPOINT_INTERVAL = 0.05  # seconds between background WAL checkpoints
#: WAL frames (as the background last saw), or message and log bytes written, after which
#: the writer finishes a checkpoint itself, between two commits, so that the WAL starts
#: over (see Checkpointer.finish)
WAL_RESTART_FRAMES = 2048
WAL_RESTART_BYTES = 8 * 1024 * 1024


class Checkpointer:
    """The background checkpoint thread, and what the writer needs to know to finish one."""

    def __init__(self) -> None:
        self.wal_frames = 0  # the WAL's length in frames at the last background checkpoint
        self.wal_bytes = 0  # message and log bytes committed since the WAL last started over
        self.restarts = 0  # writer checkpoints that copied every frame (the WAL may start over)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, engine: Engine) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(engine,), name="tandem-checkpoint", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self, engine: Engine) -> None:
        """Copy the WAL into the database in the background (PASSIVE: never waits for,
        nor blocks, the writer or readers), every CHECKPOINT_INTERVAL seconds."""
        try:
            conn = engine.connect()
        except SQLAlchemyError as exc:
            log.error("checkpoint thread cannot connect: %s", exc)
            return
        try:
            raw = conn.connection.driver_connection
            assert raw is not None  # an open connection has one
            while not self._stop.wait(CHECKPOINT_INTERVAL):
                try:
                    busy, frames, _copied = raw.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                except sqlite3.Error as exc:  # locked: the next round tries again
                    log.debug("checkpoint skipped: %s", exc)
                    continue
                if not busy and frames >= 0:  # (busy: the writer's own checkpoint holds the lock)
                    self.wal_frames = frames  # the writer finishes the job once the WAL is big
        finally:
            conn.close()

    def due(self) -> bool:
        """Whether the writer should finish a checkpoint after this commit."""
        return self.wal_frames >= WAL_RESTART_FRAMES or self.wal_bytes >= WAL_RESTART_BYTES

    def finish(self, raw: sqlite3.Connection) -> None:
        """Copy what the background has not, between two commits, so that the writer's
        next transaction writes from the WAL's start (PASSIVE: it neither waits for nor
        blocks readers).  The background has copied all but its last round, so this is
        short."""
        try:
            busy, frames, copied = raw.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except sqlite3.Error as exc:
            log.debug("writer checkpoint skipped: %s", exc)
            return
        # busy (the background's round holds the checkpoint lock) reads (1, -1, -1): after
        # the next commit.  Every frame copied: the next transaction starts the WAL over,
        # unless a reader still uses it (then the background's next report asks again).
        if not busy and frames >= 0 and frames == copied:
            self.wal_frames = self.wal_bytes = 0
            self.restarts += 1
