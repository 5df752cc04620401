"""One side of the client matrix (tests/integration/test_client_matrix.py), run as a script by
either build's interpreter so that the SDK it imports is that build's:

    python -P sdk_side.py produce URL QUEUE N    # N messages, one "confirmed BODY" line each
    python -P sdk_side.py consume URL QUEUE N    # until N distinct bodies: "got BODY ID REDELIVERED" each, acked

Only what both builds' SDKs have is used: ``client.connect`` (a durable connection),
``declare_queue``, a producer's ``send``, a consumer's ``next`` and ``ack``, and a delivered
message's ``body``, ``id`` ('<partition>-<offset>') and ``redelivered``."""

from __future__ import annotations

import asyncio
import sys

import client
from client.errors import StaleDeliveryError


async def produce(url: str, queue: str, n: int) -> None:
    async with await client.connect(url, client_name="matrix-producer", send_timeout=60) as conn:
        await conn.declare_queue(queue, partitions=4)
        print("ready", flush=True)
        async with conn.producer(queue) as p:
            for start in range(0, n, 20):
                bodies = [f"m{i}" for i in range(start, min(n, start + 20))]
                await asyncio.gather(*(p.send(b.encode(), key=b) for b in bodies))
                for b in bodies:
                    print("confirmed", b, flush=True)


async def consume(url: str, queue: str, n: int) -> None:
    seen: set[str] = set()
    async with await client.connect(url, client_name="matrix-consumer") as conn:
        async with conn.consumer(queue, prefetch=64) as c:
            while len(seen) < n:
                m = await c.next(30)
                if m is None:
                    break  # (nothing for 30 s: the test counts what is missing)
                body = m.body.decode()
                print("got", body, m.id, int(m.redelivered), flush=True)
                seen.add(body)
                try:
                    await m.ack()
                except StaleDeliveryError:
                    pass  # its link failed: it comes again, redelivered


if __name__ == "__main__":
    mode, url, queue, count = sys.argv[1:5]
    asyncio.run({"produce": produce, "consume": consume}[mode](url, queue, int(count)))
