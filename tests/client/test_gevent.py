"""The blocking client under gevent (what locust runs it in), with real node processes.

gevent must monkey-patch before anything imports socket, ssl or threading, so the greenlets
run in a process of their own (tests/client/gevent_worker.py); these tests start the nodes,
run it, kill -9 the node its greenlets are connected to when it asks, and check what it
reports: every confirmed message consumed, duplicates only marked redelivered, and the hub
never stalled by a greenlet that waits in the client."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from broker.tools.cluster import LocalCluster
from broker.tools.process import NodeProcess
from tests.conftest import running_group

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.timeout(300)]

pytest.importorskip("gevent")

WORKER = Path(__file__).with_name("gevent_worker.py")
ROOT = Path(__file__).resolve().parents[2]
#: ticks (of 5 ms) another greenlet must get through a wait of 0.5 s or more in the client (a wait
#: that held the hub lets through only the few of the client's own socket calls: 8 in 3 s of re-dial
#: with a blocking time.sleep, against 665 with gevent's)
MIN_TICKS = 20


async def run_worker(cfg: dict[str, Any], on_kill: Any = None, timeout: float = 240) -> dict[str, Any]:
    """Run the gevent worker with ``cfg``; ``on_kill``: awaited when it asks for the kill, then it
    is told ``killed``.  Its result."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-P", str(WORKER), json.dumps(cfg), cwd=str(ROOT), env=env,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        limit=64 * 1024 * 1024)  # the result is one JSON line
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    result: dict[str, Any] | None = None
    try:
        async with asyncio.timeout(timeout):
            while line := await proc.stdout.readline():
                msg = json.loads(line)
                if msg.get("event") == "kill":
                    await on_kill()
                    proc.stdin.write(b"killed\n")
                    await proc.stdin.drain()
                elif "result" in msg:
                    result = msg["result"]
            stderr = (await proc.stderr.read()).decode(errors="replace")
            code = await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert code == 0 and result is not None, f"worker exited {code}:\n{stderr[-3000:]}"
    assert "MonkeyPatchWarning" not in stderr, stderr  # patched before socket/ssl/threading came in
    return result


def check_load(r: dict[str, Any], *, killed: str | None = None) -> None:
    """Nothing lost, duplicates only marked redelivered, every greenlet kept going."""
    assert r["errors"] == []
    consumed = Counter(body for body, _redelivered in r["consumed"])
    missing = set(r["confirmed"]) - set(consumed)
    assert not missing, f"{len(missing)} confirmed messages never consumed, e.g. {sorted(missing)[:5]}"
    first_time = Counter(body for body, redelivered in r["consumed"] if not redelivered)
    twice = {b: n for b, n in first_time.items() if n > 1}
    assert not twice, f"delivered twice without the redelivered mark: {list(twice.items())[:5]}"
    assert len(set(r["confirmed"])) == len(r["confirmed"])
    if killed is not None:
        producers = [g for g in r["nodes_before"] if g.startswith("p")]
        assert {r["nodes_before"][g] for g in producers} == {killed}  # all on the node killed
        assert all(node not in ("", killed) for node in r["nodes_after"].values())  # all re-dialled


@pytest_asyncio.fixture
async def node(tmp_path: Path) -> AsyncIterator[NodeProcess]:
    proc = NodeProcess(tmp_path / "node1")
    await proc.start()
    try:
        yield proc
    finally:
        await proc.stop()


async def failover_run(cl: LocalCluster, *, producers: int, consumers: int, messages: int) -> dict[str, Any]:
    urls = [cl.url_of(n) for n in cl.nodes]
    base = cl.url.split("@", 1)[0] + "@"
    query = "/?" + cl.url.split("/?", 1)[1] if "/?" in cl.url else ""
    hosts = [u.split("@", 1)[1].split("/?", 1)[0] for u in urls]

    def group_url(first: int) -> str:  # every node, node<first+1> first
        return base + ",".join(hosts[first:] + hosts[:first]) + query

    async def kill_node1() -> None:
        await cl.nodes["node1"].kill()

    cfg = {"mode": "load", "producer_url": group_url(0), "consumer_urls": [group_url(i) for i in range(3)],
           "producers": producers, "consumers": consumers, "messages": messages,
           "kill_after": producers * messages // 3, "after_kill": 5, "partitions": 6}
    return await run_worker(cfg, on_kill=kill_node1)


async def test_fifty_greenlets_ride_through_a_killed_node(tmp_path: Path) -> None:
    """25 producer and 25 consumer greenlets, each with its own connection, in one gevent
    process; the producers' node is killed -9 mid-run: every greenlet re-dials and goes on."""
    async with running_group(tmp_path) as cl:
        r = await failover_run(cl, producers=25, consumers=25, messages=40)
    check_load(r, killed="node1")
    assert r["idle_ticks"] >= MIN_TICKS  # 25 consumers blocked in their iteration leave the hub free
    assert r["sockets"] == ["gevent._socket3.socket"]


async def test_greenlets_over_tls_ride_through_a_killed_node(tmp_path: Path) -> None:
    """The same over tandems:// (LocalCluster(tls=True): its CA in the URL) with gevent's ssl;
    a read timeout on a TLS socket is the client's TimeoutError_ and the hub runs meanwhile."""
    async with running_group(tmp_path, tls=True) as cl:
        assert cl.url.startswith("tandems://")
        r = await failover_run(cl, producers=10, consumers=10, messages=20)
        # (no round trip: its queue's partition may be active on node3)
        t = await run_worker({"mode": "cooperative", "url": cl.url_of("node2"), "redial": False, "dns": False,
                              "round_trip": False, "read_timeout": 0.5})
    ticks, _seconds, got = t["read_timeout"]
    assert got == "TimeoutError_" and ticks >= MIN_TICKS, t["read_timeout"]
    assert "coop" in t["after_timeout"] and "SSLSocket" in t["socket_class"], t
    check_load(r, killed="node1")
    assert [s.split(".")[-1] for s in r["sockets"]] == ["SSLSocket"] and r["sockets"][0].startswith("gevent."), \
        r["sockets"]


async def test_waits_in_the_client_yield_to_other_greenlets(node: NodeProcess) -> None:
    """Re-dial backoff against a dead port, a silent node's handshake, a socket timeout on an
    empty queue: another greenlet keeps ticking through each (every 5 ms: about a hundred ticks
    in a wait of half a second, where a wait that held the hub would let through only the few
    ticks of the client's own socket calls); localhost resolves; the sockets are gevent's."""
    r = await run_worker({"mode": "cooperative", "url": node.url, "redial_seconds": 1.0, "read_timeout": 0.5,
                          "connect_timeout": 0.5})
    for what, outcome in (("redial", "ConnectionClosedError"), ("silent", "ConnectionClosedError"),
                          ("read_timeout", "TimeoutError_")):
        ticks, _seconds, got = r[what]
        assert got == outcome and ticks >= MIN_TICKS, (what, r[what])
    assert r["after_timeout"] == ["coop"] and r["round_trip"] == "after the timeout"  # the link still works
    assert r["socket_class"].startswith("gevent."), r["socket_class"]
    assert all(r["patched"].values()), r["patched"]
