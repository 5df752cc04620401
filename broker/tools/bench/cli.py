"""``tandem bench``: Tandem side by side with RabbitMQ and NATS, same workload, same run."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import tempfile
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from broker.config import NodeConfig
from broker.tools.bench.backlog import add_backlog_args, backlog_command
from broker.tools.bench.delayed import add_delayed_args, delayed_command
from broker.tools.bench.fanout import add_fanout_args, fanout_command
from broker.tools.bench.replay import add_replay_args, replay_command
from broker.tools.bench.transactions import add_transactions_args, transactions_command
from broker.tools.bench.failover import measure_failover
from broker.tools.bench.harness import ServerProcs, TandemDriver, run_system
from broker.tools.bench.workload import RunResult, Workload
from broker.tools.certs import make_dev_certs
from broker.tools.cluster import LocalCluster, free_ports
from broker.tools.options import ExamplesFormatter
from broker.tools.pair import HaSetup, add_ha_args, ha_setup
from broker.tools.process import NodeProcess
from broker.tools.scratch_db import fresh_database
import client
from client.errors import InvalidArgumentError, TandemError
from client.url import parse_url
from storage.base import DurabilityPolicy

PEERS = ("rabbitmq", "nats", "null-amqp")
SINGLE_NODE_PARTITIONS = 4  # --partitions by default for a single node
GROUP_PARTITIONS = 1  # ... and for a group: a queue declared with the defaults


def add_bench_parser(sub: Any) -> None:
    p = sub.add_parser(
        "bench", help="measure publish/consume throughput and confirm latency",
        description="Publish with confirms and consume with acks at the same time, check every message "
                    "arrived exactly once, then measure publish-to-confirm latency at a fixed rate. "
                    "Targets --url (a running node) or --spawn (a fresh local node in a temp dir; --nodes N "
                    "a replication group; --mode shared --database URL a shared-mode group on a fresh "
                    "database beside URL, dropped after; --arbiter lockfile|witness a replicated pair); "
                    "--compare-replicated N then runs the same workload on a spawned N-node replicated group; "
                    "--peer runs the same workload against the local RabbitMQ (quorum queue) and "
                    "NATS JetStream (file storage, R1) in the same run and prints the ratios; --peer null-amqp runs the "
                    "AMQP workload against a null AMQP server started for the run (confirms on receipt, stores "
                    "nothing): the most the aio-pika client can do on this machine. Each system's "
                    "server CPU per message is read from /proc: the spawned nodes, and the beam.smp or "
                    "nats-server processes listening on the peers' URLs on this machine (else n/a, with why).",
        epilog="examples:\n"
               "  tandem bench --spawn --nodes 2 --mode shared --database "
               "postgresql+psycopg://postgres@127.0.0.1:5432/postgres --compare-replicated 3\n"
               "  tandem bench --spawn --nodes 3 --peer rabbitmq --peer nats\n"
               "  tandem bench --spawn --nodes 3 --tls\n"
               "  tandem bench --spawn --nodes 3 --fanout 1,10,100 --topic-bindings 1000 --messages 10000 "
               "--peer rabbitmq\n"
               "  tandem bench --spawn --nodes 3 --transactions --tx-sizes 1,10,100",
        formatter_class=ExamplesFormatter)
    p.add_argument("--url", help="a running node, tandem://user:password@host:port")
    p.add_argument("--spawn", action="store_true", help="start a fresh node in a temp dir for the run")
    p.add_argument("--sync", default="SYNC", help="durability policy of the spawned node(s) (default SYNC)")
    p.add_argument("--nodes", type=int, default=1,
                   help="with --spawn: a replication group of this many nodes")
    p.add_argument("--remote-sync", dest="remote_sync", default=None,
                   help="with --spawn --nodes N: the replicas' durability policy (default: the node's default)")
    p.add_argument("--compare-remote-sync", dest="compare_remote_sync", default=None, metavar="POLICY",
                   help="with --spawn --nodes N: then run the same workload on a fresh group whose replicas "
                        "write POLICY, in the same run (e.g. WRITE_NO_SYNC against SYNC)")
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
    p.add_argument("--compare-replicated", dest="compare_replicated", type=int, metavar="NODES",
                   help="with --spawn: then also spawn a replicated group of NODES nodes and run the same "
                        "workload on it, in the same run (e.g. a shared-mode pair against 3 replicated "
                        "nodes); the table names each line's mode and gives the ratio")
    p.add_argument("--tls", action="store_true",
                   help="with --spawn: run the workload twice in the same run, on a plaintext group and then on "
                        "one with TLS on every link (tandems://, mutual TLS between nodes), and give TLS's cost "
                        "(a running node is measured over TLS when its --url is tandems://)")
    p.add_argument("--relayed", action="store_true",
                   help="Tandem's consumers connect to the URL's first node alone (a plain link) and get the "
                        "partitions active on the other members through its relays, instead of subscribing on "
                        "every member")
    p.add_argument("--amqp", action="store_true",
                   help="with --spawn: the spawned node(s) also serve AMQP 0-9-1, and the same workload runs "
                        "again through it with aio-pika (the RabbitMQ driver's code: persistent messages, "
                        "publisher confirms, acks); with --peer rabbitmq the ratio to RabbitMQ's quorum queue "
                        "is printed too")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_backlog_args(p)
    add_delayed_args(p)
    add_fanout_args(p)
    add_replay_args(p)
    add_transactions_args(p)
    add_ha_args(p)
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
    if args.backlog:
        return backlog_command(args)
    if args.delayed is not None:
        return delayed_command(args)
    if args.transactions:
        return transactions_command(args)
    if args.fanout or args.topic_bindings:
        return fanout_command(args)
    if args.stream_replay is not None:
        return replay_command(args)
    pair = args.mode != "replicated" or args.arbiter != "majority"
    if not args.spawn and (pair or args.database or args.lock or args.lockfile or args.compare_replicated):
        raise InvalidArgumentError("--mode, --arbiter and --compare-replicated set up groups the bench starts: "
                                   "add --spawn (a running group, --url, is measured as it is)")
    if not 1 <= args.nodes <= 9:
        raise InvalidArgumentError(f"--nodes {args.nodes}: a spawned group has 1 to 9 nodes")
    if (args.remote_sync or args.compare_remote_sync) and (not args.spawn or args.nodes < 2 or pair):
        raise InvalidArgumentError("--remote-sync and --compare-remote-sync set the replicas' policy of a "
                                   "replicated group the bench starts: give them with --spawn --nodes N")
    for policy in (args.remote_sync, args.compare_remote_sync):
        if policy:
            DurabilityPolicy.parse(policy)  # (a bad name stops here, with the choices)
    args.ha = ha_setup(args, args.nodes)
    if args.tls and (not args.spawn or args.compare_replicated or args.failover):
        raise InvalidArgumentError("--tls compares a spawned group with and without TLS: give it with --spawn "
                                   "(not --url: tandems:// in the URL measures a running node over TLS; not with "
                                   "--compare-replicated or --failover)")
    if args.compare_replicated is not None and not 1 <= args.compare_replicated <= 9:
        raise InvalidArgumentError(f"--compare-replicated {args.compare_replicated}: 1 to 9 nodes")
    args.partitions = _partitions(args)
    if args.failover:
        if pair or args.compare_replicated:
            raise InvalidArgumentError("--failover measures a replicated group; the failover of a shared-mode "
                                       "group or an arbitrated pair: tandem drill kill-active --mode shared ... "
                                       "(or --arbiter ...)")
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
    amqp: list[RunResult] | None = [] if args.amqp else None
    if args.spawn:
        runs.append(await _spawned(args, w, args.nodes, args.ha, amqp=amqp))
        if args.tls:
            runs.append(await _spawned(args, w, args.nodes, args.ha, tls=True))
        if args.compare_replicated is not None:
            runs.append(await _spawned(args, w, args.compare_replicated, HaSetup()))
        if args.compare_remote_sync is not None:
            runs.append(await _spawned(args, w, args.nodes, args.ha, remote_sync=args.compare_remote_sync))
    else:
        runs.append(await run_system(TandemDriver(args.url, "as configured on the node", relayed=args.relayed), w,
                                     servers=lambda: ServerProcs(reason="a running node (--url): its processes "
                                                                        "are not the bench's; use --spawn")))
    for peer in dict.fromkeys(args.peer):
        from broker.tools.bench import peers  # aio-pika and nats-py: the optional "bench" extra

        drv = (peers.RabbitMQDriver(args.rabbitmq_url, args.rabbitmq_nodes) if peer == "rabbitmq"
               else peers.NullAmqpDriver() if peer == "null-amqp"
               else peers.NatsDriver(args.nats_url, args.nats_replicas))
        runs.append(await run_system(drv, w, servers=drv.server_processes))
    runs[1:1] = amqp or []
    report = _report(runs, w)
    if args.tls:
        report["tls_cost"] = _tls_cost(runs[0], runs[1])
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_human(report)
    ok = all(r.error is None and r.lost == 0 and r.duplicated == 0 and r.unexpected == 0 for r in runs)
    return 0 if ok else 1


def _tls_cost(plain: RunResult, tls: RunResult) -> dict[str, float | None]:
    """How much throughput TLS takes, as a fraction of the plaintext run's (0.2: 20 % less)."""
    def cost(a: float, b: float) -> float | None:
        return round(1 - b / a, 3) if a and b else None

    return {"publish_per_s": cost(plain.publish_per_s, tls.publish_per_s),
            "consume_per_s": cost(plain.consume_per_s, tls.consume_per_s)}


async def _spawned(args: argparse.Namespace, w: Workload, nodes: int, ha: HaSetup, *,
                   tls: bool = False, remote_sync: str | None = None, amqp: list[RunResult] | None = None) -> RunResult:
    """Start a fresh group (one node, a replicated group, a shared-mode group on a database of
    its own, an arbitrated pair; with ``tls``, TLS on every link), run the workload on it, stop it.
    With ``amqp``, the nodes serve AMQP too and the workload runs through it (added to ``amqp``)."""
    remote = DurabilityPolicy.parse(remote_sync or args.remote_sync or NodeConfig().remote_sync.value).value
    mode = ha.label(nodes) + (", TLS" if tls else "") + (f", replicas {remote}" if nodes > 1 and not ha.shared
                                                          else "")
    if ha.shared:
        try:
            async with fresh_database(str(ha.database), "bench") as url:
                return await _spawned_on(args, w, nodes, dataclasses.replace(ha, database=url), tls=tls, mode=mode,
                                         remote=remote, amqp=amqp)
        except (TandemError, OSError) as exc:  # the database could not be made
            return RunResult(system="tandem", messages=w.messages, mode=mode,
                             error=f"{type(exc).__name__}: {exc}")
    return await _spawned_on(args, w, nodes, ha, tls=tls, mode=mode, remote=remote, amqp=amqp)


async def _spawned_on(args: argparse.Namespace, w: Workload, nodes: int, ha: HaSetup, *, tls: bool,
                      mode: str, remote: str, amqp: list[RunResult] | None) -> RunResult:
    node = None
    cluster = None
    with tempfile.TemporaryDirectory(prefix="tandem-bench-") as tmp:
        try:
            if nodes > 1:
                cluster = LocalCluster(Path(tmp), nodes=nodes, base_port=0, sync=args.sync, ha=ha, tls=tls,
                                       extra_args=["--remote-sync", remote], amqp=amqp is not None)
                await cluster.start()
                await cluster.wait_ready()
                url = cluster.url
                if not ha.shared:  # (as tandem cluster up leaves a new group: at this build's highest level)
                    await cluster.finalize()
                if ha.shared:
                    durability = f"{nodes}-node shared group: the lock holder commits to the one database " \
                                 f"({'PostgreSQL' if str(ha.database).startswith('postgresql') else 'SQLite'}), " \
                                 "others passive"
                else:
                    durability = f"{nodes}-node group: active {args.sync.upper()}, replicas {remote}, " \
                                 "quorum commit"
            else:
                tls_args: list[str] = []
                ca = None
                if tls:
                    certs = await asyncio.to_thread(make_dev_certs, Path(tmp) / "certs", ["node1"])
                    tls_args, ca = certs.node_args("node1"), certs.ca
                amqp_args = ["--amqp-port", str(free_ports(1)[0])] if amqp is not None else []
                node = await NodeProcess(Path(tmp) / "node1", sync=args.sync, extra_args=tls_args + amqp_args,
                                         ca=ca).start()
                url, durability = node.url, args.sync.upper()
                async with await client.connect_link(url) as conn:  # (as tandem cluster up --nodes 1 leaves it)
                    await conn.finalize_upgrade()

            def servers() -> ServerProcs:
                pids = [n.pid for n in cluster.processes.values()] if cluster is not None else \
                    [node.pid] if node is not None else []
                return ServerProcs(pids=tuple(pids), what=f"{len(pids)} spawned tandem node(s), pid(s) "
                                                          f"{', '.join(map(str, pids))}")

            result = await run_system(TandemDriver(url, durability, relayed=args.relayed), w, servers=servers,
                                      mode=mode + (", consumers on one node (relayed)" if args.relayed else ""))
            if amqp is not None:
                from broker.tools.bench.peers import TandemAmqpDriver  # aio-pika: the optional "bench" extra

                port = cluster.amqp_ports["node1"] if cluster is not None else int(amqp_args[1])
                drv = TandemAmqpDriver(f"amqp://admin:{parse_url(url).password}@127.0.0.1:{port}/", durability,
                                       servers)
                amqp.append(await run_system(drv, w, servers=servers, mode=mode))
            return result
        finally:
            if node is not None:
                await node.stop()
            if cluster is not None:
                await cluster.stop()


def ratio_key(r: RunResult) -> str:
    """How a run is named in the ratios: the peer's name, or Tandem with its mode."""
    return f"{r.system} ({r.mode})" if r.mode else r.system


def _report(runs: list[RunResult], w: Workload) -> dict[str, Any]:
    tandem = runs[0]
    ratios: dict[str, dict[str, float | None]] = {}
    for r in runs[1:]:
        ratios[r.system if r.system != tandem.system else ratio_key(r)] = {
            "publish_per_s": round(tandem.publish_per_s / r.publish_per_s, 2) if r.publish_per_s else None,
            "consume_per_s": round(tandem.consume_per_s / r.consume_per_s, 2) if r.consume_per_s else None,
        }
    by_system = {r.system: r for r in runs}
    rabbit = by_system.get("rabbitmq")
    for name in ("tandem-amqp", "null-amqp"):  # (the same aio-pika code against RabbitMQ)
        other = by_system.get(name)
        if other is not None and rabbit is not None:
            ratios[f"{name} / rabbitmq"] = {
                "publish_per_s": round(other.publish_per_s / rabbit.publish_per_s, 2) if rabbit.publish_per_s
                else None,
                "consume_per_s": round(other.consume_per_s / rabbit.consume_per_s, 2) if rabbit.consume_per_s
                else None,
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
    modes = [r.get("mode") or "-" for r in report["runs"]]
    mw = max(len("mode"), *(len(m) for m in modes))
    head = f"{'system':<10} {'mode':<{mw}} {'publish/s':>11} {'consume/s':>11} {'p50 ms':>8} {'p99 ms':>8} " \
           f"{'lost':>5} {'dup':>5} {'unexp':>5}  durability"
    print(head)
    for r, m in zip(report["runs"], modes):
        c = r["confirm_ms"] or {}
        print(f"{r['system']:<10} {m:<{mw}} {r['publish_per_s']:>11,.0f} {r['consume_per_s']:>11,.0f} "
              f"{c.get('p50', 0):>8.2f} {c.get('p99', 0):>8.2f} {r['lost']:>5} {r['duplicated']:>5} "
              f"{r['unexpected']:>5}  {r['durability']}")
        if r["error"]:
            print(f"  ! {r['system']}: {r['error']}")
    for r in report["runs"]:
        cpu = r.get("cpu_us_per_msg") or {}
        name = f"{r['system']} ({r['mode']})" if r.get("mode") else r["system"]
        if "client" in cpu:
            print(f"client CPU per message (us, throughput phase), {name}: {cpu['client']:,.1f}")
        srv, info = r.get("server_cpu_us_per_msg"), r.get("server_cpu") or {}
        if srv:
            phases = ", ".join(f"{k} {v:,.1f}" for k, v in srv.items())
            print(f"server CPU per message published and consumed (us), {name}: {phases}  "
                  f"[{info.get('processes')}]")
        elif info:
            print(f"server CPU per message (us), {name}: n/a ({info.get('reason')})")
    first = report["runs"][0] if report["runs"] else {}
    ours = f"tandem ({first['mode']})" if len(report["runs"]) > 1 and first.get("mode") and \
        any(r["system"] == "tandem" for r in report["runs"][1:]) else "tandem"
    cost = report.get("tls_cost")
    if cost:
        pub, con = cost["publish_per_s"], cost["consume_per_s"]
        print(f"TLS costs: publish {pub:.1%}, consume {con:.1%} of the plaintext run's throughput"
              if pub is not None and con is not None else "TLS costs: - (a run failed)")
    for peer, ratio in report["ratios"].items():
        pub, con = ratio["publish_per_s"], ratio["consume_per_s"]
        print(f"{peer if ' / ' in peer else f'{ours} / {peer}'}: publish x{pub if pub is not None else '-'}, "
              f"consume x{con if con is not None else '-'}")
