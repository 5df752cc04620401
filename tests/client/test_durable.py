"""The durable connection against real nodes: partition-addressed sequences, resend
after a node restart, ConfirmedMessagesLost, resubscription and stale settlements."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import client
from broker.config import NodeConfig
from broker.node.node import Node
from client.durable import ConnectionEvent
from client.errors import (
    InvalidArgumentError,
    OutOfOrderSequenceError,
    QueueNotFoundError,
    StaleDeliveryError,
    TimeoutError_,
)
from client.protocol.frames import Publish, PublishMessage, PublishOk
from storage.memory import MemoryDisk, MemoryEngine
from tests.conftest import url_of
from tests.helpers import wait_until

pytestmark = pytest.mark.asyncio


def _batch(first: int, n: int) -> list[PublishMessage]:
    return [PublishMessage(None, {}, f"m{s}".encode(), s) for s in range(first, first + n)]


async def test_partition_addressed_sequences_refuse_gaps_and_confirm_duplicates(link: client.Connection) -> None:
    await link.declare_queue("q", partitions=2)

    async def publish(msgs: list[PublishMessage], partition: int = 1) -> PublishOk:
        reply = await link.request(lambda rid: Publish(rid=rid, queue="q", messages=msgs, producer_id="p",
                                                       partition=partition))
        assert isinstance(reply, PublishOk)
        return reply

    assert (await publish([])).next_seq == 0  # a probe: nothing held yet
    with pytest.raises(OutOfOrderSequenceError) as gap:
        await publish(_batch(1, 3))  # seq 0 never came
    assert gap.value.next_seq == 0
    ok = await publish(_batch(0, 3))
    assert (ok.stored, ok.duplicates, ok.next_seq) == (3, 0, 3)
    again = await publish(_batch(1, 4))  # 1, 2 held; 3, 4 new
    assert (again.stored, again.duplicates, again.next_seq) == (2, 2, 5)
    assert (await publish([], partition=0)).next_seq == 0  # sequences are per partition
    with pytest.raises(InvalidArgumentError, match="producer_id"):
        await link.request(lambda rid: Publish(rid=rid, queue="q", messages=_batch(0, 1), partition=0))
    (info,) = await link.list_queues()
    assert info.ready == 5


async def test_producer_sends_each_partition_to_its_node_and_numbers_it_densely(conn: client.DurableConnection,
                                                                               node: Node) -> None:
    await conn.declare_queue("q", partitions=4)
    p = conn.producer("q")
    results = await p.send_many([(f"m{i}", f"k{i}") for i in range(200)])
    by_part: dict[int, list[int]] = {}
    for r in results:
        by_part.setdefault(r.partition, []).append(r.seq)
    assert len(by_part) == 4
    assert all(seqs == list(range(len(seqs))) for seqs in by_part.values())
    assert p.duplicates == 0 and p.resent == 0
    q = node.catalogue.queues["q"]
    assert sum(len(part.producers) for part in q.partitions) == 4  # one producer, known to each partition


async def test_a_producer_id_continues_where_the_partition_stands(conn: client.DurableConnection) -> None:
    await conn.declare_queue("q", partitions=2)
    async with conn.producer("q", producer_id="orders-1") as p1:
        await p1.send_many([(f"a{i}", f"k{i}") for i in range(20)])
    async with conn.producer("q", producer_id="orders-1") as p2:  # say, the process restarted
        await p2.send_many([(f"b{i}", f"k{i}") for i in range(20)])
        assert p2.duplicates == 0  # it asked first, so its first messages were not taken as resends
    (info,) = await conn.list_queues()
    assert info.ready == 40


async def test_producer_rides_through_a_node_restart_exactly_once(tmp_path: Path) -> None:
    disk = MemoryDisk()
    cfg = NodeConfig(data_dir=tmp_path / "n", port=0)
    node = Node(cfg, engine=lambda _c: MemoryEngine(disk))
    await node.start()
    port = node.address[1]
    events: list[ConnectionEvent] = []
    conn = await client.connect(url_of(node), send_timeout=30)
    conn.on_event(events.append)
    try:
        await conn.declare_queue("q", partitions=3)
        p = conn.producer("q", max_batch=20)
        futs = [p.send_nowait(f"m{i}".encode(), key=f"k{i % 7}") for i in range(300)]
        await wait_until(lambda: p.confirmed >= 60, what="some confirms")
        await node.stop()  # everything in flight fails with the node
        node = Node(NodeConfig(data_dir=tmp_path / "n", port=port), engine=lambda _c: MemoryEngine(disk))
        await node.start()
        results = await asyncio.gather(*futs)
        assert len(results) == 300
        assert any(e.kind == "disconnected" for e in events)
        q = node.catalogue.queues["q"]
        bodies = sorted(m.body for part in q.partitions for m in part.ready)
        assert bodies == sorted(f"m{i}".encode() for i in range(300))  # each stored once
    finally:
        await conn.close()
        await node.stop()


async def test_confirmed_messages_a_node_lost_are_reported(tmp_path: Path) -> None:
    node = Node(NodeConfig(data_dir=tmp_path / "n", port=0), engine=lambda _c: MemoryEngine(MemoryDisk()))
    await node.start()
    port = node.address[1]
    lost: list[ConnectionEvent] = []
    conn = await client.connect(url_of(node), send_timeout=30)
    conn.on_event(lambda e: lost.append(e) if e.kind == "messages_lost" else None)
    try:
        await conn.declare_queue("q", partitions=1)
        p = conn.producer("q")
        await p.send_many([b"x"] * 10)
        await node.stop()
        # the same node comes back with an empty store: what it confirmed is gone
        node = Node(NodeConfig(data_dir=tmp_path / "n2", port=port), engine=lambda _c: MemoryEngine(MemoryDisk()))
        await node.start()
        await conn.declare_queue("q", partitions=1)
        r = await p.send(b"after")
        assert r.seq == 0  # renumbered from where the partition stands
        assert [e.error.count for e in lost if e.error is not None] == [10]  # type: ignore[attr-defined]
        assert p.lost == 10
    finally:
        await conn.close()
        await node.stop()


async def test_send_times_out_while_no_node_answers(tmp_path: Path) -> None:
    node = Node(NodeConfig(data_dir=tmp_path / "n", port=0))
    await node.start()
    conn = await client.connect(url_of(node), send_timeout=0.5, request_timeout=0.5)
    try:
        await conn.declare_queue("q")
        p = conn.producer("q")
        await p.send(b"ok")
        await node.stop()
        with pytest.raises(TimeoutError_, match="send_timeout"):
            await p.send(b"nobody")
    finally:
        await conn.close()


async def test_consumer_resubscribes_and_old_deliveries_are_stale(conn: client.DurableConnection, url: str) -> None:
    await conn.declare_queue("q")
    await conn.producer("q").send_many([b"a", b"b"])
    watcher = await client.connect(url)
    try:
        c = await watcher.consumer("q", prefetch=10).start()
        first = [await c.next(10), await c.next(10)]
        assert all(m is not None and not m.redelivered for m in first)
        (link,) = watcher.links.values()
        assert link._writer is not None
        link._writer.transport.abort()  # the link dies under the consumer
        again = [await c.next(10), await c.next(10)]
        assert sorted(m.body for m in again if m is not None) == [b"a", b"b"]
        assert all(m is not None and m.redelivered for m in again)
        for m in first:
            assert m is not None
            with pytest.raises(StaleDeliveryError):
                m.ack()
        for m in again:
            assert m is not None
            await m.ack()
        (info,) = await conn.list_queues()
        assert (info.ready, info.unacked, info.acked) == (0, 0, 2)
    finally:
        await watcher.close()


async def test_a_cancelled_ack_wait_leaves_the_other_acks_of_its_frame_alone(conn: client.DurableConnection) -> None:
    """The acks of one loop turn share a frame and its future: cancelling one waiter (a
    timeout, a shutdown) must not cancel the others, nor lose the settlement."""
    await conn.declare_queue("q")
    await conn.producer("q").send_many([b"a", b"b"])
    c = await conn.consumer("q", prefetch=10).start()
    m1, m2 = await c.next(10), await c.next(10)
    assert m1 is not None and m2 is not None
    f1, f2 = m1.ack(), m2.ack()
    assert f1 is f2  # one frame
    async def wait(f: asyncio.Future[None]) -> None:
        await f

    waiter = asyncio.create_task(wait(f1))
    other = asyncio.create_task(wait(f2))
    await asyncio.sleep(0)  # both are waiting on the frame (a loop turn, not a wait for a state)
    waiter.cancel()
    await other  # answered, not cancelled
    assert f1.done() and not f1.cancelled()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    (info,) = await conn.list_queues()
    assert (info.ready, info.unacked, info.acked) == (0, 0, 2)


async def test_consumer_of_a_deleted_queue_ends(conn: client.DurableConnection) -> None:
    await conn.declare_queue("q")
    c = await conn.consumer("q").start()
    await conn.delete_queue("q")
    with pytest.raises(client.errors.ConsumerCancelledError):
        await asyncio.wait_for(c.__anext__(), 10)
    with pytest.raises(QueueNotFoundError):
        await conn.producer("q").send(b"x")
