"""A partition's members (voters and learners) as entries of its own log: single-server
membership changes (Raft's thesis, 4.1), sans-IO.

A change is an entry whose ``data`` is :func:`encode`'s: the marker byte 0xC1 (never the
first byte of a msgpack value, so never of the driver's own entries) and the new members.
A replica uses the members of the last such entry in its log, committed or not, from the
moment it has it; a truncation that removes that entry goes back to the one before, and
before any, to the members of the log's snapshot (the driver keeps those: ``base``).

Safety comes from the rules the active enforces (:func:`ha.confchange.check`, in
:meth:`ha.replica.Replica.change_members`): the voters change by one node at a time (any
majority of the old voters and any of the new ones then share a node, so two actives
cannot be elected in one term whoever uses which), only once the previous change is committed, and only once the active has committed
an entry of its own term (the thesis's fix for a change proposed by a new active over an
uncommitted one of its predecessor).  A new voter must be caught up first (a learner that
is fed the log), or the partition would wait on it for every commit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MARK = 0xC1


@dataclass(frozen=True, slots=True)
class Members:
    voters: tuple[str, ...]
    learners: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.voters:
            raise ValueError("a partition needs at least one voter")
        if set(self.voters) & set(self.learners):
            raise ValueError("a node cannot be both voter and learner")
        if len(set(self.voters)) != len(self.voters) or len(set(self.learners)) != len(self.learners):
            raise ValueError("members must be distinct")

    def __contains__(self, node: object) -> bool:
        return node in self.voters or node in self.learners


def encode(m: Members) -> bytes:
    """The data of the log entry that makes ``m`` the partition's members."""
    return bytes([MARK]) + json.dumps([list(m.voters), list(m.learners)]).encode()


def is_change(data: Any) -> bool:
    """Whether an entry's data is a membership change (cheap: one byte)."""
    return type(data) is bytes and len(data) > 1 and data[0] == MARK


def decode(data: Any) -> Members | None:
    """The members an entry's data makes (None: not a membership change, or a malformed one,
    which the driver's decoding then refuses like any malformed entry)."""
    if not is_change(data):
        return None
    try:
        voters, learners = json.loads(data[1:])
        if not all(type(n) is str for n in (*voters, *learners)):
            return None
        return Members(tuple(voters), tuple(learners))
    except (ValueError, TypeError):
        return None
