"""Streams against a node on a real socket (each storage engine): reads by offset, position
and time leave the messages where they are; named consumers' offsets; retention by bytes and
by age drops whole chunks, oldest first; what a stream refuses."""

from __future__ import annotations

import time

import pytest

import client
from broker.messaging.retention import Retention
from broker.node.node import Node
from client.errors import InvalidArgumentError, TandemError
from client.protocol.frames import Declare, Publish, PublishMessage
from client.testing import FakeClock
from tests.helpers import wait_until

pytestmark = pytest.mark.asyncio


async def _publish(conn: client.DurableConnection, stream: str, bodies: list[bytes]) -> list[float]:
    """Each body confirmed before the next is sent (a chunk each); the time before each send."""
    before = []
    async with conn.producer(stream) as p:
        for body in bodies:
            before.append(time.time())
            await p.send(body)
    return before


async def test_reads_leave_a_stream_as_it_is_from_any_offset_position_or_time(
        conn: client.DurableConnection) -> None:
    await conn.declare_stream("events")
    sent = await _publish(conn, "events", [f"e{i}".encode() for i in range(10)])
    for _ in range(2):  # (read twice: nothing was consumed)
        msgs, nxt, end = await conn.read("events", 0, "first")
        assert [m.body for m in msgs] == [f"e{i}".encode() for i in range(10)] and (nxt, end) == (10, 10)
    msgs, _, _ = await conn.read("events", 0, "last")
    assert [m.body for m in msgs] == [b"e9"]
    msgs, nxt, end = await conn.read("events", 0, "next")
    assert msgs == [] and nxt == end == 10
    msgs, _, _ = await conn.read("events", 0, 7, max_messages=2)
    assert [m.offset for m in msgs] == [7, 8]
    every, _, _ = await conn.read("events", 0, "first")
    msgs, _, _ = await conn.read("events", 0, timestamp=sent[5])
    asked = int(sent[5] * 1000) / 1000  # (a read by time is to the millisecond)
    assert msgs[0] == next(m for m in every if m.timestamp >= asked) and msgs[0].offset <= 5
    msgs, nxt, _ = await conn.read("events", 0, timestamp=time.time() + 60)
    assert msgs == [] and nxt == 10  # (a time after the last message: the end)
    msgs, _, _ = await conn.read("events", 0, timestamp=1)
    assert msgs[0].body == b"e0"


async def test_a_stream_is_read_not_consumed_and_takes_no_classic_settings(conn: client.DurableConnection,
                                                                           link: client.Connection) -> None:
    await conn.declare_stream("log", partitions=2, max_age=3600, max_bytes=1 << 20)
    assert (await conn.declare_stream("log", partitions=2, max_age=3600, max_bytes=1 << 20)).name == "log"
    with pytest.raises(TandemError, match="max_age: have 3600000, asked 60000"):
        await conn.declare_stream("log", partitions=2, max_age=60, max_bytes=1 << 20)
    with pytest.raises(InvalidArgumentError, match="is a stream: it is not consumed"):
        await link.get("log")
    with pytest.raises(InvalidArgumentError, match="is a stream: it is not consumed"):
        await link.consumer("log").start()
    with pytest.raises(InvalidArgumentError, match="is a stream: it is not purged"):
        await link.purge_queue("log")
    await link.declare_queue("s2", max_length=5, message_ttl=10)  # (a classic queue with them is fine)
    with pytest.raises(InvalidArgumentError, match="max_length, message_ttl: not for a stream"):
        await link.request(lambda rid: Declare(rid=rid, queue="s3", type="stream", max_length=5, message_ttl=10))
    with pytest.raises(InvalidArgumentError, match="max_age and max_bytes are a stream's retention"):
        await link.request(lambda rid: Declare(rid=rid, queue="s4", max_age=10))
    with pytest.raises(InvalidArgumentError, match="type 'log': one of classic, stream"):
        await link.request(lambda rid: Declare(rid=rid, queue="s5", type="log"))
    with pytest.raises(InvalidArgumentError, match="offset 'middle': an offset"):
        await link.read("log", 0, "middle")


async def test_named_offsets_are_kept_per_consumer_and_partition(conn: client.DurableConnection,
                                                               link: client.Connection) -> None:
    await conn.declare_stream("ledger", partitions=2)
    await conn.declare_queue("plain")
    await _publish(conn, "ledger", [b"a", b"b", b"c", b"d"])
    ends = [(await conn.read("ledger", p, "next"))[2] for p in (0, 1)]
    assert await conn.fetch_offset("ledger", "billing", 0) is None
    await conn.store_offset("ledger", "billing", 0, ends[0])
    await conn.store_offset("ledger", "billing", 1, 0)
    await conn.store_offset("ledger", "audit", 0, 0)
    assert [await conn.fetch_offset("ledger", "billing", p) for p in (0, 1)] == [ends[0], 0]
    assert await conn.fetch_offset("ledger", "audit", 0) == 0
    with pytest.raises(InvalidArgumentError, match="must be 0.."):
        await conn.store_offset("ledger", "billing", 0, ends[0] + 1)
    with pytest.raises(InvalidArgumentError, match="is not a stream"):
        await conn.store_offset("plain", "billing", 0, 0)
    with pytest.raises(InvalidArgumentError, match="consumer 'a b'"):
        await conn.store_offset("ledger", "a b", 0, 0)
    with pytest.raises(InvalidArgumentError, match="ids starting '~offset:' are the broker's"):
        await link.request(lambda rid: Publish(rid=rid, queue="ledger", messages=[PublishMessage(None, {}, b"x", 0)],
                                               producer_id="~offset:billing"))


async def test_retention_drops_the_oldest_chunks_by_bytes_and_by_age(node: Node,
                                                                    conn: client.DurableConnection) -> None:
    await conn.declare_stream("sized", max_bytes=5 * 1000)
    await conn.declare_stream("aged", max_age=3600)
    await _publish(conn, "sized", [bytes([i]) * 1000 for i in range(12)])
    await _publish(conn, "aged", [bytes([i]) * 10 for i in range(6)])
    now = Retention(lambda: node.catalogue.queues, node.holding.serves, node.services, node.clock)
    await now.sweep()

    async def first(stream: str) -> int:
        msgs, _, _ = await conn.read(stream, 0, "first", max_messages=1)
        return msgs[0].offset if msgs else -1

    # the newest chunks held add up to at most max_bytes (payloads carry a few bytes more than
    # the bodies: 4 of 1,000-byte bodies fit in 5,000)
    await wait_until(lambda: _equals(first("sized"), 8), what="the sized stream's oldest chunks dropped")
    assert await first("aged") == 0  # (an hour has not passed)
    later = Retention(lambda: node.catalogue.queues, node.holding.serves, node.services,
                      FakeClock(wall=time.time() + 7200))
    await later.sweep()
    await wait_until(lambda: _equals(first("aged"), 5), what="the aged stream's chunks but the last dropped")
    msgs, nxt, end = await conn.read("aged", 0, 0)
    assert [m.offset for m in msgs] == [5] and nxt == end == 6  # (a read from a dropped offset: the oldest held)
    await later.sweep()  # (nothing more to drop: the newest chunk stays)
    assert await first("aged") == 5


async def _equals(value: object, expected: int) -> bool:
    return await value == expected  # type: ignore[misc]
