"""What a node knows it had committed survives a restart (the log's commit watermark), and
a store that was not closed says so when it opens again."""

from __future__ import annotations

from pathlib import Path

from storage.base import LogAppend, LogRecord, LogTruncate, PutHardState, PutQueue, QueueMeta
from storage.sqlite import SqliteEngine

Q = QueueMeta(id=1, name="q", partitions=1, mapper="round_robin", ring_size=0, max_deliveries=0,
              dead_letter_queue=None, max_length=0)


def records(first: int, last: int, term: int = 1) -> list[LogRecord]:
    return [LogRecord(i, term, "n1", False, b"x") for i in range(first, last + 1)]


def test_the_commit_watermark_of_the_appends_comes_back_and_a_truncation_caps_it(tmp_path: Path) -> None:
    e = SqliteEngine(tmp_path / "tandem.db")
    e.open()
    # the hard state's commit is written with a term or a vote only: it says 0 here
    e.apply([PutQueue(Q), PutHardState(1, 0, 1, "n1", 0), LogAppend(1, 0, records(1, 10))], sync=True)
    e.apply([LogAppend(1, 0, records(11, 20), commit=10)], sync=True)
    e.apply([LogAppend(1, 0, records(21, 21), commit=19)], sync=True)
    e.close()
    again = SqliteEngine(tmp_path / "tandem.db")
    assert again.open().logs[(1, 0)].commit == 19
    again.apply([LogTruncate(1, 0, 15), LogAppend(1, 0, records(15, 16, term=2))], sync=True)
    again.close()
    third = SqliteEngine(tmp_path / "tandem.db")
    st = third.open().logs[(1, 0)]
    assert st.commit == 14 and [r.index for r in st.entries][-1] == 16
    third.close()


def test_a_store_not_closed_says_so_when_it_opens_and_a_clean_close_says_nothing(tmp_path: Path) -> None:
    e = SqliteEngine(tmp_path / "tandem.db")
    assert not e.open().unclean_stop  # a new store
    e.close()
    again = SqliteEngine(tmp_path / "tandem.db")
    assert not again.open().unclean_stop  # closed cleanly
    # not closed: as if the process was killed (its files stay as they are)
    third = SqliteEngine(tmp_path / "tandem.db")
    assert third.open().unclean_stop
    third.close()
    again.close()
    fourth = SqliteEngine(tmp_path / "tandem.db")
    assert not fourth.open().unclean_stop
    fourth.close()
