"""The Store conformance suite: every engine must pass it (today: SQLite)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from client.errors import StorageError
from storage.base import (
    Append,
    DropQueue,
    DropUser,
    Engine,
    PurgePartition,
    PutProducer,
    PutQueue,
    PutUser,
    QueueMeta,
    Remove,
    SetDeliveryCount,
    StoredMessage,
    UserRecord,
)
from storage.sqlite import SqliteEngine
from storage.writer import GroupCommitWriter

ENGINES: dict[str, Callable[[Path], Engine]] = {
    "sqlite": lambda d: SqliteEngine(d / "tandem.db"),
}


@pytest.fixture(params=sorted(ENGINES))
def make_engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Engine]]:
    opened: list[Engine] = []

    def make() -> Engine:
        e = ENGINES[request.param](tmp_path)
        opened.append(e)
        return e

    yield make
    for e in opened:
        e.close()


Q = QueueMeta(id=1, name="q", partitions=2, mapper="consistent_hash", ring_size=64, max_deliveries=3,
              dead_letter_queue="dlq", max_length=0)


def msg(offset: int, body: bytes = b"b", **kw: object) -> StoredMessage:
    return StoredMessage(offset, kw.get("key", f"k{offset}"), b"\x80", body, kw.get("pid"), kw.get("seq"),  # type: ignore[arg-type]
                         1700000000.0 + offset)


def test_empty_store_opens_with_schema(make_engine: Callable[[], Engine]) -> None:
    rec = make_engine().open()
    assert rec.queues == [] and rec.partitions == {} and rec.users == []
    assert rec.meta["schema_version"]


def test_everything_committed_comes_back(make_engine: Callable[[], Engine]) -> None:
    e = make_engine()
    e.open()
    user = UserRecord(name="u", salt=b"s" * 16, hash=b"h" * 32, role="admin", params="scrypt")
    e.apply([PutQueue(Q), PutUser(user)], sync=True)
    e.apply([Append(1, 0, [msg(0), msg(1), msg(2, pid="p", seq=9)], 3), PutProducer(1, 0, "p", 9),
             Append(1, 1, [msg(0, b"other")], 1)], sync=True)
    e.apply([Remove(1, 0, [1]), SetDeliveryCount(1, 0, [(2, 2)])], sync=False)
    e.set_meta("store_stamp", "abc")
    e.close()
    rec = make_engine().open()
    assert rec.queues == [Q] and rec.users == [user] and rec.meta["store_stamp"] == "abc"
    p0 = rec.partitions[(1, 0)]
    assert [m.offset for m in p0.messages] == [0, 2]
    assert p0.messages[1].delivery_count == 2 and p0.messages[1].seq == 9
    assert p0.next_offset == 3 and p0.producers == {"p": 9}
    assert [m.body for m in rec.partitions[(1, 1)].messages] == [b"other"]


def test_next_offset_survives_when_every_message_is_removed(make_engine: Callable[[], Engine]) -> None:
    e = make_engine()
    e.open()
    e.apply([PutQueue(Q), Append(1, 0, [msg(0), msg(1)], 2)], sync=True)
    e.apply([Remove(1, 0, [0, 1])], sync=True)
    e.close()
    rec = make_engine().open()
    assert rec.partitions[(1, 0)].next_offset == 2 and rec.partitions[(1, 0)].messages == []


def test_read_by_offset(make_engine: Callable[[], Engine]) -> None:
    e = make_engine()
    e.open()
    e.apply([PutQueue(Q), Append(1, 0, [msg(i) for i in range(10)], 10)], sync=True)
    e.apply([Remove(1, 0, [3])], sync=True)
    got = e.read(1, 0, 2, 4)
    assert [m.offset for m in got] == [2, 4, 5, 6]
    # reads work from other threads while the writer writes
    out: list[int] = []
    t = threading.Thread(target=lambda: out.extend(m.offset for m in e.read(1, 0, 0, 100)))
    t.start()
    t.join()
    assert out == [0, 1, 2, 4, 5, 6, 7, 8, 9]


def test_structural_ops(make_engine: Callable[[], Engine]) -> None:
    e = make_engine()
    e.open()
    user = UserRecord(name="u", salt=b"s", hash=b"h", role="monitor", params="x")
    e.apply([PutQueue(Q), PutUser(user), Append(1, 0, [msg(0)], 1), Append(1, 1, [msg(0)], 1)], sync=True)
    e.apply([PurgePartition(1, 0), DropUser("u")], sync=True)
    e.close()
    rec = make_engine().open()
    assert (1, 0) not in rec.partitions or rec.partitions[(1, 0)].messages == []
    assert len(rec.partitions[(1, 1)].messages) == 1 and rec.users == []
    e2 = make_engine()
    e2.open()
    e2.apply([DropQueue(1)], sync=True)
    e2.close()
    rec = make_engine().open()
    assert rec.queues == [] and rec.partitions == {}


def test_failed_batch_is_atomic(make_engine: Callable[[], Engine]) -> None:
    e = make_engine()
    e.open()
    e.apply([PutQueue(Q)], sync=True)
    bad = Append(1, 1, [StoredMessage(0, None, b"\x80", None, None, None, 0.0)], 1)  # type: ignore[arg-type]
    with pytest.raises(StorageError) as info:
        e.apply([Append(1, 0, [msg(0)], 1), bad], sync=True)
    assert info.value.orig is not None
    e.close()
    rec = make_engine().open()
    assert rec.partitions == {} and rec.queues == [Q]


def test_group_commit_writer_batches_and_reports(make_engine: Callable[[], Engine]) -> None:
    e = make_engine()
    e.open()
    done: list[BaseException | None] = []
    cv = threading.Condition()

    def notify(fn: Callable[[], None]) -> None:
        with cv:
            fn()
            cv.notify_all()

    w = GroupCommitWriter(e, notify)
    w.submit([PutQueue(Q)], sync=True, callback=done.append)
    for i in range(200):
        w.submit([Append(1, 0, [msg(i)], i + 1)], sync=True, callback=done.append)
    with cv:
        assert cv.wait_for(lambda: len(done) == 201, timeout=30)
    w.close()
    assert done == [None] * 201
    assert w.stats.commits < 201  # batched: fewer commits than submissions
    assert len(e.read(1, 0, 0, 1000)) == 200


def test_writer_reports_failures_to_every_callback(make_engine: Callable[[], Engine]) -> None:
    e = make_engine()
    e.open()
    errors: list[BaseException | None] = []
    w = GroupCommitWriter(e, lambda fn: fn())
    bad = StoredMessage(0, None, b"\x80", None, None, None, 0.0)  # type: ignore[arg-type]  # body NOT NULL
    w.submit([PutQueue(Q), Append(1, 0, [bad], 1)], sync=True, callback=errors.append)
    w.close()
    assert len(errors) == 1 and isinstance(errors[0], StorageError)
    assert w.stats.failed_commits == 1
