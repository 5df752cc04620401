"""``tandem bench``: Tandem side by side with RabbitMQ and NATS, same workload, same run."""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from broker.tools.bench.failover import measure_failover
from broker.tools.bench.harness import TandemDriver, run_system
from broker.tools.bench.workload import RunResult, Workload
from broker.tools.cluster import LocalCluster
from broker.tools.process import NodeProcess
from client.errors import InvalidArgumentError
from client.url import parse_url

PEERS = ("rabbitmq", "nats")
SINGLE_NODE_PARTITIONS = 4  # --partitions by default for a single node
GROUP_PARTITIONS = 1  # ... and for a group: a queue declared with the defaults


def add_bench_parser(sub: Any) -> None:
    p = sub.add_parser(
        "bench", help="measure publish/consume throughput and confirm latency",
        description="Publish with confirms and consume with acks at the same time, check every message "
                    "arrived exactly once, then measure publish-to-confirm latency at a fixed rate. "
                    "Targets --url (a running node) or --spawn (a fresh local node in a temp dir); "
                    "--peer runs the same workload against the local RabbitMQ (quorum queue) and "
                    "NATS JetStream (file storage, R1) in the same run and prints the ratios.")
    p.add_argument("--url", help="a running node, tandem://user:password@host:port")
    p.add_argument("--spawn", action="store_true", help="start a fresh node in a temp dir for the run")
    p.add_argument("--sync", default="SYNC", help="durability policy of the spawned node(s) (default SYNC)")
    p.add_argument("--nodes", type=int, default=1,
                   help="with --spawn: a replication group of this many nodes (replicas write WRITE_NO_SYNC)")
    p.add_argument("--rabbitmq-nodes", dest="rabbitmq_nodes", type=int, default=1,
                   help="how many nodes the RabbitMQ at --rabbitmq-url has (reported with the figures)")
    p.add_argument("--nats-replicas", dest="nats_replicas", type=int, default=1,
                   help="replicas of the NATS stream (R3 needs a 3-node NATS cluster at --nats-url)")
    p.add_argument("--messages", type=int, default=100_000, help="messages in the throughput phase")
    p.add_argument("--size", type=int, default=1024, help="message size in bytes (>= 8)")
    p.add_argument("--producers", type=int, default=1)
    p.add_argument("--consumers", type=int, default=1)
    p.add_argument("--partitions", type=int, default=None,
                   help="partitions of the Tandem queue (default: 1 for a group, the queue a client "
                        "declares with the defaults, as the peers' one stream or quorum queue; 4 for a "
                        "single node; N spreads the actives over N nodes)")
    p.add_argument("--window", type=int, default=1000, help="unconfirmed publishes in flight per producer")
    p.add_argument("--prefetch", type=int, default=1000, help="unacked deliveries per consumer")
    p.add_argument("--latency-rate", dest="latency_rate", type=float, default=2000.0,
                   help="msg/s of the paced latency phase (0 skips it)")
    p.add_argument("--latency-messages", dest="latency_messages", type=int, default=10_000)
    p.add_argument("--peer", action="append", default=[], choices=PEERS, help="also run against this peer")
    p.add_argument("--rabbitmq-url", default="amqp://guest:guest@127.0.0.1:5672/")
    p.add_argument("--nats-url", default="nats://127.0.0.1:4222")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds a phase may take")
    p.add_argument("--sequential", action="store_true",
                   help="publish all messages first, then consume them, and time each side alone "
                        "(default: publish and consume at the same time)")
    p.add_argument("--failover", action="store_true",
                   help="with --spawn --nodes N (>= 3): measure the client-visible pause when the active of a "
                        "partition is killed (kill -9) while producers send, with the default timeouts")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=bench)


def _partitions(args: argparse.Namespace) -> int:
    """--partitions, or by default: for a group, one partition (what a client gets when it
    declares a queue with the defaults: one active and its replicas), as the peers are measured
    (a NATS stream, a RabbitMQ quorum queue: one leader, one log); for a single node, 4.  A
    queue spread over the nodes (``--partitions 3``) is a choice a deployment makes; on one
    machine it multiplies the small events each message costs."""
    if args.partitions is not None:
        return args.partitions
    if args.spawn:
        nodes = args.nodes
    else:
        nodes = len(parse_url(args.url).hosts) if args.url else 1
    return GROUP_PARTITIONS if nodes > 1 else SINGLE_NODE_PARTITIONS


def _workload(args: argparse.Namespace) -> Workload:
    if args.size < 8:
        raise InvalidArgumentError("--size must be >= 8 (the message id takes 8 bytes)")
    for name in ("messages", "producers", "consumers", "partitions", "window", "prefetch"):
        if getattr(args, name) < 1:
            raise InvalidArgumentError(f"--{name} must be >= 1")
    return Workload(messages=args.messages, size=args.size, producers=args.producers, consumers=args.consumers,
                    partitions=args.partitions, window=args.window, prefetch=args.prefetch,
                    latency_rate=args.latency_rate, latency_messages=args.latency_messages, timeout=args.timeout,
                    sequential=args.sequential)


def bench(args: argparse.Namespace) -> Coroutine[Any, Any, int]:
    if bool(args.url) == bool(args.spawn):
        raise InvalidArgumentError("give exactly one of --url (a running node) or --spawn (start one)")
    args.partitions = _partitions(args)
    if args.failover:
        if not args.spawn or args.nodes < 3:
            raise InvalidArgumentError("--failover needs --spawn --nodes 3 (or more)")
        if args.partitions < 1:
            raise InvalidArgumentError("--partitions must be >= 1")
        return _failover(args)
    w = _workload(args)
    return _bench(args, w)


async def _failover(args: argparse.Namespace) -> int:
    report = await measure_failover(nodes=args.nodes, partitions=args.partitions,
                                    messages=max(1000, min(args.messages, 20000)))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        f, v = report["failover_ms"], report["verdict"]
        print(f"kill -9 of {report['killed']} (active of partition 0; now {report['new_active_of_partition_0']})")
        print(f"  longest wait for a confirm : {f['max_confirm_wait']:.0f} ms")
        print(f"  every partition active in : {f['all_partitions_active_again']:.0f} ms")
        print(f"  messages: sent {v['sent']} confirmed {v['confirmed']} ok {v['ok']} lost {v['lost']} "
              f"duplicated {v['duplicated']} unexpected {v['unexpected']}")
    return 0 if report["verdict"]["passed"] else 1


async def _bench(args: argparse.Namespace, w: Workload) -> int:
    runs: list[RunResult] = []
    node = None
    cluster = None
    tmp = None
    try:
        if args.spawn and args.nodes > 1:
            tmp = tempfile.TemporaryDirectory(prefix="tandem-bench-")
            cluster = LocalCluster(Path(tmp.name), nodes=args.nodes, base_port=0, sync=args.sync)
            await cluster.start()
            await cluster.wait_ready()
            url = cluster.url
            durability = f"{args.nodes}-node group: active {args.sync.upper()}, replicas WRITE_NO_SYNC, quorum commit"
        elif args.spawn:
            tmp = tempfile.TemporaryDirectory(prefix="tandem-bench-")
            node = await NodeProcess(Path(tmp.name) / "node1", sync=args.sync).start()
            url, durability = node.url, args.sync.upper()
        else:
            url, durability = args.url, "as configured on the node"

        def server_pids() -> list[int]:
            if cluster is not None:
                return [n.pid for n in cluster.nodes.values()]
            return [node.pid] if node is not None else []

        runs.append(await run_system(TandemDriver(url, durability), w,
                                     server_pids=server_pids if args.spawn else None))
    finally:
        if node is not None:
            await node.stop()
        if cluster is not None:
            await cluster.stop()
        if tmp is not None:
            tmp.cleanup()
    for peer in dict.fromkeys(args.peer):
        from broker.tools.bench import peers  # aio-pika and nats-py: the optional "bench" extra

        drv = (peers.RabbitMQDriver(args.rabbitmq_url, args.rabbitmq_nodes) if peer == "rabbitmq"
               else peers.NatsDriver(args.nats_url, args.nats_replicas))
        runs.append(await run_system(drv, w))
    report = _report(runs, w)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_human(report)
    ok = all(r.error is None and r.lost == 0 and r.duplicated == 0 and r.unexpected == 0 for r in runs)
    return 0 if ok else 1


def _report(runs: list[RunResult], w: Workload) -> dict[str, Any]:
    tandem = runs[0]
    ratios: dict[str, dict[str, float | None]] = {}
    for r in runs[1:]:
        ratios[r.system] = {
            "publish_per_s": round(tandem.publish_per_s / r.publish_per_s, 2) if r.publish_per_s else None,
            "consume_per_s": round(tandem.consume_per_s / r.consume_per_s, 2) if r.consume_per_s else None,
        }
    return {
        "workload": {k: getattr(w, k) for k in w.__dataclass_fields__},
        "machine": {"cpus": _cpus(), "python": platform.python_version(), "platform": platform.platform()},
        "runs": [r.to_json() for r in runs],
        "ratios": ratios,
    }


def _cpus() -> int:
    return os.cpu_count() or 0


def _print_human(report: dict[str, Any]) -> None:
    w = report["workload"]
    mode = "publish, then consume" if w["sequential"] else "publish and consume at once"
    print(f"workload: {w['messages']} x {w['size']} B, {w['producers']} producer(s), {w['consumers']} "
          f"consumer(s), window {w['window']}, prefetch {w['prefetch']}, {mode}; "
          f"latency at {w['latency_rate']:g} msg/s")
    head = f"{'system':<10} {'publish/s':>11} {'consume/s':>11} {'p50 ms':>8} {'p99 ms':>8} " \
           f"{'lost':>5} {'dup':>5} {'unexp':>5}  durability"
    print(head)
    for r in report["runs"]:
        c = r["confirm_ms"] or {}
        print(f"{r['system']:<10} {r['publish_per_s']:>11,.0f} {r['consume_per_s']:>11,.0f} "
              f"{c.get('p50', 0):>8.2f} {c.get('p99', 0):>8.2f} {r['lost']:>5} {r['duplicated']:>5} "
              f"{r['unexpected']:>5}  {r['durability']}")
        if r["error"]:
            print(f"  ! {r['system']}: {r['error']}")
    for r in report["runs"]:
        cpu = r.get("cpu_us_per_msg") or {}
        if cpu:
            parts = [f"{k} {v:,.1f}" for k, v in cpu.items()]
            print(f"CPU per message (us, throughput phase), {r['system']}: {', '.join(parts)}")
    for peer, ratio in report["ratios"].items():
        pub, con = ratio["publish_per_s"], ratio["consume_per_s"]
        print(f"tandem / {peer}: publish x{pub if pub is not None else '-'}, consume x{con if con is not None else '-'}")
