"""The ``tandem`` command.

    tandem broker start   run a node
    tandem produce        publish messages (confirmed) from arguments or stdin
    tandem consume        consume (and ack) messages
    tandem queues         list, declare, delete or purge queues
    tandem bench          throughput and latency, side by side with RabbitMQ and NATS

Every client command takes ``--url tandem://user:password@host:port`` (or
``TANDEM_URL``) and ``--json``.  Errors print one line and exit non-zero;
nothing prints a traceback for bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import shutil
import signal
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from client.errors import InvalidArgumentError, TandemError

DEFAULT_URL = "tandem://admin@127.0.0.1:7780"


def run_async(coro: Coroutine[Any, Any, int]) -> int:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)-7s %(name)s %(message)s",
        stream=sys.stderr,
    )


# -- broker start -----------------------------------------------------------------------------


def _broker_start(args: argparse.Namespace) -> int:
    from broker.config import build_config, load_toml

    values: dict[str, Any] = load_toml(Path(args.config)) if args.config else {}
    for key in ("name", "data_dir", "host", "port", "sync", "max_message_size", "max_frame_size", "heartbeat",
                "peer_port", "peers", "priority", "votes", "quorum_policy", "keepalive_interval",
                "non_response_timeout", "remote_sync", "replicas", "sync_replicas", "designated_primary",
                "advertise", "http_port", "producer_expiry", "log_segment_size", "ack_linger", "failback_after"):
        v = getattr(args, key)
        if v is not None:
            values[key] = v
    config = build_config(values)
    return run_async(_serve(config))


async def _serve(config: Any) -> int:
    from broker.node import Node

    from webconsole.app import Console

    node = Node(config, console=Console)
    await node.start()
    if os.environ.get("TANDEM_GC_FREEZE", "1") != "0":
        # What start-up made (modules, SQLAlchemy, the schema, ...) lives as long as the
        # process: out of the collector's way, a full collection scans only what came
        # later (~60k objects fewer: full-collection pauses ~55 -> ~5 ms on a test node).
        gc.freeze()
    host, port = node.address
    pw_file = node.data_path / "admin-password"
    print(f"Tandem node {config.name} is up", flush=True)
    print(f"  client URL : tandem://admin@{host}:{port}", flush=True)
    print(f"  data       : {node.data_path / config.db_path.name} (sync={config.sync.value})", flush=True)
    if node.console is not None:
        print(f"  console    : {node.console.url}", flush=True)
    if pw_file.exists():
        print(f"  admin pass : {pw_file}", flush=True)
    print("  stop with Ctrl-C or SIGTERM", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    logging.getLogger("tandem.broker").info("signal received: shutting down")
    await node.stop()
    return 0


# -- cluster up ---------------------------------------------------------------------------------


def _cluster_up(args: argparse.Namespace) -> int:
    return run_async(_run_cluster(args))


async def _run_cluster(args: argparse.Namespace) -> int:
    from broker.cluster import LocalCluster

    extra = ["--remote-sync", args.remote_sync] if args.remote_sync else []
    cluster = LocalCluster(Path(args.data_dir), nodes=args.nodes, base_port=args.base_port, sync=args.sync,
                           extra_args=extra)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"starting {args.nodes} node(s) in {args.data_dir} ...", flush=True)
    try:
        await cluster.start()
        await cluster.wait_ready()
        print(f"Tandem group of {args.nodes} node(s) is up (quorum reached)", flush=True)
        for name, p in cluster.nodes.items():
            print(f"  {name:6} client {p.host}:{p.address[1] if p.address else p.port}  peer "
                  f"{cluster.peer_ports[name]}  log {p.log_path}", flush=True)
        hosts = cluster.url.split("@", 1)[1]
        print(f"  client URL : tandem://admin@{hosts}", flush=True)
        print(f"  console    : {cluster.console_url(next(iter(cluster.nodes)))} (any node's port +2 serves it)",
              flush=True)
        pw = Path(args.data_dir) / "admin-password"
        print(f"  admin pass : {pw if pw.exists() else 'from TANDEM_ADMIN_PASSWORD'}", flush=True)
        print("  status     : tandem status --url tandem://admin:PASSWORD@" + hosts.split(",")[0], flush=True)
        print("  stop with Ctrl-C", flush=True)
        done = asyncio.ensure_future(stop.wait())
        died = [asyncio.ensure_future(p.proc.wait()) for p in cluster.nodes.values() if p.proc is not None]
        await asyncio.wait([done, *died], return_when=asyncio.FIRST_COMPLETED)
        if not stop.is_set():
            dead = [n for n, p in cluster.nodes.items() if p.proc is not None and p.proc.returncode is not None]
            print(f"node(s) {', '.join(dead)} exited: stopping the group (see their logs)", file=sys.stderr)
        for t in (done, *died):
            t.cancel()
    finally:
        print("stopping the group ...", flush=True)
        await cluster.stop()
    return 0 if stop.is_set() else 1


# -- parser ------------------------------------------------------------------------------------


def _url_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=os.environ.get("TANDEM_URL", DEFAULT_URL),
                   help="broker URL, tandem://user:password@host:port (env TANDEM_URL; "
                        "the password may also come from TANDEM_PASSWORD)")
    p.add_argument("--json", action="store_true", help="machine-readable output, one JSON document")


def build_parser() -> argparse.ArgumentParser:
    from broker import commands

    parser = argparse.ArgumentParser(prog="tandem", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log-level", default=os.environ.get("TANDEM_LOG_LEVEL", "INFO"),
                        help="DEBUG, INFO, WARNING or ERROR (default INFO)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    broker = sub.add_parser("broker", help="run a broker node")
    bsub = broker.add_subparsers(dest="broker_command", required=True, metavar="ACTION")
    start = bsub.add_parser("start", help="start a node in the foreground",
                            description="Start a Tandem node. Settings come from --config (TOML) and are "
                                        "overridden by flags. The first start creates user 'admin' with the "
                                        "password in TANDEM_ADMIN_PASSWORD, or a random one written to "
                                        "<data-dir>/admin-password.")
    start.add_argument("--config", help="TOML file with the settings below (flags win)")
    start.add_argument("--name", help="node name (default node1)")
    start.add_argument("--data-dir", dest="data_dir", help="where the node keeps its store (default .tandem/node1)")
    start.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    start.add_argument("--port", type=int, help="client port (default 7780; 0 = any free port)")
    start.add_argument("--sync", help="durability policy: SYNC (fsync before confirm, default), "
                                      "WRITE_NO_SYNC (written to the OS), NO_SYNC (confirm at once)")
    start.add_argument("--max-message-size", dest="max_message_size", type=int, help="bytes (default 5 MiB)")
    start.add_argument("--max-frame-size", dest="max_frame_size", type=int, help="bytes (default 8 MiB)")
    start.add_argument("--heartbeat", type=float, help="seconds between heartbeats (default 10)")
    start.add_argument("--http-port", dest="http_port", type=int,
                       help="serve the management console and admin REST API on this port (0 = any free "
                            "port; default: not served)")
    start.add_argument("--producer-expiry", dest="producer_expiry", type=float,
                       help="seconds a producer may stay idle before its sequences are forgotten "
                            "(default 86400: a resend later than that is stored again)")
    start.add_argument("--advertise", help="HOST:PORT clients are told to reach this node at, when not "
                                           "where it listens (NAT, proxies; default: where it listens)")
    group = start.add_argument_group("replication group (leave out for a single node)")
    group.add_argument("--peer-port", dest="peer_port", type=int, help="port for node <-> node links")
    group.add_argument("--peer", dest="peers", action="append", metavar="NAME=HOST:PORT",
                       help="another member of the group (repeat for each)")
    group.add_argument("--priority", type=int, help="0 never active, 1 normal (default), 2 high, 3 highest")
    group.add_argument("--votes", type=int, help="votes this node carries in quorum (default 1)")
    group.add_argument("--quorum-policy", dest="quorum_policy",
                       help="majority (default), percentage:P, min_votes:N or disabled")
    group.add_argument("--keepalive-interval", dest="keepalive_interval", type=float,
                       help="seconds between keep-alives on peer links (default 0.25)")
    group.add_argument("--non-response-timeout", dest="non_response_timeout", type=float,
                       help="seconds of silence before a peer is Down (default 1.0)")
    group.add_argument("--remote-sync", dest="remote_sync",
                       help="how replicas write what the active ships: SYNC, WRITE_NO_SYNC (default), NO_SYNC")
    group.add_argument("--replicas", type=int, help="copies of each partition besides its active (default 2)")
    group.add_argument("--sync-replicas", dest="sync_replicas", type=int,
                       help="how many of the replicas vote and count for commits (default 2; others async)")
    group.add_argument("--log-segment-size", dest="log_segment_size", type=int, metavar="BYTES",
                       help="size a file of the replication log grows to before the next is started; "
                            "space is reclaimed a whole file at a time (default 64 MiB)")
    group.add_argument("--ack-linger", dest="ack_linger", type=float, metavar="SECONDS",
                       help="how long an ack may wait to travel in its partition's next log entry instead "
                            "of one of its own (default 0.01; 0: at once). Longer saves CPU; an ack not yet "
                            "committed when the active dies means its message is delivered again")
    group.add_argument("--failback-after", dest="failback_after", type=float, metavar="SECONDS",
                       help="failback: a partition's placed active that is back, caught up and answering for "
                            "this long takes the partition over again (default 5; 0: never). The hand-over "
                            "holds the partition's writes for a moment, like a failover, without losing any")
    group.add_argument("--designated-primary", dest="designated_primary", action="store_const", const=True,
                       help="two-node group: this node goes on alone when its peer is gone")
    start.set_defaults(func=_broker_start)

    produce = sub.add_parser("produce", help="publish messages with confirms",
                             description="Publish each BODY argument (or each line of stdin when no BODY is "
                                         "given) to QUEUE and wait for the broker's confirms.")
    produce.add_argument("queue")
    produce.add_argument("bodies", nargs="*", metavar="BODY")
    produce.add_argument("--key", help="message key (selects the partition)")
    produce.add_argument("--header", action="append", default=[], metavar="K=V", help="header, repeatable")
    produce.add_argument("--declare", type=int, metavar="PARTITIONS",
                         help="declare the queue first with this many partitions")
    _url_args(produce)
    produce.set_defaults(func=commands.produce)

    consume = sub.add_parser("consume", help="consume and ack messages",
                             description="Consume from QUEUE, print each message, ack it.")
    consume.add_argument("queue")
    consume.add_argument("-n", "--count", type=int, default=0, help="stop after N messages (0 = run until Ctrl-C)")
    consume.add_argument("--timeout", type=float, default=0.0,
                         help="stop when no message came for this many seconds (0 = wait forever)")
    consume.add_argument("--prefetch", type=int, default=256)
    consume.add_argument("--no-ack", action="store_true", help="nack with requeue instead of ack")
    _url_args(consume)
    consume.set_defaults(func=commands.consume)

    queues = sub.add_parser("queues", help="list (default), declare, delete or purge queues")
    queues.add_argument("action", nargs="?", default="list", choices=["list", "declare", "delete", "purge"])
    queues.add_argument("name", nargs="?")
    queues.add_argument("--partitions", type=int, default=1)
    queues.add_argument("--mapper", default="consistent_hash", choices=["consistent_hash", "round_robin"])
    queues.add_argument("--max-deliveries", dest="max_deliveries", type=int, default=0)
    queues.add_argument("--dead-letter-queue", dest="dead_letter_queue")
    queues.add_argument("--max-length", dest="max_length", type=int, default=0)
    _url_args(queues)
    queues.set_defaults(func=commands.queues)

    st = sub.add_parser("status", help="the node, its replication group and quorum",
                        description="Show the node's identity, the state of every other member of its "
                                    "replication group (Up, Down, ...) and its node quorum state.")
    _url_args(st)
    st.set_defaults(func=commands.status)

    adm = sub.add_parser("admin", help="operator overrides (logged loudly)")
    asub = adm.add_subparsers(dest="admin_command", required=True, metavar="ACTION")
    qo = asub.add_parser("set-quorum-override",
                         help="keep node quorum with at least N members up (or 'none' to clear)",
                         description="Temporary operator override of the node quorum policy, e.g. to restore "
                                     "service from one surviving node of three. Takes effect at once and is "
                                     "logged loudly; clear it with 'none' when the group is whole again.")
    qo.add_argument("value", metavar="N|none")
    _url_args(qo)
    qo.set_defaults(func=commands.admin)
    sp = asub.add_parser("set-priority", help="this node's election priority, at once",
                         description="Change the election priority of the node --url points at: 0 never active, "
                                     "1 normal, 2 high, 3 highest. Used by the next elections; logged loudly.")
    sp.add_argument("value", metavar="0|1|2|3")
    _url_args(sp)
    sp.set_defaults(func=commands.admin)
    dp = asub.add_parser("set-designated-primary", help="two-node group: let this node go on alone (on|off)",
                         description="In a two-node group neither node has a majority alone. Turning this on for "
                                     "the node --url points at lets it keep (or take) every partition when its "
                                     "peer is gone. Only one of the two may have it; logged loudly.")
    dp.add_argument("value", metavar="on|off")
    _url_args(dp)
    dp.set_defaults(func=commands.admin)

    con = sub.add_parser("console", help="print the management console's address of a running node",
                         description="Ask the node at --url for its management console (served on its "
                                     "--http-port; every node of a group shows the whole group) and print the "
                                     "address. Log in there with a Tandem user.")
    _url_args(con)
    con.set_defaults(func=commands.console)

    cl = sub.add_parser("cluster", help="run a local replication group")
    clsub = cl.add_subparsers(dest="cluster_command", required=True, metavar="ACTION")
    up = clsub.add_parser("up", help="start N node processes on this machine and wait for quorum",
                          description="Start a local replication group: node i listens on BASE+10*(i-1) for "
                                      "clients, +1 for peer links, +2 for HTTP; data in DATA_DIR/node<i>. "
                                      "Prints the client URL listing every node; Ctrl-C stops them all. All "
                                      "nodes share one admin password: TANDEM_ADMIN_PASSWORD, else a random "
                                      "one in DATA_DIR/admin-password.")
    up.add_argument("--nodes", type=int, default=3, help="how many nodes (default 3)")
    up.add_argument("--base-port", dest="base_port", type=int, default=7780, help="default 7780")
    up.add_argument("--data-dir", dest="data_dir", default=".tandem", help="default .tandem")
    up.add_argument("--sync", default="SYNC", help="the actives' durability policy (default SYNC)")
    up.add_argument("--remote-sync", dest="remote_sync", help="the replicas' policy (default WRITE_NO_SYNC)")
    up.set_defaults(func=_cluster_up)

    add_drill_parser(sub)
    from broker.bench.cli import add_bench_parser
    add_bench_parser(sub)
    return parser


def add_drill_parser(sub: Any) -> None:
    from broker.drill import SCENARIOS

    d = sub.add_parser(
        "drill", help="failover drill: inject a fault under load and check every message",
        description="Start a fresh local group (for every run), run producers and consumers with confirms "
                    "and acks on durable connections, inject the fault once a third of the messages are "
                    "confirmed, heal, drain, and classify every message: ok, lost (confirmed, never "
                    "consumed), duplicated (stored twice), redelivered (delivered again after a failover: "
                    "allowed), unexpected (consumed, never sent). Exit status 0 only when every run passed. "
                    "Scenarios: kill-active (kill -9 the node active for most partitions, then restart it), "
                    "kill-replica (kill -9 a priority-0 node, a replica of every partition), pause-active "
                    "(SIGSTOP for 2 x non_response_timeout + 1 s), partition-active (cut its peer and client "
                    "links with fault-injecting proxies for as long), restart-all (kill -9 every node, start "
                    "them again), rolling-restart (stop and start each node in turn, waiting for catch-up), "
                    "slow-disk (the fsyncs of every node but that one stall for as long, through strace: "
                    "no partition may change its active).")
    d.add_argument("scenario", choices=SCENARIOS, metavar="SCENARIO", help=" | ".join(SCENARIOS))
    d.add_argument("--spawn", action="store_true",
                   help="start a fresh group on this machine for every run (the default)")
    d.add_argument("--url", help="drill a running group instead (with --inject and --heal: the drill cannot "
                                 "reach its nodes' processes itself); its own queue drill-<random>")
    d.add_argument("--inject", help="with --url: shell command injecting the fault; {node} is replaced by the "
                                    "node active for most partitions (e.g. \"ssh {node} sudo systemctl kill -s "
                                    "KILL tandem\")")
    d.add_argument("--heal", help="with --url: shell command healing it (e.g. \"ssh {node} sudo systemctl start "
                                  "tandem\")")
    d.add_argument("--hold", type=float, default=5.0, help="with --url: seconds between inject and heal "
                                                           "(default 5)")
    d.add_argument("--nodes", type=int, default=3, help="group size (default 3)")
    d.add_argument("--partitions", type=int, default=6, help="partitions of the drill queue (default 6)")
    d.add_argument("--producers", type=int, default=2, help="default 2")
    d.add_argument("--consumers", type=int, default=2, help="default 2")
    d.add_argument("--messages", type=int, default=3000, help="messages per run, all producers (default 3000)")
    d.add_argument("--repeat", type=int, default=1, help="runs (default 1)")
    d.add_argument("--seed", type=int, default=1, help="makes the schedule (keys, interleaving) reproducible")
    d.add_argument("--local-sync", dest="local_sync", default="SYNC", help="the actives' policy (default SYNC)")
    d.add_argument("--remote-sync", dest="remote_sync", default="WRITE_NO_SYNC",
                   help="the replicas' policy (default WRITE_NO_SYNC)")
    d.add_argument("--non-response-timeout", dest="non_response_timeout", type=float,
                   help="the nodes' failure detection (default: the node default, 1 s)")
    d.add_argument("--timeout", type=float, default=180.0, help="seconds per run (default 180)")
    d.add_argument("--json", action="store_true", help="one JSON object on stdout (progress per run on stderr)")
    d.set_defaults(func=_drill)


def _ptrace_scope() -> int:
    """Linux's Yama ptrace_scope (0: a process may trace any of its user's; 1 and up: not
    its siblings, which the drill's strace is to the nodes); 0 where there is no Yama."""
    try:
        return int(Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip())
    except (OSError, ValueError):
        return 0


def _drill(args: argparse.Namespace) -> int:
    import json

    from broker.config import DurabilityPolicy
    from broker.drill import DrillConfig, drill, progress_line, report_text

    for name in ("nodes", "partitions", "producers", "consumers", "messages", "repeat"):
        if getattr(args, name) < 1:
            raise InvalidArgumentError(f"--{name.replace('_', '-')} must be >= 1")
    if args.nodes < 2:
        raise InvalidArgumentError("--nodes: a drill needs a group of at least 2 nodes")
    local = DurabilityPolicy.parse(args.local_sync).value
    remote = DurabilityPolicy.parse(args.remote_sync).value
    if args.url and args.spawn:
        raise InvalidArgumentError("--spawn and --url: choose one")
    if args.url and not (args.inject and args.heal):
        raise InvalidArgumentError("--url needs --inject and --heal: the drill cannot reach a running group's "
                                   "processes itself (see docs/drills.md)")
    if (args.inject or args.heal) and not args.url:
        raise InvalidArgumentError("--inject and --heal go with --url (a spawned group's faults are the drill's own)")
    if args.hold < 0:
        raise InvalidArgumentError("--hold must be >= 0")
    if args.scenario == "slow-disk":
        if args.url:
            raise InvalidArgumentError("slow-disk runs on a group the drill starts (it stalls the nodes' fsyncs "
                                       "itself and checks that no active moved): drop --url")
        if shutil.which("strace") is None:
            raise InvalidArgumentError("slow-disk stalls the nodes' fsyncs with strace, which is not installed "
                                       "(Debian: apt-get install strace)")
        scope = _ptrace_scope()
        if os.geteuid() != 0 and scope > 0:
            raise InvalidArgumentError(f"slow-disk traces the nodes with strace, which ptrace_scope {scope} "
                                       "(/proc/sys/kernel/yama) allows only to root")
    cfg = DrillConfig(args.scenario, nodes=args.nodes, partitions=args.partitions, producers=args.producers,
                      consumers=args.consumers, messages=args.messages, seed=args.seed, local_sync=local,
                      remote_sync=remote, non_response_timeout=args.non_response_timeout, timeout=args.timeout,
                      url=args.url, inject=args.inject, heal=args.heal, hold=args.hold)

    def progress(r: object) -> None:
        print(progress_line(r), file=sys.stderr)  # type: ignore[arg-type]

    rep = asyncio.run(drill(cfg, args.repeat, progress=progress))
    print(json.dumps(rep) if args.json else report_text(rep))
    return 0 if rep["passed"] else 1


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.log_level)
    try:
        return int(args.func(args) or 0)
    except TandemError as exc:
        print(f"tandem: error: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (`tandem consume ... | head`): nothing more to say, to anyone
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except OSError as exc:
        print(f"tandem: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
