"""Transactions against a node on a real socket (each storage engine): a transaction's publishes
are delivered only once it commits and never after an abort; its acks settle at commit and give
the messages back at abort; a newer instance of a producer fences the older one; what a
transaction prepared survives a restart of the node, and is resolved there."""

from __future__ import annotations

import asyncio

import pytest

import client
import client.blocking
import client.transactions
from broker.node.node import Node
from client.errors import AccessRefusedError, InvalidArgumentError, ProducerFencedError, TransactionAbortedError
from tests.helpers import wait_until

pytestmark = pytest.mark.asyncio


async def _drain(link: client.Connection, queue: str) -> list[bytes]:
    """Every message ready in ``queue`` now, acked (a get each, until none)."""
    out = []
    while (m := await link.get(queue)) is not None:
        out.append(m.body)
        await m.ack()
    return out


async def test_a_commit_delivers_every_publish_and_an_abort_none(link: client.Connection, node: Node) -> None:
    await link.declare_queue("a", partitions=3)
    await link.declare_queue("b")
    async with link.transaction("app") as tx:
        await tx.publish_many("a", [(f"a{i}".encode(), f"k{i}") for i in range(20)])
        await tx.publish("b", b"b0")
        assert await link.get("a") is None and await link.get("b") is None  # (read committed)
        msgs, _, _ = await link.read("b", 0, 0)
        assert msgs == []  # (a read does not see them either)
    assert sorted(await _drain(link, "a")) == sorted(f"a{i}".encode() for i in range(20))
    assert await _drain(link, "b") == [b"b0"]

    with pytest.raises(RuntimeError):
        async with link.transaction("app") as tx:
            await tx.publish("a", b"never")
            raise RuntimeError("the block fails: the transaction aborts")
    tx2 = await link.begin("app")
    await tx2.publish("b", b"never either")
    await tx2.abort()
    assert await _drain(link, "a") == [] and await _drain(link, "b") == []
    assert node.catalogue.queue("a").depth == 0 and node.catalogue.queue("b").depth == 0  # (nothing held aside)


async def test_acks_settle_at_commit_and_the_messages_come_back_at_abort(link: client.Connection) -> None:
    await link.declare_queue("in")
    await link.declare_queue("out")
    await link.producer("in").send_many([(f"m{i}".encode(), None) for i in range(4)])
    got = [await link.get("in") for _ in range(2)]
    assert all(m is not None for m in got)
    tx = await link.begin("worker")
    for m in got:
        assert m is not None
        await tx.publish("out", m.body.upper())
        await tx.ack(m)
    await tx.abort()
    back = await _drain(link, "in")
    assert sorted(back) == [b"m0", b"m1", b"m2", b"m3"]  # (the two acked in the aborted one are ready again)
    assert await _drain(link, "out") == []

    await link.producer("in").send_many([(b"x", None), (b"y", None)])
    got = [await link.get("in"), await link.get("in")]
    async with link.transaction("worker") as tx:
        for m in got:
            assert m is not None
            await tx.publish("out", m.body.upper())
            await tx.ack(m)
    assert await _drain(link, "in") == []
    assert sorted(await _drain(link, "out")) == [b"X", b"Y"]


async def test_a_message_that_cannot_be_acked_leaves_the_others_of_the_call_to_the_caller(
        link: client.Connection) -> None:
    """``tx.ack(a, b, c)`` where ``b`` cannot be acked (settled already; for a durable consumer's
    message, its link failed): it raises, and ``a`` and ``c`` are not taken as settled, so the
    caller can give them back (nack), as a worker does with a batch that failed."""
    await link.declare_queue("batch")
    await link.producer("batch").send_many([(f"m{i}".encode(), None) for i in range(3)])
    a, b, c = [await link.get("batch") for _ in range(3)]
    assert a is not None and b is not None and c is not None
    await b.ack()
    tx = await link.begin("worker")
    with pytest.raises(InvalidArgumentError, match="already settled"):
        await tx.ack(a, b, c)
    await tx.abort()
    await a.nack()  # (would raise "already settled" if the failed call had kept it)
    await c.nack()
    assert sorted(await _drain(link, "batch")) == [b"m0", b"m2"]


async def test_a_newer_instance_fences_the_older_and_its_prepared_writes_are_aborted(
        url: str, link: client.Connection) -> None:
    await link.declare_queue("q")
    old = await link.begin("shop")
    await old.publish("q", b"from the zombie")
    async with await client.connect_link(url) as other:
        async with other.transaction("shop") as new:  # (a new instance: the epoch goes up)
            await new.publish("q", b"from the new one")
        with pytest.raises(ProducerFencedError, match="epoch"):
            await old.commit()
        assert await _drain(other, "q") == [b"from the new one"]


async def test_a_transaction_is_its_users_own(url: str, link: client.Connection, node: Node) -> None:
    await link.declare_queue("q")
    tx = await link.begin("mine")
    with pytest.raises(InvalidArgumentError, match="transactional id"):
        await link.begin("bad/name")
    await link.request(lambda rid: client.protocol.frames.UserPut(
        rid=rid, name="bob", password="bob-password-1", role="user"))
    await link.request(lambda rid: client.protocol.frames.AclGrant(
        rid=rid, user="bob", pattern="q", permissions=["produce", "consume"]))
    bob_url = url.replace("admin:", "bob:").split("@")[0].rsplit(":", 1)[0] + ":bob-password-1@" + url.split("@")[1]
    async with await client.connect_link(bob_url) as bob:
        forged = client.transactions.Transaction(bob, tx.id)
        with pytest.raises(AccessRefusedError, match="not begun by user"):
            await forged.publish("q", b"into someone else's transaction")
        async with bob.transaction("mine") as own:  # (the same id, another user: another producer)
            await own.publish("q", b"bob's")
    await tx.commit()  # (bob's producer did not fence admin's)
    assert await _drain(link, "q") == [b"bob's"]


async def test_a_stream_is_refused_in_a_transaction_directly_or_through_an_exchange(link: client.Connection) -> None:
    await link.declare_stream("s")
    await link.declare_queue("q")
    await link.declare_exchange("fan", "fanout")
    await link.bind_queue("q", "fan")
    await link.bind_queue("s", "fan")
    tx = await link.begin("app")
    with pytest.raises(InvalidArgumentError, match="stream"):
        await tx.publish("s", b"x")
    with pytest.raises(InvalidArgumentError, match="routes to stream 's'.*nothing of the batch was stored"):
        await tx.publish_to_exchange("fan", b"x")
    await tx.abort()
    assert await _drain(link, "q") == []
    msgs, _, _ = await link.read("s", 0, 0)
    assert msgs == []


async def test_publishes_through_exchanges_commit_and_abort_with_the_rest(link: client.Connection,
                                                                        node: Node) -> None:
    await link.declare_queue("in")
    for q in ("eu", "us", "audit"):
        await link.declare_queue(q, partitions=2)
    await link.declare_exchange("orders", "topic")
    await link.bind_queue("eu", "orders", "order.eu.*")
    await link.bind_queue("us", "orders", "order.us.*")
    await link.bind_queue("audit", "orders", "order.#")
    await link.producer("in").send_many([(b"one", None), (b"two", None)])

    m = await link.get("in")
    assert m is not None
    async with link.transaction("router") as tx:
        await tx.publish_to_exchange("orders", b"eu-1", routing_key="order.eu.new")
        stored = await tx.publish_many_to_exchange("orders", [(b"us-1", "k1"), (b"us-2", "k2")],
                                                   routing_key="order.us.new")
        assert stored == 4  # (each to its region's queue and to audit)
        await tx.publish_to_exchange("orders", b"nowhere", routing_key="refund.eu")  # (dropped: no binding)
        await tx.ack(m)
        assert [await link.get(q) for q in ("eu", "us", "audit")] == [None] * 3  # (read committed)
    assert await _drain(link, "eu") == [b"eu-1"]
    assert sorted(await _drain(link, "us")) == [b"us-1", b"us-2"]
    assert sorted(await _drain(link, "audit")) == [b"eu-1", b"us-1", b"us-2"]

    m = await link.get("in")
    assert m is not None
    tx = await link.begin("router")
    await tx.publish_to_exchange("orders", b"eu-2", routing_key="order.eu.new")
    await tx.publish("us", b"direct")
    await tx.ack(m)
    with pytest.raises(client.errors.UnroutableError):
        await tx.publish_to_exchange("orders", b"lost", routing_key="refund.us", mandatory=True)
    await tx.abort()
    assert [await _drain(link, q) for q in ("eu", "us", "audit")] == [[]] * 3
    assert await _drain(link, "in") == [b"two"]  # (its ack aborted)
    assert all(node.catalogue.queue(q).depth == 0 for q in ("eu", "us", "audit"))  # (nothing held aside)


async def test_a_closed_link_aborts_what_it_left_open(url: str, link: client.Connection) -> None:
    await link.declare_queue("q")
    await link.producer("q").send(b"in")
    other = await client.connect_link(url)
    m = await other.get("q")
    assert m is not None
    tx = await other.begin("app")
    await tx.publish("q", b"out")
    await tx.ack(m)
    await other.close()  # (before the commit)
    await wait_until(lambda: _ready(link, "q", 1), timeout=30, what="the acked message ready again")
    assert await _drain(link, "q") == [b"in"]
    with pytest.raises(TransactionAbortedError):  # (its commit, asked late on another link: the abort stands)
        await client.transactions.Transaction(link, tx.id).commit()
    assert await _drain(link, "q") == []


async def _ready(link: client.Connection, queue: str, n: int) -> bool:
    return {q.name: q for q in await link.list_queues()}[queue].ready == n


async def test_the_blocking_client_commits_and_aborts_as_the_asyncio_one(url: str, link: client.Connection) -> None:
    await link.declare_queue("in")
    await link.declare_queue("out")
    await link.producer("in").send_many([(b"one", None), (b"two", None)])

    def work() -> None:
        with client.blocking.connect(url, timeout=10) as b:
            m = b.get("in")
            assert m is not None
            with b.transaction("blocking-worker") as tx:
                tx.publish("out", m.body.upper())
                assert tx.publish_many_to_exchange("", [(b"ROUTED", None)], routing_key="out") == 1
                tx.publish_to_exchange("", b"dropped", routing_key="no-such-queue")
                tx.ack(m)
            m = b.get("in")
            assert m is not None
            with pytest.raises(RuntimeError):
                with b.transaction("blocking-worker") as tx:
                    tx.publish("out", b"never")
                    tx.ack(m)
                    raise RuntimeError("the block fails")

    await asyncio.to_thread(work)
    assert await _drain(link, "out") == [b"ONE", b"ROUTED"]
    assert await _drain(link, "in") == [b"two"]  # (acked in the aborted transaction: ready again)
