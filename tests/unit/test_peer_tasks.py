"""Every task the peer links start (a dialer, an accepted link's handler) is owned by the
PeerManager and ended by its stop: afterwards none of them is alive."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from broker.config import NodeConfig
from broker.messaging.queues import Queue
from broker.peers.host import NoReceiver
from broker.peers.links import Link
from broker.peers.peers import PeerManager
from client.clock import SYSTEM_CLOCK, Clock
from tests.helpers import wait_until

pytestmark = pytest.mark.asyncio

SECRET = b"0123456789abcdef0123456789abcdef"


class _NoDelivery:
    def schedule(self, q: Queue) -> None:
        pass


class Host:
    """A node as the peer links see it: no replication, no clients."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.clock: Clock = SYSTEM_CLOCK
        self.store_stamp = "18c-00000001"
        self.receiver = NoReceiver()
        self.client_address = ""
        self.queues: dict[str, Queue] = {}
        self.delivery = _NoDelivery()

    async def handle_forward(self, link: Link, kind: int, payload: bytes) -> bytes:
        return b""

    def link_lost(self, link: Link) -> None:
        pass

    def map_changed(self) -> None:
        pass

    def quorum_changed(self) -> None:
        pass

    def ha_disabled_changed(self) -> None:
        pass


def closed_port() -> int:
    """A loopback port nothing listens on (a dial there is refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def started_here(before: set[asyncio.Task[object]]) -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t not in before and not t.done()]


async def manager(tmp_path: Path) -> PeerManager:
    # node1 sorts first: it dials node2 (whose port refuses: the dialer waits and dials again)
    cfg = NodeConfig(name="node1", data_dir=tmp_path / "node1", port=0, peer_port=0,
                     peers=(f"node2=127.0.0.1:{closed_port()}",), keepalive_interval=0.05)
    pm = PeerManager(Host(cfg), secret=SECRET)
    await pm.start()
    return pm


async def silent_link(pm: PeerManager) -> asyncio.StreamWriter:
    """A connection to the peer port that says nothing: its handler waits for a PeerHello."""
    assert pm.address is not None
    _reader, writer = await asyncio.open_connection(*pm.address)
    return writer


async def test_after_run_and_stop_no_dialer_and_no_accepted_link_is_alive(tmp_path: Path) -> None:
    before = asyncio.all_tasks()
    pm = await manager(tmp_path)
    runner = asyncio.create_task(pm.run(), name="test-peers-run")
    writer = await silent_link(pm)
    names = lambda: {t.get_name() for t in started_here(before)}  # noqa: E731
    await wait_until(lambda: "tandem-peer-dial-node2" in names() and len(names()) >= 3,
                     what="the dialer and the accepted link's handler running")
    runner.cancel()
    await asyncio.gather(runner, return_exceptions=True)  # (as the node ends the task it made)
    await pm.stop()
    assert started_here(before) == []
    writer.close()


async def test_stop_alone_ends_the_dialers_and_the_accepted_links(tmp_path: Path) -> None:
    before = asyncio.all_tasks()
    pm = await manager(tmp_path)
    runner = asyncio.create_task(pm.run(), name="test-peers-run")
    writer = await silent_link(pm)
    await wait_until(lambda: len(started_here(before)) >= 3, what="the dialer and the accepted link's handler")
    await pm.stop()
    assert started_here(before) == [runner]  # the caller's own task: the caller ends it
    runner.cancel()
    await asyncio.gather(runner, return_exceptions=True)
    writer.close()
