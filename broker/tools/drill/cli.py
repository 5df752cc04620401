"""``tandem drill``: its options, checked before anything starts."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from broker.config import DurabilityPolicy
from broker.tools.drill.model import SCENARIOS, DrillConfig, RunResult
from broker.tools.drill.report import progress_line, report_text
from broker.tools.drill.run import drill
from client.errors import InvalidArgumentError


def add_parser(sub: Any) -> None:
    """``drill`` under the ``tandem`` parser."""
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

    def progress(r: RunResult) -> None:
        print(progress_line(r), file=sys.stderr)

    rep = asyncio.run(drill(cfg, args.repeat, progress=progress))
    print(json.dumps(rep) if args.json else report_text(rep))
    return 0 if rep["passed"] else 1
