"""Group commit: one writer thread, one transaction and at most one fsync per batch.

Callers :meth:`submit` a list of write ops with a completion callback.  The
writer thread takes *everything* waiting when it becomes free, applies it in a
single transaction (``sync`` if any waiting submission asked for it), then hands
all the callbacks back in one call to ``notify`` (the broker passes
``loop.call_soon_threadsafe``), so the event loop never blocks on the disk and
pays one wake-up per commit, not per message.

Submissions commit in the order they were made; callbacks run in that order.

*Lazy* submissions (settlements: acks, delivery counts) do not wake the writer:
they ride along with the next eager commit, or are committed on their own once
the oldest has waited ``lazy_delay`` seconds (or ``lazy_max_ops`` pile up).
That turns the stream of small ack commits between publish commits into
nothing, which is most of the writer's time saved on a busy queue.
"""

from __future__ import annotations

import logging
import threading

from collections.abc import Callable
from dataclasses import dataclass

from client.errors import StorageError
from client.clock import SYSTEM_CLOCK, Clock
from storage.base import Engine, WriteOp

log = logging.getLogger("tandem.storage")

Callback = Callable[[BaseException | None], None]
Notify = Callable[[Callable[[], None]], object]


@dataclass(slots=True)
class WriterStats:
    commits: int = 0
    ops: int = 0
    synced_commits: int = 0
    failed_commits: int = 0
    commit_seconds_total: float = 0.0
    last_commit_seconds: float = 0.0
    max_batch_ops: int = 0


class GroupCommitWriter:
    """Owns the engine's write side on a dedicated thread."""

    def __init__(
        self, engine: Engine, notify: Notify, *, clock: Clock = SYSTEM_CLOCK, name: str = "tandem-writer",
        lazy_delay: float = 0.02,
    ) -> None:
        self._clock = clock
        self.engine = engine
        self._notify = notify
        self._cond = threading.Condition()
        self._pending: list[tuple[list[WriteOp], bool, Callback | None]] = []
        self._eager = 0  # pending submissions that want a commit now
        self._lazy_ops = 0
        self._lazy_since = 0.0
        self.lazy_delay = lazy_delay
        self.lazy_max_ops = 20000
        self._closing = False
        self.stats = WriterStats()
        #: observers called on the writer thread with each commit's duration (metrics).
        self.commit_observers: list[Callable[[float, bool], None]] = []
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, ops: list[WriteOp], *, sync: bool, callback: Callback | None = None) -> None:
        """Queue ``ops`` for the next commit; ``callback(err)`` runs via ``notify`` after it."""
        with self._cond:
            if self._closing:
                raise StorageError("store writer is closed")
            self._pending.append((ops, sync, callback))
            self._eager += 1
            if self._eager == 1:
                self._cond.notify()

    def submit_lazy(self, ops: list[WriteOp]) -> None:
        """Queue ``ops`` for a commit that need not happen now (nobody waits for it)."""
        with self._cond:
            if self._closing:
                raise StorageError("store writer is closed")
            if not self._lazy_ops:
                self._lazy_since = self._clock.monotonic()
            self._pending.append((ops, False, None))
            self._lazy_ops += len(ops)
            if self._lazy_ops == len(ops) or self._lazy_ops >= self.lazy_max_ops:
                self._cond.notify()

    def close(self) -> None:
        """Commit what is pending, then stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._eager or self._closing or self._lazy_ops >= self.lazy_max_ops):
                    if not self._pending:
                        self._cond.wait()
                        continue
                    wait = self._lazy_since + self.lazy_delay - self._clock.monotonic()
                    if wait <= 0:
                        break
                    self._cond.wait(wait)
                if not self._pending:
                    return
                batch, self._pending = self._pending, []
                self._eager = self._lazy_ops = 0
            self._commit(batch)

    def _commit(self, batch: list[tuple[list[WriteOp], bool, Callback | None]]) -> None:
        ops: list[WriteOp] = []
        sync = False
        for item_ops, item_sync, _cb in batch:
            ops.extend(item_ops)
            sync = sync or item_sync
        started = self._clock.monotonic()
        error: BaseException | None = None
        try:
            self.engine.apply(ops, sync=sync)
        except StorageError as exc:
            error = exc
        except Exception as exc:  # an engine bug must not kill the writer thread
            error = StorageError(f"unexpected store failure: {exc!r}", orig=exc)
        elapsed = self._clock.monotonic() - started
        st = self.stats
        st.commits += 1
        st.ops += len(ops)
        st.synced_commits += sync
        st.commit_seconds_total += elapsed
        st.last_commit_seconds = elapsed
        st.max_batch_ops = max(st.max_batch_ops, len(ops))
        if error is not None:
            st.failed_commits += 1
            log.error("commit failed ops=%d error=%s", len(ops), error)
        for observer in self.commit_observers:
            observer(elapsed, sync)
        callbacks = [cb for _o, _s, cb in batch if cb is not None]
        if callbacks:
            def run_callbacks() -> None:
                for cb in callbacks:
                    cb(error)
            self._notify(run_callbacks)
