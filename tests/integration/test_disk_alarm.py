"""The disk alarm (broker/node/diskalarm.py) on a real node process whose data dir is a small tmpfs:
below ``--disk-free-limit`` publishes and declares are refused with UNAVAILABLE naming the
node and the free space, a durable producer's send waits, and everything goes on once the
space is freed; a node that cannot start on a full disk says so in one line."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

import client
from broker.tools.cluster import LocalCluster
from broker.tools.powerfs_mount import mounted
from broker.tools.process import NodeProcess, node_command
from client.errors import UnavailableError
from tests.conftest import FAST
from tests.helpers import wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.timeout(120)]
root = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs for the node's data dir (root)")

DISK_MB = 32
LIMIT = "16M"
MiB = 1 << 20


@pytest_asyncio.fixture
async def disk(tmp_path: Path) -> AsyncIterator[Path]:
    """A tmpfs of DISK_MB MiB, unmounted on every exit path."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m,mode=0700", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        if mounted(mnt):
            subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(path: Path, leave: int) -> None:
    """Write ``path`` until its file system has about ``leave`` bytes free (0: until ENOSPC)."""
    block = b"\0" * MiB
    with open(path, "wb", buffering=0) as f:
        while True:
            room = shutil.disk_usage(path.parent).free - leave
            if room <= 0:
                return
            try:
                f.write(block[:min(room, MiB)])
            except OSError:
                return


async def _refused(url: str, queue: str) -> str | None:
    """The error message of a publish to ``queue`` if it is refused with UNAVAILABLE, else None."""
    async with await client.connect_link(url) as conn:
        try:
            await conn.producer(queue).send(b"probe")
        except UnavailableError as exc:
            return exc.message
    return None


@root
async def test_the_alarm_refuses_publishes_below_the_limit_and_clears_when_space_is_freed(
        tmp_path: Path, disk: Path) -> None:
    node = NodeProcess(disk / "node1", log_path=tmp_path / "node1.log", extra_args=["--disk-free-limit", LIMIT])
    filler = disk / "filler"
    await node.start()
    try:
        async with await client.connect_link(node.url) as conn:
            await conn.declare_queue("jobs", partitions=2)
            await conn.producer("jobs").send(b"before")
            # about 4 MiB left, below the 16 MiB limit, and room enough for any write
            await asyncio.to_thread(_fill, filler, 4 * MiB)
            said: list[str] = []
            stored = [1]  # "before", then each probe published before the alarm was raised

            async def refused() -> bool:
                msg = await _refused(node.url, "jobs")
                if msg is None:
                    stored.append(1)
                else:
                    said.append(msg)
                return msg is not None

            await wait_until(refused, timeout=30, what="a publish refused by the disk alarm")
            assert said[0].startswith("node node1: disk free space ") and \
                said[0].endswith("is below disk_free_limit 16.0 MiB: publishing refused until space is freed"), said
            with pytest.raises(UnavailableError, match="disk_free_limit 16.0 MiB: declaring queues refused"):
                await conn.declare_queue("other")
            await conn.declare_queue("jobs", partitions=2)  # it exists: nothing to write, not refused
            st = await conn.status()
            assert any(e.startswith("disk-alarm node1: disk free space ") for e in st.events), st.events

            # a durable producer's send waits through the alarm (UNAVAILABLE is retriable)
            async with await client.connect(node.url, send_timeout=60) as durable:
                sending = asyncio.ensure_future(durable.producer("jobs").send(b"during", key="k"))
                try:
                    await wait_until(lambda: "disk alarm raised" in node.log_text(), timeout=10,
                                     what="the WARNING line")
                    assert not sending.done()
                    filler.unlink()
                    await asyncio.wait_for(asyncio.shield(sending), 30)
                finally:
                    if not sending.done():
                        sending.cancel()
            await conn.producer("jobs").send(b"after")
            st = await conn.status()
            assert any(e.startswith("disk-alarm node1: cleared: disk free space ") for e in st.events), st.events
            depth = sum(q.ready for q in await conn.list_queues() if q.name == "jobs")
            assert depth == len(stored) + 2  # and "during" and "after", once each
        log = node.log_text()
        assert " WARNING tandem.broker disk alarm raised: node node1: disk free space " in log
        assert " INFO    tandem.broker disk alarm cleared: " in log
    finally:
        await node.stop()


@root
async def test_a_node_on_a_full_disk_refuses_to_start_in_one_line_and_starts_once_there_is_room(
        tmp_path: Path, disk: Path) -> None:
    node = NodeProcess(disk / "node1", log_path=tmp_path / "node1.log", extra_args=["--disk-free-limit", "8M"])
    await node.start()
    await node.stop()
    filler = disk / "filler"
    await asyncio.to_thread(_fill, filler, 0)
    command, env = node_command()
    env["TANDEM_ADMIN_PASSWORD"] = node.password
    r = await asyncio.to_thread(subprocess.run, [*command, "broker", "start", "--name", "node1", "--data-dir",
                                                 str(disk / "node1"), "--port", "0"],
                                capture_output=True, text=True, env=env, timeout=60, check=False)
    assert r.returncode != 0, r
    assert "Traceback" not in r.stderr, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("tandem: error:")]
    assert len(errors) == 1 and "node node1 cannot start: its disk is full (No space left on device" in errors[0], \
        r.stderr
    assert r.stderr.strip().splitlines()[-1] == errors[0], r.stderr  # nothing after it (a second line of its own)
    filler.unlink()
    await node.start()
    try:
        async with await client.connect_link(node.url) as conn:
            await conn.declare_queue("jobs")
            await conn.producer("jobs").send(b"x")
    finally:
        await node.stop()




async def test_in_a_group_a_node_in_alarm_refuses_only_its_own_writes(tmp_path: Path) -> None:
    """node3 (priority 0: active for nothing, a replica of every partition) has a limit above
    any disk's free space, so its alarm is raised from its start: it still forwards publishes
    and declares to the actives and replicates what they store; its status says why it would
    refuse."""
    cl = LocalCluster(tmp_path, console=False, nodes=3, base_port=0, password="test-password", extra_args=FAST,
                      node_args={"node3": ["--priority", "0", "--disk-free-limit", "1000000G"]})
    await cl.start()
    try:
        await cl.wait_ready()
        await cl.wait_members()  # (node3 forwards once it is linked)
        async with await client.connect_link(cl.url_of("node3")) as conn:
            await conn.declare_queue("jobs", partitions=4)  # forwarded to the catalogue's active
            assert await conn.producer("jobs").send_many([f"m{i}".encode() for i in range(20)])
            st = await conn.status()
            assert any(e.startswith("disk-alarm node3: disk free space ") and "below disk_free_limit 1000000.0 GiB"
                       in e for e in st.events), st.events
        async with await client.connect(cl.url) as durable:  # every message stored, on the actives
            got: set[bytes] = set()
            consumer = durable.consumer("jobs")

            async def take() -> None:
                async for m in consumer:
                    got.add(m.body)
                    await m.ack()

            taking = asyncio.ensure_future(take())
            try:
                await wait_until(lambda: len(got) == 20, timeout=30, what="the 20 messages consumed")
            finally:
                taking.cancel()
                await asyncio.gather(taking, return_exceptions=True)
        assert "disk alarm raised: node node3" in cl.nodes["node3"].log_text()
        assert "disk alarm raised" not in cl.nodes["node1"].log_text()
    finally:
        await cl.stop()
