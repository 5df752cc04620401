"""Queue semantics through the SDK against a node on a real socket."""

from __future__ import annotations

import asyncio

import pytest

import client
from broker.node.node import Node
from client.mapper import make_mapper
from client.errors import (
    AuthError,
    InvalidArgumentError,
    InvalidFieldError,
    MessageTooLargeError,
    PartitionNotFoundError,
    QueueExistsError,
    QueueFullError,
    QueueNotFoundError,
    UnknownDeliveryTagError,
)
from client.protocol.frames import Publish, PublishMessage, PublishOk
from tests.conftest import url_of
from tests.helpers import wait_until

pytestmark = pytest.mark.asyncio


async def drain(c: client.Consumer, n: int, timeout: float = 10.0, ack: bool = False) -> list[client.Message]:
    out = []
    while len(out) < n:
        m = await c.next(timeout)
        assert m is not None, f"got {len(out)} of {n} messages"
        out.append(m)
        if ack:
            m.ack()
    return out


async def test_declare_is_idempotent_and_conflicts_are_named(conn: client.DurableConnection) -> None:
    q1 = await conn.declare_queue("orders", partitions=4)
    q2 = await conn.declare_queue("orders", partitions=4)
    assert q1.name == q2.name == "orders" and q2.partitions == 4
    with pytest.raises(QueueExistsError, match="partitions: have 4, asked 2"):
        await conn.declare_queue("orders", partitions=2)


async def test_a_queue_keeps_the_mapper_it_was_declared_with(conn: client.DurableConnection) -> None:
    """A declare that names no mapper gets jump_hash for a new queue and matches an existing
    queue's own mapper; naming another one is a conflict (no key moves under a queue)."""
    assert (await conn.declare_queue("new-default", partitions=3)).mapper == "jump_hash"
    old = await conn.declare_queue("older", partitions=3, mapper="consistent_hash")
    assert old.mapper == "consistent_hash"
    assert (await conn.declare_queue("older", partitions=3)).mapper == "consistent_hash"
    with pytest.raises(QueueExistsError, match="mapper: have 'consistent_hash', asked 'jump_hash'"):
        await conn.declare_queue("older", partitions=3, mapper="jump_hash")
    # each keyed message is in the partition the mapper names, and k0..k11 reach all three
    await conn.producer("new-default").send_many([(f"m{i}".encode(), f"k{i}") for i in range(12)])
    async with conn.consumer("new-default", prefetch=20) as c:
        msgs = await drain(c, 12)
    mapper = make_mapper("jump_hash", 3, 1024)
    assert {m.body: m.partition for m in msgs} == {f"m{i}".encode(): mapper.partition(f"k{i}") for i in range(12)}
    assert {m.partition for m in msgs} == {0, 1, 2}


@pytest.mark.parametrize("kwargs, field", [
    ({"partitions": 0}, "partitions"),
    ({"partitions": 5000}, "partitions"),
    ({"mapper": "random"}, "mapper"),
    ({"ring_size": 2}, "ring_size"),
    ({"dead_letter_queue": "q"}, "dead_letter_queue"),
])
async def test_declare_rejects_bad_settings(conn: client.DurableConnection, kwargs: dict, field: str) -> None:
    with pytest.raises(InvalidArgumentError, match=field):
        await conn.declare_queue("q", **{"partitions": 4, **kwargs})
    with pytest.raises(InvalidFieldError, match=r"max_deliveries.*0 \.\. 2\*\*63-1"):
        await conn.declare_queue("q", max_deliveries=-1)
    with pytest.raises(InvalidArgumentError, match="queue name"):
        await conn.declare_queue("bad name!")


async def test_publish_consume_ack_every_message_once(conn: client.DurableConnection) -> None:
    await conn.declare_queue("q", partitions=4)
    p = conn.producer("q")
    n = 3000
    await asyncio.gather(*(p.send(f"m{i}".encode(), key=f"k{i % 37}", headers={"i": str(i)}) for i in range(n)))
    assert p.confirmed == n
    async with conn.consumer("q", prefetch=100) as c:
        msgs = await drain(c, n, ack=True)
    assert sorted(m.body for m in msgs) == sorted(f"m{i}".encode() for i in range(n))
    assert all(m.headers["i"] == m.body.decode()[1:] for m in msgs)
    assert len({m.id for m in msgs}) == n
    assert not any(m.redelivered for m in msgs)
    (info,) = await conn.list_queues()
    assert (info.ready, info.unacked, info.acked) == (0, 0, n)


async def test_same_key_same_partition_in_order(conn: client.DurableConnection) -> None:
    await conn.declare_queue("q", partitions=8)
    p = conn.producer("q")
    await p.send_many([(str(i), "customer-7") for i in range(200)])
    async with conn.consumer("q", prefetch=500) as c:
        msgs = await drain(c, 200)
    assert len({m.partition for m in msgs}) == 1
    assert [int(m.body) for m in msgs] == list(range(200))


async def test_round_robin_spreads_over_partitions(conn: client.DurableConnection) -> None:
    await conn.declare_queue("rr", partitions=4, mapper="round_robin")
    await conn.producer("rr").send_many([b"x"] * 40)
    counts = {}
    for _ in range(40):
        m = await conn.get("rr", auto_ack=True)
        assert m is not None
        counts[m.partition] = counts.get(m.partition, 0) + 1
    assert counts == {0: 10, 1: 10, 2: 10, 3: 10}


async def test_prefetch_limits_unacked_deliveries(conn: client.DurableConnection, node: Node) -> None:
    await conn.declare_queue("q")
    await conn.producer("q").send_many([b"x"] * 50)
    async with conn.consumer("q", prefetch=5) as c:
        await wait_until(lambda: c.received == 5, what="5 deliveries")
        assert node.catalogue.queues["q"].unacked_count == 5 and node.catalogue.queues["q"].ready_count == 45
        first = await c.next(5)
        assert first is not None
        await first.ack()
        await wait_until(lambda: c.received == 6, what="credit returned by the ack")


async def test_competing_consumers_share_the_queue(url: str) -> None:
    async with await client.connect(url) as a, await client.connect(url) as b:
        await a.declare_queue("q", partitions=2)
        ca, cb = await a.consumer("q", prefetch=10).start(), await b.consumer("q", prefetch=10).start()
        await a.producer("q").send_many([str(i) for i in range(400)])
        got: list[bytes] = []

        async def run(c: client.Consumer) -> None:
            while len(got) < 400:
                m = await c.next(0.5)
                if m is None:
                    continue
                got.append(m.body)
                await m.ack()

        await asyncio.wait_for(asyncio.gather(run(ca), run(cb)), 30)
        assert sorted(got) == sorted(str(i).encode() for i in range(400))
        assert ca.received > 50 and cb.received > 50


async def test_nack_requeues_with_redelivered_flag_and_count(conn: client.DurableConnection) -> None:
    await conn.declare_queue("q")
    await conn.producer("q").send(b"job")
    async with conn.consumer("q") as c:
        m1 = await c.next(5)
        assert m1 is not None and (m1.redelivered, m1.delivery_count) == (False, 1)
        await m1.nack(requeue=True)
        m2 = await c.next(5)
        assert m2 is not None and m2.id == m1.id and (m2.redelivered, m2.delivery_count) == (True, 2)
        await m2.ack()


async def test_a_dead_letter_queue_must_exist_and_stays_while_a_queue_names_it(conn: client.DurableConnection) -> None:
    """A dead letter never has nowhere to go: a declare naming a queue that does not exist is
    refused, and so is deleting a queue another names as its dead_letter_queue."""
    with pytest.raises(InvalidArgumentError, match="dead_letter_queue 'dlq': no such queue"):
        await conn.declare_queue("work", dead_letter_queue="dlq")
    assert [q.name for q in await conn.list_queues()] == []  # nothing declared
    await conn.declare_queue("dlq")
    await conn.declare_queue("work", dead_letter_queue="dlq")
    await conn.declare_queue("more", dead_letter_queue="dlq")
    with pytest.raises(InvalidArgumentError, match="queue 'dlq' is the dead_letter_queue of more, work: delete those"):
        await conn.delete_queue("dlq")
    await conn.delete_queue("work")
    await conn.delete_queue("more")
    await conn.delete_queue("dlq")  # (named by none now)
    assert await conn.list_queues() == []


async def test_dead_letter_after_max_deliveries_and_on_reject(conn: client.DurableConnection) -> None:
    await conn.declare_queue("dlq")
    await conn.declare_queue("work", max_deliveries=3, dead_letter_queue="dlq")
    await conn.producer("work").send(b"poison", key="p")
    async with conn.consumer("work") as c:
        for expected in (1, 2, 3):
            m = await c.next(5)
            assert m is not None and m.delivery_count == expected
            await m.nack(requeue=True)
    dead = await conn.get("dlq")
    assert dead is not None and dead.body == b"poison"
    assert dead.headers["x-death-reason"] == "delivery_limit" and dead.headers["x-death-queue"] == "work"
    await dead.ack()
    await conn.producer("work").send(b"bad")
    m = await conn.get("work")
    assert m is not None
    await m.reject()
    dead = await conn.get("dlq", auto_ack=True)
    assert dead is not None and dead.body == b"bad" and dead.headers["x-death-reason"] == "rejected"
    assert await conn.get("work") is None


async def test_dead_client_unacked_deliveries_return_to_ready(url: str, node: Node) -> None:
    async with await client.connect(url) as conn:
        await conn.declare_queue("q")
        await conn.producer("q").send_many([b"a", b"b", b"c"])
    doomed = await client.connect_link(url)
    c = await doomed.consumer("q", prefetch=10).start()
    await wait_until(lambda: c.received == 3, what="3 deliveries")
    doomed._writer.transport.abort()  # the client dies without a goodbye
    await wait_until(lambda: node.catalogue.queues["q"].ready_count == 3, what="requeue after the client died")
    await doomed.close()
    async with await client.connect(url) as conn:
        async with conn.consumer("q") as c2:
            msgs = await drain(c2, 3)
    assert sorted(m.body for m in msgs) == [b"a", b"b", b"c"]
    assert all(m.redelivered and m.delivery_count == 2 for m in msgs)


async def test_ack_of_unknown_tag_is_a_typed_error(link: client.Connection) -> None:
    conn = link
    await conn.declare_queue("q")
    await conn.producer("q").send(b"x")
    m = await conn.get("q")
    assert m is not None
    await m.ack()
    with pytest.raises(UnknownDeliveryTagError, match="unknown delivery tag"):
        await conn.settle(client.consumer.Ack, m.tag)


async def test_ack_multiple(link: client.Connection) -> None:
    conn = link
    from client.protocol.frames import Ack

    await conn.declare_queue("q")
    await conn.producer("q").send_many([b"1", b"2", b"3"])
    async with conn.consumer("q") as c:
        msgs = await drain(c, 3)
        await conn.request(lambda rid: Ack(rid=rid, tags=[msgs[-1].tag], multiple=True))
    (info,) = await conn.list_queues()
    assert (info.ready, info.unacked, info.acked) == (0, 0, 3)


async def test_idempotent_producer_stores_a_resend_once(link: client.Connection) -> None:
    conn = link
    from client.protocol.frames import Publish, PublishMessage, PublishOk

    await conn.declare_queue("q", partitions=3)
    batch = [PublishMessage(f"k{i}", {}, b"x", i) for i in range(10)]
    r1 = await conn.request(lambda rid: Publish(rid=rid, queue="q", messages=batch, producer_id="p1"))
    r2 = await conn.request(lambda rid: Publish(rid=rid, queue="q", messages=batch, producer_id="p1"))
    assert isinstance(r1, PublishOk) and isinstance(r2, PublishOk)
    assert (r1.stored, r1.duplicates, r2.stored, r2.duplicates) == (10, 0, 0, 10)
    (info,) = await conn.list_queues()
    assert info.ready == 10


async def test_stream_read_by_offset_does_not_consume(conn: client.DurableConnection) -> None:
    await conn.declare_queue("s", partitions=1)
    await conn.producer("s").send_many([str(i) for i in range(25)])
    msgs, nxt, end = await conn.read("s", 0, offset=0, max_messages=10)
    assert [int(m.body) for m in msgs] == list(range(10)) and nxt == 10 and end == 25
    msgs, nxt, end = await conn.read("s", 0, offset=nxt, max_messages=100)
    assert [m.offset for m in msgs] == list(range(10, 25)) and nxt == 25
    (info,) = await conn.list_queues()
    assert info.ready == 25
    with pytest.raises(PartitionNotFoundError):
        await conn.read("s", 3)


async def test_purge_and_delete(conn: client.DurableConnection) -> None:
    await conn.declare_queue("q", partitions=2)
    await conn.producer("q").send_many([b"x"] * 30)
    assert await conn.purge_queue("q") == 30
    assert await conn.get("q") is None
    await conn.producer("q").send(b"y")
    with pytest.raises(InvalidArgumentError, match="not empty"):
        await conn.delete_queue("q", if_empty=True)
    await conn.delete_queue("q")
    with pytest.raises(QueueNotFoundError):
        await conn.producer("q").send(b"z")
    assert await conn.list_queues() == []


async def test_deleting_a_queue_cancels_its_consumers(url: str) -> None:
    async with await client.connect(url) as a, await client.connect(url) as b:
        await a.declare_queue("q")
        c = await b.consumer("q").start()
        await a.delete_queue("q")
        with pytest.raises(client.errors.ConsumerCancelledError, match="cancelled by the broker"):
            await asyncio.wait_for(c.__anext__(), 10)


async def test_limits_max_length_and_message_size(conn: client.DurableConnection, node: Node) -> None:
    await conn.declare_queue("small", max_length=5)
    await conn.producer("small").send_many([b"x"] * 5)
    with pytest.raises(QueueFullError, match="max_length 5"):
        await conn.producer("small").send(b"one too many")
    big = b"x" * (node.config.max_message_size + 1)
    with pytest.raises(MessageTooLargeError):
        await conn.producer("small").send(big)


async def test_wrong_password_is_refused_clearly(node: Node) -> None:
    with pytest.raises(AuthError, match="authentication failed for user 'admin'"):
        await client.connect(url_of(node, password="wrong-password"))
    with pytest.raises(AuthError):
        await client.connect(url_of(node, user="nobody"))


async def test_monitor_user_may_look_but_not_change(node: Node, conn: client.DurableConnection) -> None:
    from broker.security.users import make_user
    from client.errors import AccessRefusedError
    from storage.base import PutUser

    user = make_user("watcher", "watcher-pass", "monitor")
    await node.store.write([PutUser(user)], sync=True)
    node.services.users.put(user)
    await conn.declare_queue("q")
    async with await client.connect(url_of(node, user="watcher", password="watcher-pass")) as mon:
        assert [q.name for q in await mon.list_queues()] == ["q"]
        with pytest.raises(AccessRefusedError, match="'watcher'.*'produce' permission on queue 'q'"):
            await mon.producer("q").send(b"x")
        with pytest.raises(AccessRefusedError):
            await mon.purge_queue("q")


async def test_produced_says_which_of_a_producers_messages_a_partition_still_stores(link: client.Connection) -> None:
    """``Produced`` (a restore's look for resends): the producer's seqs stored from an offset
    on, its last seq, and whether every message from there on is still stored; once they are
    consumed and settled they are not, and a look no longer vouches for what it did not see."""
    await link.declare_queue("s", partitions=1)

    async def publish(producer: str, seqs: range) -> None:
        reply = await link.request(lambda rid: Publish(rid=rid, queue="s", producer_id=producer, messages=[
            PublishMessage(None, {}, f"{producer}-{s}".encode(), s) for s in seqs]))
        assert isinstance(reply, PublishOk) and reply.stored == len(seqs), reply

    await publish("P", range(10))
    await publish("other", range(5))  # offsets 10..14
    await publish("P", range(10, 12))  # 15, 16
    got = await link.produced("s", 0, "P")
    assert (got.last, got.covered, got.seqs) == (11, True, list(range(12)))
    got = await link.produced("s", 0, "P", offset=8)
    assert (got.last, got.covered, got.seqs) == (11, True, [8, 9, 10, 11])
    got = await link.produced("s", 0, "nobody", offset=8)
    assert (got.last, got.covered, got.seqs) == (None, True, [])
    with pytest.raises(PartitionNotFoundError):
        await link.produced("s", 1, "P")
    with pytest.raises(QueueNotFoundError):
        await link.produced("nope", 0, "P")
    async with link.consumer("s", prefetch=100) as c:
        for m in await drain(c, 17):
            await m.ack()

    async def settled() -> bool:
        got = await link.produced("s", 0, "P")
        return not got.covered and got.last == 11

    await wait_until(settled, what="the settled messages no longer stored, the look not covered")
