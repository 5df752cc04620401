"""The benchmark workload, its result, the exactly-once checker, and the driver interface.

Every system (Tandem, RabbitMQ, NATS JetStream) is driven through a
:class:`Driver` by the same harness (:mod:`broker.tools.bench.harness`), so they pay
the same client-side costs.  A message body is its 8-byte big-endian id
followed by padding up to ``size``; the checker reads the id back.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from client.clock import SYSTEM_CLOCK, Clock


@dataclass(frozen=True, kw_only=True, slots=True)
class Workload:
    messages: int = 100_000
    size: int = 1024
    producers: int = 1
    consumers: int = 1
    partitions: int = 4
    window: int = 1000  # unconfirmed publishes in flight per producer
    prefetch: int = 1000  # unacked deliveries in flight per consumer
    latency_rate: float = 2000.0  # msg/s of the paced latency phase (0: skip it)
    latency_messages: int = 10_000
    timeout: float = 300.0  # seconds a phase may take before it is declared failed
    sequential: bool = False  # throughput phase: publish everything, then consume (each measured alone)


def body_for(msg_id: int, size: int) -> bytes:
    head = msg_id.to_bytes(8, "big")
    return head + b"x" * max(0, size - 8)


def id_of(body: bytes) -> int:
    return int.from_bytes(body[:8], "big")


class Checker:
    """Counts what was consumed against what was confirmed.

    ``lost``: confirmed, never consumed.  ``duplicated``: consumed more than
    once.  ``unexpected``: consumed but never sent in this run.
    """

    def __init__(self, expected: int, *, base: int = 0) -> None:
        self.expected = expected
        self.base = base
        self.seen = bytearray(expected)
        self.received = 0
        self.unique = 0
        self.duplicated = 0
        self.unexpected = 0
        self.done = asyncio.Event()

    def record(self, body: bytes) -> None:
        i = id_of(body) - self.base
        self.received += 1
        if not 0 <= i < self.expected:
            self.unexpected += 1
            return
        if self.seen[i]:
            self.duplicated += 1
            return
        self.seen[i] = 1
        self.unique += 1
        if self.unique == self.expected:
            self.done.set()

    def lost(self, confirmed_ids: int) -> int:
        return max(0, confirmed_ids - self.unique)


def percentile(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    k = min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))
    return s[k]


@dataclass(slots=True)
class RunResult:
    system: str
    messages: int
    #: how the system ran, for Tandem the group's setup ("replicated, 3 nodes", "shared, 2
    #: nodes, postgresql", "single node"); "" for a peer (its durability line says it)
    mode: str = ""
    publish_per_s: float = 0.0
    consume_per_s: float = 0.0
    confirm_ms: dict[str, float] = field(default_factory=dict)  # paced latency phase
    confirm_ms_saturated: dict[str, float] = field(default_factory=dict)  # throughput phase
    confirmed: int = 0
    consumed: int = 0
    lost: int = 0
    duplicated: int = 0
    unexpected: int = 0
    seconds: float = 0.0
    durability: str = ""
    error: str | None = None
    #: CPU time per message of the throughput phase, in microseconds (user + system): of the
    #: benchmark process ("client": every producer and consumer, all systems alike) and, when
    #: the bench started the nodes itself (``--spawn``), of the node processes ("servers")
    cpu_us_per_msg: dict[str, float] = field(default_factory=dict)
    #: the servers' CPU time (user + system, summed over the system's server processes) per
    #: message published and consumed, in microseconds, per phase ("throughput", "latency");
    #: ``None`` when the processes are not on this machine or not found (``server_cpu`` says why)
    server_cpu_us_per_msg: dict[str, float] | None = None
    #: which processes were counted ("processes"), or why none ("reason")
    server_cpu: dict[str, str | None] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Publisher:
    """Shared publish loop: keeps ``window`` confirms in flight, optionally paced.

    ``submit(body)`` must start one publish and return an awaitable
    that completes when the system confirms it.  Latencies (seconds) of every
    confirm are appended to ``latencies``.
    """

    def __init__(self, submit: Callable[[bytes], Awaitable[Any]], *, window: int,
                 close: Callable[[], Awaitable[None]] | None = None, clock: Clock = SYSTEM_CLOCK) -> None:
        self.submit = submit
        self._close = close
        self.window = window
        self.clock = clock
        self.latencies: list[float] = []
        self.confirmed = 0
        self.failed = 0
        self.first_error: BaseException | None = None

    async def close(self) -> None:
        """Release what the driver opened for this publisher (its connection)."""
        if self._close is not None:
            await self._close()

    async def run(self, ids: range, size: int, rate: float = 0.0) -> None:
        sem = asyncio.Semaphore(self.window)
        clock = self.clock
        lat = self.latencies
        start = clock.monotonic()
        pending: set[asyncio.Future[Any]] = set()

        def on_done(fut: asyncio.Future[Any], *, t0: float) -> None:
            sem.release()
            pending.discard(fut)
            if fut.cancelled() or fut.exception() is not None:
                self.failed += 1
                if self.first_error is None and not fut.cancelled():
                    self.first_error = fut.exception()
                return
            self.confirmed += 1
            lat.append(clock.monotonic() - t0)

        for n, i in enumerate(ids):
            if rate > 0:
                due = start + n / rate
                now = clock.monotonic()
                if due > now:
                    await clock.sleep(due - now)
            await sem.acquire()
            t0 = clock.monotonic()
            fut = asyncio.ensure_future(self.submit(body_for(i, size)))
            pending.add(fut)
            fut.add_done_callback(functools.partial(on_done, t0=t0))
        if pending:
            await asyncio.gather(*list(pending), return_exceptions=True)


class Driver(Protocol):
    """One system under test.  ``setup`` makes a fresh, empty queue for the run."""

    name: str
    durability: str

    async def setup(self, w: Workload) -> None: ...

    async def publisher(self, w: Workload) -> Publisher:
        """A Publisher on its own connection/channel, ready to run."""

    async def consume(self, w: Workload, checker: Checker) -> None:
        """Consume and ack (manual acks, prefetch ``w.prefetch``), feeding ``checker.record(body)``,
        until ``checker.done`` is set or the task is cancelled."""

    async def teardown(self) -> None: ...
