"""Where a 3-node group's slowest confirms come from, at a paced rate.

    .venv/bin/python scripts/confirm_tail.py [--rate 2000] [--messages 16000] [--partitions 1]

Starts a fresh group (``tandem cluster up --nodes 3``, in a temp dir) whose nodes load
``scripts/tail_probe/sitecustomize.py`` (their writer commits and event-loop lags, timed), then
publishes at ``--rate`` with a consumer acking, as ``tandem bench``'s latency phase does, and
notes each confirm's send time and latency.  It prints the p50 / p99, then the slowest 1% in
episodes (sends less than 20 ms apart) with what each node was doing then: writer commits
over 2 ms (``L`` lazy, the held store writes; ``S`` synced; ops in brackets) and loop lags
over 2 ms.  Last, how many episodes overlap a lazy commit on some node.  A diagnostic;
``tandem bench`` is the benchmark.  Linux only.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from broker.tools.bench.harness import TandemDriver
from broker.tools.bench.workload import Checker, Workload, body_for
from broker.tools.process import node_command
from client.clock import SYSTEM_CLOCK

PROBE = Path(__file__).resolve().parent / "tail_probe"


async def paced(url: str, messages: int, rate: float, partitions: int) -> list[tuple[float, float]]:
    """(send time, seconds to its confirm) for each message, on a fresh queue."""
    clock = SYSTEM_CLOCK
    w = Workload(messages=messages, partitions=partitions, latency_rate=rate, latency_messages=messages)
    drv = TandemDriver(url)
    await drv.setup(w)
    checker = Checker(messages)
    consumer = asyncio.create_task(drv.consume(w, checker))
    publisher = await drv.publisher(w)
    sent: list[tuple[float, float]] = []
    window = asyncio.Semaphore(w.window)
    pending: set[asyncio.Future[Any]] = set()

    def confirmed(fut: asyncio.Future[Any], *, t0: float) -> None:
        window.release()
        pending.discard(fut)
        sent.append((t0, clock.monotonic() - t0))

    try:
        start = clock.monotonic()
        for i in range(messages):
            due = start + i / rate
            if due > clock.monotonic():
                await clock.sleep(due - clock.monotonic())  # the pace, as the bench's
            await window.acquire()
            t0 = clock.monotonic()
            fut = asyncio.ensure_future(publisher.submit(body_for(i, w.size)))
            pending.add(fut)
            fut.add_done_callback(functools.partial(confirmed, t0=t0))
        await asyncio.gather(*pending)
        await asyncio.wait_for(checker.done.wait(), 60)
    finally:
        consumer.cancel()
        await asyncio.gather(consumer, return_exceptions=True)
        await drv.teardown()
    return sorted(sent)


def report(sent: list[tuple[float, float]], nodes: dict[str, dict[str, Any]]) -> None:
    lat = sorted(x[1] for x in sent)
    p50, p99 = lat[len(lat) // 2], lat[int(len(lat) * 0.99)]
    print(f"{len(sent)} confirms: p50 {p50 * 1e3:.2f} ms  p99 {p99 * 1e3:.2f} ms  max {lat[-1] * 1e3:.2f} ms")
    episodes: list[list[tuple[float, float]]] = []
    for t, d in sent:
        if d < p99:
            continue
        if episodes and t - episodes[-1][-1][0] < 0.02:
            episodes[-1].append((t, d))
        else:
            episodes.append([(t, d)])
    t_first = sent[0][0]
    with_lazy = 0
    for ep in episodes:
        a, b = ep[0][0] - 0.01, ep[-1][0] + ep[-1][1]
        parts, lazy_here = [], False
        for name, probe in nodes.items():
            commits = [c for c in probe["commits"] if c[0] < b and c[0] + c[1] > a and c[1] > 0.002]
            lags = [g for g in probe["lags"] if g[0] < b and g[0] + g[1] > a]
            lazy_here |= any(c[5] for c in commits)
            shown = ",".join(f"{c[1] * 1e3:.0f}{'L' if c[5] else ''}{'S' if c[4] else ''}({c[3]})" for c in commits)
            parts.append(f"{name}: commits {shown or '-'} lags {','.join(f'{g[1] * 1e3:.0f}' for g in lags) or '-'}")
        with_lazy += lazy_here
        print(f"  {ep[0][0] - t_first:7.3f} s  {len(ep):3d} slow, worst {max(d for _, d in ep) * 1e3:5.1f} ms | "
              + " | ".join(parts))
    print(f"{len(episodes)} episodes of the slowest 1%; {with_lazy} overlap a lazy commit on some node")
    for name, probe in nodes.items():
        lazy = [c for c in probe["commits"] if c[5]]
        if lazy:
            print(f"{name}: {len(lazy)} lazy commits, {sum(c[3] for c in lazy) / len(lazy):.0f} ops, "
                  f"{sum(c[1] for c in lazy) / len(lazy) * 1e3:.1f} ms and {sum(c[2] for c in lazy) / len(lazy) * 1e3:.1f}"
                  f" ms of the writer's CPU on average")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=2000.0, help="msg/s (default %(default)s)")
    ap.add_argument("--messages", type=int, default=16000, help="(default %(default)s)")
    ap.add_argument("--partitions", type=int, default=1, help="of the queue (default %(default)s)")
    ap.add_argument("--base-port", type=int, default=7900, help="the group's first port (default %(default)s)")
    args = ap.parse_args()
    if args.rate <= 0 or args.messages < 100 or args.partitions < 1:
        ap.error("--rate must be > 0, --messages >= 100, --partitions >= 1")
    tandem, env = node_command()
    with tempfile.TemporaryDirectory(prefix="tandem-tail-") as tmp:
        probes = Path(tmp) / "probes"
        probes.mkdir()
        env = {**env, "TANDEM_TAIL_PROBE": str(probes), "PYTHONPATH": f"{PROBE}{os.pathsep}{env['PYTHONPATH']}"}
        data = Path(tmp) / "group"
        log_path = Path(tmp) / "cluster.log"
        with open(log_path, "w+") as logf:
            group = subprocess.Popen([*tandem, "cluster", "up", "--nodes", "3", "--base-port", str(args.base_port),
                                      "--data-dir", str(data)], stdout=logf, stderr=subprocess.STDOUT, env=env)
            try:
                deadline = SYSTEM_CLOCK.monotonic() + 60
                while "client URL" not in log_path.read_text():
                    if group.poll() is not None or SYSTEM_CLOCK.monotonic() > deadline:
                        raise SystemExit(f"the group did not start:\n{log_path.read_text()}")
                    SYSTEM_CLOCK.sleep_blocking(0.2)  # polling a child's output, bounded by the deadline
                password = (data / "admin-password").read_text().strip()
                hosts = ",".join(f"127.0.0.1:{args.base_port + 10 * i}" for i in range(3))
                sent = asyncio.run(paced(f"tandem://admin:{password}@{hosts}", args.messages, args.rate,
                                         args.partitions))
            finally:
                group.send_signal(signal.SIGINT)
                group.wait(60)
        nodes = {}
        for f in sorted(probes.glob("*.json")):
            probe = json.loads(f.read_text())
            argv = probe["argv"]
            nodes[argv[argv.index("--name") + 1] if "--name" in argv else f.stem] = probe
    if len(nodes) != 3:
        raise SystemExit(f"expected 3 nodes' probes, found {len(nodes)}")
    report(sent, nodes)


if __name__ == "__main__":
    main()
