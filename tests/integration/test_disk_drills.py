"""The disk fault drills in short form (broker/tools/drill/diskfaults.py, writefaults.py): every node's data dir
on powerfs (or a tmpfs), the fault injected under load, every message checked."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from broker.tools.drill import DrillConfig, drill
from broker.tools.drill.diskfaults import missing
from tests.helpers import wait_until
from broker.tools.drill.nemesis import NEMESES

_why = missing(frozenset({"powerfs", "root"}))
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300), pytest.mark.asyncio,
              pytest.mark.skipif(_why is not None, reason=f"the disk drills cannot run here: {_why}")]


#: the disk families
DISK = ("power-loss", "torn-write", "power-loss-all", "disk-full", "disk-error", "fsync-error", "lying-fsync",
        "lost-write", "misdirected-write", "bad-sector", "torn-write-two", "fsync-error-two", "lying-fsync-two",
        "lost-write-two", "misdirected-write-two", "bad-sector-two", "reordered-write", "reordered-write-two",
        "reordered-write-all")


async def _run(tmp_path: Path, scenario: str, messages: int = 400, seed: int = 7, **kw: Any) -> dict[str, Any]:
    """One run of the drill, its failure detection as quick as the other tests' (FAST).  No
    window of looking for a deposed active after the heal: a disk family does not judge one."""
    cfg = DrillConfig(scenario, producers=1, consumers=1, messages=messages, partitions=4, seed=seed,
                      data_dir=tmp_path, timeout=150, non_response_timeout=0.5, watch=0.0, **kw)
    rep = await drill(cfg, repeat=1)
    print(f"{scenario}: lost {rep['lost']} (reported {rep['reported_lost']}, unreported {rep['unreported_lost']}), "
          f"schedule {rep['schedule']}, errors {rep['errors']}")
    assert rep["schedule"], "the fault left no line in the schedule"
    return rep


#: power-loss-all's restart order under this seed (RESTART_ORDER): node1, node3 1.2 s later, node2
#: 0.7 s after that, each node back about when the one before it has started
POWER_LOSS_ALL_SEED = 1
RESTART_ORDER = "restart order +1.0s node1, +1.2s node3, +0.7s node2"


def _clean(rep: dict[str, Any]) -> None:
    assert rep["sent"] == rep["confirmed"] + rep["failed_sends"]
    assert (rep["duplicated"], rep["unexpected"], rep["unreported_lost"]) == (0, 0, 0), rep


async def test_the_disk_families_are_registered() -> None:
    assert set(DISK) <= set(NEMESES)
    assert not any(NEMESES[name].keeps_actives for name in DISK)


async def test_power_loss_of_the_active_loses_nothing(tmp_path: Path) -> None:
    rep = await _run(tmp_path, "power-loss")
    _clean(rep)
    assert rep["errors"] == [] and rep["lost"] == 0 and rep["passed"], rep
    assert "rolled back" in rep["schedule"][0]


async def test_power_loss_of_every_node_loses_nothing_unreported(tmp_path: Path) -> None:
    """Replicas on WRITE_NO_SYNC (the default) keep an unsynced tail: with every node's
    power gone at once a confirmed message may be lost; it must then be reported.  (Held for
    0.5 s: with every node down nothing happens during the hold, and the restart order's gaps
    keep the group without a quorum for seconds after it.)"""
    rep = await _run(tmp_path, "power-loss-all", seed=POWER_LOSS_ALL_SEED, hold=0.5)
    _clean(rep)
    assert rep["errors"] == [], rep
    assert rep["schedule"][0].endswith(RESTART_ORDER), rep["schedule"]


@pytest.mark.long
async def test_power_loss_of_every_node_with_synced_replicas_loses_nothing(tmp_path: Path) -> None:
    """In the long tier: make test cuts the whole group's power with SYNC replicas in
    tests/integration/test_unclean_stop.py (nothing confirmed lost), and drills power-loss-all
    above with the default policy."""
    rep = await _run(tmp_path, "power-loss-all", seed=POWER_LOSS_ALL_SEED, remote_sync="SYNC")
    _clean(rep)
    assert rep["schedule"][0].endswith(RESTART_ORDER), rep["schedule"]
    assert rep["errors"] == [] and rep["lost"] == 0 and rep["passed"], rep


async def test_disk_full_fails_confirms_and_loses_nothing(tmp_path: Path) -> None:
    """The full node either keeps serving (its disk alarm refuses its publishes, then clears)
    or stops on the ENOSPC line while its disk is full and serves again once the space is
    freed; either way nothing confirmed is lost, duplicated or unexpected."""
    # (enough messages that sends are still in flight while the disk is full)
    rep = await _run(tmp_path, "disk-full", messages=3000)
    _clean(rep)
    assert rep["errors"] == [] and rep["lost"] == 0 and rep["passed"], rep
    fate = [line for line in rep["schedule"] if ": kept serving while its disk was full (" in line
            or ": stopped (status 1) while its disk was full: " in line]
    assert len(fate) == 1, rep["schedule"]
    if "stopped" in fate[0]:
        assert "No space left on device" in fate[0] or "database or disk is full" in fate[0], fate
        assert fate[0].endswith("started again once the space was freed"), fate
    else:
        assert fate[0].endswith("cleared once the space was freed)"), fate
    assert rep["confirmed"] > 0


async def test_disk_error_on_a_replica_loses_nothing(tmp_path: Path) -> None:
    rep = await _run(tmp_path, "disk-error", messages=3000)
    _clean(rep)
    assert rep["errors"] == [] and rep["lost"] == 0 and rep["passed"], rep
    assert rep["failover_ms"]["max"] < 5000, "the actives did not go on with the other replica"


def _nodes(rep: dict[str, Any], family: str) -> list[str]:
    """The nodes a family's fault line (the schedule's first) names: one, two for a ``-two``
    family, every one for an ``-all``."""
    nodes = sorted(set(re.findall(r"node\d+", rep["schedule"][0])))
    assert len(nodes) == (2 if family.endswith("-two") else 3 if family.endswith("-all") else 1), rep
    return nodes


@pytest.mark.parametrize("family", ["fsync-error", "fsync-error-two"])
async def test_a_failed_fsync_stops_the_active_and_loses_nothing(tmp_path: Path, family: str) -> None:
    """Every fsync of the busiest active fails (its writes succeed): it stops at the first one,
    naming it, never confirming what it could not sync; the others take over; started again on
    the working disk, it catches up.  The ``-two`` family fails a second node's fsyncs once the
    first's have failed: the group has no quorum until the heal starts both again."""
    rep = await _run(tmp_path, family, messages=2000)
    _clean(rep)
    for node in _nodes(rep, family):
        failed = next(line for line in rep["schedule"] if f"{family} {node}: " in line
                      and line.endswith("fsync(s) failed"))
        assert int(failed.rsplit(": ", 1)[1].split()[0]) >= 1, rep["schedule"]
        # (the first to fail is the log's fdatasync, never retried, or the store's, a disk I/O error
        # of the commit that SQLite rolled back: either way the node stops there)
        assert any(f": {node} exited (status 1) while its fsyncs failed" in line
                   and (("fdatasync failed" in line and "never retried" in line)
                        or ("to the store failed" in line and "disk I/O error" in line and "this node stops" in line))
                   for line in rep["schedule"]), rep["schedule"]
    assert rep["errors"] == [] and rep["lost"] == 0 and rep["passed"], rep


@pytest.mark.parametrize("family", ["lying-fsync", "lying-fsync-two"])
async def test_fsyncs_that_lie_lose_nothing_and_the_actives_name_what_the_node_lost(tmp_path: Path,
                                                                                   family: str) -> None:
    """Every fsync of the busiest active answers success and syncs nothing; then its power is
    cut: it comes back without entries it had acknowledged.  Nothing confirmed is lost (a quorum
    had each), and the actives it is a replica of name what it lost.  The ``-two`` family: two
    nodes' fsyncs lie at once, their power cut one after the other."""
    rep = await _run(tmp_path, family, messages=2000)
    _clean(rep)
    for node in _nodes(rep, family):
        line = next(line for line in rep["schedule"] if f"{family} {node}: " in line and "lied about" in line)
        assert int(line.split(f"{family} {node}: ", 1)[1].split()[0]) > 0 and "rolled back" in line, rep["schedule"]
        assert "(replica-went-back)" in line, rep["schedule"]
    assert rep["errors"] == [] and rep["lost"] == 0 and rep["passed"], rep


@pytest.mark.parametrize("family", ["lost-write", "lost-write-two"])
async def test_a_lost_write_in_the_log_is_found_at_start_and_loses_nothing(tmp_path: Path, family: str) -> None:
    """One write to the busiest active's log is acknowledged and never made; killed and started
    again, the node finds the hole (or, at its log's very end, cuts it off as a torn tail), catches
    up from the group, and nothing confirmed is lost.  The ``-two`` family loses a later write of
    a second node too, and kills and starts both together: each finds its own."""
    rep = await _run(tmp_path, family, messages=2000)
    _clean(rep)
    for node in _nodes(rep, family):
        line = next(line for line in rep["schedule"] if f"{family} {node}: " in line
                    and "started again" in line)
        assert " lost; kill -9, started again: found (" in line, rep["schedule"]
    assert rep["errors"] == [] and rep["lost"] == 0 and rep["passed"], rep


@pytest.mark.parametrize("family", ["misdirected-write", "misdirected-write-two"])
async def test_a_misdirected_write_in_the_log_is_found_at_start_and_loses_nothing(tmp_path: Path,
                                                                                 family: str) -> None:
    """One write to the busiest active's log lands sectors before its place, over records it had
    written: killed and started again, the node finds the damage, catches up from the group, and
    nothing confirmed is lost.  The ``-two`` family: the same to a later write of a second node."""
    rep = await _run(tmp_path, family, messages=2000)
    _clean(rep)
    for node in _nodes(rep, family):
        line = next(line for line in rep["schedule"] if f"{family} {node}: " in line
                    and "started again" in line)
        assert " landed at byte " in line and "; kill -9, started again: found (log-damaged" in line, \
            rep["schedule"]
    assert rep["errors"] == [] and rep["lost"] == 0 and rep["passed"], rep


@pytest.mark.parametrize("family", ["torn-write", "torn-write-two"])
async def test_a_power_loss_that_tears_the_last_writes_loses_nothing(tmp_path: Path, family: str) -> None:
    """The busiest active's disk rolled back with its last writes torn at a sector: it starts,
    cuts off a record its log now ends inside (saying so), and nothing confirmed is lost.  The
    ``-two`` family: two nodes' power cut together, each disk torn at its own sectors."""
    rep = await _run(tmp_path, family, messages=2000)
    _clean(rep)
    line = rep["schedule"][0]
    nodes = _nodes(rep, family)
    assert f": {family} " in line, rep["schedule"]
    for node in nodes:
        said = line.split(f"{node}: kill -9, ", 1)[1].split("; ")[0]
        assert "kept" in said and "past their last fsync" in said, rep["schedule"]
        if "ends inside a record" in line.split(f"{node}: kill -9, ", 1)[1].split("; ")[1]:
            assert any(x.endswith(f"{family} {node}: the torn record cut off at start") for x in rep["schedule"]), \
                rep["schedule"]
    assert rep["errors"] == [] and rep["lost"] == 0 and rep["passed"], rep


@pytest.mark.parametrize("family", ["reordered-write", "reordered-write-two", "reordered-write-all"])
async def test_a_power_loss_after_reordered_writes_loses_nothing(tmp_path: Path, family: str) -> None:
    """The disk wrote what came since each file's last fsync in an order of its own, and lost
    power midway: any of those sectors made it. The node starts on it (a hole in its log with
    records after it named, one at its end cut off), catches up, and nothing confirmed is lost;
    ``-all`` cuts the whole group's power, its replicas syncing (SYNC)."""
    rep = await _run(tmp_path, family, messages=2000, remote_sync="SYNC")
    _clean(rep)
    line = rep["schedule"][0]
    for node in _nodes(rep, family):
        said = line.split(f"{node}: kill -9, ", 1)[1]
        assert re.match(r"rolled back \d+ B in \d+ file\(s\), kept \d+ B past their last fsync in sectors drawn "
                        r"from seed \d+; its log (holds \d+ hole\(s\) with records after them|has a hole past its last "
                        r"fdatasync|ends inside a record|ends at a whole record)", said), line
        if "ends at a whole record" not in said.split(";")[1]:
            assert f"{family} {node}: the end of its log said (" in " ".join(rep["schedule"]), rep["schedule"]
    assert rep["errors"] == [] and rep["lost"] == 0 and rep["passed"], rep


@pytest.mark.parametrize("family", ["bad-sector", "bad-sector-two"])
async def test_a_sector_the_disk_cannot_read_is_found_and_repaired_and_loses_nothing(tmp_path: Path,
                                                                                    family: str) -> None:
    """A sector of the busiest active's newest log segment fails every read (a latent sector
    error) while it is down: started again, it names the unreadable bytes, reads on past them,
    every copy of the queue catches up, and nothing confirmed is lost.  The ``-two`` family: two
    nodes at once, killed and started together."""
    rep = await _run(tmp_path, family, messages=2000)
    _clean(rep)
    for node in _nodes(rep, family):
        line = next(line for line in rep["schedule"] if f"{family} {node}: injected" in line)
        assert f"{family} {node}: injected 1, detected 1, repaired 1 (log-damaged" in line and "unreadable: " in line, \
            rep["schedule"]
    assert rep["errors"] == [] and rep["lost"] == 0 and rep["passed"], rep


def _mounts_under(path: Path) -> list[str]:
    with open("/proc/mounts", encoding="utf-8") as f:
        return [line.split()[1] for line in f if line.split()[1].startswith(str(path))]


async def test_sigterm_stops_a_drill_and_undoes_its_nodes_and_mounts(tmp_path: Path) -> None:
    """``tandem drill`` stopped with SIGTERM (a supervisor's or a CI job's stop) undoes what it set
    up, as Ctrl-C does: no node process, no mount left, status 143 and one line saying so, and
    no client's error left unread on the way out."""
    env = {**os.environ, "TMPDIR": str(tmp_path), "TANDEM_ADMIN_PASSWORD": "test-password"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "broker.cli", "drill", "lost-write", "--runs", "1", "--messages", "200000",
        "--partitions", "4", "--non-response-timeout", "0.5", env=env, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE)
    try:
        me = psutil.Process(proc.pid)
        started: list[psutil.Process] = []

        def cmdline(c: psutil.Process) -> str:
            try:
                return " ".join(c.cmdline())
            except psutil.Error:  # (gone, or a zombie)
                return ""

        def nodes_up() -> bool:
            started[:] = [c for c in me.children(recursive=True) if "powerfs" not in cmdline(c)]
            return len(_mounts_under(tmp_path)) >= 6 and len(started) >= 3  # (3 tmpfs, 3 powerfs; 3 nodes)

        await wait_until(nodes_up, timeout=120, what="the drill's disks mounted and its nodes started")
        everything = me.children(recursive=True)
        print(f"before SIGTERM: {len(everything)} processes, mounts {_mounts_under(tmp_path)}")
        proc.send_signal(signal.SIGTERM)
        _out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    text = err.decode()
    assert proc.returncode == 143, text[-2000:]
    assert "tandem drill: stopped by SIGTERM" in text and "never retrieved" not in text, text[-2000:]
    assert _mounts_under(tmp_path) == []
    alive = [p for p in everything if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert alive == [], [cmdline(p) for p in alive]
