"""Consuming from any node, with real node processes: a blocking client connected to one member
consumes every partition of a 6-partition queue whose partitions are active on all three, and
keeps doing so when another member is killed (kill -9) mid-run.  The checker counts what was
lost, duplicated and unexpected."""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
from pathlib import Path

import pytest

import client
import client.blocking
from broker.tools.builds import from_ref
from broker.tools.checker import classify
from broker.tools.cluster import LocalCluster
from client.errors import StaleDeliveryError, TimeoutError_, UnknownDeliveryTagError
from client.mapper import make_mapper
from tests.conftest import FAST
from tests.helpers import wait_until
from tests.integration.test_upgrade import PINNED

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.timeout(240)]

PARTITIONS = 6


def consume(url: str, queue: str, want: set[bytes], got: list[tuple[bytes, str]], stop: threading.Event,
            order: list[int], progress: threading.Event, after: int) -> None:
    """A blocking consumer on ``url`` (one node, not durable across nodes: the URL names one) until
    every body of ``want`` was seen or ``stop``; ``progress`` is set once ``after`` arrived."""
    with client.blocking.connect(url, timeout=2.0) as conn:
        consumer = conn.consumer(queue, prefetch=20)
        while not stop.is_set() and not want <= {b for b, _ in got}:
            try:
                m = consumer.next()
            except TimeoutError_:
                continue  # nothing for a while (a failover under way): look at the stop flag, wait again
            got.append((m.body, m.id))
            order.append(m.partition)
            if len(got) >= after:
                progress.set()
            try:
                m.ack()
            except StaleDeliveryError:
                pass  # its relay's link or its partition's active went: it is delivered again
            except TimeoutError_:
                pass  # no answer in time (a member was just killed): applied, or it is delivered again


@pytest.mark.parametrize("kill", [False, True], ids=["steady", "kill-9-mid-run"])
async def test_a_blocking_client_on_one_member_consumes_every_partition(tmp_path: Path, kill: bool) -> None:
    cl = LocalCluster(tmp_path, console=False, nodes=3, base_port=0, password="test-password", extra_args=FAST)
    await cl.start()
    try:
        await cl.wait_ready()
        async with await client.connect(cl.url) as conn:
            await conn.declare_queue("anywhere", partitions=PARTITIONS)

        async def spread() -> bool:
            where = await cl.actives("anywhere", PARTITIONS)
            return len(where) == PARTITIONS and len(set(where.values())) == 3

        await wait_until(spread, timeout=60, what="the partitions active on all three members")
        sent = [f"m{i}".encode() for i in range(600)]
        async with await client.connect(cl.url) as conn:
            p = conn.producer("anywhere")
            await asyncio.gather(*(p.send(b, key=b.decode()) for b in sent))
        where = await cl.actives("anywhere", PARTITIONS)
        got: list[tuple[bytes, str]] = []
        order: list[int] = []
        stop, progress = threading.Event(), threading.Event()
        at_kill = 0
        reader = asyncio.ensure_future(asyncio.to_thread(
            consume, cl.url_of("node1"), "anywhere", set(sent), got, stop, order, progress, 200))
        try:
            if kill:
                await wait_until(progress.is_set, timeout=60, what="200 consumed")
                victim = next(n for n in ("node2", "node3") if n in where.values())
                await cl.processes[victim].kill()
                at_kill = len(got)
            await asyncio.wait_for(asyncio.shield(reader), timeout=120)
        finally:
            stop.set()
            await reader
        verdict = classify(sent, sent, got)
        assert (verdict.lost, verdict.unexpected) == (0, 0), verdict
        if not kill:
            assert verdict.duplicated == 0, verdict
        else:  # the victim's partitions failed over and were consumed from their new actives
            later = set(order[at_kill:])
            assert later & {p for p, n in where.items() if n == victim}, (later, where, victim)
        assert set(order) == set(range(PARTITIONS))
        assert any(node != "node1" for node in where.values())
    finally:
        await cl.stop()


async def test_a_member_on_an_older_build_relays_nothing_and_is_named_once(tmp_path: Path) -> None:
    """node3 runs the first release (a rolling upgrade under way): it knows no relays, refuses the
    subscription node1 asks for its client, and node1 says so once.  The client on node1 gets
    the partitions active on node1 and node2; a group consumer (on every member) the rest:
    every message once."""
    cl = LocalCluster(tmp_path, console=False, nodes=3, base_port=0, password="test-password", extra_args=FAST)
    cl.nodes["node3"].build = from_ref(PINNED)
    await cl.start()
    try:
        await cl.wait_ready()
        async with await client.connect(cl.url) as conn:
            info = await conn.declare_queue("mixed", partitions=PARTITIONS)

        async def spread() -> bool:
            where = await cl.actives("mixed", PARTITIONS)
            return len(where) == PARTITIONS and "node3" in where.values() and len(set(where.values())) > 1

        await wait_until(spread, timeout=60, what="the partitions active on node3 and another member")
        mapper = make_mapper(info.mapper, info.partitions, info.ring_size)
        sent = {f"m{i}".encode(): f"k{i}" for i in range(300)}
        async with await client.connect(cl.url) as conn:
            p = conn.producer("mixed")
            await asyncio.gather(*(p.send(b, key=k) for b, k in sent.items()))
        got: list[tuple[bytes, str]] = []
        deadline = asyncio.get_running_loop().time() + 60
        async with await client.connect_link(cl.url_of("node1")) as link:
            async with link.consumer("mixed", prefetch=50) as c:
                where = await cl.actives("mixed", PARTITIONS)
                while not (reachable := {b for b, k in sent.items()
                                         if where.get(mapper.partition(k), "node3") != "node3"}) <= {b for b, _ in got}:
                    m = await c.next(3)
                    if m is None:  # (where they are active looked at again: a partition placed first
                        # on node3 fails back to it once node3 has been up for --failback-after)
                        left = len(reachable - {b for b, _ in got})
                        assert asyncio.get_running_loop().time() < deadline, f"{left} reachable left; {where}"
                        where = await cl.actives("mixed", PARTITIONS)
                        continue
                    got.append((m.body, m.id))
                    try:
                        await m.ack()
                    except UnknownDeliveryTagError:
                        pass  # (its partition failed back to node3 meanwhile: it comes again, redelivered)
        log = cl.nodes["node1"].log_text()
        assert log.count("node node3 relays no consumers (its build is older)") == 1, log[-2000:]
        async with await client.connect_link(cl.url) as conn:
            async with conn.group_consumer("mixed", prefetch=100) as c:
                while len({b for b, _ in got}) < len(sent):
                    m = await c.next(30)
                    assert m is not None, f"{len(got)} of {len(sent)}"
                    got.append((m.body, m.id))
                    await m.ack()
        verdict = classify(sent, sent, got)
        assert (verdict.lost, verdict.duplicated, verdict.unexpected) == (0, 0, 0), verdict
    finally:
        await cl.stop()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("iptables") is None, reason="needs root and iptables")
@pytest.mark.xdist_group("netns")  # (the host's packet filter and namespaces: one such group at a time)
async def test_a_relay_across_a_cut_link_gives_back_what_it_held_and_comes_back(tmp_path: Path) -> None:
    """Each node in a network namespace of its own; a blocking client on node1 consumes a queue
    spread over the three while iptables drops everything between node1 and another member for
    5 s (the link hangs rather than closes).  node1's partitions keep coming, the other member's
    stop; after the heal the relay comes back, and every message arrives: none lost."""
    cl = LocalCluster(tmp_path, console=False, nodes=3, base_port=0, password="test-password", extra_args=FAST,
                      net="netns")
    assert cl.netns is not None
    await cl.start()
    try:
        await cl.wait_members()
        async with await client.connect(cl.url) as conn:
            await conn.declare_queue("cut", partitions=PARTITIONS)

        async def spread() -> bool:
            where = await cl.actives("cut", PARTITIONS)
            return len(where) == PARTITIONS and len(set(where.values())) == 3

        await wait_until(spread, timeout=60, what="the partitions active on all three members")
        where = await cl.actives("cut", PARTITIONS)
        other = next(n for n in ("node2", "node3") if n in where.values())
        sent = [f"m{i}".encode() for i in range(600)]
        async with await client.connect(cl.url) as conn:
            p = conn.producer("cut")
            await asyncio.gather(*(p.send(b, key=b.decode()) for b in sent))
        got: list[tuple[bytes, str]] = []
        order: list[int] = []
        stop, progress = threading.Event(), threading.Event()
        reader = asyncio.ensure_future(asyncio.to_thread(
            consume, cl.url_of("node1"), "cut", set(sent), got, stop, order, progress, 200))
        try:
            await wait_until(progress.is_set, timeout=60, what="200 consumed")
            await asyncio.to_thread(cl.netns.block, "node1", [other])
            cut_at = len(got)
            await wait_until(lambda: len(got) > cut_at + 20, timeout=30, what="node1's own partitions still coming")
            await asyncio.sleep(5)  # the fault's length: the cut lasts 5 s, consuming goes on meanwhile
            healed_at = len(order)
            await asyncio.to_thread(cl.netns.clear, ["node1"])
            await asyncio.wait_for(asyncio.shield(reader), timeout=120)
        finally:
            stop.set()
            await asyncio.to_thread(cl.netns.clear, ["node1"])
            await reader
        verdict = classify(sent, sent, got)
        assert (verdict.lost, verdict.unexpected) == (0, 0), verdict
        assert set(order) == set(range(PARTITIONS))
        theirs = {p for p, n in where.items() if n == other}
        assert theirs & set(order[healed_at:]), "nothing of the cut member's partitions came after the heal"
    finally:
        await cl.stop()
