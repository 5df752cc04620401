"""The rolling-upgrade drill from a pinned older commit of this repository (the last one before
feature levels and negotiated builds: a first-release build, protocol 1, level 1): a 3-node
group on it under producers and consumers on durable connections, each node stopped and
started on this build with its data dir, then finalized, or, in the second run, every node
put back on the older build before a finalize.  The checker counts lost, duplicated and
unexpected; every step's ``tandem upgrade status --json`` is in the report."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import client
from broker import __version__
from broker.tools.builds import REPO, from_ref
from broker.tools.drill import DrillConfig, drill
from broker.tools.process import NodeProcess
from ha.upgrade import LEVEL_MAX
from tests.integration.test_upgrade import PINNED

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]



def _config(tmp_path: Path, rollback: bool, hold: float) -> DrillConfig:
    return DrillConfig("rolling-upgrade", producers=2, consumers=2, messages=600, partitions=4, seed=11,
                       data_dir=tmp_path, timeout=200, from_ref=PINNED, rollback=rollback, steady_rate=400,
                       non_response_timeout=0.5, hold_after=2, upgrade_hold=hold)


@pytest.mark.asyncio
@pytest.mark.parametrize("rollback,hold", [(False, 0.0), (True, 0.0), (False, 3.0)],
                         ids=["finalize", "rollback", "majority-held-then-finalize"])
async def test_a_group_upgraded_node_by_node_under_load_loses_nothing(tmp_path: Path, rollback: bool,
                                                                      hold: float) -> None:
    rep = await drill(_config(tmp_path, rollback, hold))
    assert rep["errors"] == [], rep["errors"]
    assert (rep["lost"], rep["duplicated"], rep["unexpected"]) == (0, 0, 0), rep
    assert rep["failed_sends"] == 0 and rep["confirmed"] == rep["sent"] > 600
    assert rep["failover_ms"]["max"] < 4000, rep["failover_ms"]
    steps = rep["steps"]
    names = [s["step"] for s in steps]
    expected = ["group up on 7443ca5", "node3 on this build", "node2 on this build",
                *(["held 3 s with 2 of 3 upgraded"] if hold else []), "node1 on this build"]
    expected += ["node1 back on 7443ca5", "node2 back on 7443ca5", "node3 back on 7443ca5"] if rollback \
        else ["finalized"]
    assert names == expected
    confirmed = [s["confirmed"] for s in steps]
    assert confirmed == sorted(confirmed) and len(set(confirmed)) == len(confirmed), confirmed  # load throughout
    for s in steps:  # every step on its own: nothing lost or stored twice, no confirm waiting 4 s
        assert (s["lost"], s["duplicated"]) == (0, 0) and s["longest_confirm_wait_ms"] < 4000, s
    for s in [s for s in steps if s["step"].endswith("on this build")]:  # level 1, old and new side by side
        st = s["status"]
        assert st["feature_level"] == 1 and st["feature_levels"] == [1, LEVEL_MAX]
        seen = {m["name"]: m for m in st["members"]}
        for name, build in s["builds"].items():
            assert seen[name]["build"] == ("0.1.x" if build == "old" else __version__), (s["step"], seen[name])
            assert seen[name]["levels"] == ([1, 1] if build == "old" else [1, LEVEL_MAX])
        assert st["finalizable"] == (s["step"] == "node1 on this build"), st["finalize_refusal"]
    if not rollback:
        final = steps[-1]["status"]
        assert final["feature_level"] == LEVEL_MAX and not final["finalizable"]
        assert f"at feature level {LEVEL_MAX} already" in final["finalize_refusal"]


@pytest.mark.asyncio
async def test_the_older_build_refuses_a_finalized_store_in_one_line(tmp_path: Path) -> None:
    """After the finalize a node's store is stamped schema version 4: the older build stops at
    once with one line naming it; the rollback run above shows it starts before the finalize."""
    old = from_ref(PINNED)
    p = NodeProcess(tmp_path / "n1", name="node1", password="upgrade-pass")
    await p.start()
    try:
        async with await client.connect_link(p.url) as conn:
            await conn.declare_queue("q")
            st = await conn.finalize_upgrade()
        assert st.feature_level == LEVEL_MAX
    finally:
        await p.stop()
    out = subprocess.run([*old.command(), "broker", "start", "--name", "node1", "--data-dir", str(tmp_path / "n1"),
                          "--port", "0"], env={**old.env(), "TANDEM_ADMIN_PASSWORD": "upgrade-pass"},
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 2
    last = out.stderr.strip().splitlines()[-1]
    assert last == f"tandem: error: store {tmp_path / 'n1' / 'tandem.db'} has schema version 4, this build reads 3"
    assert "Traceback" not in out.stderr and "Traceback" not in out.stdout


def test_the_pinned_commit_is_an_ancestor_of_this_one() -> None:
    """The drill's older build is this repository's own history, not another tree."""
    out = subprocess.run(["git", "-C", str(REPO), "merge-base", "--is-ancestor", PINNED, "HEAD"], check=False)
    assert out.returncode == 0
