"""Test helpers: wait for a condition with a deadline, never sleep blind; a replication core
that is active."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import client
from broker.security.secret import ensure_secret
from broker.tools.forked import can_fork, run_forked
from broker.tools.cluster import port_range
from client.clock import SYSTEM_CLOCK
from client.errors import TandemError
from client.protocol import Frame, FrameBuffer, decode_payload
from ha.messages import Envelope, VoteReply
from ha.replica import Replica, ReplicaConfig, Role

POLL = 0.01


async def wait_until(predicate: Callable[[], bool | Awaitable[bool]], *, timeout: float = 30.0,
                     what: str = "condition") -> None:
    """Poll ``predicate`` until true; AssertionError naming ``what`` after ``timeout`` seconds."""
    deadline = SYSTEM_CLOCK.monotonic() + timeout
    while True:
        result = predicate()
        if asyncio.iscoroutine(result) or isinstance(result, Awaitable):
            result = await result
        if result:
            return
        if SYSTEM_CLOCK.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await SYSTEM_CLOCK.sleep(POLL)


def wait_until_sync(predicate: Callable[[], bool], *, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(POLL)


def active_replica(entries: int = 0, size: int = 0) -> Replica:
    """The core of node "a" of a three-voter partition (a, b, c), elected with b's vote, its
    no-op (index 1) persisted, then ``entries`` entries of ``size`` bytes proposed and persisted."""
    cfg = ReplicaConfig(node="a", voters=("a", "b", "c"), election_timeout=1.0, heartbeat_interval=0.2)
    r = Replica(cfg, rng=random.Random(0))
    r.tick(5.0)
    r.step(Envelope("b", "a", VoteReply(r.term + 1, "b", True, pre=True)))  # its pre-vote, then its vote
    ready = r.step(Envelope("b", "a", VoteReply(r.term, "b", True)))
    if r.role is not Role.LEADER:
        raise AssertionError(f"node a did not become active: {r.role}")
    r.persisted(ready.append[-1])
    for _ in range(entries):
        _ready, e = r.propose(b"x" * size)
        if e is None:
            raise AssertionError("a proposal was refused")
        r.persisted(e)
    return r


async def read_frame(reader: asyncio.StreamReader, buf: FrameBuffer) -> Frame | None:
    """The next frame the other end of a raw connection sends (decoded without the protocol's
    state checks), or None once it has closed the connection."""
    while (payload := buf.next_payload()) is None:
        data = await reader.read(65536)
        if not data:
            return None
        buf.feed(data)
    return decode_payload(payload)


def free_base_port(nodes: int = 3) -> int:
    """A base port whose group layout (base + 10 i, +1, +2 for i < ``nodes``) is free now, in
    this worker's slice of the range below the kernel's ephemeral ports (see
    broker.tools.cluster.free_ports)."""
    low, high = port_range()
    for _ in range(200):
        base = random.randrange(low, high - 10 * nodes, 10)
        socks: list[socket.socket] = []
        try:
            for i in range(nodes):
                for off in (0, 1, 2):
                    s = socket.socket()
                    socks.append(s)
                    s.bind(("127.0.0.1", base + 10 * i + off))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no free block of ports")


def group_secret_file(directory: Path) -> Path:
    """A group secret file in ``directory`` (made once, then reused), for nodes started by hand."""
    return ensure_secret(directory / "cluster.secret")


async def tandem(*args: str) -> tuple[int, str, str]:
    """The CLI as a user runs it, in a process of its own: its exit status, stdout, stderr.  The
    process is forked from the server that imported the CLI once (broker/tools/forked.py), as
    the nodes are; tests/integration/test_cli.py starts the command in a fresh interpreter."""
    env = dict(os.environ)
    if await asyncio.to_thread(can_fork, env):  # (it reads the working directory)
        code, out, err = await asyncio.wait_for(run_forked(list(args), env), 120)
        return code, out.decode(), err.decode()
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "broker.cli", *args,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                env=env)
    out_b, err_b = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out_b.decode(), err_b.decode()


async def drain_served(url: str, queue: str, *, timeout: float = 60.0) -> list[tuple[bytes, str]]:
    """Consume the whole ``queue`` (every member, from a plain link to ``url``'s node) with acks,
    as (body, id) pairs, until every partition of it has an active and each of those actives
    (asked at the client address the group gives) holds none of the queue's messages: none
    ready, none delivered and unacked, none pending.  Every message is then consumed and
    settled and nothing is left to deliver later, so no wait for a silence is needed.
    AssertionError after ``timeout`` seconds, naming what was still held."""
    out: list[tuple[bytes, str]] = []
    deadline = SYSTEM_CLOCK.monotonic() + timeout
    async with await client.connect_link(url) as conn:
        async with conn.group_consumer(queue) as c:
            while True:
                m = await c.next(0.1)
                if m is not None:
                    out.append((m.body, m.id))
                    try:
                        await m.ack()
                    except TandemError:  # stale (its partition moved) or its link ended meanwhile:
                        pass  # the new active delivers it again
                    continue
                held = await queue_held(conn, queue)
                if not held:
                    return out
                if SYSTEM_CLOCK.monotonic() > deadline:
                    raise AssertionError(f"timed out after {timeout}s draining {queue}: {held}")


async def queue_held(probe: client.Connection, queue: str) -> str:
    """What keeps ``queue`` from being drained, as seen from ``probe``'s node and the actives it
    names ("" nothing: every partition has an active, each active holds no message of it)."""
    md = (await probe.metadata(queue)).map
    if "" in md.actives:
        return f"partitions without an active: {md.actives}"
    for name in sorted(set(md.actives)):
        link = probe if name == probe.node else await probe.sibling(name, md.addresses[name])
        there = (await link.metadata(queue)).map
        if there.actives != md.actives:
            return f"{probe.node} names the actives {md.actives}, {name} {there.actives}"
        if there.queue.ready or there.queue.unacked:
            return f"{name} holds {there.queue.ready} ready and {there.queue.unacked} unacked"
    return ""
