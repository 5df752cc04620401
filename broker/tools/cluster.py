"""A local replication group of N node processes: ``tandem cluster up``, tests, bench, drills.

Node *i* (1-based) is named ``node<i>``, keeps its store in ``<data_dir>/node<i>``
and listens on ``base_port + 10*(i-1)`` for clients, ``+1`` for peer links and
``+2`` for HTTP (the management console; ``console=False``: none, a node starting without
it skips importing the web stack, a fifth of its start-up) and, with ``amqp=True``, ``+3`` for
AMQP 0-9-1 clients (broker.amqp).  ``base_port=0`` picks free
ports (tests).  Every node gets the same admin password (``TANDEM_ADMIN_PASSWORD``,
else a random one written to ``<data_dir>/admin-password``) and the same group secret
(``<data_dir>/cluster.secret``, made on the first run and kept: peer authentication).

``ha`` (:class:`~broker.tools.pair.HaSetup`) makes it a shared-mode group (every node on the
one database) or a pair under the LockFile arbiter (``<data_dir>/tandem.lock`` unless a path
is given) or a witness: then a witness process ``w1`` runs beside the nodes, its peer port
the one a third node's would be (``base_port + 10*N + 1``), its data in ``<data_dir>/w1``.

``net="netns"``: each node in a network namespace of its own (:class:`~broker.tools.netns.NetnsGroup`,
root only), made by :meth:`LocalCluster.start` and removed by :meth:`LocalCluster.stop`: a node
binds and is reached (by peers and clients alike) at its namespace's address, clients stay in
this namespace and reach the nodes through the group's bridge; :attr:`LocalCluster.netns` cuts links.

``tls``: TLS on every link.  A throwaway CA and a certificate per node (and witness) are made
in ``<data_dir>/certs`` (:mod:`broker.tools.certs`, once), every process gets ``--tls-cert``,
``--tls-key`` and ``--tls-ca``, and :attr:`LocalCluster.url` is ``tandems://...?ca=<data_dir>/certs/ca.crt``.
"""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import socket
from pathlib import Path

import client
from broker.tools.certs import make_dev_certs
from broker.security.secret import ensure_secret
from broker.tools.faults import FaultProxy
from broker.tools.netns import NetnsGroup
from broker.tools.pair import REPLICATED, WITNESS_NAME, HaSetup, group_ready, serving_actives
from broker.tools.process import NodeProcess
from broker.tools.witness_process import WitnessProcess
from client.clock import SYSTEM_CLOCK, Clock
from client.errors import TandemError, UnavailableError
from client.protocol.frames import StatusOk


#: the group secret's file in a local group's data dir
SECRET_FILE = "cluster.secret"


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on 127.0.0.1 now, for nodes that bind them a moment later.

    They are picked below the kernel's ephemeral range when it leaves room: a port that
    ``bind(0)`` hands out comes from that range, and so do the local ports of outgoing
    connections, so in between any connection could take it (a test suite makes thousands)
    and the node would fail with "address already in use".  ``TANDEM_PORT_RANGE=LOW-HIGH``
    narrows the choice: parallel test workers each get their own range, so one worker never
    picks a port that another's node is about to bind or is restarting on."""
    low, high = port_range()
    socks: list[socket.socket] = []
    try:
        while len(socks) < n:
            s = socket.socket()
            port = random.randrange(low, high) if high - low > 100 else 0
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue  # taken: another one
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def port_range() -> tuple[int, int]:
    """[low, high) that :func:`free_ports` picks from: ``TANDEM_PORT_RANGE`` or 10000 up to
    the kernel's ephemeral range."""
    spec = os.environ.get("TANDEM_PORT_RANGE", "")
    if spec:
        lo, _, hi = spec.partition("-")
        return int(lo), int(hi)
    return 10000, _ephemeral_low()


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux; 32768, its default, elsewhere)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def active_terms(statuses: list[tuple[str, StatusOk]], queue: str) -> dict[int, tuple[str, int]]:
    """partition -> (the node that says it is active for it (and serves it), its term)."""
    out: dict[int, tuple[str, int]] = {}
    for name, st in statuses:
        for part in st.partitions:
            if part.queue == queue and part.role == "active" and part.active == name:
                out[part.partition] = (name, part.term)
    return out


def actives_of(statuses: list[tuple[str, StatusOk]], queue: str) -> dict[int, str]:
    """partition -> the node that says it is active for it (and serves it)."""
    return {p: name for p, (name, _term) in active_terms(statuses, queue).items()}


def _failure_detection(args: list[str]) -> list[str]:
    """The nodes' keep-alive and non-response flags among ``args``, for the witness (its peer
    links time out as theirs do)."""
    out = []
    for flag in ("--keepalive-interval", "--non-response-timeout"):
        if flag in args[:-1]:
            out += [flag, args[args.index(flag) + 1]]
    return out


class LocalCluster:
    def __init__(self, data_dir: Path, *, nodes: int = 3, base_port: int = 7780, host: str = "127.0.0.1",
                 password: str | None = None, sync: str = "SYNC", extra_args: list[str] | None = None,
                 node_args: dict[str, list[str]] | None = None, clock: Clock = SYSTEM_CLOCK,
                 proxied: bool = False, ha: HaSetup = REPLICATED, tls: bool = False, secret: bool = True,
                 net: str = "local", console: bool = True, amqp: bool = False) -> None:
        self.clock = clock
        self.console = console
        self.amqp = amqp  # each node serves AMQP 0-9-1 on its client port + 3 (broker.amqp)
        self.tls = tls
        self.certs_dir = Path(os.path.abspath(data_dir)) / "certs"  # absolute: the URL's ca works anywhere
        ha.check(nodes)
        self.ha = ha
        #: every peer link and every node's client port behind a FaultProxy (cut_node / heal_node)
        self.proxied = proxied
        self.proxies: dict[str, list[FaultProxy]] = {}  # node -> the proxies cutting which isolates it
        self._client_proxies: dict[str, FaultProxy] = {}
        if not 1 <= nodes <= 9:
            raise UnavailableError(f"--nodes {nodes}: a local group has 1 to 9 nodes")
        self.data_dir = Path(data_dir)
        self.host = host
        self.password = password or os.environ.get("TANDEM_ADMIN_PASSWORD") or self._password_file()
        #: the group secret every node and the witness prove on their peer links (``secret=False``
        #: with ``tls=True``: none, the members' certificates authenticate them)
        self.secret_file = ensure_secret(self.data_dir / SECRET_FILE) if secret else None
        names = [f"node{i}" for i in range(1, nodes + 1)]
        if net not in ("local", "netns"):
            raise UnavailableError(f"net {net!r}: local or netns")
        if net == "netns" and (proxied or ha.witness or ha.shared):
            raise UnavailableError("--net netns: a replicated group without proxies, a witness or a shared database "
                                   "(those are reached on this namespace's loopback)")
        #: the nodes' network namespaces (``net="netns"``)
        self.netns = NetnsGroup(names) if net == "netns" else None
        #: node -> the address it binds and is reached at
        self.hosts = dict(self.netns.addresses) if self.netns is not None else {n: host for n in names}
        if base_port:
            ports = {n: (base_port + 10 * i, base_port + 10 * i + 1, base_port + 10 * i + 2, base_port + 10 * i + 3)
                     for i, n in enumerate(names)}
            witness_port = base_port + 10 * nodes + 1
        else:
            free = free_ports(4 * nodes + 1)
            ports = {n: (free[4 * i], free[4 * i + 1], free[4 * i + 2], free[4 * i + 3]) for i, n in enumerate(names)}
            witness_port = free[-1]
        self.peer_ports = {n: p[1] for n, p in ports.items()}
        self.http_ports = {n: p[2] for n, p in ports.items()}
        self.amqp_ports = {n: p[3] for n, p in ports.items()}
        #: (from, to) -> "host:port" where ``from`` reaches ``to``'s peer port (a FaultProxy)
        self.peer_routes: dict[tuple[str, str], str] = {}
        self.nodes: dict[str, NodeProcess] = {}
        self._extra = list(extra_args or [])
        self._node_args = dict(node_args or {})
        for n in names:
            self.nodes[n] = NodeProcess(self.data_dir / n, name=n, port=ports[n][0], sync=sync,
                                        password=self.password, host=self.hosts[n], clock=clock,
                                        ca=self.certs_dir / "ca.crt" if tls else None)
            if self.netns is not None:
                self.nodes[n].wrap = [*self.nodes[n].wrap, *self.netns.wrap(n)]
        #: the pair's witness (``ha.arbiter == "witness"``), started before the nodes
        self.witness: WitnessProcess | None = None
        if ha.witness:
            self.witness = WitnessProcess(self.data_dir / WITNESS_NAME, name=WITNESS_NAME, peer_port=witness_port,
                                             peers=[f"{n}={host}:{self.peer_ports[n]}" for n in names], host=host,
                                             extra_args=[*self._secret_args(), *_failure_detection(self._extra),
                                                         *self._tls_args(WITNESS_NAME)], clock=clock)
        self._arrange()

    def new_member(self, name: str, zone: str = "", seeds: list[str] | None = None) -> str:
        """A node ``name`` that joins this running group (``--join``, its peers the members, or
        with ``seeds`` those members' peer ports only, by name: ``--seed HOST:PORT`` each; in
        ``zone``, in a group with zones): added to :attr:`nodes`, not started.  Returns its
        ``NAME=HOST:PEER_PORT`` for ``tandem group add``."""
        if name in self.nodes:
            raise UnavailableError(f"{name} is in the group already")
        client_port, peer_port, http_port, amqp_port = free_ports(4)
        self.hosts[name] = self.host
        self.peer_ports[name], self.http_ports[name], self.amqp_ports[name] = peer_port, http_port, amqp_port
        first = next(iter(self.nodes.values()))
        p = NodeProcess(self.data_dir / name, name=name, port=client_port, sync=first.sync, password=self.password,
                        host=self.host, clock=self.clock, ca=self.certs_dir / "ca.crt" if self.tls else None)
        peers = [a for o in self.nodes for a in ("--peer", f"{o}={self.hosts[o]}:{self.peer_ports[o]}")] \
            if seeds is None else [a for o in seeds for a in ("--seed", f"{self.hosts[o]}:{self.peer_ports[o]}")]
        if self.tls and not (self.certs_dir / f"{name}.key").exists():
            raise UnavailableError(f"{name} has no certificate in {self.certs_dir}: make the group's certificates "
                                   f"with its name among them before the group starts (broker.tools.certs)")
        p.extra_args = [*self._secret_args(), "--peer-port", str(peer_port), *self._http_args(name), *peers,
                        "--join", *self._tls_args(name), *self._extra, *(("--zone", f"{name}={zone}") if zone else ())]
        self.nodes[name] = p
        return f"{name}={self.host}:{peer_port}"

    def _secret_args(self) -> list[str]:
        return [] if self.secret_file is None else ["--cluster-secret-file", str(self.secret_file)]

    def _http_args(self, name: str) -> list[str]:
        return [*(["--http-port", str(self.http_ports[name])] if self.console else []),
                *(["--amqp-port", str(self.amqp_ports[name])] if self.amqp else [])]

    def _tls_args(self, name: str) -> list[str]:
        if not self.tls:
            return []
        d = self.certs_dir
        return ["--tls-cert", str(d / f"{name}.crt"), "--tls-key", str(d / f"{name}.key"), "--tls-ca", str(d / "ca.crt")]

    def _make_certs(self) -> None:
        """The group's throwaway CA and certificates (kept across restarts of the group)."""
        names = [*self.nodes, *([self.witness.name] if self.witness is not None else [])]
        if all((self.certs_dir / f"{n}.key").exists() for n in names):
            return
        make_dev_certs(self.certs_dir, names, sorted({self.host, *self.hosts.values()}))

    def _arrange(self) -> None:
        names = list(self.nodes)
        ha = self.ha.node_args(self.data_dir, self.witness.spec if self.witness is not None else None)
        for n, p in self.nodes.items():
            peers = [a for o in names if o != n for a in
                     ("--peer", f"{o}={self.peer_routes.get((n, o), f'{self.hosts[o]}:{self.peer_ports[o]}')}")]
            # the secret first: a later --cluster-secret-file among the extra args wins (tests give one node another)
            p.extra_args = [*self._secret_args(), "--peer-port", str(self.peer_ports[n]),
                            *self._http_args(n), *peers, *ha, *self._tls_args(n), *self._extra,
                            *self._node_args.get(n, [])]

    @property
    def processes(self) -> dict[str, NodeProcess | WitnessProcess]:
        """Every process of the group: the nodes, and the witness if there is one."""
        procs: dict[str, NodeProcess | WitnessProcess] = dict(self.nodes)
        if self.witness is not None:
            procs[self.witness.name] = self.witness
        return procs

    def route(self, src: str, dst: str, address: str) -> None:
        """``src`` reaches ``dst``'s peer port at ``address`` (before start)."""
        self.peer_routes[(src, dst)] = address
        self._arrange()

    def _password_file(self) -> str:
        path = self.data_dir / "admin-password"
        if path.exists():
            return path.read_text().strip()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        pw = secrets.token_urlsafe(12)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(pw + "\n")
        return pw

    @property
    def url(self) -> str:
        """One URL listing every node: the SDK tries them in turn."""
        hosts = ",".join(self._client_address(n) for n in self.nodes)
        if self.tls:
            return f"tandems://admin:{self.password}@{hosts}/?ca={self.certs_dir / 'ca.crt'}"
        return f"tandem://admin:{self.password}@{hosts}"

    def _client_address(self, name: str) -> str:
        if name in self._client_proxies:
            return self._client_proxies[name].address
        p = self.nodes[name]
        return f"{p.host}:{p.address[1] if p.address else p.port}"

    def console_url(self, name: str) -> str:
        """Node ``name``'s management console (every node serves the whole group's view)."""
        if not self.console:
            raise UnavailableError("this group runs without consoles (console=False)")
        return f"{'https' if self.tls else 'http'}://{self.hosts[name]}:{self.http_ports[name]}/"

    def url_of(self, name: str) -> str:
        """Node ``name`` itself (not through its proxy)."""
        return self.nodes[name].url

    async def _start_proxies(self) -> None:
        names = list(self.nodes)
        for n in names:
            self.proxies[n] = []
        for i, a in enumerate(names):
            for b in names[i + 1:]:  # the lower name dials the higher: one link per pair
                px = await FaultProxy((self.host, self.peer_ports[b])).start()
                self.proxies[a].append(px)
                self.proxies[b].append(px)
                self.peer_routes[(a, b)] = px.address
        for n, proc in self.nodes.items():
            if proc.port == 0:  # a proxy needs the node's port before it starts
                proc.port = free_ports(1)[0]
            px = await FaultProxy((self.host, proc.port)).start()
            self._client_proxies[n] = px
            self.proxies[n].append(px)
            self._node_args[n] = [*self._node_args.get(n, []), "--advertise", px.address]
        self._arrange()

    def cut_node(self, name: str) -> None:
        """Cut every peer link of ``name`` and its clients' connections (``proxied`` groups)."""
        for px in self.proxies[name]:
            px.cut()

    def heal_node(self, name: str) -> None:
        for px in self.proxies[name]:
            px.heal()

    async def start(self, timeout: float = 60.0) -> None:
        try:
            if self.netns is not None and not self.netns.up:
                await asyncio.to_thread(self.netns.setup)
            if self.tls:
                await asyncio.to_thread(self._make_certs)
            if self.proxied and not self.proxies:
                await self._start_proxies()
            if self.witness is not None and (self.witness.proc is None or self.witness.proc.returncode is not None):
                await self.witness.start(timeout)
            await asyncio.gather(*(p.start(timeout) for p in self.nodes.values()))
        except BaseException:
            await self.stop()
            raise

    async def wait_ready(self, timeout: float = 60.0) -> None:
        """Until some node serves clients (:func:`~broker.tools.pair.group_ready`: node quorum and
        an active for the queue catalogue; under the LockFile arbiter a lock holder; in shared
        mode an ACTIVE node)."""
        try:
            async with self.clock.timeout(timeout):
                while not group_ready(self.ha, await self._statuses()):
                    await self.clock.sleep(0.1)  # polling real processes for a state; bounded by the deadline
        except TimeoutError:
            what = "an ACTIVE node" if self.ha.shared else "a lock holder" if self.ha.arbiter == "lockfile" \
                else "an active"
            raise UnavailableError(f"the group did not elect {what} within {timeout:.0f} s") from None

    async def wait_members(self, timeout: float = 60.0) -> None:
        """Until every node that runs (not paused) answers and counts a quorum: a node that has
        just started serves its clients once its peer links are up (before, it answers
        UNAVAILABLE), where :meth:`wait_ready` waits for some node only."""
        async def linked() -> bool:
            running = [n for n, p in self.nodes.items()
                       if p.proc is not None and p.proc.returncode is None and not p.paused]
            statuses = await self._statuses()
            return len(statuses) == len(running) and all(st.quorum_state != "Disabled" for _n, st in statuses)

        try:
            async with self.clock.timeout(timeout):
                while not await linked():
                    await self.clock.sleep(0.1)  # polling real processes for a state; bounded by the deadline
        except TimeoutError:
            raise UnavailableError(f"not every member counted a quorum within {timeout:.0f} s") from None

    async def finalize(self, timeout: float = 60.0) -> StatusOk:
        """Raise the group's feature level to this build's highest (every member runs it): asked
        again while it is refused because a member's links are still coming up (its build is
        not known yet), for at most ``timeout`` seconds in all; then the last refusal."""
        deadline = self.clock.monotonic() + timeout
        while True:
            try:
                await self.wait_members(max(1.0, deadline - self.clock.monotonic()))
                async with self.clock.timeout(max(1.0, deadline - self.clock.monotonic())):
                    async with await client.connect_link(self.url, client_name="tandem-cluster") as conn:
                        return await conn.finalize_upgrade()
            except (TandemError, TimeoutError):
                if self.clock.monotonic() >= deadline:
                    raise
                await self.clock.sleep(0.5)  # (links coming up: asked again, until the deadline)

    async def _statuses(self) -> list[tuple[str, StatusOk]]:
        """The status of every node that is running (not paused) and answers."""
        out = []
        for name, p in self.nodes.items():
            if p.proc is None or p.proc.returncode is not None or p.paused:
                continue
            try:
                out.append((name, await self.status(name)))
            except (TandemError, OSError):
                continue  # starting, stopping or killed: the caller looks again
        return out

    async def status(self, name: str) -> StatusOk:
        async with await client.connect_link(self.url_of(name), client_name="tandem-cluster", observe=True) as conn:
            return await conn.status()

    async def actives(self, queue: str, partitions: int | None = None) -> dict[int, str]:
        """partition -> the node serving it, as the live nodes report (partitions without one left
        out; shared mode: :func:`~broker.tools.pair.serving_actives`)."""
        return serving_actives(self.ha, await self._statuses(), queue, partitions)

    async def stop(self) -> None:
        try:
            await asyncio.gather(*(p.stop() for p in self.nodes.values()), return_exceptions=True)
            if self.witness is not None:
                await self.witness.stop()
            proxies = {id(px): px for pxs in self.proxies.values() for px in pxs}
            await asyncio.gather(*(px.stop() for px in proxies.values()), return_exceptions=True)
            self.proxies.clear()
            self._client_proxies.clear()
        finally:
            if self.netns is not None:
                await asyncio.to_thread(self.netns.teardown)
