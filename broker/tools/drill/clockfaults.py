"""The ``clock`` fault family: every node's clocks disagree, and some jump while the fault lasts.

Nothing that keeps data safe may depend on the nodes' clocks agreeing.  A node has two clocks
(docs/drills.md, "Clock faults"):

* its **wall clock** (``time.time()``: message timestamps, event times, store stamps) is faked
  by libfaketime, preloaded into the node (``LD_PRELOAD``) and told its offset by a control
  file of its own (``FAKETIME_TIMESTAMP_FILE``, re-read every second:
  ``FAKETIME_CACHE_DURATION=1``), so the drill can skew it, and make it jump, while the node
  runs.  ``FAKETIME_DONT_FAKE_MONOTONIC=1``: libfaketime leaves the monotonic clock alone;
* its **monotonic clock** (timeouts, leases, elections) runs in a time namespace of its own
  whose offset (seconds to days, either way) is set when the group starts: a holder process
  (``unshare --time --monotonic=OFF --boottime=OFF sleep infinity``) owns the namespace and the
  node is started through ``nsenter --time=/proc/HOLDER/ns/time --``, which moves itself into
  it and then execs the node (so the node's pid is the one the drill started).  A monotonic
  clock never jumps, so this offset stays for the whole run.

The family (:class:`ClockSkew`) sets both up before the nodes start (its ``prepare``, need
``faketime``: :class:`FaketimeSetup`; every wall clock true), skews every wall clock by its own
amount, from a second to hours, ahead or behind, jumps some of them forward or back while the
fault lasts, heals by setting them all true again, and removes the holders on ``close``.  Needs
root (``unshare --time``).
"""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import signal
from pathlib import Path
from typing import Any, ClassVar

from broker.tools.drill.nemesis import FaultContext, Nemesis, register
from client.errors import UnavailableError

LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"
#: the largest wall-clock skew the family sets, seconds (6 hours)
MAX_SKEW = 6 * 3600.0
#: the largest monotonic offset a node's time namespace gets, seconds (a week)
MAX_MONOTONIC = 7 * 86400.0
#: how long libfaketime keeps an offset before it reads its control file again, seconds
CACHE_SECONDS = 1


def control_file(node: Any) -> Path:
    """Where node ``node`` (a NodeProcess) reads its wall-clock offset."""
    return Path(node.data_dir).parent / f"{node.name}.faketime"


def set_offset(node: Any, seconds: float) -> None:
    """The node's wall clock runs ``seconds`` ahead of the true time (behind if negative)."""
    path = control_file(node)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{int(round(seconds)):+d}\n")
    os.replace(tmp, path)  # libfaketime never reads half a line


def fmt_offset(seconds: float) -> str:
    sign = "-" if seconds < 0 else "+"
    s = int(round(abs(seconds)))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return sign + (f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s")


def _libfaketime() -> str:
    path = os.environ.get("TANDEM_LIBFAKETIME", LIBFAKETIME)
    if not Path(path).exists():
        raise UnavailableError(f"the clock family needs libfaketime ({path} is missing; Debian: apt-get install "
                               "libfaketime, or set TANDEM_LIBFAKETIME)")
    return path


def _uptime() -> float:
    try:
        return float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0


class FaketimeSetup:
    """A control file and a time namespace per node of ``cluster`` (see the module's docstring)."""

    def __init__(self, cluster: Any, rng: Any) -> None:
        self.cluster, self.rng = cluster, rng
        self.holders: dict[str, asyncio.subprocess.Process] = {}
        #: node -> its monotonic clock's offset, seconds
        self.monotonic: dict[str, float] = {}

    def _monotonic_offset(self) -> float:
        """Days ahead, or behind by at most half the machine's uptime (a clock may not start
        before the boot)."""
        behind = _uptime() / 2
        if behind > 1 and self.rng.random() < 0.3:
            return -self.rng.uniform(1, behind)
        return self.rng.uniform(1, MAX_MONOTONIC)

    async def prepare(self) -> None:
        lib = _libfaketime()
        for tool in ("unshare", "nsenter"):
            if shutil.which(tool) is None:
                raise UnavailableError(f"the clock family needs {tool} (util-linux)")
        if os.geteuid() != 0:
            raise UnavailableError("the clock family needs root (a time namespace per node: unshare --time)")
        for name, node in self.cluster.nodes.items():
            off = int(self._monotonic_offset())
            proc = await asyncio.create_subprocess_exec(
                "unshare", "--time", f"--monotonic={off}", f"--boottime={off}", "sleep", "infinity",
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE)
            self.holders[name] = proc
            await self._entered(name, proc)
            self.monotonic[name] = float(off)
            set_offset(node, 0.0)
            preload = " ".join(x for x in (node.env.get("LD_PRELOAD"), lib) if x)
            node.env.update({"LD_PRELOAD": preload, "FAKETIME_TIMESTAMP_FILE": str(control_file(node)),
                             "FAKETIME_CACHE_DURATION": str(CACHE_SECONDS),
                             "FAKETIME_DONT_FAKE_MONOTONIC": "1", "DONT_FAKE_MONOTONIC": "1"})
            node.wrap = [*node.wrap, "nsenter", f"--time=/proc/{proc.pid}/ns/time", "--"]

    async def _entered(self, name: str, proc: asyncio.subprocess.Process) -> None:
        """Until the holder runs in its new time namespace (it is not ours); an error if it died."""
        ours = os.readlink("/proc/self/ns/time")
        for _ in range(200):  # 10 s: polling a process we just started, bounded
            if proc.returncode is not None:
                err = (await proc.stderr.read()).decode(errors="replace").strip() if proc.stderr else ""
                raise UnavailableError(f"unshare --time for {name} failed: {err or proc.returncode}")
            try:
                if os.readlink(f"/proc/{proc.pid}/ns/time") != ours:
                    return
            except OSError:
                pass
            await self.cluster.clock.sleep(0.05)
        raise UnavailableError(f"the time namespace holder of {name} did not start")

    async def close(self) -> None:
        """Kill the holders (a node already in a namespace keeps it; a node started after this
        could not enter it) and remove the control files."""
        for proc in self.holders.values():
            if proc.returncode is None:
                proc.send_signal(signal.SIGKILL)
            await proc.wait()
        self.holders.clear()
        for node in self.cluster.nodes.values():
            try:
                control_file(node).unlink()
            except FileNotFoundError:
                pass


@register
class ClockSkew(Nemesis):
    """Every node's wall clock off by its own amount, some jumping while the fault lasts."""

    name: ClassVar[str] = "clock"
    needs: ClassVar[frozenset[str]] = frozenset({"faketime", "root"})

    def __init__(self) -> None:
        self.setup: FaketimeSetup | None = None
        self.nodes: list[Any] = []
        self.jumps: asyncio.Task[None] | None = None

    async def prepare(self, ctx: FaultContext) -> None:
        """Every node on clocks of its own (before the nodes start)."""
        self.setup = FaketimeSetup(ctx.cluster, ctx.rng)
        await self.setup.prepare()

    @staticmethod
    def _skew(rng: Any) -> float:
        """A second to :data:`MAX_SKEW`, log-uniform, either way."""
        return rng.choice((-1, 1)) * math.exp(rng.uniform(0.0, math.log(MAX_SKEW)))

    async def inject(self, ctx: FaultContext) -> str:
        rng = ctx.rng
        self.nodes = list(ctx.cluster.nodes.values())
        for node in self.nodes:
            if not control_file(node).exists():
                raise UnavailableError("the clock family needs a group set up for it (need 'faketime': "
                                       f"{control_file(node)} is missing)")
        first = {n.name: self._skew(rng) for n in self.nodes}
        for node in self.nodes:
            set_offset(node, first[node.name])
        skews = dict(first)
        # jumps within the fault's hold: a node's clock moves by minutes to hours, either way
        hold = ctx.cfg.pause
        plan = []
        for node in rng.sample(self.nodes, rng.randint(1, len(self.nodes))):
            at = rng.uniform(0.2, 0.8) * hold
            skews[node.name] += rng.choice((-1, 1)) * rng.uniform(30.0, 2 * 3600.0)
            plan.append((at, node, skews[node.name]))
        plan.sort(key=lambda j: j[0])
        self.jumps = asyncio.ensure_future(self._jump(ctx, plan))
        return ("wall clocks " + ", ".join(f"{n.name} {fmt_offset(first[n.name])}" for n in self.nodes)
                + "; jumps " + ", ".join(f"{n.name} to {fmt_offset(off)} at {at:.1f} s" for at, n, off in plan))

    async def _jump(self, ctx: FaultContext, plan: list[tuple[float, Any, float]]) -> None:
        start = ctx.clock.monotonic()
        for at, node, off in plan:
            await ctx.clock.sleep(max(0.0, start + at - ctx.clock.monotonic()))  # the plan's time: not a wait
            set_offset(node, off)

    async def heal(self, ctx: FaultContext) -> None:
        """Every wall clock true again (within libfaketime's re-read, a second)."""
        if self.jumps is not None:
            self.jumps.cancel()
            await asyncio.gather(self.jumps, return_exceptions=True)
            self.jumps = None
        for node in self.nodes:
            if control_file(node).exists():
                set_offset(node, 0.0)
        self.nodes = []

    async def close(self, ctx: FaultContext) -> None:
        await self.heal(ctx)
        if self.setup is not None:
            await self.setup.close()
            self.setup = None
