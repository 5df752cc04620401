"""The client matrix of a rolling upgrade: the pinned older build's SDK against a group of this
build, and this build's SDK against a group of the older build.  Each side is a process of its
own build (tests/integration/sdk_side.py): a producer on a durable connection sends while the
node active for most partitions is killed (kill -9) and started again; then a consumer takes
every message.  Every message is confirmed and stored once (one partition and offset); a delivery
seen again is a redelivery (its ack could not reach the partition), never a second copy."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from broker.tools.builds import OtherBuild, from_ref
from broker.tools.cluster import LocalCluster
from broker.tools.process import node_command
from tests.conftest import PASSWORD
from tests.integration.test_upgrade import PINNED

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.timeout(300)]

SIDE = Path(__file__).with_name("sdk_side.py")
N = 1200
QUEUE = "matrix"


def _command(build: OtherBuild | None) -> tuple[list[str], dict[str, str]]:
    if build is not None:
        return [*build.command()[:2], str(SIDE)], build.env()
    command, env = node_command()
    return [command[0], "-P", str(SIDE)], env


async def _side(build: OtherBuild | None, mode: str, url: str, on_line: int = 0,
                at_line: asyncio.Event | None = None) -> list[str]:
    """Run one side to its end; its output lines (``at_line`` set once it has printed ``on_line``
    "confirmed" lines)."""
    command, env = _command(build)
    proc = await asyncio.create_subprocess_exec(*command, mode, url, QUEUE, str(N), env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    lines: list[str] = []
    confirmed = 0
    while line := (await proc.stdout.readline()).decode().strip():
        lines.append(line)
        if line.startswith("confirmed "):
            confirmed += 1
            if at_line is not None and confirmed == on_line:
                at_line.set()
    err = (await proc.stderr.read()).decode()
    assert await proc.wait() == 0, err[-3000:]
    return lines


@pytest.mark.parametrize("client_build,group_build", [("old", "new"), ("new", "old")],
                         ids=["old-client-new-group", "new-client-old-group"])
async def test_every_message_once_across_builds_and_a_failover(tmp_path: Path, client_build: str,
                                                                group_build: str) -> None:
    old = from_ref(PINNED)
    cl = LocalCluster(tmp_path, console=False, nodes=3, base_port=0, password=PASSWORD)
    for p in cl.nodes.values():
        p.build = old if group_build == "old" else None
    side = old if client_build == "old" else None
    try:
        await cl.start()
        await cl.wait_ready()
        halfway = asyncio.Event()
        producer = asyncio.ensure_future(_side(side, "produce", cl.url, N // 3, halfway))
        await asyncio.wait([producer, asyncio.ensure_future(halfway.wait())], return_when=asyncio.FIRST_COMPLETED)
        assert halfway.is_set(), "the producer ended before a third of its messages were confirmed"
        actives = Counter((await cl.actives(QUEUE, 4)).values())
        victim = actives.most_common(1)[0][0]
        await cl.nodes[victim].kill()
        assert not producer.done(), "the producer ended before the kill: no failover to ride through"
        await cl.nodes[victim].start()
        produced = await producer
        confirmed = [line.split(" ", 1)[1] for line in produced if line.startswith("confirmed ")]
        assert sorted(confirmed) == sorted(f"m{i}" for i in range(N))
        got = [line.split(" ")[1:] for line in await _side(side, "consume", cl.url) if line.startswith("got ")]
        stored: dict[str, set[str]] = defaultdict(set)
        for body, at, _ in got:
            stored[body].add(at)
        assert set(stored) == set(confirmed), f"lost {len(set(confirmed) - set(stored))}, " \
                                              f"unexpected {len(set(stored) - set(confirmed))}"
        twice = {body: sorted(ats) for body, ats in stored.items() if len(ats) > 1}
        assert not twice, f"{len(twice)} stored twice: {list(twice.items())[:10]}"
        first: set[str] = set()
        for body, at, redelivered in got:  # a delivery seen again says it was delivered before
            assert at not in first or redelivered == "1", f"{body} ({at}) delivered again, not flagged"
            first.add(at)
    finally:
        await cl.stop()
