"""How long a partition move takes when the partition holds a large backlog, and what a producer sees.

    .venv/bin/python scripts/move_backlog.py [--size 1G] [--body 64K] [--runs 1]

Each run starts a fresh four-node group (``LocalCluster``, default settings: three copies of
each partition, in a temp dir), fills a one-partition queue (placed on node1, node2, node3)
with ``--size`` of messages (confirmed), waits until both replicas have all of it, then moves
the partition to node4, node2, node3 with ``tandem partition move backlog 0 --to ... --wait
--json`` while a durable producer sends one message every 10 ms to it.  node4 gets the whole
backlog (a snapshot), becomes a voter, takes over as the active, and node1 drops its copy.
It reports the move's time, the longest confirm wait of a send made during it, and how long
the new active took to deliver the first message of the backlog.  The figures are for
docs/operations.md.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path

from broker.config import parse_size
from broker.tools.cluster import LocalCluster
from client.clock import SYSTEM_CLOCK
from drain_backlog import (QUEUE, Prober, backlog_args, cli, fill, first_delivery,  # (scripts/, beside this one)
                           keep_logs)

clock = SYSTEM_CLOCK


async def one_run(size: int, body: int, keep: str | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="tandem-move-backlog-", dir=keep) as tmp:
        cl = LocalCluster(Path(tmp), nodes=4, base_port=0)
        await cl.start()
        try:
            await cl.wait_ready()
            sent, took, active = await fill(cl, size, body)
            st = await cl.status(active)
            holders = [active] + [r.node for p in st.partitions if p.queue == QUEUE for r in p.replicas]
            newcomer = next(n for n in cl.nodes if n not in holders)
            target = [newcomer] + holders[1:]
            prober = Prober(cl.url)
            probing = asyncio.ensure_future(prober.run())
            await clock.sleep(1.0)  # the probe's steady state before the move (a baseline, not a wait for a state)
            m0 = clock.monotonic()
            moved = await cli("partition", "move", QUEUE, "0", "--to", ",".join(target), "--wait", "--timeout",
                              "900", "--json", "--url", cl.url_of(holders[1]))
            m1 = clock.monotonic()
            await clock.sleep(1.0)  # the probe after the move (a tail, not a wait for a state)
            prober.stop()
            await probing
            now_active = (await cl.actives(QUEUE, 1))[0]
            deliver_after = await first_delivery(cl.url_of(now_active))
            return {"backlog_bytes": sent, "fill_seconds": round(took, 1), "from": holders, "to": target,
                    "active_after": now_active, "move_seconds": moved["seconds"],
                    "move_wall_seconds": round(m1 - m0, 2),
                    "longest_confirm_wait_during_move_ms": round(prober.longest(m0, m1) * 1000),
                    "longest_sent_at_s": round(max(((w, t) for t, w in prober.waits if m0 <= t <= m1),
                                                   default=(0.0, m0))[1] - m0, 2),
                    "first_delivery_after_move_s": round(deliver_after, 2),
                    "probe_sends": len(prober.waits) + prober.failed, "probe_failed": prober.failed}
        finally:
            await cl.stop()
            keep_logs(tmp, keep)


async def main() -> None:
    args = backlog_args(__doc__).parse_args()
    for i in range(args.runs):
        print(json.dumps({"run": i + 1, **await one_run(parse_size(args.size), parse_size(args.body), args.logs)}),
              flush=True)


if __name__ == "__main__":
    asyncio.run(main())
