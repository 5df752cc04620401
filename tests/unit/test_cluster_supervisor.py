"""tandem cluster up's Supervisor: a node that dies is named once and started again, later
while it keeps dying; on a FakeClock, with stand-ins for the node processes."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest

from broker.tools.cluster_up import RESTART_CAP, STEADY, Supervisor, how_it_ended
from broker.tools.process import NodeStartError
from client.testing import FakeClock

class FakeNode:
    """What the Supervisor uses of a NodeProcess; the test decides when it dies."""

    def __init__(self, name: str, root: Path, clock: FakeClock) -> None:
        self.name = name
        self.log_path = root / f"{name}.log"
        self.clock = clock
        self.pid = 100
        self.exits: asyncio.Queue[int] = asyncio.Queue()
        self.started_at: list[float] = []
        self.fail_starts = 0

    async def wait(self) -> int:
        return await self.exits.get()

    async def start(self) -> FakeNode:
        self.started_at.append(self.clock.monotonic())
        if self.fail_starts:
            self.fail_starts -= 1
            raise NodeStartError(f"node {self.name} did not start: exited with status 1\n(log tail)")
        self.pid += 1
        return self


def test_how_it_ended() -> None:
    assert how_it_ended(-signal.SIGKILL) == "killed by SIGKILL"
    assert how_it_ended(1) == "exited with status 1"
    assert how_it_ended(0) == "exited with status 0"


@pytest.mark.asyncio
async def test_a_dead_node_is_started_again_later_while_it_keeps_dying(tmp_path: Path) -> None:
    clock = FakeClock(autojump=True)
    node = FakeNode("node1", tmp_path, clock)
    lines: asyncio.Queue[str] = asyncio.Queue()
    cluster = SimpleNamespace(data_dir=tmp_path, nodes={"node1": node}, processes={"node1": node})
    sup = Supervisor(cluster, restart_delay=2.0, clock=clock, say=lines.put_nowait)  # type: ignore[arg-type]
    sup.write_pid(node)  # type: ignore[arg-type]
    watch = asyncio.create_task(sup.watch("node1"))
    try:
        node.exits.put_nowait(-signal.SIGKILL)
        line = await lines.get()
        assert line.startswith("node1 killed by SIGKILL; the others keep serving; starting it again in 2 s")
        assert not (tmp_path / "node1.pid").exists()
        assert await lines.get() == "node1 is back (pid 101)"
        assert node.started_at == [2.0]
        assert (tmp_path / "node1.pid").read_text() == "101\n"

        node.fail_starts = 1  # dies again at once, and the first start after that fails
        node.exits.put_nowait(1)
        line = await lines.get()
        assert line.startswith("node1 exited with status 1; the others keep serving; starting it again in 4 s "
                               "(it keeps dying: waiting 4 s)")
        assert (await lines.get()).startswith("node node1 did not start: exited with status 1; trying again in 8 s")
        assert await lines.get() == "node1 is back (pid 102)"
        assert node.started_at == [2.0, 6.0, 14.0]

        await clock.sleep(STEADY)  # up long enough: the next death waits the first delay again
        node.exits.put_nowait(-signal.SIGTERM)
        assert "starting it again in 2 s" in await lines.get()
        assert await lines.get() == "node1 is back (pid 103)"
        assert node.started_at[-1] == 14.0 + STEADY + 2.0
        assert lines.empty()
    finally:
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
        await clock.aclose()


@pytest.mark.asyncio
async def test_the_delay_stops_growing_at_the_cap(tmp_path: Path) -> None:
    clock = FakeClock(autojump=True)
    node = FakeNode("node2", tmp_path, clock)
    node.fail_starts = 10
    lines: asyncio.Queue[str] = asyncio.Queue()
    cluster = SimpleNamespace(data_dir=tmp_path, nodes={"node2": node}, processes={"node2": node})
    sup = Supervisor(cluster, restart_delay=2.0, clock=clock, say=lines.put_nowait)  # type: ignore[arg-type]
    watch = asyncio.create_task(sup.watch("node2"))
    try:
        node.exits.put_nowait(-signal.SIGKILL)
        while await lines.get() != "node2 is back (pid 101)":
            pass
        gaps = [b - a for a, b in zip(node.started_at, node.started_at[1:])]
        assert gaps[:4] == [4.0, 8.0, 16.0, RESTART_CAP] and max(gaps) == RESTART_CAP
    finally:
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
        await clock.aclose()


@pytest.mark.asyncio
async def test_restart_delay_zero_leaves_the_node_down(tmp_path: Path) -> None:
    clock = FakeClock(autojump=True)
    node = FakeNode("node3", tmp_path, clock)
    lines: asyncio.Queue[str] = asyncio.Queue()
    cluster = SimpleNamespace(data_dir=tmp_path, nodes={"node3": node}, processes={"node3": node})
    sup = Supervisor(cluster, restart_delay=0, clock=clock, say=lines.put_nowait)  # type: ignore[arg-type]
    watch = asyncio.create_task(sup.watch("node3"))
    node.exits.put_nowait(-signal.SIGKILL)
    await watch  # it returns: nothing more to do
    assert "it stays down" in await lines.get()
    assert node.started_at == []
    await clock.aclose()
