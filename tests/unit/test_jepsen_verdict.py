"""A jepsen run's verdict counts what its families found wrong beyond the messages (a damaged
record the node did not find): each fault's ``said`` and ``failures`` in the timeline, and a
failure fails the run whatever the checker says (broker/tools/drill/jepsen.py)."""

from __future__ import annotations

import random
from typing import Any

from broker.tools.drill import DrillConfig
from broker.tools.drill.jepsen import Fault, _Runner
from broker.tools.drill.load import Load
from broker.tools.drill.nemesis import FaultContext
from client.clock import SYSTEM_CLOCK


def _runner(said: list[str]) -> _Runner:
    return _Runner(DrillConfig("jepsen", seed=3), ["lost-write"], 30.0, 100.0, SYSTEM_CLOCK, said.append)


def _load(cfg: DrillConfig) -> Load:
    """A load whose one message was sent, confirmed and consumed once: the checker passes it."""
    load = Load(None, cfg, 1, random.Random(0), SYSTEM_CLOCK)
    load.sent, load.confirmed, load.consumed = [b"m"], [b"m"], [(b"m", "id-1")]
    return load


def _judged(runner: _Runner) -> dict[str, Any]:
    rep: dict[str, Any] = {"error": ""}
    runner._judge(rep, _load(runner.cfg))
    return rep


def test_what_a_family_said_is_kept_and_its_failures_fail_the_run() -> None:
    said: list[str] = []
    runner = _runner(said)
    fault = Fault(1, "lost-write", 2.0, 1.0, 7)
    ctx = FaultContext(None, runner.cfg, SYSTEM_CLOCK, random.Random(0))
    entry: dict[str, Any] = {"index": 1}
    runner.timeline.append(entry)
    assert _judged(runner)["passed"]  # (the checker alone passes it)
    ctx.schedule.append("lost-write node1: the write of 10 B at byte 4 of 1.seg lost; kill -9, started again: NOT found")
    ctx.failures.append("lost-write node1: the write of 10 B at byte 4 of 1.seg lost, and the node did not find it")
    runner._said(fault, ctx, entry)
    assert entry["said"] == ctx.schedule and entry["failures"] == ctx.failures
    assert any("#1 FAILED: lost-write node1" in line for line in said)
    assert not _judged(runner)["passed"]
