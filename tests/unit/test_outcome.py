"""broker.messaging.outcome.Outcome: settled once; listeners run in the settling call; awaitable."""

from __future__ import annotations

import asyncio

import pytest

from broker.messaging.outcome import Outcome


def test_listeners_run_in_the_call_that_settles() -> None:
    o: Outcome[int] = Outcome()
    seen: list[int] = []
    o.add_done_callback(lambda x: seen.append(x.result()))
    assert not o.done() and seen == []
    o.set_result(7)
    assert seen == [7]  # no loop turn in between
    o.add_done_callback(lambda x: seen.append(x.result() * 2))  # settled: at once
    assert seen == [7, 14]
    with pytest.raises(asyncio.InvalidStateError):
        o.set_result(8)


def test_an_error_is_raised_by_result_and_returned_by_exception() -> None:
    o: Outcome[int] = Outcome.failed(ValueError("no"))
    assert isinstance(o.exception(), ValueError)
    with pytest.raises(ValueError):
        o.result()
    with pytest.raises(asyncio.InvalidStateError):
        Outcome().result()


@pytest.mark.asyncio
async def test_awaiting_waits_for_the_result_or_raises_the_error() -> None:
    o: Outcome[str] = Outcome()
    asyncio.get_running_loop().call_soon(o.set_result, "ok")
    assert await o == "ok"
    assert await o == "ok"  # settled: at once
    bad: Outcome[str] = Outcome()
    asyncio.get_running_loop().call_soon(bad.set_exception, KeyError("k"))
    with pytest.raises(KeyError):
        await bad
