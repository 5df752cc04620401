from __future__ import annotations

import pytest

from ha.partition import (
    STATE_TRANSITIONS,
    IllegalTransition,
    PartitionChanged,
    PartitionLifecycle,
    PartitionState,
    PartitionStatus,
)


def test_define_enable_elect_fail_over_and_disable() -> None:
    seen: list[PartitionChanged] = []
    p = PartitionLifecycle("orders", 3, notifiers=[seen.append])
    p.set_status("define_remote")
    p.set_status("enable_remote")
    assert p.state is PartitionState.INITIAL and p.status is PartitionStatus.REMOTE_ENABLED
    p.set_status("enable_local")
    assert p.state is PartitionState.UNAVAILABLE and not p.serving
    p.on("active_elected")
    assert p.serving
    p.on("replicate")
    p.on("active_lost")
    assert p.state is PartitionState.UNAVAILABLE
    p.on("active_elected")
    p.on("quorum_lost")
    p.on("active_elected")
    p.set_status("disable_local")
    assert (p.state, p.status) == (PartitionState.INITIAL, PartitionStatus.LOCAL_DISABLED)
    states = [c.new_state.value for c in seen if c.new_state != c.old_state]
    assert states == ["Unavailable", "Active", "Replicating", "Unavailable", "Active", "Unavailable", "Active",
                      "Initial"]


def test_illegal_transitions_raise() -> None:
    p = PartitionLifecycle("q", 0)
    with pytest.raises(IllegalTransition):
        p.on("active_elected")  # not enabled yet
    with pytest.raises(IllegalTransition):
        p.set_status("enable_remote")  # not defined
    p.set_status("define_local")
    with pytest.raises(IllegalTransition):
        p.set_status("disable_local")
    p.set_status("enable_local")
    p.on("active_elected")
    with pytest.raises(IllegalTransition):
        p.on("done")  # nothing in progress


def test_every_state_can_be_disabled() -> None:
    assert all((s, "disabled") in STATE_TRANSITIONS for s in PartitionState)


def test_failover_is_reported_and_late_completion_is_harmless() -> None:
    seen: list[PartitionChanged] = []
    p = PartitionLifecycle("q", 1, notifiers=[seen.append])
    p.set_status("define_local")
    p.set_status("enable_local")
    p.on("active_elected")
    n = len(seen)
    p.on("active_elected", "failover to node2")
    assert len(seen) == n + 1 and seen[-1].reason == "failover to node2"
    p.on("migrate")
    p.on("quorum_lost")
    assert p.on("done") is PartitionState.UNAVAILABLE  # the migration ended while unavailable
    with pytest.raises(IllegalTransition):
        p.on("disabled")  # disabling is a status change
