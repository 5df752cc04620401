"""The one clock.  Everything that waits or measures time takes a :class:`Clock`.

Production code uses :class:`SystemClock` (the running asyncio loop); tests of
sans-IO cores pass a fake they advance by hand.  Nothing outside this module
calls ``time.monotonic()`` or ``asyncio.sleep()`` directly.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol


class Cancellable(Protocol):
    def cancel(self) -> Any: ...


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (for timeouts and durations)."""

    def time(self) -> float:
        """Wall-clock seconds since the epoch (for message timestamps)."""

    async def sleep(self, seconds: float) -> None: ...

    def call_later(self, delay: float, callback: Callable[[], None]) -> Cancellable: ...

    def timeout(self, seconds: float | None) -> AbstractAsyncContextManager[Any]:
        """Cancel the enclosed block after ``seconds`` on this clock; it raises TimeoutError."""


class SystemClock:
    """The real clock, on the running asyncio loop."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def call_later(self, delay: float, callback: Callable[[], None]) -> Cancellable:
        return asyncio.get_running_loop().call_later(delay, callback)

    def timeout(self, seconds: float | None) -> AbstractAsyncContextManager[Any]:
        return asyncio.timeout(seconds)

    def sleep_blocking(self, seconds: float) -> None:
        """For code with no event loop (the blocking client, Spark's executors)."""
        time.sleep(seconds)


SYSTEM_CLOCK = SystemClock()


class Backoff:
    """Exponential backoff with full jitter between ``first`` and ``cap`` seconds."""

    def __init__(self, first: float = 0.05, cap: float = 2.0, rng: random.Random | None = None) -> None:
        self.first, self.cap = first, cap
        self.rng = rng or random.Random()
        self.n = 0

    def next(self) -> float:
        d = min(self.cap, self.first * (2 ** self.n))
        self.n = min(self.n + 1, 30)
        return d * (0.5 + self.rng.random() / 2)

    def reset(self) -> None:
        self.n = 0
