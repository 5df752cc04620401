"""How long a restore takes when the quarantine holds a large backlog, and what a producer sees.

    .venv/bin/python scripts/restore_backlog.py [--size 1G] [--body 64K] [--via api|cli] [--runs 1]
                                                [--weak-hold-bytes 1536M]

Each run starts a fresh three-node group (``LocalCluster``, default settings, in a temp dir)
whose node3 is reached through fault proxies, declares a one-partition queue, cuts node3 off,
lets node1 and node2 confirm 100 messages, forces node3 to take writes alone (``quorum_override 1``) and fills the queue there with
``--size`` of keyed messages (confirmed by node3 alone), clears the override and heals the
cut: node3 discards those writes (HA-1014) and the quarantine gets them.  Then it restores
them (``--via api``: ``POST /api/v1/restore`` again while it answers ``"more"``; ``--via
cli``: ``tandem restore --json``) while a durable producer sends one message every 10 ms to
the queue.  It reports the fill, how long the quarantine took to hold every message after the
heal, the restore's time, the longest confirm wait of a send made during it, and that the
queue then holds every key once.  The figures are for docs/operations.md.  node3 takes writes
under the override up to ``--weak-hold-bytes`` (the nodes' setting, default 256M) and refuses
the next ones: give it more than ``--size``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import tempfile
from pathlib import Path

import aiohttp

import client
from broker.config import parse_size
from broker.partitions.quarantine import QUEUE as QUARANTINE
from broker.tools.cluster import LocalCluster
from broker.tools.faults import FaultProxy
from broker.tools.totals import queue_totals
from client.clock import SYSTEM_CLOCK
from client.errors import TandemError
from drain_backlog import (QUEUE, Prober, backlog_args, cli, keep_logs, wait_for)  # (scripts/, beside this one)
from update_backlog import send_keyed

clock = SYSTEM_CLOCK
MAJORITY = 100  # messages the majority side confirms during the cut


async def ready(url: str, queue: str) -> int:
    totals = await queue_totals(url)
    return next((q.ready for q in totals.queues if q.name == queue), 0)


async def split_and_fill(cl: LocalCluster, proxies: list[FaultProxy], size: int, body: int) -> tuple[int, float]:
    """node3 cut off and filled alone under the override: (messages, seconds the fill took)."""
    async with await client.connect(cl.url) as conn:
        await conn.declare_queue(QUEUE, partitions=1)
    await wait_for(lambda: _has_active(cl), "the queue's active")
    for p in proxies:
        p.cut()
    async with await client.connect_link(cl.url_of("node3")) as iso:
        await wait_for(lambda: _disabled(iso), "node3 Disabled")
        # the majority side writes too (its own active, a term of its own), so the two logs
        # diverge and the heal discards node3's
        async with await client.connect(cl.url_of("node1"), client_name="restore-majority") as conn:
            await conn.producer(QUEUE).send_many([(b"m", f"maj-{i}") for i in range(MAJORITY)])
        await iso.set_quorum_override(1)
        p = iso.producer(QUEUE)  # (node3 itself: a durable connection would find node1's side)
        await wait_for(lambda: _takes(p), "node3 to take writes under the override")
        n, _sent, took = await send_keyed(p, size, body)
        await iso.set_quorum_override(None)
    return n, took


async def _has_active(cl: LocalCluster) -> bool:
    return len(await cl.actives(QUEUE)) == 1


async def _disabled(iso: client.Connection) -> bool:
    return (await iso.status()).quorum_state == "Disabled"


async def _takes(p: client.Producer) -> bool:
    try:
        async with asyncio.timeout(3):
            await p.send(b"x", key="override")
        return True
    except (TandemError, TimeoutError):
        return False


async def restore(cl: LocalCluster, via: str) -> tuple[dict[str, int], int]:
    """(what was restored, per queue; how many calls it took)."""
    if via == "cli":
        out = await cli("restore", "--json", "--url", cl.url)
        return out["restored"], 1
    admin = {"Authorization": "Basic " + base64.b64encode(f"admin:{cl.password}".encode()).decode()}
    restored: dict[str, int] = {}
    calls = 0
    async with aiohttp.ClientSession(headers=admin) as s:
        while True:
            calls += 1
            async with s.post(cl.console_url("node1") + "api/v1/restore", timeout=aiohttp.ClientTimeout(120)) as r:
                out = await r.json()
                if r.status != 200:
                    raise SystemExit(f"POST /api/v1/restore: {r.status} {out}")
            for q, k in out["restored"].items():
                restored[q] = restored.get(q, 0) + k
            if not out.get("more"):
                return restored, calls


async def one_run(size: int, body: int, via: str, keep: str | None = None, hold: str | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="tandem-restore-backlog-", dir=keep) as tmp:
        cl = LocalCluster(Path(tmp), nodes=3, base_port=0, extra_args=["--weak-hold-bytes", hold] if hold else [])
        proxies = [await FaultProxy(("127.0.0.1", cl.peer_ports["node3"])).start() for _ in range(2)]
        cl.route("node1", "node3", proxies[0].address)  # (node1 and node2 dial node3: names sort)
        cl.route("node2", "node3", proxies[1].address)
        await cl.start()
        try:
            await cl.wait_ready()
            n, took = await split_and_fill(cl, proxies, size, body)
            h0 = clock.monotonic()
            for p in proxies:
                p.heal()

            async def quarantined() -> bool:
                return await ready(cl.url, QUARANTINE) >= n

            await wait_for(quarantined, "the quarantine to hold every discarded message", timeout=1800)
            h1 = clock.monotonic()
            prober = Prober(cl.url)
            probing = asyncio.ensure_future(prober.run())
            await clock.sleep(1.0)  # the probe's steady state before the restore (a baseline, not a wait for a state)
            r0 = clock.monotonic()
            restored, calls = await restore(cl, via)
            r1 = clock.monotonic()
            await clock.sleep(1.0)  # the probe after the restore (a tail, not a wait for a state)
            prober.stop()
            await probing
            consumed = await consume_all(cl.url)
            return {"via": via, "messages": n, "bytes": n * body, "fill_seconds": round(took, 1),
                    "heal_to_quarantined_seconds": round(h1 - h0, 1), "restore_seconds": round(r1 - r0, 2),
                    "restore_calls": calls, "restored": restored.get(QUEUE, 0),
                    "longest_confirm_wait_during_restore_ms": round(prober.longest(r0, r1) * 1000),
                    "probe_sends": len(prober.waits) + prober.failed, "probe_failed": prober.failed,
                    "quarantine_left": await ready(cl.url, QUARANTINE), **consumed}
        finally:
            await cl.stop()
            for p in proxies:
                await p.stop()
            keep_logs(tmp, keep)


async def consume_all(url: str) -> dict:
    """Consume the whole queue: how many messages, how many distinct fill keys, fill keys seen
    twice (the probes and the sends that waited for the override have none)."""
    keys: set[str] = set()
    total = twice = 0
    async with await client.connect(url, client_name="restore-check") as conn:
        async with conn.group_consumer(QUEUE, prefetch=256) as c:
            while (m := await c.next(5.0)) is not None:
                total += 1
                if m.key is not None and m.key.startswith("key-"):
                    twice += m.key in keys
                    keys.add(m.key)
                m.ack()
    return {"consumed": total, "keys_consumed": len(keys), "keys_twice": twice}


async def main() -> None:
    ap = backlog_args(__doc__, "what node3 writes alone, then discards (default 1G)")
    ap.add_argument("--via", choices=("api", "cli"), default="api", help="the admin API (default) or tandem restore")
    ap.add_argument("--weak-hold-bytes", metavar="SIZE",
                    help="the nodes' weak_hold_bytes (default: theirs, 256M): above --size, node3 takes every "
                         "message the fill sends it alone")
    args = ap.parse_args()
    for i in range(args.runs):
        print(json.dumps({"run": i + 1, **await one_run(parse_size(args.size), parse_size(args.body), args.via,
                                                        args.logs, args.weak_hold_bytes)}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
