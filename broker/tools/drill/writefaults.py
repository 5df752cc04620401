"""The disk fault families of writes a disk acknowledged and did not keep: fsyncs that lie, and
lost and misdirected writes, on one node or on two (the ``-two`` families: a majority of a group
of three, the second faulted later than the first).

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
"""

from __future__ import annotations

import asyncio
from typing import Any

from broker.tools.drill.diskfaults import DETECT_WAIT, DiskNemesis, said, two_nodes
from broker.tools.drill.nemesis import FaultContext, register
from broker.tools.powerfs_mount import PowerFS
from client.errors import TandemError

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


async def _hole_found(ctx: FaultContext, node: str, before: int) -> str:
    """What the restarted ``node`` said of the hole in its log, within :data:`DETECT_WAIT`: its
    ``log-damaged`` event, or its log's line cutting off a torn tail; "" for nothing."""
    p = ctx.cluster.nodes[node]

    def hole(events: list[str]) -> str:
        damaged = next((e for e in events if e.startswith("log-damaged")), "")
        if not damaged and "cut off there" in p.log_text()[before:]:
            return "its log ended inside a record, cut off at start (a torn tail)"
        return damaged

    return await said(ctx, node, hole, DETECT_WAIT)


__all__ = ["LostWrite", "LostWriteTwo", "LyingFsync", "LyingFsyncTwo", "MisdirectedWrite", "MisdirectedWriteTwo"]
