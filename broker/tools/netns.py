"""Network namespaces for a local group: each node in a namespace of its own, partitions by
iptables (``tandem drill --net netns``; :class:`~broker.tools.cluster.LocalCluster` ``net="netns"``).

Layout of one group, all names starting with its id (``<prefix><6 hex digits>``, at most 15
characters, as Linux allows for interface names):

* a bridge ``<id>b`` in the root namespace, at ``10.X.Y.1/24`` (X, Y random per group, a
  subnet no route or address of this machine overlaps): the drill's clients (producers,
  consumers, status polls) run in the root namespace and reach every node through it;
* per node *i* (1-based) a namespace ``<id>n<i>`` holding ``eth0`` at ``10.X.Y.<i+1>`` and
  ``lo``, its veth peer ``<id>v<i>`` a port of the bridge;
* where bridged traffic passes the root namespace's iptables (``br_netfilter``,
  ``net.bridge.bridge-nf-call-iptables = 1``), one rule accepting it in the root ``FORWARD``
  chain (commented ``tandem-netns:<id>``), since a ``DROP`` policy there would cut every node.

Faults are rules in the nodes' own namespaces (their ``INPUT`` and ``OUTPUT`` chains, which
hold nothing else): a ``DROP`` per peer address, never for the bridge's address, so clients
are never cut.  :meth:`NetnsGroup.clear` flushes them.

A group registers itself in ``/run/tandem-netns/<id>`` (its owner's pid and start time)
before it creates anything and unregisters after it removed everything.  Every
:meth:`NetnsGroup.setup` first removes what groups of the same prefix left behind whose owner
is gone (a crashed drill: its namespaces, links, root rules, and the node processes still in
them); groups of live owners (parallel runs) are left alone.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
from collections.abc import Iterable
from pathlib import Path

from client.errors import UnavailableError

log = logging.getLogger("tandem.drill")

#: the names' default prefix (a group's id is the prefix and 6 hex digits)
PREFIX = "tdm"
#: where live groups register (a tmpfs: gone at reboot, as the namespaces are)
REGISTRY = Path("/run/tandem-netns")
#: the comment on a group's root-namespace rules
COMMENT = "tandem-netns:"
_PREFIX_OK = re.compile(r"[a-z][a-z0-9]{0,5}")


def require_root(what: str = "--net netns") -> None:
    """One clear line when this process cannot make namespaces (not root, tools missing)."""
    if os.geteuid() != 0:
        raise UnavailableError(f"{what} needs root: it makes network namespaces, veth pairs, a bridge "
                               "and iptables rules")
    for tool, pkg in (("ip", "iproute2"), ("iptables", "iptables"), ("iptables-restore", "iptables")):
        if shutil.which(tool) is None:
            raise UnavailableError(f"{what} needs {tool} (Debian: apt-get install {pkg})")


def _run(args: list[str], *, stdin: str | None = None, missing_ok: bool = False) -> str:
    """Run a command; its stdout.  A failure raises one line naming the command and its error,
    except that with ``missing_ok`` a "no such device / namespace / rule" one is ignored."""
    try:
        out = subprocess.run(args, input=stdin, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise UnavailableError(f"--net netns needs {args[0]}, which is not installed (Debian: apt-get install "
                               f"{'iproute2' if args[0] == 'ip' else 'iptables'})") from None
    if out.returncode != 0:
        err = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit status {out.returncode}"
        if missing_ok and re.search(r"not exist|No such|Cannot find|does a matching rule exist|"
                                    r"Bad rule|No chain", out.stderr):
            return ""
        raise UnavailableError(f"{shlex.join(args)}: {err}")
    return out.stdout


def _start_time(pid: int) -> str:
    """A process's start time (field 22 of /proc/PID/stat): with the pid, who it is."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[-1].split()[19]


def _owner_alive(gid: str) -> bool:
    try:
        pid_s, start = (REGISTRY / gid).read_text().split()[:2]
        pid = int(pid_s)
    except (OSError, ValueError):
        return False
    return _start_time(pid) == start


def _used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 route and address of this machine (root namespace)."""
    nets = []
    text = _run(["ip", "-4", "route", "show", "table", "all"]) + "\n" + \
        "\n".join(line.split()[3] for line in _run(["ip", "-o", "-4", "addr", "show"]).splitlines()
                  if len(line.split()) > 3)
    for line in text.splitlines():
        word = line.split()[0] if line.split() else ""
        if word in ("broadcast", "local", "unreachable", "prohibit", "blackhole") and len(line.split()) > 1:
            word = line.split()[1]
        try:
            nets.append(ipaddress.IPv4Network(word, strict=False))
        except ValueError:
            continue  # "default" and the like
    return nets


def _pick_subnet() -> ipaddress.IPv4Network:
    used = _used_networks()
    rnd = secrets.SystemRandom()
    for _ in range(500):
        net = ipaddress.IPv4Network(f"10.{rnd.randrange(100, 255)}.{rnd.randrange(256)}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise UnavailableError("--net netns: found no free 10.X.Y.0/24 subnet for the group")


class NetnsGroup:
    """The namespaces, veth pairs, bridge and rules of one local group (see the module doc).

    Construction only picks names and addresses; :meth:`setup` makes them (root), and
    :meth:`teardown` removes them all, also after a failed :meth:`setup`.  Blocking calls
    (they run ``ip`` and ``iptables``): from asyncio, call them through ``asyncio.to_thread``.
    """

    def __init__(self, names: Iterable[str], *, prefix: str = PREFIX) -> None:
        if not _PREFIX_OK.fullmatch(prefix):
            raise UnavailableError(f"netns prefix {prefix!r}: a lowercase letter, then up to 5 letters or digits")
        self.prefix = prefix
        self.id = f"{prefix}{secrets.token_hex(3)}"
        self.names = list(names)
        if not 1 <= len(self.names) <= 9:
            raise UnavailableError(f"--net netns: 1 to 9 nodes, not {len(self.names)}")
        self.bridge = f"{self.id}b"
        self.namespaces = {n: f"{self.id}n{i}" for i, n in enumerate(self.names, 1)}
        self.veths = {n: f"{self.id}v{i}" for i, n in enumerate(self.names, 1)}
        self.subnet = _pick_subnet()
        hosts = list(self.subnet.hosts())
        #: the bridge's address: where every client connection to a node comes from
        self.gateway = str(hosts[0])
        #: node -> its address (it binds there, peers and clients reach it there)
        self.addresses = {n: str(hosts[i]) for i, n in enumerate(self.names, 1)}
        self.up = False
        self._root_rules: list[list[str]] = []

    def wrap(self, name: str) -> list[str]:
        """The command prefix that runs a program in node ``name``'s namespace (it execs it)."""
        return ["ip", "netns", "exec", self.namespaces[name]]

    # -- making and removing ---------------------------------------------------------------

    def setup(self) -> None:
        """Make the bridge, the namespaces and their links (removing stale leftovers first)."""
        require_root()
        if self.up:
            return
        clean_stale(self.prefix)
        REGISTRY.mkdir(parents=True, exist_ok=True)
        (REGISTRY / self.id).write_text(f"{os.getpid()} {_start_time(os.getpid())} {self.subnet}\n")
        self.up = True
        try:
            br, plen = self.bridge, self.subnet.prefixlen
            _run(["ip", "link", "add", br, "type", "bridge"])
            _run(["ip", "addr", "add", f"{self.gateway}/{plen}", "dev", br])
            _run(["ip", "link", "set", br, "up"])
            for n in self.names:
                ns, veth = self.namespaces[n], self.veths[n]
                _run(["ip", "netns", "add", ns])
                _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
                _run(["ip", "link", "set", veth, "master", br, "up"])
                _run(["ip", "-n", ns, "addr", "add", f"{self.addresses[n]}/{plen}", "dev", "eth0"])
                _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
                _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            if _bridge_filtered():
                rule = ["FORWARD", "-i", br, "-o", br, "-m", "comment", "--comment", COMMENT + self.id, "-j", "ACCEPT"]
                _run(["iptables", "-w", "-I", *rule])
                self._root_rules.append(rule)
        except BaseException:
            self.teardown()
            raise
        log.info("netns group %s: subnet %s, bridge %s, namespaces %s", self.id, self.subnet, self.bridge,
                 " ".join(self.namespaces.values()))

    def teardown(self) -> None:
        """Remove everything :meth:`setup` made (idempotent; whatever it had made so far).
        Every step is tried; the first failure is raised after the others ran."""
        if not self.up:
            return
        errors: list[UnavailableError] = []

        def step(args: list[str]) -> None:
            try:
                _run(args, missing_ok=True)
            except UnavailableError as exc:
                errors.append(exc)

        for rule in self._root_rules:
            step(["iptables", "-w", "-D", *rule])
        self._root_rules.clear()
        for n in self.names:
            step(["ip", "netns", "delete", self.namespaces[n]])
            step(["ip", "link", "delete", self.veths[n]])  # gone with the namespace, unless a process holds it
        step(["ip", "link", "delete", self.bridge])
        if not errors:
            (REGISTRY / self.id).unlink(missing_ok=True)
            self.up = False
        if errors:
            raise errors[0]

    # -- faults ----------------------------------------------------------------------------

    def _restore(self, name: str, rules: list[str]) -> None:
        if not rules:
            return
        text = "*filter\n" + "".join(r + "\n" for r in rules) + "COMMIT\n"
        _run([*self.wrap(name), "iptables-restore", "-w", "--noflush"], stdin=text)

    def block(self, name: str, peers: Iterable[str], *, inbound: bool = True, outbound: bool = True) -> None:
        """``name`` drops what it gets from ``peers`` (``inbound``) and what it sends them
        (``outbound``); clients (the bridge's address) stay reachable."""
        rules = []
        for p in peers:
            if p == name:
                continue
            addr = self.addresses[p]
            if inbound:
                rules.append(f"-A INPUT -s {addr}/32 -j DROP")
            if outbound:
                rules.append(f"-A OUTPUT -d {addr}/32 -j DROP")
        self._restore(name, rules)

    def lose(self, name: str, peers: Iterable[str], probability: float) -> None:
        """``name`` drops each packet from ``peers`` with ``probability`` (0 < P < 1)."""
        if not 0.0 < probability < 1.0:
            raise UnavailableError(f"packet loss {probability}: between 0 and 1")
        self._restore(name, [f"-A INPUT -s {self.addresses[p]}/32 -m statistic --mode random "
                             f"--probability {probability:.4f} -j DROP" for p in peers if p != name])

    def clear(self, names: Iterable[str] | None = None) -> None:
        """Flush the fault rules of ``names`` (every node's by default)."""
        for n in self.names if names is None else names:
            _run([*self.wrap(n), "iptables", "-w", "-F", "INPUT"])
            _run([*self.wrap(n), "iptables", "-w", "-F", "OUTPUT"])

    def rules(self, name: str) -> list[str]:
        """The rules in ``name``'s INPUT and OUTPUT chains (``iptables -S`` lines, policies left out)."""
        return [line for chain in ("INPUT", "OUTPUT")
                for line in _run([*self.wrap(name), "iptables", "-w", "-S", chain]).splitlines()
                if line.startswith("-A ")]


def _bridge_filtered() -> bool:
    """Whether bridged packets pass the root namespace's iptables (br_netfilter)."""
    try:
        return Path("/proc/sys/net/bridge/bridge-nf-call-iptables").read_text().strip() == "1"
    except OSError:
        return False


def leftovers(prefix: str = PREFIX) -> dict[str, list[str]]:
    """Group id -> the namespaces, links and root rules of that prefix on this machine now."""
    pat = re.compile(rf"^({re.escape(prefix)}[0-9a-f]{{6}})(?:n\d|v\d|b)$")
    found: dict[str, list[str]] = {}
    for line in _run(["ip", "netns", "list"]).splitlines():
        name = line.split()[0] if line.split() else ""
        m = pat.match(name)
        if m:
            found.setdefault(m.group(1), []).append(f"netns {name}")
    for line in _run(["ip", "-o", "link", "show"]).splitlines():
        parts = line.split(":", 2)
        name = parts[1].strip().split("@")[0] if len(parts) > 1 else ""
        m = pat.match(name)
        if m:
            found.setdefault(m.group(1), []).append(f"link {name}")
    for line in _run(["iptables", "-w", "-S", "FORWARD"]).splitlines():
        m = re.search(rf"{re.escape(COMMENT)}({re.escape(prefix)}[0-9a-f]{{6}})\b", line)
        if m and line.startswith("-A "):
            found.setdefault(m.group(1), []).append(f"rule {line}")
    if REGISTRY.is_dir():
        for f in REGISTRY.iterdir():
            if re.fullmatch(rf"{re.escape(prefix)}[0-9a-f]{{6}}", f.name):
                found.setdefault(f.name, [])
    return found


def clean_stale(prefix: str = PREFIX) -> list[str]:
    """Remove what groups of ``prefix`` whose owner is gone left behind (their node processes
    too); the ids removed."""
    removed = []
    for gid, items in leftovers(prefix).items():
        if _owner_alive(gid):
            continue
        log.warning("netns: removing the leftovers of group %s (its drill is gone): %s", gid, ", ".join(items))
        for item in items:
            kind, _, what = item.partition(" ")
            if kind == "netns":
                for pid in _run(["ip", "netns", "pids", what], missing_ok=True).split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)  # a node of the crashed drill
                    except (ProcessLookupError, ValueError):
                        pass
                _run(["ip", "netns", "delete", what], missing_ok=True)
        for item in items:
            kind, _, what = item.partition(" ")
            if kind == "link":
                _run(["ip", "link", "delete", what], missing_ok=True)
            elif kind == "rule":
                _run(["iptables", "-w", "-D", *shlex.split(what)[1:]], missing_ok=True)
        (REGISTRY / gid).unlink(missing_ok=True)
        removed.append(gid)
    return removed
