"""``tandem upgrade status`` and ``finalize`` on a group of mixed builds: two nodes of this build
and one of the pinned older commit (a first-release build, which says nothing of its build on
its links).  The finalize is refused, naming the older member, and changes nothing; this
build's tool manages the older node at its protocol version and refuses what it cannot ask of
it in one line; with every member on this build the finalize goes through."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from broker.tools.builds import from_ref
from broker.tools.cluster import LocalCluster
from tests.conftest import PASSWORD
from tests.helpers import wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.timeout(300)]

#: the last commit before this build's first upgrade change (broker 0.1.0, a first-release build)
PINNED = "7443ca57cd344ad588fe7c86adb2ff042aa527b3"


def _tandem(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "broker.cli", *args, "--url", url], capture_output=True, text=True,
                          timeout=60)


async def test_finalize_is_refused_while_a_member_runs_the_older_build(tmp_path: Path) -> None:
    old = from_ref(PINNED)
    cl = LocalCluster(tmp_path, console=False, nodes=3, base_port=0, password=PASSWORD)
    cl.nodes["node3"].build = old
    try:
        await cl.start()
        await cl.wait_ready()
        new_url, old_url = cl.nodes["node1"].url, cl.nodes["node3"].url
        st = _tandem("upgrade", "status", "--json", url=new_url)
        assert st.returncode == 0, st.stderr
        doc = json.loads(st.stdout)
        seen = {m["name"]: m for m in doc["members"]}
        assert seen["node3"]["build"] == "0.1.x" and seen["node3"]["levels"] == [1, 1]
        assert seen["node2"]["build"] == "0.2.0" and seen["node2"]["levels"] == [1, 2]
        assert doc["feature_level"] == 1 and not doc["finalizable"]
        for name in ("node1", "node2"):  # (asked of each: refused there, wherever the catalogue's active is)
            fin = _tandem("upgrade", "finalize", url=cl.nodes[name].url)
            assert fin.returncode == 2 and fin.stdout == ""
            assert fin.stderr.count("\n") == 1, fin.stderr  # one line
            assert "cannot finalize feature level 2" in fin.stderr and "node3 (build 0.1.x supports levels 1..1)" \
                in fin.stderr and "node1 (" not in fin.stderr and "node2 (" not in fin.stderr
        # the older node, managed by this build's tool: its status at protocol 1; no finalize there
        st3 = _tandem("upgrade", "status", "--json", url=old_url)
        assert st3.returncode == 0, st3.stderr
        doc3 = json.loads(st3.stdout)
        assert doc3["build"] == "0.1.0" and doc3["protocol"] == [1, 1] and not doc3["finalizable"]
        fin3 = _tandem("upgrade", "finalize", url=old_url)
        assert fin3.returncode == 2 and fin3.stderr.count("\n") == 1 and "Traceback" not in fin3.stderr
        assert "runs a build without feature levels" in fin3.stderr
        # nothing changed: the older node still serves, the group is at level 1
        assert json.loads(_tandem("upgrade", "status", "--json", url=new_url).stdout)["feature_level"] == 1
        # node3 on this build: the finalize goes through, on every member
        p = cl.nodes["node3"]
        await p.stop()
        p.build = None
        await p.start()
        await cl.wait_ready()
        ok = _tandem("upgrade", "finalize", url=new_url)
        assert ok.returncode == 0, ok.stderr
        assert ok.stdout.startswith("group finalized at feature level 2")
        for name in cl.nodes:  # (applied on the node asked when it answers; on the others as they apply the entry)
            await wait_until(lambda name=name: _level(cl, name, 2), timeout=15, what=f"{name} at feature level 2")
    finally:
        await cl.stop()


async def _level(cl: LocalCluster, name: str, level: int) -> bool:
    return (await cl.status(name)).feature_level == level
