"""How long a drain takes when the partition it moves holds a large backlog, and what a producer sees.

    .venv/bin/python scripts/drain_backlog.py [--size 1G] [--body 64K] [--runs 1]

Each run starts a fresh three-node group (``LocalCluster``, as ``tandem cluster up``, default
settings, in a temp dir), fills a one-partition queue with ``--size`` of messages (confirmed),
waits until both replicas have all of it, then drains the partition's active with
``tandem node drain NODE --wait --json`` while a durable producer sends one message every
10 ms.  It reports the drain's time, the longest confirm wait of a send made during it, how
long the new active took to deliver the first message of the backlog to a consumer, and the
same for the undrain (failback).  The figures are for docs/operations.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

import client
from broker.config import parse_size
from broker.tools.cluster import LocalCluster
from client.clock import SYSTEM_CLOCK

QUEUE = "backlog"
clock = SYSTEM_CLOCK


async def cli(*args: str) -> dict:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "broker.cli", *args,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    if proc.returncode:
        raise SystemExit(f"tandem {' '.join(args)}: {err.decode().strip()}")
    return json.loads(out) if out.strip().startswith(b"{") else {}


class Prober:
    """One send every 10 ms on a durable connection, each confirm's wait recorded with its send time."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.waits: list[tuple[float, float]] = []  # (sent at, wait)
        self.failed = 0
        self._stop = asyncio.Event()

    async def run(self) -> None:
        async with await client.connect(self.url, client_name="drain-prober") as conn:
            p = conn.producer(QUEUE)
            pending: set[asyncio.Task[None]] = set()
            i = 0
            while not self._stop.is_set():
                t0 = clock.monotonic()

                async def one(t0: float = t0, i: int = i) -> None:
                    try:
                        await p.send(f"probe-{i}".encode())
                        self.waits.append((t0, clock.monotonic() - t0))
                    except Exception:
                        self.failed += 1

                task = asyncio.ensure_future(one())
                pending.add(task)
                task.add_done_callback(pending.discard)
                i += 1
                await clock.sleep(0.01)  # pacing: the probe's rate, not a wait for a state
            if pending:
                await asyncio.wait(pending)

    def stop(self) -> None:
        self._stop.set()

    def longest(self, start: float, end: float) -> float:
        return max((w for t, w in self.waits if start <= t <= end), default=0.0)


async def caught_up(cl: LocalCluster, active: str) -> bool:
    st = await cl.status(active)
    part = next(p for p in st.partitions if p.queue == QUEUE and p.role == "active")
    return bool(part.replicas) and all(r.lag == 0 for r in part.replicas)


async def wait_for(pred, what: str, timeout: float = 600) -> None:  # type: ignore[no-untyped-def]
    deadline = clock.monotonic() + timeout
    while not await pred():
        if clock.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        await clock.sleep(0.05)  # polling the nodes' status, bounded by the deadline


async def first_delivery(url: str) -> float:
    """Seconds from subscribing until the first message arrives (it is not acked: it stays)."""
    async with await client.connect(url, client_name="drain-consumer") as conn:
        t0 = clock.monotonic()
        c = await conn.consumer(QUEUE, prefetch=1).start()
        while (m := await c.next(0.5)) is None:
            pass
        took = clock.monotonic() - t0
        m.nack()
        await c.close()
        return took


async def fill(cl: LocalCluster, size: int, body: int) -> tuple[int, float, str]:
    """A one-partition queue filled with ``size`` bytes of ``body``-byte messages (confirmed),
    its replicas caught up: (bytes sent, seconds the fill took, the partition's active)."""
    async with await client.connect(cl.url) as conn:
        await conn.declare_queue(QUEUE, partitions=1)
        p = conn.producer(QUEUE)
        payload = b"x" * body
        t0 = clock.monotonic()
        sent = 0
        while sent < size:
            await p.send_many([payload] * 256)
            sent += 256 * body
        took = clock.monotonic() - t0
    active = (await cl.actives(QUEUE, 1))[0]
    await wait_for(lambda: caught_up(cl, active), "the replicas to have the backlog")
    return sent, took, active


async def one_run(size: int, body: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="tandem-drain-backlog-") as tmp:
        cl = LocalCluster(Path(tmp), nodes=3, base_port=0)
        await cl.start()
        try:
            await cl.wait_ready()
            sent, took, active = await fill(cl, size, body)
            other = next(n for n in cl.nodes if n != active)
            prober = Prober(cl.url)
            probing = asyncio.ensure_future(prober.run())
            await clock.sleep(1.0)  # the probe's steady state before the drain (a baseline, not a wait for a state)
            d0 = clock.monotonic()
            drained = await cli("node", "drain", active, "--wait", "--timeout", "300", "--json", "--url",
                                cl.url_of(other))
            d1 = clock.monotonic()
            moved_to = (await cl.actives(QUEUE, 1))[0]
            deliver_after_drain = await first_delivery(cl.url_of(moved_to))
            await cli("node", "undrain", active, "--url", cl.url_of(other))
            u0 = clock.monotonic()

            async def back() -> bool:
                return (await cl.actives(QUEUE, 1)).get(0) == active

            await wait_for(back, "failback to the undrained node")
            u1 = clock.monotonic()
            await clock.sleep(1.0)  # the probe after the failback (a tail, not a wait for a state)
            prober.stop()
            await probing
            deliver_after_failback = await first_delivery(cl.url_of(active))
            return {"backlog_bytes": sent, "fill_seconds": round(took, 1), "drained": active, "to": moved_to,
                    "drain_seconds": drained["seconds"], "drain_wall_seconds": round(d1 - d0, 2),
                    "longest_confirm_wait_during_drain_ms": round(prober.longest(d0, d1) * 1000),
                    "first_delivery_after_drain_s": round(deliver_after_drain, 2),
                    "failback_seconds": round(u1 - u0, 2),
                    "longest_confirm_wait_during_failback_ms": round(prober.longest(u0, u1) * 1000),
                    "first_delivery_after_failback_s": round(deliver_after_failback, 2),
                    "probe_sends": len(prober.waits) + prober.failed, "probe_failed": prober.failed}
        finally:
            await cl.stop()


def keep_logs(tmp: str, keep: str | None) -> None:
    """Copy a run's node logs from ``tmp`` to ``keep`` (--logs), if given."""
    if keep:
        for log in Path(tmp).glob("*.log"):
            (Path(keep) / log.name).write_bytes(log.read_bytes())


def backlog_args(doc: str, size_help: str = "backlog in the partition (default 1G)",
                 logs: bool = True) -> argparse.ArgumentParser:
    """The options the backlog scripts share: --size, --body, --runs (and --logs)."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--size", default="1G", help=size_help)
    ap.add_argument("--body", default="64K", help="message size (default 64K)")
    ap.add_argument("--runs", type=int, default=1)
    if logs:
        ap.add_argument("--logs", metavar="DIR", help="copy each run's node logs to DIR")
    return ap


async def main() -> None:
    args = backlog_args(__doc__, logs=False).parse_args()
    for i in range(args.runs):
        print(json.dumps({"run": i + 1, **await one_run(parse_size(args.size), parse_size(args.body))}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
