"""The steps that take a partition's members to a new node list, sans-IO
(``tandem partition move``, :mod:`broker.partitions.moves`).

Each step is one membership change the core accepts (:meth:`ha.replica.Replica.change_members`:
the voters differ by one node at most, a new voter is caught up):

1. every node of the list that is not a member yet joins as a learner (all at once:
   learners do not vote, so quorum is untouched), and is fed the log;
2. each one the list wants voting becomes a voter once it has every committed entry,
   one at a time;
3. then each voter the list does not want voting leaves (or becomes a learner), one at
   a time, never the active: the active hands the partition to the list's first node
   once that one votes (:func:`leaving`, which the driver treats like drained nodes);
4. last, the learners the list does not name leave.

Voters are added before any is removed, so a partition never has fewer voters than
the smaller of its old and new lists, and losing a node mid-move costs no more than it
would before or after.
"""

from __future__ import annotations

from collections.abc import Mapping

from ha.members import Members


def next_members(current: Members, target: Members, me: str, match: Mapping[str, int],
                 commit: int) -> Members | None:
    """The next members on the way from ``current`` to ``target`` on the active ``me``, whose
    other members have the entries up to ``match`` and whose log is committed up to ``commit``;
    None while nothing can be done yet (a copy is catching up, the active must hand over) or
    once there."""
    new = tuple(n for n in target.voters + target.learners if n not in current)
    if new:
        return Members(current.voters, current.learners + new)
    for n in target.voters:
        if n in current.learners and match.get(n, 0) >= commit:
            return Members(current.voters + (n,), tuple(x for x in current.learners if x != n))
    if any(n in current.learners for n in target.voters):
        return None  # a new voter is still catching up
    for n in current.voters:
        if n not in target.voters and n != me:
            learners = current.learners + ((n,) if n in target.learners else ())
            return Members(tuple(v for v in current.voters if v != n), learners)
    if any(n not in target for n in current.learners):
        return Members(current.voters, tuple(n for n in current.learners if n in target))
    return None


def arrived(current: Members, target: Members) -> bool:
    """The members are the list's (in any order)."""
    return set(current.voters) == set(target.voters) and set(current.learners) == set(target.learners)


def leaving(current: Members, first: str) -> frozenset[str]:
    """The voters that rank as drained while the partition moves: once ``first`` (the list's
    choice of active) is a voter, every other one, so that the active hands the partition
    to it (once, straight there: until then the active stays where it is) and elections
    prefer it."""
    return frozenset(current.voters) - {first} if first in current.voters else frozenset()


def copying(current: Members, target: Members, match: Mapping[str, int], commit: int) -> bool:
    """A node the list wants voting is still a learner behind the commit index: its copy is
    being made (the partition is ``Replicating``)."""
    return any(n in current.learners and match.get(n, 0) < commit for n in target.voters)
