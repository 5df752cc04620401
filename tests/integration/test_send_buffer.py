"""The local send buffer across a client restart: with every node down, a client process
buffers 1,000 sends and exits; the nodes come back; a new client process with the same
buffer path and producer id drains them; a consumer gets each exactly once, in order
within its partition."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import client
from client.errors import StaleDeliveryError
from broker.tools.cluster import LocalCluster

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.timeout(240)]

CLIENT = """
import asyncio, sys
import client

async def main(url, path, mode):
    conn = await client.connect(url, buffer_path=path, send_timeout=60)
    p = conn.producer("orders", producer_id="shop-1")
    if mode == "send":
        for i in range(1000):
            r = await p.send(f"m{i}".encode(), key=f"customer-{i % 17}")
            assert r.buffered, r
        print("buffered", p.buffered_count)
    else:
        await p.wait_drained(timeout=60)
        print("drained", p.confirmed)
    await conn.close()

asyncio.run(main(*sys.argv[1:]))
"""


def _client(url: str, path: Path, mode: str) -> str:
    out = subprocess.run([sys.executable, "-c", CLIENT, url, str(path), mode], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip()


async def test_buffered_sends_survive_a_client_restart_and_arrive_once_in_order(tmp_path: Path) -> None:
    cl = LocalCluster(tmp_path / "group", console=False, nodes=3, base_port=0, password="test-password",
                      extra_args=["--keepalive-interval", "0.1", "--non-response-timeout", "0.5"])
    await cl.start()
    try:
        await cl.wait_ready()
        async with await client.connect(cl.url) as conn:
            await conn.declare_queue("orders", partitions=4)
        url = cl.url
        await cl.stop()  # every node down
        buffer = tmp_path / "client" / "buffer.db"
        assert _client(url, buffer, "send") == "buffered 1000"
        await cl.start()
        await cl.wait_ready()
        assert _client(url, buffer, "drain") == "drained 1000"
        got: dict[int, list[int]] = {}  # each partition's messages, in the order they first came
        seen: set[int] = set()
        async with await client.connect(url) as conn:
            async with conn.consumer("orders") as c:
                # (until each came and nothing more comes: a delivery whose settle a link's failover
                # cut comes again, and is acked then)
                while (m := await c.next(30 if len(seen) < 1000 else 3)) is not None:
                    i = int(m.body[1:])
                    if i not in seen:
                        seen.add(i)
                        got.setdefault(m.partition, []).append(i)
                    try:
                        await m.ack()
                    except StaleDeliveryError:
                        pass
        assert len(seen) == 1000, f"only {len(seen)} of 1000 arrived"
        assert sorted(i for ids in got.values() for i in ids) == list(range(1000))
        assert all(ids == sorted(ids) for ids in got.values())
        for name in cl.nodes:  # nothing left anywhere: no copy was stored twice
            async with await client.connect_link(cl.url_of(name)) as link:
                assert all(q.ready + q.unacked == 0 for q in await link.list_queues())
    finally:
        await cl.stop()
