from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from storage.intervals import IntervalSet, ranges_of


def test_ranges_of() -> None:
    assert ranges_of([9, 3, 4, 5, 5]) == [(3, 6), (9, 10)]
    assert ranges_of([7, 5, 6]) == [(5, 8)] and ranges_of([]) == []  # one run, any order
    assert ranges_of([1, 1, 3]) == [(1, 2), (3, 4)]  # as long as the span, but a duplicate and a hole
    assert ranges_of([]) == []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 200), st.integers(0, 30))), st.integers(0, 250),
       st.integers(0, 230), st.integers(0, 40))
def test_interval_set_matches_a_plain_set(adds: list[tuple[int, int]], low: int, q: int, qlen: int) -> None:
    s = IntervalSet()
    plain: set[int] = set()
    for start, n in adds:
        s.add(start, start + n)
        plain.update(range(start, start + n))
    ranges = list(s)
    assert all(a < b for a, b in ranges)
    assert all(ranges[i][1] < ranges[i + 1][0] for i in range(len(ranges) - 1))  # disjoint, not adjacent
    assert {o for a, b in ranges for o in range(a, b)} == plain
    assert s.covers(q, q + qlen) == all(o in plain for o in range(q, q + qlen))
    s.drop_below(low)
    assert {o for a, b in s for o in range(a, b)} == {o for o in plain if o >= low}
