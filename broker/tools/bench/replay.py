"""``tandem bench --stream-replay BYTES``: a stream of BYTES published, then read from its first
offset to its end, twice, by one reader per partition: the replay rate, and that each read saw
every message once.

On a spawned node (or group), publishes BYTES of ``--size``-byte messages to a stream, then reads
every partition from ``first`` to the end with ``Read`` requests (10,000 messages at most each,
as many as fit a frame), all partitions at once, one reader each; then does it again.  Each read
must see every confirmed message once (the bodies carry their id), in offset order.  With
``--peer rabbitmq``, the same bytes go to a RabbitMQ stream queue (``x-queue-type: stream``) on
the same machine and are read from ``x-stream-offset: first`` with one consumer (prefetch
``--prefetch``), also twice.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from collections.abc import Coroutine
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import client
from broker.tools.bench.backlog import publish_ids
from broker.tools.bench.harness import spawn_target
from client.clock import SYSTEM_CLOCK
from client.errors import InvalidArgumentError, TandemError

#: messages one read asks for
READ_BATCH = 10_000
#: seconds the replay waits for every confirmed message to be readable
READABLE_WAIT = 30.0
STREAM = "replay"


@dataclass
class ReplayPass:
    messages: int = 0
    bytes: int = 0
    seconds: float = 0.0
    duplicated: int = 0
    missing: int = 0
    unexpected: int = 0
    out_of_order: int = 0

    @property
    def mb_per_s(self) -> float:
        return round(self.bytes / 1e6 / self.seconds, 1) if self.seconds else 0.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "mb_per_s": self.mb_per_s,
                "messages_per_s": round(self.messages / self.seconds) if self.seconds else 0}


@dataclass
class ReplayResult:
    system: str
    nodes: int
    partitions: int
    size: int
    messages: int
    confirmed: int = 0
    publish_mb_per_s: float = 0.0
    passes: list[ReplayPass] = field(default_factory=list)
    error: str | None = None

    @property
    def passed(self) -> bool:
        return self.error is None and len(self.passes) == 2 and all(
            p.messages == self.confirmed and not (p.duplicated or p.missing or p.unexpected or p.out_of_order)
            for p in self.passes)

    def to_json(self) -> dict[str, Any]:
        return {**{k: v for k, v in asdict(self).items() if k != "passes"},
                "passes": [p.to_json() for p in self.passes], "passed": self.passed}


def _tally(seen: bytearray, bodies: list[bytes], out: ReplayPass) -> None:
    for body in bodies:
        i = int.from_bytes(body[:8], "big")
        if i >= len(seen):
            out.unexpected += 1  # (an id this run never sent)
            continue
        if seen[i]:
            out.duplicated += 1
        seen[i] = 1
        out.messages += 1
        out.bytes += len(body)


async def _read_partition(conn: client.DurableConnection, partition: int, seen: bytearray, out: ReplayPass) -> None:
    msgs, nxt, end = await conn.read(STREAM, partition, "first", READ_BATCH)
    last = -1
    while True:
        for m in msgs:
            if m.offset <= last:
                out.out_of_order += 1
            last = m.offset
        _tally(seen, [m.body for m in msgs], out)
        if nxt >= end:
            return
        msgs, nxt, end = await conn.read(STREAM, partition, nxt, READ_BATCH)


async def _tandem_pass(url: str, partitions: int, count: int) -> ReplayPass:
    out = ReplayPass()
    seen = bytearray(count)
    async with await client.connect(url, client_name="tandem-bench-replay") as conn:
        t0 = time.perf_counter()
        await asyncio.gather(*(_read_partition(conn, p, seen, out) for p in range(partitions)))
        out.seconds = round(time.perf_counter() - t0, 3)
    out.missing = count - sum(seen)
    return out


async def _readable(url: str, partitions: int, confirmed: int) -> None:
    """Until the partitions' ends add up to what was confirmed: a store writes what its log
    committed a moment later (up to 0.2 s, docs/messaging.md), and the replay starts after."""
    deadline = SYSTEM_CLOCK.monotonic() + READABLE_WAIT
    async with await client.connect(url, client_name="tandem-bench-replay") as conn:
        while sum([(await conn.read(STREAM, p, "next", 1))[2] for p in range(partitions)]) < confirmed:
            if SYSTEM_CLOCK.monotonic() > deadline:
                raise TimeoutError(f"the stream's ends did not reach the {confirmed:,} confirmed messages in "
                                   f"{READABLE_WAIT:.0f} s")
            await SYSTEM_CLOCK.sleep(0.05)


async def run_tandem(total: int, *, size: int, nodes: int, partitions: int, producers: int, window: int,
                     sync: str) -> ReplayResult:
    count = total // size
    res = ReplayResult("tandem", nodes, partitions, size, count)
    with tempfile.TemporaryDirectory(prefix="tandem-replay-") as tmp:
        stop = None
        try:
            url, stop = await spawn_target(Path(tmp), nodes, sync)
            async with await client.connect(url, client_name="tandem-bench-replay") as conn:
                await conn.declare_stream(STREAM, partitions=partitions)
            res.confirmed, took = await publish_ids(url, STREAM, range(count), size, producers, window)
            res.publish_mb_per_s = round(res.confirmed * size / 1e6 / took, 1) if took else 0.0
            await _readable(url, partitions, res.confirmed)
            for _ in range(2):
                res.passes.append(await _tandem_pass(url, partitions, count))
        except (TandemError, OSError, TimeoutError) as exc:
            res.error = f"{type(exc).__name__}: {exc}"
        finally:
            if stop is not None:
                await stop()
    return res


async def run_rabbitmq(url: str, total: int, *, size: int, prefetch: int, window: int) -> ReplayResult:
    """The same bytes through a RabbitMQ stream queue, read twice from ``first``."""
    import uuid

    import aio_pika

    count = total // size
    res = ReplayResult("rabbitmq", 1, 1, size, count)
    name = f"tandem-bench-replay-{uuid.uuid4().hex[:8]}"
    conn = await aio_pika.connect(url)
    try:
        ch = await conn.channel(publisher_confirms=True)
        await ch.declare_queue(name, durable=True, arguments={"x-queue-type": "stream"})
        t0 = time.perf_counter()
        pending: set[asyncio.Future[Any]] = set()
        for i in range(count):
            body = i.to_bytes(8, "big") + b"x" * (size - 8)
            pending.add(asyncio.ensure_future(ch.default_exchange.publish(aio_pika.Message(body), routing_key=name)))
            if len(pending) >= window:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                res.confirmed += sum(1 for f in done if f.exception() is None)
        if pending:
            done, _ = await asyncio.wait(pending)
            res.confirmed += sum(1 for f in done if f.exception() is None)
        res.publish_mb_per_s = round(res.confirmed * size / 1e6 / (time.perf_counter() - t0), 1)
        for _ in range(2):
            out, seen = ReplayPass(), bytearray(count)
            rch = await conn.channel()
            await rch.set_qos(prefetch_count=prefetch)
            q = await rch.get_queue(name, ensure=False)
            done_event = asyncio.Event()
            batch: list[bytes] = []

            async def on_message(m: Any) -> None:
                batch.append(m.body)
                if len(batch) >= 1000 or out.messages + len(batch) >= res.confirmed:
                    _tally(seen, batch, out)
                    batch.clear()
                    await m.ack(multiple=True)
                    if out.messages >= res.confirmed:
                        done_event.set()

            t0 = time.perf_counter()
            tag = await q.consume(on_message, arguments={"x-stream-offset": "first"})
            await asyncio.wait_for(done_event.wait(), 600)
            out.seconds = round(time.perf_counter() - t0, 3)
            await q.cancel(tag)
            await rch.close()
            out.missing = count - sum(seen)
            res.passes.append(out)
        await ch.queue_delete(name)
    except Exception as exc:  # (a peer's own error: reported with the run, not raised)
        res.error = f"{type(exc).__name__}: {exc}"
    finally:
        await conn.close()
    return res


def print_replay(results: list[ReplayResult], *, as_json: bool) -> None:
    if as_json:
        print(json.dumps([r.to_json() for r in results], indent=2))
        return
    for r in results:
        print(f"{r.system}: {r.confirmed:,} of {r.messages:,} x {r.size} B confirmed "
              f"({r.confirmed * r.size / 1e6:,.0f} MB, {r.partitions} partition(s), {r.nodes} node(s)), "
              f"published at {r.publish_mb_per_s:,.1f} MB/s")
        for i, p in enumerate(r.passes, 1):
            print(f"  replay {i}: {p.messages:,} messages in {p.seconds:,.1f} s = {p.mb_per_s:,.1f} MB/s "
                  f"({p.to_json()['messages_per_s']:,} msg/s); missing {p.missing}, duplicated {p.duplicated}, "
                  f"unexpected {p.unexpected}, out of order {p.out_of_order}")
        if r.error:
            print(f"  ! {r.error}")


def add_replay_args(p: Any) -> None:
    g = p.add_argument_group("stream replay (--spawn --stream-replay BYTES)")
    g.add_argument("--stream-replay", dest="stream_replay", type=int, metavar="BYTES",
                   help="with --spawn: publish BYTES of --size-byte messages to a stream (default size 4096 here), "
                        "then read it from first to end twice, one reader per partition (--partitions, default 1), "
                        "reporting the replay rate and that each read saw every message once; --peer rabbitmq "
                        "does the same through a RabbitMQ stream queue")


def replay_command(args: Any) -> Coroutine[Any, Any, int]:
    if not args.spawn:
        raise InvalidArgumentError("--stream-replay needs --spawn (it starts the node(s) it measures)")
    size = args.size if args.size != 1024 else 4096
    if args.stream_replay < size or size < 8:
        raise InvalidArgumentError("--stream-replay: at least one message of --size bytes (>= 8)")
    if set(args.peer) - {"rabbitmq"}:
        raise InvalidArgumentError("--stream-replay compares with --peer rabbitmq only")

    async def run() -> int:
        results = [await run_tandem(args.stream_replay, size=size, nodes=args.nodes, partitions=args.partitions or 1,
                                    producers=max(1, args.producers), window=args.window, sync=args.sync)]
        if "rabbitmq" in args.peer:
            results.append(await run_rabbitmq(args.rabbitmq_url, args.stream_replay, size=size,
                                              prefetch=args.prefetch, window=args.window))
        print_replay(results, as_json=args.json)
        return 0 if all(r.passed for r in results) else 1

    return run()
