"""The ``rolling-upgrade`` drill's fault: a group started on an older build (``--from REF`` or
``--from-venv PATH``, broker.tools.builds) upgraded node by node under the drill's load, each
node stopped (SIGTERM) and started on this build with its data dir, the group caught up before
the next; then ``tandem upgrade finalize`` or, with ``--rollback``, every node back on the
older build one by one (nothing written before a finalize is beyond it).  Each step's
``tandem upgrade status --json`` is kept in the run's result (``steps``), as a node of this
build sees it (a first-release node does not say: the step says which build each node runs).
"""

from __future__ import annotations

import logging
from typing import Any

import client
from broker.tools.builds import OtherBuild
from broker.tools.checker import classify
from broker.tools.cluster import LocalCluster
from broker.tools.drill.groups import all_active, caught_up_past
from broker.tools.drill.load import Load
from broker.tools.drill.model import DrillConfig
from broker.sessions.upgrade import report
from client.clock import Clock
from client.errors import TandemError

log = logging.getLogger("tandem.drill")


async def status_step(cl: LocalCluster, what: str, builds: dict[str, str], load: Load, clock: Clock) -> dict[str, Any]:
    """One step of the drill: ``what`` was done, ``builds`` says which build each node runs, how
    many messages were sent and confirmed by then (and when: :func:`step_figures`), and the
    upgrade status as the first node on this build sees it."""
    doc: dict[str, Any] = {"step": what, "builds": dict(builds), "sent": len(load.sent),
                           "confirmed": len(load.confirmed), "at": clock.monotonic()}
    new = [n for n, b in builds.items() if b == "new"]
    if new:
        async with await client.connect_link(cl.nodes[new[0]].url, client_name="drill-upgrade") as conn:
            doc["status"] = report(await conn.status())
    return doc


async def rolling_upgrade(cl: LocalCluster, cfg: DrillConfig, old: OtherBuild, clock: Clock, deadline: float,
                          load: Load, steps: list[dict[str, Any]]) -> None:
    """Upgrade ``cl`` (every node on ``old``) to this build node by node, then finalize, or, with
    ``cfg.rollback``, go back to ``old`` node by node; each step appended to ``steps``.  With
    ``cfg.upgrade_hold``: once ``cfg.hold_after`` nodes run this build, the group is held there,
    under the load, for that many seconds before the next node."""
    builds = {name: "old" for name in cl.nodes}
    steps.append(await status_step(cl, f"group up on {old.label}", builds, load, clock))
    load.mark_fault()
    for i, name in enumerate(sorted(cl.nodes, reverse=True), 1):
        await _restart_on(cl, name, None, cfg, clock, deadline)
        builds[name] = "new"
        steps.append(await status_step(cl, f"{name} on this build", builds, load, clock))
        if cfg.upgrade_hold and i == cfg.hold_after and i < len(cl.nodes):
            await clock.sleep(cfg.upgrade_hold)  # the held mixed group is the fault: not a wait for a state
            steps.append(await status_step(cl, f"held {cfg.upgrade_hold:g} s with {i} of {len(cl.nodes)} upgraded",
                                           builds, load, clock))
    if cfg.rollback:
        for name in sorted(cl.nodes):
            await _restart_on(cl, name, old, cfg, clock, deadline)
            builds[name] = "old"
            steps.append(await status_step(cl, f"{name} back on {old.label}", builds, load, clock))
    else:
        async with await client.connect_link(cl.nodes["node1"].url, client_name="drill-upgrade") as conn:
            await conn.finalize_upgrade()
        steps.append(await status_step(cl, "finalized", builds, load, clock))
    load.mark_settled()
    load.after = await all_active(cl, cfg.partitions, deadline, clock)


def step_figures(steps: list[dict[str, Any]], load: Load) -> None:
    """Once the run is checked: each step's figures, for the messages confirmed during it (from
    the step before's end to its own): lost, duplicated, and the longest wait for a confirm of
    a send made during it.  (The first step covers the load before the upgrade began.)"""
    start_at, start_n = float("-inf"), 0
    for step in steps:
        bodies = load.confirmed[start_n:step["confirmed"]]
        wanted = set(bodies)
        v = classify(bodies, bodies, [(b, mid) for b, mid in load.consumed if b in wanted])
        waits = load.waits_during(start_at, step["at"]) if not load.failed else []
        step.update(lost=v.lost, duplicated=v.duplicated, longest_confirm_wait_ms=round(max(waits, default=0) * 1000, 1))
        start_at, start_n = step.pop("at"), step["confirmed"]


async def _restart_on(cl: LocalCluster, name: str, build: OtherBuild | None, cfg: DrillConfig, clock: Clock,
                      deadline: float) -> None:
    """Stop node ``name`` (SIGTERM), start it on ``build`` (None: this one) with its data dir, and
    wait until every partition has an active and every replica holds what was committed by then."""
    p = cl.nodes[name]
    log.info("rolling upgrade: %s to %s", name, build.label if build is not None else "this build")
    await p.stop()
    p.build = build
    try:
        await p.start()
    except TandemError as exc:
        raise TandemError(f"{name} did not start on {build.label if build else 'this build'}: {exc}") from exc
    await cl.wait_ready()
    await caught_up_past(cl, cfg.partitions, deadline, clock)
