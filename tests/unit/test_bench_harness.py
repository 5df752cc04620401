"""The bench harness against an in-memory driver: each phase on a queue of its own.

The stub broker behaves as RabbitMQ does when a consumer's connection closes with
deliveries it had not acked: it delivers them again to the next consumer of that queue.
Were both phases on one queue, the latency phase's checker would count those as unexpected
and the bench would fail for a peer's reason.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from broker.tools.bench.harness import run_system
from broker.tools.bench.workload import Checker, Publisher, Workload, id_of

pytestmark = pytest.mark.asyncio


class _Queue:
    def __init__(self) -> None:
        self.ready: asyncio.Queue[bytes] = asyncio.Queue()


class StubDriver:
    """A broker in memory.  Each consumer leaves ``unacked_at_close`` of what it got unacked
    when it is cancelled, and the queue delivers those again to its next consumer."""

    name = "stub"
    durability = "memory"

    def __init__(self, *, unacked_at_close: int) -> None:
        self.unacked_at_close = unacked_at_close
        self.queues: dict[str, _Queue] = {}
        self.current = ""
        self.setups = 0

    async def setup(self, w: Workload) -> None:
        self.setups += 1
        self.current = f"q-{uuid.uuid4().hex[:6]}"
        self.queues[self.current] = _Queue()

    async def publisher(self, w: Workload) -> Publisher:
        q = self.queues[self.current]

        async def submit(body: bytes) -> Any:
            q.ready.put_nowait(body)

        return Publisher(submit, window=w.window)

    async def consume(self, w: Workload, checker: Checker) -> None:
        q = self.queues[self.current]
        got: list[bytes] = []
        try:
            while True:
                body = await q.ready.get()
                got.append(body)
                checker.record(body)
        finally:  # closed with the last few unacked: the broker delivers them again
            for body in got[len(got) - self.unacked_at_close:]:
                q.ready.put_nowait(body)

    async def teardown(self) -> None:
        self.queues.clear()


async def test_each_phase_runs_on_a_fresh_queue_so_a_peers_redeliveries_do_not_count() -> None:
    drv = StubDriver(unacked_at_close=5)
    w = Workload(messages=200, latency_rate=2000.0, latency_messages=50, timeout=30)
    res = await run_system(drv, w)
    assert res.error is None, res.error
    assert (res.confirmed, res.consumed) == (200, 200)
    assert (res.lost, res.duplicated, res.unexpected) == (0, 0, 0)
    assert drv.setups == 2
    assert res.confirm_ms["p50"] > 0


async def test_the_checker_still_sees_a_queue_that_delivers_twice_within_a_phase() -> None:
    """The fresh queue hides nothing within a phase: a broker that delivers a message twice
    to the same consumer is still counted as duplicated."""

    class Doubling(StubDriver):
        async def publisher(self, w: Workload) -> Publisher:
            q = self.queues[self.current]

            async def submit(body: bytes) -> Any:
                q.ready.put_nowait(body)
                if id_of(body) == 0:
                    q.ready.put_nowait(body)

            return Publisher(submit, window=w.window)

    drv = Doubling(unacked_at_close=0)
    w = Workload(messages=100, latency_rate=0, latency_messages=0, timeout=30)
    res = await run_system(drv, w)
    assert res.duplicated == 1
