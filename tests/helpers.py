"""Test helpers: wait for a condition with a deadline, never sleep blind."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from client.clock import SYSTEM_CLOCK

POLL = 0.01


async def wait_until(predicate: Callable[[], bool | Awaitable[bool]], *, timeout: float = 30.0,
                     what: str = "condition") -> None:
    """Poll ``predicate`` until true; AssertionError naming ``what`` after ``timeout`` seconds."""
    deadline = SYSTEM_CLOCK.monotonic() + timeout
    while True:
        result = predicate()
        if asyncio.iscoroutine(result) or isinstance(result, Awaitable):
            result = await result
        if result:
            return
        if SYSTEM_CLOCK.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await SYSTEM_CLOCK.sleep(POLL)


def wait_until_sync(predicate: Callable[[], bool], *, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(POLL)
