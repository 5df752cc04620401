"""ha.shared: the shared-mode arbiter, transition by transition, on a fake clock; illegal
transitions raise; a stale active (paused past its lease) never serves beside the new one."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from client.testing import FakeClock
from ha.errors import IllegalTransition
from ha.shared import SharedArbiter, SharedEvent, SharedState, next_state

S = SharedState
LEASE = 3.0


def states(changes: list) -> list[tuple[str, str]]:
    return [(c.previous.value, c.present.value) for c in changes]


def active(name: str, clock: FakeClock, epoch: int = 1) -> SharedArbiter:
    n = SharedArbiter(name, lease=LEASE)
    n.lease_acquired(epoch, clock.monotonic())
    n.activated()
    return n


def test_passive_takes_the_lease_activates_then_serves() -> None:
    clock = FakeClock()
    n = SharedArbiter("a", lease=LEASE)
    assert n.state is S.PASSIVE and n.wants_lease and not n.serving(clock.monotonic())
    assert states(n.lease_acquired(1, clock.monotonic())) == [("PASSIVE", "ACTIVATING")]
    assert not n.serving(clock.monotonic())  # loading: clients still wait
    assert states(n.activated()) == [("ACTIVATING", "ACTIVE")]
    assert n.serving(clock.monotonic()) and not n.wants_lease and n.epoch == 1


def test_renewals_extend_the_deadline_from_when_they_were_sent() -> None:
    clock = FakeClock()
    n = active("a", clock)
    clock.advance(2.0)
    n.renewal_sent(clock.monotonic())  # at t=2
    clock.advance(0.5)
    n.renewal_granted()  # the grant counts from t=2, not t=2.5
    assert n.deadline == 2.0 + LEASE
    clock.advance(2.49)
    assert n.serving(clock.monotonic()) and n.tick(clock.monotonic()) == []
    clock.advance(0.02)
    assert not n.serving(clock.monotonic())
    assert states(n.tick(clock.monotonic())) == [("ACTIVE", "PASSIVE")]


def test_an_unanswered_renewal_does_not_extend_the_lease() -> None:
    clock = FakeClock()
    n = active("a", clock)
    clock.advance(1.0)
    n.renewal_sent(clock.monotonic())  # the database does not answer
    clock.advance(LEASE)
    assert states(n.tick(clock.monotonic())) == [("ACTIVE", "PASSIVE")]
    n.renewal_granted()  # a late answer after stepping down changes nothing
    assert n.state is S.PASSIVE and not n.serving(clock.monotonic())


@pytest.mark.parametrize("activate", [False, True])
def test_a_fencing_refusal_or_a_refused_renewal_steps_down(activate: bool) -> None:
    clock = FakeClock()
    for lose in ("fenced", "refused"):
        n = SharedArbiter("a", lease=LEASE)
        n.lease_acquired(4, clock.monotonic())
        if activate:
            n.activated()
        before = n.state.value
        changes = n.fenced(5) if lose == "fenced" else n.renewal_refused("lease held by b")
        assert states(changes) == [(before, "PASSIVE")]
        assert not n.serving(clock.monotonic()) and n.wants_lease
        assert n.fenced(5) == []  # passive already: nothing more to give up


def test_a_new_lease_needs_a_later_epoch() -> None:
    clock = FakeClock()
    n = active("a", clock, epoch=3)
    n.fenced(4)
    with pytest.raises(IllegalTransition):
        n.lease_acquired(3, clock.monotonic())
    n.lease_acquired(5, clock.monotonic())
    assert n.state is S.ACTIVATING and n.epoch == 5


@pytest.mark.parametrize("state, event", [
    (S.PASSIVE, SharedEvent.ACTIVATED),
    (S.PASSIVE, SharedEvent.LEASE_LOST),
    (S.PASSIVE, SharedEvent.FENCED),
    (S.ACTIVATING, SharedEvent.LEASE_ACQUIRED),
    (S.ACTIVE, SharedEvent.LEASE_ACQUIRED),
    (S.ACTIVE, SharedEvent.ACTIVATED),
    (S.DEAD, SharedEvent.LEASE_ACQUIRED),
    (S.DEAD, SharedEvent.STOP),
])
def test_illegal_transitions_raise(state: SharedState, event: SharedEvent) -> None:
    with pytest.raises(IllegalTransition, match=state.value):
        next_state(state, event)


def test_stop_from_every_state() -> None:
    for before in (S.PASSIVE, S.ACTIVATING, S.ACTIVE):
        assert next_state(before, SharedEvent.STOP) is S.DEAD
    clock = FakeClock()
    n = active("a", clock)
    assert states(n.stop()) == [("ACTIVE", "DEAD")]
    with pytest.raises(IllegalTransition):
        n.activated()


@dataclass
class LeaseRow:
    holder: str = ""
    epoch: int = 0
    until: float = 0.0


def test_a_paused_active_is_replaced_and_never_serves_beside_the_new_one() -> None:
    """The database's part played by the test: a lease row (holder, epoch, until) on the
    database's clock, which runs with the nodes' here."""
    clock = FakeClock()
    row = LeaseRow()
    a, b = SharedArbiter("a", lease=LEASE), SharedArbiter("b", lease=LEASE)

    def take(n: SharedArbiter) -> None:
        now = clock.monotonic()
        if n.wants_lease and (not row.holder or now >= row.until):
            row.holder, row.epoch, row.until = n.node, row.epoch + 1, now + LEASE
            n.lease_acquired(row.epoch, now)
            n.activated()

    def renew(n: SharedArbiter) -> None:
        now = clock.monotonic()
        n.renewal_sent(now)
        if row.holder == n.node and row.epoch == n.epoch:
            row.until = now + LEASE
            n.renewal_granted()
        else:
            n.renewal_refused("the lease is another node's")

    def one_serves() -> None:
        now = clock.monotonic()
        assert not (a.serving(now) and b.serving(now)), (a.state, b.state)

    take(a)
    take(b)
    assert (a.state, b.state) == (S.ACTIVE, S.PASSIVE)
    for _ in range(5):
        clock.advance(1.0)
        renew(a)
        take(b)
        one_serves()
    # a pauses: no renewals; its own deadline ends its serving before the row can be taken
    clock.advance(LEASE)
    assert not a.serving(clock.monotonic())
    take(b)
    assert b.state is S.ACTIVE and b.epoch == 2
    one_serves()
    # a wakes: a write it tries is fenced by the database (epoch 2 there), it steps down
    assert states(a.fenced(row.epoch)) == [("ACTIVE", "PASSIVE")]
    renew(b)
    one_serves()
    assert (a.state, b.state) == (S.PASSIVE, S.ACTIVE)
