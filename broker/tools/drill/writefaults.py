"""The disk fault families of writes a disk did not keep as they were made: fsyncs that lie, lost
and misdirected writes, and a power cut after writes it made out of order, on one node or on
two (the ``-two`` families: a majority of a group of three, the second faulted later than the
first), or on every node (``reordered-write-all``).

They run on the disks :mod:`broker.tools.drill.diskfaults` mounts (root, FUSE).

* ``lying-fsync``: every fsync of the node active for the most partitions answers success and
  syncs nothing for the hold (a disk whose write cache lies); then its power is cut (kill -9, its
  disk rolled back to its last fsync before the lying began), and after 3 x
  ``non_response_timeout`` it starts again.  It comes back without entries it acknowledged: the
  group must still hold every confirmed message (a quorum had each), the actives of the
  partitions it is a replica of must name what it lost (``replica-went-back`` in their status
  events, within :data:`WENT_BACK_WAIT`; none named fails the run), and it takes the entries
  back from them.
* ``lying-fsync-two``: the fsyncs of two nodes lie from the same moment; at the heal the first's
  power is cut and it is started again as above, and only once an active has named what it lost
  is the second's power cut (then the same for it).  Both cut at once would lose what only the
  two of them had acknowledged, in any system: the quorum that confirmed it kept nothing.
* ``lost-write``: the next write to a replication log segment of the node active for the most
  partitions is acknowledged and never made (its bytes stay zeros; the writes after it land), so
  its log holds a hole it knows nothing of.  At the heal it is killed (kill -9) and started again:
  it must find the hole (a ``log-damaged`` status event naming the segment, within
  :data:`DETECT_WAIT`; a hole at the very end of its log reads as a torn tail, cut off and said
  so), go on from its store, catch up from the group, and lose nothing confirmed.  A lost write
  the node did not find fails the run.
* ``misdirected-write``: the same, and the lost write's bytes land 1-64 sectors (drawn from the
  run's seeded source) before where they were meant to, over records written earlier: a hole
  and damaged records the node must find at start, as above.
* ``lost-write-two``, ``misdirected-write-two``: the same on two nodes, the second's fault armed
  once the first's write is lost (so it takes a later write, at another place in another log);
  at the heal both are killed together and started together, and each must find its own.
* ``reordered-write``: kill -9 the node active for the most partitions and roll its disk back as
  a disk that wrote what came since each file's last fsync in an order of its own leaves it
  (powerfs ``rollback-reordered``: any of those sectors kept).  At the heal it starts again: a
  hole in its log with records after it must be said (cut off as a write the machine did not
  finish, or named as damage: :func:`_hole_found`), and every copy of the queue must catch up
  within :data:`REPAIR_WAIT`.  ``reordered-write-two`` does it to two nodes at once,
  ``reordered-write-all`` to every node (the whole group's power cut).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, ClassVar

from broker.tools.drill.diskfaults import DETECT_WAIT, REPAIR_WAIT, DiskNemesis, said, two_nodes
from broker.tools.drill.groups import caught_up_past
from broker.tools.drill.nemesis import FaultContext, register
from broker.tools.powerfs_mount import PowerFS
from client.errors import TandemError, UnavailableError
from storage.segfiles import scan

#: seconds the other nodes are given to name what a node whose fsyncs lied lost (lying-fsync)
WENT_BACK_WAIT = 10.0


@register
class LyingFsync(DiskNemesis):
    name = "lying-fsync"

    async def inject(self, ctx: FaultContext) -> str:
        self.nodes = await self._targets(ctx)
        for n in self.nodes:
            await asyncio.to_thread(self.disks[n].lie_fsync, True)
        # (its actives move when its power is cut at the heal: not a deposition)
        self.cut = frozenset(self.nodes)
        return f"{self.name} {' and '.join(self.nodes)}: every fsync answers success and syncs nothing"

    async def heal(self, ctx: FaultContext) -> None:
        for n in self.nodes:  # one after the other: see the module
            await self._cut_power(ctx, n)

    async def _cut_power(self, ctx: FaultContext, node: str) -> None:
        disk = self.disks[node]
        lied = (await asyncio.to_thread(disk.stats))["lied_syncs"]
        lost = await self._power_loss(ctx, [node])
        await asyncio.to_thread(disk.lie_fsync, False)
        off = round(3 * ctx.cfg.nrt, 1)
        await ctx.clock.sleep(off)  # (the power stays off a while: the schedule's own step, not a wait for a state)
        await ctx.cluster.nodes[node].start()
        seen = await _went_back_seen(ctx, node)
        ctx.schedule.append(f"{self.name} {node}: {lied} fsync(s) lied about; kill -9, {lost}; off {off} s; "
                            + (f"its lost entries named by {', '.join(seen)} (replica-went-back)" if seen else
                               "no active named its lost entries"))
        if lied and not seen:
            ctx.failures.append(f"{self.name} {node}: {lied} fsync(s) lied about, and no active named the "
                                f"entries it lost")


LyingFsyncTwo = two_nodes(LyingFsync)


async def _went_back_seen(ctx: FaultContext, node: str) -> list[str]:
    """The other nodes whose status events say ``node`` lost entries it had acknowledged, as soon
    as one does, within :data:`WENT_BACK_WAIT` (an active sees it at its first append to the node)."""
    others = sorted(n for n in ctx.cluster.nodes if n != node)
    deadline = ctx.clock.monotonic() + WENT_BACK_WAIT
    while True:
        seen = []
        for n in others:
            try:
                events = (await ctx.cluster.status(n)).events
            except (TandemError, OSError):
                continue
            if any(e.startswith("replica-went-back") and f": {node}'s log ends at" in e for e in events):
                seen.append(n)
        if seen or ctx.clock.monotonic() > deadline:
            return seen
        await ctx.clock.sleep(0.2)  # (polling the nodes' words with a deadline)


@register
class LostWrite(DiskNemesis):
    name = "lost-write"

    def __init__(self) -> None:
        super().__init__()
        self.before: dict[str, int] = {}  # node -> the writes its disk had lost before this fault

    async def inject(self, ctx: FaultContext) -> str:
        self.nodes = await self._targets(ctx)
        said = []
        for i, n in enumerate(self.nodes):
            when = ""
            if i:  # (once the first node's write is lost: another write, in another log)
                first = self.nodes[0]
                struck = await self._struck(ctx, first, "lost", self.before[first])
                when = f"then ({'once' if struck else 'though not yet'} {first}'s had struck) "
            disk = self.disks[n]
            self.before[n] = len((await asyncio.to_thread(disk.stats))["lost"])
            said.append(when + await self._arm(ctx, n, disk))
        self.cut = frozenset(self.nodes)  # (killed at the heal: its actives move then)
        return f"{self.name} " + "; ".join(said)

    async def _arm(self, ctx: FaultContext, node: str, disk: PowerFS) -> str:
        await asyncio.to_thread(disk.lose_write, ".seg")
        return f"{node}: its next replication log write is acknowledged and never made"

    def _what(self, w: dict[str, Any]) -> str:
        return f"the write of {w['bytes']} B at byte {w['offset']} of {w['path'].rsplit('/', 1)[-1]} lost"

    async def heal(self, ctx: FaultContext) -> None:
        lost = {}
        for n in self.nodes:
            disk = self.disks[n]
            await asyncio.to_thread(disk.lose_write, "off")  # (a write not lost during the hold never is)
            lost[n] = (await asyncio.to_thread(disk.stats))["lost"][self.before[n]:]
        procs = [ctx.cluster.nodes[n] for n in self.nodes]
        await asyncio.gather(*(p.kill() for p in procs))
        before = {n: len(p.log_text()) for n, p in zip(self.nodes, procs)}
        await asyncio.gather(*(p.start() for p in procs))
        for n in self.nodes:
            if not lost[n]:
                ctx.schedule.append(f"{self.name} {n}: no write reached its log during the hold; kill -9, "
                                    f"started again")
                continue
            what = self._what(lost[n][0])
            found = await _hole_found(ctx, n, before[n])
            ctx.schedule.append(f"{self.name} {n}: {what}; kill -9, started again: "
                                + (f"found ({found})" if found else "NOT found"))
            if not found:
                ctx.failures.append(f"{self.name} {n}: {what}, and the node did not find the damage it left")


LostWriteTwo = two_nodes(LostWrite)


@register
class MisdirectedWrite(LostWrite):
    name = "misdirected-write"

    async def _arm(self, ctx: FaultContext, node: str, disk: PowerFS) -> str:
        seed = ctx.rng.getrandbits(32)
        await asyncio.to_thread(disk.misdirect_write, ".seg", seed)
        return (f"{node}: its next replication log write lands sectors before its place (seed {seed}), which keeps "
                f"its old bytes")

    def _what(self, w: dict[str, Any]) -> str:
        where = f"the write of {w['bytes']} B meant for byte {w['offset']} of {w['path'].rsplit('/', 1)[-1]}"
        return f"{where} landed at byte {w['to']}" if "to" in w else f"{where} lost (no sector before it)"


MisdirectedWriteTwo = two_nodes(MisdirectedWrite)


@register
class ReorderedWrite(DiskNemesis):
    name = "reordered-write"
    #: every node's power is cut at once (``reordered-write-all``), not only the busiest active's
    every: ClassVar[bool] = False

    def __init__(self) -> None:
        super().__init__()
        self.holed: dict[str, bool] = {}  # node -> its log held a hole, or ended inside a record

    async def inject(self, ctx: FaultContext) -> str:
        self.nodes = sorted(ctx.cluster.nodes) if self.every else await self._targets(ctx)
        await asyncio.gather(*(ctx.cluster.nodes[n].kill() for n in self.nodes))
        said = []
        for n in self.nodes:
            seed = ctx.rng.getrandbits(32)
            out = await asyncio.to_thread(self.disks[n].rollback_reordered, seed)
            log_dir = Path(ctx.cluster.nodes[n].data_dir) / "tandem.db-log"
            _good, damage, torn = await asyncio.to_thread(scan, log_dir) if log_dir.is_dir() else (0, [], [])
            self.holed[n] = bool(damage or torn)
            # (as tandem scrub reads it: a hole in what an fdatasync reached is damage; one past it, or
            # a record cut short at the end, is a torn tail)
            said.append(f"{n}: kill -9, rolled back {out['bytes']} B in {out['files']} file(s), kept {out['kept']} B "
                        f"past their last fsync in sectors drawn from seed {seed}; its log "
                        + (f"holds {len(damage)} hole(s) with records after them" if damage else
                           "has a hole past its last fdatasync" if torn and "fdatasync" in torn[0] else
                           "ends inside a record" if torn else "ends at a whole record"))
        self.cut = frozenset(self.nodes)  # (their actives move)
        return f"{self.name} " + "; ".join(said)

    async def heal(self, ctx: FaultContext) -> None:
        procs = {n: ctx.cluster.nodes[n] for n in self.nodes}
        before = {n: len(p.log_text()) for n, p in procs.items()}
        await asyncio.gather(*(p.start() for p in procs.values()))
        for n in self.nodes:
            if self.holed[n]:
                found = await _hole_found(ctx, n, before[n])
                ctx.schedule.append(f"{self.name} {n}: the end of its log " + (f"said ({found})" if found else
                                                                               "NOT said"))
                if not found:
                    ctx.failures.append(f"{self.name} {n}: its log held a hole or a torn end, and the node did not "
                                        f"say so")
        try:
            await caught_up_past(ctx.cluster, ctx.cfg.partitions, ctx.clock.monotonic() + REPAIR_WAIT, ctx.clock)
        except UnavailableError:
            ctx.failures.append(f"{self.name}: the queue's copies did not all catch up within {REPAIR_WAIT:.0f} s of "
                                f"the restart")


ReorderedWriteTwo = two_nodes(ReorderedWrite)


@register
class ReorderedWriteAll(ReorderedWrite):
    """``reordered-write`` on every node at once: the whole group loses power."""

    name = "reordered-write-all"
    every = True


async def _hole_found(ctx: FaultContext, node: str, before: int) -> str:
    """What the restarted ``node`` said of the hole in its log, within :data:`DETECT_WAIT`: its
    ``log-damaged`` event, or its log's line cutting off a torn tail; "" for nothing."""
    p = ctx.cluster.nodes[node]

    def hole(events: list[str]) -> str:
        damaged = next((e for e in events if e.startswith("log-damaged")), "")
        said = p.log_text()[before:]
        if not damaged and "did not all reach the disk" in said:
            return "what came after its last fdatasync cut off at the first hole, at start (a torn tail)"
        if not damaged and "cut off there" in said:
            return "its log ended inside a record, cut off at start (a torn tail)"
        return damaged

    return await said(ctx, node, hole, DETECT_WAIT)


__all__ = ["LostWrite", "LostWriteTwo", "LyingFsync", "LyingFsyncTwo", "MisdirectedWrite", "MisdirectedWriteTwo",
           "ReorderedWrite", "ReorderedWriteAll", "ReorderedWriteTwo"]
