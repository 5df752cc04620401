"""``tandem bench --transactions``: what a transaction costs against plain confirmed publishes.

On a spawned node (or group, finalized at its build's feature level: a group takes transactions
from level 6), in the same run and on the same nodes:

* for each transaction size N of ``--tx-sizes``, first a round of the **baseline**:
  ``--tx-messages`` messages of ``--size`` bytes published with confirms by ``--tx-producers``
  producers, each on a connection of its own keeping ``--window`` publishes unconfirmed
  (messages/s; the median round is the baseline);
* then the same messages and producers, each producer one batch at a time: first in plain
  batches of N (``send_many``, awaited before the next: a transaction's shape without the
  transaction), then in transactions of N (``publish_many``, then ``commit``), each producer
  with a transactional id of its own: transactions/s, messages/s, commit latency, the nodes'
  CPU per message, and the rate as a fraction of the baseline's and of the plain batches'.

Messages are keyed (``k<id>``), so a transaction of many spreads over the queue's partitions as
a keyed batch does.  Each phase writes to a fresh queue, declared before anything is timed;
each producer's ``TxInit`` (once per producer and connection) is sent untimed too.  After each
phase the messages ready in its queue (summed over the members) must be the ones confirmed or
committed, else the run fails.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import client
from broker.config import NodeConfig
from broker.tools.bench.backlog import declare_served, publish_ids
from broker.tools.bench.delayed import cpu_seconds
from broker.tools.bench.workload import body_for, id_of, percentile
from broker.tools.cluster import LocalCluster
from broker.tools.process import NodeProcess
from broker.transactions.ids import COORDINATOR_QUEUE, coordinator_partition
from broker.tools.totals import queue_totals
from client.clock import SYSTEM_CLOCK
from client.errors import InvalidArgumentError, TandemError
from storage.base import DurabilityPolicy

#: a transaction's messages go in publishes of at most this many messages and bytes each
CHUNK_MESSAGES = 256
CHUNK_BYTES = 4 * 1024 * 1024
CLIENT_NAME = "tandem-bench-tx"

T = TypeVar("T")


@dataclass
class SizeResult:
    """One transaction size: plain batches of it, then transactions of it."""

    per_tx: int
    transactions: int = 0
    messages: int = 0
    seconds: float = 0.0
    tx_per_s: float = 0.0
    msg_per_s: float = 0.0
    commit_ms: dict[str, float] = field(default_factory=dict)
    transaction_ms: dict[str, float] = field(default_factory=dict)  # begin, publishes and commit
    #: the nodes' CPU (user + system, all nodes) per message committed, microseconds
    server_cpu_us_per_msg: float = 0.0
    ready: int = 0
    batches_per_s: float = 0.0  # msg/s of the same messages in plain batches of ``per_tx``
    batch_ms: dict[str, float] = field(default_factory=dict)
    batches_server_cpu_us_per_msg: float = 0.0
    batches_ready: int = 0
    ratio_to_baseline: float | None = None
    ratio_to_batches: float | None = None


@dataclass
class TxBenchResult:
    nodes: int
    partitions: int
    size: int
    producers: int
    messages: int
    window: int
    durability: str
    #: msg/s of the median baseline round; a round (its own queue) runs before each size's phases
    baseline_per_s: float = 0.0
    baseline_rounds: list[float] = field(default_factory=list)
    baseline_confirmed: int = 0
    baseline_ready: int = 0
    baseline_server_cpu_us_per_msg: float = 0.0
    sizes: list[SizeResult] = field(default_factory=list)
    #: in a group, where things were active: each transactions queue's partitions (partition ->
    #: node), each producer's coordinator partition, and the node each producer's link is on
    placement: dict[str, dict[str, str]] = field(default_factory=dict)
    error: str | None = None

    @property
    def counted(self) -> bool:
        """Every phase's queue holds exactly what it confirmed or committed."""
        return self.baseline_ready == self.baseline_confirmed and all(
            s.ready == s.messages and s.batches_ready == s.messages for s in self.sizes)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "counted": self.counted}


def _ms(values: list[float]) -> dict[str, float]:
    return {"p50": round(percentile(values, 50) * 1000, 2), "p99": round(percentile(values, 99) * 1000, 2),
            "max": round(max(values, default=0.0) * 1000, 2)}


def _chunks(ids: range, size: int) -> list[range]:
    """``ids`` cut into publishes of at most CHUNK_MESSAGES messages and CHUNK_BYTES bytes."""
    step = max(1, min(CHUNK_MESSAGES, CHUNK_BYTES // max(1, size)))
    return [ids[i:i + step] for i in range(0, len(ids), step)]


def _items(ids: range, size: int) -> list[tuple[bytes, str | None]]:
    return [(body_for(i, size), f"k{i}") for i in ids]


def _share(count: int, per_tx: int, producers: int) -> list[list[range]]:
    """``count // per_tx`` transactions of ``per_tx`` consecutive ids, dealt to the producers in turn."""
    txs = [range(t * per_tx, (t + 1) * per_tx) for t in range(count // per_tx)]
    return [txs[k::producers] for k in range(producers)]


class _Cpu:
    """The nodes' CPU seconds over a phase."""

    def __init__(self, pids: Callable[[], list[int]]) -> None:
        self._pids = pids
        self._start = 0.0
        self.spent = 0.0

    def _now(self) -> float:
        return sum(cpu_seconds(pid) for pid in self._pids())

    def __enter__(self) -> _Cpu:
        self._start = self._now()
        return self

    def __exit__(self, *exc: object) -> None:
        self.spent = self._now() - self._start

    def per(self, messages: int) -> float:
        return round(self.spent * 1e6 / messages, 1) if messages else 0.0


async def _ready(url: str, queue: str) -> int:
    """Messages ready in ``queue``, summed over the members."""
    totals = await queue_totals(url, client_name=CLIENT_NAME)
    if totals.missing:
        raise TandemError(f"counting {queue}: no figures from {', '.join(sorted(totals.missing))}")
    return sum(q.ready for q in totals.queues if q.name == queue)


async def _together(coros: list[Coroutine[Any, Any, None]]) -> None:
    """Run ``coros`` at once; the first to fail cancels the others, and its error is raised."""
    try:
        async with asyncio.TaskGroup() as tg:
            for c in coros:
                tg.create_task(c)
    except BaseExceptionGroup as eg:
        raise eg.exceptions[0] from None


async def _phase(what: str, timeout: float, aw: Awaitable[T]) -> T:
    try:
        async with SYSTEM_CLOCK.timeout(timeout):
            return await aw
    except TimeoutError:
        raise TimeoutError(f"{what}: not done in {timeout:g} s (--timeout)") from None


async def _batches(conns: list[client.DurableConnection], queue: str, shares: list[list[range]],
                   size: int) -> tuple[float, list[float]]:
    """Each producer sends its batches, one ``send_many`` at a time: (seconds, batch latencies)."""
    lat: list[float] = []

    async def one(conn: client.DurableConnection, txs: list[range]) -> None:
        p = conn.producer(queue)
        try:
            for ids in txs:
                t0 = time.perf_counter()
                await p.send_many(_items(ids, size))
                lat.append(time.perf_counter() - t0)
        finally:
            await p.close()

    t0 = time.perf_counter()
    await _together([one(c, s) for c, s in zip(conns, shares)])
    return time.perf_counter() - t0, lat


async def _transactions(conns: list[client.DurableConnection], tids: list[str], queue: str,
                        shares: list[list[range]], size: int) -> tuple[float, list[float], list[float]]:
    """Each producer runs its transactions one at a time: (seconds, commit latencies, transaction latencies)."""
    commits: list[float] = []
    whole: list[float] = []

    async def one(conn: client.DurableConnection, tid: str, txs: list[range]) -> None:
        for ids in txs:
            t0 = time.perf_counter()
            tx = await conn.begin(tid)
            for chunk in _chunks(ids, size):
                await tx.publish_many(queue, _items(chunk, size))
            t1 = time.perf_counter()
            await tx.commit()
            t2 = time.perf_counter()
            commits.append(t2 - t1)
            whole.append(t2 - t0)

    t0 = time.perf_counter()
    await _together([one(c, tid, s) for c, tid, s in zip(conns, tids, shares)])
    return time.perf_counter() - t0, commits, whole


def _rate(n: int, seconds: float) -> float:
    return round(n / seconds, 1) if seconds > 0 else 0.0


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if a and b else None


async def measure(url: str, res: TxBenchResult, sizes: list[int], pids: Callable[[], list[int]], *,
                  timeout: float = 600.0, actives: Callable[[str], Awaitable[dict[int, str]]] | None = None) -> None:
    """For each size a round of the baseline, then plain batches, then transactions, on the
    node(s) at ``url``; each phase may take ``timeout`` seconds.  ``actives(queue)`` (a group's)
    says where each partition is active, for ``res.placement``."""
    for q in (f"{kind}-{n}" for n in sizes for kind in ("plain", "batches", "tx")):
        await declare_served(url, q, res.partitions, client_name=CLIENT_NAME)
    cpus: list[float] = []
    conns = [await client.connect(url, client_name=CLIENT_NAME) for _ in range(res.producers)]
    try:
        tids = [f"tandem-bench-{k}" for k in range(res.producers)]
        coordinators: dict[str, int] = {}
        for conn, tid in zip(conns, tids):  # TxInit: once per producer and connection, before any timing
            link = await conn.primary()
            coordinators[tid] = coordinator_partition((await link.init_producer(tid)).name)
            if actives is not None:
                res.placement.setdefault("links", {})[tid] = link.node or ""
        for n in sizes:
            s = SizeResult(per_tx=n, transactions=res.messages // n, messages=res.messages // n * n)
            res.sizes.append(s)
            with _Cpu(pids) as cpu:
                confirmed, took = await _phase(f"the baseline round before {n}", timeout, publish_ids(
                    url, f"plain-{n}", range(res.messages), res.size, res.producers, res.window,
                    submit=lambda p: lambda body: p.send_nowait(body, key=f"k{id_of(body)}")))
            res.baseline_rounds.append(_rate(confirmed, took))
            cpus.append(cpu.per(confirmed))
            res.baseline_confirmed += confirmed
            res.baseline_ready += await _ready(url, f"plain-{n}")
            shares = _share(res.messages, n, res.producers)
            with _Cpu(pids) as cpu:
                took, lat = await _phase(f"batches of {n}", timeout,
                                         _batches(conns, f"batches-{n}", shares, res.size))
            s.batches_per_s, s.batch_ms = _rate(s.messages, took), _ms(lat)
            s.batches_server_cpu_us_per_msg = cpu.per(s.messages)
            s.batches_ready = await _ready(url, f"batches-{n}")
            with _Cpu(pids) as cpu:
                s.seconds, commits, whole = await _phase(f"transactions of {n}", timeout,
                                                         _transactions(conns, tids, f"tx-{n}", shares, res.size))
            s.tx_per_s, s.msg_per_s = _rate(s.transactions, s.seconds), _rate(s.messages, s.seconds)
            s.commit_ms, s.transaction_ms = _ms(commits), _ms(whole)
            s.server_cpu_us_per_msg = cpu.per(s.messages)
            s.ready = await _ready(url, f"tx-{n}")
            s.seconds = round(s.seconds, 3)
            s.ratio_to_batches = _ratio(s.msg_per_s, s.batches_per_s)
        if actives is not None:
            for n in sizes:
                res.placement[f"tx-{n}"] = {str(p): node for p, node in sorted((await actives(f"tx-{n}")).items())}
            held = await actives(COORDINATOR_QUEUE)
            res.placement["coordinators"] = {tid: held.get(p, "") for tid, p in coordinators.items()}
    finally:
        for conn in conns:
            await conn.close()
    res.baseline_per_s = statistics.median(res.baseline_rounds)
    res.baseline_server_cpu_us_per_msg = statistics.median(cpus)
    for s in res.sizes:
        s.ratio_to_baseline = _ratio(s.msg_per_s, res.baseline_per_s)


async def run_transactions(*, messages: int, sizes: list[int], size: int = 1024, nodes: int = 1,
                           partitions: int = 4, producers: int = 4, window: int = 1000, sync: str = "SYNC",
                           timeout: float = 600.0) -> TxBenchResult:
    """Spawn the node(s) in a temp dir, measure, stop them."""
    remote = NodeConfig().remote_sync.value
    durability = sync.upper() if nodes == 1 else \
        f"{nodes}-node group: active {sync.upper()}, replicas {remote}, quorum commit"
    res = TxBenchResult(nodes, partitions, size, producers, messages, window, durability)
    with tempfile.TemporaryDirectory(prefix="tandem-bench-tx-") as tmp:
        node: NodeProcess | None = None
        cluster: LocalCluster | None = None

        def pids() -> list[int]:
            if cluster is not None:
                return [p.pid for p in cluster.processes.values() if getattr(p, "proc", None) is not None]
            return [node.pid] if node is not None and node.proc is not None else []

        try:
            if nodes > 1:
                cluster = LocalCluster(Path(tmp), nodes=nodes, base_port=0, sync=sync)
                await cluster.start()
                await cluster.finalize()  # (a group takes transactions from feature level 6)
                url = cluster.url
            else:
                node = await NodeProcess(Path(tmp) / "node1", sync=sync).start()
                url = node.url
            await measure(url, res, sizes, pids, timeout=timeout,
                          actives=cluster.actives if cluster is not None else None)
        except (TandemError, OSError, TimeoutError) as exc:
            res.error = f"{type(exc).__name__}: {exc}"
        finally:
            if node is not None:
                await node.stop()
            if cluster is not None:
                await cluster.stop()
    return res


def _pct(ratio: float | None) -> str:
    return f"{ratio:.1%}" if ratio is not None else "-"


def print_transactions(res: TxBenchResult, *, as_json: bool) -> None:
    if as_json:
        print(json.dumps(res.to_json(), indent=2))
        return
    print(f"transactions: {res.messages:,} x {res.size} B per phase, {res.producers} producer(s) each on its own "
          f"connection, {res.partitions} partition(s), keyed; {res.nodes} node(s), {res.durability}")
    print(f"baseline, confirmed publishes ({res.window} in flight per producer): {res.baseline_per_s:,.0f} msg/s "
          f"(median of {', '.join(f'{r:,.0f}' for r in res.baseline_rounds)}), nodes' CPU "
          f"{res.baseline_server_cpu_us_per_msg:,.1f} us/msg")
    print(f"{'msg/tx':>6} {'tx/s':>9} {'msg/s':>9} {'commit p50':>11} {'p99 ms':>8} {'CPU us/msg':>10}  "
          f"{'batches msg/s':>13} {'batch p50':>10} {'CPU us/msg':>10}  {'/ batches':>9} {'/ baseline':>10}")
    for s in res.sizes:
        c, b = s.commit_ms, s.batch_ms
        print(f"{s.per_tx:>6} {s.tx_per_s:>9,.1f} {s.msg_per_s:>9,.0f} {c.get('p50', 0):>11.2f} "
              f"{c.get('p99', 0):>8.2f} {s.server_cpu_us_per_msg:>10,.1f}  {s.batches_per_s:>13,.0f} "
              f"{b.get('p50', 0):>10.2f} {s.batches_server_cpu_us_per_msg:>10,.1f}  "
              f"{_pct(s.ratio_to_batches):>9} {_pct(s.ratio_to_baseline):>10}")
    for what, where in res.placement.items():
        print(f"{what}: " + ", ".join(f"{k} {v}" for k, v in where.items()))
    if not res.counted and res.error is None:
        print(f"  ! ready after each phase differs from what was confirmed or committed: baseline rounds "
              f"{res.baseline_ready}/{res.baseline_confirmed}; " + "; ".join(
                  f"{s.per_tx}: batches {s.batches_ready}/{s.messages}, tx {s.ready}/{s.messages}"
                  for s in res.sizes))
    if res.error:
        print(f"  ! {res.error}")


def add_transactions_args(p: Any) -> None:
    """``tandem bench``'s transactions mode flags."""
    g = p.add_argument_group("transactions (--spawn --transactions)")
    g.add_argument("--transactions", action="store_true",
                   help="with --spawn: measure transactions of --tx-sizes messages (publish_many, then commit) "
                        "against plain confirmed publishes of the same messages, on the same node(s) in the same "
                        "run: transactions/s, msg/s, commit latency, the nodes' CPU per message, and the ratios")
    g.add_argument("--tx-sizes", dest="tx_sizes", default="1,10,100", metavar="N,N,...",
                   help="with --transactions: messages per transaction, one phase each (default 1,10,100)")
    g.add_argument("--tx-messages", dest="tx_messages", type=int, default=20_000, metavar="COUNT",
                   help="with --transactions: messages per phase (the baseline and each size; default 20000)")
    g.add_argument("--tx-producers", dest="tx_producers", type=int, default=4, metavar="N",
                   help="with --transactions: producers at once, each on its own connection with its own "
                        "transactional id (default 4)")


def parse_sizes(text: str) -> list[int]:
    """``--tx-sizes``: distinct positive integers, comma-separated, in the order given."""
    sizes: list[int] = []
    for part in text.split(","):
        try:
            n = int(part.strip())
        except ValueError:
            raise InvalidArgumentError(f"--tx-sizes {text!r}: give whole numbers of messages per transaction, "
                                       f"comma-separated (e.g. 1,10,100)") from None
        if n < 1:
            raise InvalidArgumentError(f"--tx-sizes: {n} messages per transaction (each must be >= 1)")
        if n in sizes:
            raise InvalidArgumentError(f"--tx-sizes: {n} is given twice")
        sizes.append(n)
    return sizes


def transactions_command(args: Any) -> Coroutine[Any, Any, int]:
    if not args.spawn:
        raise InvalidArgumentError("--transactions needs --spawn (it starts the node(s) it measures)")
    if args.mode != "replicated" or args.arbiter != "majority" or args.peer or args.tls:
        raise InvalidArgumentError("--transactions measures a spawned node or replicated group (--nodes N): "
                                   "not with --mode, --arbiter, --peer or --tls")
    if not 1 <= args.nodes <= 9:
        raise InvalidArgumentError(f"--nodes {args.nodes}: a spawned group has 1 to 9 nodes")
    sizes = parse_sizes(args.tx_sizes)
    DurabilityPolicy.parse(args.sync)  # (a bad name stops here, with the choices)
    if args.tx_producers < 1:
        raise InvalidArgumentError("--tx-producers must be >= 1")
    if args.size < 8:
        raise InvalidArgumentError("--size must be >= 8 (the message id takes 8 bytes)")
    if args.window < 1 or (args.partitions is not None and args.partitions < 1):
        raise InvalidArgumentError("--window and --partitions must be >= 1")
    if args.tx_messages < max(sizes) * args.tx_producers:
        raise InvalidArgumentError(f"--tx-messages {args.tx_messages}: too few for transactions of {max(sizes)} "
                                   f"messages by {args.tx_producers} producers (at least one each: "
                                   f"{max(sizes) * args.tx_producers})")

    async def run() -> int:
        res = await run_transactions(messages=args.tx_messages, sizes=sizes, size=args.size, nodes=args.nodes,
                                     partitions=args.partitions or 4, producers=args.tx_producers,
                                     window=args.window, sync=args.sync, timeout=args.timeout)
        print_transactions(res, as_json=args.json)
        return 0 if res.error is None and res.counted else 1

    return run()
