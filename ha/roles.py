"""The roles of a partition's replica and the one table every role change goes through."""

from __future__ import annotations

from enum import Enum

from ha.errors import IllegalTransition


class Role(Enum):
    __hash__ = object.__hash__  # members are singletons: identity, in C (Enum's own hashes the name in Python, per lookup)
    FOLLOWER = "follower"  # a sync replica
    CANDIDATE = "candidate"
    LEADER = "active"
    LEARNER = "learner"  # an async replica


class RoleEvent(Enum):
    """What moves a replica from one role to another."""

    __hash__ = object.__hash__
    ELECTION_TIMEOUT = "election_timeout"  # no word from an active in time (or a hand-over): stand
    WON = "won"  # a quorum of votes
    HIGHER_TERM = "higher_term"  # a message of a later term
    ACTIVE_SEEN = "active_seen"  # an active of this same term
    LOST_QUORUM = "lost_quorum"  # the active heard from too few voters within the election timeout
    RIVAL_ACTIVE = "rival_active"  # another active in this term (only under a weak override)
    DEPOSED = "deposed"  # the group's arbiter (a LockFile) no longer lets this node be active
    DEMOTED = "demoted"  # a membership change made this node a learner, or took it out (ha.members)
    PROMOTED = "promoted"  # a membership change made this learner a voter


F, C, A, L = Role.FOLLOWER, Role.CANDIDATE, Role.LEADER, Role.LEARNER
E = RoleEvent

#: role -> {event -> next role}.  An event missing from a role's row is a bug in the
#: caller (``next_role`` raises).  A learner never stands and never becomes active.
TRANSITIONS: dict[Role, dict[RoleEvent, Role]] = {
    F: {E.ELECTION_TIMEOUT: C, E.HIGHER_TERM: F, E.DEMOTED: L},
    C: {E.ELECTION_TIMEOUT: C, E.WON: A, E.HIGHER_TERM: F, E.ACTIVE_SEEN: F, E.DEPOSED: F, E.DEMOTED: L},
    A: {E.HIGHER_TERM: F, E.LOST_QUORUM: F, E.RIVAL_ACTIVE: F, E.DEPOSED: F},
    L: {E.HIGHER_TERM: L, E.PROMOTED: F},
}


def next_role(role: Role, event: RoleEvent) -> Role:
    new = TRANSITIONS[role].get(event)
    if new is None:
        raise IllegalTransition(f"{role.name} cannot take {event.value!r}")
    return new
