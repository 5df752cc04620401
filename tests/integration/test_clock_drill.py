"""The clock fault family (broker/tools/drill/clockfaults.py): nodes whose wall clocks are
skewed and jump, and whose monotonic clocks run in time namespaces of their own, lose,
duplicate and reorder nothing."""

from __future__ import annotations

import datetime
import os
import random
import re
from pathlib import Path

import pytest

from broker.tools.cluster import LocalCluster
from broker.tools.drill import DrillConfig, drill
from broker.tools.drill.clockfaults import FaketimeSetup, control_file, set_offset
from tests.helpers import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300),
              pytest.mark.skipif(os.geteuid() != 0, reason="the clock family needs root (unshare --time)")]

_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+ .*session tandem-cluster", re.M)


@pytest.mark.asyncio
async def test_each_node_runs_on_its_own_clocks(tmp_path: Path) -> None:
    """The node is the process the drill started (nsenter execs it), in its holder's time
    namespace with its monotonic offset; its wall clock follows its control file; the holders
    are gone once the setup is closed."""
    cl = LocalCluster(tmp_path, console=False, nodes=2, base_port=0)
    setup = FaketimeSetup(cl, random.Random(5))
    try:
        await setup.prepare()
        await cl.start()
        for name, node in cl.nodes.items():
            holder = setup.holders[name].pid
            assert os.readlink(f"/proc/{node.pid}/ns/time") == os.readlink(f"/proc/{holder}/ns/time")
            assert os.readlink(f"/proc/{node.pid}/ns/time") != os.readlink("/proc/self/ns/time")
            assert Path(f"/proc/{node.pid}/stat").read_text().split()[3] == str(os.getpid())  # our child
            offsets = Path(f"/proc/{node.pid}/timens_offsets").read_text().split()
            assert int(offsets[1]) == int(setup.monotonic[name]) != 0
        set_offset(cl.nodes["node1"], 2 * 3600)

        async def two_hours_ahead() -> bool:
            await cl.status("node1")  # a session: a line in its log, stamped by its wall clock
            stamps = _STAMP.findall(cl.nodes["node1"].log_text())
            last = datetime.datetime.strptime(stamps[-1], "%Y-%m-%d %H:%M:%S")
            ahead = (last - datetime.datetime.now()).total_seconds()
            return abs(ahead - 7200) < 120
        await wait_until(two_hours_ahead, timeout=30, what="node1's wall clock two hours ahead")
    finally:
        holders = list(setup.holders.values())
        await cl.stop()
        await setup.close()
    assert all(p.returncode is not None for p in holders)  # killed and reaped
    assert not setup.holders and not control_file(cl.nodes["node1"]).exists()


@pytest.mark.asyncio
async def test_skewed_and_jumping_clocks_lose_nothing(tmp_path: Path) -> None:
    # seed 11 jumps three clocks at 1.0, 1.1 and 1.6 s of the 3 s hold: each node reads its
    # jump (libfaketime re-reads its control file every second) before the heal
    cfg = DrillConfig("clock", producers=2, consumers=2, messages=1500, partitions=4, seed=11, hold=3,
                      data_dir=tmp_path, timeout=150)
    rep = await drill(cfg, repeat=1)
    assert rep["errors"] == [], rep
    assert rep["sent"] == rep["confirmed"] == 1500
    assert (rep["lost"], rep["duplicated"], rep["unexpected"], rep["reordered"]) == (0, 0, 0, 0)
    assert rep["passed"]
