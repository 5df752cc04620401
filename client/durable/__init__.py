"""Durable connections: a client that rides through failovers.

    conn = await client.connect("tandem://admin:PW@h1:7780,h2:7790,h3:7800")
    async with conn.producer("orders") as p:
        await p.send(b"hello", key="customer-1")   # takes longer across a failover, no more
    async with conn.consumer("orders") as c:
        async for m in c:
            await m.ack()

The package, from the bottom up:

* :mod:`~client.durable.events` — what the application hears: ``ConnectionEvent``, ``SendResult``.
* :mod:`~client.durable.routing` — which partition map to route by when a node has no quorum (sans-IO).
* :mod:`~client.durable.links` — one link per node, the primary link and its failover.
* :mod:`~client.durable.pipeline` — one partition's send pipeline, a sans-IO state table.
* :mod:`~client.durable.draining` — the producer's local buffer (sends while no node answers).
* :mod:`~client.durable.producer` — the asyncio shell that drives the pipelines.
* :mod:`~client.durable.consumer` — consumers of every member's partitions.
* :mod:`~client.durable.connection` — ``DurableConnection``: the application's calls.
"""

from __future__ import annotations

from client.durable.connection import DurableConnection
from client.durable.consumer import DurableConsumer, DurableMessage
from client.durable.events import ConnectionEvent, SendResult
from client.durable.links import DEFAULT_BUFFER_MAX_BYTES, DEFAULT_REQUEST_TIMEOUT, DEFAULT_SEND_TIMEOUT
from client.durable.producer import DurableProducer

__all__ = ["DEFAULT_BUFFER_MAX_BYTES", "DEFAULT_REQUEST_TIMEOUT", "DEFAULT_SEND_TIMEOUT", "ConnectionEvent",
           "DurableConnection", "DurableConsumer", "DurableMessage", "DurableProducer", "SendResult"]
