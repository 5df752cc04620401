"""Edge cases: large messages, NO_SYNC stream reads, store failures, cancellations, leaks."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import pytest_asyncio

import client
from broker.config import NodeConfig, build_config
from broker.node.node import Node
from client.errors import QueueFullError, StorageError
from client.protocol.frames import Publish, PublishMessage, PublishOk
from storage.base import Append, Engine, Settle, WriteOp
from storage.sqlite import SqliteEngine
from tests.conftest import url_of
from tests.helpers import wait_until

pytestmark = pytest.mark.asyncio


class FlakyEngine(SqliteEngine):
    """SQLite that fails every commit ``failing(ops)`` picks, while it is set."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.failing: Callable[[list[WriteOp]], bool] | None = None
        self.failures = 0

    def apply(self, ops: list[WriteOp], *, sync: bool, store_sync: bool | None = None) -> None:
        if self.failing is not None and self.failing(ops):
            self.failures += 1
            raise StorageError("injected failure")
        super().apply(ops, sync=sync, store_sync=store_sync)


async def started(tmp_path: Path, **kw: object) -> Node:
    n = Node(build_config({"data_dir": tmp_path / "node1", "port": 0, **kw}))
    await n.start()
    return n


@pytest_asyncio.fixture
async def flaky(tmp_path: Path) -> AsyncIterator[tuple[Node, FlakyEngine]]:
    engines: list[FlakyEngine] = []

    def make(cfg: NodeConfig) -> Engine:
        engines.append(FlakyEngine(cfg.db_path))
        return engines[-1]

    n = Node(NodeConfig(data_dir=tmp_path / "node1", port=0), engine=make)
    await n.start()
    try:
        yield n, engines[0]
    finally:
        await n.stop()


async def test_large_messages_are_delivered_and_read_in_frames_that_fit(conn: client.DurableConnection) -> None:
    big = 4 * 1024 * 1024  # under the 5 MiB message limit; three do not fit one 8 MiB frame
    await conn.declare_queue("big")
    await conn.producer("big").send_many([bytes([i]) * big for i in range(3)])
    got, offset = [], 0
    while len(got) < 3:
        msgs, offset, end = await conn.read("big", 0, offset=offset, max_messages=10)
        assert msgs, "a read must make progress"
        got += [m.body[0] for m in msgs]
    assert got == [0, 1, 2]
    async with conn.consumer("big", prefetch=10) as c:
        bodies = []
        for _ in range(3):
            m = await c.next(30)
            assert m is not None and len(m.body) == big
            bodies.append(m.body[0])
            await m.ack()
    assert sorted(bodies) == [0, 1, 2]


async def test_no_sync_stream_reads_skip_nothing(tmp_path: Path) -> None:
    node = await started(tmp_path, sync="NO_SYNC")
    try:
        async with await client.connect(url_of(node)) as conn:
            await conn.declare_queue("s")
            await conn.declare_queue("dlq")
            await conn.declare_queue("w", dead_letter_queue="dlq")
            await conn.producer("s").send_many([str(i) for i in range(100)])
            seen: list[int] = []
            offset = 0

            async def read_all() -> bool:
                nonlocal offset
                msgs, offset, _end = await conn.read("s", 0, offset=offset)
                seen.extend(int(m.body) for m in msgs)
                return len(seen) >= 100

            await wait_until(read_all, what="100 messages read")
            assert seen == list(range(100))
            await conn.producer("w").send_many([b"a", b"b", b"c"])
            for _ in range(3):
                m = await conn.get("w")
                assert m is not None
                await m.reject()
            dead: list[bytes] = []
            doff = 0

            async def read_dlq() -> bool:
                nonlocal doff
                msgs, doff, _end = await conn.read("dlq", 0, offset=doff)
                dead.extend(m.body for m in msgs)
                return len(dead) >= 3

            await wait_until(read_dlq, what="3 dead-lettered messages read")
            assert sorted(dead) == [b"a", b"b", b"c"]
    finally:
        await node.stop()


async def test_failed_commit_lets_every_failed_batch_be_stored_again(
        flaky: tuple[Node, FlakyEngine]) -> None:
    node, engine = flaky
    async with await client.connect_link(url_of(node)) as conn:
        await conn.declare_queue("q")
        a = [PublishMessage(None, {}, b"A", i) for i in range(5)]
        b = [PublishMessage(None, {}, b"B", i) for i in range(5, 10)]
        engine.failing = lambda ops: any(isinstance(o, Append) for o in ops)
        fa = conn.request_nowait(Publish(rid=conn.next_rid(), queue="q", messages=a, producer_id="p"))
        fb = conn.request_nowait(Publish(rid=conn.next_rid(), queue="q", messages=b, producer_id="p"))
        for fut in (fa, fb):
            with pytest.raises(StorageError):
                await fut
        engine.failing = None
        ra = await conn.request(lambda rid: Publish(rid=rid, queue="q", messages=a, producer_id="p"))
        rb = await conn.request(lambda rid: Publish(rid=rid, queue="q", messages=b, producer_id="p"))
        assert isinstance(ra, PublishOk) and isinstance(rb, PublishOk)
        assert (ra.stored, rb.stored) == (5, 5)
        assert (await conn.list_queues())[0].ready == 10


async def test_failed_settlement_commit_is_retried(flaky: tuple[Node, FlakyEngine], tmp_path: Path) -> None:
    node, engine = flaky
    async with await client.connect(url_of(node)) as conn:
        await conn.declare_queue("q")
        await conn.producer("q").send_many([b"x", b"y"])
        m = await conn.get("q")
        assert m is not None
        engine.failing = lambda ops: any(isinstance(o, Settle) for o in ops)
        await m.ack()
        await wait_until(lambda: engine.failures >= 2, what="the settlement to fail and be retried")
        engine.failing = None
        await wait_until(lambda: node.store.writer.stats.commits > node.store.writer.stats.failed_commits + 4
                         and not node.store.writer._pending, what="the retry to commit")
    await node.stop()
    again = await started(tmp_path)
    try:
        async with await client.connect(url_of(again)) as conn:
            (info,) = await conn.list_queues()
            assert info.ready == 1  # the ack survived the failed commit
    finally:
        await again.stop()


async def test_consumer_survives_a_timeout_during_subscribe(conn: client.DurableConnection, node: Node) -> None:
    await conn.declare_queue("q")
    await conn.producer("q").send_many([str(i) for i in range(100)])
    c = conn.consumer("q", prefetch=50)
    assert await c.next(timeout=0) is None  # gives up before the subscription is answered
    got = []
    while len(got) < 100:
        m = await c.next(10)
        assert m is not None, f"{len(got)} of 100"
        got.append(m.body)
        m.ack()
    assert len(node.catalogue.queues["q"].consumers) == 1
    await c.cancel()


async def test_close_sends_pending_acks_first(url: str) -> None:
    async with await client.connect(url) as conn:
        await conn.declare_queue("q")
        await conn.producer("q").send(b"x")
    conn = await client.connect(url)
    m = await conn.get("q")
    assert m is not None
    m.ack()  # not awaited
    await conn.close()
    async with await client.connect(url) as conn:
        assert (await conn.list_queues())[0].ready == 0


async def test_unseen_buffered_messages_are_not_charged_a_delivery(url: str) -> None:
    async with await client.connect(url) as conn:
        await conn.declare_queue("dlq")
        await conn.declare_queue("work", max_deliveries=2, dead_letter_queue="dlq")
        await conn.producer("work").send_many([str(i) for i in range(10)])
    for _ in range(3):  # like `tandem consume work -n 1`, three times
        async with await client.connect(url) as conn:
            async with conn.consumer("work", prefetch=256) as c:
                m = await c.next(10)
                assert m is not None
                await m.ack()
    async with await client.connect(url) as conn:
        infos = {q.name: q for q in await conn.list_queues()}
        assert infos["dlq"].ready == 0 and infos["work"].ready == 7
        async with conn.consumer("work") as c:
            m = await c.next(10)
            assert m is not None and (m.redelivered, m.delivery_count) == (False, 1)
            await m.ack()


async def test_blocking_consumer_learns_of_a_broker_cancel(url: str, node: Node) -> None:
    from client import blocking
    from client.errors import ConsumerCancelledError

    async with await client.connect(url) as conn:
        await conn.declare_queue("q")
    outcome: list[BaseException] = []
    ready = threading.Event()

    def consume() -> None:
        with blocking.connect(url) as bconn:
            c = bconn.consumer("q")
            ready.set()
            try:
                c.next()
            except ConsumerCancelledError as exc:
                outcome.append(exc)

    t = threading.Thread(target=consume)
    t.start()
    await asyncio.to_thread(ready.wait, 30)
    await wait_until(lambda: len(node.catalogue.queues["q"].consumers) == 1, what="the blocking consumer")
    async with await client.connect(url) as conn:
        await conn.delete_queue("q")
    await asyncio.to_thread(t.join, 30)
    assert not t.is_alive() and len(outcome) == 1


def _open_db_fds(db: Path) -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(db)):
            out.append(target)
    return out


async def test_stop_and_failed_start_leave_nothing_open(tmp_path: Path) -> None:
    node = await started(tmp_path)
    async with await client.connect(url_of(node)) as conn:
        await conn.declare_queue("q")
        await conn.producer("q").send(b"x")
        await conn.read("q", 0)  # opens a reader connection in a worker thread
    await node.stop()
    assert _open_db_fds(node.store.data_path / "tandem.db") == []
    blocker = await started(tmp_path / "other")
    try:
        clash = Node(NodeConfig(data_dir=tmp_path / "third", port=blocker.address[1]))
        with pytest.raises(OSError):
            await clash.start()
        assert not [t for t in threading.enumerate() if t.name == "tandem-writer" and t.is_alive()
                    and t is not getattr(blocker.store._writer, "_thread", None)]
        assert _open_db_fds(tmp_path.resolve() / "third" / "tandem.db") == []
    finally:
        await blocker.stop()


async def test_queue_ids_are_never_reused(tmp_path: Path) -> None:
    node = await started(tmp_path)
    async with await client.connect(url_of(node)) as conn:
        await conn.declare_queue("a")
        await conn.declare_queue("b")
        await conn.delete_queue("b")
    await node.stop()
    node = await started(tmp_path)
    try:
        async with await client.connect(url_of(node)) as conn:
            await conn.declare_queue("c")
        assert node.catalogue.queues["c"].meta.id == 3
    finally:
        await node.stop()


async def test_failed_purge_keeps_the_messages(flaky: tuple[Node, FlakyEngine]) -> None:
    node, engine = flaky
    async with await client.connect(url_of(node)) as conn:
        await conn.declare_queue("q")
        await conn.producer("q").send_many([str(i) for i in range(20)])
        engine.failing = lambda ops: any(isinstance(o, Settle) for o in ops)
        with pytest.raises(StorageError):
            await conn.purge_queue("q")
        engine.failing = None
        assert (await conn.list_queues())[0].ready == 20
        got = [int((await conn.get("q", auto_ack=True)).body) for _ in range(20)]  # type: ignore[union-attr]
        assert got == sorted(got) and len(set(got)) == 20


async def test_connections_over_the_limit_are_told_why(tmp_path: Path) -> None:
    from client.errors import ConnectionClosedError

    node = await started(tmp_path, max_connections=1)
    try:
        async with await client.connect(url_of(node)):
            with pytest.raises(ConnectionClosedError, match="max_connections"):
                await client.connect(url_of(node))
    finally:
        await node.stop()


async def test_a_failed_commit_under_a_later_one_leaves_a_gap_that_a_resend_fills(
        flaky: tuple[Node, FlakyEngine]) -> None:
    """Single node, one producer, one partition: batch A's commit fails while batch B (later
    seqs) commits.  A's seqs must not then count as held (its resend would be confirmed as a
    duplicate and lost): they are a gap that the resend fills."""
    node, engine = flaky
    entered, release = threading.Event(), threading.Event()

    def fail_a(ops: list[WriteOp]) -> bool:
        if any(isinstance(o, Append) and any(m.body == b"A" for m in o.messages) for o in ops):
            entered.set()
            release.wait(10)  # (the writer thread) B is submitted meanwhile: a commit of its own
            return True
        return False

    async with await client.connect_link(url_of(node)) as conn:
        await conn.declare_queue("q")
        a = [PublishMessage(None, {}, b"A", i) for i in range(5)]
        b = [PublishMessage(None, {}, b"B", i) for i in range(5, 10)]
        engine.failing = fail_a
        fa = conn.request_nowait(Publish(rid=conn.next_rid(), queue="q", messages=a, producer_id="p", partition=0))
        await asyncio.to_thread(entered.wait, 10)
        fb = conn.request_nowait(Publish(rid=conn.next_rid(), queue="q", messages=b, producer_id="p", partition=0))
        await wait_until(lambda: node.catalogue.queues["q"].partitions[0].producers.get("p") == 9, what="B accepted")
        release.set()
        with pytest.raises(StorageError):
            await fa
        assert isinstance(await fb, PublishOk)
        engine.failing = None
        probe = await conn.request(lambda rid: Publish(rid=rid, queue="q", messages=[], producer_id="p",
                                                       partition=0))
        assert isinstance(probe, PublishOk) and probe.next_seq == 10
        again = await conn.request(lambda rid: Publish(rid=rid, queue="q", messages=a, producer_id="p",
                                                       partition=0))
        assert isinstance(again, PublishOk) and (again.stored, again.duplicates) == (5, 0)
        dup = await conn.request(lambda rid: Publish(rid=rid, queue="q", messages=b, producer_id="p", partition=0))
        assert isinstance(dup, PublishOk) and (dup.stored, dup.duplicates) == (0, 5)
        (info,) = await conn.list_queues()
        assert info.ready == 10


async def test_a_resend_of_stored_messages_is_confirmed_even_when_the_queue_is_full(url: str) -> None:
    async with await client.connect_link(url) as conn:
        await conn.declare_queue("small", max_length=3)
        batch = [PublishMessage(None, {}, b"x", i) for i in range(3)]
        first = await conn.request(lambda rid: Publish(rid=rid, queue="small", messages=batch, producer_id="p",
                                                       partition=0))
        again = await conn.request(lambda rid: Publish(rid=rid, queue="small", messages=batch, producer_id="p",
                                                       partition=0))
        assert isinstance(first, PublishOk) and isinstance(again, PublishOk) and again.duplicates == 3
        with pytest.raises(QueueFullError):
            await conn.request(lambda rid: Publish(rid=rid, queue="small", producer_id="p", partition=0,
                                                   messages=[PublishMessage(None, {}, b"y", 3)]))


async def test_a_cancelled_send_does_not_hold_up_flush(conn: client.DurableConnection) -> None:
    await conn.declare_queue("q")
    p = conn.producer("q")
    fut = p.send_nowait(b"x")
    fut.cancel()
    await p.send(b"y")
    await asyncio.wait_for(p.flush(), 10)
    await asyncio.wait_for(p.close(), 10)


async def test_idle_producers_are_forgotten_after_producer_expiry(tmp_path: Path) -> None:
    """Every producer id leaves a sequence per partition; idle ones expire (replicated op),
    in memory and in the store, so short-lived ids do not pile up."""
    node = await started(tmp_path, producer_expiry=1.0)
    try:
        async with await client.connect_link(url_of(node)) as conn:
            await conn.declare_queue("q", partitions=2)
            for pid in ("short-lived-1", "short-lived-2"):
                await conn.request(lambda rid, pid=pid: Publish(
                    rid=rid, queue="q", producer_id=pid, messages=[PublishMessage(f"k{i}", {}, b"x", i)
                                                                   for i in range(10)]))
            q = node.catalogue.queues["q"]
            assert all(part.producers for part in q.partitions)
            await wait_until(lambda: not any(part.producers for part in q.partitions), timeout=30,
                             what="idle producers forgotten")
            (info,) = await conn.list_queues()
            assert info.ready == 20  # the messages stay
    finally:
        await node.stop()
    again = await started(tmp_path, producer_expiry=1.0)
    try:
        assert not any(part.producers for part in again.catalogue.queues["q"].partitions)  # gone from the store too
    finally:
        await again.stop()
