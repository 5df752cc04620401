"""Process fault families: ``kill`` (kill -9 a node, start it again) and ``pause`` (SIGSTOP a
node, SIGCONT).  Both hit the node active for the most partitions when the fault starts, as
the kill-active and pause-active drills do."""

from __future__ import annotations

from typing import ClassVar

from broker.tools.drill.nemesis import FaultContext, Nemesis, register


@register
class Kill(Nemesis):
    """``kill -9`` the node active for the most partitions; healing starts it again (it rejoins
    and catches up)."""

    name: ClassVar[str] = "kill"

    def __init__(self) -> None:
        self.target: str | None = None

    async def inject(self, ctx: FaultContext) -> str:
        self.target = await ctx.target()
        await ctx.cluster.nodes[self.target].kill()
        return f"kill -9 {self.target}"

    async def heal(self, ctx: FaultContext) -> None:
        if self.target is not None:
            node = ctx.cluster.nodes[self.target]
            if node.proc is None or node.proc.returncode is not None:
                await node.start()
            self.target = None


@register
class Pause(Nemesis):
    """SIGSTOP the node active for the most partitions (its sockets stay open, it answers
    nothing); healing sends SIGCONT: it must step down, not write."""

    name: ClassVar[str] = "pause"

    def __init__(self) -> None:
        self.target: str | None = None

    async def inject(self, ctx: FaultContext) -> str:
        self.target = await ctx.target()
        ctx.cluster.nodes[self.target].pause()
        return f"SIGSTOP {self.target}"

    async def heal(self, ctx: FaultContext) -> None:
        await self.close(ctx)

    async def close(self, ctx: FaultContext) -> None:
        if self.target is not None:
            ctx.cluster.nodes[self.target].resume()
            self.target = None
