"""Shared mode, sans-IO: one database, and only the holder of its lease writes.

Every node of a shared-mode group uses the same database.  A lease row in it (or a lock
file) names the one node that may write, under an *activation epoch* that each takeover
increments; every write transaction checks that epoch inside the database, so a node that
lost the lease cannot commit a single row, whatever it believes.

States (:class:`SharedState`), moved only through :data:`TRANSITIONS`:

* ``PASSIVE``: refuses clients, naming the active; watches the active's heartbeats and tries
  the lease once they stop;
* ``ACTIVATING``: holds the lease; loads the queues from the database and gives unacked
  deliveries back to ready before it serves;
* ``ACTIVE``: serves every partition, renewing the lease;
* ``DEAD``: stopped.

The lease runs on the database's clock (the driver's renewal says ``UPDATE ... SET until =
now() + lease``).  This core also keeps a local deadline: a renewal sent at local time ``t``
can only have been granted until at least ``t + lease`` by the database, so an active that
has had no renewal confirmed for ``lease`` seconds on its own clock stops before any other
node can be granted the lease.  Fencing stays the guarantee; the local deadline only keeps a
stale active from trying.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ha.errors import IllegalTransition


class SharedState(Enum):
    PASSIVE = "PASSIVE"
    ACTIVATING = "ACTIVATING"
    ACTIVE = "ACTIVE"
    DEAD = "DEAD"


class SharedEvent(Enum):
    LEASE_ACQUIRED = "lease_acquired"  # this node took the lease (a new activation epoch)
    ACTIVATED = "activated"  # queues loaded, unacked deliveries back to ready
    LEASE_LOST = "lease_lost"  # a renewal failed or was not confirmed in time
    FENCED = "fenced"  # the database refused a write: another node holds a later epoch
    STOP = "stop"


S, E = SharedState, SharedEvent

#: state -> {event -> next state}; anything else raises IllegalTransition.
TRANSITIONS: dict[SharedState, dict[SharedEvent, SharedState]] = {
    S.PASSIVE: {E.LEASE_ACQUIRED: S.ACTIVATING, E.STOP: S.DEAD},
    S.ACTIVATING: {E.ACTIVATED: S.ACTIVE, E.LEASE_LOST: S.PASSIVE, E.FENCED: S.PASSIVE, E.STOP: S.DEAD},
    S.ACTIVE: {E.LEASE_LOST: S.PASSIVE, E.FENCED: S.PASSIVE, E.STOP: S.DEAD},
    S.DEAD: {},
}

HOLDING = frozenset({S.ACTIVATING, S.ACTIVE})


def next_state(state: SharedState, event: SharedEvent) -> SharedState:
    new = TRANSITIONS[state].get(event)
    if new is None:
        raise IllegalTransition(f"{state.value} cannot take {event.value!r}")
    return new


@dataclass(frozen=True, slots=True)
class SharedChanged:
    node: str
    previous: SharedState
    present: SharedState
    epoch: int
    reason: str


class SharedArbiter:
    """One node of a shared-mode group.  ``lease``: the lease's length (seconds)."""

    def __init__(self, node: str, *, lease: float) -> None:
        if lease <= 0:
            raise ValueError("lease must be positive")
        self.node = node
        self.lease = lease
        self.state = SharedState.PASSIVE
        self.epoch = 0
        self.deadline = 0.0  # local time after which this node must assume the lease lost
        self._renewal_sent: float | None = None

    def serving(self, now: float) -> bool:
        """May this node accept and confirm client writes now?"""
        return self.state is SharedState.ACTIVE and now < self.deadline

    @property
    def wants_lease(self) -> bool:
        return self.state is SharedState.PASSIVE

    def lease_acquired(self, epoch: int, sent_at: float) -> list[SharedChanged]:
        """The database granted the lease under ``epoch``; the request left at ``sent_at``."""
        if epoch <= self.epoch:
            raise IllegalTransition(f"lease granted with epoch {epoch}, not above {self.epoch}")
        changes = self._move(SharedEvent.LEASE_ACQUIRED, f"took the lease, epoch {epoch}")
        self.epoch = epoch
        self.deadline = sent_at + self.lease
        return changes

    def activated(self) -> list[SharedChanged]:
        return self._move(SharedEvent.ACTIVATED, "queues loaded")

    def renewal_sent(self, now: float) -> None:
        """A renewal request leaves now (its grant counts from this moment)."""
        if self.state in HOLDING and self._renewal_sent is None:
            self._renewal_sent = now

    def renewal_granted(self) -> None:
        if self.state in HOLDING and self._renewal_sent is not None:
            self.deadline = max(self.deadline, self._renewal_sent + self.lease)
        self._renewal_sent = None

    def renewal_refused(self, why: str) -> list[SharedChanged]:
        """The database says the lease is someone else's."""
        self._renewal_sent = None
        return self._lose(SharedEvent.LEASE_LOST, why)

    def fenced(self, epoch_in_db: int) -> list[SharedChanged]:
        """A write was refused: the database holds a later activation epoch."""
        return self._lose(SharedEvent.FENCED, f"write refused: epoch {epoch_in_db} in the database, "
                                              f"this node's {self.epoch}")

    def tick(self, now: float) -> list[SharedChanged]:
        """Time passes: no renewal confirmed within the lease means the lease is lost."""
        if self.state in HOLDING and now >= self.deadline:
            return self._lose(SharedEvent.LEASE_LOST, "no renewal confirmed within the lease")
        return []

    def stop(self) -> list[SharedChanged]:
        return self._move(SharedEvent.STOP, "stopping")

    def _lose(self, event: SharedEvent, why: str) -> list[SharedChanged]:
        if self.state not in HOLDING:
            return []  # passive already: nothing to give up
        changes = self._move(event, why)
        self.deadline = 0.0
        return changes

    def _move(self, event: SharedEvent, reason: str) -> list[SharedChanged]:
        new = next_state(self.state, event)
        if new is self.state:
            return []
        old, self.state = self.state, new
        return [SharedChanged(self.node, old, new, self.epoch, reason)]
