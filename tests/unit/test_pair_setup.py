"""The HA setups the tools start (broker/tools/pair.py): the flags each node gets, the wrong
combinations named by flag, who serves as the nodes' status frames report it; and the drill's
takeover time (fault to the first confirm on the new active) from confirm times."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.tools.drill.load import takeover_time
from broker.tools.pair import HaSetup, group_ready, reported_setup, serving_actives
from client.errors import InvalidArgumentError
from client.protocol.frames import PartitionInfo, StatusOk

PG = "postgresql+psycopg://postgres@127.0.0.1:5432/tandem"


def _part(queue: str, p: int, active: str, role: str) -> PartitionInfo:
    return PartitionInfo(queue=queue, partition=p, state="Active", active=active, role=role, term=1, commit=0, applied=0,
                         last_index=0, replicas=[])


def _status(node: str, *, ha_state: str = "", mode: str = "replicated", arbiter: str = "majority",
            parts: list[PartitionInfo] | None = None, quorum: str = "Active") -> tuple[str, StatusOk]:
    return node, StatusOk(rid=1, node=node, version="x", store_stamp="s", priority=1, votes=1, quorum_state=quorum,
                          quorum_policy="majority", quorum_override=None, remotes=[], partitions=parts or [],
                          events=[], mode=mode, arbiter=arbiter, ha_state=ha_state)


def test_node_flags_of_each_setup(tmp_path: Path) -> None:
    assert HaSetup().node_args(tmp_path) == []
    assert HaSetup(mode="shared", database=PG).node_args(tmp_path) == ["--mode", "shared", "--database", PG]
    assert HaSetup(mode="shared", database=PG, lock="file:/g/t.lock", lease=2.0).node_args(tmp_path) == [
        "--mode", "shared", "--database", PG, "--lock", "file:/g/t.lock", "--lease", "2"]
    assert HaSetup(arbiter="lockfile").node_args(tmp_path) == [
        "--arbiter", "lockfile", "--lockfile", str(tmp_path / "tandem.lock")]
    assert HaSetup(arbiter="lockfile", lockfile="/mnt/g/x.lock").node_args(tmp_path)[-1] == "/mnt/g/x.lock"
    assert HaSetup(arbiter="witness").node_args(tmp_path, "w1=127.0.0.1:9") == [
        "--arbiter", "witness", "--witness", "w1=127.0.0.1:9"]


def test_labels() -> None:
    assert HaSetup().label(1) == "single node"
    assert HaSetup().label(3) == "replicated, 3 nodes"
    assert HaSetup(arbiter="witness").label(2) == "replicated, 2 nodes, witness"
    assert HaSetup(mode="shared", database=PG).label(2) == "shared, 2 nodes, postgresql"
    assert HaSetup(mode="shared", database="sqlite:///x.db", lock="file:/l").label(2) == \
        "shared, 2 nodes, sqlite, lock file:/l"


@pytest.mark.parametrize(("setup", "nodes", "says"), [
    (HaSetup(mode="shared"), 2, "--mode shared needs --database"),
    (HaSetup(mode="shared", database="mysql://x"), 2, "--database: expected"),
    (HaSetup(mode="shared", database=PG, arbiter="lockfile"), 2, "arbitrated by its lock"),
    (HaSetup(mode="shared", database=PG, lock="nfs"), 2, "--lock 'nfs'"),
    (HaSetup(mode="shared", database=PG), 1, "at least 2 nodes"),
    (HaSetup(database=PG), 3, "--database goes with --mode shared"),
    (HaSetup(lock="database"), 3, "--lock goes with --mode shared"),
    (HaSetup(arbiter="lockfile"), 3, "--nodes 2"),
    (HaSetup(arbiter="witness"), 1, "--nodes 2"),
    (HaSetup(lockfile="/x"), 2, "--lockfile goes with --arbiter lockfile"),
    (HaSetup(lease=0.01), 3, "--lease"),
])
def test_wrong_combinations_name_the_flag(setup: HaSetup, nodes: int, says: str) -> None:
    with pytest.raises(InvalidArgumentError, match=says.replace("(", r"\(")):
        setup.check(nodes)


def test_shared_mode_the_one_active_node_serves_every_partition() -> None:
    shared = HaSetup(mode="shared", database=PG)
    a = _status("node1", ha_state="ACTIVE", mode="shared")
    p = _status("node2", ha_state="PASSIVE", mode="shared")
    assert serving_actives(shared, [a, p], "q", 3) == {0: "node1", 1: "node1", 2: "node1"}
    assert group_ready(shared, [a, p]) and not group_ready(shared, [p])
    # partitions it lists win over the count
    listed = _status("node2", ha_state="ACTIVE", mode="shared", parts=[_part("q", 0, "node2", "active")])
    assert serving_actives(shared, [listed], "q", 3) == {0: "node2"}
    # two that say ACTIVE (a stale one not yet fenced): nobody for sure
    assert serving_actives(shared, [a, _status("node2", ha_state="ACTIVE", mode="shared")], "q", 3) == {}
    assert serving_actives(shared, [_status("node1", ha_state="ACTIVATING", mode="shared"), p], "q", 3) == {}
    assert reported_setup([p]).shared


def test_lockfile_only_a_lock_holder_counts_as_active() -> None:
    lock = HaSetup(arbiter="lockfile")
    holder = _status("node1", ha_state="STANDALONE", arbiter="lockfile",
                     parts=[_part("q", 0, "node1", "active"), _part("", 0, "node1", "active")])
    stale = _status("node2", ha_state="WAITING", arbiter="lockfile", parts=[_part("q", 1, "node2", "active")])
    assert serving_actives(lock, [holder, stale], "q") == {0: "node1"}
    # ready once the holder is in step with its peer (ACTIVE): while STANDALONE it may confirm
    # writes the other lacks, and a fault injected then would be a double fault
    in_step = _status("node1", ha_state="ACTIVE", arbiter="lockfile",
                      parts=[_part("q", 0, "node1", "active"), _part("", 0, "node1", "active")])
    passive = _status("node2", ha_state="PASSIVE", arbiter="lockfile", parts=[_part("q", 0, "node1", "replica")])
    assert not group_ready(lock, [holder, stale]) and not group_ready(lock, [stale])
    assert group_ready(lock, [in_step, passive])
    assert reported_setup([stale]).arbiter == "lockfile"


def test_replicated_and_witness_per_partition_as_today() -> None:
    n1 = _status("node1", parts=[_part("q", 0, "node1", "active"), _part("", 0, "node1", "active")])
    n2 = _status("node2", parts=[_part("q", 1, "node2", "active"), _part("q", 0, "node1", "replica")])
    for setup in (HaSetup(), HaSetup(arbiter="witness")):
        assert serving_actives(setup, [n1, n2], "q") == {0: "node1", 1: "node2"}
        assert group_ready(setup, [n1, n2])
    disabled = _status("node1", parts=[_part("", 0, "node1", "active")], quorum="Disabled")
    assert not group_ready(HaSetup(), [disabled])


def test_takeover_is_the_pause_after_the_fault_on_the_targets_partitions() -> None:
    confirms = [(t / 10, 0) for t in range(0, 50)]  # partition 0: a confirm every 0.1 s until 4.9
    confirms += [(5.0, 0), (5.02, 0)]  # the old active's last confirms, read after the kill at 5.0
    confirms += [(6.5 + t / 10, 0) for t in range(0, 30)]  # the new active from 6.5 s
    confirms += [(t / 10, 1) for t in range(0, 100)]  # partition 1: another node's, never paused
    assert takeover_time(confirms, 4.99, 6.6, {0}) == pytest.approx(6.5 - 4.99)
    # a later, longer pause (a failback) after the group served again is not this fault's
    late = confirms + [(20.0, 0)]
    assert takeover_time(late, 4.99, 6.6, {0}) == pytest.approx(6.5 - 4.99)
    # a partition that never paused: no more than the time until the group served again
    quiet = takeover_time(confirms, 4.99, 5.2, {1})
    assert quiet is not None and quiet <= 0.25
    assert takeover_time(confirms, 100.0, None, {0}) is None
