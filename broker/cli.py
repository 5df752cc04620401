"""The ``tandem`` command.

    tandem broker start   run a node
    tandem cluster up     run a local replication group of N nodes
    tandem produce        publish messages (confirmed) from arguments or stdin
    tandem consume        consume (and ack) messages
    tandem queues         list, declare, delete or purge queues
    tandem status         a node's view of its replication group
    tandem drill          inject a fault under load and check every message
    tandem bench          throughput and latency, side by side with RabbitMQ and NATS
    tandem load           a locust load test, or the soak (an hour of load with a kill every 10 min)
    tandem witness start  run a two-node group's witness (a data-less third vote)
    tandem certs dev      a throwaway CA and node certificates for TLS on one machine
    tandem secret new     make a group secret file (peer authentication)
    tandem node drain     move every active off a member for maintenance (undrain: back)
    tandem partition      move a partition, add partitions to a queue, re-map its messages (update)
    tandem group          add a member to a running group, or remove one
    tandem restore        merge back what a split brain's heal discarded (HA-1014, the quarantine)

Every client command takes ``--url tandem://user:password@host:port`` (or
``TANDEM_URL``; ``tandems://...?ca=CA.pem`` for a node that speaks TLS) and ``--json``.  Errors print one line and exit non-zero;
nothing prints a traceback for bad input.  Client commands log warnings and errors
only; ``-v`` or ``--log-level`` shows more.  Nodes log at INFO.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import logging
import os
import signal
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker.node import heap
from broker.config import NodeConfig, build_config, load_toml, redact_url
from broker.logsafe import EscapingFormatter
from client.errors import TandemError

if TYPE_CHECKING:
    from broker.node.node import Node
    from webconsole.app import Console
    from webconsole.nodeview import NodeView

#: how much a command logs unless -v, --log-level or TANDEM_LOG_LEVEL say otherwise
CLIENT_LOG_LEVEL = "WARNING"
NODE_LOG_LEVEL = "INFO"


def run_async(coro: Coroutine[Any, Any, int]) -> int:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def setup_logging(level: str) -> None:
    """One line per record on stderr, control characters escaped (broker.logsafe)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(EscapingFormatter("%(asctime)s %(levelname)-7s %(name)s %(message)s"))
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), handlers=[handler])


def log_level(args: argparse.Namespace) -> str:
    """--log-level, else -v (INFO; -vv DEBUG), else TANDEM_LOG_LEVEL, else the command's own."""
    if args.log_level:
        return str(args.log_level)
    if args.verbose:
        return "DEBUG" if args.verbose > 1 else "INFO"
    return os.environ.get("TANDEM_LOG_LEVEL") or args.default_log_level


# -- broker start -----------------------------------------------------------------------------


def _broker_start(args: argparse.Namespace) -> Coroutine[Any, Any, int]:
    values: dict[str, Any] = load_toml(Path(args.config)) if args.config else {}
    for key in ("name", "data_dir", "host", "port", "sync", "max_message_size", "max_frame_size", "heartbeat",
                "peer_port", "peers", "priority", "votes", "quorum_policy", "keepalive_interval",
                "non_response_timeout", "remote_sync", "replicas", "sync_replicas", "zones", "availability_zones",
                "designated_primary",
                "join", "seeds",
                "advertise", "http_port", "amqp_port", "producer_expiry", "transaction_timeout", "log_segment_size", "ack_linger", "failback_after",
                "objects_locked_per_transaction", "compensation", "weak_hold_bytes", "arbiter", "lockfile", "witness", "lease", "mode", "database", "lock", "tls_cert", "tls_key",
                "tls_ca", "peer_tls", "max_connections_per_user", "max_prefetch", "max_failed_logins",
                "login_timeout", "max_connections",
                "cluster_secret_file", "permitted_nodes", "disk_free_limit", "max_memory"):
        v = getattr(args, key)
        if v is not None:
            values[key] = v
    config = build_config(values)
    return _serve(config)


def banner(config: NodeConfig, address: tuple[str, int], data_path: Path, console: str | None) -> str:
    """What a node prints once it is up: its client URL (the line ``broker.tools.process``
    reads), its data, its console, where the admin password is, and how to stop it."""
    host, port = address
    scheme = "tandems" if config.tls_cert is not None else "tandem"
    lines = [f"Tandem node {config.name} is up", f"  client URL : {scheme}://admin@{host}:{port}"]
    if config.mode == "shared":
        lines.append(f"  database   : {redact_url(config.database or '')} (shared mode, sync={config.sync.value})")
    else:
        lines.append(f"  data       : {data_path / config.db_path.name} (sync={config.sync.value})")
    if console is not None:
        lines.append(f"  console    : {console}")
    if (pw_file := data_path / "admin-password").exists():
        lines.append(f"  admin pass : {pw_file}")
    lines.append("  stop with Ctrl-C or SIGTERM")
    return "\n".join(lines) + "\n"


def _quiet_resets(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The loop's handler of errors nobody handled: a connection the other end reset or broke
    leaves its error in the stream's close future, which asyncio reports as "never retrieved"
    when the garbage collector frees the future before its protocol (a client gone, a peer
    stopping at the same time): that is said at DEBUG; everything else as asyncio says it."""
    exc = context.get("exception")
    if context.get("message") == "Future exception was never retrieved" and \
            isinstance(exc, (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)):
        logging.getLogger("tandem.broker").debug("a connection's end, never awaited: %r", exc)
        return
    loop.default_exception_handler(context)


async def _serve(config: NodeConfig) -> int:
    from broker.node.node import Node  # the node and its console: only for the command that runs one

    asyncio.get_running_loop().set_exception_handler(_quiet_resets)
    heap.limit_arenas()  # before the node's threads (broker/node/heap.py)
    node = Node(config, console=console_of)
    await node.start()
    if os.environ.get("TANDEM_GC_FREEZE", "1") != "0":
        # What start-up made (modules, SQLAlchemy, the schema, ...) lives as long as the
        # process: out of the collector's way, a full collection scans only what came
        # later (~60k objects fewer: full-collection pauses ~55 -> ~5 ms on a test node).
        gc.freeze()
    # SIGTERM and SIGINT stop the node cleanly from the moment it says it is up (a supervisor
    # may stop it as soon as it has read that)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # one write: a log line from another thread (on stderr, often the same pipe) cannot land
    # inside the banner, whose client URL line supervisors and the test tools read
    sys.stdout.write(banner(config, node.address, node.store.data_path,
                            node.console.url if node.console is not None else None))
    sys.stdout.flush()
    signalled = asyncio.ensure_future(stop.wait())
    stopped = asyncio.ensure_future(node.stopped.wait())
    trimming = asyncio.ensure_future(_trim_heap(node))
    await asyncio.wait([signalled, stopped], return_when=asyncio.FIRST_COMPLETED)
    signalled.cancel()
    stopped.cancel()
    trimming.cancel()
    if not stop.is_set():
        # the node stopped itself (a fatal error, logged above): the process goes too, with a
        # failure status, so that a supervisor restarts it rather than keep a node serving nothing
        logging.getLogger("tandem.broker").critical("node %s stopped on a fatal error: exiting", config.name)
        return 1
    logging.getLogger("tandem.broker").info("signal received: shutting down")
    return 0 if await node.stop() else 1  # (a stop that did not finish says why, above)


def console_of(node: Node) -> Console:
    """The console the entry point attaches to ``node`` (started by the node, with it)."""
    from webconsole.app import Console

    return Console(console_view(node))


def console_view(node: Node) -> NodeView:
    """What the console of ``node`` is handed (webconsole.nodeview): the node as its small
    views, and the parts of it that do the operations."""
    from webconsole.nodeview import NodeView

    from broker.node.parts import Meters

    ops = node.ops
    return NodeView(node=node.services, report=node.report, changes=node.placing, state=node.services,
                    options=node.options, meters=Meters(node.store, node.catalogue, node.publisher), guard=node.guard,
                    security=node.security, drains=ops.drains, moves=ops.moves, remaps=ops.remaps,
                    restores=ops.restores, group=ops.group, levels=ops.levels, topology=ops.topology)


async def _trim_heap(node: Any) -> None:
    """Once a minute hand the process's free heap memory back to the system, off the event
    loop (broker/node/heap.py)."""
    while True:
        await node.clock.sleep(heap.TRIM_EVERY)
        await asyncio.to_thread(heap.trim)


# -- parser ------------------------------------------------------------------------------------


def _log_args(p: argparse.ArgumentParser, default: str | None) -> None:
    """-v and --log-level, on the top parser (``default`` None) and on each command
    (``argparse.SUPPRESS``: a command's own leaves what the top parser read alone)."""
    p.add_argument("-v", "--verbose", action="count", default=default,
                   help="log more: -v INFO, -vv DEBUG")
    p.add_argument("--log-level", dest="log_level", default=default,
                   help=f"DEBUG, INFO, WARNING or ERROR (env TANDEM_LOG_LEVEL; default {CLIENT_LOG_LEVEL} for "
                        f"client commands, {NODE_LOG_LEVEL} for nodes)")


#: the module that adds each group of commands, and the function that adds them: a command
#: imports its own module only (a client command starts in half the time), ``tandem --help``
#: and an unknown command all of them
TOOLS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("broker.tools.commands", "add_parsers", ("produce", "consume", "queues", "console")),
    ("broker.tools.exchange_cli", "add_parsers", ("exchanges", "bind", "unbind")),
    ("broker.tools.stream_cli", "add_parsers", ("streams",)),
    ("broker.tools.status", "add_parsers", ("status", "admin")),
    ("broker.tools.users_cli", "add_parsers", ("users", "acl")),
    ("broker.tools.node_cli", "add_parser", ("node",)),
    ("broker.tools.partition_cli", "add_parser", ("partition",)),
    ("broker.tools.group_cli", "add_parser", ("group",)),
    ("broker.tools.restore_cli", "add_parser", ("restore",)),
    ("broker.tools.upgrade_cli", "add_parser", ("upgrade",)),
    ("broker.tools.cluster_up", "add_parser", ("cluster",)),
    ("broker.tools.drill.cli", "add_parser", ("drill",)),
    ("broker.tools.bench.cli", "add_bench_parser", ("bench",)),
    ("broker.tools.load", "add_parser", ("load",)),
    ("broker.tools.witness_cli", "add_parser", ("witness",)),
    ("broker.tools.certs", "add_parser", ("certs",)),
    ("broker.tools.secret_cli", "add_parser", ("secret",)),
    ("broker.tools.scrub_cli", "add_parser", ("scrub",)),
)


def command_of(argv: list[str]) -> str | None:
    """The command ``argv`` names when it begins with it (None: it begins with an option)."""
    return argv[0] if argv and not argv[0].startswith("-") else None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or, given ``command`` (command_of), of that one alone
    where it is known: an unknown one gets every command, for argparse to list."""
    parser = argparse.ArgumentParser(prog="tandem", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    _log_args(parser, None)
    parser.set_defaults(default_log_level=CLIENT_LOG_LEVEL)
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
    start.add_argument("--amqp-port", dest="amqp_port", type=int,
                       help="serve AMQP 0-9-1 clients (pika, aio-pika, kombu) on this port (0 = any free port; "
                            "default: not served; docs/amqp.md)")
    start.add_argument("--producer-expiry", dest="producer_expiry", type=float,
                       help="seconds a producer may stay idle before its sequences are forgotten "
                            "(default 86400: a resend later than that is stored again)")
    start.add_argument("--transaction-timeout", dest="transaction_timeout", type=float,
                       help="seconds a transaction may stay open before the partitions it wrote to abort it "
                            "(default 60)")
    start.add_argument("--disk-free-limit", dest="disk_free_limit", metavar="BYTES",
                       help="the disk alarm: while the data dir's file system has less free space than this "
                            "(a number of bytes, or with a K, M or G suffix) the node refuses publishes and "
                            "declares with UNAVAILABLE until space is freed (default 64M; 0: no alarm)")
    start.add_argument("--max-memory", dest="max_memory", metavar="BYTES",
                       help="bytes of ready messages the node holds in memory (a number, or with a K, M or G "
                            "suffix), split over its partitions; the rest of a backlog stays in the store and "
                            "is read back as consumers take it (default 256M; 0: no bound)")
    start.add_argument("--advertise", help="HOST:PORT clients are told to reach this node at, when not "
                                           "where it listens (NAT, proxies; default: where it listens)")
    group = start.add_argument_group("replication group (leave out for a single node)")
    group.add_argument("--peer-port", dest="peer_port", type=int, help="port for node <-> node links")
    group.add_argument("--peer", dest="peers", action="append", metavar="NAME=HOST:PORT",
                       help="another member of the group (repeat for each)")
    group.add_argument("--seed", dest="seeds", action="append", metavar="HOST:PORT",
                       help="the peer port of any member, its name not needed (repeat for more): a --join node "
                            "finds the group by it, and any member asks it for the address of a member it has "
                            "none for. Members also pass their addresses on to each other")
    group.add_argument("--priority", type=int, help="0 never active, 1 normal (default), 2 high, 3 highest")
    group.add_argument("--votes", type=int, help="votes this node carries in quorum (default 1)")
    group.add_argument("--quorum-policy", dest="quorum_policy",
                       help="majority (default), percentage:P, min_votes:N or disabled")
    group.add_argument("--keepalive-interval", dest="keepalive_interval", type=float,
                       help="seconds between keep-alives on peer links (default 0.25)")
    group.add_argument("--non-response-timeout", dest="non_response_timeout", type=float,
                       help="seconds of silence before a peer is Down (default 1.0)")
    group.add_argument("--remote-sync", dest="remote_sync",
                       help="how replicas write what the active ships: SYNC (default), WRITE_NO_SYNC, NO_SYNC")
    group.add_argument("--replicas", type=int, help="copies of each partition besides its active (default 2)")
    group.add_argument("--sync-replicas", dest="sync_replicas", type=int,
                       help="how many of the replicas vote and count for commits (default 2; others async)")
    group.add_argument("--zone", dest="zones", action="append", metavar="NAME=ZONE",
                       help="a member's zone (rack, data centre), for every member and this node, the same "
                            "on each (repeat for each): a partition's copies go to distinct zones, so losing a "
                            "whole zone leaves every partition a majority (default: no zones)")
    group.add_argument("--availability-zone", dest="availability_zones", action="append",
                       metavar="NAME=MEMBER,MEMBER,...[:POLICY]",
                       help="members that give each other quorum under POLICY (majority by default; as "
                            "--quorum-policy), besides the group's (repeat for each; a node may be in several): "
                            "this node goes Disabled, its HA services off and its partitions handed to other "
                            "nodes, while any zone it is in lacks quorum (default: none)")
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
    group.add_argument("--objects-locked-per-transaction", dest="objects_locked_per_transaction", type=int,
                       metavar="N", help="a partition's snapshot goes to a new or lagging replica in parts of at "
                                         "most N messages (and 4 MiB), each read in a transaction of its own, so "
                                         "the active does not stop for a large partition (default 1000)")
    group.add_argument("--weak-hold-bytes", dest="weak_hold_bytes", metavar="BYTES",
                       help="per partition, an active under a weak override (quorum override, designated "
                            "primary) takes publishes that no majority holds up to this much (a number, or with a "
                            "K, M or G suffix) and refuses the next ones (retry), keeping what it wrote in its log "
                            "so that a heal can compare it and quarantine what it discards; it costs that much "
                            "memory per partition written (default 256M)")
    group.add_argument("--compensation", metavar="NAME",
                       help="a restore run by the group (admin API, console) asks this hook, an installed entry "
                            "point of tandem.compensation, what to do with each key conflict (docs/operations.md; "
                            "install it on every member; default: restore the message beside the queue's own)")
    group.add_argument("--designated-primary", dest="designated_primary", action="store_const", const=True,
                       help="two-node group: this node goes on alone when its peer is gone")
    group.add_argument("--join", dest="join", action="store_const", const=True,
                       help="a new member of a running group (after `tandem group add NAME=HOST:PEER_PORT` on it): "
                            "on its first start it takes the group's state from the members --peer names, or "
                            "those it finds by --seed")
    sec = start.add_argument_group("peer authentication (docs/security.md)")
    sec.add_argument("--cluster-secret-file", dest="cluster_secret_file", metavar="PATH",
                     help="the group secret (`tandem secret new PATH` makes one; the same file on every member "
                          "and the witness): each peer link proves it before anything else is accepted. A group "
                          "member needs it, unless its peer links use mutual TLS")
    sec.add_argument("--permitted-node", dest="permitted_nodes", action="append", metavar="NAME[@HOST]",
                     help="a member allowed on the peer port, from anywhere (NAME) or only from HOST's address "
                          "(NAME@HOST); repeat for each. Default: every --peer, from anywhere")
    pair = start.add_argument_group("two-node groups and shared mode (docs/shared-mode.md)")
    pair.add_argument("--arbiter", choices=("majority", "lockfile", "witness"),
                      help="who decides which of two nodes is active: majority (the votes; default), "
                           "lockfile (the holder of --lockfile) or witness (--witness, a data-less third vote)")
    pair.add_argument("--lockfile", metavar="PATH", help="--arbiter lockfile: a lock file both nodes reach "
                                                         "(on a third, gateway machine)")
    pair.add_argument("--witness", metavar="NAME=HOST:PORT", help="--arbiter witness: the group's witness "
                                                                  "(tandem witness start)")
    pair.add_argument("--lease", type=float, metavar="SECONDS",
                      help="how long a lock or lease holder may go without a confirmed renewal before it "
                           "stops serving (default 1.0); a failover takes about this long")
    pair.add_argument("--mode", choices=("replicated", "shared"),
                      help="replicated (each node its own store; default) or shared (one database for the "
                           "group, the lock holder active)")
    pair.add_argument("--database", metavar="URL", help="--mode shared: postgresql+psycopg://USER@HOST:PORT/DB, "
                                                       "or sqlite:///PATH for nodes on one machine")
    pair.add_argument("--lock", metavar="database|file:PATH",
                      help="--mode shared: database (a lease row in the database; default) or file:PATH")
    sec = start.add_argument_group("TLS (docs/security.md)")
    sec.add_argument("--tls-cert", dest="tls_cert", metavar="PEM",
                     help="this node's certificate (with --tls-key): the client port, the peer links and the "
                          "console speak TLS only (clients use tandems://, the console https://)")
    sec.add_argument("--tls-key", dest="tls_key", metavar="PEM", help="the private key of --tls-cert")
    sec.add_argument("--tls-ca", dest="tls_ca", metavar="PEM",
                     help="the CA certificate the members' certificates are signed by; peer links check "
                          "each other's against it (needed for TLS on peer links)")
    sec.add_argument("--peer-tls", dest="peer_tls", choices=("auto", "on", "off"),
                     help="TLS on peer links: auto (on when --tls-cert is given; default), on, or off "
                          "(plaintext replication, logged as a warning)")
    limits = start.add_argument_group("limits against abuse (docs/security.md)")
    limits.add_argument("--max-connections", dest="max_connections", type=int, metavar="N",
                        help="client connections this node holds at once (default 10000); at the limit a "
                             "new connection takes the slot of the oldest one that has not logged in, or "
                             "is refused with UNAVAILABLE when every one has")
    limits.add_argument("--max-connections-per-user", dest="max_connections_per_user", type=int, metavar="N",
                        help="client connections one user may hold on this node (default 1000); "
                             "more are refused with TOO_MANY_CONNECTIONS")
    limits.add_argument("--max-prefetch", dest="max_prefetch", type=int, metavar="N",
                        help="the largest prefetch a consumer may ask for, 1..65535 (default 10000); "
                             "a Subscribe above it is refused with PREFETCH_TOO_LARGE")
    limits.add_argument("--max-failed-logins", dest="max_failed_logins", type=int, metavar="N",
                        help="failed logins from one client address before it must wait (1 s, doubling "
                             "per further failure, up to 30 s) between attempts (default 5)")
    limits.add_argument("--login-timeout", dest="login_timeout", type=float, metavar="SECONDS",
                        help="seconds a client connection has from connect to a finished login, whatever "
                             "it sends meanwhile (default 10); then it is closed")
    start.set_defaults(func=_broker_start, default_log_level=NODE_LOG_LEVEL)

    known = command == "broker" or any(command in names for _, _, names in TOOLS)
    for module, adder, names in TOOLS:
        if not known or command in names:
            getattr(importlib.import_module(module), adder)(sub)
    for name, command_parser in sub.choices.items():
        _log_args(command_parser, argparse.SUPPRESS)
        if name == "cluster":
            command_parser.set_defaults(default_log_level=NODE_LOG_LEVEL)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(command_of(argv))
    args = parser.parse_args(argv)
    setup_logging(log_level(args))
    try:
        # a command returns its exit status, or the coroutine that computes it
        out = args.func(args)
        return int(run_async(out) if asyncio.iscoroutine(out) else out or 0)
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
