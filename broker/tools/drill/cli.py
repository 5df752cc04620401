"""``tandem drill``: its options, checked before anything starts."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from broker.config import DurabilityPolicy
from broker.tools.drill.families import families, load_families
from broker.tools.drill.jepsen import default_out, jepsen, verdict_line
from broker.tools.drill.model import SCENARIOS, WORKLOADS, DrillConfig, RunResult
from broker.tools.drill.report import progress_line, report_text
from broker.tools.drill.diskfaults import missing
from broker.tools.drill.run import check_family, drill
from broker.tools.options import ExamplesFormatter
from broker.tools.pair import HaSetup, add_ha_args, ha_setup
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
                    "them again), rolling-restart (stop and start each node in turn, waiting for catch-up), rolling-upgrade (the group "
                    "starts on an older build, --from REF or --from-venv PATH, each node is stopped and started on "
                    "this build in turn with its data dir, waiting for catch-up, then tandem upgrade finalize; "
                    "with --rollback each node goes back to the older build instead; every step's tandem upgrade "
                    "status --json is in the report), "
                    "slow-disk (the fsyncs of every node but that one stall for as long, through strace: "
                    "no partition may change its active). Disk faults (root; every node's data dir on powerfs, "
                    "a FUSE file system that can forget what was not fsynced, or on a small tmpfs): power-loss "
                    "(kill -9 the node active for most partitions, roll its disk back to its last fsync, start it "
                    "again), torn-write (the same with its last writes torn at a sector: each file keeps a prefix of "
                    "what it wrote since its last fsync; it must start, cut off a torn log record and say so), "
                    "power-loss-all (every node at once, restarted in a seeded random order with 0-5 s "
                    "gaps, printed as the run's fault line), disk-full (the target's tmpfs filled to ENOSPC for "
                    "the hold: confirms may fail, none may be lost; the node keeps serving behind its disk alarm "
                    "or stops on the ENOSPC line and is started again once the space is freed, the schedule "
                    "says which), disk-error (every "
                    "write and fsync of a priority-0 replica fails with EIO for the hold), fsync-error (every fsync of "
                    "the node active for most partitions fails with EIO, its writes succeed: it must stop at the "
                    "first, never retry it, and come back once restarted), lying-fsync (every fsync of that node "
                    "answers success and syncs nothing, then its power is cut: it comes back without entries it "
                    "acknowledged; nothing confirmed may be lost, and the actives must name what it lost), "
                    "lost-write (the next write to that node's replication log is acknowledged and never made, "
                    "leaving a hole; at the heal it is killed and started again: it must find the hole, catch up "
                    "from the group, and lose nothing confirmed), misdirected-write (the same, its bytes landing "
                    "sectors before their place, over records written earlier), bad-sector (kill -9 that node, make "
                    "a sector of its newest log segment unreadable, start it again: it must name the unreadable "
                    "bytes, read on past them and catch up from the group), reordered-write (kill -9 that node and "
                    "keep any of the sectors each file wrote since its last fsync, as a disk that writes them out "
                    "of order: a hole in its log must be said, and it must catch up; reordered-write-all cuts "
                    "every node's power); torn-write-two, fsync-error-two, "
                    "lying-fsync-two, lost-write-two, misdirected-write-two, bad-sector-two and reordered-write-two do the "
                    "same to two "
                    "nodes, a majority of three (the second's fsyncs fail, or its write is lost, once the first's "
                    "have; lying-fsync-two cuts their power and bad-sector-two damages the second one after the "
                    "other). "
                    "Storage faults: bit-flip (kill -9 "
                    "a node, flip one bit in a log record with records after it, one in a stored chunk of "
                    "messages and one in a producer's stored position, and lose a write to its store (a chunk row "
                    "gone), start it again: it must find all four, catch up from the group, and never deliver a "
                    "damaged body; the schedule says injected, detected and repaired), bit-flip-two (the same on "
                    "two nodes at once, a majority of three, each one's store damage in partitions the other's "
                    "spares), stale-store (kill -9 a node and put one partition's rows of its store back as they "
                    "were some writes earlier, its copy, its applied position or its settlements and delivery "
                    "counts, as a lost write leaves them: it must name the partition and catch up from the group), "
                    "stale-acks (the same, always its settlements and delivery counts: acks and nacks undone), "
                    "stale-store-two and stale-acks-two (those on two nodes at once). "
                    "Two-node setups (kill-active and pause-active): "
                    "--mode shared --database URL (the node whose status says ha_state ACTIVE is the target; "
                    "each run on a fresh database beside URL, dropped after), --arbiter lockfile (the lock "
                    "holder is the target; the lock file in the run's directory) and --arbiter witness (a "
                    "witness process beside the pair; the node active for most partitions is the target); "
                    "--nodes defaults to 2 for them, and pause-active holds for at least 2 x the lease + 1 s and "
                    "until the other node serves (then SIGCONT: the woken node must write nothing). "
                    "Network faults (each node in a network namespace of its own, --net netns, their default; "
                    "root; links cut by iptables DROP rules by peer address, the drill's clients never cut; "
                    "held 5 s, flap 8 s, or --hold): isolate-active (the node active for most partitions cut off "
                    "from its peers), partition (a random minority cut off from the majority), bridge (two halves "
                    "that cannot see each other, one node seeing both), one-way (that node hears its peers but is "
                    "not heard), one-way-reverse (it is heard but does not hear), flap (a random node isolated "
                    "for 1-2 s, then the next, for the hold), loss (every node drops --loss of its peers' "
                    "packets). "
                    "Reported per run: the longest wait for a confirm, and the time from the fault to the "
                    "first confirm on the new active; after a network fault also the time from the heal until "
                    "every node reports every peer Up, and how many partitions whose active was on a node the "
                    "fault never cut changed their active or term after the heal (deposed; isolate-active and "
                    "partition fail on any). Fault families run once under load the same way "
                    "(tandem drill FAMILY, held for --hold): kill, pause, clock (root: every node's wall clock "
                    "skewed by libfaketime, seconds to hours either way, some jumping while it holds; its "
                    "monotonic clock offset in a time namespace of its own), and the network and disk families "
                    "where installed. jepsen: one group, producers at about --rate messages/s for --time seconds, "
                    "the --faults families injected and healed one at a time on a schedule made from --seed "
                    "(printed on stderr as it runs), then drain and check; the results JSON goes to --out and "
                    "the last line says 'lost N of M confirmed, unexpected U, duplicated D' (also counted: "
                    "reordered, first deliveries out of their producer's order in a partition).",
        epilog="examples:\n"
               "  tandem drill kill-active --mode shared --database "
               "postgresql+psycopg://postgres@127.0.0.1:5432/postgres --runs 20\n"
               "  tandem drill pause-active --arbiter lockfile --runs 20\n"
               "  tandem drill kill-active --arbiter witness --runs 20\n"
               "  tandem drill power-loss-all --runs 10\n"
               "  tandem drill isolate-active --runs 10 --json\n"
               "  tandem drill loss --loss 0.3 --hold 10\n"
               "  tandem drill clock --runs 5\n"
               "  tandem drill jepsen --faults partition,one-way,bridge,flap,loss,clock,kill,pause,disk-full,"
               "power-loss,power-loss-all --time 300 --rate 500 --seed 7",
        formatter_class=ExamplesFormatter)
    scenarios = [*SCENARIOS, *sorted(load_families()), "jepsen"]
    d.add_argument("scenario", choices=scenarios, metavar="SCENARIO",
                   help=" | ".join(scenarios) + ": a scenario above, a fault family run once under load (held for "
                        "--hold), or jepsen: the families of --faults on a seeded random schedule (docs/drills.md)")
    d.add_argument("--faults", help="jepsen: the fault families, comma-separated (e.g. kill,pause,clock)")
    d.add_argument("--time", type=float, default=300.0,
                   help="jepsen: seconds of load and faults before the drain (default 300)")
    d.add_argument("--rate", type=float, default=500.0,
                   help="jepsen and rolling-upgrade: messages a second over all producers, about, sent until the "
                        "faults are over (default 500)")
    d.add_argument("--out", help="jepsen: the results JSON (default: jepsen-seed<SEED>-<UTC time>.json here)")
    d.add_argument("--spawn", action="store_true",
                   help="start a fresh group on this machine for every run (the default)")
    d.add_argument("--url", help="drill a running group instead (with --inject and --heal: the drill cannot "
                                 "reach its nodes' processes itself); its own queue drill-<random>")
    d.add_argument("--inject", help="with --url: shell command injecting the fault; {node} is replaced by the "
                                    "node active for most partitions (e.g. \"ssh {node} sudo systemctl kill -s "
                                    "KILL tandem\")")
    d.add_argument("--heal", help="with --url: shell command healing it (e.g. \"ssh {node} sudo systemctl start "
                                  "tandem\")")
    d.add_argument("--hold", type=float, help="seconds between inject and heal: with --url (default 5), and "
                                              "for a spawned group's pause-active and partition-active (default "
                                              "2 x non_response_timeout + 1 s, at least 2 x the lease + 1 s in "
                                              "shared mode and under the LockFile arbiter), and for the fault families (the "
                                              "network faults 5 s, flap 8 s; the others as pause-active)")
    d.add_argument("--net", choices=("proxy", "netns"),
                   help="the spawned group's network: proxy (the nodes on this machine's loopback; partition-active "
                        "cuts them through fault-injecting proxies; the default) or netns (each node in a network "
                        "namespace of its own, on a bridge: root; the default and only choice for the network "
                        "faults)")
    d.add_argument("--loss", type=float, default=0.2,
                   help="loss: the share of its peers' packets each node drops (default 0.2)")
    d.add_argument("--nodes", type=int, help="group size (default 3; 2 with --mode shared or --arbiter)")
    d.add_argument("--partitions", type=int, default=6, help="partitions of the drill queue (default 6)")
    d.add_argument("--producers", type=int, default=2, help="default 2")
    d.add_argument("--consumers", type=int, default=2, help="default 2")
    d.add_argument("--messages", type=int, default=3000, help="messages per run, all producers (default 3000)")
    d.add_argument("--runs", "--repeat", dest="repeat", type=int, default=1, help="runs (default 1)")
    d.add_argument("--seed", type=int, default=1,
                   help="makes the schedule (keys, interleaving; jepsen: its faults) reproducible")
    d.add_argument("--local-sync", dest="local_sync", default="SYNC", help="the actives' policy (default SYNC)")
    d.add_argument("--remote-sync", dest="remote_sync", default="SYNC",
                   help="the replicas' policy (default SYNC)")
    d.add_argument("--non-response-timeout", dest="non_response_timeout", type=float,
                   help="the nodes' failure detection (default: the node default, 1 s)")
    d.add_argument("--timeout", type=float, default=180.0, help="seconds per run (default 180)")
    d.add_argument("--tls", action="store_true",
                   help="TLS on every link of the spawned group: clients on tandems://, mutual TLS between the "
                        "nodes (a running group, --url, is drilled over TLS when its URL is tandems://)")
    d.add_argument("--from", dest="from_ref", metavar="REF",
                   help="rolling-upgrade: the older build the group starts on, a git ref of this repository "
                        "(exported and made into a venv under ~/.cache/tandem-builds, once per commit)")
    d.add_argument("--from-venv", dest="from_venv", metavar="PATH",
                   help="rolling-upgrade: the older build the group starts on, a venv with it installed")
    d.add_argument("--rollback", action="store_true",
                   help="rolling-upgrade: once every node runs this build, put each back on the older one "
                        "instead of finalizing")
    d.add_argument("--hold-after", dest="hold_after", type=int, default=1, metavar="N",
                   help="rolling-upgrade with --upgrade-hold: hold the group once N nodes run this build (1 of 3: a "
                        "minority upgraded; 2: a majority; default 1)")
    d.add_argument("--upgrade-hold", dest="upgrade_hold", type=float, default=0.0, metavar="S",
                   help="rolling-upgrade: seconds the half-upgraded group runs under the load before the next node "
                        "(default 0)")
    d.add_argument("--workload", choices=WORKLOADS, default="plain",
                   help="plain (default): producers and consumers of one queue; transactional: each consumer "
                        "turns inputs into outputs on a second queue, its publishes and acks in one transaction "
                        "per batch, and the checker also checks each transaction all or nothing")
    d.add_argument("--json", action="store_true", help="one JSON object on stdout (progress per run on stderr)")
    add_ha_args(d)
    d.set_defaults(func=_drill)


def _ptrace_scope() -> int:
    """Linux's Yama ptrace_scope (0: a process may trace any of its user's; 1 and up: not
    its siblings, which the drill's strace is to the nodes); 0 where there is no Yama."""
    try:
        return int(Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip())
    except (OSError, ValueError):
        return 0


#: the scenarios a shared-mode group or an arbitrated pair is drilled with
PAIR_SCENARIOS = ("kill-active", "pause-active")


def _ha(args: argparse.Namespace) -> HaSetup:
    """The drilled group's HA setup; --nodes filled in (2 for a pair or a shared group)."""
    pair = args.mode != "replicated" or args.arbiter != "majority"
    if args.nodes is None:
        args.nodes = 2 if pair else 3
    if not pair:
        if args.database or args.lock or args.lockfile or args.lease is not None:
            ha_setup(args, args.nodes)  # names the flag that needs another
        return HaSetup()
    if args.url:
        raise InvalidArgumentError("--mode and --arbiter set up a group the drill starts; a running group (--url) "
                                   "is drilled with the setup it has")
    if args.scenario not in PAIR_SCENARIOS:
        what = "--mode shared" if args.mode == "shared" else f"--arbiter {args.arbiter}"
        raise InvalidArgumentError(f"{what}: the drills are {' and '.join(PAIR_SCENARIOS)}, not {args.scenario}")
    return ha_setup(args, args.nodes)


def _drill(args: argparse.Namespace) -> int:
    ha = _ha(args)
    for name in ("nodes", "partitions", "producers", "consumers", "messages", "repeat"):
        if getattr(args, name) < 1:
            flag = "runs" if name == "repeat" else name
            raise InvalidArgumentError(f"--{flag} must be >= 1")
    if args.nodes < 2:
        raise InvalidArgumentError("--nodes: a drill needs a group of at least 2 nodes")
    local = DurabilityPolicy.parse(args.local_sync).value
    remote = DurabilityPolicy.parse(args.remote_sync).value
    if args.url and args.spawn:
        raise InvalidArgumentError("--spawn and --url: choose one")
    if args.url and args.tls:
        raise InvalidArgumentError("--tls sets up the group the drill starts; a running group (--url) is drilled "
                                   "over TLS when its URL is tandems://")
    if args.url and not (args.inject and args.heal):
        raise InvalidArgumentError("--url needs --inject and --heal: the drill cannot reach a running group's "
                                   "processes itself (see docs/drills.md)")
    if (args.inject or args.heal) and not args.url:
        raise InvalidArgumentError("--inject and --heal go with --url (a spawned group's faults are the drill's own)")
    if args.hold is not None and args.hold < 0:
        raise InvalidArgumentError("--hold must be >= 0")
    upgrade = args.from_ref or args.from_venv or args.rollback or args.upgrade_hold
    if args.scenario == "rolling-upgrade":
        if bool(args.from_ref) == bool(args.from_venv):
            raise InvalidArgumentError("rolling-upgrade: give the build to upgrade from, --from REF or --from-venv "
                                       "PATH (one of them)")
        if args.url or args.tls:
            raise InvalidArgumentError("rolling-upgrade starts its own group, without TLS: drop --url and --tls")
        if args.upgrade_hold < 0 or not 1 <= args.hold_after < (args.nodes or 3):
            raise InvalidArgumentError(f"--upgrade-hold: seconds >= 0; --hold-after: 1 .. {(args.nodes or 3) - 1} "
                                       f"(nodes upgraded when the group is held)")
    elif upgrade:
        raise InvalidArgumentError("--from, --from-venv, --rollback and --upgrade-hold go with the rolling-upgrade "
                                   "drill")
    if args.scenario == "jepsen":
        return _jepsen(args)
    if args.faults or args.out:
        raise InvalidArgumentError("--faults and --out go with the jepsen drill")
    held = ("pause-active", "partition-active", *load_families())
    if args.hold is not None and not args.url and args.scenario not in held:
        raise InvalidArgumentError(f"--hold: {args.scenario} has no fault that lasts (pause-active, "
                                   "partition-active and the fault families have, and a running group's "
                                   "--inject/--heal)")
    fams = load_families()
    if args.scenario in fams and args.url:
        raise InvalidArgumentError(f"{args.scenario} runs on a group the drill starts (it sets up the nodes' disks, "
                                   "network or clocks itself): drop --url")
    if args.scenario in fams and (why := missing(fams[args.scenario].needs)) is not None:
        raise InvalidArgumentError(f"{args.scenario} cannot run here: {why}")
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
                      url=args.url, inject=args.inject, heal=args.heal, hold=args.hold, ha=ha, tls=args.tls,
                      net=args.net, loss=args.loss, from_ref=args.from_ref, from_venv=args.from_venv,
                      rollback=args.rollback, hold_after=args.hold_after, upgrade_hold=args.upgrade_hold,
                      steady_rate=args.rate if args.scenario == "rolling-upgrade" else None,
                      workload=args.workload)
    if args.workload == "transactional" and args.scenario == "rolling-upgrade":
        raise InvalidArgumentError("rolling-upgrade starts on an older build, which may have no transactions: "
                                   "--workload plain")
    check_family(cfg)

    def progress(r: RunResult) -> None:
        print(progress_line(r), file=sys.stderr)

    rep = _until_stopped(drill(cfg, args.repeat, progress=progress))
    print(json.dumps(rep) if args.json else report_text(rep))
    return 0 if rep["passed"] else 1


class _Stopped(Exception):
    """SIGTERM stopped a drill (after it undid what it had set up)."""


def _until_stopped(work: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
    """Run a drill to its end.  SIGTERM stops it as Ctrl-C does: the run is cancelled, and what it
    started (nodes, mounts, namespaces, rules) is undone on the way out; the command then exits
    with status 143, saying so."""
    async def main() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        stopped = False

        def stop() -> None:
            nonlocal stopped
            stopped = True
            task.cancel()
        loop.add_signal_handler(signal.SIGTERM, stop)
        try:
            return await work
        except asyncio.CancelledError:
            if stopped:
                raise _Stopped() from None
            raise
        finally:
            loop.remove_signal_handler(signal.SIGTERM)
    try:
        return asyncio.run(main())
    except _Stopped:
        print("tandem drill: stopped by SIGTERM; the nodes, mounts and rules it had set up are undone",
              file=sys.stderr)
        raise SystemExit(143) from None


def _jepsen(args: argparse.Namespace) -> int:
    """``tandem drill jepsen``: the schedule on stderr as it runs, the verdict line on stdout
    (the results JSON with --json too), exit status 0 only when it passed."""
    if args.url or args.inject or args.heal:
        raise InvalidArgumentError("jepsen starts a group of its own: drop --url, --inject and --heal")
    if args.repeat != 1:
        raise InvalidArgumentError("jepsen makes one long run: drop --runs (--time sets its length)")
    if args.hold is not None:
        raise InvalidArgumentError("--hold: jepsen's faults hold for what its schedule says (1 to 10 s each)")
    if not args.faults:
        raise InvalidArgumentError("jepsen needs --faults FAMILY,... (known: "
                                   f"{', '.join(sorted(load_families()))})")
    names = [n.strip() for n in args.faults.split(",") if n.strip()]
    families(names)
    if args.time <= 0 or args.rate <= 0:
        raise InvalidArgumentError("--time and --rate must be > 0")
    cfg = DrillConfig("jepsen", nodes=args.nodes, partitions=args.partitions, producers=args.producers,
                      consumers=args.consumers, messages=max(3, int(args.time * args.rate)), seed=args.seed,
                      local_sync=DurabilityPolicy.parse(args.local_sync).value,
                      remote_sync=DurabilityPolicy.parse(args.remote_sync).value,
                      non_response_timeout=args.non_response_timeout, timeout=args.timeout, tls=args.tls,
                      workload=args.workload)
    out = Path(args.out) if args.out else default_out(args.seed)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    rep = _until_stopped(jepsen(cfg, names, args.time, args.rate, say=say, out=out))
    say(f"jepsen: results in {out}")
    if args.json:
        print(json.dumps(rep))
    print(verdict_line(rep))
    return 0 if rep.get("passed") else 1
