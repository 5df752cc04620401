"""Shared mode's store: the lease row on the database's clock, and fenced engines, on every
backend (SQLite for nodes on one machine, PostgreSQL)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from client.errors import StorageError
from storage.base import Append, LogAppend, LogRecord, PutQueue, QueueMeta, Settle, StoredMessage
from storage.postgres import PostgresEngine, PostgresShared
from storage.shared import FencedEngine, FencedError, Lease, SharedStore
from storage.sqlite import SqliteEngine
from storage.sqlite.shared import SqliteShared
from tests.helpers import wait_until_sync

Q = QueueMeta(id=1, name="q", partitions=1, mapper="consistent_hash", ring_size=64, max_deliveries=3,
              dead_letter_queue=None, max_length=0)


def msg(offset: int) -> StoredMessage:
    return StoredMessage(offset, None, b"\x80", b"m%d" % offset, None, None, 1700000000.0)


@dataclass
class Backend:
    """One shared database for a test: ``store()`` opens it as a node does (each call: another
    node's view, with connections of its own)."""

    name: str
    url: str  # as ``database = URL`` names it
    store: Callable[[], SharedStore]
    #: waits until some session is blocked on a lock (PostgreSQL); None: not observable
    wait_lock_waiter: Callable[[], None] | None = None
    #: a store whose lease gives up after ``seconds`` waiting for a lock (SQLite)
    impatient_store: Callable[[float], SharedStore] | None = None


def _sqlite(tmp_path: Path) -> Backend:
    path = tmp_path / "shared" / "tandem.db"
    return Backend("sqlite", f"sqlite:///{path}", lambda: SqliteShared(path),
                   impatient_store=lambda seconds: SqliteShared(path, busy_timeout=seconds))


def _postgresql(request: pytest.FixtureRequest) -> Backend:
    url = request.getfixturevalue("pg_url")

    def wait_lock_waiter() -> None:
        with psycopg.connect(url.replace("postgresql+psycopg", "postgresql"), autocommit=True) as conn:
            wait_until_sync(lambda: conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'").fetchone() != (0,), timeout=10, what="a session waiting for a lock")

    return Backend("postgresql", url, lambda: PostgresShared(url), wait_lock_waiter=wait_lock_waiter)


BACKENDS: dict[str, Callable[[pytest.FixtureRequest, Path], Backend]] = {
    "sqlite": lambda _request, tmp_path: _sqlite(tmp_path),
    "postgresql": lambda request, _tmp_path: _postgresql(request),
}


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return BACKENDS[request.param](request, tmp_path)


@pytest.fixture
def closing() -> Iterator[Callable[[Any], Any]]:
    """Registers leases and engines to close after the test."""
    things: list[Any] = []

    def add(thing: Any) -> Any:
        things.append(thing)
        return thing

    yield add
    for thing in reversed(things):
        thing.close()


def lease_of(backend: Backend, closing: Callable[[Any], Any]) -> Lease:
    lease: Lease = closing(backend.store().lease())
    return lease


def engine_of(backend: Backend, closing: Callable[[Any], Any]) -> FencedEngine:
    e: FencedEngine = closing(backend.store().engine())
    e.open()
    return e


def test_acquire_is_refused_while_held_and_holder_names_the_holder(backend: Backend, closing: Any) -> None:
    a, b = lease_of(backend, closing), lease_of(backend, closing)
    assert a.holder().node is None and a.holder().epoch == 0
    assert a.acquire("n1", "h1:1", 30.0) == 1
    assert b.acquire("n2", "h2:2", 30.0) is None
    assert a.acquire("n1", "h1:1", 30.0) is None  # held, if by itself: no second epoch
    h = b.holder()
    assert (h.node, h.epoch, h.address) == ("n1", 1, "h1:1") and 25.0 < h.remaining <= 30.0


def test_the_lease_expires_on_the_databases_clock(backend: Backend, closing: Any) -> None:
    a, b = lease_of(backend, closing), lease_of(backend, closing)
    assert a.acquire("n1", "h1:1", 0.3) == 1
    got: list[int | None] = []

    def taken() -> bool:
        got.append(b.acquire("n2", "h2:2", 30.0))
        return got[-1] is not None

    wait_until_sync(taken, timeout=10, what="the lease to expire")
    assert got[-1] == 2 and b.holder().node == "n2"
    assert not a.renew("n1", 1, 30.0)  # taken over: the old holder cannot renew


def test_renewal_extends_the_lease_of_the_holder_under_its_epoch_only(backend: Backend, closing: Any) -> None:
    a, b = lease_of(backend, closing), lease_of(backend, closing)
    assert a.acquire("n1", "h1:1", 1.0) == 1
    assert a.renew("n1", 1, 60.0) and a.holder().remaining > 50.0
    assert not b.renew("n2", 1, 60.0) and not a.renew("n1", 2, 60.0)
    assert b.acquire("n2", "h2:2", 1.0) is None


def test_release_lets_another_take_the_lease_at_once(backend: Backend, closing: Any) -> None:
    a, b = lease_of(backend, closing), lease_of(backend, closing)
    assert a.acquire("n1", "h1:1", 60.0) == 1
    a.release("n1", 7)  # not its epoch: nothing happens
    assert b.acquire("n2", "h2:2", 60.0) is None
    a.release("n1", 1)
    assert a.holder().node is None and a.holder().epoch == 1
    assert b.acquire("n2", "h2:2", 60.0) == 2


def test_claim_records_an_epoch_won_elsewhere_unless_a_later_one_is_there(backend: Backend, closing: Any) -> None:
    a, b = lease_of(backend, closing), lease_of(backend, closing)
    assert a.claim("n1", "h1:1", 5)
    h = b.holder()
    assert (h.node, h.epoch, h.address, h.remaining) == ("n1", 5, "h1:1", float("inf"))
    assert a.claim("n1", "h1:1", 5)  # the holder again under its epoch: fine
    assert not b.claim("n2", "h2:2", 4) and not b.claim("n2", "h2:2", 5)
    assert b.acquire("n2", "h2:2", 1.0) is None  # a claimed lease does not run out
    assert b.claim("n2", "h2:2", 6) and a.holder().node == "n2"
    assert not a.claim("n1", "h1:1", 5)


def test_two_nodes_using_a_fresh_database_at_once_get_one_lease(backend: Backend, closing: Any) -> None:
    leases = [lease_of(backend, closing) for _ in range(4)]
    start = threading.Barrier(len(leases))
    got: list[int | None | BaseException] = [None] * len(leases)

    def race(i: int) -> None:
        start.wait()
        try:
            got[i] = leases[i].acquire(f"n{i}", "h:1", 60.0)
        except BaseException as exc:
            got[i] = exc

    threads = [threading.Thread(target=race, args=(i,)) for i in range(len(leases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got, key=str) == [1, None, None, None], got


def test_engines_open_one_after_another_and_side_by_side(backend: Backend, closing: Any) -> None:
    first = backend.store().engine()
    first.open()
    first.apply([PutQueue(Q), Append(1, 0, [msg(0)], 1)], sync=True)
    first.close()
    second = engine_of(backend, closing)
    third = engine_of(backend, closing)  # (a passive may open before the active stops)
    assert [m.offset for m in second.read(1, 0, 0, 10)] == [0]
    second.apply([Append(1, 0, [msg(1)], 2)], sync=True)
    assert [m.offset for m in third.read(1, 0, 0, 10)] == [0, 1]


def test_shared_mode_keeps_no_replication_log(backend: Backend, closing: Any) -> None:
    e = engine_of(backend, closing)
    assert e.capabilities.shared and not e.capabilities.replication_log
    with pytest.raises(StorageError, match="no replication log"):
        e.apply([PutQueue(Q), LogAppend(1, 0, [LogRecord(1, 1, "n1", False, b"x")])], sync=True)
    assert e.read(1, 0, 0, 10) == [] and engine_of(backend, closing).open().queues == []


def test_a_fenced_engine_commits_nothing_once_the_lease_is_taken_over(backend: Backend, closing: Any) -> None:
    lease_a, lease_b = lease_of(backend, closing), lease_of(backend, closing)
    a = engine_of(backend, closing)
    assert lease_a.acquire("a", "ha:1", 60.0) == 1
    a.fence(1)
    a.apply([PutQueue(Q), Append(1, 0, [msg(0)], 1)], sync=True)
    a.set_meta("k", "a")
    lease_a.release("a", 1)  # (or it expires: either way B takes over with a later epoch)
    assert lease_b.acquire("b", "hb:1", 60.0) == 2
    with pytest.raises(FencedError) as info:
        a.apply([Append(1, 0, [msg(1)], 2)], sync=True)
    assert info.value.epoch == 2
    with pytest.raises(FencedError):
        a.set_meta("k", "stale")
    b = engine_of(backend, closing)
    b.fence(2)
    fresh = engine_of(backend, closing)
    assert [m.offset for m in fresh.read(1, 0, 0, 10)] == [0]  # A's refused row is not there
    b.apply([Append(1, 0, [msg(1)], 2)], sync=True)
    b.set_meta("k", "b")
    with pytest.raises(FencedError):  # still refused, even for a write B made possible
        a.apply([Append(1, 0, [msg(2)], 3)], sync=True)
    rec = engine_of(backend, closing).open()
    assert [m.offset for m in rec.partitions[(1, 0)].messages] == [0, 1] and rec.meta["k"] == "b"


def test_a_write_in_flight_commits_before_the_takeover_is_granted_never_after(
        backend: Backend, closing: Any) -> None:
    """A's transaction has passed its epoch check when B asks for the lease: B's takeover waits
    for A's commit (A's rows are there, under A's epoch), and A's next write is refused."""
    lease_a = lease_of(backend, closing)
    a = engine_of(backend, closing)
    assert lease_a.acquire("a", "ha:1", 0.2) == 1
    a.fence(1)
    a.apply([PutQueue(Q)], sync=True)
    wait_until_sync(lambda: lease_a.holder().remaining < 0, timeout=10, what="A's lease to run out")
    inside, go = threading.Event(), threading.Event()
    applier = a._applier  # type: ignore[attr-defined]
    plain = applier.apply

    def paused(conn: Any, ops: Any) -> Any:
        out = plain(conn, ops)
        inside.set()
        assert go.wait(30)
        return out

    applier.apply = paused
    a_result: list[BaseException | None] = []

    def write() -> None:
        try:
            a.apply([Append(1, 0, [msg(0)], 1)], sync=True)
            a_result.append(None)
        except BaseException as exc:
            a_result.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    assert inside.wait(30)
    if backend.impatient_store is not None:
        # SQLite: the takeover cannot be granted while A's transaction holds the write lock
        with pytest.raises(StorageError, match="locked"):
            closing(backend.impatient_store(0.2).lease()).acquire("b", "hb:1", 60.0)
        go.set()
        writer.join()
        granted = lease_of(backend, closing).acquire("b", "hb:1", 60.0)
    else:
        got: list[int | None] = []
        lease_b = lease_of(backend, closing)
        taker = threading.Thread(target=lambda: got.append(lease_b.acquire("b", "hb:1", 60.0)))
        taker.start()
        assert backend.wait_lock_waiter is not None
        backend.wait_lock_waiter()  # B's UPDATE waits for A's transaction
        assert got == []
        go.set()
        writer.join()
        taker.join()
        granted = got[0]
    applier.apply = plain
    assert a_result == [None] and granted == 2
    assert [m.offset for m in engine_of(backend, closing).read(1, 0, 0, 10)] == [0]
    with pytest.raises(FencedError):
        a.apply([Append(1, 0, [msg(1)], 2)], sync=True)


def test_processes_racing_for_the_lease_of_a_fresh_sqlite_file_get_one(tmp_path: Path) -> None:
    """Nodes on one machine are processes: three of them create the table and ask for the
    lease at once; one gets epoch 1, the others None, none an error."""
    import subprocess
    import sys

    path = tmp_path / "shared" / "tandem.db"
    code = ("import sys; from storage.sqlite.shared import SqliteShared; "
            "lease = SqliteShared(sys.argv[1]).lease(); sys.stdin.readline(); "
            "print(lease.acquire(sys.argv[2], 'h:1', 60.0)); lease.close()")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path), f"n{i}"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=Path.cwd())
             for i in range(3)]
    try:
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
    assert sorted(out.strip() for out, _ in outs) == ["1", "None", "None"]


def chunk_rows(engine: FencedEngine) -> int:
    """The chunk rows in the engine's database (nothing settled whole may be left behind)."""
    if isinstance(engine, PostgresEngine):
        assert engine._engine is not None
        with engine._engine.connect() as conn:
            return int(conn.exec_driver_sql("SELECT count(*) FROM chunks").scalar_one())
    assert isinstance(engine, SqliteEngine) and engine._writer is not None
    n = int(engine._writer.exec_driver_sql("SELECT count(*) FROM chunks").scalar_one())
    engine._writer.rollback()
    return n


def test_a_node_that_takes_the_lease_again_writes_on_what_the_other_wrote(backend: Backend, closing: Any) -> None:
    """A, B, then A again with the engine it kept: A's view of the tables (which chunks are
    there, which ranges settled) is read again, so its compaction deletes what B left."""
    lease = lease_of(backend, closing)
    a, b = engine_of(backend, closing), engine_of(backend, closing)
    assert lease.acquire("a", "ha:1", 60.0) == 1
    a.fence(1)
    a.apply([PutQueue(Q), Append(1, 0, [msg(i) for i in range(10)], 10)], sync=True)
    lease.release("a", 1)
    assert lease.acquire("b", "hb:1", 60.0) == 2
    b.fence(2)
    b.apply([Append(1, 0, [msg(i) for i in range(10, 20)], 20), Settle(1, 0, list(range(10)))], sync=True)
    lease.release("b", 2)
    assert lease.acquire("a", "ha:1", 60.0) == 3
    a.fence(3)
    a.apply([Append(1, 0, [msg(20)], 21), Settle(1, 0, list(range(10, 20)))], sync=True)
    assert [m.offset for m in a.read(1, 0, 0, 100)] == [20] and chunk_rows(a) == 1
    rec = engine_of(backend, closing).open()
    assert [m.offset for m in rec.partitions[(1, 0)].messages] == [20] and rec.partitions[(1, 0)].next_offset == 21


def test_a_node_loading_the_store_holds_up_neither_writes_nor_the_lease(
        backend: Backend, closing: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A passive (or activating) node reads everything on open, for as long as that takes; the
    active's writes and lease renewals go on meanwhile."""
    import storage.postgres.engine
    import storage.sqlite.engine

    lease = closing(backend.impatient_store(0.5).lease() if backend.impatient_store else backend.store().lease())
    a = engine_of(backend, closing)
    assert lease.acquire("a", "ha:1", 60.0) == 1
    a.fence(1)
    a.apply([PutQueue(Q), Append(1, 0, [msg(0)], 1)], sync=True)
    module: Any = storage.sqlite.engine if backend.name == "sqlite" else storage.postgres.engine
    inside, go = threading.Event(), threading.Event()
    plain = module.load

    def slow_load(*args: Any) -> Any:
        out = plain(*args)  # (in the read transaction, which stays open)
        inside.set()
        assert go.wait(30)
        return out

    monkeypatch.setattr(module, "load", slow_load)
    passive = closing(backend.store().engine())
    opener = threading.Thread(target=passive.open)
    opener.start()
    try:
        assert inside.wait(30)
        done: list[BaseException | None] = []

        def active_work() -> None:
            try:
                a.apply([Append(1, 0, [msg(1)], 2)], sync=True)
                assert lease.renew("a", 1, 60.0)
                done.append(None)
            except BaseException as exc:
                done.append(exc)

        worker = threading.Thread(target=active_work)
        worker.start()
        worker.join(timeout=20)
        assert done == [None]
    finally:
        go.set()
        opener.join()
    assert [m.offset for m in passive.read(1, 0, 0, 10)] == [0, 1]


def test_an_active_process_killed_mid_stream_leaves_a_store_the_next_one_opens(backend: Backend) -> None:
    """The active (a process) commits, then dies with SIGKILL while it keeps committing; the
    next node's engine opens every commit it confirmed, in order, and writes on under a later
    epoch.  (SQLite: the replication log's directory beside the file stays empty.)"""
    import signal
    import subprocess
    import sys

    code = """
import sys
from storage.base import Append, PutQueue, QueueMeta, StoredMessage
from storage.shared_factory import open_shared
store = open_shared(sys.argv[1])
lease, engine = store.lease(), store.engine()
engine.open()
engine.fence(lease.acquire("a", "ha:1", 0.5))
engine.apply([PutQueue(QueueMeta(id=1, name="q", partitions=1, mapper="consistent_hash", ring_size=64,
                                 max_deliveries=3, dead_letter_queue=None, max_length=0))], sync=True)
i = 0
while True:
    engine.apply([Append(1, 0, [StoredMessage(i, None, b"\\x80", b"m", None, None, 0.0)], i + 1)], sync=True)
    print(i, flush=True)
    i += 1
"""
    proc = subprocess.Popen([sys.executable, "-c", code, backend.url], stdout=subprocess.PIPE, text=True,
                            cwd=Path.cwd())
    try:
        assert proc.stdout is not None
        confirmed = [int(proc.stdout.readline()) for _ in range(50)]  # 50 commits confirmed
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    store = backend.store()
    lease, engine = store.lease(), store.engine()
    try:
        rec = engine.open()
        offsets = [m.offset for m in rec.partitions[(1, 0)].messages]
        assert offsets[:50] == confirmed and offsets == list(range(len(offsets)))  # every one, in order
        got: list[int | None] = []

        def taken() -> bool:  # the dead one's lease runs out
            got.append(lease.acquire("b", "hb:1", 60.0))
            return got[-1] is not None

        wait_until_sync(taken, timeout=10, what="the lease to run out")
        epoch = got[-1]
        assert epoch == 2
        engine.fence(epoch)
        n = len(offsets)
        engine.apply([Append(1, 0, [msg(n)], n + 1)], sync=True)
        assert [m.offset for m in engine.read(1, 0, 0, 1000)] == list(range(n + 1))
        if backend.name == "sqlite":
            log_dir = Path(backend.url.removeprefix("sqlite:///") + "-log")
            assert not any(f.stat().st_size for f in log_dir.glob("*.seg"))  # (no record in the log)
    finally:
        engine.close()
        lease.close()


def test_the_group_commit_writer_does_not_retry_a_fenced_write(backend: Backend, closing: Any) -> None:
    """Writes whose submitter cannot act on an error (``retry=True``) are tried again after a
    failed commit, but not once fenced: every later one would be refused too.  They get the
    FencedError, and the writer closes."""
    from storage.writer import GroupCommitWriter

    lease = lease_of(backend, closing)
    a = engine_of(backend, closing)
    assert lease.acquire("a", "ha:1", 60.0) == 1
    a.fence(1)
    results: list[BaseException | None] = []
    w = GroupCommitWriter(a, lambda fn: fn())
    w.submit([PutQueue(Q)], sync=True, callback=results.append)
    wait_until_sync(lambda: results == [None], timeout=10, what="the first commit")
    lease.release("a", 1)
    assert lease.acquire("b", "hb:1", 60.0) == 2
    w.submit([Append(1, 0, [msg(0)], 1)], sync=True, callback=results.append, retry=True)
    w.submit([Settle(1, 0, [0])], sync=False, callback=results.append, retry=True, lazy=True)
    w.close()
    assert results[0] is None and len(results) == 3
    assert all(isinstance(err, FencedError) and err.epoch == 2 for err in results[1:])
    assert w.stats.retried_ops == 0
