"""What makes whole nodes run in one event loop, in virtual time, deterministically, and die.

* :class:`Life`: one life of a node, from its start to its stop or its kill.  Everything the
  node does runs in a ``contextvars.Context`` of the life's (:data:`OWNER`), so the tasks it
  creates (seen by :func:`owned_tasks`, the loop's task factory), the timers it sets (through
  its :class:`NodeClock`) and the store writers it opens (:class:`LoopWriter`) are known to be
  its own, whichever node's code path made them.  A kill cancels those tasks and silences
  those timers and writers, and nothing else.
* :class:`NodeClock`: a node's view of the group's one :class:`client.testing.FakeClock`:
  the same time; its timers run in the node's context, and never once the node is dead.
* :class:`LoopWriter`: the group-commit writer (``storage.writer.GroupCommitWriter``, whose
  commit code it runs) driven from the event loop, its thread never started: what the writer
  takes in one go is what was submitted before the loop's next turn, so batches, callbacks and
  so a seed's whole run are the same every time.  A dead node's writer commits nothing more.
* :class:`SeededRandom`: the replication cores' random election timeouts drawn from the seed.
* :class:`InlineExecutor`: the loop's default executor, so ``asyncio.to_thread`` (the
  store's reads, the engine's open) runs at once on the loop rather than on a thread whose
  timing the schedule cannot control.
* :class:`Driver`: moves virtual time: lets the loop run until it is idle, then advances the
  clock to the next timer, until a deadline or a condition.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import random
import threading
from collections.abc import Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

from client.clock import Cancellable
from client.testing import FakeClock
from storage.writer import Callback, GroupCommitWriter
from storage.base import WriteOp

T = TypeVar("T")

#: the life of the node whose code runs now (None: the test's own code)
OWNER: contextvars.ContextVar[Life | None] = contextvars.ContextVar("tandem_harness_owner", default=None)


class Life:
    """One life of node ``name`` (its ``number``-th start)."""

    def __init__(self, name: str, number: int) -> None:
        self.name, self.number = name, number
        self.tasks: set[asyncio.Task[Any]] = set()
        self.writers: list[LoopWriter] = []
        self.dead = False
        self.context = contextvars.copy_context()
        self.context.run(OWNER.set, self)

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` as the node's own code (tasks it creates are the node's)."""
        return self.context.copy().run(fn, *args)

    def spawn(self, coro: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
        return asyncio.get_running_loop().create_task(coro, name=name, context=self.context.copy())

    def __repr__(self) -> str:
        return f"<life {self.number} of {self.name}{' (dead)' if self.dead else ''}>"


def owned_tasks(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
    """The loop's task factory: a task made in a node's context belongs to that life; a dead
    node starts nothing (a task its dying tasks make is cancelled before it runs)."""
    task: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, **kwargs)
    ctx = kwargs.get("context")
    owner = ctx.get(OWNER) if ctx is not None else OWNER.get()
    if owner is not None:
        owner.tasks.add(task)
        task.add_done_callback(owner.tasks.discard)
        if owner.dead:
            task.cancel()
    return task


class _Silenced:
    """A timer of a dead node's (it never fires)."""

    def cancel(self) -> None:
        pass


class NodeClock:
    """One node's view of the group's FakeClock (a :class:`client.clock.Clock`)."""

    def __init__(self, clock: FakeClock, life: Life) -> None:
        self._clock, self._life = clock, life

    def monotonic(self) -> float:
        return self._clock.monotonic()

    def time(self) -> float:
        return self._clock.time()

    def call_later(self, delay: float, callback: Callable[[], None]) -> Cancellable:
        life = self._life
        if life.dead:
            return _Silenced()

        def fire() -> None:
            if not life.dead:
                life.run(callback)

        return self._clock.call_later(delay, fire)

    async def sleep(self, seconds: float) -> None:
        await self._clock.sleep(seconds)

    def timeout(self, seconds: float | None) -> AbstractAsyncContextManager[Any]:
        return self._clock.timeout(seconds)

    def sleep_blocking(self, seconds: float) -> None:
        raise RuntimeError("a node on the harness never blocks on the clock")


class _NoThread(threading.Thread):
    """The writer's thread, never started."""

    def start(self) -> None:
        pass

    def join(self, timeout: float | None = None) -> None:
        pass


_NO_THREAD = _NoThread(name="tandem-writer (on the loop)")


class LoopWriter(GroupCommitWriter):
    """The store writer of a node on the harness: its thread ends at once, and the loop runs
    its commits (see the module doc).  ``crash()``: the node died; what is pending is lost."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._notify = asyncio.get_running_loop().call_soon  # (on the loop already: no wake-up through a pipe)
        self._owner = OWNER.get()
        if self._owner is not None:
            self._owner.writers.append(self)
        self._turn_due = False
        self._timer: Cancellable | None = None
        self._crashed = False

    @property
    def _thread(self) -> threading.Thread:
        return _NO_THREAD

    @_thread.setter
    def _thread(self, thread: threading.Thread) -> None:
        pass  # (the writer's thread is never started: the loop commits, in _turn)

    def submit(self, ops: list[WriteOp], *, sync: bool, callback: Callback | None = None,
               retry: bool = False, lazy: bool = False) -> None:
        if self._crashed:
            return
        super().submit(ops, sync=sync, callback=callback, retry=retry, lazy=lazy)
        if not self._turn_due:
            self._turn_due = True
            asyncio.get_running_loop().call_soon(self._turn)

    def _turn(self) -> None:
        """Commit what is due, as the thread would when it wakes; a timer for what waits."""
        self._turn_due = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._pending and not self._crashed:
            wait = self._due()
            if wait > 0:
                self._timer = self._clock.call_later(wait, self._turn)
                return
            batch, self._pending = self._pending, []
            self._eager = self._lazy_ops = 0
            self._commit_taken(batch)

    def close(self) -> None:
        """Commit what is pending (a clean stop), then close."""
        with self._cond:
            self._closing = True
        self._turn()
        self._thread.join()

    def crash(self) -> None:
        self._crashed = True
        self._pending = []
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    @property
    def idle(self) -> bool:
        return not self._pending or self._crashed


class SeededRandom:
    """Stands in for the ``random`` module where a node makes the random number generators of
    its replication cores (``broker.modes.replicated.reconcile``): an unseeded ``Random()`` is
    seeded from the group's seed, the node, its life and how many it made before, so that the
    election timeouts of a seed's run are the same every time."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._made: dict[str, int] = {}

    def Random(self, x: object = None) -> random.Random:  # noqa: N802 (as the module's)
        if x is not None:
            return random.Random(x)  # type: ignore[arg-type]
        life = OWNER.get()
        who = f"{self.seed}-{life.name}-{life.number}" if life is not None else f"{self.seed}"
        self._made[who] = n = self._made.get(who, 0) + 1
        return random.Random(f"{who}-{n}")


class InlineExecutor(concurrent.futures.ThreadPoolExecutor):
    """Runs what is submitted at once, in the caller's thread (the loop's)."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        try:
            fut.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # (handed to the awaiting coroutine, as a thread's would be)
            fut.set_exception(exc)
        return fut


class Driver:
    """Moves the group's virtual time.  :meth:`settle` lets every ready callback run until the
    loop is idle (nothing but timers left); :meth:`run_for` and :meth:`until` fire the clock's
    timers in order, settling after each instant."""

    #: passes of the loop with nothing ready that count as idle: one, since a callback scheduled
    #: from any thread lands in the ready queue at once, and no node waits on a real socket
    IDLE_PASSES = 1

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.instants = 0  # instants of virtual time the driver stopped at (a measure of work)

    async def settle(self) -> None:
        loop = asyncio.get_running_loop()
        idle = 0
        while idle < self.IDLE_PASSES:
            await asyncio.sleep(0)
            idle = idle + 1 if not loop._ready else 0  # type: ignore[attr-defined]

    async def run_for(self, seconds: float) -> None:
        await self.until(lambda: False, seconds, fail=False)

    async def until(self, done: Callable[[], bool], timeout: float, *, fail: bool = True,
                    what: str = "the condition") -> bool:
        """Run until ``done()`` (checked at every instant) or ``timeout`` virtual seconds have
        passed: then AssertionError naming ``what`` (``fail``), or False."""
        clock = self.clock
        end = clock.monotonic() + timeout
        while True:
            await self.settle()
            if done():
                return True
            nxt = clock.next_deadline()
            if nxt is None or nxt > end:
                break
            self.instants += 1
            clock.advance(max(0.0, nxt - clock.monotonic()))
        clock.advance(max(0.0, end - clock.monotonic()))
        await self.settle()
        if done():
            return True
        if fail:
            raise AssertionError(f"{what} not reached in {timeout:g} virtual seconds")
        return False
