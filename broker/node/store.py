"""The node's store: its engine, the group-commit writer over it, and the commit path in use.

One object holds what a node writes with, so the parts that write take it rather than the
node: the engine (SQLite, or shared mode's database while this node holds the lock), the
writer that batches commits to it, and the commit path (:mod:`broker.messaging.commit`) that
the HA mode in use puts in front of the writer.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import threading
from collections.abc import Callable
from pathlib import Path

from broker.messaging.commit import CommitPath, Key, LocalCommitPath
from broker.messaging.queues import Queue
from broker.config import NodeConfig
from broker.node.diskalarm import FULL_BELOW, DiskAlarm, free_bytes, full_disk_error
from client.clock import Clock
from client.errors import ShuttingDownError, StorageError
from storage.base import Engine, Recovered, StoredMessage, WriteOp
from storage.sqlite import SqliteEngine
from storage.sqlite.reads import unreadable
from storage.sqlite.scrub import page_check
from storage.writer import Callback, GroupCommitWriter

log = logging.getLogger("tandem.broker")

EngineFactory = Callable[[NodeConfig], Engine]
#: beside the store: why the node last stopped on a damaged store or a failing disk
#: (:meth:`NodeStore.damaged`); its next start checks every page of the store before it serves
DAMAGED_MARK = "-damaged"
#: seconds a stop waits for that note to be written
NOTE_WAIT = 5.0


def sqlite_engine(config: NodeConfig) -> Engine:
    return SqliteEngine(config.db_path, log_segment_bytes=config.log_segment_size)


class NodeStore:
    """The engine, its writer and the commit path; opened at start (or at each shared-mode
    activation), closed at stop."""

    def __init__(self, config: NodeConfig, clock: Clock, engine: Engine, *, shared: bool = False) -> None:
        self.config, self.clock, self.engine = config, clock, engine
        #: shared mode: the engine is the group's database, opened only while holding the lock
        self.shared = shared
        #: whether ``engine`` is open (shared mode: only while this node holds the lock)
        self.open = False
        self._writer: GroupCommitWriter | None = None
        self._commit: CommitPath | None = None
        #: called on the writer thread with each commit's duration and sync flag (metrics); every
        #: writer the node opens shares this list (shared mode opens one per activation)
        self.commit_observers: list[Callable[[float, bool], None]] = []
        #: this store's identity: peers tell a member's stores apart by it (set at start)
        self.stamp = ""
        #: the data directory, resolved at start
        self.data_path: Path = config.data_dir
        #: the disk alarm (broker/node/diskalarm.py): None in shared mode (the data is in the
        #: group's database) and with disk_free_limit = 0
        self.disk_alarm: DiskAlarm | None = None
        #: called (on the loop) when a write or read finds the store's file damaged or unreadable
        #: (storage.sqlite.reads.unreadable): the node stops
        self.on_damage: Callable[[str], None] | None = None
        self._noting: threading.Thread | None = None  # writing the note of damage (damaged())

    def check_disk(self, what: str) -> None:
        """Refuse ``what`` (a write to this node's own store) while the disk alarm is raised."""
        if self.disk_alarm is not None:
            self.disk_alarm.refuse(what)

    @property
    def writer(self) -> GroupCommitWriter:
        if self._writer is None:
            raise ShuttingDownError("the node's store is not open")
        return self._writer

    @property
    def commit(self) -> CommitPath:
        if self._commit is None:
            raise ShuttingDownError("the node is not started")
        return self._commit

    @commit.setter
    def commit(self, path: CommitPath) -> None:
        self._commit = path

    async def check_free(self) -> None:
        """Refuse to start on a disk too full to write anything (one line), and raise the disk
        alarm at once on a nearly full one (with ``disk_free_limit`` set)."""
        cfg = self.config
        free = await asyncio.to_thread(free_bytes, self.data_path)
        if free < FULL_BELOW:
            raise full_disk_error(cfg.name, self.data_path, free)
        if cfg.disk_free_limit > 0:
            self.disk_alarm = DiskAlarm(cfg.name, self.data_path, cfg.disk_free_limit, clock=self.clock)
            self.disk_alarm.update(free)

    async def load_stamp(self, meta: dict[str, str]) -> None:
        """This store's stamp: the one it has, or a new one written to it."""
        if "store_stamp" in meta:
            self.stamp = meta["store_stamp"]
            return
        self.stamp = f"{int(self.clock.time() * 1000):x}-{secrets.token_hex(4)}"
        await asyncio.to_thread(self.engine.set_meta, "store_stamp", self.stamp)

    async def open_engine(self, engine: Engine | None = None) -> Recovered:
        """Open ``engine`` (the node's own by default) and a writer over it; the commit path
        is the single node's until the HA mode puts its own in front."""
        if engine is not None:
            self.engine = engine
        self.engine.load_budget = self.config.max_memory
        await asyncio.to_thread(self._check_after_damage)
        recovered = await asyncio.to_thread(self.engine.open)
        self.open = True
        loop = asyncio.get_running_loop()
        self._writer = GroupCommitWriter(self.engine, loop.call_soon_threadsafe, clock=self.clock)
        self._writer.commit_observers = self.commit_observers

        def failed(err: BaseException) -> None:  # (on the writer thread)
            if unreadable(err):
                loop.call_soon_threadsafe(self.damaged, f"a write to the store failed ({err})")

        self._writer.failure_observers.append(failed)
        self._commit = LocalCommitPath(self._writer, self.config.name, policy=self.config.sync)
        return recovered

    def damaged(self, why: str) -> None:
        """The store's file is damaged, or its disk failed a read, a write or a sync (``why``):
        said, noted beside the store for the next start (:data:`DAMAGED_MARK`), and the node told."""
        log.critical("%s: the store's file is damaged or its disk failed: this node stops (in a group its replicas "
                     "elect another active); tandem scrub --data-dir %s says whether its file is damaged",
                     why, self.data_path)
        mark = self._damaged_mark
        if mark is not None and self._noting is None:
            # (off the loop, on a disk that may hang: the stop waits for it a while, close())
            self._noting = threading.Thread(target=_note, args=(mark, why), name="tandem-damage-note", daemon=True)
            self._noting.start()
        if self.on_damage is not None:
            self.on_damage(why)

    @property
    def _damaged_mark(self) -> Path | None:
        """Where :meth:`damaged` notes why: beside this node's own store file (none in shared
        mode, where the store is the group's database, nor for a store without a file)."""
        path = getattr(self.engine, "path", None)
        return path.with_name(path.name + DAMAGED_MARK) if isinstance(path, Path) and not self.shared else None

    def _check_after_damage(self) -> None:
        """The node last stopped on a damaged store or a failing disk: every page of the store
        read (SQLite's quick_check) before the node serves.  A page still damaged (one that
        opening does not read, an index) refuses the start in one line, rather than start and
        stop again at the next write through it; a store that passes (the disk had failed a
        write or a sync) starts, and the note goes."""
        mark = self._damaged_mark
        if mark is None or not mark.exists():
            return
        why = mark.read_text(encoding="utf-8", errors="replace").strip() or "no reason noted"
        store = mark.with_name(mark.name[:-len(DAMAGED_MARK)])
        found = page_check(store) if store.exists() else []
        if found:
            raise StorageError(f"the store {store} was found damaged when this node stopped ({why}), and "
                               f"SQLite's quick_check finds it damaged still ({'; '.join(found[:3])}): this node "
                               f"does not start: restore its data directory (a member of a group can also be "
                               f"taken out and added back on an empty one, docs/operations.md#remove-a-member)")
        log.warning("store %s: every page reads whole (quick_check) after this node stopped on: %s", store, why)
        mark.unlink()

    def write(self, ops: list[WriteOp], *, sync: bool) -> asyncio.Future[None]:
        """Commit ``ops`` to this node's store now; the future resolves when they are committed."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.writer.submit(ops, sync=sync, callback=_resolver(fut))
        return fut

    def write_later(self, ops: list[WriteOp], callback: Callback | None = None, *, lazy: bool = True) -> None:
        """Write ops nobody waits for: retried until committed; ``callback`` runs then.

        In a group these are partition ops (settlements, marks, counts): they are
        replicated, and fail (callback gets the error) for partitions this node no
        longer serves; the new active redelivers those messages."""
        if ops:
            self.commit.propose(ops, callback, lazy=lazy)

    async def commit_ops(self, key: Key, ops: list[WriteOp]) -> None:
        """Commit a partition's ops as a client's write (durable), and wait for it."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.commit.propose(ops, _resolver(fut), durable=True)
        await fut

    async def read_cold(self, q: Queue, pidx: int, offset: int, limit: int) -> tuple[int, list[StoredMessage]]:
        """The store's log end of the partition, then up to ``limit`` messages from ``offset``. A
        read that finds the store's file damaged or unreadable stops the node (:meth:`damaged`;
        ShuttingDownError)."""
        engine = self.engine

        def read() -> tuple[int, list[StoredMessage]]:
            # the end first: what it says is in the store stays there while the read runs
            end = engine.stored_end(q.meta.id, pidx)
            return end, engine.read(q.meta.id, pidx, offset, limit)

        try:
            return await asyncio.to_thread(read)
        except (StorageError, OSError) as exc:
            if not unreadable(exc):
                raise
            why = f"partition {q.meta.id}/{pidx}: reading its backlog failed ({exc})"
            self.damaged(why)
            raise ShuttingDownError(f"{why}: this node stops") from exc

    async def close(self) -> None:
        """Drain the writer and close the engine (in shared mode, nothing to do on a passive
        that has not opened the group's database)."""
        if self.shared and not self.open and self._writer is None:
            return
        if self._noting is not None:  # (a disk that hangs: the stop goes on without the note)
            await asyncio.to_thread(self._noting.join, NOTE_WAIT)
        self.open = False
        if self._writer is not None:
            await asyncio.to_thread(self._writer.close)
            st = self._writer.stats
            log.info("store writer stats commits=%d synced=%d failed=%d retried_ops=%d ops=%d "
                     "max_batch_ops=%d busy_s=%.2f", st.commits, st.synced_commits, st.failed_commits,
                     st.retried_ops, st.ops, st.max_batch_ops, st.commit_seconds_total)
            self._writer = None
        await asyncio.to_thread(self.engine.close)


def _resolver(fut: asyncio.Future[None]) -> Callback:
    def done(err: BaseException | None) -> None:
        if not fut.done():
            fut.set_exception(err) if err is not None else fut.set_result(None)
    return done


def _note(mark: Path, why: str) -> None:
    """Write ``why`` to ``mark``, synced (NodeStore.damaged, on a thread of its own)."""
    try:
        with open(mark, "w", encoding="utf-8") as f:
            f.write(why + "\n")
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        log.error("could not note the damage in %s (%s): the next start does not check the store first", mark, exc)
