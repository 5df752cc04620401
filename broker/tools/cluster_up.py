"""``tandem cluster up``: a local replication group in the foreground.

By default a replicated group; ``--mode shared --database URL`` makes every node use the one
database (the lock holder active, the others passive), and ``--arbiter lockfile`` or
``--arbiter witness`` makes a replicated pair (``--nodes 2``) arbitrated by a lock file or by
a witness process started beside the nodes (:class:`~broker.tools.pair.HaSetup`).

It starts the nodes (:class:`~broker.tools.cluster.LocalCluster`: every node and the witness
prove the group secret in ``DATA_DIR/cluster.secret``, made on the first run and kept), waits
for a quorum, prints where everything is, then watches the node processes.  A node that exits or is
killed (the witness too) is named once, with how it ended; the others keep serving, and it
is started again after ``--restart-delay`` seconds (doubled, up to :data:`RESTART_CAP`, while it keeps
dying within :data:`STEADY` seconds of its start).  Each node's pid is in
``DATA_DIR/node<i>.pid`` while it runs.  SIGINT (Ctrl-C) or SIGTERM stops every node.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from broker.config import redact_url
from broker.tools.cluster import LocalCluster
from broker.tools.options import ExamplesFormatter
from broker.tools.pair import HaSetup, add_ha_args, ha_setup
from broker.tools.process import NodeProcess, NodeStartError
from broker.tools.witness_process import WitnessProcess
import client
from client.clock import SYSTEM_CLOCK, Clock
from client.errors import InvalidArgumentError, TandemError

RESTART_DELAY = 2.0
RESTART_CAP = 30.0
#: a node that ran this long before it died is restarted after the first delay again
STEADY = 30.0


def add_parser(sub: Any) -> None:
    """``cluster up`` under the ``tandem`` parser."""
    cl = sub.add_parser("cluster", help="run a local replication group")
    clsub = cl.add_subparsers(dest="cluster_command", required=True, metavar="ACTION")
    up = clsub.add_parser("up", help="start N node processes on this machine and wait for quorum",
                          description="Start a local replication group: node i listens on BASE+10*(i-1) for "
                                      "clients, +1 for peer links, +2 for HTTP; data in DATA_DIR/node<i>, its "
                                      "log in DATA_DIR/node<i>.log, its pid in DATA_DIR/node<i>.pid. Prints the "
                                      "client URL listing every node. A node that exits or is killed is "
                                      "started again after --restart-delay seconds while the others keep "
                                      "serving; Ctrl-C stops them all. All nodes share one admin password: "
                                      "TANDEM_ADMIN_PASSWORD, else a random one in DATA_DIR/admin-password; and "
                                      "one group secret, DATA_DIR/cluster.secret (made on the first run, kept "
                                      "for the next: peer authentication, docs/security.md). "
                                      "Two-node setups (docs/shared-mode.md): --mode shared --database URL (every "
                                      "node on the one database; the lock holder is ACTIVE for every partition, "
                                      "the others PASSIVE), --arbiter lockfile (a replicated pair, the holder of "
                                      "--lockfile serves) and --arbiter witness (a replicated pair plus a witness "
                                      "process w1 as the third vote, peer port BASE+10*N+1, supervised like the "
                                      "nodes).",
                          epilog="examples:\n"
                                 "  tandem cluster up --nodes 2 --mode shared --database "
                                 "postgresql+psycopg://postgres@127.0.0.1:5432/tandem\n"
                                 "  tandem cluster up --nodes 2 --mode shared --database "
                                 "sqlite:///$PWD/.tandem/shared.db\n"
                                 "  tandem cluster up --nodes 2 --arbiter lockfile --lockfile "
                                 "/mnt/gateway/tandem.lock\n"
                                 "  tandem cluster up --nodes 2 --arbiter witness\n"
                                 "  tandem cluster up --nodes 5 --zones a,b,c --data-dir .tandem-zones",
                          formatter_class=ExamplesFormatter)
    up.add_argument("--nodes", type=int, default=3, help="how many nodes (default 3)")
    up.add_argument("--base-port", dest="base_port", type=int, default=7780, help="default 7780")
    up.add_argument("--data-dir", dest="data_dir", default=".tandem", help="default .tandem")
    up.add_argument("--sync", default="SYNC", help="the actives' durability policy (default SYNC)")
    up.add_argument("--remote-sync", dest="remote_sync", help="the replicas' policy (default SYNC)")
    up.add_argument("--restart-delay", dest="restart_delay", type=float, default=RESTART_DELAY,
                    metavar="SECONDS", help=f"start a node that died again after this long (default "
                                            f"{RESTART_DELAY:g}; doubled while it keeps dying; 0: leave it down)")
    up.add_argument("--tls", action="store_true",
                    help="TLS on every link: a throwaway CA and node certificates in DATA_DIR/certs (tandem certs "
                         "dev), client URL tandems://...?ca=DATA_DIR/certs/ca.crt, the console on https://")
    up.add_argument("--zones", metavar="A,B,C",
                    help="zone labels dealt to the nodes in turn (node1 a, node2 b, node3 c, node4 a, ...): each "
                         "partition's copies go to distinct zones (default: no zones)")
    add_ha_args(up)
    up.set_defaults(func=cluster_up)


def cluster_up(args: argparse.Namespace) -> Coroutine[Any, Any, int]:
    if args.restart_delay < 0:
        raise InvalidArgumentError("--restart-delay must be >= 0")
    if not 1 <= args.nodes <= 9:
        raise InvalidArgumentError(f"--nodes {args.nodes}: a local group has 1 to 9 nodes")
    args.ha = ha_setup(args, args.nodes)
    if args.zones is not None and args.ha.shared:
        raise InvalidArgumentError("--zones: not with --mode shared (one database holds every message; there are "
                                   "no copies to spread)")
    args.zone_args = zone_args(args.zones, args.nodes)
    return _run(args)


def zone_args(zones: str | None, nodes: int) -> list[str]:
    """``--zone nodeI=Z`` for each node, the labels of ``zones`` ("a,b,c") dealt in turn."""
    if zones is None:
        return []
    labels = [z.strip() for z in zones.split(",")]
    if not all(labels) or len(set(labels)) != len(labels):
        raise InvalidArgumentError(f"--zones {zones!r}: distinct labels separated by commas, e.g. a,b,c")
    if nodes < 2:
        raise InvalidArgumentError("--zones: only for a group (--nodes 2 or more)")
    return [a for i in range(1, nodes + 1) for a in ("--zone", f"node{i}={labels[(i - 1) % len(labels)]}")]


def how_it_ended(code: int) -> str:
    """'killed by SIGKILL', 'exited with status 1', ..."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


def _say(line: str) -> None:
    print(line, flush=True)


class Supervisor:
    """Brings back the nodes of a running group that die, one watch per node."""

    def __init__(self, cluster: LocalCluster, *, restart_delay: float = RESTART_DELAY,
                 clock: Clock = SYSTEM_CLOCK, say: Callable[[str], None] = _say) -> None:
        self.cluster = cluster
        self.restart_delay = restart_delay
        self.clock = clock
        self.say = say

    def pid_path(self, name: str) -> Path:
        return self.cluster.data_dir / f"{name}.pid"

    def write_pid(self, p: NodeProcess | WitnessProcess) -> None:
        self.pid_path(p.name).write_text(f"{p.pid}\n")

    def remove_pids(self) -> None:
        for name in self.cluster.processes:
            self.pid_path(name).unlink(missing_ok=True)

    async def watch(self, name: str) -> None:
        """Until cancelled: wait for the node (or witness) to die, say so, start it again."""
        p = self.cluster.processes[name]
        delay = self.restart_delay
        while True:
            up_since = self.clock.monotonic()
            code = await p.wait()
            self.pid_path(name).unlink(missing_ok=True)
            if self.restart_delay <= 0:
                self.say(f"{name} {how_it_ended(code)}; the others keep serving (--restart-delay 0: "
                         f"it stays down; log {p.log_path})")
                return
            if self.clock.monotonic() - up_since >= STEADY:
                delay = self.restart_delay
            again = "" if delay == self.restart_delay else f" (it keeps dying: waiting {delay:g} s)"
            self.say(f"{name} {how_it_ended(code)}; the others keep serving; starting it again in {delay:g} s"
                     f"{again} (log {p.log_path})")
            while True:
                await self.clock.sleep(delay)  # the restart delay itself: not a wait for a state
                delay = min(delay * 2, RESTART_CAP)
                try:
                    await p.start()
                    break
                except NodeStartError as exc:
                    reason = str(exc).splitlines()[0]
                    self.say(f"{reason}; trying again in {delay:g} s (log {p.log_path})")
            self.write_pid(p)
            self.say(f"{name} is back (pid {p.pid})")


async def _run(args: argparse.Namespace) -> int:
    extra = ["--remote-sync", args.remote_sync] if args.remote_sync else []
    extra += getattr(args, "zone_args", [])
    cluster = LocalCluster(Path(args.data_dir), nodes=args.nodes, base_port=args.base_port, sync=args.sync,
                           extra_args=extra, ha=args.ha, tls=args.tls, amqp=True)
    sup = Supervisor(cluster, restart_delay=args.restart_delay)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"starting {args.nodes} node(s) ({args.ha.label(args.nodes)}) in {args.data_dir} ...", flush=True)
    try:
        if not await _started(cluster, stop):
            return 0
        for p in cluster.processes.values():
            sup.write_pid(p)
        _banner(cluster, args)
        async with asyncio.TaskGroup() as tg:
            watches = [tg.create_task(sup.watch(name), name=f"watch-{name}") for name in cluster.processes]
            await stop.wait()
            for t in watches:
                t.cancel()
    finally:
        print("stopping the group ...", flush=True)
        await cluster.stop()
        sup.remove_pids()
    return 0


async def _started(cluster: LocalCluster, stop: asyncio.Event) -> bool:
    """Start the nodes and wait for a quorum; False if ``stop`` came first."""
    starting = asyncio.ensure_future(_start(cluster))
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([starting, stopping], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        if not starting.done():
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
    if starting.cancelled():
        return False
    starting.result()  # the start's error, if it failed
    return True


async def _start(cluster: LocalCluster) -> None:
    await cluster.start()
    await cluster.wait_ready()
    if not cluster.ha.shared:
        # every member runs this build: the group is at its highest feature level from the start
        # (a group made anew, or started again on the same build; docs/upgrades.md)
        try:
            await cluster.finalize()
        except (TandemError, TimeoutError) as refused:
            print(f"the group's feature level was not raised ({refused}): `tandem upgrade finalize` raises it",
                  flush=True)


def _banner(cluster: LocalCluster, args: argparse.Namespace) -> None:
    ha: HaSetup = args.ha
    reached = "an ACTIVE node" if ha.shared else "a lock holder" if ha.arbiter == "lockfile" else "quorum reached"
    print(f"Tandem group of {args.nodes} node(s) is up ({reached})", flush=True)
    print(f"  mode       : {ha.label(args.nodes)}", flush=True)
    if ha.shared:
        print(f"  database   : {redact_url(str(ha.database))}  lock {ha.lock or 'database'}", flush=True)
    if ha.arbiter == "lockfile":
        print(f"  lock file  : {ha.lockfile_path(cluster.data_dir)}", flush=True)
    zone_of = dict(a.split("=", 1) for a in getattr(args, "zone_args", [])[1::2])
    for name, p in cluster.nodes.items():
        zone = f"  zone {zone_of[name]}" if name in zone_of else ""
        print(f"  {name:6} client {p.host}:{p.address[1] if p.address else p.port}  peer "
              f"{cluster.peer_ports[name]}{zone}  pid {p.pid}  log {p.log_path}", flush=True)
    if cluster.witness is not None:
        w = cluster.witness
        print(f"  {w.name:6} witness, peer {w.peer_port}  pid {w.pid}  log {w.log_path}", flush=True)
    scheme, rest = cluster.url.split("://", 1)
    hosts = rest.split("@", 1)[1]
    print(f"  client URL : {scheme}://admin@{hosts}", flush=True)
    print(f"  console    : {cluster.console_url(next(iter(cluster.nodes)))} (any node's port +2 serves it)",
          flush=True)
    first = next(iter(cluster.nodes))
    print(f"  AMQP URL   : {'amqps' if cluster.tls else 'amqp'}://admin@{cluster.hosts[first]}:"
          f"{cluster.amqp_ports[first]}/ (any node's port +3: pika, aio-pika, kombu; docs/amqp.md)", flush=True)
    pw = Path(args.data_dir) / "admin-password"
    print(f"  admin pass : {pw if pw.exists() else 'from TANDEM_ADMIN_PASSWORD'}", flush=True)
    print(f"  secret     : {cluster.secret_file} (the group secret the peer links prove)", flush=True)
    query = f"/?ca={cluster.certs_dir / 'ca.crt'}" if cluster.tls else ""
    print(f"  status     : tandem status --url '{scheme}://admin:PASSWORD@{hosts.split(',')[0].split('/')[0]}{query}'",
          flush=True)
    print("  a node that dies is started again; stop them all with Ctrl-C", flush=True)

