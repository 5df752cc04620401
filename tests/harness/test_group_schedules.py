"""Seeded schedules of kills, restarts, cuts and heals against a 3-node group with producers
and consumers (tests/harness/schedules.py); after a heal and a drain, the whole queue must
keep the invariants of :meth:`tests.harness.clients.Ledger.violations`: no confirmed message
lost, each message stored once, a redelivery marked as one, nothing unexpected.

``TANDEM_HARNESS_SEEDS`` picks the seeds: a count (``200``, the default: seeds 0..199) or a
range (``1000-1999``); ``TANDEM_HARNESS_SEED`` replays one seed, here with the nodes' log::

    TANDEM_HARNESS_SEED=17 pytest tests/harness/test_group_schedules.py -k invariants -p no:randomly -n 0 \
        -s --log-cli-level=INFO

A failure names every failing seed and that command for the first.  Two planted bugs must be
caught within the same seeds, so the checks can fail: a publish confirmed as soon as it is
proposed, before a quorum has it (a confirmed message lost), and a new active that forgets the
producers' sequences (a resent message stored twice).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from broker.messaging.message import Msg
from broker.messaging.queues import Queue
from broker.messaging.window import Window
from broker.modes.replicated.commit import Proposals
from storage.base import Append, PartitionState
from tests.harness.schedules import Run, run_schedule

pytestmark = pytest.mark.asyncio


def seeds() -> tuple[list[int], bool]:
    """The seeds to run, and whether it is a replay of one seed."""
    one = os.environ.get("TANDEM_HARNESS_SEED", "").strip()
    if one:
        return [int(one)], True
    spec = os.environ.get("TANDEM_HARNESS_SEEDS", "200").strip()
    if "-" in spec:
        low, high = spec.split("-")
        return list(range(int(low), int(high) + 1)), False
    return list(range(int(spec))), False


def replay(seed: int) -> str:
    return (f"replay: TANDEM_HARNESS_SEED={seed} pytest tests/harness/test_group_schedules.py -k invariants "
            f"-p no:randomly -n 0 -s --log-cli-level=INFO")


async def run_seeds(tmp_path: Path, which: list[int]) -> tuple[list[Run], float]:
    started = time.perf_counter()
    runs = [await run_schedule(seed, tmp_path) for seed in which]
    return runs, time.perf_counter() - started


#: the seeds are split over this many tests, which xdist runs on its workers side by side
CHUNKS = 4


@pytest.mark.parametrize("chunk", range(CHUNKS))
async def test_schedules_keep_the_queue_invariants(tmp_path: Path, chunk: int) -> None:
    """Every ``CHUNKS``-th seed from ``chunk`` on (a replay of one seed: chunk 0)."""
    which, one = seeds()
    if one and chunk:
        pytest.skip("a replay of one seed (TANDEM_HARNESS_SEED): chunk 0 runs it")
    which = which[chunk::CHUNKS]
    runs, seconds = await run_seeds(tmp_path, which)
    failed = [r for r in runs if r.violations()]
    sent = sum(len(r.ledger.sent) for r in runs)
    redelivered = sum(len(r.ledger.deliveries) - len({(d.partition, d.offset) for d in r.ledger.deliveries})
                      for r in runs)
    print(f"\n{len(runs)} seeds in {seconds:.1f} s: {sent} messages sent, {redelivered} redeliveries, "
          f"{sum(len(r.steps) for r in runs)} steps, {len(failed)} failed")
    if one:
        print(runs[0].report())
    assert not failed, "\n".join([r.report() for r in failed[:5]] + [replay(failed[0].seed)])
    if not one:  # (a run that sends nothing keeps every invariant)
        assert sent > 20 * len(runs), "the schedules did little work"


async def test_a_confirm_before_the_quorum_has_the_entry_is_caught(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A planted bug: the active confirms a publish as soon as it proposes its entry, before a
    quorum (or even its own disk) has it.  Some seed must then lose a confirmed message."""
    flush = Proposals._flush

    def confirm_at_once(self: Proposals, *, force: bool = False) -> None:
        scheduled = list(self._scheduled)
        before = {id(plog): set(plog.waiters) for plog in scheduled}
        flush(self, force=force)
        for plog in scheduled:
            for index in set(plog.waiters) - before[id(plog)]:
                ops, cbs = plog.waiters[index]
                if any(isinstance(op, Append) for op in ops):
                    plog.waiters[index] = (ops, [])
                    for cb in cbs:
                        cb(None)

    monkeypatch.setattr(Proposals, "_flush", confirm_at_once)
    caught = await first_caught(tmp_path, "lost")
    print(f"\nplanted bug (confirm before the quorum) caught at seed {caught.seed}:\n{caught.report()}")


async def test_an_active_that_forgets_the_producers_sequences_is_caught(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A planted bug: a node that becomes a partition's active loads it without the producers'
    last sequences (and the seqs it learned of them), so a batch resent after a failover is
    stored again.  Some seed must then
    find a message stored twice."""
    load = Queue.load_partition

    def forgetful(self: Queue, pidx: int, st: PartitionState, *, messages: bool = True,
                  windows: Mapping[str, Window] | None = None, ready: list[Msg] | None = None) -> None:
        st.producers = {}
        load(self, pidx, st, messages=messages, ready=ready)

    monkeypatch.setattr(Queue, "load_partition", forgetful)
    caught = await first_caught(tmp_path, "stored more than once")
    print(f"\nplanted bug (producers forgotten) caught at seed {caught.seed}:\n{caught.report()}")


async def first_caught(tmp_path: Path, violation: str) -> Run:
    """The first run, over the seeds, that reports ``violation``."""
    which, one = seeds()
    if one:
        pytest.skip("a replay of one seed (TANDEM_HARNESS_SEED)")
    for seed in which:
        run = await run_schedule(seed, tmp_path)
        if any(violation in v for v in run.violations()):
            return run
    raise AssertionError(f"the planted bug went unnoticed in {len(which)} seeds")
