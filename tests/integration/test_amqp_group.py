"""AMQP clients on a 3-node group, with real node processes: aio-pika's robust connection,
pika's blocking connection and kombu, all on node1 first, each publish with confirms to a queue
active on node2 and consume it with acks, while node1 (the node they are connected to) is killed
(kill -9) and started again.  Every confirmed message is consumed; the duplicates AMQP's
at-least-once allows (a publish resent after its confirm was lost) are counted.  Then a transaction on the same connection: its publishes to the queue on node2 are
seen only once it commits, and never once it rolls back."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import aio_pika
import pytest

import client
from broker.tools.cluster import LocalCluster
from tests.conftest import FAST
from tests.integration.amqp_clients import Run, kombu_consume, kombu_publish, pika_consume, pika_publish
from tests.helpers import wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.timeout(240)]

PASSWORD = "test-password"
SENT = 300


async def test_aio_pika_pika_and_kombu_through_a_kill_9_of_their_node_lose_no_confirmed_message(tmp_path: Path) -> None:
    cl = LocalCluster(tmp_path, console=False, nodes=3, base_port=0, password=PASSWORD, extra_args=FAST, amqp=True)
    await cl.start()
    try:
        await cl.finalize()  # (transactions need the group's feature level 6)
        queues = ("work", "work-pika", "work-kombu")
        async with await client.connect(cl.url) as conn:
            for q in queues:
                await conn.declare_queue(q, placement=[["node2", "node3", "node1"]])

        async def served() -> bool:
            return all([(await cl.actives(q, 1)).get(0) == "node2" for q in queues])

        await wait_until(served, timeout=60, what="the queues active on node2")
        url = f"amqp://admin:{PASSWORD}@{cl.hosts['node1']}:{cl.amqp_ports['node1']}/"
        urls = [f"amqp://admin:{PASSWORD}@{cl.hosts[n]}:{cl.amqp_ports[n]}/" for n in ("node1", "node2", "node3")]
        blocking = {"pika": Run("pika"), "kombu": Run("kombu")}
        stop = threading.Event()
        publishers = [asyncio.ensure_future(asyncio.to_thread(pika_publish, urls, "work-pika", SENT, blocking["pika"],
                                                              stop)),
                      asyncio.ensure_future(asyncio.to_thread(kombu_publish, urls, "work-kombu", SENT,
                                                              blocking["kombu"], stop))]
        connection = await aio_pika.connect_robust(url, reconnect_interval=0.2)
        confirmed: list[bytes] = []
        resent = 0
        try:
            channel = await connection.channel(publisher_confirms=True)
            # a queue declared over AMQP can be used once declare-ok comes: its partitions have an active
            await channel.declare_queue("fresh", arguments={"x-queue-type": "quorum"})
            assert (await cl.actives("fresh", 1)).get(0), "declare-ok before the queue had an active"

            async def publish(i: int) -> None:
                nonlocal resent
                body = f"m{i}".encode()
                while True:
                    try:
                        await channel.default_exchange.publish(aio_pika.Message(body), routing_key="work",
                                                               timeout=10)
                        confirmed.append(body)
                        return
                    except (aio_pika.exceptions.AMQPError, ConnectionError, asyncio.TimeoutError, RuntimeError):
                        resent += 1  # (its outcome unknown: sent again, at least once)
                        await asyncio.sleep(0.2)  # (pacing the retries of a client, not a wait for a state)

            first = [asyncio.ensure_future(publish(i)) for i in range(SENT // 2)]
            await wait_until(lambda: min(len(confirmed), *(len(r.confirmed) for r in blocking.values())) >= 50,
                             timeout=60, what="50 confirmed by each client")
            await cl.nodes["node1"].kill()
            await cl.nodes["node1"].start()
            await asyncio.gather(*first)
            await asyncio.gather(*(publish(i) for i in range(SENT // 2, SENT)))
            await asyncio.gather(*publishers)
            deadline = time.monotonic() + 60
            await asyncio.gather(asyncio.to_thread(pika_consume, urls, "work-pika", blocking["pika"], deadline),
                                 asyncio.to_thread(kombu_consume, urls, "work-kombu", blocking["kombu"], deadline))

            got: list[bytes] = []
            consume = await connection.channel()
            await consume.set_qos(prefetch_count=50)
            queue = await consume.get_queue("work", ensure=True)
            async with queue.iterator() as it:
                async for m in it:
                    got.append(m.body)
                    await m.ack()
                    if set(got) >= set(confirmed):
                        break

            # a transaction's publishes, forwarded to the queue's active on node2, held there until the commit
            tx_channel = await connection.channel(publisher_confirms=False)
            tx = tx_channel.transaction()
            await tx.select()
            for i in range(10):
                await tx_channel.default_exchange.publish(aio_pika.Message(f"t{i}".encode()), routing_key="work")
            assert await queue.get(fail=False) is None  # (read committed)
            await tx.rollback()
            await tx_channel.default_exchange.publish(aio_pika.Message(b"kept"), routing_key="work")
            await tx.commit()
            committed = await queue.get(fail=False, no_ack=True)
            assert committed is not None and committed.body == b"kept"
            assert await queue.get(fail=False) is None  # (nothing of the rolled-back ten)

            # a transaction's acks of deliveries relayed from the active on node2: held there by it,
            # settled at its commit, back to ready when it aborts (its channel closed uncommitted)
            assert (await cl.actives("work", 1)).get(0) == "node2"  # (and the client on node1)
            for body in (b"a0", b"a1", b"a2", b"b0"):
                await channel.default_exchange.publish(aio_pika.Message(body), routing_key="work", timeout=10)
            acking = await connection.channel(publisher_confirms=False)
            await acking.transaction().select()
            relayed = await acking.get_queue("work", ensure=False)
            held = [await relayed.get(fail=False) for _ in range(3)]
            assert [m.body for m in held if m is not None] == [b"a0", b"a1", b"a2"], held
            for m in held:
                await m.ack()
            await acking.transaction().commit()
            last = await relayed.get(fail=False)
            assert last is not None and last.body == b"b0"
            await last.ack()
            await acking.close()  # (uncommitted: the transaction is aborted, b0 is ready again)

            async def b0_again() -> bool:
                m = await queue.get(fail=False, no_ack=True)
                assert m is None or m.body == b"b0", m.body  # (a0-a2 settled by the commit)
                return m is not None

            await wait_until(b0_again, timeout=30, what="b0 ready again after the abort")
            assert await queue.get(fail=False) is None

            # the same through a plain link on node1 (Tandem's own protocol): acks sent as they
            # are made, held on node2 by the transaction; its abort makes them ready again
            async with await client.connect_link(cl.url_of("node1")) as link:
                await link.producer("work").send_many([(b"c0", None), (b"c1", None)])
                pair = [await link.get("work"), await link.get("work")]
                assert sorted(m.body for m in pair if m is not None) == [b"c0", b"c1"], pair
                tx = await link.begin("worker")
                for m in pair:
                    assert m is not None
                    await tx.ack(m)
                await tx.abort()
                back = []
                while (m := await link.get("work")) is not None:
                    back.append(m.body)
                    m.ack()
                assert sorted(back) == [b"c0", b"c1"]  # (ready again: the transaction that held them aborted)
        finally:
            stop.set()
            await connection.close()
        for run in blocking.values():
            lost = set(run.confirmed) - set(run.got)
            assert not lost, (run.name, sorted(lost)[:5])
            assert len(run.confirmed) == SENT, run.name
            duplicated = len(run.got) - len(set(run.got))
            assert duplicated <= run.resent, (run.name, duplicated, run.resent)
            print(f"{run.name}: {SENT} confirmed, 0 lost, {duplicated} duplicated, {run.resent} sends repeated")
        lost = set(confirmed) - set(got)
        duplicated = len(got) - len(set(got))
        assert not lost, sorted(lost)[:5]
        assert len(set(confirmed)) == SENT
        assert duplicated <= resent, (duplicated, resent)  # (a duplicate only where a publish was sent again)
    finally:
        await cl.stop()
