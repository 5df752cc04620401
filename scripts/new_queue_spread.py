"""How a new queue's actives come out on a fresh local group: spread, and how soon.

    .venv/bin/python scripts/new_queue_spread.py [--runs 20] [--nodes 3]

Each run starts a fresh group (``LocalCluster``, as ``tandem cluster up``, in a temp dir),
declares a queue with one partition per node, and times the declare until every partition
has an active (``tandem bench``'s set-up, which polls every 50 ms).  Prints one line a run
and a summary: how many runs had each node the active of exactly one partition.  A diagnostic
(docs/replication.md); the test of the rule is in tests/ha.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from broker.tools.bench.harness import TandemDriver
from broker.tools.bench.workload import Workload
from broker.tools.cluster import LocalCluster
from client.clock import SYSTEM_CLOCK


async def one_run(nodes: int) -> tuple[float, dict[int, str]]:
    with tempfile.TemporaryDirectory(prefix="tandem-spread-") as tmp:
        cl = LocalCluster(Path(tmp), nodes=nodes, base_port=0)
        await cl.start()
        try:
            await cl.wait_ready()
            drv = TandemDriver(cl.url)
            await drv._connect()  # the connection is not part of the time
            t0 = SYSTEM_CLOCK.monotonic()
            await drv.setup(Workload(partitions=nodes))
            took = SYSTEM_CLOCK.monotonic() - t0
            actives = await cl.actives(drv.queue)
            await drv.teardown()
            return took, actives
        finally:
            await cl.stop()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--nodes", type=int, default=3)
    args = ap.parse_args()
    spread, times = 0, []
    for i in range(args.runs):
        took, actives = await one_run(args.nodes)
        even = sorted(actives.values()) == sorted(f"node{k + 1}" for k in range(args.nodes))
        spread += even
        times.append(took)
        print(f"run {i + 1}: every partition active in {took:.2f} s, actives {dict(sorted(actives.items()))}"
              f"{'' if even else '  <- uneven'}", flush=True)
    times.sort()
    print(f"{spread} of {args.runs} runs spread evenly; declare to every partition active "
          f"{times[0]:.2f}-{times[-1]:.2f} s, median {times[len(times) // 2]:.2f} s")


if __name__ == "__main__":
    asyncio.run(main())
