"""Delayed and expiring messages through the SDKs against a node on a real socket (each storage
engine): a message is delivered no earlier than its time, and one that expired before a
consumer reached it goes to the dead-letter queue, never to a consumer."""

from __future__ import annotations

import asyncio
import time

import pytest

import client
import client.blocking
from tests.helpers import wait_until
from client.errors import InvalidArgumentError

pytestmark = pytest.mark.asyncio


async def test_a_delay_holds_a_message_back_and_a_ttl_sends_it_to_the_dead_letter_queue(
        conn: client.DurableConnection) -> None:
    await conn.declare_queue("dead")
    await conn.declare_queue("timed", dead_letter_queue="dead")
    p = conn.producer("timed")
    await p.send(b"later", delay=0.5)
    await p.send(b"short", ttl=0.2)  # (the head of the ready messages: nobody consumes, it expires there)
    async with conn.consumer("dead") as d:
        m = await d.next(10)
        assert m is not None and m.body == b"short" and m.headers["x-death-reason"] == "expired"
        assert "expiration" not in m.headers  # (it does not expire again in the dead-letter queue)
        await m.ack()
    async with conn.consumer("timed") as c:
        m = await c.next(10)
        assert m is not None and m.body == b"later"
        assert time.time() >= m.timestamp + 0.5  # never early
        await m.ack()
        assert await c.next(0.2) is None
    with pytest.raises(InvalidArgumentError, match="x-delay: a number of seconds >= 0"):
        await p.send(b"x", delay=-1)


async def test_the_blocking_client_delays_too(url: str) -> None:
    def run() -> tuple[bytes, float, float]:
        with client.blocking.connect(url, timeout=10) as b:
            b.declare_queue("blocking-timed")
            at = time.time() + 0.3  # (the client's clock and the node's: the same host)
            b.producer("blocking-timed").send(b"in a moment", deliver_at=at)
            m = b.consumer("blocking-timed").next()
            m.ack()
            return m.body, at, time.time()

    body, at, got = await asyncio.to_thread(run)
    assert body == b"in a moment" and got >= at  # never early


async def test_a_queue_unused_for_its_expires_is_deleted(conn: client.DurableConnection) -> None:
    """A consumer keeps it; once cancelled and unused for its expires, the node deletes it."""
    await conn.declare_queue("brief", expires=300)
    await conn.producer("brief").send(b"kept while consumed")
    async with conn.consumer("brief") as c:
        assert (await c.next(10)) is not None

    async def gone() -> bool:
        return "brief" not in {q.name for q in await conn.list_queues()}

    await wait_until(gone, timeout=20, what="the unused queue deleted")
