"""The Store conformance suite: every engine must pass it (SQLite, SQLite shared by the nodes
of a machine, PostgreSQL, memory); a test of a feature an engine lacks (``Capabilities``)
skips, naming it."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from client.errors import StorageError
from client.testing import FakeClock
from storage.base import (
    Trim,
    Append,
    DropQueue,
    DropUser,
    AclRecord,
    GrantAcl,
    PutMeta,
    RevokeAcl,
    Engine,
    LogAppend,
    LogRecord,
    LogTruncate,
    MarkDelivered,
    PackedRun,
    DropProducers,
    PutProducer,
    PutQueue,
    PutUser,
    QueueMeta,
    SetDeliveryCount,
    Settle,
    StoredMessage,
    UserRecord,
    WriteOp,
)
from storage.budget import message_cost
from storage.memory import MemoryDisk, MemoryEngine
from storage.postgres import PostgresEngine, PostgresShared
from storage.sqlite import SqliteEngine
from storage.sqlite.shared import SharedSqliteEngine
from storage.writer import GroupCommitWriter

# name -> factory(tmp_path, shared) where ``shared`` is one object per test (the memory
# engine keeps its "disk" there, so a second engine sees what the first committed;
# PostgreSQL's "url" is a database schema of the test's own, see tests/pg.py)
ENGINES: dict[str, Callable[[Path, dict[str, object]], Engine]] = {
    "postgresql": lambda _d, shared: PostgresShared(str(shared["url"])).engine(),
    "sqlite": lambda d, _shared: SqliteEngine(d / "tandem.db"),
    "sqlite-shared": lambda d, _shared: SharedSqliteEngine(d / "tandem.db"),
    "memory": lambda _d, shared: MemoryEngine(shared.setdefault("disk", MemoryDisk())),  # type: ignore[arg-type]
}


@pytest.fixture(params=sorted(ENGINES))
def make_engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Engine]]:
    opened: list[Engine] = []
    shared: dict[str, object] = {}
    if request.param == "postgresql":
        shared["url"] = request.getfixturevalue("pg_url")

    def make() -> Engine:
        e = ENGINES[request.param](tmp_path, shared)
        opened.append(e)
        return e

    yield make
    for e in opened:
        e.close()


Q = QueueMeta(id=1, name="q", partitions=2, mapper="consistent_hash", ring_size=64, max_deliveries=3,
              dead_letter_queue="dlq", max_length=0, owner="alice")


def msg(offset: int, body: bytes = b"b", **kw: object) -> StoredMessage:
    """A message as the broker hands it to the store (any object with these attributes)."""
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
    e.apply([Settle(1, 0, [1]), SetDeliveryCount(1, 0, [(2, 2)]), MarkDelivered(1, 0, 1)], sync=False)
    e.set_meta("store_stamp", "abc")
    e.close()
    rec = make_engine().open()
    assert rec.queues == [Q] and rec.users == [user] and rec.meta["store_stamp"] == "abc"
    p0 = rec.partitions[(1, 0)]
    assert [m.offset for m in p0.messages] == [0, 2]
    assert p0.delivered_upto == 1
    # offset 0: below the delivered mark, no count recorded -> it was out once
    # offset 2: count 2 recorded when its delivery ended, not below the mark
    assert [m.dc for m in p0.messages] == [1, 2] and p0.messages[1].seq == 9
    assert p0.next_offset == 3 and p0.producers == {"p": 9}
    assert [m.body for m in rec.partitions[(1, 1)].messages] == [b"other"]


def test_a_queue_keeps_its_owner_or_none(make_engine: Callable[[], Engine]) -> None:
    """The user who declared a queue comes back with it (the dead-letter check needs it); the
    node's own queues have none; a PutQueue of the queue again (a re-map) keeps what it says."""
    e = make_engine()
    e.open()
    own = QueueMeta(id=2, name="tandem.own", partitions=1, mapper="round_robin", ring_size=1, max_deliveries=0,
                    dead_letter_queue=None, max_length=0)
    e.apply([PutQueue(Q), PutQueue(own)], sync=True)
    e.apply([PutQueue(dataclasses.replace(Q, partitions=4))], sync=True)
    e.close()
    rec = make_engine().open()
    assert [(q.name, q.owner, q.partitions) for q in rec.queues] == [("q", "alice", 4), ("tandem.own", None, 1)]


def test_dropped_producers_are_gone_and_others_stay(make_engine: Callable[[], Engine]) -> None:
    e = make_engine()
    e.open()
    e.apply([PutQueue(Q), PutProducer(1, 0, "a", 3), PutProducer(1, 0, "b", 5), PutProducer(1, 1, "a", 1)],
            sync=True)
    e.apply([DropProducers(1, 0, ["a", "nobody"]), PutProducer(1, 0, "c", 2)], sync=True)
    e.close()
    rec = make_engine().open()
    assert rec.partitions[(1, 0)].producers == {"b": 5, "c": 2}
    assert rec.partitions[(1, 1)].producers == {"a": 1}  # another partition's "a" stays


def test_next_offset_survives_when_every_message_is_removed(make_engine: Callable[[], Engine]) -> None:
    e = make_engine()
    e.open()
    e.apply([PutQueue(Q), Append(1, 0, [msg(0), msg(1)], 2)], sync=True)
    e.apply([Settle(1, 0, [0, 1])], sync=True)
    e.close()
    rec = make_engine().open()
    assert rec.partitions[(1, 0)].next_offset == 2 and rec.partitions[(1, 0)].messages == []


def test_read_by_offset(make_engine: Callable[[], Engine]) -> None:
    e = make_engine()
    e.open()
    e.apply([PutQueue(Q), Append(1, 0, [msg(i) for i in range(10)], 10)], sync=True)
    e.apply([Settle(1, 0, [3])], sync=True)
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
    e.apply([DropUser("u")], sync=True)
    e.close()
    rec = make_engine().open()
    assert len(rec.partitions[(1, 1)].messages) == 1 and rec.users == []
    e2 = make_engine()
    e2.open()
    e2.apply([DropQueue(1)], sync=True)
    e2.close()
    rec = make_engine().open()
    assert rec.queues == [] and rec.partitions == {}


def test_grants_add_and_revoke_per_permission_and_go_with_their_user(make_engine: Callable[[], Engine]) -> None:
    e = make_engine()
    e.open()
    bob = UserRecord(name="bob", salt=b"s", hash=b"h", role="user", params="x")
    amy = UserRecord(name="amy", salt=b"s", hash=b"h", role="user", params="x")
    e.apply([PutUser(bob), PutUser(amy),
             GrantAcl(AclRecord(user="bob", pattern="orders.*", permissions=("produce", "consume"))),
             GrantAcl(AclRecord(user="bob", pattern="orders.*", permissions=("consume", "browse"))),
             GrantAcl(AclRecord(user="amy", pattern="*", permissions=("browse",)))], sync=True)
    e.apply([RevokeAcl(AclRecord(user="bob", pattern="orders.*", permissions=("produce", "configure"))),
             PutMeta("users", "group")], sync=True)
    e.close()
    rec = make_engine().open()
    assert {(a.user, a.pattern, tuple(sorted(a.permissions))) for a in rec.acls} == {
        ("bob", "orders.*", ("browse", "consume")), ("amy", "*", ("browse",))}
    assert rec.meta["users"] == "group"
    e2 = make_engine()
    e2.open()
    e2.apply([DropUser("bob")], sync=True)
    e2.close()
    rec = make_engine().open()
    assert [(a.user, a.pattern) for a in rec.acls] == [("amy", "*")] and [u.name for u in rec.users] == ["amy"]


def test_failed_batch_is_atomic(make_engine: Callable[[], Engine]) -> None:
    e = make_engine()
    e.open()
    e.apply([PutQueue(Q)], sync=True)
    bad = PutUser(UserRecord(name="x", salt=None, hash=b"", role="admin", params=""))  # type: ignore[arg-type]
    with pytest.raises(StorageError) as info:  # salt NOT NULL
        e.apply([Append(1, 0, [msg(0)], 1), Settle(1, 0, [0]), Append(1, 0, [msg(1)], 2), bad], sync=True)
    assert info.value.orig is not None
    # the engine is still usable and its view matches the disk
    e.apply([Append(1, 0, [msg(0)], 1), Append(1, 0, [msg(1)], 2), Settle(1, 0, [0])], sync=True)
    e.close()
    rec = make_engine().open()
    assert rec.queues == [Q] and [m.offset for m in rec.partitions[(1, 0)].messages] == [1]


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


class _LazyWriter:
    """A writer whose lazy writes wait for an eager commit (its clock, a FakeClock, never
    reaches ``lazy_delay``), with its callbacks run under a condition a test waits on;
    ``setup`` is committed on return."""

    def __init__(self, engine: Engine, setup: list[WriteOp]) -> None:
        self.cv = threading.Condition()
        self.writer = GroupCommitWriter(engine, self._notify, clock=FakeClock(), lazy_delay=60.0)
        done: list[BaseException | None] = []
        self.writer.submit(setup, sync=True, callback=done.append)
        self.wait(lambda: done == [None])

    def _notify(self, fn: Callable[[], None]) -> None:
        with self.cv:
            fn()
            self.cv.notify_all()

    def wait(self, until: Callable[[], bool]) -> None:
        with self.cv:
            assert self.cv.wait_for(until, timeout=30)


@pytest.mark.parametrize("eager_truncates", [False, True])
def test_log_appends_do_not_wait_behind_lazy_store_writes(tmp_path: Path, eager_truncates: bool) -> None:
    """Held-back store writes submitted lazily ride with the next commit; when that commit is
    of log appends alone (a publish's entry, to be fsynced before its confirm) the appends go
    first and the store writes right after, in a transaction of their own.  Anything else in
    the eager part (here a truncation) keeps the submission order: one commit."""
    applied: list[list[str]] = []

    class Recording(SqliteEngine):
        def apply(self, ops: list[WriteOp], *, sync: bool, store_sync: bool | None = None) -> None:
            applied.append(sorted({type(op).__name__ for op in ops}))
            super().apply(ops, sync=sync, store_sync=store_sync)

    e = Recording(tmp_path / "tandem.db")
    e.open()
    order: list[str] = []
    h = _LazyWriter(e, [PutQueue(Q), Append(1, 0, [msg(0)], 1)])
    w = h.writer
    w.submit([Settle(1, 0, [0]), PutProducer(1, 0, "p", 0)], sync=False, lazy=True,
             callback=lambda err: order.append("store"))
    eager: list[WriteOp] = [LogAppend(1, 0, [LogRecord(1, 1, "n1", False, b"entry")])]
    if eager_truncates:
        eager.insert(0, LogTruncate(1, 0, 1))
    w.submit(eager, sync=True, callback=lambda err: order.append("log"))
    h.wait(lambda: len(order) == 2)
    w.close()
    if eager_truncates:
        assert order == ["store", "log"] and applied[-1] == ["LogAppend", "LogTruncate", "PutProducer", "Settle"]
    else:
        assert order == ["log", "store"] and applied[-2:] == [["LogAppend"], ["PutProducer", "Settle"]]
    e.close()
    rec = SqliteEngine(tmp_path / "tandem.db").open()
    assert rec.partitions[(1, 0)].messages == [] and rec.partitions[(1, 0)].producers == {"p": 0}


def test_an_empty_submission_waits_for_the_lazy_writes_before_it(tmp_path: Path) -> None:
    """An empty eager submission is a barrier (the active submits what it holds, then waits
    for an empty write before it reads a snapshot): it is not "appends only", and must not go
    ahead of the lazy writes before it."""
    e = SqliteEngine(tmp_path / "tandem.db")
    e.open()
    order: list[str] = []
    h = _LazyWriter(e, [PutQueue(Q)])
    w = h.writer
    w.submit([PutProducer(1, 0, "p", 1)], sync=False, lazy=True, callback=lambda err: order.append("store"))
    w.submit([], sync=False, callback=lambda err: order.append("barrier"))
    h.wait(lambda: len(order) == 2)
    w.close()
    assert order == ["store", "barrier"]
    e.close()


def test_when_a_slice_of_lazy_writes_fails_the_rest_fails_with_it(tmp_path: Path) -> None:
    """Lazy writes committed in slices fail together, as in one transaction: a later slice
    committing over a failed one would carry an applied position past writes the store lacks."""
    e = SqliteEngine(tmp_path / "tandem.db")
    e.open()
    results: list[tuple[str, BaseException | None]] = []
    h = _LazyWriter(e, [PutQueue(Q)])
    w = h.writer
    bad = PutUser(UserRecord(name="x", salt=None, hash=b"", role="admin", params=""))  # type: ignore[arg-type]
    w.submit([*(PutProducer(1, 0, f"a{j}", 1) for j in range(600)), bad], sync=False, lazy=True,
             callback=lambda err: results.append(("first", err)))
    w.submit([PutProducer(1, 0, "b", 1)], sync=False, lazy=True, callback=lambda err: results.append(("second", err)))
    w.submit([LogAppend(1, 0, [LogRecord(1, 1, "n1", False, b"entry")])], sync=True,
             callback=lambda err: results.append(("log", err)))
    h.wait(lambda: len(results) == 3)
    w.close()
    assert [name for name, _ in results] == ["log", "first", "second"]
    assert results[0][1] is None and all(isinstance(err, StorageError) for _, err in results[1:])
    e.close()
    assert SqliteEngine(tmp_path / "tandem.db").open().partitions.get((1, 0)) is None  # neither slice


def test_lazy_store_writes_go_in_slices_and_an_append_waits_for_one_slice_only(tmp_path: Path) -> None:
    """Many held-back store writes behind a log append are committed a slice at a time
    (LAZY_SLICE_OPS), whole submissions each; an append submitted meanwhile goes after the
    slice being committed, not after all of them."""
    applied: list[str] = []
    w: GroupCommitWriter | None = None
    done: list[str] = []

    class Recording(SqliteEngine):
        def apply(self, ops: list[WriteOp], *, sync: bool, store_sync: bool | None = None) -> None:
            kinds = {type(op).__name__ for op in ops}
            applied.append("log" if kinds == {"LogAppend"} else f"store:{len(ops)}")
            super().apply(ops, sync=sync, store_sync=store_sync)
            if applied.count("log") == 1 and kinds != {"LogAppend"} and w is not None:
                # a publish's entry arrives while the first slice commits
                w.submit([LogAppend(1, 0, [LogRecord(2, 1, "n1", False, b"second")])], sync=True,
                         callback=lambda err: done.append("log2"))

    e = Recording(tmp_path / "tandem.db")
    e.open()
    h = _LazyWriter(e, [PutQueue(Q)])
    w = h.writer
    for i in range(8):  # 8 submissions of 200 ops: slices of 2 (400 ops <= LAZY_SLICE_OPS)
        w.submit([PutProducer(1, 0, f"p{j}", i) for j in range(200)], sync=False, lazy=True,
                 callback=lambda err, i=i: done.append(f"store{i}"))
    w.submit([LogAppend(1, 0, [LogRecord(1, 1, "n1", False, b"first")])], sync=True,
             callback=lambda err: done.append("log1"))
    h.wait(lambda: len(done) == 10)
    w.close()
    assert applied[-6:] == ["log", "store:400", "log", "store:400", "store:400", "store:400"], applied
    assert done == ["log1", "store0", "store1", "log2", *(f"store{i}" for i in range(2, 8))]
    e.close()
    rec = SqliteEngine(tmp_path / "tandem.db").open()
    assert rec.partitions[(1, 0)].producers == {f"p{j}": 7 for j in range(200)}


def test_a_failing_commit_observer_neither_fails_the_commit_nor_ends_the_writer(
        make_engine: Callable[[], Engine], caplog: pytest.LogCaptureFixture) -> None:
    e = make_engine()
    e.open()
    done: list[BaseException | None] = []
    w = GroupCommitWriter(e, lambda fn: fn())

    def broken(seconds: float, sync: bool) -> None:
        raise ValueError("metric backend gone")

    w.commit_observers.append(broken)
    with caplog.at_level(logging.ERROR, logger="tandem.storage"):
        w.submit([PutQueue(Q)], sync=True, callback=done.append)
        w.submit([Append(1, 0, [msg(0)], 1)], sync=True, callback=done.append)
        w.close()  # commits what is pending: the thread is still there to do it
    assert done == [None, None]
    assert len(e.read(1, 0, 0, 10)) == 1
    assert "commit observer" in caplog.text and "metric backend gone" in caplog.text


def test_writer_reports_failures_to_every_callback(make_engine: Callable[[], Engine]) -> None:
    e = make_engine()
    e.open()
    errors: list[BaseException | None] = []
    w = GroupCommitWriter(e, lambda fn: fn())
    bad = PutUser(UserRecord(name="x", salt=None, hash=b"", role="admin", params=""))  # type: ignore[arg-type]
    w.submit([PutQueue(Q), bad], sync=True, callback=errors.append)
    w.close()
    assert len(errors) == 1 and isinstance(errors[0], StorageError)
    assert w.stats.failed_commits == 1


def test_settled_chunks_are_deleted_and_out_of_order_settles_work(make_engine: Callable[[], Engine]) -> None:
    e = make_engine()
    e.open()
    e.apply([PutQueue(Q)] + [Append(1, 0, [msg(i) for i in range(b * 10, b * 10 + 10)], b * 10 + 10)
                             for b in range(5)], sync=True)
    # settle chunk 1 entirely, out of order, and half of chunk 0
    e.apply([Settle(1, 0, list(range(19, 9, -1))), Settle(1, 0, [0, 2, 4])], sync=True)
    assert [m.offset for m in e.read(1, 0, 0, 100)] == [1, 3] + list(range(5, 10)) + list(range(20, 50))
    e.apply([Settle(1, 0, [1, 3, 5, 6, 7, 8, 9] + list(range(20, 50)))], sync=True)
    assert e.read(1, 0, 0, 100) == []
    e.apply([Append(1, 0, [msg(50)], 51)], sync=True)
    e.close()
    e2 = make_engine()
    rec = e2.open()
    st = rec.partitions[(1, 0)]
    assert [m.offset for m in st.messages] == [50] and st.next_offset == 51
    if isinstance(e2, SqliteEngine):  # nothing settled is left behind in the tables
        conn = e2._writer
        assert conn is not None
        assert conn.exec_driver_sql("SELECT count(*) FROM chunks").scalar() == 1
        assert conn.exec_driver_sql("SELECT count(*) FROM settled").scalar() == 0
        conn.rollback()
    if isinstance(e2, PostgresEngine):
        assert e2._engine is not None
        with e2._engine.connect() as pg:
            assert pg.exec_driver_sql("SELECT count(*) FROM chunks").scalar() == 1
            assert pg.exec_driver_sql("SELECT count(*) FROM settled").scalar() == 0


def test_random_settle_orders_recover_exactly(make_engine: Callable[[], Engine]) -> None:
    import random

    rnd = random.Random(7)
    e = make_engine()
    e.open()
    e.apply([PutQueue(Q)], sync=True)
    live: set[int] = set()
    nxt = 0
    for _ in range(60):
        n = rnd.randint(1, 30)
        e.apply([Append(1, 0, [msg(o) for o in range(nxt, nxt + n)], nxt + n)], sync=rnd.random() < 0.5)
        live.update(range(nxt, nxt + n))
        nxt += n
        done = rnd.sample(sorted(live), k=rnd.randint(0, len(live)))
        e.apply([Settle(1, 0, done)], sync=False)
        live.difference_update(done)
    assert [m.offset for m in e.read(1, 0, 0, 10_000)] == sorted(live)
    e.close()
    rec = make_engine().open()
    got = rec.partitions[(1, 0)].messages if (1, 0) in rec.partitions else []
    assert [m.offset for m in got] == sorted(live)


# -- the replication log (replicated mode) --------------------------------------------------------


def test_replication_log_hard_state_and_applied_position_survive_reopen(make_engine: Callable[[], Engine]) -> None:
    from storage.base import LogAppend, LogCompact, LogRecord, LogTruncate, PutApplied, PutHardState

    e = make_engine()
    if not e.capabilities.replication_log:
        pytest.skip("capability: the engine keeps no replication log (shared mode)")
    e.open()
    recs = [LogRecord(i, 1 if i < 4 else 2, "n1", i == 5, bytes([i])) for i in range(1, 7)]
    e.apply([PutQueue(Q), LogAppend(1, 0, recs[:3])], sync=True)
    e.apply([LogAppend(1, 0, recs[3:]), PutHardState(1, 0, 2, "n2", 4)], sync=True)
    e.apply([LogTruncate(1, 0, 6), LogCompact(1, 0, 2, 1, "n1"), PutApplied(1, 0, 3, 1, "n1")], sync=False)
    e.apply([LogAppend(0, 0, [LogRecord(1, 1, "n3", False, b"meta")])], sync=True)
    e.close()
    rec = make_engine().open()
    st = rec.logs[(1, 0)]
    assert (st.term, st.voted_for, st.commit) == (2, "n2", 4)
    assert st.snapshot == (2, 1, "n1") and st.applied == (3, 1, "n1")
    assert [r.index for r in st.entries] == [3, 4, 5]
    assert st.entries[2] == LogRecord(5, 2, "n1", True, b"\x05")
    assert [r.data for r in rec.logs[(0, 0)].entries] == [b"meta"]


def test_reset_and_load_one_partition(make_engine: Callable[[], Engine]) -> None:
    from storage.base import ResetPartition

    e = make_engine()
    e.open()
    e.apply([PutQueue(Q), Append(1, 0, [msg(0), msg(1), msg(2)], 3), Append(1, 1, [msg(0)], 1),
             Settle(1, 0, [1]), MarkDelivered(1, 0, 1), PutProducer(1, 0, "p", 7)], sync=True)
    st = e.load_partition(1, 0)
    assert [m.offset for m in st.messages] == [0, 2] and st.messages[0].dc == 1
    assert st.next_offset == 3 and st.producers == {"p": 7}
    e.apply([ResetPartition(1, 0), Append(1, 0, [msg(5)], 6)], sync=True)
    st = e.load_partition(1, 0)
    assert [m.offset for m in st.messages] == [5] and st.next_offset == 6 and st.producers == {}
    assert [m.offset for m in e.load_partition(1, 1).messages] == [0]  # the other partition is untouched
    e.close()
    rec = make_engine().open()
    assert [m.offset for m in rec.partitions[(1, 0)].messages] == [5]


def test_partition_ops_travel_the_replication_log_unchanged() -> None:
    """What the active proposes is what a replica applies: every partition op survives its
    encoding as a log entry."""
    from broker.modes.replicated import decode_ops, encode_ops

    def plain(ops: list[WriteOp]) -> list[WriteOp]:  # appends with their messages as a list
        return [Append(op.queue_id, op.partition, list(op.messages), op.next_offset) if isinstance(op, Append)
                else op for op in ops]

    ops = [Append(1, 0, [msg(0), msg(1, pid="p", seq=4)], 2), Settle(1, 0, [0]), MarkDelivered(1, 0, 1),
           SetDeliveryCount(1, 0, [(1, 2)]), PutProducer(1, 0, "p", 4), DropProducers(1, 0, ["old-1", "old-2"]),
           Append(1, 0, [msg(5), msg(7)], 8)]  # not consecutive: travels message by message
    data, here = encode_ops(ops)
    there = decode_ops((1, 0), data)
    assert plain(there) == plain(here) == ops
    # consecutive appends travel (and are applied) in the stores' chunk format, undecoded
    assert isinstance(there[0], Append) and isinstance(there[0].messages, PackedRun)
    assert isinstance(here[0], Append) and isinstance(here[0].messages, PackedRun)
    assert isinstance(there[-1], Append) and isinstance(there[-1].messages, list)
    # entries written before the packed form still read
    import msgpack
    old = msgpack.packb([["A", 2, [[0, "k0", b"\x80", b"b", None, None, 1700000000.0]]]], use_bin_type=True)
    assert decode_ops((1, 0), old) == [Append(1, 0, [msg(0)], 2)]


def test_stored_end_is_what_the_store_has_committed(make_engine: Callable[[], Engine]) -> None:
    """A stream read caps what it reports at the store's own end (in a group the log
    commits before the store is written)."""
    e = make_engine()
    e.open()
    assert e.stored_end(1, 0) == 0
    e.apply([PutQueue(Q), Append(1, 0, [msg(0), msg(1), msg(2)], 3)], sync=True)
    assert e.stored_end(1, 0) == 3 and e.stored_end(1, 1) == 0
    e.apply([Settle(1, 0, [0, 1, 2])], sync=True)
    assert e.stored_end(1, 0) == 3  # settling does not move the end
    e.close()


def test_a_chunk_settled_in_the_batch_that_appends_it_leaves_nothing_behind(
        make_engine: Callable[[], Engine]) -> None:
    """In a group the store writes of committed entries are held back, so a batch often
    appends messages and settles them too: the partition must read as if both were
    written one after the other, now and after a restart."""
    e = make_engine()
    e.open()
    e.apply([PutQueue(Q), Append(1, 0, PackedRun.of([msg(0), msg(1), msg(2)]), 3), Settle(1, 0, [0, 1, 2]),
             Append(1, 0, [msg(3), msg(4)], 5), Settle(1, 0, [3])], sync=True)
    st = e.load_partition(1, 0)
    assert [m.offset for m in st.messages] == [4] and st.next_offset == 5
    assert e.stored_end(1, 0) == 5 and [m.offset for m in e.read(1, 0, 0, 10)] == [4]
    e.apply([Append(1, 0, [msg(5)], 6), Settle(1, 0, [4, 5])], sync=True)
    e.close()
    e = make_engine()
    e.open()
    st = e.load_partition(1, 0)
    assert st.messages == [] and st.next_offset == 6 and e.read(1, 0, 0, 10) == []
    e.apply([Append(1, 0, [msg(6)], 7)], sync=True)
    assert [m.offset for m in e.load_partition(1, 0).messages] == [6]
    e.close()


def test_a_budgeted_load_decodes_the_head_and_counts_the_rest(make_engine: Callable[[], Engine]) -> None:
    """What a new active loads (a budget of bytes): the head decoded, then a cold region whose
    count leaves out the settled offsets of every chunk past it, equal to what an unbounded
    load finds."""
    e = make_engine()
    e.open()
    body = b"x" * 1000
    e.apply([PutQueue(Q), *(Append(1, 0, [msg(o, body) for o in range(s, s + 5)], s + 5) for s in range(0, 30, 5)),
             Settle(1, 0, [1, 7, 12, 13, 29])], sync=True)
    full = e.load_partition(1, 0)
    head = e.load_partition(1, 0, budget=3 * message_cost(msg(0, body)))
    assert [m.offset for m in head.messages] == [0, 2, 3]
    assert (head.cold_start, head.cold_end, head.cold_count) == (4, 30, len(full.messages) - 3) == (4, 30, 22)
    assert head.cold_bytes > 0 and head.next_offset == full.next_offset == 30
    e.close()


def test_a_packed_append_is_stored_like_a_list(make_engine: Callable[[], Engine]) -> None:
    """An append that arrives packed (a replicated log entry) gives the same partition."""
    e = make_engine()
    e.open()
    e.apply([PutQueue(Q), Append(1, 0, PackedRun.of([msg(0), msg(1, pid="p", seq=3), msg(2)]), 3),
             Append(1, 1, [msg(0), msg(1, pid="p", seq=3), msg(2)], 3), Settle(1, 0, [1]), Settle(1, 1, [1])],
            sync=True)
    a, b = e.load_partition(1, 0), e.load_partition(1, 1)
    assert a.messages == b.messages and [m.offset for m in a.messages] == [0, 2] and a.next_offset == 3
    e.apply([Settle(1, 0, [0, 2])], sync=True)
    assert e.load_partition(1, 0).messages == []
    e.close()
    assert [m.offset for m in make_engine().open().partitions[(1, 1)].messages] == [0, 2]


def test_a_stream_keeps_its_type_and_trim_drops_whole_chunks_below_an_offset(
        make_engine: Callable[[], Engine]) -> None:
    """A stream's record comes back as it was declared; ``Trim(below)`` deletes the chunks that
    end at or below ``below`` (one append is one chunk in the stores that keep chunks; the memory
    engine's chunks are single messages), in every engine, and what it dropped stays dropped
    over a reopen; the chunk list says starts, counts and sizes."""
    e = make_engine()
    e.open()
    stream = QueueMeta(id=3, name="events", partitions=1, mapper="jump_hash", ring_size=1024, max_deliveries=0,
                       dead_letter_queue=None, max_length=0, type="stream", max_age=60_000, max_bytes=1 << 20)
    e.apply([PutQueue(stream)], sync=True)
    for start in (0, 3, 6):  # three appends: [0, 3), [3, 6), [6, 9)
        e.apply([Append(3, 0, [msg(i, b"x" * 10) for i in range(start, start + 3)], start + 3)], sync=True)
    chunks = e.chunks(3, 0)
    assert [s for s, _, _ in chunks] in ([0, 3, 6], list(range(9)))
    assert sum(n for _, n, _ in chunks) == 9 and all(b >= 10 * n for _, n, b in chunks)
    e.apply([Trim(3, 0, 4)], sync=True)  # the chunk [3, 6) straddles 4: it stays whole where it is one
    first = e.read(3, 0, 0, 100)[0].offset
    assert first in (3, 4)
    e.close()
    e = make_engine()
    rec = e.open()
    assert rec.queues == [stream]
    assert e.read(3, 0, 0, 1)[0].offset == first and e.stored_end(3, 0) == 9
    e.apply([Trim(3, 0, 9)], sync=True)
    assert e.read(3, 0, 0, 100) == [] and e.chunks(3, 0) == []


def test_a_queues_dead_letter_exchange_comes_back(make_engine: Callable[[], Engine]) -> None:
    """Where a queue's dead letters go (an exchange and a routing key, or the key left to each
    message) is stored with it, in every engine."""
    e = make_engine()
    e.open()
    routed = QueueMeta(id=5, name="work", partitions=2, mapper="jump_hash", ring_size=1024, max_deliveries=3,
                       dead_letter_queue=None, max_length=0, owner="alice", dead_letter_exchange="dlx",
                       dead_letter_routing_key="dead")
    keyless = QueueMeta(id=6, name="work2", partitions=1, mapper="jump_hash", ring_size=1024, max_deliveries=0,
                        dead_letter_queue=None, max_length=0, dead_letter_exchange="dlx")
    e.apply([PutQueue(routed), PutQueue(keyless)], sync=True)
    e.close()
    e = make_engine()
    assert e.open().queues == [routed, keyless]
    e.close()
