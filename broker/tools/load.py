"""``tandem load``: a headless locust run against a node or group (``--url``) or a group
started for the run (``--spawn``), its CSV and HTML report in ``--out``; ``--profile soak``:
an hour of steady load with a kill -9 every ten minutes (:mod:`broker.tools.soak`).

Locust runs as a child process (``python -m locust -f LOCUSTFILE --headless ...``): it
monkey-patches whatever imports it, and this process runs asyncio (the spawned nodes).
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import tempfile
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from broker.tools import soak
from broker.tools.cluster import LocalCluster
from broker.tools.locust_run import LocustRun, parse_duration, run_locust
from broker.tools.options import ExamplesFormatter
from broker.tools.process import NodeProcess
from client.errors import InvalidArgumentError, TandemError

PACKAGED_LOCUSTFILE = Path(__file__).with_name("locustfile.py")
MISSING = "tandem load needs locust, matplotlib and psutil: pip install 'tandem-broker[load]'"
#: the request types of client.locust, in the order the summary prints them
KINDS = ("publish", "deliver", "ack", "connect")


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "load", help="a locust load test (producers and consumers), or the hour-long soak",
        description="Run locust headless against --url (a running node or group) or --spawn (a fresh "
                    "local node, --nodes N a replication group, in a temp dir), with producer and consumer "
                    "users of client.locust.TandemUser. Locust's CSV and HTML report go to --out; a summary "
                    "(requests, failures, rate, p50/p99 of publish-to-confirm and publish-to-delivery) is "
                    "printed; the exit status is 1 if any request failed. --profile soak: steady load at "
                    "--rate on a spawned group with a kill -9 of a partition's active every --kill-every, "
                    "every message checked (lost / duplicated), throughput, confirm latency and each node's "
                    "memory per interval, a JSON series, a PNG plot and a verdict (docs/load.md). "
                    "For the locust web UI: locust -f examples/locustfile.py --host tandem://...",
        epilog="examples:\n"
               "  tandem load --spawn --nodes 3 --users 50 --run-time 60s --processes 2\n"
               "  tandem load --url tandem://admin:PW@127.0.0.1:7780 --users 20 --run-time 5m --out load-out\n"
               "  tandem load --url tandem://admin:PW@h1:7780,h2:7790 --locustfile examples/locustfile.py\n"
               "  tandem load --profile soak                      # 1 h, 2000 msg/s, 3 nodes, a kill every 10 min\n"
               "  tandem load --profile soak --run-time 5m --out soak-5m",
        formatter_class=ExamplesFormatter)
    p.add_argument("--profile", choices=("load", "soak"), default="load",
                   help="load: locust users as the locustfile says (default); soak: see above")
    p.add_argument("--url", help="a running node or group, tandem://user:password@host:port[,host:port...]")
    p.add_argument("--spawn", action="store_true", help="start a fresh node (or --nodes N) for the run")
    p.add_argument("--nodes", type=int, default=None, help="with --spawn: this many nodes (default 1; soak: 3)")
    p.add_argument("--sync", default="SYNC", help="durability policy of spawned nodes (default SYNC)")
    p.add_argument("--users", type=int, default=None, help="locust users (default 10; soak: 20 producers)")
    p.add_argument("--spawn-rate", dest="spawn_rate", type=float, default=None,
                   help="users started a second (default: all within a second)")
    p.add_argument("--run-time", dest="run_time", default=None,
                   help="how long: 90s, 5m, 1h30m (default 60s; soak: 1h)")
    p.add_argument("--processes", type=int, default=1,
                   help="locust processes (its --processes: a master and N workers, so that the load "
                        "generator is not what limits; default 1)")
    p.add_argument("--locustfile", default=None,
                   help="a locustfile of your own (default: the packaged one: half producers at "
                        "100 msg/s each, half consumers)")
    p.add_argument("--out", default=None, help="directory for the report (default tandem-load, soak: tandem-soak)")
    p.add_argument("--queue", default=None, help="the queue (locust --tandem-queue; default locust, soak: soak)")
    p.add_argument("--partitions", type=int, default=None,
                   help="partitions of the queue if the run declares it (default 1; soak: one per node)")
    p.add_argument("--body-size", dest="body_size", type=int, default=None, help="bytes per message (>= 28)")
    p.add_argument("--batch-size", dest="batch_size", type=int, default=None, help="messages per publish")
    p.add_argument("--rate", type=float, default=None,
                   help="load: messages a second per producer user; soak: messages a second in all "
                        "(default 2000)")
    p.add_argument("--kill-every", dest="kill_every", default=None,
                   help="soak: time between kills (default: a sixth of --run-time, 10m for the hour)")
    p.add_argument("--locust-arg", dest="locust_args", action="append", default=[], metavar="ARG",
                   help="an argument passed to locust as it is (repeat; e.g. --locust-arg=--tandem-prefetch=500)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.set_defaults(func=load)


def _require_extra() -> None:
    for mod in ("locust", "matplotlib", "psutil"):
        if importlib.util.find_spec(mod) is None:
            raise InvalidArgumentError(MISSING)


def load(args: argparse.Namespace) -> Coroutine[Any, Any, int]:
    _require_extra()
    if args.profile == "soak":
        return soak.run(args)
    if bool(args.url) == bool(args.spawn):
        raise InvalidArgumentError("give exactly one of --url (a running node or group) or --spawn (start one)")
    if args.kill_every:
        raise InvalidArgumentError("--kill-every is for --profile soak")
    nodes = args.nodes or 1
    if not 1 <= nodes <= 9:
        raise InvalidArgumentError(f"--nodes {nodes}: a spawned group has 1 to 9 nodes")
    if args.nodes and not args.spawn:
        raise InvalidArgumentError("--nodes is for --spawn (a running group is given by its --url)")
    for name in ("users", "processes", "partitions", "batch_size"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise InvalidArgumentError(f"--{name.replace('_', '-')} must be >= 1")
    if args.body_size is not None and args.body_size < 28:
        raise InvalidArgumentError("--body-size must be >= 28 (the stamp takes 28 bytes)")
    locustfile = Path(args.locustfile) if args.locustfile else PACKAGED_LOCUSTFILE
    if not locustfile.is_file():
        raise InvalidArgumentError(f"--locustfile {locustfile}: no such file")
    run = LocustRun(locustfile=locustfile, users=args.users or 10, spawn_rate=args.spawn_rate,
                    run_time=parse_duration(args.run_time or "60s"), processes=args.processes,
                    out=Path(args.out or "tandem-load"), options=tandem_options(args), extra=args.locust_args)
    return _load(args, run, nodes)


def tandem_options(args: argparse.Namespace) -> list[str]:
    """The ``--tandem-*`` options of client.locust for what the command line set."""
    out = []
    for name in ("queue", "partitions", "body_size", "batch_size", "rate"):
        v = getattr(args, name)
        if v is not None:
            out.append(f"--tandem-{name.replace('_', '-')}={v}")
    return out


async def _load(args: argparse.Namespace, run: LocustRun, nodes: int) -> int:
    if args.url:
        code = await run_locust(run, args.url)
        target = "the node(s) at --url"
    else:
        with tempfile.TemporaryDirectory(prefix="tandem-load-") as tmp:
            cluster = node = None
            try:
                if nodes > 1:
                    cluster = LocalCluster(Path(tmp), nodes=nodes, base_port=0, sync=args.sync)
                    await cluster.start()
                    await cluster.wait_ready()
                    url = cluster.url
                else:
                    node = await NodeProcess(Path(tmp) / "node1", sync=args.sync).start()
                    url = node.url
                code = await run_locust(run, url)
            finally:
                if node is not None:
                    await node.stop()
                if cluster is not None:
                    await cluster.stop()
        target = f"a spawned {nodes}-node group" if nodes > 1 else "a spawned node"
    summary = read_summary(run.out)
    summary.update(target=target, users=run.users, processes=run.processes, run_time_s=run.run_time,
                   locust_exit=code, report=str(run.out / "report.html"), csv=str(run.out / "locust_stats.csv"))
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_summary(summary)
    failures = summary["total"]["failures"] if summary["total"] else 1
    return 0 if code == 0 and failures == 0 and summary["total"]["requests"] > 0 else 1


def _num(v: str) -> float:
    try:
        return float(v)
    except ValueError:
        return 0.0  # locust writes "N/A" for a percentile of nothing


def read_summary(out: Path) -> dict[str, Any]:
    """Per request type and in all, from locust's ``locust_stats.csv``: requests, failures,
    requests/s and the p50/p99 times (ms)."""
    path = out / "locust_stats.csv"
    rows: dict[str, dict[str, float]] = {}
    total: dict[str, float] = {}
    if not path.exists():
        raise TandemError(f"locust wrote no {path}: see {out / 'locust.log'}")
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            entry = {"requests": int(_num(r["Request Count"])), "failures": int(_num(r["Failure Count"])),
                     "rps": _num(r["Requests/s"]), "p50_ms": _num(r["50%"]), "p99_ms": _num(r["99%"])}
            if r["Name"] == "Aggregated":
                total = entry
            else:
                rows[r["Type"]] = entry
    return {"by_type": rows, "total": total}


def print_summary(s: dict[str, Any]) -> None:
    print(f"locust: {s['users']} users, {s['processes']} process(es), {s['run_time_s']:.0f} s against {s['target']}")
    print(f"{'type':<9} {'requests':>10} {'failures':>9} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
    notes = {"publish": "publish to confirm (one batch)", "deliver": "publish to delivery (end to end)",
             "ack": "ack round trip", "connect": "connection failures"}
    kinds = [k for k in KINDS if k in s["by_type"]] + [k for k in s["by_type"] if k not in KINDS]
    for kind in kinds:
        r = s["by_type"][kind]
        print(f"{kind:<9} {r['requests']:>10,} {r['failures']:>9,} {r['rps']:>9,.0f} {r['p50_ms']:>8.0f} "
              f"{r['p99_ms']:>8.0f}  {notes.get(kind, '')}")
    t = s["total"]
    if t:
        print(f"{'all':<9} {t['requests']:>10,} {t['failures']:>9,} {t['rps']:>9,.0f}")
    print(f"report: {s['report']}, {s['csv']}")
    if s["locust_exit"] != 0:
        print(f"locust exited with status {s['locust_exit']}: see its log beside the report")
