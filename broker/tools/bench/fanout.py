"""``tandem bench --fanout 1,10,100`` and ``--topic-bindings N``: publishing to exchanges.

For each fan-out, a fanout exchange bound to that many queues (one partition each, placed by the
group's policy) gets ``--messages`` messages with ``--window`` unconfirmed at
a time (the durable connection's exchange producers, one batch of 256 in flight each); the
figure is messages confirmed per second and queue copies stored per second (messages
times queues), and every queue must then hold every message (checked).  ``--plain-producer``: one
plain link's pipelined exchange producer instead (up to 64 batches in flight); a publish may
fail, and every queue must hold every confirmed message.  ``--topic-bindings N``:
a topic exchange with N patterns (``k<i>.*``) bound over 10 queues, each message's routing key
matching one of them at random.  With ``--peer rabbitmq`` the same runs go to RabbitMQ's fanout
and topic exchanges with durable quorum queues, persistent messages and publisher confirms, in
the same run.
"""

from __future__ import annotations

import asyncio
import json
import random
import tempfile
import time
import uuid
from collections.abc import Coroutine
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import client
from broker.tools.bench.harness import spawn_target
from broker.tools.totals import queue_totals
from client.connection import connect_link
from client.errors import InvalidArgumentError, UnavailableError

TOPIC_QUEUES = 10


@dataclass
class ExchangeRun:
    system: str
    kind: str  # "fanout" or "topic"
    queues: int
    bindings: int
    messages: int
    seconds: float
    messages_per_s: float
    copies_per_s: float
    stored: int  # copies found in the queues afterwards
    error: str | None = None
    confirmed: int = 0  # messages confirmed (the rest failed: --plain-producer)


def add_fanout_args(p: Any) -> None:
    p.add_argument("--fanout", default=None, metavar="N,N,...",
                   help="publish to a fanout exchange bound to each of these numbers of queues (e.g. 1,10,100): "
                        "messages and queue copies stored per second; --messages messages each")
    p.add_argument("--topic-bindings", dest="topic_bindings", type=int, default=0, metavar="N",
                   help="with --fanout (or alone): also a topic exchange with N patterns over 10 queues")
    p.add_argument("--plain-producer", dest="plain_producer", action="store_true",
                   help="with --fanout: publish through one plain link's pipelined exchange producer (many "
                        "batches in flight) instead of the durable connection's producers; a publish may then "
                        "fail, and every confirmed copy must be stored")


def _counts(text: str | None) -> list[int]:
    if not text:
        return []
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InvalidArgumentError(f"--fanout {text!r}: numbers of queues, comma-separated (1,10,100)") from None
    if not out or any(not 1 <= n <= 1000 for n in out):
        raise InvalidArgumentError(f"--fanout {text!r}: each between 1 and 1000 queues")
    return out


def fanout_command(args: Any) -> Coroutine[Any, Any, int]:
    fans = _counts(args.fanout)
    if not 0 <= args.topic_bindings <= 100_000:
        raise InvalidArgumentError("--topic-bindings: 0 .. 100000")
    if not args.spawn:
        raise InvalidArgumentError("--fanout starts its own node or group: give --spawn (with --nodes N)")
    if set(args.peer) - {"rabbitmq"}:
        raise InvalidArgumentError("--fanout compares with --peer rabbitmq only (NATS has no exchanges)")
    return _main(args, fans)


async def _main(args: Any, fans: list[int]) -> int:
    runs: list[ExchangeRun] = []
    with tempfile.TemporaryDirectory(prefix="tandem-fanout-") as tmp:
        url, stop = await spawn_target(Path(tmp), args.nodes, args.sync)
        try:
            for n in fans:
                runs.append(await tandem_run(url, "fanout", n, n, args.messages, args.size, args.window,
                                             plain=args.plain_producer))
            if args.topic_bindings:
                runs.append(await tandem_run(url, "topic", TOPIC_QUEUES, args.topic_bindings, args.messages,
                                             args.size, args.window, plain=args.plain_producer))
        finally:
            await stop()
    if "rabbitmq" in args.peer:
        for n in fans:
            runs.append(await rabbit_run(args.rabbitmq_url, "fanout", n, n, args.messages, args.size, args.window))
        if args.topic_bindings:
            runs.append(await rabbit_run(args.rabbitmq_url, "topic", TOPIC_QUEUES, args.topic_bindings,
                                         args.messages, args.size, args.window))
    report = {"nodes": args.nodes, "messages": args.messages, "size": args.size, "window": args.window,
              "runs": [asdict(r) for r in runs]}
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{'system':<10} {'exchange':<8} {'queues':>6} {'bindings':>8} {'msg/s':>10} {'copies/s':>10} "
              f"{'stored':>9}")
        for r in runs:
            print(f"{r.system:<10} {r.kind:<8} {r.queues:>6} {r.bindings:>8} {r.messages_per_s:>10,.0f} "
                  f"{r.copies_per_s:>10,.0f} {r.stored:>9}" + (f"  error: {r.error}" if r.error else ""))
    return 1 if any(r.error for r in runs) else 0


def _topic_key(rng: random.Random, bindings: int) -> str:
    return f"k{rng.randrange(bindings)}.x"


#: how long the count of the queues afterwards waits for every member to answer
TOTALS_WAIT = 60.0


async def tandem_run(url: str, kind: str, queues: int, bindings: int, messages: int, size: int,
                     window: int, *, plain: bool = False) -> ExchangeRun:
    tag = uuid.uuid4().hex[:8]
    names = [f"bench-{tag}-{i}" for i in range(queues)]
    ex = f"bench-{tag}"
    body = b"x" * size
    rng = random.Random(7)
    async with await client.connect(url, client_name="tandem-bench-fanout") as conn:
        await conn.declare_exchange(ex, kind)
        for q in names:
            await conn.declare_queue(q)
        for i in range(bindings):
            await conn.bind_queue(names[i % queues], ex, f"k{i}.*" if kind == "topic" else "")
    keys = [_topic_key(rng, bindings) if kind == "topic" else "" for _ in range(messages)]
    if plain:
        # one plain link's pipelined producer: many batches in flight, any of them may fail
        link = await connect_link(url, client_name="tandem-bench-fanout")
        try:
            producer = link.exchange_producer(ex)
            start = time.perf_counter()
            sent = await asyncio.gather(*[producer.send(body, routing_key=k) for k in keys], return_exceptions=True)
        finally:
            await link.close()
        seconds = time.perf_counter() - start
        confirmed = sum(1 for r in sent if not isinstance(r, BaseException))
    else:
        # the durable connection's exchange producers, each with one batch in flight (the safe
        # way: client.durable.exchange), as many as --window fills with batches of 256
        async with await client.connect(url, client_name="tandem-bench-fanout") as conn:
            producers = [conn.exchange_producer(ex) for _ in range(max(1, window // 256))]
            start = time.perf_counter()
            await asyncio.gather(*[producers[i % len(producers)].send(body, routing_key=k)
                                   for i, k in enumerate(keys)])
            seconds = time.perf_counter() - start
        confirmed = messages
    deadline = time.monotonic() + TOTALS_WAIT
    while True:  # (every member's partitions; a member busy catching up may not answer at once)
        totals = await queue_totals(url, client_name="tandem-bench-fanout")
        if not totals.missing:
            break
        if time.monotonic() > deadline:
            raise UnavailableError(f"members did not answer for {TOTALS_WAIT:g} s: {', '.join(sorted(totals.missing))}")
        await asyncio.sleep(1.0)
    stored = sum(q.ready for q in totals.queues if q.name in set(names))
    async with await client.connect(url, client_name="tandem-bench-fanout") as conn:
        for q in names:
            await conn.delete_queue(q)
        await conn.delete_exchange(ex)
    copies = queues if kind == "fanout" else 1
    want, most = confirmed * copies, messages * copies
    error = None if want <= stored <= most else (
        f"{stored} copies stored, {want} confirmed" if stored < want else f"{stored} copies stored, {most} sent")
    if error is None and confirmed < messages:
        error = f"{messages - confirmed} of {messages} publishes failed"
    return ExchangeRun("tandem", kind, queues, bindings, messages, round(seconds, 3), round(confirmed / seconds),
                       round(want / seconds), stored, error, confirmed)


async def rabbit_run(url: str, kind: str, queues: int, bindings: int, messages: int, size: int,
                     window: int) -> ExchangeRun:
    import aio_pika  # (the optional "bench" extra, as the peers' drivers: only --peer rabbitmq needs it)

    tag = uuid.uuid4().hex[:8]
    names = [f"bench-{tag}-{i}" for i in range(queues)]
    rng = random.Random(7)
    conn = await aio_pika.connect(url)
    try:
        ch = await conn.channel(publisher_confirms=True)
        ex = await ch.declare_exchange(f"bench-{tag}", kind, durable=True)
        qs = [await ch.declare_queue(n, durable=True, arguments={"x-queue-type": "quorum"}) for n in names]
        for i in range(bindings):
            await qs[i % queues].bind(ex, f"k{i}.*" if kind == "topic" else "")
        start = time.perf_counter()
        pending: set[asyncio.Future[Any]] = set()
        for _ in range(messages):
            msg = aio_pika.Message(b"x" * size, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
            pending.add(asyncio.ensure_future(ex.publish(
                msg, routing_key=_topic_key(rng, bindings) if kind == "topic" else "")))
            if len(pending) >= window:
                _done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        await asyncio.gather(*pending)
        seconds = time.perf_counter() - start
        stored = 0
        for n in names:
            q = await ch.declare_queue(n, passive=True)
            stored += q.declaration_result.message_count or 0
        for q in qs:
            await q.delete(if_unused=False, if_empty=False)
        await ex.delete()
    finally:
        await conn.close()
    want = messages * (queues if kind == "fanout" else 1)
    return ExchangeRun("rabbitmq", kind, queues, bindings, messages, round(seconds, 3), round(messages / seconds),
                       round(want / seconds), stored,
                       None if stored == want else f"{stored} copies stored, {want} expected")
