"""The store writer's timing on a FakeClock: lazy writes wait for ``lazy_delay`` and failed
commits for their back-off exactly as the injected clock measures them, and not a moment
of real time.  The clock is moved by hand (``advance``): the writer is a thread, which the
FakeClock's autojump cannot see."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from client.errors import StorageError
from client.testing import FakeClock
from storage.base import Append, PutQueue, QueueMeta, Settle, StoredMessage, WriteOp
from storage.memory import MemoryDisk, MemoryEngine
from storage.writer import RETRY_MIN, GroupCommitWriter
from tests.helpers import wait_until_sync

Q = QueueMeta(id=1, name="q", partitions=1, mapper="round_robin", ring_size=1, max_deliveries=0,
              dead_letter_queue=None, max_length=0)


def msg(offset: int) -> StoredMessage:
    return StoredMessage(offset, None, b"\x80", b"body", None, None, 0.0)


class Harness:
    """A writer on a FakeClock over the memory engine.  ``commits`` records the fake time
    of every commit the engine is asked for (``ok``: whether it committed); ``fail`` makes
    the next that many fail."""

    def __init__(self, *, lazy_delay: float) -> None:
        self.clock = FakeClock()
        self.engine = Recording(MemoryDisk(), self)
        self.engine.open()
        self.commits: list[tuple[float, bool]] = []
        self.fail = 0
        self.done: list[str] = []
        self.cv = threading.Condition()
        self.writer = GroupCommitWriter(self.engine, self._notify, clock=self.clock, lazy_delay=lazy_delay)

    def _notify(self, fn: Callable[[], None]) -> None:
        with self.cv:
            fn()
            self.cv.notify_all()

    def callback(self, name: str) -> Callable[[BaseException | None], None]:
        return lambda err: self.done.append(name if err is None else f"{name}: failed")

    def wait_done(self, n: int) -> None:
        with self.cv:
            assert self.cv.wait_for(lambda: len(self.done) >= n, timeout=30), self.done

    def wait_asleep(self) -> float:
        """Wait until the writer sleeps on the clock; the fake time it wakes at."""
        wait_until_sync(lambda: self.clock.pending() == 1, what="the writer to arm its timer")
        deadline = self.clock.next_deadline()
        assert deadline is not None
        return deadline


class Recording(MemoryEngine):
    def __init__(self, disk: MemoryDisk, h: Harness) -> None:
        super().__init__(disk)
        self.h = h

    def apply(self, ops: list[WriteOp], *, sync: bool, store_sync: bool | None = None) -> None:
        h = self.h
        if h.fail:
            h.fail -= 1
            h.commits.append((h.clock.monotonic(), False))
            raise StorageError("disk says no")
        super().apply(ops, sync=sync, store_sync=store_sync)
        h.commits.append((h.clock.monotonic(), True))


@pytest.fixture
def harness() -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def make(lazy_delay: float = 0.5) -> Harness:
        h = Harness(lazy_delay=lazy_delay)
        made.append(h)
        return h

    yield make
    for h in made:
        h.writer.close()
        h.engine.close()


def test_a_lazy_write_is_committed_when_the_clock_reaches_the_lazy_delay(harness: Callable[..., Harness]) -> None:
    h = harness(lazy_delay=0.5)
    h.writer.submit([PutQueue(Q), Append(1, 0, [msg(0)], 1)], sync=True, callback=h.callback("setup"))
    h.wait_done(1)
    h.clock.advance(10.0)  # the lazy delay counts from the lazy write, not from the start
    h.writer.submit([Settle(1, 0, [0])], sync=False, lazy=True, callback=h.callback("settle"))
    assert h.wait_asleep() == 10.5
    h.clock.advance(0.25)
    assert h.clock.pending() == 1 and h.done == ["setup"]  # its timer has not fired: still asleep
    assert h.commits == [(0.0, True)]
    h.clock.advance(0.25)
    h.wait_done(2)
    assert h.done == ["setup", "settle"]
    assert h.commits == [(0.0, True), (10.5, True)]
    assert h.engine.read(1, 0, 0, 10) == []


def test_lazy_writes_ride_with_an_eager_commit_before_their_delay(harness: Callable[..., Harness]) -> None:
    h = harness(lazy_delay=60.0)
    h.writer.submit([PutQueue(Q)], sync=True, callback=h.callback("setup"))
    h.wait_done(1)
    h.writer.submit([Append(1, 0, [msg(0)], 1)], sync=False, lazy=True, callback=h.callback("lazy"))
    assert h.wait_asleep() == 60.0
    h.clock.advance(1.0)
    h.writer.submit([Append(1, 0, [msg(1)], 2)], sync=True, callback=h.callback("eager"))
    h.wait_done(3)
    assert h.done == ["setup", "lazy", "eager"]  # one commit, at the eager write's time
    assert h.commits == [(0.0, True), (1.0, True)]
    assert h.clock.pending() == 0  # nothing left to wait for: the timer went with the commit


def test_enough_lazy_ops_commit_at_once_whatever_the_clock(harness: Callable[..., Harness]) -> None:
    h = harness(lazy_delay=60.0)
    h.writer.lazy_max_ops = 10
    h.writer.submit([PutQueue(Q)], sync=True, callback=h.callback("setup"))
    h.wait_done(1)
    h.writer.submit([Append(1, 0, [msg(i)], i + 1) for i in range(10)], sync=False, lazy=True,
                    callback=h.callback("pile"))
    h.wait_done(2)
    assert h.commits == [(0.0, True), (0.0, True)]


def test_a_failed_commit_is_retried_on_the_clock_with_a_doubling_back_off(harness: Callable[..., Harness]) -> None:
    """Submissions made with ``retry=True`` go back to the queue; the writer tries again after
    RETRY_MIN, then twice that, and so on, as the clock measures; the callback runs once."""
    h = harness()
    h.fail = 3
    h.writer.submit([PutQueue(Q)], sync=True, callback=h.callback("queue"), retry=True)
    attempts = [0.0]
    for k in range(3):
        attempts.append(attempts[-1] + RETRY_MIN * 2 ** k)
        assert h.wait_asleep() == pytest.approx(attempts[-1])
        h.clock.advance(h.wait_asleep() - h.clock.monotonic())
    h.wait_done(1)
    assert h.done == ["queue"]
    assert [t for t, _ok in h.commits] == pytest.approx(attempts)  # 0, 0.05, 0.15, 0.35
    assert [ok for _t, ok in h.commits] == [False, False, False, True]
    # after a success the back-off starts over
    h.fail = 1
    h.writer.submit([Append(1, 0, [msg(0)], 1)], sync=True, callback=h.callback("append"), retry=True)
    assert h.wait_asleep() == pytest.approx(attempts[-1] + RETRY_MIN)


def test_a_commit_without_retry_reports_the_failure_and_waits_for_nothing(harness: Callable[..., Harness]) -> None:
    h = harness()
    h.fail = 1
    h.writer.submit([PutQueue(Q)], sync=True, callback=h.callback("queue"))
    h.wait_done(1)
    assert h.done == ["queue: failed"] and h.commits == [(0.0, False)]
    h.writer.submit([PutQueue(Q)], sync=True, callback=h.callback("again"))
    h.wait_done(2)  # not held back: nothing was to be retried
    assert h.commits == [(0.0, False), (0.0, True)]
