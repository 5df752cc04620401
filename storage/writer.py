"""Group commit: one writer thread, one transaction and at most one fsync per batch.

Callers :meth:`~GroupCommitWriter.submit` a list of write ops.  The writer
thread takes *everything* waiting when it becomes free, applies it in a single
transaction (``sync`` if any waiting submission asked for it), then hands all
the callbacks back in one call to ``notify`` (the broker passes
``loop.call_soon_threadsafe``), so the event loop never blocks on the disk and
pays one wake-up per commit, not per message.  Submissions commit in the order
they were made; callbacks run in that order.

*Lazy* submissions (settlements, delivery marks) do not wake the writer: they
ride along with the next eager commit, or are committed on their own once the
oldest has waited ``lazy_delay`` seconds (or ``lazy_max_ops`` pile up).  One
exception to the order: when everything eager in a batch appends to the
replication log and nothing else, those appends are committed first, and the
lazy rest right after, in transactions of about ``LAZY_SLICE_OPS`` ops, with any
append submitted meanwhile going between two of them.  A confirm waits for such an
append (and its fsync); it need not wait for a group's held-back store writes,
which a batch may hold hundreds of (the replication driver's ``HOLD_APPLY``), and
which are of entries the log already has: a crash between the two leaves the
store behind its log, which a restart applies again.

When a commit fails, submissions made with ``retry=False`` (someone is waiting
and can act: a publisher gets an error and may resend) get the error; those
made with ``retry=True`` (nobody can act on an error: an ack already
answered, a NO_SYNC publish already confirmed) go back to the head of the
queue and are tried again after a back-off, and their callbacks run once they
are committed; but not after a :class:`~storage.shared.FencedError` (shared mode: another
node took the lease, and every later write is refused too): then they get the error.

Time: the lazy delay and the back-off are measured on the injected clock.  On the
system clock the thread waits for them with a timed wait; on any other clock (a test's
:class:`client.testing.FakeClock`) a timer on that clock wakes it, so they pass exactly
when that clock says so (``tests/storage/test_writer_clock.py``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from client.clock import SYSTEM_CLOCK, Clock, SystemClock
from client.errors import StorageError
from storage.base import LOG_OPS, Engine, LogAppend, WriteOp

log = logging.getLogger("tandem.storage")

Callback = Callable[[BaseException | None], None]
Notify = Callable[[Callable[[], None]], object]

RETRY_MIN = 0.05
RETRY_MAX = 5.0
LAZY_SLICE_OPS = 512  # lazy ops in one transaction, when log appends are waiting (see _commit_lazy)


@dataclass(slots=True)
class WriterStats:
    commits: int = 0
    ops: int = 0
    synced_commits: int = 0
    failed_commits: int = 0
    retried_ops: int = 0
    commit_seconds_total: float = 0.0
    last_commit_seconds: float = 0.0
    max_batch_ops: int = 0


@dataclass(slots=True)
class _Item:
    ops: list[WriteOp]
    sync: bool
    callback: Callback | None
    retry: bool
    lazy: bool


def _appends_only(item: _Item) -> bool:
    """An eager submission of replication log appends and nothing else.  (Not an empty one:
    that is a barrier, which must wait for everything before it.)"""
    return not item.lazy and bool(item.ops) and all(type(op) is LogAppend for op in item.ops)


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
        self._pending: list[_Item] = []
        self._eager = 0  # pending submissions that want a commit now
        self._lazy_ops = 0
        self._lazy_since = 0.0
        self._retry_at = 0.0  # after a failure: no commit before this
        self._retry_delay = RETRY_MIN
        self.lazy_delay = lazy_delay
        self.lazy_max_ops = 20000
        self._closing = False
        self.stats = WriterStats()
        #: observers called on the writer thread with each commit's duration (metrics).
        self.commit_observers: list[Callable[[float, bool], None]] = []
        #: observers called on the writer thread with each error never tried again (``permanent``)
        self.failure_observers: list[Callable[[BaseException], None]] = []
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, ops: list[WriteOp], *, sync: bool, callback: Callback | None = None,
               retry: bool = False, lazy: bool = False) -> None:
        """Queue ``ops`` for a commit; ``callback(err)`` runs via ``notify`` after it.

        ``lazy``: no need to commit now (see the module doc).  ``retry``: on a
        failed commit, try again rather than report the error.
        """
        item = _Item(ops, sync, callback, retry, lazy)
        with self._cond:
            if self._closing:
                raise StorageError("store writer is closed")
            self._pending.append(item)
            if lazy:
                if not self._lazy_ops:
                    self._lazy_since = self._clock.monotonic()
                self._lazy_ops += len(ops)
                if self._lazy_ops == len(ops) or self._lazy_ops >= self.lazy_max_ops:
                    self._cond.notify()
            else:
                self._eager += 1
                if self._eager == 1:
                    self._cond.notify()

    def close(self) -> None:
        """Commit what is pending, then stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join()

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def _sleep(self, seconds: float) -> None:
        """Wait, the lock held, until notified or ``seconds`` have passed on the clock."""
        if isinstance(self._clock, SystemClock):
            self._cond.wait(seconds)
            return
        timer = self._clock.call_later(seconds, self._wake)
        try:
            self._cond.wait()
        finally:
            timer.cancel()

    def _due(self) -> float:
        """Seconds until the next commit should start (0: now); called under the lock."""
        now = self._clock.monotonic()
        if self._retry_at > now and not self._closing:
            return self._retry_at - now
        if self._eager or self._closing or self._lazy_ops >= self.lazy_max_ops:
            return 0.0
        return max(0.0, self._lazy_since + self.lazy_delay - now)

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if not self._pending:
                        if self._closing:
                            return
                        self._cond.wait()
                        continue
                    wait = self._due()
                    if wait <= 0:
                        break
                    self._sleep(wait)
                batch, self._pending = self._pending, []
                self._eager = self._lazy_ops = 0
            self._commit_taken(batch)

    def _commit_taken(self, batch: list[_Item]) -> None:
        """Commit what the writer took from the queue in one go."""
        eager = [item for item in batch if not item.lazy]
        if eager and len(eager) < len(batch) and all(_appends_only(item) for item in eager):
            self._commit(eager)  # (see the module doc)
            self._commit_lazy([item for item in batch if item.lazy])
        else:
            self._commit(batch)

    def _commit_lazy(self, items: list[_Item]) -> None:
        """Commit lazy submissions in transactions of about LAZY_SLICE_OPS (whole submissions:
        each is all or nothing), and between two, log appends submitted meanwhile: an append
        waits for one slice, not for all of them."""
        while items:
            n, size = 0, 0
            while n < len(items) and (n == 0 or size + len(items[n].ops) <= LAZY_SLICE_OPS):
                size += len(items[n].ops)
                n += 1
            error, requeued = self._commit(items[:n])
            items = items[n:]
            if error is not None and items:
                # The rest fails with it, as it would have in one transaction: a later slice
                # must not commit over writes that did not (its applied position would say
                # they are in the store).  What is to be retried goes back to the queue, after
                # what the failed slice itself put back.
                again = [item for item in items if item.retry and not getattr(error, "permanent", False)]
                if again:
                    with self._cond:
                        self._pending[requeued:requeued] = again
                        self._lazy_ops += sum(len(item.ops) for item in again)
                        self._lazy_since = self._clock.monotonic() - self.lazy_delay  # (with the others)
                kept = {id(item) for item in again}
                self._report([item for item in items if id(item) not in kept], error)
                return
            if items:
                with self._cond:
                    k = 0
                    while k < len(self._pending) and _appends_only(self._pending[k]):
                        k += 1
                    jump, self._pending[:k] = self._pending[:k], []
                    self._eager -= k
                if jump:
                    self._commit(jump)

    def _commit(self, batch: list[_Item]) -> tuple[BaseException | None, int]:
        """Commit ``batch``: its error (None if it committed) and how many of its submissions
        went back to the head of the queue to be tried again."""
        ops: list[WriteOp] = [op for item in batch for op in item.ops]
        sync = any(item.sync for item in batch)
        # does anything but the replication log need the sync? (an engine keeping the log
        # in files of its own then fsyncs those alone for a batch of log appends)
        store_sync = sync and any(item.sync and any(type(op) not in LOG_OPS for op in item.ops) for item in batch)
        started = self._clock.monotonic()
        error: BaseException | None = None
        try:
            self.engine.apply(ops, sync=sync, store_sync=store_sync)
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
        for observer in self.commit_observers:
            try:
                observer(elapsed, sync)
            except Exception:  # a metric's fault must not end the thread every write waits on
                log.exception("commit observer %r failed; the commit stands", observer)
        done = batch
        requeued = 0
        if error is not None:
            st.failed_commits += 1
            # an error marked permanent (shared mode's FencedError: this node may never write
            # again under its epoch) ends retried submissions too
            retrying = not getattr(error, "permanent", False)
            again = [item for item in batch if item.retry and retrying]
            requeued = len(again)
            done = [item for item in batch if not (item.retry and retrying)]
            retried = sum(len(item.ops) for item in again)
            st.retried_ops += retried
            log.error("commit failed ops=%d retrying=%d in=%.2fs error=%s",
                      len(ops), retried, self._retry_delay, error)
            if not retrying:
                for failed in self.failure_observers:
                    failed(error)
            if again:
                with self._cond:
                    self._pending[:0] = again
                    self._eager += sum(1 for item in again if not item.lazy)
                    lazy = sum(len(item.ops) for item in again if item.lazy)
                    if lazy:
                        self._lazy_ops += lazy
                        self._lazy_since = self._clock.monotonic() - self.lazy_delay
                    self._retry_at = self._clock.monotonic() + self._retry_delay
                    self._retry_delay = min(RETRY_MAX, self._retry_delay * 2)
        else:
            self._retry_delay = RETRY_MIN
        self._report(done, error)
        return error, requeued

    def _report(self, items: list[_Item], error: BaseException | None) -> None:
        """Hand the callbacks of ``items`` to the loop, in order, in one call."""
        callbacks = [item.callback for item in items if item.callback is not None]
        if callbacks:
            def run_callbacks() -> None:
                for cb in callbacks:
                    cb(error)

            try:
                self._notify(run_callbacks)
            except RuntimeError as exc:  # the event loop is closed: nobody is left to tell
                log.error("commit callbacks dropped (%d): %s", len(callbacks), exc)
