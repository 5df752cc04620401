"""client.testing.FakeClock: time moves only when the test (or autojump) moves it."""

from __future__ import annotations

import asyncio

import pytest

from client.testing import FakeClock


def test_advance_fires_timers_in_order_at_their_time() -> None:
    clock = FakeClock()
    fired: list[tuple[str, float]] = []
    clock.call_later(2.0, lambda: fired.append(("b", clock.monotonic())))
    clock.call_later(1.0, lambda: fired.append(("a", clock.monotonic())))
    cancelled = clock.call_later(1.5, lambda: fired.append(("x", clock.monotonic())))
    cancelled.cancel()
    clock.advance(0.5)
    assert fired == []
    clock.advance(5.0)
    assert fired == [("a", 1.0), ("b", 2.0)]
    assert clock.monotonic() == 5.5
    with pytest.raises(ValueError):
        clock.advance(-1)


@pytest.mark.asyncio
async def test_autojump_runs_a_long_sleep_at_once() -> None:
    clock = FakeClock(autojump=True)
    await clock.sleep(3600.0)
    assert clock.monotonic() == 3600.0
    await clock.aclose()


@pytest.mark.asyncio
async def test_timeout_expires_on_the_fake_clock() -> None:
    clock = FakeClock(autojump=True)
    with pytest.raises(TimeoutError):
        async with clock.timeout(10.0):
            await clock.sleep(60.0)
    assert clock.monotonic() == 10.0
    async with clock.timeout(10.0):
        await clock.sleep(1.0)
    assert clock.monotonic() == 11.0
    await clock.aclose()


@pytest.mark.asyncio
async def test_timeout_does_not_swallow_an_outside_cancel() -> None:
    clock = FakeClock()

    async def body() -> None:
        async with clock.timeout(10.0):
            await asyncio.Event().wait()

    t = asyncio.ensure_future(body())
    await asyncio.sleep(0)
    t.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t
