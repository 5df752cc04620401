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


async def test_dead_letters_go_through_a_named_exchange_with_their_routing_key(amqp_node: Node) -> None:
    """RabbitMQ's dead-letter exchange: a rejected message goes to the queues the exchange routes
    it to with the queue's x-dead-letter-routing-key, else the key it was published with; an
    expired one too; the dead letter names that exchange and key."""
    async with await aio_pika.connect(amqp_url(amqp_node)) as conn:
        ch = await conn.channel()
        dlx = await ch.declare_exchange("dlx", aio_pika.ExchangeType.TOPIC)
        rejected = await ch.declare_queue("rejected")
        await rejected.bind(dlx, "orders.#")
        expired = await ch.declare_queue("expired")
        await expired.bind(dlx, "late")
        work = await ch.declare_queue("work", arguments={"x-dead-letter-exchange": "dlx"})
        orders = await ch.declare_exchange("orders", aio_pika.ExchangeType.DIRECT)
        await work.bind(orders, "orders.new")
        await orders.publish(aio_pika.Message(b"bad order"), routing_key="orders.new")
        m = await work.get(timeout=10)
        await m.reject(requeue=False)
        dead = await rejected.get(timeout=10)
        assert (dead.body, dead.exchange, dead.routing_key) == (b"bad order", "dlx", "orders.new")
        assert dead.headers["x-death-reason"] == "rejected" and dead.headers["x-death-queue"] == "work"
        [death] = dead.headers["x-death"]  # (RabbitMQ's table)
        assert (death["count"], death["reason"], death["queue"], death["exchange"], death["routing-keys"]) == \
            (1, "rejected", "work", "orders", ["orders.new"])
        assert dead.headers["x-first-death-reason"] == "rejected"
        await dead.ack()

        await ch.declare_queue("timed", arguments={"x-dead-letter-exchange": "dlx",
                                                   "x-dead-letter-routing-key": "late", "x-message-ttl": 50})
        await ch.default_exchange.publish(aio_pika.Message(b"too late", headers={"k": "v"}, expiration=30),
                                          routing_key="timed")
        got: list[AbstractIncomingMessage] = []

        async def take(msg: AbstractIncomingMessage) -> None:
            got.append(msg)
            await msg.ack()

        await expired.consume(take)

        async def arrived() -> bool:
            return bool(got)

        await wait_until(arrived, timeout=10, what="the expired message in the dead-letter exchange's queue")
        assert (got[0].body, got[0].routing_key, got[0].headers["k"]) == (b"too late", "late", "v")
        [death] = got[0].headers["x-death"]
        assert (death["reason"], death["queue"], death["original-expiration"]) == ("expired", "timed", "30000")


async def test_a_dead_letter_exchange_that_routes_nowhere_drops_and_a_cycle_of_expiry_is_cut(
        amqp_node: Node) -> None:
    async with await aio_pika.connect(amqp_url(amqp_node)) as conn:
        ch = await conn.channel()
        await ch.declare_exchange("nowhere", aio_pika.ExchangeType.FANOUT)
        q = await ch.declare_queue("lonely", arguments={"x-dead-letter-exchange": "nowhere"})
        await ch.default_exchange.publish(aio_pika.Message(b"m"), routing_key="lonely")
        await (await q.get(timeout=10)).reject(requeue=False)
        # (expired messages routed back to their own queue would expire for ever: dropped instead)
        loop = await ch.declare_exchange("loop", aio_pika.ExchangeType.FANOUT)
        looped = await ch.declare_queue("looped", arguments={"x-dead-letter-exchange": "loop", "x-message-ttl": 20})
        await looped.bind(loop)
        await ch.default_exchange.publish(aio_pika.Message(b"again"), routing_key="looped")

        async def gone() -> bool:
            info = amqp_node.catalogue.queues["looped"].info()
            lonely = amqp_node.catalogue.queues["lonely"].info()
            return info.ready + info.unacked == 0 and lonely.ready + lonely.unacked == 0

        await wait_until(gone, timeout=10, what="both messages dropped")
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed, match="must be text"):
            await (await conn.channel()).declare_queue("odd", arguments={"x-dead-letter-exchange": 7})


async def test_update_secret_is_answered_and_the_connection_stays_the_users(amqp_node: Node) -> None:
    """As RabbitMQ answers it for users of its own database: update-secret-ok; the password was
    checked at login and the connection goes on as that user."""
    async with await aio_pika.connect(amqp_url(amqp_node)) as conn:
        await conn.update_secret("a rotated token", reason="rotated")
        await (await conn.channel()).declare_queue("still-open")


async def test_an_auto_delete_queue_goes_with_its_last_consumer_not_with_its_declarer(amqp_node: Node) -> None:
    """RabbitMQ's rule: an auto-delete queue is deleted once its last consumer is cancelled or
    gone (channel or connection closed), never because a connection that declared it closed,
    and never if it had no consumer."""
    url = amqp_url(amqp_node)
    queues = amqp_node.catalogue.queues

    async def gone(name: str) -> None:
        async def no_queue() -> bool:
            return name not in queues

        await wait_until(no_queue, timeout=10, what=f"{name} deleted")

    declarer = await aio_pika.connect(url)
    await (await declarer.channel()).declare_queue("pulled", auto_delete=True)
    await declarer.close()
    assert "pulled" in queues  # (never consumed: stays)

    a, b = await aio_pika.connect(url), await aio_pika.connect(url)
    qa = await (await a.channel()).declare_queue("shared", auto_delete=True)
    await qa.consume(ack)
    qb = await (await b.channel()).declare_queue("shared", auto_delete=True)
    tag = await qb.consume(ack)
    await a.close()  # (b still consumes)
    await (await b.channel()).declare_queue("barrier")  # (a round trip after a's close was handled)
    assert "shared" in queues
    await qb.cancel(tag)  # (the last consumer)
    await gone("shared")

    qc = await (await b.channel()).declare_queue("by-close", auto_delete=True)
    await qc.consume(ack)
    await b.close()  # (its consumer goes with the connection)
    await gone("by-close")


async def test_unbinding_from_a_queue_or_exchange_gone_is_unbind_ok(amqp_node: Node) -> None:
    """As RabbitMQ answers (aio-pika's RPC cancels its auto-delete reply queue's consumer, which
    deletes it, then unbinds it)."""
    async with await aio_pika.connect(amqp_url(amqp_node)) as conn:
        ch = await conn.channel()
        ex = await ch.declare_exchange("ex", aio_pika.ExchangeType.DIRECT)
        other = await ch.declare_exchange("other", aio_pika.ExchangeType.DIRECT)
        q = await ch.declare_queue("brief")
        await q.bind(ex, "k")
        await other.bind(ex, "k")
        await q.delete(if_unused=False, if_empty=False)
        await q.unbind(ex, "k")  # (the queue is gone)
        await other.delete()
        raw = await ch.get_underlay_channel()
        await raw.exchange_unbind(destination="other", source="ex", routing_key="k")  # (the exchange is gone)
        with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
            await q.bind(ex, "k")  # (a bind to what is gone still says so)
