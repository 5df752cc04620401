"""The active's record of when it appended entries (replication lag in seconds): bounded
whatever the rate, and never dating an entry later than it was written."""

from broker.modes.replicated.partlog import STAMP_EVERY, STAMPS, AppendTimes


def test_nothing_recorded_is_unknown() -> None:
    assert AppendTimes().written_at(1) is None


def test_an_entry_is_dated_by_its_batch_or_an_earlier_sample() -> None:
    t = AppendTimes()
    t.appended(1, 100.0)
    t.appended(5, 100.0 + STAMP_EVERY / 2)  # too soon for a sample of its own
    t.appended(9, 100.0 + 2 * STAMP_EVERY)
    assert t.written_at(1) == 100.0
    assert t.written_at(4) == 100.0
    assert t.written_at(6) == 100.0  # written at 100.025: dated earlier, a lag too long by < STAMP_EVERY
    assert t.written_at(9) == 100.0 + 2 * STAMP_EVERY
    assert t.written_at(1_000) == 100.0 + 2 * STAMP_EVERY
    assert len(t) == 2


def test_an_entry_older_than_every_sample_gets_the_oldest() -> None:
    t = AppendTimes()
    for i in range(STAMPS + 10):
        t.appended(10 + i * 3, i * 2 * STAMP_EVERY)
    assert len(t) == STAMPS
    assert t.written_at(1) == 10 * 2 * STAMP_EVERY  # the oldest kept: at least that old


def test_a_million_appends_keep_at_most_stamps_samples() -> None:
    t = AppendTimes()
    for i in range(1_000_000):
        t.appended(i + 1, i * 0.001)  # 1,000 entries a second for 1,000 s
    assert len(t) == STAMPS
    last = 999_999 * 0.001
    assert abs(t.written_at(1_000_000) - last) <= STAMP_EVERY


def test_a_rewritten_tail_forgets_what_it_replaced() -> None:
    t = AppendTimes()
    t.appended(1, 1.0)
    t.appended(10, 2.0)
    t.appended(10, 3.0)  # a new term wrote index 10 again
    assert len(t) == 1
    assert t.written_at(10) == 3.0
