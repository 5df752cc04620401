"""Shared mode's store: the lease row on the database's clock, and fenced engines, on every
backend (SQLite for nodes on one machine, PostgreSQL)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from client.errors import StorageError
from storage.base import Append, LogAppend, LogRecord, PutQueue, QueueMeta, StoredMessage
from storage.shared import FencedEngine, FencedError, Lease, SharedStore
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
    store: Callable[[], SharedStore]
    #: waits until some session is blocked on a lock (PostgreSQL); None: not observable
    wait_lock_waiter: Callable[[], None] | None = None
    #: a store whose lease gives up after ``seconds`` waiting for a lock (SQLite)
    impatient_store: Callable[[float], SharedStore] | None = None


def _sqlite(tmp_path: Path) -> Backend:
    path = tmp_path / "shared" / "tandem.db"
    return Backend("sqlite", lambda: SqliteShared(path),
                   impatient_store=lambda seconds: SqliteShared(path, busy_timeout=seconds))


BACKENDS: dict[str, Callable[[pytest.FixtureRequest, Path], Backend]] = {
    "sqlite": lambda _request, tmp_path: _sqlite(tmp_path),
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
