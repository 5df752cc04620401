"""The PostgreSQL engine's own behaviour, against the local server: what it says when the
database is not there, what it does when its connection is cut, how a stopped node's
transaction is ended so that a takeover goes through, and two nodes creating the schema at
once.  (What every engine does is in test_store_conformance.py and test_shared_lease.py.)"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import psycopg
import pytest

from client.errors import StorageError
from storage.base import Append, PutQueue, QueueMeta, StoredMessage
from storage.postgres import PostgresEngine, PostgresShared
from storage.shared_factory import open_shared
from tests.helpers import wait_until_sync

Q = QueueMeta(id=1, name="q", partitions=1, mapper="consistent_hash", ring_size=64, max_deliveries=3,
              dead_letter_queue=None, max_length=0)


def msg(offset: int) -> StoredMessage:
    return StoredMessage(offset, None, b"\x80", b"m%d" % offset, None, None, 1700000000.0)


def admin(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url.replace("postgresql+psycopg", "postgresql"), autocommit=True)


def test_a_database_that_is_not_there_is_a_clear_error_without_the_password() -> None:
    store = open_shared("postgresql+psycopg://tandem:s3cret-pw@127.0.0.1:1/nothing")
    engine = store.engine()
    with pytest.raises(StorageError) as info:
        engine.open()
    text = str(info.value)
    assert "s3cret-pw" not in text and "127.0.0.1:1" in text and "cannot open store" in text
    assert "***" in text and info.value.orig is not None
    lease = store.lease()
    with pytest.raises(StorageError) as info:
        lease.acquire("n1", "h:1", 1.0)
    assert "s3cret-pw" not in str(info.value) and "lease acquire" in str(info.value)
    lease.close()
    engine.close()


def test_a_url_of_another_kind_is_refused_by_name() -> None:
    with pytest.raises(StorageError, match="expected postgresql"):
        PostgresShared("postgresql+asyncpg://u:pw@h/db")
    with pytest.raises(StorageError, match="expected postgresql"):
        open_shared("mysql://u@h/db")


def test_a_cut_connection_fails_the_batch_in_flight_and_the_next_one_reconnects(pg_url: str) -> None:
    e = PostgresShared(pg_url).engine()
    e.open()
    try:
        e.apply([PutQueue(Q), Append(1, 0, [msg(0)], 1)], sync=True)
        with admin(pg_url) as conn:  # what a server restart looks like from the client
            killed = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                                  "datname = current_database() AND pid <> pg_backend_pid()").fetchall()
        assert killed and all(ok for (ok,) in killed)
        with pytest.raises(StorageError, match="write failed") as info:
            e.apply([Append(1, 0, [msg(1)], 2)], sync=True)
        assert info.value.retriable
        e.apply([Append(1, 0, [msg(1)], 2)], sync=True)  # a new connection, the index read again
        assert [m.offset for m in e.read(1, 0, 0, 10)] == [0, 1]
    finally:
        e.close()


@pytest.mark.parametrize("takeover", ["acquire", "claim"])
def test_a_node_stopped_inside_a_write_transaction_cannot_hold_up_a_takeover(
        pg_url: str, caplog: pytest.LogCaptureFixture, takeover: str) -> None:
    """A write transaction left idle past ``idle_timeout`` (the node stopped inside it, here
    right after a pipelined executemany, where the server's own idle timeout is not armed) is
    ended by the takeover: the takeover goes through, and the stopped node's commit fails,
    with nothing of it in the database."""
    store = PostgresShared(pg_url, idle_timeout=0.5)
    lease_a, lease_b = store.lease(), store.lease()
    a = store.engine()
    a.open()
    try:
        assert lease_a.acquire("a", "ha:1", 0.1) == 1
        a.fence(1)
        a.apply([PutQueue(Q)], sync=True)
        inside, go = threading.Event(), threading.Event()
        plain = a._applier.apply

        def stopped(conn: Any, ops: Any) -> Any:
            out = plain(conn, ops)
            inside.set()
            assert go.wait(30)  # "SIGSTOP" until the test says
            return out

        a._applier.apply = stopped  # type: ignore[method-assign]
        result: list[BaseException | None] = []

        def write() -> None:
            try:
                a.apply([Append(1, 0, [msg(0)], 1)], sync=True)
                result.append(None)
            except BaseException as exc:
                result.append(exc)

        writer = threading.Thread(target=write)
        writer.start()
        assert inside.wait(30)
        got: list[int | None] = []

        def taken() -> bool:  # the lease runs out on the database's clock (or a file lock is won,
            # claim): the takeover waits for A's transaction, then ends it
            if takeover == "claim":
                got.append(2 if lease_b.claim("b", "hb:1", 2) else None)
            else:
                got.append(lease_b.acquire("b", "hb:1", 60.0))
            return got[-1] is not None

        wait_until_sync(taken, timeout=20, what="the takeover")
        granted = got[-1]
        go.set()
        writer.join()
        a._applier.apply = plain  # type: ignore[method-assign]
        # granted once A's transaction ended: the server's idle_in_transaction_session_timeout or
        # the taker's pg_terminate_backend ("lease takeover: ended session"), whichever came first
        assert granted == 2
        assert len(result) == 1 and isinstance(result[0], StorageError)
        fresh = store.engine()
        fresh.open()
        assert fresh.read(1, 0, 0, 10) == []
        fresh.close()
    finally:
        a.close()
        lease_a.close()
        lease_b.close()


def test_two_nodes_creating_the_schema_at_once_both_open(pg_url: str) -> None:
    engines = [PostgresShared(pg_url).engine() for _ in range(4)]
    start = threading.Barrier(len(engines))
    errors: list[BaseException] = []

    def open_one(e: PostgresEngine) -> None:
        start.wait()
        try:
            e.open()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for e in engines:
        e.close()
    assert errors == []


def test_a_session_stopped_mid_statement_holding_the_row_is_ended_once_the_lease_ran_out(pg_url: str) -> None:
    """A node stopped while the server still runs (or waits for the rest of) its statement
    leaves its session "active", not idle: the server's idle timeout never ends it.  A taker
    ends it once the lease has run out, and only then."""
    store = PostgresShared(pg_url, idle_timeout=0.5)
    lease_a, lease_b = store.lease(), store.lease()
    assert lease_a.acquire("a", "ha:1", 5.0) == 1
    stuck = admin(pg_url)
    stuck.execute("BEGIN")
    stuck.execute("SELECT epoch FROM tandem_lease WHERE id = 1 FOR SHARE")
    sleeper = threading.Thread(target=lambda: _ignore(lambda: stuck.execute("SELECT pg_sleep(60)")))
    sleeper.start()
    try:
        # a's lease (5 s) is current: the taker gives up at its lock timeout and ends nothing
        assert lease_b.acquire("b", "hb:1", 60.0) is None
        assert sleeper.is_alive()
        got: list[int | None] = []
        wait_until_sync(lambda: got.append(lease_b.acquire("b", "hb:1", 60.0)) or got[-1] is not None,
                        timeout=30, what="a takeover once a's lease ran out")
        assert got[-1] == 2
        sleeper.join(30)
        assert not sleeper.is_alive()  # its session was ended
    finally:
        stuck.close()
        lease_a.close()
        lease_b.close()


def _ignore(fn: Any) -> None:
    try:
        fn()
    except psycopg.Error:
        pass  # ended by the takeover: what the test wants


def test_only_the_writer_session_is_ended_when_idle_in_a_transaction(pg_url: str) -> None:
    """Loading a big store reads in one transaction and unpacks between statements for as
    long as it takes: the idle timeout is the writer's alone (the one locking the lease row)."""
    e = PostgresShared(pg_url, idle_timeout=0.2).engine()
    e.open()
    try:
        e.apply([PutQueue(Q)], sync=True)
        assert e._engine is not None
        with e._engine.connect() as conn:  # a pooled (reader) connection
            assert conn.exec_driver_sql("SHOW idle_in_transaction_session_timeout").scalar() == "0"
        raw = e._raw_writer()
        assert raw.execute("SHOW idle_in_transaction_session_timeout").fetchone() == ("200ms",)
        raw.rollback()
    finally:
        e.close()


@pytest.mark.asyncio
async def test_the_database_going_away_and_coming_back(pg_url: str) -> None:
    """Through a link that is cut (every connection dropped, new ones refused) and healed:
    while it is cut every write, read and lease operation fails at once with a StorageError
    (the engine is not broken by it); once healed they work again on new connections, the
    engine's index read again."""
    import asyncio

    from broker.tools.faults import FaultProxy

    proxy = await FaultProxy(("127.0.0.1", 5432)).start()
    url = pg_url.replace("127.0.0.1:5432", proxy.address)
    store = PostgresShared(url)
    e, lease = store.engine(), store.lease()
    try:
        await asyncio.to_thread(e.open)
        assert await asyncio.to_thread(lease.acquire, "a", "ha:1", 60.0) == 1
        e.fence(1)
        await asyncio.to_thread(e.apply, [PutQueue(Q), Append(1, 0, [msg(0)], 1)], sync=True)
        proxy.cut()
        for call in (lambda: e.apply([Append(1, 0, [msg(1)], 2)], sync=True), lambda: e.read(1, 0, 0, 10),
                     lambda: lease.renew("a", 1, 60.0), lambda: lease.holder()):
            with pytest.raises(StorageError) as info:
                await asyncio.to_thread(call)
            assert "127.0.0.1" in str(info.value)
        proxy.heal()
        assert await asyncio.to_thread(lease.renew, "a", 1, 60.0)
        await asyncio.to_thread(e.apply, [Append(1, 0, [msg(1)], 2)], sync=True)
        assert [m.offset for m in await asyncio.to_thread(e.read, 1, 0, 0, 10)] == [0, 1]
    finally:
        await asyncio.to_thread(e.close)
        await asyncio.to_thread(lease.close)
        await proxy.stop()


def test_a_database_without_the_snapshot_mark_columns_gains_them(pg_url: str) -> None:
    """A database made before ha_state kept a snapshot's weak mark: opened, it gains them."""
    e = PostgresShared(pg_url).engine()
    e.open()
    e.close()
    schema = pg_url.rsplit("%3D", 1)[1]
    with admin(pg_url.split("?")[0]) as conn:
        for column in ("snap_weak", "snap_recency_term", "snap_recency_index"):
            conn.execute(f'ALTER TABLE "{schema}".ha_state DROP COLUMN {column}')
    again = PostgresShared(pg_url).engine()
    again.open()
    again.close()
    with admin(pg_url.split("?")[0]) as conn:
        have = {r[0] for r in conn.execute("SELECT column_name FROM information_schema.columns WHERE table_schema = %s "
                                           "AND table_name = 'ha_state'", (schema,))}
    assert {"snap_weak", "snap_recency_term", "snap_recency_index"} <= have


def test_a_database_without_queue_owners_gains_the_column_and_reads_none(pg_url: str) -> None:
    """A database made before queues kept who declared them: opened, it gains the column, its
    queues read with no owner, and an owner written then comes back."""
    e = PostgresShared(pg_url).engine()
    e.open()
    e.apply([PutQueue(Q)], sync=True)
    e.close()
    schema = pg_url.rsplit("%3D", 1)[1]
    with admin(pg_url.split("?")[0]) as conn:
        conn.execute(f'ALTER TABLE "{schema}".queues DROP COLUMN owner')
    again = PostgresShared(pg_url).engine()
    assert [q.owner for q in again.open().queues] == [None]
    again.apply([PutQueue(dataclasses.replace(Q, owner="bob"))], sync=True)
    again.close()
    third = PostgresShared(pg_url).engine()
    assert [q.owner for q in third.open().queues] == ["bob"]
    third.close()
