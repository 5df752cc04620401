"""The producers and consumers of one drill run, and what they saw."""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import client
from broker.tools.checker import Delivery
from broker.tools.drill.groups import empty_everywhere
from broker.tools.drill.model import QUEUE, DrillConfig
from client.clock import Clock
from client.durable import ConnectionEvent, DurableConnection
from client.errors import ConfirmedMessagesLost, StaleDeliveryError

log = logging.getLogger("tandem.drill")


class Load:
    """The producers and consumers of one run."""

    def __init__(self, cl: Any, cfg: DrillConfig, run: int, rng: random.Random, clock: Clock,
                 queue: str = QUEUE) -> None:
        self.cl, self.cfg, self.run_no, self.rng, self.clock = cl, cfg, run, rng, clock
        self.queue = queue
        self.sent: list[bytes] = []
        self.confirmed: list[bytes] = []
        self.consumed: list[tuple[bytes, str]] = []
        #: every delivery as received: the consumer, the partition, the broker's redelivered flag
        self.received: list[Delivery] = []
        #: sent body -> (producer, its place in that producer's send order)
        self.origin: dict[bytes, tuple[str, int]] = {}
        self.waits: list[float] = []
        self.confirm_times: list[tuple[float, int]] = []  # (when, partition) of every confirm
        self.fault_at: float | None = None  # when the fault was injected
        self.settled_at: float | None = None  # when the group served again (or the fault ended)
        self.after: dict[int, str] = {}  # partition -> who served it once the fault was over
        self.failed = 0
        self.reported_lost = 0
        self.where: dict[bytes, tuple[str, int, int]] = {}  # confirmed body -> (producer id, partition, seq)
        self.lost_ranges: list[tuple[str, int, int, int]] = []  # (producer id, partition, first seq, count)
        self.third = asyncio.Event()
        self.conns: list[DurableConnection] = []
        self._stop_consumers = asyncio.Event()

    def _event(self, ev: ConnectionEvent) -> None:
        err = ev.error
        if ev.kind == "messages_lost" and isinstance(err, ConfirmedMessagesLost):
            self.reported_lost += err.count
            self.lost_ranges.append((err.producer_id, err.partition, err.first_seq, err.count))

    def reported(self, body: bytes) -> bool:
        """Whether a ``messages_lost`` report covers the confirmed message ``body``."""
        pid, part, seq = self.where.get(body, ("", -1, -1))
        return any(pid == rp and part == rpart and first <= seq < first + count
                   for rp, rpart, first, count in self.lost_ranges)

    def unreported(self, lost: set[bytes]) -> int:
        """How many of ``lost`` no reported range covers."""
        return sum(1 for body in lost if not self.reported(body))

    def waits_during(self, start: float, end: float) -> list[float]:
        """The confirm waits of the sends made between ``start`` and ``end`` (clock times).
        Waits and confirm times pair up only while no send failed (callers check ``failed``)."""
        return [w for w, (t, _p) in zip(self.waits, self.confirm_times) if start <= t - w <= end]

    def mark_fault(self) -> None:
        self.fault_at = self.clock.monotonic()

    def mark_settled(self) -> None:
        if self.settled_at is None:
            self.settled_at = self.clock.monotonic()

    def takeover(self, partitions: set[int]) -> float | None:
        """Seconds from the fault to the first confirm on the new active (:func:`takeover_time`)."""
        if self.fault_at is None:
            return None
        return takeover_time(self.confirm_times, self.fault_at, self.settled_at, partitions)

    async def _connect(self, name: str) -> DurableConnection:
        conn = await client.connect(self.cl.url, client_name=name, send_timeout=self.cfg.timeout)
        conn.on_event(self._event)
        self.conns.append(conn)
        return conn

    async def produce(self, index: int, count: int | None, *, rate: float | None = None,
                      until: float | None = None, stop: asyncio.Event | None = None) -> None:
        """``count`` messages, or (None) until ``until`` on the clock or ``stop`` is set; at most
        ``rate`` a second if given (never more than the window in flight)."""
        conn = await self._connect(f"drill-producer-{index}")
        p = conn.producer(self.queue, max_in_flight=8)
        cfg, clock = self.cfg, self.clock
        sem = asyncio.Semaphore(cfg.window)
        rng = random.Random(self.rng.random())
        pending: set[asyncio.Future[Any]] = set()

        def done(body: bytes, t0: float, fut: asyncio.Future[Any]) -> None:
            sem.release()
            pending.discard(fut)
            self.waits.append(clock.monotonic() - t0)
            if fut.cancelled() or fut.exception() is not None:
                self.failed += 1
                return
            r = fut.result()
            self.confirm_times.append((clock.monotonic(), r.partition))
            self.where[body] = (p.producer_id, r.partition, r.seq)
            self.confirmed.append(body)
            if len(self.confirmed) >= cfg.messages // 3:
                self.third.set()

        start = clock.monotonic()
        i = 0
        while count is None or i < count:
            if rate:
                await clock.sleep(max(0.0, start + i / rate - clock.monotonic()))  # pacing: not a wait for a state
            if (until is not None and clock.monotonic() >= until) or (stop is not None and stop.is_set()):
                break
            await sem.acquire()
            body = f"{self.run_no}:{index}:{i}".encode()
            self.sent.append(body)
            self.origin[body] = (f"p{index}", i)
            i += 1
            fut = p.send_nowait(body, key=f"k{rng.randrange(cfg.keys)}")
            pending.add(fut)
            fut.add_done_callback(functools.partial(done, body, clock.monotonic()))
        while pending:
            await asyncio.wait(set(pending))
        await p.close()

    def consumers(self) -> list[Coroutine[Any, Any, None]]:
        """The run's consumers (``cfg.consumers`` of them)."""
        return [self.consume(i) for i in range(self.cfg.consumers)]

    def queues(self) -> tuple[str, ...]:
        """The queues the run fills: drained when they hold nothing."""
        return (self.queue,)

    async def consume(self, index: int, queue: str | None = None) -> None:
        """Consumer ``index`` of the drill queue (or ``queue``), acking what it gets."""
        conn = await self._connect(f"drill-consumer-{index}")
        c = await conn.consumer(queue or self.queue, prefetch=128).start()
        try:
            while not self._stop_consumers.is_set():
                m = await c.next(0.2)
                if m is None:
                    continue
                self.consumed.append((m.body, m.id))
                self.got(index, m)
                if self.cfg.consume_pause:
                    await self.clock.sleep(self.cfg.consume_pause)  # (a slow consumer: a backlog builds)
                try:
                    m.ack()
                except StaleDeliveryError:
                    pass  # its link failed: it comes again, redelivered
        finally:
            await c.close()

    def got(self, index: int, m: Any) -> None:
        """What a consumer received, besides its body and id (``consumed``), for the checker."""
        self.received.append(Delivery(m.body, index, m.partition, m.redelivered))

    async def go(self, fault: Callable[[], Awaitable[None]], deadline: float) -> None:
        """Consumers and producers; ``fault`` once a third is confirmed; then until drained.  With
        ``steady_rate`` the producers send at that rate until the fault is over instead of
        ``messages`` in all (then ``messages`` / 3 confirmed starts the fault)."""
        cfg = self.cfg
        consumers = [asyncio.ensure_future(c) for c in self.consumers()]
        share = [cfg.messages // cfg.producers + (1 if i < cfg.messages % cfg.producers else 0)
                 for i in range(cfg.producers)]
        over = asyncio.Event()
        if cfg.steady_rate:  # (a fault that takes a while: the load goes on at that rate until it is over)
            work = [self.produce(i, None, rate=cfg.steady_rate / cfg.producers, stop=over) for i in range(cfg.producers)]
        else:
            work = [self.produce(i, n) for i, n in enumerate(share)]
        producers: asyncio.Future[Any] = asyncio.ensure_future(asyncio.gather(*work))
        third: asyncio.Future[Any] = asyncio.ensure_future(self.third.wait())
        try:
            await asyncio.wait([third, producers], return_when=asyncio.FIRST_COMPLETED)
            third.cancel()
            try:
                await fault()
            finally:
                over.set()
            async with asyncio.timeout(max(1.0, deadline - self.clock.monotonic())):
                await producers
            await self.drained(deadline)
        finally:
            # (on every way out, a run stopped or failed included: no client left running,
            # none of their errors left unread)
            for t in (third, producers, *consumers):
                t.cancel()
            await self.close()
            await asyncio.gather(producers, *consumers, return_exceptions=True)

    async def drained(self, deadline: float) -> None:
        """Until every confirmed message was consumed, but those the SDK reported lost (a weak
        policy's loss: they will not come), and the queue holds nothing."""
        async with await client.connect(self.cl.url, client_name="drill-check") as conn:
            while self.clock.monotonic() < deadline:
                seen = {b for b, _ in self.consumed}
                want = {b for b in self.confirmed if b not in seen and not self.reported(b)}
                if not want:
                    infos = await conn.list_queues()
                    total = sum(q.ready + q.unacked for q in infos if q.name in self.queues())
                    if total == 0 and all([await empty_everywhere(self.cl, q) for q in self.queues()]):
                        return
                await self.clock.sleep(0.1)  # polling consumers and nodes, bounded by the deadline
        log.warning("drill run %d: drain deadline passed", self.run_no)

    async def close(self) -> None:
        self._stop_consumers.set()
        await asyncio.gather(*(c.close() for c in self.conns), return_exceptions=True)


def takeover_time(confirms: list[tuple[float, int]], fault_at: float, settled_at: float | None,
                  partitions: set[int]) -> float | None:
    """From the fault to the first confirm on the new active, out of the confirms' times
    ``(when, partition)``: per partition of ``partitions`` (the target's), the end of the
    longest pause in its confirms after the fault, looking no further than its first confirm
    once the group served again (``settled_at``: a later pause, a failback say, is not this
    fault's); the worst partition.  Confirms the old active sent just before it died arrive
    right after the fault and end no pause.  None: no partition had a confirm after the fault."""
    worst: float | None = None
    for part in partitions:
        times = sorted(t for t, q in confirms if q == part and t > fault_at)
        prev, best = fault_at, None
        for t in times:
            if best is None or t - prev > best[0]:
                best = (t - prev, t)
            prev = t
            if settled_at is not None and t >= settled_at:
                break
        if best is not None:
            worst = max(worst or 0.0, best[1] - fault_at)
    return worst
