"""Every task a node creates has an owner that its stop ends (STYLE rule 14)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

import client
from broker.config import NodeConfig
from broker.node.node import Node
from client.errors import StorageError
from storage.base import LogAppend, WriteOp
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
    n.services.spawn(forever.wait())  # spawned work that does not end on its own
    n.services.spawn(asyncio.sleep(3600))
    await n.stop()
    me = asyncio.current_task()
    alive = sorted(t.get_name() for t in asyncio.all_tasks() - before if t is not me and not t.done())
    assert alive == []
    # and nothing is spawned once the node stopped: refused, never run
    ran = []

    async def late() -> None:
        ran.append(1)

    n.services.spawn(late())
    await asyncio.sleep(0)
    assert ran == [] and not (asyncio.all_tasks() - before - {me})


async def test_a_spawned_task_that_fails_is_logged_with_its_name(node: Node, caplog: pytest.LogCaptureFixture) -> None:
    async def boom() -> None:
        raise ValueError("the sweep broke")

    def ours(r: logging.LogRecord) -> bool:  # (not asyncio's "never retrieved" at collection)
        return r.name == "tandem.broker" and "the sweep broke" in r.getMessage()

    with caplog.at_level(logging.ERROR, logger="tandem.broker"):
        node.services.spawn(boom())
        await wait_until(lambda: any(ours(r) for r in caplog.records), timeout=5.0, what="the failure logged")
    [rec] = [r for r in caplog.records if ours(r)]
    assert "boom" in rec.getMessage() and rec.levelno == logging.ERROR  # the task's name
    assert rec.exc_info is not None and isinstance(rec.exc_info[1], ValueError)


class LogDiskFails(MemoryEngine):
    """A store whose replication log writes fail once ``failing`` is set."""

    failing = False

    def apply(self, ops: list[WriteOp], *, sync: bool, store_sync: bool | None = None) -> None:
        if self.failing and any(isinstance(op, LogAppend) for op in ops):
            raise StorageError("the log's disk is gone")
        super().apply(ops, sync=sync, store_sync=store_sync)


async def test_a_replication_failure_stops_the_node_to_the_end(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Replication stops its node when its state may be inconsistent (a log write failed).
    That stop runs as the node's own task: the replication it stops does not own it, and
    never cancels it; it runs to its end (the store closed, ``stopped`` set)."""
    engine = LogDiskFails()
    n = Node(NodeConfig(name="node1", data_dir=tmp_path / "node1", port=0, peer_port=0),  # a group of one
             engine=lambda _cfg: engine)
    stops: list[asyncio.Task[object] | None] = []
    node_stop = n.stop

    async def stop() -> None:
        stops.append(asyncio.current_task())
        await node_stop()

    monkeypatch.setattr(n, "stop", stop)
    await n.start()
    c = await client.connect(url_of(n), send_timeout=2.0)
    try:
        await c.declare_queue("orders", partitions=1)
        engine.failing = True
        send = asyncio.ensure_future(c.producer("orders").send(b"m", key="k"))
        await asyncio.wait_for(n.stopped.wait(), timeout=20)
        await asyncio.gather(send, return_exceptions=True)
    finally:
        await c.close()
        await node_stop()
    [task] = stops  # the one stop, that replication asked for
    assert task is not None and task.done()  # (and ``stopped`` is set: it ran to its end)
    assert not task.cancelled() and task.cancelling() == 0  # nothing asked it to stop halfway


class CloseBreaks(MemoryEngine):
    """A store whose close fails with an error no stop expects."""

    def close(self) -> None:
        raise TypeError("a closed descriptor closed again")


async def test_a_stop_step_that_fails_is_logged_and_the_node_stops_all_the_same(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A node that says it stops must stop: a step of its stop that fails (its store's close,
    here) is logged with its traceback, and ``stopped`` is set all the same, so the process
    exits rather than hang."""
    n = Node(NodeConfig(data_dir=tmp_path / "node1", port=0), engine=lambda _cfg: CloseBreaks(MemoryDisk()))
    await n.start()
    with caplog.at_level(logging.ERROR, logger="tandem.broker"):
        finished = await asyncio.wait_for(n.stop(), timeout=20)
    assert n.stopped.is_set() and finished is False  # (the process exits with a failure status)
    [rec] = [r for r in caplog.records if "did not finish" in r.getMessage()]
    assert rec.exc_info is not None and isinstance(rec.exc_info[1], TypeError)
