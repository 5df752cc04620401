"""A queue's bounds through the SDK against a node on a real socket (each storage engine):
``max_length`` and ``max_length_bytes`` with overflow ``reject-publish`` or ``drop-head``, the
shed messages dead-lettered or dropped, and what a restart keeps of both."""

from __future__ import annotations

from pathlib import Path

import pytest

import client
from broker.config import NodeConfig
from broker.node.node import Node
from client.errors import InvalidArgumentError, QueueExistsError, QueueFullError
from tests.broker.test_messaging import drain
from tests.conftest import url_of

pytestmark = pytest.mark.asyncio

BODY = b"x" * 9  # 10 bytes with its empty headers (msgpack {}: one byte)


async def test_max_length_bytes_refuses_what_does_not_fit(conn: client.DurableConnection) -> None:
    await conn.declare_queue("bytes", max_length_bytes=100)
    await conn.producer("bytes").send_many([BODY] * 10)
    with pytest.raises(QueueFullError, match="100 bytes of max_length_bytes 100 .overflow reject-publish."):
        await conn.producer("bytes").send(BODY)
    async with conn.consumer("bytes", prefetch=1) as c:  # a delivered message still counts for max_length
        m = (await drain(c, 1))[0]                       # but not for the bytes of ready messages
        await conn.producer("bytes").send(BODY)
        await m.ack()


async def test_drop_head_sheds_the_oldest_into_the_dead_letter_queue(conn: client.DurableConnection) -> None:
    await conn.declare_queue("dead")
    await conn.declare_queue("recent", partitions=3, max_length=5, overflow="drop-head", dead_letter_queue="dead")
    p = conn.producer("recent")
    for i in range(8):
        await p.send(f"m{i}".encode(), key=f"k{i}")
    async with conn.consumer("recent", prefetch=10) as c:
        kept = sorted(m.body for m in await drain(c, 5, ack=True))
        assert await c.next(0.3) is None
    assert kept == [f"m{i}".encode() for i in range(3, 8)]
    async with conn.consumer("dead", prefetch=10) as c:
        shed = await drain(c, 3, ack=True)
    assert [m.body for m in shed] == [b"m0", b"m1", b"m2"]  # the oldest first, over the partitions
    assert {m.headers["x-death-reason"] for m in shed} == {"maxlen"}
    assert {m.headers["x-death-queue"] for m in shed} == {"recent"}


async def test_drop_head_by_bytes_without_a_dead_letter_queue_drops(conn: client.DurableConnection) -> None:
    await conn.declare_queue("window", max_length_bytes=50, overflow="drop-head")
    p = conn.producer("window")
    for i in range(20):  # (one at a time: one publish must fit the bound by itself)
        await p.send(f"{i:09d}".encode())
    async with conn.consumer("window", prefetch=30) as c:
        got = [m.body for m in await drain(c, 5, ack=True)]
        assert await c.next(0.3) is None
    assert got == [f"{i:09d}".encode() for i in range(15, 20)]


async def test_drop_head_refuses_when_no_ready_message_can_make_room(conn: client.DurableConnection) -> None:
    await conn.declare_queue("held", max_length=2, overflow="drop-head")
    await conn.producer("held").send_many([b"a", b"b"])
    async with conn.consumer("held", prefetch=5) as c:
        taken = await drain(c, 2)  # delivered, not settled: they still count, and cannot be shed
        with pytest.raises(QueueFullError, match="its ready messages cannot make room"):
            await conn.producer("held").send(b"c")
        for m in taken:
            await m.ack()
    with pytest.raises(QueueFullError, match="the publish alone is more than the queue holds"):
        await conn.producer("held").send_many([b"1", b"2", b"3"])


async def test_bad_and_conflicting_overflow_settings_are_refused(conn: client.DurableConnection) -> None:
    with pytest.raises(InvalidArgumentError, match="overflow 'drop-tail': one of reject-publish, drop-head"):
        await conn.declare_queue("q", overflow="drop-tail")
    await conn.declare_queue("q", max_length_bytes=10, overflow="drop-head")
    await conn.declare_queue("q", max_length_bytes=10, overflow="drop-head")  # the same: idempotent
    with pytest.raises(QueueExistsError, match="overflow: have 'drop-head', asked 'reject-publish'"):
        await conn.declare_queue("q", max_length_bytes=10)
    with pytest.raises(QueueExistsError, match="max_length_bytes: have 10, asked 20"):
        await conn.declare_queue("q", max_length_bytes=20, overflow="drop-head")


async def test_a_restart_keeps_the_bounds_and_what_was_shed_stays_shed(tmp_path: Path) -> None:
    """The node raises its own feature level to 3 as it declares the first such queue (an older
    build then refuses the store rather than read the queue without its bound)."""
    cfg = NodeConfig(data_dir=tmp_path / "node1", port=0)
    node = Node(cfg)
    await node.start()
    try:
        assert node.ops.levels.level < 3
        async with await client.connect(url_of(node)) as conn:
            await conn.declare_queue("ring", max_length=3, overflow="drop-head")
            for i in range(7):
                await conn.producer("ring").send(f"m{i}".encode())
        assert node.ops.levels.level == 3
    finally:
        await node.stop()
    node = Node(NodeConfig(data_dir=tmp_path / "node1", port=0))
    await node.start()
    try:
        assert node.ops.levels.level == 3
        meta = node.catalogue.queues["ring"].meta
        assert (meta.max_length, meta.overflow) == (3, "drop-head")
        async with await client.connect(url_of(node)) as conn:
            async with conn.consumer("ring", prefetch=10) as c:
                assert [m.body for m in await drain(c, 3, ack=True)] == [b"m4", b"m5", b"m6"]
                assert await c.next(0.3) is None
    finally:
        await node.stop()


async def test_a_full_dead_letter_queue_follows_its_own_overflow(conn: client.DurableConnection) -> None:
    """Dead-lettering into a bounded queue: drop-head sheds its oldest to make room; reject-publish
    drops the message dead-lettered (logged)."""
    await conn.declare_queue("ring-dlq", max_length=2, overflow="drop-head")
    await conn.declare_queue("capped-dlq", max_length=2)
    await conn.declare_queue("a", dead_letter_queue="ring-dlq")
    await conn.declare_queue("b", dead_letter_queue="capped-dlq")
    for name in ("a", "b"):
        await conn.producer(name).send_many([f"{name}{i}".encode() for i in range(4)])
        async with conn.consumer(name, prefetch=1) as c:
            for _ in range(4):
                m = (await drain(c, 1))[0]
                await m.reject()
    for name, want in (("ring-dlq", [b"a2", b"a3"]), ("capped-dlq", [b"b0", b"b1"])):
        async with conn.consumer(name, prefetch=10) as c:
            assert [m.body for m in await drain(c, 2, ack=True)] == want
            assert await c.next(0.3) is None
