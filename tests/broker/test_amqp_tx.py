"""AMQP transactions (``tx.select``, ``tx.commit``, ``tx.rollback``) on a node's AMQP port, with
aio-pika and pika: publishes (to queues and through exchanges) delivered only at commit and never
after a rollback, acks and nacks held until the commit and unsettled again by a rollback, a
channel closed with its transaction open, and the refusals RabbitMQ makes."""

from __future__ import annotations

import asyncio

import aio_pika
import aiormq
import pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage

from broker.node.node import Node
from tests.broker.test_amqp import amqp_node, amqp_url
from tests.helpers import wait_until

pytestmark = pytest.mark.asyncio
__all__ = ["amqp_node"]  # (the fixture, for pytest)


async def _count(conn: aio_pika.abc.AbstractConnection, queue: str) -> int:
    """The messages ready in ``queue``, from a channel of its own."""
    ch = await conn.channel()
    try:
        q = await ch.declare_queue(queue, passive=True)
        return q.declaration_result.message_count or 0
    finally:
        await ch.close()


async def _get(ch: AbstractChannel, queue: str) -> AbstractIncomingMessage:
    q = await ch.get_queue(queue)
    m = await q.get(fail=False)
    assert m is not None, f"{queue}: nothing to get"
    return m


async def test_publishes_show_at_commit_and_never_after_a_rollback(amqp_node: Node) -> None:
    async with await aio_pika.connect(amqp_url(amqp_node)) as conn:
        ch = await conn.channel(publisher_confirms=False)
        for name in ("orders", "audit"):
            await ch.declare_queue(name)
        fan = await ch.declare_exchange("fan", aio_pika.ExchangeType.FANOUT)
        await (await ch.get_queue("audit")).bind(fan)
        tx = ch.transaction()
        await tx.select()
        for i in range(3):
            await ch.default_exchange.publish(aio_pika.Message(f"o{i}".encode()), routing_key="orders")
        await fan.publish(aio_pika.Message(b"a0"), routing_key="")
        assert (await _count(conn, "orders"), await _count(conn, "audit")) == (0, 0)  # (read committed)
        await tx.commit()
        assert (await _count(conn, "orders"), await _count(conn, "audit")) == (3, 1)

        await ch.default_exchange.publish(aio_pika.Message(b"never"), routing_key="orders")
        await fan.publish(aio_pika.Message(b"never"), routing_key="")
        await tx.rollback()
        await ch.default_exchange.publish(aio_pika.Message(b"o3"), routing_key="orders")
        await tx.commit()  # (a channel in tx mode stays in it: the next transaction began at the rollback)
        assert (await _count(conn, "orders"), await _count(conn, "audit")) == (4, 1)
        bodies = []
        while (m := await (await ch.get_queue("orders")).get(fail=False, no_ack=True)) is not None:
            bodies.append(m.body)
        assert bodies == [b"o0", b"o1", b"o2", b"o3"]
        # nothing held aside is left behind
        assert amqp_node.catalogue.queue("orders").depth == 0 and amqp_node.catalogue.queue("audit").depth == 1


async def test_acks_wait_for_the_commit_and_a_rollback_leaves_them_unacked(amqp_node: Node) -> None:
    async with await aio_pika.connect(amqp_url(amqp_node)) as conn:
        ch = await conn.channel(publisher_confirms=False)
        await ch.declare_queue("in")
        await ch.declare_queue("out")
        for i in range(3):
            await ch.default_exchange.publish(aio_pika.Message(f"i{i}".encode()), routing_key="in")
        tx = ch.transaction()
        await tx.select()
        first, second, third = [await _get(ch, "in") for _ in range(3)]
        await first.ack()
        await second.nack(requeue=True)
        await third.reject(requeue=False)
        await ch.default_exchange.publish(aio_pika.Message(b"I0"), routing_key="out")
        await tx.rollback()
        assert await _count(conn, "in") == 0  # (all three still unacked by this channel)
        assert await _count(conn, "out") == 0

        raw = await ch.get_underlay_channel()  # (aio-pika settles a message once: the same tags again, by hand)
        await raw.basic_ack(first.delivery_tag)
        await raw.basic_nack(second.delivery_tag, requeue=True)
        await ch.default_exchange.publish(aio_pika.Message(b"I0"), routing_key="out")
        assert await _count(conn, "in") == 0  # (the nack waits for the commit too)
        await tx.commit()
        assert await _count(conn, "out") == 1
        assert await _count(conn, "in") == 1  # (the nacked one: ready again; the third still unacked)
        again = await _get(ch, "in")
        assert again.body == b"i1" and again.redelivered
        await raw.basic_ack(third.delivery_tag)
        await again.ack()
        await tx.commit()
        await ch.close()
        assert await _count(conn, "in") == 0
        assert amqp_node.catalogue.queue("in").depth == 0


async def test_a_channel_closed_in_a_transaction_aborts_it(amqp_node: Node) -> None:
    async with await aio_pika.connect(amqp_url(amqp_node)) as conn:
        setup = await conn.channel()
        await setup.declare_queue("in")
        await setup.declare_queue("out")
        await setup.default_exchange.publish(aio_pika.Message(b"input"), routing_key="in")
        ch = await conn.channel(publisher_confirms=False)
        await ch.transaction().select()
        m = await _get(ch, "in")
        await m.ack()
        await ch.default_exchange.publish(aio_pika.Message(b"output"), routing_key="out")
        await ch.close()
        got = await _get(setup, "in")
        assert got.body == b"input" and got.redelivered
        await wait_until(lambda: amqp_node.catalogue.queue("out").depth == 0, timeout=10,
                         what="the output the transaction held aside settled by its abort")
        assert await _count(conn, "out") == 0


async def test_tx_and_confirm_modes_exclude_each_other_and_a_commit_needs_tx_select(amqp_node: Node) -> None:
    async with await aio_pika.connect(amqp_url(amqp_node)) as conn:
        ch = await conn.channel(publisher_confirms=False)
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed, match="not transactional"):
            await ch.transaction().commit()
        ch = await conn.channel(publisher_confirms=True)
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed, match="confirm to tx"):
            await (await ch.get_underlay_channel()).tx_select()  # (aio-pika would not ask, as below)
        ch = await conn.channel(publisher_confirms=False)
        await ch.transaction().select()
        raw = await ch.get_underlay_channel()
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed, match="tx to confirm"):
            await raw.confirm_delivery()


async def test_pika_commits_and_rolls_back(amqp_node: Node) -> None:
    url = amqp_url(amqp_node)

    def work() -> tuple[int, int]:
        with pika.BlockingConnection(pika.URLParameters(url)) as conn:
            ch = conn.channel()
            ch.queue_declare("jobs")
            ch.tx_select()
            ch.basic_publish("", "jobs", b"kept")
            ch.basic_publish("", "jobs", b"kept too")
            ch.tx_commit()
            ch.basic_publish("", "jobs", b"rolled back")
            ch.tx_rollback()
            method, _props, body = ch.basic_get("jobs")
            assert method is not None and body == b"kept"
            ch.basic_ack(method.delivery_tag)
            ch.tx_rollback()  # (the ack too)
            before = ch.queue_declare("jobs", passive=True).method.message_count
            ch.basic_ack(method.delivery_tag)
            ch.tx_commit()
            return before, ch.queue_declare("jobs", passive=True).method.message_count

    assert await asyncio.to_thread(work) == (1, 1)  # (one unacked, one ready; then the first acked)
