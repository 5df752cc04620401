"""Exchanges with real node processes: a 3-node group, a fanout exchange bound to 100 queues, a
topic exchange routing to 3 queues by pattern and a headers exchange, three durable producers
sending at once, and ``kill -9`` of the member that is active for a third of the queues mid-run.
Every bound queue must hold every confirmed message routed to it exactly once: the checker
reads each queue by offset and counts lost, duplicated and unexpected."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

import client
from broker.tools.cluster import LocalCluster
from tests.conftest import FAST
from tests.helpers import wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.timeout(240)]

NODES = ("node1", "node2", "node3")
FANOUT = [f"fan{i:03d}" for i in range(30)]
#: topic queue -> its pattern, and the routing keys sent (each key's expected queues follow)
TOPIC = {"t.eu": "*.eu.#", "t.orders": "orders.*", "t.all": "#"}
KEYS = ["orders.eu", "orders.us", "news.eu.fr", "misc"]


def topic_wanted(key: str) -> set[str]:
    words = key.split(".")
    out = {"t.all"}
    if len(words) >= 2 and words[1] == "eu":
        out.add("t.eu")
    if len(words) == 2 and words[0] == "orders":
        out.add("t.orders")
    return out


async def stored(conn: client.DurableConnection, queue: str) -> Counter[bytes]:
    """Every message the queue's one partition holds, by body (read by offset, not consumed)."""
    got: Counter[bytes] = Counter()
    offset = 0
    while True:
        msgs, nxt, end = await conn.read(queue, 0, offset, 1000)
        got.update(m.body for m in msgs)
        if nxt >= end or not msgs:
            return got
        offset = nxt


async def test_fanout_topic_and_headers_through_a_kill_9_store_each_message_once_per_queue(tmp_path: Path) -> None:
    cl = LocalCluster(tmp_path, console=False, nodes=3, base_port=0, password="test-password", extra_args=FAST)
    await cl.start()
    try:
        await cl.finalize()
        async with await client.connect(cl.url, send_timeout=60) as conn:
            await conn.declare_exchange("fan", "fanout")
            await conn.declare_exchange("topics", "topic")
            await conn.declare_exchange("docs", "headers")
            async def fan_queue(i: int, q: str) -> None:  # each queue's active: node1, node2, node3 in turn
                first = NODES[i % 3]
                await conn.declare_queue(q, placement=[[first, *(n for n in NODES if n != first)]])
                await conn.bind_queue(q, "fan")

            await asyncio.gather(*(fan_queue(i, q) for i, q in enumerate(FANOUT)))
            for q, pattern in TOPIC.items():
                await conn.declare_queue(q, placement=[["node2", "node1", "node3"]])
                await conn.bind_queue(q, "topics", pattern)
            await conn.declare_queue("pdf", placement=[["node2", "node3", "node1"]])
            await conn.bind_queue("pdf", "docs", arguments={"x-match": "all", "format": "pdf"})

            async def served() -> bool:
                return all([len(await cl.actives(q, 1)) == 1 for q in (*FANOUT[:3], *TOPIC, "pdf")])

            await wait_until(served, timeout=60, what="the queues active")
            confirmed: dict[str, list[tuple[bytes, str]]] = {"fan": [], "topics": [], "docs": []}

            async def produce(exchange: str, n: int) -> None:
                p = conn.exchange_producer(exchange)
                for i in range(n):
                    body = f"{exchange}-{i}".encode()
                    key = KEYS[i % len(KEYS)]
                    fmt = "pdf" if i % 2 == 0 else "zip"
                    await p.send(body, routing_key=key, headers={"format": fmt})
                    confirmed[exchange].append((body, key if exchange == "topics" else fmt))

            producers = asyncio.gather(produce("fan", 150), produce("topics", 200), produce("docs", 200))
            await wait_until(lambda: len(confirmed["fan"]) >= 50, timeout=60, what="a third of the fan-out sent")
            await cl.nodes["node2"].kill()  # active of the topic and headers queues and of a third of the fan-out
            await producers
            await cl.nodes["node2"].start()
            await cl.wait_members()  # (read once the group has its three members again)

            async def all_served() -> bool:
                return all([len(await cl.actives(q, 1)) == 1 for q in (*FANOUT, *TOPIC, "pdf")])

            await wait_until(all_served, timeout=60, what="every queue active again")

        async with await client.connect(cl.url) as conn:
            lost = duplicated = unexpected = 0

            missing: dict[str, list[bytes]] = {}

            def count(got: Counter[bytes], want: set[bytes], queue: str) -> None:
                nonlocal lost, duplicated, unexpected
                lost += len(want - set(got))
                if want - set(got):
                    missing[queue] = sorted(want - set(got))[:5]
                duplicated += sum(1 for b, n in got.items() if n > 1)
                unexpected += len(set(got) - want)

            fan_bodies = {b for b, _ in confirmed["fan"]}
            for q in FANOUT:
                count(await stored(conn, q), fan_bodies, q)
            for q in TOPIC:
                count(await stored(conn, q), {b for b, key in confirmed["topics"] if q in topic_wanted(key)}, q)
            count(await stored(conn, "pdf"), {b for b, fmt in confirmed["docs"] if fmt == "pdf"}, "pdf")
            assert (lost, duplicated, unexpected) == (0, 0, 0), missing
            assert (len(confirmed["fan"]), len(confirmed["topics"]), len(confirmed["docs"])) == (150, 200, 200)
    finally:
        await cl.stop()
