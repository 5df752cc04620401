"""Foreign partitions: who is active for the partitions this node does not hold.

In a group with more members than a partition has copies (``replicas`` + 1), each member
holds only some partitions.  It still knows every partition's definition (the catalogue)
and, from the members' keep-alives, which member is active for each: every ``Heartbeat`` a
member sends carries the partitions it serves (``actives``: queue id, partition, term,
flattened).  So a node that holds no copy of a partition answers ``tandem status`` for it
(``RemoteEnabled`` with its active, ``RemoteDefined`` while none is known), names the
active in partition maps (clients send there directly), and forwards what it is asked to
that active.  What a member said is forgotten when its link goes, and a claim of an older
term than one already heard is ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

Key = tuple[int, int]

#: the most partitions one keep-alive may claim (a member's claim past it is ignored as a whole)
MAX_CLAIMS = 100_000


def flatten(served: Iterable[tuple[Key, int]]) -> list[int]:
    """``Heartbeat.actives`` of (key, term) pairs: [queue id, partition, term, ...]."""
    return [x for (q, p), term in served for x in (q, p, term)]


class ForeignActives:
    """The actives other members say they are, for the partitions this node does not hold."""

    def __init__(self) -> None:
        self._by_key: dict[Key, tuple[str, int]] = {}  # key -> (member, term)
        self._by_member: dict[str, set[Key]] = {}

    def heard(self, member: str, flat: list[int], held_here: Callable[[Key], bool]) -> bool:
        """``member``'s keep-alive says it serves ``flat``'s partitions (all it serves): True
        if what this node knows changed.  A malformed claim is ignored whole."""
        if len(flat) % 3 or len(flat) > 3 * MAX_CLAIMS or not all(type(x) is int and x >= 0 for x in flat):
            return False
        claims = {(flat[i], flat[i + 1]): flat[i + 2] for i in range(0, len(flat), 3)}
        changed = False
        for key in self._by_member.get(member, set()) - set(claims):
            if self._by_key.get(key, ("", 0))[0] == member:
                del self._by_key[key]
                changed = True
        mine: set[Key] = set()
        for key, term in claims.items():
            if held_here(key):
                continue  # this node's own log knows better
            was = self._by_key.get(key)
            if was is None or was[0] == member or term > was[1]:
                if was != (member, term):
                    self._by_key[key] = (member, term)
                    changed = True
                mine.add(key)
        self._by_member[member] = mine
        return changed

    def forget(self, member: str) -> bool:
        """``member``'s link went: nothing it said stands.  True if anything was known of it."""
        keys = self._by_member.pop(member, set())
        gone = [k for k in keys if self._by_key.get(k, ("", 0))[0] == member]
        for k in gone:
            del self._by_key[k]
        return bool(gone)

    def active(self, key: Key) -> tuple[str, int] | None:
        """(member, term) serving ``key`` as last heard, or None."""
        return self._by_key.get(key)
