"""``tandem cluster up`` as ``make run`` starts it: the README's try-it, with ``kill -9`` of the
node active for a partition.  The survivors keep serving, the producer's next sends are
confirmed, every confirmed message is consumed exactly once, the killed node comes back, and
Ctrl-C (SIGINT) stops every node."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import pytest_asyncio

import client
from broker.tools.checker import classify
from tests.conftest import PASSWORD
from tests.helpers import free_base_port, wait_until
from tests.integration.test_cli import tandem

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.timeout(300)]


@dataclass
class Group:
    """A running ``tandem cluster up`` and what it printed so far."""

    proc: asyncio.subprocess.Process
    data_dir: Path
    base: int
    lines: list[str] = field(default_factory=list)

    def printed(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def output(self) -> str:
        return "".join(self.lines)

    def url(self, *nodes: int) -> str:
        hosts = ",".join(f"127.0.0.1:{self.base + 10 * (i - 1)}" for i in (nodes or (1, 2, 3)))
        return f"tandem://admin:{PASSWORD}@{hosts}"

    def pid(self, name: str) -> int:
        return int((self.data_dir / f"{name}.pid").read_text())


async def _read(proc: asyncio.subprocess.Process, lines: list[str]) -> None:
    assert proc.stdout is not None
    while line := await proc.stdout.readline():
        lines.append(line.decode(errors="replace"))


@pytest_asyncio.fixture
async def group(tmp_path: Path) -> AsyncIterator[Group]:
    base = free_base_port()
    data = tmp_path / "group"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "broker.cli", "cluster", "up", "--nodes", "3", "--base-port", str(base),
        "--data-dir", str(data), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "TANDEM_ADMIN_PASSWORD": PASSWORD})
    g = Group(proc, data, base)
    reader = asyncio.create_task(_read(proc, g.lines))
    try:
        await wait_until(lambda: g.printed("client URL") or proc.returncode is not None, timeout=90,
                         what="cluster up to print its URL")
        assert proc.returncode is None, g.output()
        yield g
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
            await wait_until(lambda: proc.returncode is not None, timeout=60, what="cluster up to stop")
        await reader


async def _status(url: str) -> dict:
    rc, out, err = await tandem("status", "--url", url, "--json")
    assert rc == 0, err
    return json.loads(out)


async def _totals(url: str) -> dict:
    rc, out, err = await tandem("queues", "--url", url, "--json")
    assert rc == 0, err
    (q,) = [q for q in json.loads(out) if q["name"] == "orders"]
    return q


async def _actives(g: Group) -> dict[int, str]:
    """partition of orders -> the node that says it is active for it (asked of every node)."""
    out: dict[int, str] = {}
    for i in (1, 2, 3):
        try:
            st = await _status(g.url(i))
        except AssertionError:
            continue  # that node is down right now
        for p in st["partitions"]:
            if p["queue"] == "orders" and p["role"] == "active" and p["active"] == st["node"]:
                out[p["partition"]] = st["node"]
    return out


async def test_kill_9_of_an_active_node_loses_nothing_and_it_comes_back(group: Group) -> None:
    g = group
    rc, _, err = await tandem("queues", "declare", "orders", "--partitions", "4", "--url", g.url())
    assert rc == 0, err
    assert err == ""  # client commands log nothing at INFO by default
    # a group cluster up makes is at this build's highest feature level: a bounded queue is declared at once
    rc, out, err = await tandem("queues", "declare", "recent", "--max-length-bytes", "1000", "--overflow",
                                "drop-head", "--url", g.url())
    assert rc == 0, err
    assert "queue recent declared" in out
    actives: dict[int, str] = {}

    async def all_active() -> bool:
        actives.update(await _actives(g))
        return len(actives) == 4

    await wait_until(all_active, timeout=60, what="an active for each partition of orders")
    assert len(set(actives.values())) > 1  # partitions active on different nodes

    # the try-it's seven messages: whole-queue figures, whichever node answers
    rc, _, err = await tandem("produce", "orders", "first order", "second order", "--key", "customer-1",
                              "--url", g.url())
    assert rc == 0, err
    rc, _, err = await tandem("produce", "orders", "--url", g.url(), stdin=b"1\n2\n3\n4\n5\n")
    assert rc == 0, err
    for i in (1, 2, 3):
        q = await _totals(g.url(i))
        assert (q["ready"], q["published"], q["complete"]) == (7, 7, True), (i, q)
    sent = [b"first order", b"second order", *(str(i).encode() for i in range(1, 6))]
    confirmed = list(sent)

    async with await client.connect(g.url(), send_timeout=60) as conn:
        producer = conn.producer("orders")
        batch = [f"before-{i}".encode() for i in range(40)]
        sent += batch
        await asyncio.gather(*(producer.send(b, key=f"k{i}") for i, b in enumerate(batch)))
        confirmed += batch

        victim = actives[0]
        old_pid = g.pid(victim)
        os.kill(old_pid, signal.SIGKILL)
        await wait_until(lambda: g.printed(f"{victim} killed by SIGKILL"), timeout=30,
                         what="cluster up to say the node was killed")
        survivor = next(i for i in (1, 2, 3) if f"node{i}" != victim)
        st = await _status(g.url(survivor))  # a survivor answers
        assert st["quorum_state"] != "Disabled"

        batch = [f"after-{i}".encode() for i in range(40)]
        sent += batch
        await asyncio.gather(*(producer.send(b, key=f"k{i}") for i, b in enumerate(batch)))
        confirmed += batch  # every send after the kill was confirmed (send raises otherwise)

        await wait_until(lambda: g.printed(f"{victim} is back"), timeout=60, what=f"{victim} to come back")
        new_pid = g.pid(victim)
        assert new_pid != old_pid
        victim_url = g.url(int(victim.removeprefix("node")))
        await wait_until(lambda: _answers(victim_url), timeout=30, what=f"{victim} to answer again")

        consumed: list[tuple[bytes, str]] = []
        async with conn.group_consumer("orders", prefetch=64) as c:
            async def drained() -> bool:
                while (m := await c.next(0.5)) is not None:
                    consumed.append((m.body, m.id))
                    await m.ack()
                return set(confirmed) <= {b for b, _ in consumed}

            await wait_until(drained, timeout=60, what="every confirmed message consumed")

            async def empty() -> bool:
                m = await c.next(0.1)
                if m is not None:  # (a duplicate would show here)
                    consumed.append((m.body, m.id))
                    await m.ack()
                q = await _totals(g.url())
                return q["ready"] + q["unacked"] == 0 and q["complete"]

            await wait_until(empty, timeout=60, what="the queue to be empty on every member")

    v = classify(sent, confirmed, consumed)
    assert (v.lost, v.duplicated, v.unexpected) == (0, 0, 0), v
    assert v.ok == len(sent) == 87

    pids = [g.pid(f"node{i}") for i in (1, 2, 3)] + [old_pid]
    g.proc.send_signal(signal.SIGINT)
    await wait_until(lambda: g.proc.returncode is not None, timeout=60, what="cluster up to stop on SIGINT")
    assert g.proc.returncode == 0, g.output()
    for pid in pids:
        assert not _alive(pid), f"node process {pid} is still running after Ctrl-C"
    assert not list(g.data_dir.glob("*.pid"))


async def _answers(url: str) -> bool:
    rc, _, _ = await tandem("status", "--url", url, "--json")
    return rc == 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
