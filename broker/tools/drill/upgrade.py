"""The ``rolling-upgrade`` drill's fault: a group started on an older build (``--from REF`` or
``--from-venv PATH``, broker.tools.builds) upgraded node by node under the drill's load, each
node stopped (SIGTERM) and started on this build with its data dir, the group caught up before
the next; then ``tandem upgrade finalize`` or, with ``--rollback``, every node back on the
older build one by one (nothing written before a finalize is beyond it).  Each step's
``tandem upgrade status --json`` is kept in the run's result (``steps``), as a node of this
build sees it (a first-release node does not say: the step says which build each node runs).
"""

from __future__ import annotations

import json
import logging

import client
from broker.tools.builds import OtherBuild
from broker.tools.cluster import LocalCluster
from broker.tools.drill.groups import all_active, caught_up
from broker.tools.drill.load import Load
from broker.tools.drill.model import DrillConfig
from broker.sessions.upgrade import report
from client.clock import Clock
from client.errors import TandemError

log = logging.getLogger("tandem.drill")


async def status_step(cl: LocalCluster, what: str, builds: dict[str, str], load: Load) -> str:
    """One step of the drill: ``what`` was done, ``builds`` says which build each node runs, how
    many messages were sent and confirmed by then, and the upgrade status as the first node on
    this build sees it (as JSON)."""
    doc: dict[str, object] = {"step": what, "builds": dict(builds), "sent": len(load.sent),
                              "confirmed": len(load.confirmed)}
    new = [n for n, b in builds.items() if b == "new"]
    if new:
        async with await client.connect_link(cl.nodes[new[0]].url, client_name="drill-upgrade") as conn:
            doc["status"] = report(await conn.status())
    return json.dumps(doc, sort_keys=True)


async def rolling_upgrade(cl: LocalCluster, cfg: DrillConfig, old: OtherBuild, clock: Clock, deadline: float,
                          load: Load, steps: list[str]) -> None:
    """Upgrade ``cl`` (every node on ``old``) to this build node by node, then finalize, or, with
    ``cfg.rollback``, go back to ``old`` node by node; each step's status appended to ``steps``."""
    builds = {name: "old" for name in cl.nodes}
    steps.append(await status_step(cl, f"group up on {old.label}", builds, load))
    load.mark_fault()
    for name in sorted(cl.nodes, reverse=True):
        await _restart_on(cl, name, None, cfg, clock, deadline)
        builds[name] = "new"
        steps.append(await status_step(cl, f"{name} on this build", builds, load))
    if cfg.rollback:
        for name in sorted(cl.nodes):
            await _restart_on(cl, name, old, cfg, clock, deadline)
            builds[name] = "old"
            steps.append(await status_step(cl, f"{name} back on {old.label}", builds, load))
    else:
        async with await client.connect_link(cl.nodes["node1"].url, client_name="drill-upgrade") as conn:
            await conn.finalize_upgrade()
        steps.append(await status_step(cl, "finalized", builds, load))
    load.mark_settled()
    load.after = await all_active(cl, cfg.partitions, deadline, clock)


async def _restart_on(cl: LocalCluster, name: str, build: OtherBuild | None, cfg: DrillConfig, clock: Clock,
                      deadline: float) -> None:
    """Stop node ``name`` (SIGTERM), start it on ``build`` (None: this one) with its data dir, and
    wait until every partition has an active and every replica has caught up."""
    p = cl.nodes[name]
    log.info("rolling upgrade: %s to %s", name, build.label if build is not None else "this build")
    await p.stop()
    p.build = build
    try:
        await p.start()
    except TandemError as exc:
        raise TandemError(f"{name} did not start on {build.label if build else 'this build'}: {exc}") from exc
    await cl.wait_ready()
    await caught_up(cl, cfg.partitions, deadline, clock)
