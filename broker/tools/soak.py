"""``tandem load --profile soak``: steady load for an hour on a spawned group, a kill -9 of a
partition's active every ten minutes, every message checked.

* Producers: locust users (:mod:`broker.tools.soak_locustfile`, the blocking client under
  gevent, as a user's load test runs) at a fixed total ``--rate``, each writing a ledger of
  what it sent and what was confirmed (a publish that failed is not counted as confirmed).
* Consumer: a durable async client (:mod:`client.durable`) in this process.  It subscribes on
  every member and follows each partition across failovers, so the count of lost and
  duplicated messages is the broker's, not an artefact of where a consumer happened to be
  connected: a blocking consumer (as locust users have) gets only the partitions active on
  its one node, and after a kill the partition's new active may have none.  It also outlives
  locust's stop, so the end-of-run drain reads the queue to the last message.
* Faults: every ``--kill-every`` the active of the next partition in turn is killed (-9) and
  started again after ``down_for`` (it rejoins and catches up; failback gives it its
  partitions back).
* Records: per interval (a minute for the hour) published and consumed msg/s, confirm
  p50/p99, each node's RSS (psutil).  Out: ``soak.json``, ``soak.png``, locust's CSV/HTML,
  and a verdict (:func:`broker.tools.soak_report.judge`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import client
from broker.tools.cluster import LocalCluster
from broker.tools.locust_run import LocustRun, parse_duration, run_locust
from broker.tools.soak_report import Ledger, Tally, judge, plot, series
from client.clock import SYSTEM_CLOCK
from client.errors import InvalidArgumentError, StaleDeliveryError

log = logging.getLogger("tandem.load")
LOCUSTFILE = Path(__file__).with_name("soak_locustfile.py")


@dataclass(frozen=True, slots=True, kw_only=True)
class SoakConfig:
    run_time_s: float
    rate: float
    kill_every_s: float
    down_for_s: float
    interval_s: float
    nodes: int
    partitions: int
    users: int
    batch_size: int
    body_size: int
    processes: int
    queue: str
    sync: str
    out: str
    drain_timeout_s: float = 120.0


def config(args: argparse.Namespace) -> SoakConfig:
    if args.url:
        raise InvalidArgumentError("--profile soak spawns its own group (it kills nodes): leave out --url")
    if args.locustfile:
        raise InvalidArgumentError("--profile soak runs its own producers: leave out --locustfile")
    run_time = parse_duration(args.run_time or "1h")
    kill_every = parse_duration(args.kill_every, "--kill-every") if args.kill_every else run_time / 6
    nodes = args.nodes or 3
    if not 3 <= nodes <= 9:
        raise InvalidArgumentError(f"--nodes {nodes}: the soak kills an active, so it needs 3 to 9 nodes")
    rate = args.rate if args.rate is not None else 2000.0
    users = args.users or 20
    batch = args.batch_size or 10
    if rate <= 0 or users < 1 or batch < 1 or args.processes < 1:
        raise InvalidArgumentError("--rate, --users, --batch-size and --processes must be > 0")
    if args.body_size is not None and args.body_size < 28:
        raise InvalidArgumentError("--body-size must be >= 28 (the stamp takes 28 bytes)")
    return SoakConfig(run_time_s=run_time, rate=rate, kill_every_s=kill_every,
                      down_for_s=min(10.0, kill_every / 3), interval_s=min(60.0, max(1.0, run_time / 20)),
                      nodes=nodes, partitions=args.partitions or nodes, users=users, batch_size=batch,
                      body_size=args.body_size or 256, processes=args.processes, queue=args.queue or "soak",
                      sync=args.sync, out=args.out or "tandem-soak")


def run(args: argparse.Namespace) -> Any:
    cfg = config(args)
    return _main(cfg, args.json)


async def _main(cfg: SoakConfig, as_json: bool) -> int:
    if logging.getLogger().getEffectiveLevel() >= logging.WARNING:
        # the consumer's failovers are the point of the run, not news: -v shows them
        logging.getLogger("tandem.client").setLevel(logging.ERROR)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    ledger_dir = out / "ledger"
    ledger_dir.mkdir(exist_ok=True)
    for old in ledger_dir.glob("ledger-*.txt"):
        old.unlink()  # a report dir used before: this run's ledger only
    soak = Soak(cfg, ledger_dir)
    with tempfile.TemporaryDirectory(prefix="tandem-soak-") as tmp:
        cluster = LocalCluster(Path(tmp), nodes=cfg.nodes, base_port=0, sync=cfg.sync)
        soak.cluster = cluster
        try:
            await cluster.start()
            await cluster.wait_ready()
            await soak.go()
        finally:
            await soak.stop_tasks()
            await cluster.stop()
    data = soak.report()
    (out / "soak.json").write_text(json.dumps(data, indent=1))
    plot(out / "soak.png", data)
    if as_json:
        print(json.dumps({k: v for k, v in data.items() if k != "series"}, indent=2))
    else:
        print_report(data, out)
    return 0 if data["judgement"]["passed"] else 1


class Soak:
    def __init__(self, cfg: SoakConfig, ledger_dir: Path) -> None:
        self.cfg = cfg
        self.ledger_dir = ledger_dir
        self.cluster: LocalCluster | None = None
        self.tally = Tally()
        self.rss: list[tuple[float, str, int]] = []
        self.kills: list[dict[str, Any]] = []
        self.t0 = 0.0
        self.locust_exit: int | None = None
        self.drained = False
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []

    async def go(self) -> None:
        cfg, cl = self.cfg, self.cluster
        assert cl is not None
        async with await client.connect(cl.url, client_name="soak-admin") as admin:
            await admin.declare_queue(cfg.queue, partitions=cfg.partitions)
        await self._until_served()
        consumer = await client.connect(cl.url, client_name="soak-consumer")
        try:
            self._tasks.append(asyncio.create_task(self._consume(consumer)))
            self._tasks.append(asyncio.create_task(self._sample()))
            run = LocustRun(locustfile=LOCUSTFILE, users=cfg.users, spawn_rate=None, run_time=cfg.run_time_s,
                            processes=cfg.processes, out=Path(cfg.out), extra=[],
                            options=[f"--tandem-queue={cfg.queue}", f"--tandem-partitions={cfg.partitions}",
                                     f"--tandem-rate={cfg.rate / cfg.users}",
                                     f"--tandem-batch-size={cfg.batch_size}", f"--tandem-body-size={cfg.body_size}"])
            self.t0 = SYSTEM_CLOCK.time()
            killer = asyncio.create_task(self._kill_loop())
            try:
                self.locust_exit = await run_locust(run, cl.url, env={"TANDEM_SOAK_LEDGER": str(self.ledger_dir)})
            finally:
                killer.cancel()
                await asyncio.gather(killer, return_exceptions=True)
                await self._restart_all()
            await self._drain(consumer)
        finally:
            self._stop.set()
            await self.stop_tasks()
            await consumer.close()

    async def _until_served(self) -> None:
        assert self.cluster is not None
        async with SYSTEM_CLOCK.timeout(60):
            while len(await self.cluster.actives(self.cfg.queue, self.cfg.partitions)) < self.cfg.partitions:
                await SYSTEM_CLOCK.sleep(0.2)  # polling the nodes for a state, bounded by the deadline

    async def _consume(self, conn: Any) -> None:
        c = await conn.consumer(self.cfg.queue, prefetch=1000).start()
        try:
            while not self._stop.is_set():
                m = await c.next(0.2)
                if m is None:
                    continue
                self.tally.add(m.body, m.id, SYSTEM_CLOCK.time())
                try:
                    m.ack()
                except StaleDeliveryError:
                    pass  # its link failed: it comes again, redelivered
        finally:
            await c.close()

    async def _sample(self) -> None:
        """Each node's RSS every few seconds (a killed node is left out until it is back)."""
        import psutil  # the optional "load" extra

        assert self.cluster is not None
        every = min(10.0, self.cfg.interval_s / 3)
        while not self._stop.is_set():
            now = SYSTEM_CLOCK.time()
            for name, p in self.cluster.nodes.items():
                if p.proc is None or p.proc.returncode is not None:
                    continue
                try:
                    self.rss.append((now, name, psutil.Process(p.proc.pid).memory_info().rss))
                except psutil.Error:
                    continue  # it died between the look and the read
            await SYSTEM_CLOCK.sleep(every)  # a sampling period, not a wait for a state

    async def _kill_loop(self) -> None:
        cfg, cl = self.cfg, self.cluster
        assert cl is not None
        k = 0
        while True:
            at = self.t0 + (k + 1) * cfg.kill_every_s
            if at + cfg.down_for_s >= self.t0 + cfg.run_time_s:
                return  # no room left to start it again before the end
            await SYSTEM_CLOCK.sleep(max(0.0, at - SYSTEM_CLOCK.time()))  # the schedule, not a wait for a state
            part = k % cfg.partitions
            actives = await cl.actives(cfg.queue, cfg.partitions)
            target = actives.get(part) or next(iter(cl.nodes))
            record = {"at_s": round(SYSTEM_CLOCK.time() - self.t0, 2), "node": target, "partition": part,
                      "restarted_at_s": None}
            self.kills.append(record)
            log.info("soak: kill -9 %s (active of partition %d)", target, part)
            await cl.nodes[target].kill()
            await SYSTEM_CLOCK.sleep(cfg.down_for_s)  # how long it stays down
            await cl.nodes[target].start()
            record["restarted_at_s"] = round(SYSTEM_CLOCK.time() - self.t0, 2)
            k += 1

    async def _restart_all(self) -> None:
        assert self.cluster is not None
        for name, p in self.cluster.nodes.items():
            if p.proc is None or p.proc.returncode is not None:
                await p.start()
                for rec in self.kills:
                    if rec["node"] == name and rec["restarted_at_s"] is None:
                        rec["restarted_at_s"] = round(SYSTEM_CLOCK.time() - self.t0, 2)

    async def _drain(self, conn: Any) -> None:
        """Until every confirmed message was consumed and no node holds one of the queue."""
        from broker.tools.drill.groups import empty_everywhere

        ledger = Ledger.load(self.ledger_dir)
        want = list(ledger.confirmed_keys())
        deadline = SYSTEM_CLOCK.monotonic() + self.cfg.drain_timeout_s
        while SYSTEM_CLOCK.monotonic() < deadline:
            want = [k for k in want if not self.tally.seen(k)]
            if not want and await empty_everywhere(self.cluster, self.cfg.queue):
                self.drained = True
                return
            await SYSTEM_CLOCK.sleep(0.5)  # polling the consumer and the nodes, bounded by the deadline
        log.warning("soak: %d confirmed message(s) not consumed by the drain deadline", len(want))

    async def stop_tasks(self) -> None:
        self._stop.set()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    def report(self) -> dict[str, Any]:
        cfg = self.cfg
        ledger = Ledger.load(self.ledger_dir)
        verdict = self.tally.verdict(ledger)
        restarts: dict[str, list[float]] = {}
        for k in self.kills:
            if k["restarted_at_s"] is not None:
                restarts.setdefault(k["node"], []).append(self.t0 + k["restarted_at_s"])
        judgement = judge(self.t0, cfg.run_time_s, ledger, self.tally, self.rss, verdict, restarts=restarts,
                          settle=min(60.0, cfg.kill_every_s / 2))
        return {"config": {**asdict(cfg), "rate": cfg.rate}, "verdict": verdict.as_dict(),
                "publish_errors": ledger.errors, "drained": self.drained, "locust_exit": self.locust_exit,
                "kills": self.kills, "judgement": judgement,
                "series": series(self.t0, cfg.run_time_s, cfg.interval_s, ledger, self.tally, self.rss)}


def print_report(data: dict[str, Any], out: Path) -> None:
    cfg, v, j = data["config"], data["verdict"], data["judgement"]
    print(f"soak: {cfg['rate']:g} msg/s for {cfg['run_time_s']:.0f} s on {cfg['nodes']} nodes "
          f"({cfg['partitions']} partitions), {len(data['kills'])} kill(s) of an active")
    for k in data["kills"]:
        print(f"  {k['at_s']:>8.1f} s  kill -9 {k['node']} (partition {k['partition']}), started again at "
              f"{k['restarted_at_s']} s")
    print(f"messages: sent {v['sent']:,} confirmed {v['confirmed']:,} ok {v['ok']:,} lost {v['lost']} "
          f"duplicated {v['duplicated']} unexpected {v['unexpected']} redelivered {v['redelivered']} "
          f"recovered {v['recovered']}" + ("" if data["drained"] else "  (drain deadline passed)"))
    if data["publish_errors"]:
        print(f"failed publishes (messages): {data['publish_errors']}")
    w = j["windows_s"]
    print(f"windows: first {w['first'][0]:.0f}-{w['first'][1]:.0f} s, last {w['last'][0]:.0f}-{w['last'][1]:.0f} s")
    for name, c in j["checks"].items():
        change = f"{c['change']:+.1%}" if c["change"] is not None else "-"
        print(f"  {name:<22} first {c['first']} last {c['last']} ({change}) {'flat' if c['flat'] else 'NOT FLAT'}")
    print(f"verdict: {'PASSED' if j['passed'] else 'FAILED'}; {out / 'soak.json'}, {out / 'soak.png'}, "
          f"{out / 'report.html'}")
