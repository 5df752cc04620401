"""ha.lockfile: the LockFile arbiter of a two-node group, transition by transition, on a
fake clock; illegal transitions raise; a scripted pair through link loss, a paused holder
and a takeover never has two nodes serving at once."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from client.testing import FakeClock
from ha.errors import IllegalTransition
from ha.lockfile import SERVING, HaState, LockArbiter, LockEvent, next_state

S = HaState
LEASE = 5.0


def arbiter(name: str = "a") -> tuple[LockArbiter, FakeClock]:
    return LockArbiter(name, lease=LEASE), FakeClock()


def states(changes: list) -> list[tuple[str, str]]:
    return [(c.previous.value, c.present.value) for c in changes]


def test_starts_waiting_and_wants_the_lock() -> None:
    a, clock = arbiter()
    assert a.state is S.WAITING and a.wants_lock and not a.serving(clock.monotonic())


def test_lock_without_a_peer_is_standalone_and_serves_until_the_lease_runs_out() -> None:
    a, clock = arbiter()
    assert states(a.lock_acquired(1, clock.monotonic())) == [("WAITING", "STANDALONE")]
    assert a.serving(clock.monotonic()) and a.may_confirm(1, clock.monotonic()) and not a.wants_lock
    clock.advance(LEASE - 0.1)
    a.renewed(clock.monotonic())
    clock.advance(LEASE - 0.1)
    assert a.serving(clock.monotonic())  # renewed: the lease runs from the renewal
    assert a.tick(clock.monotonic()) == []
    clock.advance(0.2)
    assert not a.serving(clock.monotonic())  # confirms stop the moment the lease is over
    assert states(a.tick(clock.monotonic())) == [("STANDALONE", "WAITING")]
    assert a.wants_lock


def test_lock_with_the_peer_up_syncs_it_then_is_active() -> None:
    a, clock = arbiter()
    assert a.peer_connected() == []  # WAITING stays WAITING: the peer may hold the lock
    assert states(a.lock_acquired(1, clock.monotonic())) == [("WAITING", "STANDALONE"),
                                                             ("STANDALONE", "ACTIVE_SYNC")]
    assert a.serving(clock.monotonic())  # serves while it brings the peer up to date
    assert states(a.synced()) == [("ACTIVE_SYNC", "ACTIVE")]


def test_the_holder_goes_standalone_on_link_loss_and_syncs_again_when_it_heals() -> None:
    a, clock = arbiter()
    a.peer_connected()
    a.lock_acquired(1, clock.monotonic())
    a.synced()
    assert states(a.peer_lost("link cut")) == [("ACTIVE", "STANDALONE")]
    assert a.serving(clock.monotonic())
    assert states(a.peer_connected()) == [("STANDALONE", "ACTIVE_SYNC")]
    assert states(a.peer_lost("cut again")) == [("ACTIVE_SYNC", "STANDALONE")]


def test_the_other_node_follows_a_serving_peer_and_waits_when_it_is_gone() -> None:
    b, clock = arbiter("b")
    b.peer_connected()
    assert states(b.peer_serving(1)) == [("WAITING", "PASSIVE_SYNC")]
    assert not b.serving(clock.monotonic()) and not b.wants_lock
    assert b.peer_serving(1) == []  # its heartbeats repeat it
    assert states(b.synced()) == [("PASSIVE_SYNC", "PASSIVE")]
    assert states(b.peer_lost("link cut")) == [("PASSIVE", "WAITING")]
    assert b.wants_lock
    b.peer_connected()
    b.peer_serving(1)
    assert states(b.peer_lost("cut while syncing")) == [("PASSIVE_SYNC", "WAITING")]


@pytest.mark.parametrize("before", [S.STANDALONE, S.ACTIVE_SYNC, S.ACTIVE])
def test_a_lost_lock_stops_a_serving_node_at_once(before: HaState) -> None:
    a, clock = arbiter()
    if before is not S.STANDALONE:
        a.peer_connected()
    a.lock_acquired(1, clock.monotonic())
    if before is S.ACTIVE:
        a.synced()
    assert a.state is before
    assert states(a.lock_lost("lock file gone")) == [(before.value, "WAITING")]
    assert not a.serving(clock.monotonic()) and not a.may_confirm(1, clock.monotonic())


@pytest.mark.parametrize("before", [S.STANDALONE, S.ACTIVE_SYNC, S.ACTIVE])
def test_a_later_epoch_fences_a_serving_node(before: HaState) -> None:
    a, clock = arbiter()
    if before is not S.STANDALONE:
        a.peer_connected()
    a.lock_acquired(3, clock.monotonic())
    if before is S.ACTIVE:
        a.synced()
    assert a.observe_epoch(3) == [] and a.serving(clock.monotonic())
    assert states(a.observe_epoch(4)) == [(before.value, "WAITING")]
    assert not a.may_confirm(3, clock.monotonic())


def test_an_older_epoch_changes_nothing_and_a_stale_claim_is_ignored() -> None:
    a, clock = arbiter()
    a.peer_connected()
    a.lock_acquired(5, clock.monotonic())
    assert a.observe_epoch(2) == []
    assert a.peer_serving(4) == []  # a stale holder's claim: our epoch 5 fences it
    assert a.serving(clock.monotonic())
    with pytest.raises(IllegalTransition):
        a.peer_serving(5)  # two holders of one epoch: a driver bug, never a state


def test_the_lock_needs_a_new_epoch() -> None:
    a, clock = arbiter()
    a.observe_epoch(7)
    with pytest.raises(IllegalTransition):
        a.lock_acquired(7, clock.monotonic())
    a.lock_acquired(8, clock.monotonic())
    assert a.epoch == 8


def test_stop_from_every_state_and_nothing_after() -> None:
    for before in (S.WAITING, S.STANDALONE, S.ACTIVE_SYNC, S.ACTIVE, S.PASSIVE_SYNC, S.PASSIVE):
        assert next_state(before, LockEvent.STOP) is S.DEAD
    a, _clock = arbiter()
    assert states(a.stop()) == [("WAITING", "DEAD")]
    for call in (a.peer_connected, a.synced, a.stop):
        with pytest.raises(IllegalTransition):
            call()


@pytest.mark.parametrize("state, event", [
    (S.WAITING, LockEvent.SYNCED),
    (S.STANDALONE, LockEvent.SYNCED),
    (S.STANDALONE, LockEvent.LOCK_ACQUIRED),
    (S.STANDALONE, LockEvent.PEER_SERVING),
    (S.ACTIVE, LockEvent.PEER_SERVING),
    (S.PASSIVE_SYNC, LockEvent.LOCK_ACQUIRED),
    (S.PASSIVE, LockEvent.LOCK_ACQUIRED),
    (S.PASSIVE, LockEvent.LOCK_LOST),
    (S.DEAD, LockEvent.PEER_UP),
])
def test_illegal_transitions_raise(state: HaState, event: LockEvent) -> None:
    with pytest.raises(IllegalTransition, match=state.value):
        next_state(state, event)


@dataclass
class LockFile:
    holder: str | None = None
    epoch: int = 0
    until: float = 0.0


def test_a_pair_through_faults_never_has_two_serving() -> None:
    """The driver's part played by the test: one lock file (holder, epoch) both reach."""
    clock = FakeClock()
    a, b = LockArbiter("a", lease=LEASE), LockArbiter("b", lease=LEASE)
    lock = LockFile()

    def try_lock(n: LockArbiter) -> None:
        now = clock.monotonic()
        if n.wants_lock and (lock.holder is None or now >= lock.until):
            lock.holder, lock.epoch, lock.until = n.node, lock.epoch + 1, now + LEASE
            n.lock_acquired(lock.epoch, now)

    def renew(n: LockArbiter) -> None:
        if lock.holder == n.node and n.state in SERVING:
            lock.until = clock.monotonic() + LEASE
            n.renewed(clock.monotonic())

    def check() -> None:
        now = clock.monotonic()
        assert not (a.serving(now) and b.serving(now)), (a.state, b.state)

    a.peer_connected()
    b.peer_connected()
    try_lock(a)
    try_lock(b)  # a holds it
    b.peer_serving(a.epoch)
    b.synced()
    a.synced()
    assert (a.state, b.state) == (S.ACTIVE, S.PASSIVE)
    check()
    # the link between them is cut: a goes on alone, b waits (and cannot take the lock)
    a.peer_lost("cut")
    b.peer_lost("cut")
    for _ in range(10):
        clock.advance(1.0)
        renew(a)
        try_lock(b)
        a.tick(clock.monotonic())
        b.tick(clock.monotonic())
        check()
    assert (a.state, b.state) == (S.STANDALONE, S.WAITING)
    # a is paused (SIGSTOP): no renewal; the lock's lease runs out and b takes it
    clock.advance(LEASE + 0.5)
    try_lock(b)
    assert b.state is S.STANDALONE and b.epoch == 2
    assert not a.serving(clock.monotonic())  # before a even runs again, its lease is over
    check()
    # a wakes (SIGCONT): its tick stops it; the link heals; b's epoch fences whatever a had
    a.tick(clock.monotonic())
    a.peer_connected()
    b.peer_connected()
    a.peer_serving(b.epoch)
    assert a.state is S.PASSIVE_SYNC and not a.may_confirm(1, clock.monotonic())
    assert b.state is S.ACTIVE_SYNC
    a.synced()
    b.synced()
    assert (a.state, b.state) == (S.PASSIVE, S.ACTIVE)
    check()


@pytest.mark.parametrize("before", [S.PASSIVE_SYNC, S.PASSIVE])
def test_a_passive_whose_peer_stops_serving_waits_for_the_lock(before: HaState) -> None:
    b, clock = arbiter("b")
    b.peer_connected()
    b.peer_serving(1)
    if before is S.PASSIVE:
        b.synced()
    assert b.state is before
    assert states(b.peer_idle("peer lost its lock")) == [(before.value, "WAITING")]
    assert b.wants_lock
    b.lock_acquired(2, clock.monotonic())  # the peer is still connected: it syncs it
    assert b.state is S.ACTIVE_SYNC


@pytest.mark.parametrize("state", [S.WAITING, S.STANDALONE, S.ACTIVE_SYNC, S.ACTIVE])
def test_a_peer_serving_nothing_changes_nothing_elsewhere(state: HaState) -> None:
    assert next_state(state, LockEvent.PEER_IDLE) is state


def test_peer_idle_is_illegal_once_dead() -> None:
    with pytest.raises(IllegalTransition):
        next_state(S.DEAD, LockEvent.PEER_IDLE)
