"""The disk fault families: power loss (one node, every node), torn writes, a full disk, a
failing disk, fsyncs that fail and sectors it cannot read, and the disks they all run on.

Every disk family puts each node's data dir on the same layout (:class:`_Disks`, one per
group, shared by the disk families of a ``jepsen`` run): a small tmpfs of the node's own
(:data:`TMPFS_MB`, at ``<run dir>/<node>.disk``) holds the backing directory of a powerfs mount
(:mod:`broker.tools.powerfs`) at the data dir, so one disk can be rolled back, fail with EIO
and fill up.  Mounted before the nodes start, unmounted after they stop (by the last family
of the run to close).  All of them need root and FUSE.

* ``power-loss``: kill -9 the node active for most partitions, roll its disk back to what it
  had fsynced; after the hold start it again on that disk.
* ``torn-write``: kill -9 the node active for most partitions and roll its disk back with its
  last writes torn: each file keeps a prefix, cut at a 512-byte sector boundary drawn from the
  run's seeded source, of what it had written past its last fsync.  The node must start on it,
  cutting off a record its newest segment now ends inside (its log says so: a tear it does not
  name fails the run), and lose nothing confirmed.
* ``power-loss-all``: kill -9 every node at once, roll every disk back; after the hold start
  them again in an order and with gaps (0-5 s) drawn from the run's seeded random source, both
  printed in the schedule line, so a run can be replayed.
* ``disk-full``: fill the target's tmpfs with a filler file until ENOSPC, hold, delete it.
  A write refused must fail the confirm, never lose a confirmed message.  The node either
  keeps serving (its disk alarm refuses its publishes, ``disk_free_limit``) and clears its
  alarm once there is room, or stops with status 1 and one CRITICAL line naming ENOSPC (a
  log write that failed: docs/replication.md, "a full disk"); then the heal starts it again
  once the space is freed, as a supervisor would, and it must serve again.  The schedule
  says which of the two happened.
* ``disk-error``: every write and fsync of the group's replica (the last node, priority 0,
  active for nothing) fails with EIO for the hold: it must not ack what it did not write, and
  the actives keep serving with the other replica.
* ``fsync-error``: every fsync of the node active for most partitions fails with EIO for the
  hold, its writes succeed (the kernel may have dropped the pages it could not write back: a
  later fsync would report success).  The node must stop at its log's first failed fsync (it
  never confirms what it could not sync, and never retries the fsync), its replicas elect another
  active, and the heal starts it again on the working disk: a node still running at the heal
  after a failed fsync fails the run.
* ``torn-write-two``, ``fsync-error-two``: the same on two nodes, a majority of a group of
  three: the two killed together, each disk torn at sectors drawn on its own; the second's fsyncs
  failing from the moment the first's disk has failed one (the group has no quorum from the
  second's stop to the heal).

* ``bad-sector``: kill -9 the node active for most partitions, make a sector of its newest
  replication log segment unreadable (a latent sector error: every read that covers it fails
  with EIO; powerfs ``bad-sector``), at an offset drawn from the run's seeded source with records
  after it, and start it again.  It must name the unreadable bytes (its ``log-damaged`` status
  event, within :data:`DETECT_WAIT`), read on past them, and every copy of the queue must have
  caught up within :data:`REPAIR_WAIT`: the schedule says ``injected N, detected M, repaired R``.
  ``bad-sector-two`` does it to a second node once the first is repaired, another sector of
  another log: two damaged members at once could leave a partition whose recent entries only
  their two logs held without a good majority (each damaged log costs the partitions it may
  have taken entries of, as ``bit-flip-two`` shows with its damage placed apart).

Fsyncs that lie, lost or misdirected writes and reordered ones are in
:mod:`broker.tools.drill.writefaults`.

A node that will not start on its rolled-back disk fails the run with its own words (the
tail of its log): it must refuse, never serve less than it confirmed.
"""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
from pathlib import Path
from collections.abc import Callable
from typing import Any, ClassVar

from broker.tools.drill.groups import caught_up_past
from broker.tools.drill.nemesis import FaultContext, Nemesis, register
from broker.tools.powerfs_mount import PowerFS, fuse_missing, mounted, unmount
from client.errors import TandemError, UnavailableError
from storage.segfiles import scan

#: each node's tmpfs under disk-full (MiB)
TMPFS_MB = 128
#: the filler's name in a full node's data dir
FILLER = "disk-full.filler"
#: the longest gap between two restarts of power-loss-all (seconds)
MAX_GAP = 5.0
#: bad-sector: the sector lies at least this far (bytes) before its segment's end (records after it)
BAD_MARGIN = 2 * 4096
#: bad-sector: how many sectors it draws at most to find one that far from the end
SECTOR_DRAWS = 20
#: seconds a restarted node is given to report the damage it found (bad-sector, the write faults)
DETECT_WAIT = 30.0
#: seconds the copies of the drill's queue are given to catch up again after the restart (bad-sector)
REPAIR_WAIT = 30.0
#: how many ``non_response_timeout`` a two-node family waits for its first node's disk to meet
#: the fault before it faults the second (:meth:`DiskNemesis._struck`)
STRIKE_WAIT = 4.0


def missing(needs: frozenset[str]) -> str | None:
    """Why a family with ``needs`` cannot run here, or None."""
    if "powerfs" in needs:
        return fuse_missing()
    if "root" in needs and os.geteuid() != 0:
        return "not root (it mounts file systems for the nodes' data dirs)"
    return None


class _Disks:
    """The nodes' disks of one group: per node a tmpfs holding a powerfs mount's backing
    directory, the powerfs mount at the node's data dir."""

    def __init__(self) -> None:
        self.users = 0
        self.fs: dict[str, PowerFS] = {}
        self.tmpfs: list[Path] = []

    async def mount(self, ctx: FaultContext, strict: bool) -> None:
        for name, proc in ctx.cluster.nodes.items():
            data = Path(proc.data_dir)
            disk = data.with_name(f"{name}.disk")
            disk.mkdir(parents=True, exist_ok=True)
            self.tmpfs.append(disk)
            await _run("mount", "-t", "tmpfs", "-o", f"size={TMPFS_MB}m,mode=0700", "tmpfs", str(disk))
            self.fs[name] = PowerFS(disk / "backing", data, strict=strict, clock=ctx.clock)
        # (all at once: each is a process of its own; unmount() unmounts every one, mounted or not)
        failed = [r for r in await asyncio.gather(*(fs.mount() for fs in self.fs.values()),
                                                   return_exceptions=True) if isinstance(r, BaseException)]
        if failed:
            raise failed[0]

    async def unmount(self) -> None:
        for fs in self.fs.values():
            await fs.unmount()
        for d in self.tmpfs:
            await asyncio.to_thread(unmount, d)
        self.tmpfs.clear()


#: id(cluster) -> its disks, while a disk family of its run is prepared
_GROUP_DISKS: dict[int, _Disks] = {}


class DiskNemesis(Nemesis):
    """What the disk families share: their mounts, made before the nodes start."""

    needs: ClassVar[frozenset[str]] = frozenset({"powerfs", "root"})
    #: powerfs forgets directory entries not fsynced too (``--strict``)
    strict: ClassVar[bool] = False
    #: how many nodes the fault hits (:meth:`_targets`)
    count: ClassVar[int] = 1

    def __init__(self) -> None:
        self.disks: dict[str, PowerFS] = {}
        self._group: _Disks | None = None
        self.node = ""  # the node the fault hits (a family that hits one)
        self.nodes: list[str] = []  # the nodes it hits (a family of :attr:`count`)

    async def _targets(self, ctx: FaultContext) -> list[str]:
        """The nodes the fault hits: the node active for the most partitions, then (a family of
        two) another drawn from the run's seeded source."""
        first = await ctx.target()
        if self.count == 1:
            return [first]
        return [first, *ctx.rng.sample(sorted(n for n in ctx.cluster.nodes if n != first), self.count - 1)]

    async def _struck(self, ctx: FaultContext, node: str, key: str, before: int) -> bool:
        """Until ``node``'s disk has met its fault (its ``stats()[key]`` count past ``before``), at
        most :data:`STRIKE_WAIT` x ``non_response_timeout``: the next node of a two-node family is
        faulted then, at another place in another file.  Whether it had."""
        deadline = ctx.clock.monotonic() + STRIKE_WAIT * ctx.cfg.nrt
        while True:
            st = await asyncio.to_thread(self.disks[node].stats)
            if (st[key] if isinstance(st[key], int) else len(st[key])) > before:
                return True
            if ctx.clock.monotonic() > deadline:
                return False
            await ctx.clock.sleep(0.05)  # (polling the disk's counts with a deadline)

    async def prepare(self, ctx: FaultContext) -> None:
        """Every node's data dir on its disk (:class:`_Disks`), before the group starts; the
        disks are shared with the other disk families of the run."""
        why = missing(self.needs)
        if why is not None:
            raise UnavailableError(f"{self.name} cannot run here: {why}")
        key = id(ctx.cluster)
        group = _GROUP_DISKS.get(key)
        if group is None:
            group = _GROUP_DISKS[key] = _Disks()
            group.users = 1
            self._group = group
            await group.mount(ctx, self.strict)
        else:
            group.users += 1
            self._group = group
        self.disks = group.fs

    async def close(self, ctx: FaultContext) -> None:
        group, self._group = self._group, None
        if group is None:
            return
        group.users -= 1
        if group.users <= 0:
            _GROUP_DISKS.pop(id(ctx.cluster), None)
            await group.unmount()

    async def _power_loss(self, ctx: FaultContext, names: list[str]) -> str:
        """kill -9 ``names`` at once, then roll their disks back; what was rolled back."""
        await asyncio.gather(*(ctx.cluster.nodes[n].kill() for n in names))
        parts = []
        for n in names:
            out = await asyncio.to_thread(self.disks[n].rollback)
            parts.append(f"{n} {out['bytes']} B in {out['files']} file(s)"
                         + (f", {out['entries']} dir entries" if self.strict else ""))
        return "rolled back " + "; ".join(parts)


def two_nodes(cls: type[DiskNemesis]) -> type[DiskNemesis]:
    """``cls`` on two nodes (:attr:`DiskNemesis.count`): the family ``<its name>-two``."""
    two: type[DiskNemesis] = type(f"{cls.__name__}Two", (cls,), {
        "name": f"{cls.name}-two", "count": 2, "__module__": cls.__module__,
        "__doc__": f"``{cls.name}`` on two nodes, a majority of a group of three (the module says how)."})
    register(two)
    return two


@register
class PowerLoss(DiskNemesis):
    name = "power-loss"

    async def inject(self, ctx: FaultContext) -> str:
        self.node = await ctx.target()
        return f"power-loss {self.node}: kill -9, {await self._power_loss(ctx, [self.node])}"

    async def heal(self, ctx: FaultContext) -> None:
        await ctx.cluster.nodes[self.node].start()


@register
class TornWrite(DiskNemesis):
    name = "torn-write"

    def __init__(self) -> None:
        super().__init__()
        self.torn: dict[str, bool] = {}  # node -> its newest log segment was left ending inside a record

    async def inject(self, ctx: FaultContext) -> str:
        self.nodes = await self._targets(ctx)
        await asyncio.gather(*(ctx.cluster.nodes[n].kill() for n in self.nodes))
        said = []
        for n in self.nodes:
            seed = ctx.rng.getrandbits(32)
            out = await asyncio.to_thread(self.disks[n].rollback_torn, seed)
            self.torn[n] = await asyncio.to_thread(_torn_tail, Path(ctx.cluster.nodes[n].data_dir))
            said.append(f"{n}: kill -9, rolled back {out['bytes']} B in {out['files']} file(s), kept {out['kept']} B "
                        f"past their last fsync (cut at sectors drawn from seed {seed}); the newest log segment "
                        + ("ends inside a record" if self.torn[n] else "ends at a whole record"))
        return f"{self.name} " + "; ".join(said)

    async def heal(self, ctx: FaultContext) -> None:
        procs = {n: ctx.cluster.nodes[n] for n in self.nodes}
        before = {n: len(p.log_text()) for n, p in procs.items()}
        await asyncio.gather(*(p.start() for p in procs.values()))
        for n, p in procs.items():
            if not self.torn[n]:
                continue
            cut = "cut off there" in p.log_text()[before[n]:]
            ctx.schedule.append(f"{self.name} {n}: the torn record " + ("cut off at start" if cut else "NOT reported"))
            if not cut:
                ctx.failures.append(f"{self.name} {n}: its log ended inside a record and it did not say it cut it "
                                    f"off")


TornWriteTwo = two_nodes(TornWrite)


@register
class PowerLossAll(DiskNemesis):
    name = "power-loss-all"

    def __init__(self) -> None:
        super().__init__()
        self.order: list[tuple[str, float]] = []

    async def inject(self, ctx: FaultContext) -> str:
        names = list(ctx.cluster.nodes)
        lost = await self._power_loss(ctx, names)
        self.order = [(n, round(ctx.rng.uniform(0.0, MAX_GAP), 1)) for n in ctx.rng.sample(names, len(names))]
        start = ", ".join(f"+{gap}s {n}" for n, gap in self.order)
        return f"power-loss-all: kill -9 every node, {lost}; restart order {start}"

    async def heal(self, ctx: FaultContext) -> None:
        starts = []
        for n, gap in self.order:
            await ctx.clock.sleep(gap)  # the replayable schedule's own gap, not a wait for a state
            # started in the background: a node may wait for a quorum before it says its URL
            starts.append(asyncio.create_task(ctx.cluster.nodes[n].start()))
        await asyncio.gather(*starts)


@register
class DiskFull(DiskNemesis):
    name = "disk-full"

    def __init__(self) -> None:
        super().__init__()
        self.filler: Path | None = None

    async def inject(self, ctx: FaultContext) -> str:
        self.node = await ctx.target()
        self.filler = Path(ctx.cluster.nodes[self.node].data_dir) / FILLER
        size = await asyncio.to_thread(_fill, self.filler)
        return f"disk-full {self.node}: its {TMPFS_MB} MiB tmpfs filled to ENOSPC ({size // 1024} KiB of filler)"

    async def heal(self, ctx: FaultContext) -> None:
        p = ctx.cluster.nodes[self.node]
        if self.filler is not None:
            self.filler.unlink(missing_ok=True)
        if p.proc is not None and p.proc.returncode is None:
            cleared = await _alarm_cleared(ctx, self.node)
            if cleared is not None:
                ctx.schedule.append(f"disk-full {self.node}: kept serving while its disk was full ({cleared})")
                return
        # it stopped (or is stopping) on a write the full disk refused: the ENOSPC line, then
        # started again now that there is room
        await _stopped_on_enospc(ctx, self.node)


@register
class DiskError(DiskNemesis):
    name = "disk-error"

    async def inject(self, ctx: FaultContext) -> str:
        self.node = list(ctx.cluster.nodes)[-1]  # priority 0: a replica of every partition
        await asyncio.to_thread(self.disks[self.node].fail_io, "all")
        return f"disk-error {self.node}: every write and fsync fails with EIO"

    async def heal(self, ctx: FaultContext) -> None:
        await asyncio.to_thread(self.disks[self.node].fail_io, "off")
        st = await asyncio.to_thread(self.disks[self.node].stats)
        ctx.schedule.append(f"disk-error {self.node}: {st['failed_ios']} write(s)/fsync(s) failed")
        # a node may stop on a disk that fails (fail-stop): it must come back on a healthy one
        await _revive(ctx, self.node, "its disk failed", fatal=False)


@register
class FsyncError(DiskNemesis):
    name = "fsync-error"

    def __init__(self) -> None:
        super().__init__()
        self.before: dict[str, int] = {}  # node -> the I/Os its disk had failed before this fault

    async def inject(self, ctx: FaultContext) -> str:
        self.nodes = await self._targets(ctx)
        for n in self.nodes:
            self.before[n] = (await asyncio.to_thread(self.disks[n].stats))["failed_ios"]
        said = []
        for i, n in enumerate(self.nodes):
            if i:  # (from the moment the first node's disk has failed an fsync)
                first = self.nodes[0]
                struck = await self._struck(ctx, first, "failed_ios", self.before[first])
                await asyncio.to_thread(self.disks[n].fail_io, "fsync")
                said.append(f"then ({'once' if struck else 'though not yet'} {first}'s had failed one) {n}: the same")
                continue
            await asyncio.to_thread(self.disks[n].fail_io, "fsync")
            said.append(f"{n}: every fsync fails with EIO (writes succeed)")
        self.cut = frozenset(self.nodes)  # (the faulted nodes: their actives move)
        return f"{self.name} " + "; ".join(said)

    async def heal(self, ctx: FaultContext) -> None:
        for n in self.nodes:
            await asyncio.to_thread(self.disks[n].fail_io, "off")
        for n in self.nodes:
            failed = (await asyncio.to_thread(self.disks[n].stats))["failed_ios"] - self.before[n]
            ctx.schedule.append(f"{self.name} {n}: {failed} fsync(s) failed")
            p = ctx.cluster.nodes[n]
            if failed and p.proc is not None and p.proc.returncode is None:
                # (a failed fsync is never retried: the pages it could not write may be gone)
                ctx.failures.append(f"{n} kept running after {failed} failed fsync(s)")
                continue
            await _revive(ctx, n, "its fsyncs failed", fatal=False)


FsyncErrorTwo = two_nodes(FsyncError)


@register
class BadSector(DiskNemesis):
    name = "bad-sector"

    def __init__(self) -> None:
        super().__init__()
        self.bad: dict[str, dict[str, Any]] = {}  # node -> its unreadable sector (powerfs's word)

    async def inject(self, ctx: FaultContext) -> str:
        self.nodes = await self._targets(ctx)
        self.cut = frozenset(self.nodes)
        said = await self._damage(ctx, self.nodes[0])
        return f"{self.name} {said}" + (f"; then {', '.join(self.nodes[1:])} once it is repaired"
                                        if len(self.nodes) > 1 else "")

    async def _damage(self, ctx: FaultContext, node: str) -> str:
        """kill -9 ``node`` and make a sector of its newest log segment unreadable; what was done."""
        await ctx.cluster.nodes[node].kill()
        segs = sorted((Path(ctx.cluster.nodes[node].data_dir) / "tandem.db-log").glob("*.seg"))
        size = segs[-1].stat().st_size if segs else 0
        if size <= BAD_MARGIN:
            return f"{node}: kill -9, its newest log segment too short for a bad sector ({size} B)"
        # (a sector drawn again replaces the last: one bad sector a node; after SECTOR_DRAWS the
        # last one drawn stays, still a fault, and the line says where)
        for _ in range(SECTOR_DRAWS):
            seed = ctx.rng.getrandbits(32)
            bad = await asyncio.to_thread(self.disks[node].bad_sector, segs[-1].name, seed)
            if bad["offset"] < size - BAD_MARGIN:
                break
        self.bad[node] = bad
        return (f"{node}: kill -9, the sector at byte {bad['offset']} of {segs[-1].name} ({size} B) unreadable "
                f"(seed {seed})")

    async def heal(self, ctx: FaultContext) -> None:
        for i, n in enumerate(self.nodes):
            if i:
                ctx.schedule.append(f"{self.name} {await self._damage(ctx, n)}")
            await ctx.cluster.nodes[n].start()
            await self._judge(ctx, n)

    async def _judge(self, ctx: FaultContext, node: str) -> None:
        """``node`` restarted: did it name the unreadable bytes, and has the queue caught up."""
        if node not in self.bad:
            return
        got = await _event(ctx, node, "log-damaged", "unreadable")
        try:
            await caught_up_past(ctx.cluster, ctx.cfg.partitions, ctx.clock.monotonic() + REPAIR_WAIT, ctx.clock)
            repaired = True
        except UnavailableError:
            repaired = False
        ctx.schedule.append(f"{self.name} {node}: injected 1, detected {int(bool(got))}, repaired "
                            f"{int(bool(got) and repaired)}" + (f" ({got})" if got else ""))
        if not got:
            ctx.failures.append(f"{self.name} {node}: the sector at byte {self.bad[node]['offset']} could not be "
                                f"read, and the node did not say so")
        if not repaired:
            ctx.failures.append(f"{self.name} {node}: the queue's replicas did not all catch up within "
                                f"{REPAIR_WAIT:.0f} s of its restart")


BadSectorTwo = two_nodes(BadSector)


async def _event(ctx: FaultContext, node: str, kind: str, word: str) -> str:
    """``node``'s first status event of ``kind`` that says ``word``, within :data:`DETECT_WAIT`;
    "" for none."""
    return await said(ctx, node, lambda events: next((e for e in events if e.startswith(kind) and word in e), ""))


async def said(ctx: FaultContext, node: str, what: Callable[[list[str]], str], wait: float = DETECT_WAIT) -> str:
    """What ``what`` finds in ``node``'s status events (a node not answering has none yet),
    polled until it finds something or ``wait`` seconds have passed; "" for nothing."""
    deadline = ctx.clock.monotonic() + wait
    while True:
        try:
            events = (await ctx.cluster.status(node)).events
        except (TandemError, OSError):
            events = []
        found = what(events)
        if found or ctx.clock.monotonic() > deadline:
            return found
        await ctx.clock.sleep(0.2)  # (polling the node's words with a deadline)


def _torn_tail(data: Path) -> bool:
    """Whether the newest segment of a node's replication log ends inside a record (what its
    next start cuts off: ``tandem scrub``'s reading)."""
    log_dir = data / "tandem.db-log"
    return log_dir.is_dir() and bool(scan(log_dir)[2])


async def _revive(ctx: FaultContext, node: str, what: str, *, fatal: bool = True) -> None:
    """If ``node``'s process died of the fault, start it again (the run goes on and checks every
    message) and say so in the schedule; with ``fatal`` that fails the run too."""
    p = ctx.cluster.nodes[node]
    proc = p.proc
    if proc is not None and proc.returncode is None:
        return
    await p.wait()  # (its output all in the log)
    why = [line for line in p.log_text().splitlines() if " CRITICAL " in line and "exiting" not in line][-1:]
    line = f"{node} exited (status {proc.returncode if proc else None}) while {what}" + \
        (f": {why[0].split(' CRITICAL ', 1)[1]}" if why else "")
    ctx.schedule.append(line + "; started again")
    if fatal:
        ctx.failures.append(line)
    await p.start()


#: what a CRITICAL line of a node stopped by a full disk names (the OS's ENOSPC, SQLite's SQLITE_FULL)
ENOSPC_WORDS = ("No space left on device", "database or disk is full")
#: seconds a node that kept serving has to clear its disk alarm once the space is freed
CLEAR_WAIT = 10.0


async def _alarm_cleared(ctx: FaultContext, node: str) -> str | None:
    """Until ``node``'s disk alarm is clear (polled with a deadline): what its events said,
    for the schedule; None if the process exited meanwhile."""
    p = ctx.cluster.nodes[node]
    give_up = ctx.clock.monotonic() + CLEAR_WAIT
    last = ""
    while p.proc is not None and p.proc.returncode is None:
        try:
            events = [e for e in (await ctx.cluster.status(node)).events if e.startswith(f"disk-alarm {node}: ")]
        except (TandemError, OSError):
            events = None  # (busy or stopping: looked at again)
        if events is not None:
            if not events:
                return "its disk alarm was never raised"
            last = events[-1]
            if ": cleared: " in last:
                raised = sum(1 for e in events if ": cleared: " not in e)
                return f"disk alarm raised {raised} time(s), its publishes refused; cleared once the space was freed"
        if ctx.clock.monotonic() > give_up:
            ctx.failures.append(f"{node} kept serving but its disk alarm was not cleared {CLEAR_WAIT:g} s after the "
                                f"space was freed (last event: {last or 'none'})")
            return "its disk alarm did not clear"
        await ctx.clock.sleep(0.05)  # polling a real process, bounded by CLEAR_WAIT
    return None


async def _stopped_on_enospc(ctx: FaultContext, node: str) -> None:
    """``node`` exited while its disk was full: with status 1 and the ENOSPC line, else the run
    fails; started again either way (the space is freed), and said in the schedule."""
    p = ctx.cluster.nodes[node]
    code = await p.wait()  # (its output all in the log)
    lines = [line.split(" CRITICAL ", 1)[1] for line in p.log_text().splitlines()
             if " CRITICAL " in line and "exiting" not in line]
    why = lines[-1] if lines else "no CRITICAL line"
    ctx.schedule.append(f"disk-full {node}: stopped (status {code}) while its disk was full: {why}; "
                        "started again once the space was freed")
    if code != 1 or not lines or not any(w in why for w in ENOSPC_WORDS):
        ctx.failures.append(f"{node} exited (status {code}) while its disk was full, not on the ENOSPC line "
                            f"(status 1, a CRITICAL line naming ENOSPC): {why}")
    await p.start()


def _fill(path: Path) -> int:
    """Write ``path`` until the file system has no room left; its size."""
    size = 0
    with open(path, "wb", buffering=0) as f:
        for chunk in (1 << 20, 1 << 12):
            block = b"\0" * chunk
            while True:
                try:
                    size += f.write(block) or 0
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    return size


async def _run(*cmd: str) -> None:
    r = await asyncio.to_thread(subprocess.run, list(cmd), capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise UnavailableError(f"{' '.join(cmd)}: {r.stderr.strip() or f'status {r.returncode}'}")


__all__ = ["DiskError", "DiskFull", "DiskNemesis", "PowerLoss", "PowerLossAll", "missing", "mounted"]
