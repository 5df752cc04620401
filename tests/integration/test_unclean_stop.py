"""A node that was not stopped cleanly says so when it starts again, if it confirms writes
before an fsync (its policy is weaker than SYNC): what it confirmed since its last fsync
is gone if the machine went down.  A clean stop, or SYNC, says nothing.  Real processes,
kill -9."""

from __future__ import annotations

from pathlib import Path

import pytest

import client
from broker.tools.cluster import LocalCluster
from broker.tools.process import NodeProcess
from tests.conftest import FAST
from tests.helpers import wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.timeout(240)]


async def events_of(url: str) -> list[str]:
    async with await client.connect_link(url, client_name="test", observe=True) as conn:
        return list((await conn.status()).events)


def unclean(events: list[str]) -> list[str]:
    return [e for e in events if e.startswith("unclean-stop")]


async def test_a_single_node_under_write_no_sync_says_so_after_kill_9_and_not_after_a_clean_stop(
        tmp_path: Path) -> None:
    node = NodeProcess(tmp_path / "node1", sync="WRITE_NO_SYNC", password="test-password")
    try:
        await node.start()
        async with await client.connect(node.url) as conn:
            await conn.declare_queue("q")
            for i in range(20):
                await conn.producer("q").send(f"m{i}".encode())
        assert not unclean(await events_of(node.url))  # a new store
        await node.kill()
        await node.start()
        [said] = unclean(await events_of(node.url))
        assert "WRITE_NO_SYNC" in said and "may be lost" in said
        assert "did not stop cleanly" in node.log_text()
        await node.stop()
        await node.start()
        assert not unclean(await events_of(node.url))  # a clean stop says nothing
    finally:
        await node.stop()


async def test_a_single_node_under_sync_says_nothing_after_kill_9(tmp_path: Path) -> None:
    node = NodeProcess(tmp_path / "node1", sync="SYNC", password="test-password")
    try:
        await node.start()
        await node.kill()
        await node.start()
        assert not unclean(await events_of(node.url))
    finally:
        await node.stop()


async def test_a_group_member_with_unsynced_replicas_says_so_after_kill_9(tmp_path: Path) -> None:
    cl = LocalCluster(tmp_path, nodes=3, base_port=0, password="test-password",
                      extra_args=[*FAST, "--remote-sync", "WRITE_NO_SYNC"])
    await cl.start()
    try:
        await cl.wait_ready()
        await cl.nodes["node2"].kill()
        await cl.nodes["node2"].start()
        await cl.nodes["node3"].stop()
        await cl.nodes["node3"].start()
        await cl.wait_ready()

        async def said() -> bool:
            return bool(unclean((await cl.status("node2")).events))

        await wait_until(said, timeout=30, what="node2 to report its unclean stop")
        [text] = unclean((await cl.status("node2")).events)
        assert "WRITE_NO_SYNC" in text and "HA-1014" in text
        assert not unclean((await cl.status("node3")).events)  # stopped cleanly
    finally:
        await cl.stop()
