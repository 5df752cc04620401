"""Re-partitioning with real node processes: ``tandem partition add`` gives a running queue
more partitions and ``tandem partition update`` re-maps its messages, while the drill's
durable producers and consumers run; the checker accounts for every message, and a queue
without consumers shows every message where the mapper now places it, each once, with
its id."""

from __future__ import annotations

import asyncio
import json
import random
import sys
from pathlib import Path

import pytest

import client
from broker.tools.checker import classify
from broker.tools.cluster import LocalCluster
from broker.tools.drill.load import Load
from broker.tools.drill.model import QUEUE, DrillConfig
from broker.tools.faults import FaultProxy
from client.clock import SYSTEM_CLOCK
from client.mapper import JumpHashMapper
from client.protocol.frames import Publish, PublishMessage, PublishOk, expect
from tests.conftest import FAST, running_group
from tests.helpers import tandem, wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.timeout(300)]

HELD = "held"
N = 120_000


async def _actives(cl: LocalCluster, queue: str, n: int) -> bool:
    return len(await cl.actives(queue)) == n


async def test_add_partitions_and_update_under_load_loses_nothing(tmp_path: Path) -> None:
    async with running_group(tmp_path) as cl:
        async with await client.connect(cl.url) as conn:
            await conn.declare_queue(QUEUE, partitions=2)
            await conn.declare_queue(HELD, partitions=2)
            await conn.producer(HELD).send_many([(f"h{i}".encode(), f"key{i}") for i in range(1000)])
        await wait_until(lambda: _actives(cl, QUEUE, 2), timeout=30, what="an active for each partition")
        # slow consumers (2 ms a message): a backlog builds, and deliveries are outstanding when
        # the update starts
        cfg = DrillConfig(scenario="remap", partitions=2, producers=2, consumers=2, messages=8000, window=64,
                          consume_pause=0.002)
        clock = SYSTEM_CLOCK
        load = Load(cl, cfg, 1, random.Random(3), clock)
        results: dict[str, tuple[int, str, str]] = {}

        async def operations() -> None:
            await wait_until(lambda: len(load.confirmed) >= 1000, timeout=60, what="1,000 messages confirmed")
            for queue in (QUEUE, HELD):
                results[f"add {queue}"] = await tandem("partition", "add", queue, "2", "--json",
                                                       "--url", cl.url_of("node2"))
            await wait_until(lambda: _actives(cl, QUEUE, 4), timeout=30, what="the new partitions active")
            await wait_until(lambda: _actives(cl, HELD, 4), timeout=30, what="the new partitions active")
            for queue in (QUEUE, HELD):
                results[f"update {queue}"] = await tandem("partition", "update", queue, "--wait", "--timeout",
                                                          "120", "--json", "--url", cl.url_of("node3"))

        await load.go(operations, clock.monotonic() + 240)
        for what, (rc, out, err) in results.items():
            assert rc == 0, (what, out, err)
        assert json.loads(results[f"add {QUEUE}"][1]) == {"queue": QUEUE, "added": 2, "partitions": 4}
        assert json.loads(results[f"update {HELD}"][1])["done"] is True
        v = classify(load.sent, load.confirmed, load.consumed)
        print(f"add 2 partitions to 2 and update under load: checker {v.as_dict()}, longest confirm wait "
              f"{max(load.waits) * 1000:.0f} ms")
        assert load.failed == 0, f"{load.failed} sends failed"
        assert (v.lost, v.duplicated, v.unexpected) == (0, 0, 0), v
        assert len(load.confirmed) == cfg.messages
        remapped = [int(line.split(" message(s) re-mapped")[0].rsplit(" ", 1)[1])
                    for proc in cl.nodes.values() for line in proc.log_text().splitlines()
                    if f"partition {QUEUE}/" in line and " message(s) re-mapped" in line]
        print(f"{QUEUE}: {sum(remapped)} message(s) re-mapped while the load ran")
        assert sum(remapped) > 0, "the update moved nothing: the test did not exercise it"
        for name in cl.nodes:
            st = await cl.status(name)
            assert st.updating == [] and all(p.state == "Active" for p in st.partitions), name

        # every message of the queue nobody consumed is where the mapper places it now, once
        mapper = JumpHashMapper(4)
        got: dict[bytes, tuple[int, str]] = {}
        async with await client.connect(cl.url) as conn:
            async with conn.group_consumer(HELD, prefetch=200) as consumer:
                while len(got) < 1000:
                    m = await consumer.next(10)
                    assert m is not None, f"consumed {len(got)} of 1000"
                    assert m.body not in got, m
                    got[m.body] = (m.partition, m.key)
                    m.ack()
                assert await consumer.next(0.5) is None
        assert set(got) == {f"h{i}".encode() for i in range(1000)}
        assert all(p == mapper.partition(key) for p, key in got.values())
        assert {p for p, _k in got.values()} == {0, 1, 2, 3}


async def test_refusals(tmp_path: Path) -> None:
    async with running_group(tmp_path, "--replicas", "1", "--sync-replicas", "1") as cl:
        url = cl.url_of("node1")
        async with await client.connect(url) as conn:
            await conn.declare_queue("q", partitions=2)
            await conn.declare_queue("rr", partitions=2, mapper="round_robin")
            await conn.declare_queue("fixed", partitions=1, placement="node1,node2")
        cases = [
            (["add", "nope", "1"], "partition add: no queue 'nope'"),
            (["add", "q", "0"], "COUNT 0: add one partition at least"),
            (["add", "q", "1024"], "partition add: 2 + 1024 partitions: at most 1024"),
            (["add", "fixed", "1"], "partition add: queue fixed places its partitions on explicit node lists: give "
                                    "the new ones' (--placement)"),
            (["add", "fixed", "1", "--placement", "node1,node9"],
             "placement: partition 1: no member node9 (members: node1, node2, node3)"),
            (["update", "nope"], "partition update: no queue 'nope'"),
            (["update", "rr"], "partition update: the mapper round_robin places messages in turn, not by key: there "
                               "is nothing to re-map (name a keyed mapper with --mapper)"),
            (["update", "q", "--mapper", "nosuch"], "mapper 'nosuch'"),
        ]
        for argv, want in cases:
            rc, _out, err = await tandem("partition", *argv, "--url", url)
            assert rc == 2 and want in err, (argv, err)
        rc, out, err = await tandem("partition", "add", "fixed", "1", "--placement", "node3,node1", "--url", url)
        assert rc == 0 and "queue fixed now has 2 partitions" in out, err
        rc, out, err = await tandem("partition", "update", "rr", "--mapper", "jump_hash", "--wait", "--url", url)
        assert rc == 0 and "queue rr updated in" in out, err
        async with await client.connect(url) as conn:
            info = {q.name: q for q in await conn.list_queues()}
        assert info["rr"].mapper == "jump_hash" and info["fixed"].partitions == 2


async def test_an_update_cut_by_kill_9_of_a_sweeping_active_ends_with_every_message_once(tmp_path: Path) -> None:
    """120,000 keyed messages in 2 partitions, 2 partitions added, an update started; the active
    of partition 0 is killed (kill -9) as soon as its sweep starts, then restarted.  A new
    active sweeps the partition again; the target partitions drop what the cut sweep had sent
    already (its producer id and offsets), so every message is there once, where the mapper
    places it, with the id it was first stored under."""
    async with running_group(tmp_path) as cl:
        async with await client.connect(cl.url) as conn:
            await conn.declare_queue(HELD, partitions=2)
            await conn.producer(HELD).send_many([(f"h{i}".encode(), f"key{i}") for i in range(N)])
        await wait_until(lambda: _actives(cl, HELD, 2), timeout=30, what="an active for each partition")
        rc, _out, err = await tandem("partition", "add", HELD, "2", "--url", cl.url)
        assert rc == 0, err
        await wait_until(lambda: _actives(cl, HELD, 4), timeout=30, what="the new partitions active")
        victim = (await cl.actives(HELD))[0]
        other = next(n for n in cl.nodes if n != victim)
        log_before = len(cl.nodes[victim].log_text())
        rc, _out, err = await tandem("partition", "update", HELD, "--url", cl.url_of(other))
        assert rc == 0, err
        await wait_until(lambda: f"partition {HELD}/0 state Active -> Updating" in
                         cl.nodes[victim].log_text()[log_before:], timeout=30, what="partition 0's sweep started")
        await cl.nodes[victim].kill()
        cut = f"partition {HELD}/0: update: " not in cl.nodes[victim].log_text()[log_before:]
        print(f"{victim}, the active of {HELD}/0, killed {'during' if cut else 'after'} its sweep")
        assert cut, "the sweep was over before the kill: the test did not cut it"
        await cl.nodes[victim].start(60)

        async def done() -> bool:
            for n in cl.nodes:
                if (await cl.status(n)).updating:
                    return False
            return True

        await wait_until(done, timeout=120, what="the update done on every member")
        swept = [line for proc in cl.nodes.values() for line in proc.log_text().splitlines()
                 if f"partition {HELD}/0: update: " in line]
        # (the new sweep's line says how many the cut one had published but not yet settled: the
        # targets dropped those; how many depends on where in a batch the kill fell)
        print("\n".join(swept))
        mapper = JumpHashMapper(4)
        got: dict[bytes, tuple[int, str, str]] = {}
        redelivered = 0
        async with await client.connect(cl.url) as conn:
            async with conn.group_consumer(HELD, prefetch=1000) as consumer:
                while len(got) < N:
                    m = await consumer.next(10)
                    assert m is not None, f"consumed {len(got)} of {N}"
                    if m.body in got:
                        # the same stored message again, flagged: a failback moved its partition while
                        # it was out unacked (at least once); anything else is a copy stored twice
                        assert got[m.body] == (m.partition, m.key, m.id) and m.redelivered, (
                            f"{m.body!r} twice: first (partition, key, id) {got[m.body]}, again partition "
                            f"{m.partition} id {m.id} delivery count {m.delivery_count} from {m.node}")
                        redelivered += 1
                    got[m.body] = (m.partition, m.key, m.id)
                    m.ack()
                while (m := await consumer.next(1.0)) is not None:
                    assert m.body in got and m.redelivered, f"more than {N} messages: {m.body!r}"
                    redelivered += 1
                    m.ack()
        print(f"{redelivered} delivered again after a failback")
        assert all(p == mapper.partition(key) for p, key, _id in got.values())
        ids = {i for _p, _key, i in got.values()}
        assert len(ids) == N and all(i.split("-")[0] in ("0", "1") for i in ids)


async def test_messages_a_cut_sweep_had_published_are_settled_and_not_stored_twice(tmp_path: Path) -> None:
    """A sweep cut between publishing a batch and settling it leaves the batch in its target
    partition and in its own.  Made here on purpose: before the update, 300 of partition 0's
    messages are published to where the mapper now places them exactly as a sweep does (its
    producer id, their offsets as sequence numbers, their ids in the header).  The update's
    sweep finds them there (the target drops them as duplicates), settles them in partition 0,
    and every message is consumed once."""
    n = 4000
    async with running_group(tmp_path) as cl:
        async with await client.connect(cl.url) as conn:
            await conn.declare_queue(HELD, partitions=2)
            await conn.producer(HELD).send_many([(f"h{i}".encode(), f"key{i}") for i in range(n)])
        rc, _out, err = await tandem("partition", "add", HELD, "2", "--url", cl.url)
        assert rc == 0, err
        await wait_until(lambda: _actives(cl, HELD, 4), timeout=30, what="the new partitions active")
        mapper = JumpHashMapper(4)
        async with await client.connect_link(cl.url) as link:
            stored, _next, _end = await link.read(HELD, 0, 0, 1000)
            away = [m for m in stored if mapper.partition(m.key) != 0][:300]
            assert len(away) == 300
            ok = await link.request(lambda rid: Publish(rid=rid, queue=HELD, producer_id="remap.1.0", messages=[
                PublishMessage(m.key, {**m.headers, "x-tandem-id": m.id}, m.body, m.offset) for m in away]))
            assert expect(ok, PublishOk).stored == 300
        rc, _out, err = await tandem("partition", "update", HELD, "--wait", "--url", cl.url)
        assert rc == 0, err
        swept = [line for proc in cl.nodes.values() for line in proc.log_text().splitlines()
                 if f"partition {HELD}/0: update: " in line]
        assert len(swept) == 1 and "300 of them were there already" in swept[0], swept
        got: dict[bytes, int] = {}
        async with await client.connect(cl.url) as conn:
            async with conn.group_consumer(HELD, prefetch=1000) as consumer:
                while len(got) < n:
                    m = await consumer.next(10)
                    assert m is not None, f"consumed {len(got)} of {n}"
                    assert m.body not in got, f"{m.body!r} twice"
                    assert m.partition == mapper.partition(m.key)
                    got[m.body] = m.partition
                    m.ack()
                assert await consumer.next(0.5) is None, f"more than {n} messages"


async def test_a_single_node_adds_partitions_and_updates_too(link: client.Connection) -> None:
    """One node (each store engine): the same commands, every partition served here."""
    await link.declare_queue("solo", partitions=1)
    await link.producer("solo").send_many([(f"s{i}".encode(), f"key{i}") for i in range(500)])
    await link.add_partitions("solo", 3)
    st = await link.update_partitions("solo")

    async def done() -> bool:
        return not (await link.status()).updating

    if st.updating:
        await wait_until(done, timeout=30, what="the update done")
    mapper = JumpHashMapper(4)
    got: dict[bytes, int] = {}
    async with link.consumer("solo", prefetch=500) as c:
        while len(got) < 500:
            m = await c.next(5)
            assert m is not None, f"consumed {len(got)} of 500"
            assert m.body not in got
            got[m.body] = m.partition
            assert m.partition == mapper.partition(m.key), m
            m.ack()
        assert await c.next(0.3) is None
    assert set(got.values()) == {0, 1, 2, 3}


async def test_an_update_whose_answer_is_lost_is_asked_again_once_the_links_are_back(tmp_path: Path) -> None:
    """node2's peer links stall (fault proxies hold every byte: the connections hang, they do not
    close) and node2 sees its peers Down; ``tandem partition update`` asked of node2 is answered
    UNAVAILABLE (the audit cannot reach the other members), so the command looks whether the
    update started and asks again; once the links are back, the update goes through and the
    command ends well.  Every message is then where the mapper places it, once."""
    n = 600
    cl = LocalCluster(tmp_path, nodes=3, base_port=0, password="test-password", extra_args=FAST)
    proxies = [await FaultProxy(("127.0.0.1", cl.peer_ports["node2"])).start(),  # (node1 dials node2,
               await FaultProxy(("127.0.0.1", cl.peer_ports["node3"])).start()]  # node2 dials node3)
    cl.route("node1", "node2", proxies[0].address)
    cl.route("node2", "node3", proxies[1].address)
    await cl.start()
    try:
        await cl.wait_ready()
        async with await client.connect(cl.url) as conn:
            await conn.declare_queue("lost", partitions=2)
            await conn.producer("lost").send_many([(f"l{i}".encode(), f"key{i}") for i in range(n)])
        rc, _out, err = await tandem("partition", "add", "lost", "1", "--url", cl.url)
        assert rc == 0, err
        for px in proxies:
            px.delay = 3600.0

        async def node2_alone() -> bool:
            st = await cl.status("node2")
            return all(r.state == "Down" for r in st.remotes)

        await wait_until(node2_alone, timeout=30, what="node2 seeing its peers Down")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "broker.cli", "-v", "partition", "update", "lost", "--wait",
            "--url", cl.url_of("node2"), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        assert proc.stderr is not None
        try:
            seen: list[str] = []
            async with SYSTEM_CLOCK.timeout(30):
                while not any("looking whether it started, else asking again" in line for line in seen):
                    line = (await proc.stderr.readline()).decode()
                    assert line, f"the command ended without asking again: {seen}"
                    seen.append(line)
            assert "did not answer the audit" in seen[-1], seen
            for px in proxies:  # the stalled connections go; new ones pass
                px.delay = 0.0
                px.cut()
                px.heal()
            out, rest = await asyncio.wait_for(proc.communicate(), 120)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert proc.returncode == 0, "".join(seen) + rest.decode()
        assert out.decode().startswith("queue lost updated in "), out
        # consumed (a stream read would show a moved message in its old partition too, settled
        # there): each message once, from the partition the mapper gives its key over three
        mapper = JumpHashMapper(3)
        got: dict[bytes, int] = {}
        async with await client.connect(cl.url) as conn:
            async with conn.group_consumer("lost", prefetch=1000) as consumer:
                while (m := await consumer.next(3.0)) is not None:
                    assert m.body not in got or m.redelivered, f"{m.body!r} stored twice"
                    assert m.key is not None and m.partition == mapper.partition(m.key), (m.body, m.partition)
                    got[m.body] = m.partition
                    m.ack()
        assert sorted(got) == sorted(f"l{i}".encode() for i in range(n))
    finally:
        await cl.stop()
        for px in proxies:
            await px.stop()
