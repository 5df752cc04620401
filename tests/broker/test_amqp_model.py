"""The AMQP model's rules a client relies on, with aio-pika against a node: exclusive
consumers, the broker's ``amq.`` names, what ``queue.delete`` with ``if_empty`` counts, and
what is refused by name rather than accepted silently."""

from __future__ import annotations

import aio_pika
import aiormq
import pytest

from aio_pika.abc import AbstractIncomingMessage

from broker.node.node import Node
from tests.broker.test_amqp import amqp_node, amqp_url
from tests.helpers import wait_until

pytestmark = pytest.mark.asyncio

__all__ = ["amqp_node"]


async def ack(m: AbstractIncomingMessage) -> None:
    await m.ack()


async def test_an_exclusive_consumer_is_the_queues_only_one_while_it_lasts(amqp_node: Node) -> None:
    async with await aio_pika.connect(amqp_url(amqp_node)) as conn:
        q = await (await conn.channel()).declare_queue("solo")
        tag = await q.consume(ack, exclusive=True)
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused, match="in exclusive use"):
            await (await (await conn.channel()).get_queue("solo")).consume(ack)
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused, match="in exclusive use"):
            await (await (await conn.channel()).get_queue("solo")).consume(ack, exclusive=True)
        await q.cancel(tag)
        other = await (await conn.channel()).get_queue("solo")
        await other.consume(ack)  # (taken once the exclusive one ended)
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused, match="in exclusive use"):
            await (await (await conn.channel()).get_queue("solo")).consume(ack, exclusive=True)


async def test_an_exclusive_consumer_ends_with_its_channel_and_gets_every_message(amqp_node: Node) -> None:
    async with await aio_pika.connect(amqp_url(amqp_node)) as conn:
        ch = await conn.channel()
        q = await ch.declare_queue("rpc")
        got: list[bytes] = []

        async def take(m: AbstractIncomingMessage) -> None:
            got.append(m.body)
            await m.ack()

        await q.consume(take, exclusive=True)
        for i in range(20):
            await ch.default_exchange.publish(aio_pika.Message(f"m{i}".encode()), routing_key="rpc")

        async def all_in() -> bool:
            return len(got) == 20

        await wait_until(all_in, timeout=10, what="20 messages at the exclusive consumer")
        assert sorted(got) == sorted(f"m{i}".encode() for i in range(20))
        await ch.close()
        again = await (await conn.channel()).get_queue("rpc")
        await again.consume(ack, exclusive=True)  # (the first went with its channel)


async def test_names_starting_amq_are_the_brokers(amqp_node: Node) -> None:
    async with await aio_pika.connect(amqp_url(amqp_node)) as conn:
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused, match="reserved prefix 'amq.\\*'"):
            await (await conn.channel()).declare_queue("amq.mine")
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused, match="reserved prefix 'amq.\\*'"):
            await (await conn.channel()).declare_exchange("amq.mine", aio_pika.ExchangeType.TOPIC)
        ch = await conn.channel()
        named = await ch.declare_queue("", exclusive=True)
        assert named.name.startswith("amq.gen-")
        same = await ch.declare_queue(named.name, passive=True)  # (a server-named queue, passively)
        assert same.name == named.name


async def test_an_internal_exchange_is_refused_not_made_public(amqp_node: Node) -> None:
    async with await aio_pika.connect(amqp_url(amqp_node)) as conn:
        with pytest.raises(aiormq.exceptions.AMQPError, match="NOT_IMPLEMENTED - internal exchanges"):
            await (await conn.channel()).declare_exchange("inner", aio_pika.ExchangeType.FANOUT, internal=True)
        ch = await conn.channel()
        with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
            await ch.declare_exchange("inner", passive=True)


async def test_delete_if_empty_counts_ready_messages_as_rabbitmq_does(amqp_node: Node) -> None:
    async with await aio_pika.connect(amqp_url(amqp_node)) as conn:
        ch = await conn.channel()
        q = await ch.declare_queue("full")
        await ch.default_exchange.publish(aio_pika.Message(b"waiting"), routing_key="full")
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed, match="not empty"):
            await q.delete(if_unused=False, if_empty=True)
        ch = await conn.channel()
        q = await ch.get_queue("full")
        held = await q.get(timeout=10)  # (delivered, not acked: no longer ready)
        assert held.body == b"waiting"
        await q.delete(if_unused=False, if_empty=True)
        assert "full" not in amqp_node.catalogue.queues
