"""Every task a node creates has an owner that its stop ends (STYLE rule 14)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

import client
from broker.config import NodeConfig
from broker.node.node import Node
from storage.memory import MemoryDisk, MemoryEngine
from tests.conftest import url_of
from tests.helpers import wait_until

pytestmark = pytest.mark.asyncio


def _node(engine: str, tmp_path: Path) -> Node:
    if engine == "memory":
        disk = MemoryDisk()
        return Node(NodeConfig(data_dir=tmp_path / "node1", port=0), engine=lambda _cfg: MemoryEngine(disk))
    return Node(NodeConfig(data_dir=tmp_path / "node1", port=0))


@pytest.mark.parametrize("engine", ["sqlite", "memory"])
async def test_after_stop_no_task_the_node_created_is_alive(engine: str, tmp_path: Path) -> None:
    before = asyncio.all_tasks()
    n = _node(engine, tmp_path)
    await n.start()
    c = await client.connect(url_of(n))
    await c.declare_queue("orders", partitions=3)
    await c.producer("orders").send_many([(f"m{i}".encode(), f"k{i}") for i in range(30)])
    await c.create_user("bob", "bob-password-1")
    async with c.consumer("orders", prefetch=5) as cons:
        assert await cons.next(5.0) is not None
    await c.close()
    forever = asyncio.Event()
    n.spawn(forever.wait())  # spawned work that does not end on its own
    n.spawn(asyncio.sleep(3600))
    await n.stop()
    me = asyncio.current_task()
    alive = sorted(t.get_name() for t in asyncio.all_tasks() - before if t is not me and not t.done())
    assert alive == []
    # and nothing is spawned once the node stopped: refused, never run
    ran = []

    async def late() -> None:
        ran.append(1)

    n.spawn(late())
    await asyncio.sleep(0)
    assert ran == [] and not (asyncio.all_tasks() - before - {me})


async def test_a_spawned_task_that_fails_is_logged_with_its_name(node: Node, caplog: pytest.LogCaptureFixture) -> None:
    async def boom() -> None:
        raise ValueError("the sweep broke")

    def ours(r: logging.LogRecord) -> bool:  # (not asyncio's "never retrieved" at collection)
        return r.name == "tandem.broker" and "the sweep broke" in r.getMessage()

    with caplog.at_level(logging.ERROR, logger="tandem.broker"):
        node.spawn(boom())
        await wait_until(lambda: any(ours(r) for r in caplog.records), timeout=5.0, what="the failure logged")
    [rec] = [r for r in caplog.records if ours(r)]
    assert "boom" in rec.getMessage() and rec.levelno == logging.ERROR  # the task's name
    assert rec.exc_info is not None and isinstance(rec.exc_info[1], ValueError)
