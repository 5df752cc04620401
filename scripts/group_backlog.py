"""How long adding and removing a group member take when a partition holds a large backlog, and what a producer sees.

    .venv/bin/python scripts/group_backlog.py [--size 1G] [--body 64K] [--runs 1]

Each run starts a fresh three-node group (``LocalCluster``, default settings: three copies of
each partition, in a temp dir) and fills a one-partition queue with ``--size`` of messages
(confirmed, every copy caught up).  Then, while a durable producer sends one message every
10 ms to the queue:

* ``tandem group add node0=... --wait`` adds a fourth node, started right after the command
  is issued.  Placed over node0..node3 the partition's list becomes node0, node1, node2: the
  re-spread copies the whole backlog to node0, hands the partition to it and drops node3's copy;
* ``tandem group remove node0 --wait`` takes it out again: the partition goes back to node1,
  node2, node3 (node3 gets the backlog anew) and node0 leaves the group.

It reports each operation's time and the longest confirm wait of a send made during it.  The
figures are for docs/operations.md.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path

from broker.config import parse_size
from broker.tools.cluster import LocalCluster
from client.clock import SYSTEM_CLOCK
from drain_backlog import (Prober, backlog_args, cli, fill, keep_logs)  # (scripts/, beside this one)

clock = SYSTEM_CLOCK


async def one_run(size: int, body: int, keep: str | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="tandem-group-backlog-", dir=keep) as tmp:
        cl = LocalCluster(Path(tmp), nodes=3, base_port=0)
        await cl.start()
        try:
            await cl.wait_ready()
            sent, took, _active = await fill(cl, size, body)
            spec = cl.new_member("node0")
            prober = Prober(cl.url)
            probing = asyncio.ensure_future(prober.run())
            await clock.sleep(1.0)  # the probe's steady state before the change (a baseline, not a wait for a state)
            a0 = clock.monotonic()
            adding = asyncio.ensure_future(cli("group", "add", spec, "--wait", "--timeout", "900", "--json",
                                               "--url", cl.url_of("node2")))
            await cl.nodes["node0"].start(60)
            added = await adding
            a1 = clock.monotonic()
            await clock.sleep(1.0)  # between the two (not a wait for a state)
            r0 = clock.monotonic()
            removed = await cli("group", "remove", "node0", "--wait", "--timeout", "900", "--json",
                                "--url", cl.url_of("node2"))
            r1 = clock.monotonic()
            await clock.sleep(1.0)  # the probe after the change (a tail, not a wait for a state)
            prober.stop()
            await probing
            return {"backlog_bytes": sent, "fill_seconds": round(took, 1),
                    "add_seconds": added["seconds"], "add_members": added["members"],
                    "longest_confirm_wait_during_add_ms": round(prober.longest(a0, a1) * 1000),
                    "remove_seconds": removed["seconds"], "remove_members": removed["members"],
                    "longest_confirm_wait_during_remove_ms": round(prober.longest(r0, r1) * 1000),
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
