"""The rules of membership changes on a partition's core, pure (etcd-raft's ``confchange/``).

Whether the active may propose a change now, which members a log puts in effect, and what
the active's tracker does when they change; the entries themselves are :mod:`ha.members`'s.

The rules (:func:`check`) are Raft's single-server changes (thesis 4.1): the voters
change by one node at a time, only once the previous change is committed and the active
has committed an entry of its own term, the active stays a voter, and a new voter is
caught up first (a learner that is fed the log).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ha.members import Members, decode
from ha.messages import Entry
from ha.progress import PeerTracker


class MembershipRefused(ValueError):
    """:meth:`ha.replica.Replica.change_members` cannot propose that change now; the message says why."""


def check(old: Members, new: Members, *, me: str, active: bool, change_index: int, commit: int,
          own_term_committed: bool, match: Mapping[str, int]) -> None:
    """Raise MembershipRefused unless the active ``me`` (``active``: it is, and takes writes)
    may change the members from ``old`` to ``new`` now: ``change_index`` is the entry of the
    change in effect (0: the snapshot's members), ``commit`` its commit index,
    ``own_term_committed`` whether the entry there is of its term, ``match`` how far each
    other member's log goes."""
    if not active:
        raise MembershipRefused(f"{me} is not the partition's active")
    if new == old:
        raise MembershipRefused("the members are already those")
    if change_index > commit:
        raise MembershipRefused(f"the previous membership change (entry {change_index}) is not committed yet")
    if not own_term_committed:
        raise MembershipRefused("this active has not committed an entry of its own term yet")
    if len(set(old.voters) ^ set(new.voters)) > 1:
        raise MembershipRefused(f"the voters change by one node at a time ({', '.join(old.voters)} -> "
                                f"{', '.join(new.voters)})")
    if me not in new.voters:
        raise MembershipRefused(f"{me} is the active: hand the partition to another voter before it leaves")
    for v in set(new.voters) - set(old.voters):
        if match.get(v, 0) < commit:
            raise MembershipRefused(f"{v} is not caught up ({match.get(v, 0)} of {commit}): "
                                    f"add it as a learner first")


def last_change(entries: list[Entry], base: Members) -> tuple[Members, int]:
    """The members ``entries`` put in effect and the index of their change: the last one among
    them, else ``base`` (the snapshot's members; index 0)."""
    for e in reversed(entries):
        m = decode(e.data)
        if m is not None:
            return m, e.index
    return base, 0


def retrack(tracker: PeerTracker, peers: Iterable[str], gone: Iterable[str], index: int, now: float) -> None:
    """On the active: the members changed at entry ``index``.  A new one among ``peers`` is
    sent entries from the change on (a mismatch moves it back); what is known of those
    ``gone`` is forgotten."""
    t = tracker
    for p in peers:
        if p not in t.next:
            t.next[p], t.match[p], t.heard[p] = index, 0, now
    for p in gone:
        for d in (t.next, t.match, t.heard, t.acked, t.live_since, t.snapshot_sent):
            d.pop(p, None)
