"""A durable connection routes each partition to a node that can serve it when the first
node of its URL has no quorum: real node processes, every peer link and client port behind
a FaultProxy (LocalCluster ``proxied``).  Only node1's peer links are cut: the client still
reaches all three nodes.  Every message is accounted for by the checker."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import client
from broker.tools.checker import classify
from broker.tools.cluster import LocalCluster
from client.mapper import make_mapper
from tests.helpers import drain_served, wait_until
from tests.integration.test_replication import actives

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.timeout(240)]

from tests.conftest import FAST

PARTITIONS = 6


def cut_peer_links(cl: LocalCluster, name: str) -> None:
    """Cut ``name`` off from the other members; its client port stays reachable."""
    for px in cl.proxies[name]:
        if px is not cl._client_proxies[name]:
            px.cut()


async def test_a_producer_whose_first_node_loses_quorum_sends_every_partition_elsewhere(tmp_path: Path) -> None:
    cl = LocalCluster(tmp_path, console=False, nodes=3, base_port=0, password="test-password", extra_args=FAST,
                      proxied=True)
    await cl.start()
    try:
        await cl.wait_ready()
        async with await client.connect(cl.url) as conn:
            info = await conn.declare_queue("routed", partitions=PARTITIONS)
        mapper = make_mapper(info.mapper, info.partitions, info.ring_size)
        keys: dict[int, str] = {}
        i = 0
        while len(keys) < PARTITIONS:
            keys.setdefault(mapper.partition(f"k{i}"), f"k{i}")
            i += 1
        await actives(cl, "routed", PARTITIONS)
        sent: list[bytes] = []
        confirmed: list[bytes] = []

        async def send_round(p: client.DurableProducer, tag: str) -> None:
            bodies = {f"{tag}-{part}-{n}".encode(): key for part, key in keys.items() for n in range(5)}
            sent.extend(bodies)
            results = await asyncio.wait_for(asyncio.gather(*(p.send(b, key=k) for b, k in bodies.items())),
                                             timeout=60)
            assert {r.partition for r in results} == set(keys)
            confirmed.extend(bodies)

        async with await client.connect(cl.url, send_timeout=120) as conn:
            assert conn.node == "node1"  # the URL's first host
            p = conn.producer("routed", max_batch=4)
            await send_round(p, "before")
            cut_peer_links(cl, "node1")
            try:
                async def node1_disabled() -> bool:
                    return (await cl.status("node1")).quorum_state == "Disabled"

                await wait_until(node1_disabled, timeout=30, what="node1 without quorum")
                # while node1 is cut off, every partition is confirmed, one round after another
                for r in range(3):
                    await send_round(p, f"cut{r}")
                assert conn.node != "node1"  # requests that are about no partition moved too
                # and so does a connection opened while the cut lasts
                async with await client.connect(cl.url, send_timeout=120) as late:
                    assert late.node == "node1"
                    await send_round(late.producer("routed"), "late")
            finally:
                for px in cl.proxies["node1"]:
                    px.heal()

            async def node1_back() -> bool:
                return (await cl.status("node1")).quorum_state != "Disabled"

            await wait_until(node1_back, timeout=30, what="node1 back in quorum")
            await send_round(p, "healed")
            await p.close()
        await actives(cl, "routed", PARTITIONS)
        consumed = await drain_served(cl.url_of("node1"), "routed")
        v = classify(sent, confirmed, consumed)
        assert (v.lost, v.duplicated, v.unexpected) == (0, 0, 0), v
        assert len(confirmed) == len(sent)
    finally:
        await cl.stop()
