"""LockFile arbitration of a two-node group, sans-IO (after FioranoMQ's HA pair).

Two nodes replicate to each other; a lock on a file both reach (on a third, "gateway"
machine) decides which one may serve.  A node serves writes only while it holds the lock,
its lease on it is current, and nobody has shown it a later epoch.

States (:class:`HaState`) and what moves them (:class:`LockEvent`), all in :data:`TRANSITIONS`:

* ``WAITING``: at start, after losing the lock, and on the passive when its peer is gone:
  try the lock, or wait for a peer that holds it;
* ``STANDALONE``: holds the lock and serves, no peer;
* ``ACTIVE_SYNC``: holds the lock, serves, and brings the reconnected peer up to date;
* ``ACTIVE``: holds the lock and serves, the peer in step;
* ``PASSIVE_SYNC``: the peer holds the lock; this node catches up with it;
* ``PASSIVE``: in step with the serving peer; serves nothing (back to ``WAITING`` when the
  peer is gone or says it no longer serves);
* ``DEAD``: stopped.

The rules: on link loss the holder goes ``STANDALONE`` and the other ``WAITING`` (it then
tries the lock, which the holder keeps); a lost lock or lease, or a later epoch seen on any
frame, sends a serving node to ``WAITING`` at once: it confirms nothing more.  Each
acquisition of the lock increments an *epoch* kept beside it; replication frames and confirms
carry it, so a holder that was paused past its lease and wakes up after the other took the
lock learns from the first frame it sees that it is stale.

:class:`LockArbiter` holds the state, the epoch and the lease, takes events with the time
(``now``, from the driver's clock) and returns the :class:`StateChanged` notices the driver
sends to the peer, logs and shows.  It does no I/O: the driver takes and renews the lock.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ha.errors import IllegalTransition


class HaState(Enum):
    WAITING = "WAITING"
    STANDALONE = "STANDALONE"
    ACTIVE_SYNC = "ACTIVE_SYNC"
    ACTIVE = "ACTIVE"
    PASSIVE_SYNC = "PASSIVE_SYNC"
    PASSIVE = "PASSIVE"
    DEAD = "DEAD"


class LockEvent(Enum):
    LOCK_ACQUIRED = "lock_acquired"  # this node took the lock (a new epoch)
    LOCK_LOST = "lock_lost"  # the lock or its lease is gone (renewal failed, lease ran out)
    HIGHER_EPOCH = "higher_epoch"  # a frame carried an epoch later than this node's
    PEER_UP = "peer_up"  # the link to the peer is up
    PEER_DOWN = "peer_down"  # the link is lost, or the peer silent past non_response_timeout
    PEER_SERVING = "peer_serving"  # the peer says it holds the lock (an epoch not below ours)
    PEER_IDLE = "peer_idle"  # the peer, connected, says it serves nothing (it lost the lock)
    SYNCED = "synced"  # the passive side is caught up with the active's log
    STOP = "stop"


S, E = HaState, LockEvent

#: state -> {event -> next state}.  An event missing from a state's row raises
#: IllegalTransition: a bug in the driver, never a state to guess at.
TRANSITIONS: dict[HaState, dict[LockEvent, HaState]] = {
    S.WAITING: {E.LOCK_ACQUIRED: S.STANDALONE, E.PEER_SERVING: S.PASSIVE_SYNC, E.PEER_UP: S.WAITING,
                E.PEER_DOWN: S.WAITING, E.PEER_IDLE: S.WAITING, E.HIGHER_EPOCH: S.WAITING, E.LOCK_LOST: S.WAITING,
                E.STOP: S.DEAD},
    S.STANDALONE: {E.PEER_UP: S.ACTIVE_SYNC, E.PEER_DOWN: S.STANDALONE, E.PEER_IDLE: S.STANDALONE,
                   E.LOCK_LOST: S.WAITING, E.HIGHER_EPOCH: S.WAITING, E.STOP: S.DEAD},
    S.ACTIVE_SYNC: {E.SYNCED: S.ACTIVE, E.PEER_DOWN: S.STANDALONE, E.PEER_UP: S.ACTIVE_SYNC,
                    E.PEER_IDLE: S.ACTIVE_SYNC, E.LOCK_LOST: S.WAITING, E.HIGHER_EPOCH: S.WAITING, E.STOP: S.DEAD},
    S.ACTIVE: {E.PEER_DOWN: S.STANDALONE, E.PEER_UP: S.ACTIVE, E.PEER_IDLE: S.ACTIVE, E.SYNCED: S.ACTIVE,
               E.LOCK_LOST: S.WAITING, E.HIGHER_EPOCH: S.WAITING, E.STOP: S.DEAD},
    # the peer that served says it no longer does (it lost the lock): wait for the lock
    S.PASSIVE_SYNC: {E.SYNCED: S.PASSIVE, E.PEER_SERVING: S.PASSIVE_SYNC, E.PEER_DOWN: S.WAITING,
                     E.PEER_IDLE: S.WAITING, E.HIGHER_EPOCH: S.PASSIVE_SYNC, E.STOP: S.DEAD},
    S.PASSIVE: {E.PEER_SERVING: S.PASSIVE, E.SYNCED: S.PASSIVE, E.PEER_DOWN: S.WAITING, E.PEER_IDLE: S.WAITING,
                E.HIGHER_EPOCH: S.PASSIVE, E.STOP: S.DEAD},
    S.DEAD: {},
}

#: the states that hold the lock and serve writes (while the lease is current)
SERVING = frozenset({S.STANDALONE, S.ACTIVE_SYNC, S.ACTIVE})


def next_state(state: HaState, event: LockEvent) -> HaState:
    new = TRANSITIONS[state].get(event)
    if new is None:
        raise IllegalTransition(f"{state.value} cannot take {event.value!r}")
    return new


@dataclass(frozen=True, slots=True)
class StateChanged:
    """One state change: sent to the peer, logged, shown by ``tandem status`` and the console."""
    node: str
    previous: HaState
    present: HaState
    epoch: int
    reason: str


class LockArbiter:
    """One node's side of the pair.  ``lease``: how long a holder may go without renewing
    its lock before it must stop serving (the driver renews well within it)."""

    def __init__(self, node: str, *, lease: float) -> None:
        if lease <= 0:
            raise ValueError("lease must be positive")
        self.node = node
        self.lease = lease
        self.state = HaState.WAITING
        self.epoch = 0  # the epoch this node serves under (0: never held the lock)
        self.seen_epoch = 0  # the latest epoch this node has seen anywhere
        self.lease_until = 0.0
        self.peer_up = False

    # -- what the driver asks ------------------------------------------------------------------

    def serving(self, now: float) -> bool:
        """May this node accept and confirm writes now?"""
        return self.state in SERVING and now < self.lease_until and self.epoch >= self.seen_epoch

    def may_confirm(self, epoch: int, now: float) -> bool:
        """A confirm of a write made under ``epoch``: only while still serving that epoch."""
        return epoch == self.epoch and self.serving(now)

    @property
    def wants_lock(self) -> bool:
        """Should the driver try to take the lock?  Only a waiting node does: a passive whose
        peer is up leaves it to the peer."""
        return self.state is HaState.WAITING

    # -- events ------------------------------------------------------------------------------

    def lock_acquired(self, epoch: int, now: float) -> list[StateChanged]:
        """The driver took the lock and wrote ``epoch`` (one above the last) beside it."""
        if epoch <= self.seen_epoch:
            raise IllegalTransition(f"lock taken with epoch {epoch}, but epoch {self.seen_epoch} was seen")
        changes = self._move(LockEvent.LOCK_ACQUIRED, f"took the lock, epoch {epoch}")
        self.epoch = self.seen_epoch = epoch
        self.lease_until = now + self.lease
        if self.peer_up:
            changes += self._move(LockEvent.PEER_UP, "peer connected: bringing it up to date")
        return changes

    def renewed(self, now: float) -> None:
        """The driver renewed the lock (its lease runs from ``now``)."""
        if self.state in SERVING:
            self.lease_until = now + self.lease

    def lock_lost(self, why: str) -> list[StateChanged]:
        return self._step_down(LockEvent.LOCK_LOST, why)

    def tick(self, now: float) -> list[StateChanged]:
        """Time passes: a holder whose lease ran out stops serving."""
        if self.state in SERVING and now >= self.lease_until:
            return self._step_down(LockEvent.LOCK_LOST, "lease ran out before it was renewed")
        return []

    def observe_epoch(self, epoch: int) -> list[StateChanged]:
        """Any frame from the peer carries its epoch: a later one than ours fences us."""
        if epoch <= self.seen_epoch:
            return []
        self.seen_epoch = epoch
        why = f"epoch {epoch} seen, this node's is {self.epoch}"
        if self.state in SERVING:
            return self._step_down(LockEvent.HIGHER_EPOCH, why)
        return self._move(LockEvent.HIGHER_EPOCH, why)

    def peer_connected(self) -> list[StateChanged]:
        self.peer_up = True
        return self._move(LockEvent.PEER_UP, "peer connected")

    def peer_lost(self, why: str) -> list[StateChanged]:
        self.peer_up = False
        return self._move(LockEvent.PEER_DOWN, why)

    def peer_serving(self, epoch: int) -> list[StateChanged]:
        """The peer says it holds the lock under ``epoch``."""
        changes = self.observe_epoch(epoch)
        if self.state in SERVING:
            if epoch < self.epoch:
                return changes  # a stale holder: our later epoch fences it
            raise IllegalTransition(f"{self.node} serves epoch {self.epoch} and the peer claims epoch {epoch}")
        return changes + self._move(LockEvent.PEER_SERVING, f"peer serves epoch {epoch}")

    def peer_idle(self, why: str) -> list[StateChanged]:
        """The connected peer says it serves nothing: a passive goes back to waiting for the lock."""
        return self._move(LockEvent.PEER_IDLE, why)

    def synced(self) -> list[StateChanged]:
        """The passive side caught up (on the active: the peer says so; on the passive: itself)."""
        return self._move(LockEvent.SYNCED, "in step")

    def stop(self) -> list[StateChanged]:
        return self._move(LockEvent.STOP, "stopping")

    # -- the table ----------------------------------------------------------------------------

    def _step_down(self, event: LockEvent, why: str) -> list[StateChanged]:
        changes = self._move(event, why)
        self.lease_until = 0.0
        return changes

    def _move(self, event: LockEvent, reason: str) -> list[StateChanged]:
        new = next_state(self.state, event)
        if new is self.state:
            return []
        old, self.state = self.state, new
        return [StateChanged(self.node, old, new, self.epoch, reason)]
