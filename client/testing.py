"""Fakes for tests, public so users' own tests can drive Tandem's timers too.

:class:`FakeClock` is a :class:`client.clock.Clock` whose time moves only when a test moves it
(``advance``) or, with ``autojump=True``, whenever every task on the loop is waiting: it then
jumps straight to the next timer, as trio's ``MockClock(autojump_threshold=0)`` does.  A test of
a reconnect backoff of 2 s or a heartbeat of 30 s runs in milliseconds and is exact.

Autojump only knows about this clock's timers: a task that waits on a real socket or a thread
looks idle to it, so use it where every wait in the code under test goes through the clock.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

#: How many passes of the event loop with nothing ready count as "every task is waiting".
IDLE_PASSES = 3


class FakeTimer:
    """What ``call_later`` returns: ``cancel()`` it before it fires, or never."""

    __slots__ = ("when", "callback", "cancelled")

    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when, self.callback, self.cancelled = when, callback, False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    def __init__(self, start: float = 0.0, *, wall: float = 1_700_000_000.0, autojump: bool = False) -> None:
        self._now = start
        self._wall = wall - start
        self._timers: list[tuple[float, int, FakeTimer]] = []
        self._seq = itertools.count()
        self._autojump = autojump
        self._jumper: asyncio.Task[None] | None = None
        self.jumps = 0

    # -- the Clock protocol ------------------------------------------------------------------

    def monotonic(self) -> float:
        return self._now

    def time(self) -> float:
        return self._wall + self._now

    def call_later(self, delay: float, callback: Callable[[], None]) -> FakeTimer:
        t = FakeTimer(self._now + max(0.0, delay), callback)
        heapq.heappush(self._timers, (t.when, next(self._seq), t))
        self._ensure_jumper()
        return t

    async def sleep(self, seconds: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not fut.done():
                fut.set_result(None)

        t = self.call_later(seconds, wake)
        try:
            await fut
        finally:
            t.cancel()

    def sleep_blocking(self, seconds: float) -> None:
        self.advance(seconds)

    def timeout(self, seconds: float | None) -> AbstractAsyncContextManager[Any]:
        return self._timeout(seconds)

    @asynccontextmanager
    async def _timeout(self, seconds: float | None) -> AsyncIterator[None]:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("FakeClock.timeout needs a running task")
        expired = False

        def expire() -> None:
            nonlocal expired
            expired = True
            task.cancel()

        timer = self.call_later(seconds, expire) if seconds is not None else None
        try:
            yield
        except asyncio.CancelledError:
            if expired and task.uncancel() == 0:
                raise TimeoutError() from None
            raise
        finally:
            if timer is not None:
                timer.cancel()

    # -- moving time -------------------------------------------------------------------------

    def pending(self) -> int:
        """Timers not yet fired nor cancelled."""
        return sum(1 for _w, _s, t in self._timers if not t.cancelled)

    def next_deadline(self) -> float | None:
        self._drop_cancelled()
        return self._timers[0][0] if self._timers else None

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, firing every timer due on the way, in order."""
        if seconds < 0:
            raise ValueError("time does not go back")
        end = self._now + seconds
        while True:
            self._drop_cancelled()
            if not self._timers or self._timers[0][0] > end:
                break
            when, _seq, t = heapq.heappop(self._timers)
            self._now = max(self._now, when)
            t.callback()
        self._now = end

    def _drop_cancelled(self) -> None:
        while self._timers and self._timers[0][2].cancelled:
            heapq.heappop(self._timers)

    def _ensure_jumper(self) -> None:
        if not self._autojump or (self._jumper is not None and not self._jumper.done()):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._jumper = loop.create_task(self._jump_when_idle(), name="FakeClock.autojump")

    async def _jump_when_idle(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            idle = 0
            while idle < IDLE_PASSES:
                await asyncio.sleep(0)
                ready = getattr(loop, "_ready", None)
                idle = idle + 1 if not ready else 0
            deadline = self.next_deadline()
            if deadline is None:
                return
            self.jumps += 1
            self.advance(max(0.0, deadline - self._now))

    async def aclose(self) -> None:
        """Stop autojumping (tests call it, or let the loop's shutdown cancel the task)."""
        if self._jumper is not None:
            self._jumper.cancel()
            try:
                await self._jumper
            except asyncio.CancelledError:
                pass
