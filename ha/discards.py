"""The HA-1014 reports of a partition's core on the entries it discards, pure.

Those truncated for the active's, those a snapshot that does not match replaced, and a log
that differs from the active's below its own snapshot (:class:`~ha.messages.EntriesDiscarded`).
"""

from __future__ import annotations

from ha.log import EntryLog
from ha.messages import EntriesDiscarded, Entry, InstallSnapshot


def discarded(me: str, term: int, dropped: list[Entry], lost_committed: int, *, upto: bool = False,
              certain: int | None = None) -> EntriesDiscarded:
    """``dropped`` in index order, the first ``lost_committed`` of them counted as committed on
    ``me``; ``upto`` and ``certain`` as :class:`~ha.messages.EntriesDiscarded` has them."""
    weak = sum(1 for e in dropped[:lost_committed] if e.weak)
    return EntriesDiscarded(me, term, dropped[0].index, len(dropped), lost_committed,
                            payloads=tuple(e.data for e in dropped), weak=weak, upto=upto,
                            certain=lost_committed if certain is None else certain,
                            written=tuple((e.origin, e.term) for e in dropped))


def replaced_by_snapshot(me: str, term: int, commit: int, m: InstallSnapshot, replaced: list[Entry],
                         dropped: list[Entry]) -> EntriesDiscarded | None:
    """A snapshot that does not match ``me``'s log replaced it: ``replaced`` are the entries
    up to the snapshot's index, ``dropped`` those after it.  The snapshot says only its last
    entry's (term, origin): an entry of that term and origin is in it (that active wrote its
    term's entries in order, and a log holding its last one holds all before), an entry of a
    later term is not, and any other may or may not be.  Entries ``me`` had committed (up to
    ``commit``: confirmed, if it was their active) are reported, those it cannot tell as lost
    at most; None if nothing is lost."""
    # (an entry of its last term by another origin: two actives in one term, under an override)
    lost = [e for e in replaced if e.term > m.last_term or (e.index <= commit and (
        e.term < m.last_term or e.origin != m.last_origin))]
    lost += dropped
    if not lost:
        return None
    committed = [e for e in lost if e.index <= commit]
    certain = sum(1 for e in committed if e.term > m.last_term or e.index > m.index)
    return discarded(me, term, lost, len(committed), upto=certain < len(committed), certain=certain)


def below_snapshot(me: str, term: int, log: EntryLog, commit: int) -> EntriesDiscarded:
    """The active's log differs from what ``me`` has compacted: its snapshot's last entry and
    every entry after it are discarded, confirmed (up to ``commit``), and more before them
    went uncounted (``compacted``)."""
    after = log.slice(log.snap_index + 1, log.last_index)
    payloads = (None, *(e.data for e in after))
    committed = 1 + sum(1 for e in after if e.index <= commit)
    return EntriesDiscarded(me, term, log.snap_index, len(payloads), committed, payloads=payloads,
                            certain=committed, compacted=True,
                            weak=sum(1 for e in after if e.weak and e.index <= commit),
                            written=((log.snap_origin, log.snap_term), *((e.origin, e.term) for e in after)))
