"""Network faults: the group's nodes each in a network namespace (``--net netns``,
:mod:`broker.tools.netns`), links cut by iptables ``DROP`` rules inside the namespaces, by peer
address.  The drill's clients reach the nodes from the bridge's address, which no rule names:
producers, consumers and status polls are never cut, so they see what the group does about
its broken links, not a client-side outage.

* ``isolate-active``: the node active for most partitions drops everything to and from its peers.
* ``partition``: a random minority (half the group, rounded down, less one; at least one node)
  drops everything to and from the majority.
* ``bridge``: one random node sees everyone; the others, in two random halves, do not see the
  other half.
* ``one-way``: the node active for most partitions hears its peers but is not heard (its packets
  to them are dropped); ``one-way-reverse``: it is heard but does not hear.
* ``flap``: a random node isolated for 1-2 s, healed, the next one isolated, for the whole hold.
* ``loss``: every node drops a random share (``--loss``, default 20 %) of the packets it gets
  from its peers (``-m statistic --mode random``).
"""

from __future__ import annotations

import asyncio
from typing import ClassVar

from broker.tools.drill.nemesis import FaultContext, Nemesis, register
from broker.tools.netns import NetnsGroup
from client.errors import UnavailableError

#: the families' fault length unless ``--hold`` says: past the failure detection and an
#: election (1 s and 1-1.5 s by default), so the healthy side elects before the heal
NET_HOLD = 5.0


class NetFault(Nemesis):
    """A fault made of DROP rules in the nodes' namespaces; healed by flushing them all."""

    needs: ClassVar[frozenset[str]] = frozenset({"netns", "root"})
    hold: ClassVar[float | None] = NET_HOLD

    @staticmethod
    def net(ctx: FaultContext) -> NetnsGroup:
        net = getattr(ctx.cluster, "netns", None)
        if net is None or not net.up:
            raise UnavailableError("a network fault needs the group in network namespaces (--net netns)")
        return net

    @staticmethod
    def names(ctx: FaultContext) -> list[str]:
        return sorted(ctx.cluster.nodes)

    async def split(self, ctx: FaultContext, side: list[str], other: list[str], *, inbound: bool = True,
                    outbound: bool = True) -> None:
        """Every node of ``side`` drops (``inbound``: what it gets from, ``outbound``: what it
        sends to) every node of ``other``: rules on one side are enough for both directions."""
        net = self.net(ctx)
        await asyncio.gather(*(asyncio.to_thread(net.block, n, other, inbound=inbound, outbound=outbound)
                               for n in side))

    async def heal(self, ctx: FaultContext) -> None:
        await asyncio.to_thread(self.net(ctx).clear)

    async def close(self, ctx: FaultContext) -> None:
        net = getattr(ctx.cluster, "netns", None)
        if net is not None and net.up:
            await asyncio.to_thread(net.clear)


@register
class IsolateActive(NetFault):
    name = "isolate-active"
    keeps_actives = True

    async def inject(self, ctx: FaultContext) -> str:
        target = await ctx.target()
        others = [n for n in self.names(ctx) if n != target]
        await self.split(ctx, [target], others)
        self.cut = frozenset({target})
        return f"isolate-active: {target} cut off from {', '.join(others)}"


@register
class Partition(NetFault):
    name = "partition"
    keeps_actives = True

    async def inject(self, ctx: FaultContext) -> str:
        names = self.names(ctx)
        minority = sorted(ctx.rng.sample(names, max(1, (len(names) - 1) // 2)))
        majority = [n for n in names if n not in minority]
        await self.split(ctx, minority, majority)
        self.cut = frozenset(minority)
        return f"partition: {', '.join(minority)} | {', '.join(majority)}"


@register
class Bridge(NetFault):
    name = "bridge"

    async def inject(self, ctx: FaultContext) -> str:
        names = self.names(ctx)
        if len(names) < 3:
            raise UnavailableError("bridge needs at least 3 nodes (two halves and the node between them)")
        middle = ctx.rng.choice(names)
        rest = [n for n in names if n != middle]
        ctx.rng.shuffle(rest)
        left, right = sorted(rest[:len(rest) // 2]), sorted(rest[len(rest) // 2:])
        await self.split(ctx, left, right)
        self.cut = frozenset(rest)
        return f"bridge: {', '.join(left)} | {', '.join(right)}, {middle} sees both"


@register
class OneWay(NetFault):
    name = "one-way"
    #: whether the target hears (its peers' packets reach it) rather than is heard
    hears: ClassVar[bool] = True

    async def inject(self, ctx: FaultContext) -> str:
        target = await ctx.target()
        others = [n for n in self.names(ctx) if n != target]
        await self.split(ctx, [target], others, inbound=not self.hears, outbound=self.hears)
        self.cut = frozenset({target})
        how = "hears its peers, is not heard" if self.hears else "is heard, does not hear its peers"
        return f"{self.name}: {target} {how}"


@register
class OneWayReverse(OneWay):
    name = "one-way-reverse"
    hears = False


@register
class Flap(NetFault):
    name = "flap"
    hold = 8.0

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    async def inject(self, ctx: FaultContext) -> str:
        self.cut = frozenset()
        self._stopping.clear()
        self._task = asyncio.create_task(self._flap(ctx))
        return "flap: a random node isolated for 1-2 s, then the next, until the heal"

    async def _flap(self, ctx: FaultContext) -> None:
        names, net = self.names(ctx), self.net(ctx)
        while not self._stopping.is_set():
            node = ctx.rng.choice(names)
            await asyncio.to_thread(net.clear)
            await asyncio.to_thread(net.block, node, names)
            self.cut = self.cut | {node}
            ctx.schedule.append(f"flap: {node} isolated")
            try:  # the flap's own rhythm (1-2 s), cut short by the heal
                async with ctx.clock.timeout(ctx.rng.uniform(1.0, 2.0)):
                    await self._stopping.wait()
            except TimeoutError:
                pass

    async def _stop(self) -> None:
        """Stop flapping: the step under way ends first (never a rule added after the heal)."""
        task, self._task = self._task, None
        self._stopping.set()
        if task is not None:
            await task  # a failure of the flapping itself is raised here

    async def heal(self, ctx: FaultContext) -> None:
        await self._stop()
        await super().heal(ctx)

    async def close(self, ctx: FaultContext) -> None:
        await self._stop()
        await super().close(ctx)


@register
class Loss(NetFault):
    name = "loss"

    async def inject(self, ctx: FaultContext) -> str:
        names, net = self.names(ctx), self.net(ctx)
        p = ctx.cfg.loss
        await asyncio.gather(*(asyncio.to_thread(net.lose, n, names, p) for n in names))
        self.cut = frozenset()
        return f"loss: every node drops {p:.0%} of its peers' packets"
