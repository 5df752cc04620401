"""The network fault families (``tandem drill FAMILY``, broker/tools/drill/netfaults.py) in
short form, each node in a network namespace of its own, and the namespaces' setup and
teardown (broker/tools/netns.py): nothing of a group is left behind on any exit path.

Root only (namespaces, veth pairs, a bridge, iptables rules).  Every group has its own random
id and subnet, so these tests can run beside any other; the xdist group keeps them on one
worker, one group at a time, for the CPU's sake."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from broker.tools.cluster import LocalCluster
from broker.tools.drill import DrillConfig, drill
from broker.tools.drill.nemesis import NEMESES
from broker.tools.netns import REGISTRY, NetnsGroup, clean_stale, leftovers
from broker.tools.process import NodeStartError
from client.errors import UnavailableError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300), pytest.mark.xdist_group("netns")]
root = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces, veth pairs, a bridge and iptables rules "
                                                    "need root")

FAMILIES = ["isolate-active", "partition", "bridge", "one-way", "one-way-reverse", "flap", "loss"]
# make test runs one fault of each shape (a partition, a one-way cut, flapping, packet loss); the
# long tier the others, whose shapes make test covers elsewhere: the active cut off from the rest
# by the proxy drill partition-active, and isolations, bridges and one-way cuts either way by the
# group harness's seeded schedules (tests/harness/test_group_schedules.py)
LONG = {"isolate-active", "bridge", "one-way-reverse"}


def _mine() -> dict[str, list[str]]:
    """The groups this process registered that are still on the machine."""
    out = {}
    for gid, items in leftovers().items():
        try:
            pid = int((REGISTRY / gid).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        if pid == os.getpid():
            out[gid] = items
    return out


def test_every_network_family_is_registered() -> None:
    assert set(FAMILIES) <= set(NEMESES)
    assert all(NEMESES[f].needs >= {"netns", "root"} for f in FAMILIES)


@pytest.mark.asyncio
async def test_a_network_fault_needs_root_and_netns(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UnavailableError, match="not --net proxy"):
        await drill(DrillConfig("partition", net="proxy"))
    with pytest.raises(UnavailableError, match="isolate-active is its network-namespace counterpart"):
        await drill(DrillConfig("partition-active", net="netns"))
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(UnavailableError, match="^--net netns needs root: "):
        await drill(DrillConfig("isolate-active"))


def test_drill_cli_names_the_network_faults_and_refuses_them_on_proxies() -> None:
    out = subprocess.run([sys.executable, "-m", "broker.cli", "drill", "loss", "--net", "proxy"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "tandem: error: loss cuts links inside the nodes' network namespaces: --net netns (its default), "
        "not --net proxy"], out.stderr
    helped = subprocess.run([sys.executable, "-m", "broker.cli", "drill", "--help"], capture_output=True, text=True,
                            timeout=60)
    assert all(f in helped.stdout for f in FAMILIES) and "--net" in helped.stdout


@root
@pytest.mark.asyncio
@pytest.mark.parametrize("family", [pytest.param(f, marks=pytest.mark.long) if f in LONG else f for f in FAMILIES])
async def test_network_fault_loses_and_duplicates_nothing(family: str, tmp_path: Path) -> None:
    n = 1500  # enough that sends are still in flight when the fault starts
    cfg = DrillConfig(family, producers=1, consumers=1, messages=n, partitions=4, seed=7, data_dir=tmp_path,
                      non_response_timeout=0.5, hold=3.0 if family == "flap" else 2.0, timeout=90)
    try:
        rep = await drill(cfg, repeat=1)
    finally:
        assert _mine() == {}  # the run's namespaces, links and rules are gone
    # a healthy active deposed after the heal fails an isolate-active or partition run: recorded
    # in `deposed`, and the only error allowed here (the messages are what this test checks)
    assert all("deposed after the heal" in e for e in rep["errors"]), rep["errors"]
    assert rep["net"] == "netns" and "network namespace" in rep["group"]
    assert rep["sent"] == n and rep["confirmed"] == n, rep  # every send confirmed, across the fault
    assert (rep["lost"], rep["duplicated"], rep["unexpected"]) == (0, 0, 0), rep
    assert rep["heal_up_ms"]["max"] is not None, rep  # every peer seen Up again after the heal


@root
def test_setup_and_teardown_leave_nothing(tmp_path: Path) -> None:
    net = NetnsGroup(["node1", "node2"])
    try:
        net.setup()
        found = leftovers()[net.id]
        assert {f"netns {ns}" for ns in net.namespaces.values()} <= set(found)
        assert f"link {net.bridge}" in found and all(f"link {v}" in found for v in net.veths.values())
        assert (REGISTRY / net.id).exists()
        net.block("node1", ["node2"])
        net.lose("node2", ["node1"], 0.2)
        assert net.rules("node1") == [f"-A INPUT -s {net.addresses['node2']}/32 -j DROP",
                                      f"-A OUTPUT -d {net.addresses['node2']}/32 -j DROP"]
        assert len(net.rules("node2")) == 1 and "statistic" in net.rules("node2")[0]
        net.clear()
        assert net.rules("node1") == [] and net.rules("node2") == []
    finally:
        net.teardown()
    assert net.id not in leftovers() and not (REGISTRY / net.id).exists()
    net.teardown()  # idempotent


@root
def test_a_setup_that_fails_midway_leaves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    import broker.tools.netns as netns

    net = NetnsGroup(["node1", "node2", "node3"])
    real = netns._run

    def failing(args: list[str], **kw: object) -> str:
        if net.veths["node2"] in args and "add" in args:
            raise UnavailableError("injected failure")
        return real(args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(netns, "_run", failing)
    with pytest.raises(UnavailableError, match="injected failure"):
        net.setup()
    monkeypatch.setattr(netns, "_run", real)
    assert net.id not in leftovers() and not net.up


@root
@pytest.mark.asyncio
async def test_a_group_whose_nodes_fail_to_start_leaves_nothing(tmp_path: Path) -> None:
    cl = LocalCluster(tmp_path, console=False, nodes=2, base_port=0, net="netns", extra_args=["--no-such-flag"])
    assert cl.netns is not None
    with pytest.raises(NodeStartError):
        await cl.start(timeout=60)
    assert cl.netns.id not in leftovers()


@root
def test_leftovers_of_a_crashed_run_are_removed_by_the_next_setup(tmp_path: Path) -> None:
    """A process that set up a group and died without a teardown, a process still running in
    one of its namespaces: the next setup removes them, the process too."""
    code = ("import subprocess, os\n"
            "from broker.tools.netns import NetnsGroup\n"
            "net = NetnsGroup(['node1', 'node2'])\n"
            "net.setup()\n"
            "p = subprocess.Popen([*net.wrap('node1'), 'sleep', '300'], start_new_session=True,\n"
            "                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
            "print(net.id, p.pid, flush=True)\n"
            "os._exit(0)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[2], check=True)
    gid, pid = out.stdout.split()
    try:
        assert gid in leftovers()
        assert Path(f"/proc/{pid}").exists()
        assert gid in clean_stale()
        assert gid not in leftovers() and not (REGISTRY / gid).exists()
    finally:
        clean_stale()
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
