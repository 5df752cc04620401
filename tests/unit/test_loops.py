"""broker.node.tasks.Loops: a loop stopped by name ends; its failure is raised unless dropped;
a cancel aimed at the task that stops it is not swallowed with the loop's own."""

from __future__ import annotations

import asyncio

import pytest

from broker.node.tasks import Loops

pytestmark = pytest.mark.asyncio


async def test_a_stopped_loop_ends_and_stop_returns() -> None:
    loops = Loops()
    loops.start("forever", asyncio.Event().wait())
    task = loops.task("forever")
    await loops.stop("forever")
    assert task is not None and task.cancelled() and loops.task("forever") is None


async def test_a_failed_loop_is_raised_at_its_stop_unless_dropped() -> None:
    async def boom() -> None:
        raise RuntimeError("broken")

    loops = Loops()
    loops.start("a", boom())
    loops.start("b", boom())
    await asyncio.wait([t for t in (loops.task("a"), loops.task("b")) if t is not None])  # (both failed)
    with pytest.raises(RuntimeError, match="broken"):
        await loops.stop("a")
    await loops.stop("b", failed_too=True)


async def test_a_cancel_of_the_stopping_task_reaches_it() -> None:
    started, release, in_cleanup = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def slow_to_stop() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            in_cleanup.set()
            await release.wait()  # its cleanup takes a while

    loops = Loops()
    loops.start("slow", slow_to_stop())
    await started.wait()
    stopper = asyncio.create_task(loops.stop("slow"))
    await in_cleanup.wait()
    stopper.cancel()  # the node's stop is itself cancelled while it waits for the loop
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await stopper
    assert stopper.cancelled()
