"""A partition's lifecycle on one node: its ``state`` and ``status`` (after StreamBase's
partition management; docs/ha.md), as explicit state machines.

``status`` says where the partition's definition stands here (defined locally
or learnt from a remote node, enabled, disabled); ``state`` says what it is
doing (serving, migrating, copying to a replica, being redefined, or
unavailable for want of an active or of quorum).  Every change goes through
the tables below and is reported to the installed notifiers, in order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from ha.errors import IllegalTransition


class PartitionState(Enum):
    INITIAL = "Initial"
    ACTIVE = "Active"
    MIGRATING = "Migrating"
    REPLICATING = "Replicating"
    UPDATING = "Updating"
    UNAVAILABLE = "Unavailable"


class PartitionStatus(Enum):
    LOCAL_DEFINED = "LocalDefined"
    REMOTE_DEFINED = "RemoteDefined"
    REMOTE_ENABLED = "RemoteEnabled"
    LOCAL_ENABLED = "LocalEnabled"
    LOCAL_DISABLED = "LocalDisabled"


S, T = PartitionState, PartitionStatus
_BUSY = (S.MIGRATING, S.REPLICATING, S.UPDATING)

STATE_TRANSITIONS: dict[tuple[PartitionState, str], PartitionState] = {
    (S.INITIAL, "enabled"): S.UNAVAILABLE,  # until an active is elected
    (S.UNAVAILABLE, "active_elected"): S.ACTIVE,
    (S.ACTIVE, "active_elected"): S.ACTIVE,  # failover to another active
    (S.ACTIVE, "migrate"): S.MIGRATING,
    (S.MIGRATING, "done"): S.ACTIVE,
    (S.ACTIVE, "replicate"): S.REPLICATING,
    (S.REPLICATING, "done"): S.ACTIVE,
    (S.MIGRATING, "replicate"): S.REPLICATING,  # a move: a new copy behind again (a new active's view)
    (S.REPLICATING, "migrate"): S.MIGRATING,  # the new copies caught up, the members change
    (S.MIGRATING, "active_elected"): S.ACTIVE,  # a failover mid-move: the new active says where it is
    (S.REPLICATING, "active_elected"): S.ACTIVE,
    (S.ACTIVE, "update"): S.UPDATING,
    (S.UPDATING, "done"): S.ACTIVE,
    (S.UNAVAILABLE, "done"): S.UNAVAILABLE,  # work that finishes while unavailable changes nothing
}
for _s in (S.ACTIVE, *_BUSY, S.UNAVAILABLE):
    STATE_TRANSITIONS[(_s, "active_lost")] = S.UNAVAILABLE
    STATE_TRANSITIONS[(_s, "quorum_lost")] = S.UNAVAILABLE
for _s in PartitionState:
    STATE_TRANSITIONS[(_s, "disabled")] = S.INITIAL

STATUS_TRANSITIONS: dict[tuple[PartitionStatus | None, str], PartitionStatus] = {
    (None, "define_local"): T.LOCAL_DEFINED,
    (None, "define_remote"): T.REMOTE_DEFINED,
    (T.REMOTE_DEFINED, "define_local"): T.LOCAL_DEFINED,
    (T.REMOTE_DEFINED, "enable_remote"): T.REMOTE_ENABLED,
    (T.LOCAL_DEFINED, "enable_local"): T.LOCAL_ENABLED,
    (T.REMOTE_DEFINED, "enable_local"): T.LOCAL_ENABLED,
    (T.REMOTE_ENABLED, "enable_local"): T.LOCAL_ENABLED,
    (T.LOCAL_DISABLED, "enable_local"): T.LOCAL_ENABLED,
    (T.LOCAL_ENABLED, "disable_local"): T.LOCAL_DISABLED,
}


@dataclass(frozen=True, slots=True)
class PartitionChanged:
    queue: str
    partition: int
    old_state: PartitionState
    new_state: PartitionState
    old_status: PartitionStatus | None
    new_status: PartitionStatus | None
    reason: str


Notifier = Callable[[PartitionChanged], None]


@dataclass
class PartitionLifecycle:
    queue: str
    partition: int
    state: PartitionState = PartitionState.INITIAL
    status: PartitionStatus | None = None
    notifiers: list[Notifier] = field(default_factory=list)

    def _changed(self, old_state: PartitionState, old_status: PartitionStatus | None, reason: str,
                 *, always: bool = False) -> None:
        if always or (old_state, old_status) != (self.state, self.status):
            change = PartitionChanged(self.queue, self.partition, old_state, self.state, old_status,
                                      self.status, reason)
            for cb in self.notifiers:
                cb(change)

    def on(self, event: str, reason: str = "") -> PartitionState:
        """Apply a state event (see STATE_TRANSITIONS); IllegalTransition if it does not apply.

        Disabling goes through :meth:`set_status` (``disable_local``), which keeps state and
        status consistent.  A failover (``active_elected`` while Active) is reported too.
        """
        new = STATE_TRANSITIONS.get((self.state, event)) if event != "disabled" else None
        if new is None:
            raise IllegalTransition(f"partition {self.queue}/{self.partition}: {self.state.value} "
                                    f"cannot take {event!r}")
        old = self.state
        self.state = new
        self._changed(old, self.status, reason or event, always=event == "active_elected")
        return new

    def set_status(self, event: str, reason: str = "") -> PartitionStatus:
        new = STATUS_TRANSITIONS.get((self.status, event))
        if new is None:
            shown = self.status.value if self.status else "undefined"
            raise IllegalTransition(f"partition {self.queue}/{self.partition}: {shown} cannot take {event!r}")
        old = self.status
        self.status = new
        if new is T.LOCAL_ENABLED and self.state is S.INITIAL:
            old_state: PartitionState = self.state
            self.state = STATE_TRANSITIONS[(old_state, "enabled")]
            self._changed(old_state, old, reason or event)
        elif new is T.LOCAL_DISABLED:
            old_state = self.state
            self.state = STATE_TRANSITIONS[(old_state, "disabled")]
            self._changed(old_state, old, reason or event)
        else:
            self._changed(self.state, old, reason or event)
        return new

    @property
    def serving(self) -> bool:
        """Clients may use it here (when this node is its active)."""
        return self.state in (S.ACTIVE, S.MIGRATING, S.REPLICATING)
