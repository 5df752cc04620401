"""Transactions with real node processes: a consume-transform-produce worker on a durable
connection turns 300 inputs into 300 outputs, one transaction per batch (its publishes and the
acks of its inputs), while ``kill -9`` takes the active of its coordinator partition and then
the active of a partition it writes to, each restarted.  The checker counts outputs lost,
duplicated and unexpected (a zombie producer's publish among them): with transactions, each
input's output is there exactly once whatever failed."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

import client
from broker.tools.cluster import LocalCluster
from broker.transactions.ids import COORDINATOR_QUEUE, coordinator_partition
from client.clock import Backoff
from client.durable.consumer import DurableMessage
from client.errors import ProducerFencedError, TandemError, TransactionAbortedError
from client.transactions import Transaction
from tests.conftest import FAST
from tests.helpers import wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.timeout(240)]

INPUTS = 300
BATCH = 10


async def outcome(tx: Transaction) -> bool:
    """Commit ``tx``: True once it is committed, False once it is known aborted (asked again on
    any other error: the first decision stands)."""
    backoff = Backoff()
    deadline = asyncio.get_running_loop().time() + 60
    while True:
        try:
            return await tx.commit()
        except (TransactionAbortedError, ProducerFencedError):
            return False
        except TandemError as exc:
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"transaction {tx.id}: no outcome in 60 s ({exc!r})") from None
            await asyncio.sleep(backoff.next())


class Worker:
    """Turns each input ``i<n>`` of queue "in" into ``o<n>`` on "out", in transactions."""

    def __init__(self, conn: client.DurableConnection) -> None:
        self.conn = conn
        self.committed: Counter[bytes] = Counter()  # inputs whose transaction committed, by body
        self.aborted = 0
        self.errors: Counter[str] = Counter()  # what failed a batch before its commit, by error
        self.done = asyncio.Event()

    async def run(self) -> None:
        async with self.conn.consumer("in", prefetch=40) as c:
            while len(self.committed) < INPUTS:
                m = await c.next(1)
                if m is None:
                    continue
                batch = [m]
                while len(batch) < BATCH and (more := await c.next(0.01)) is not None:
                    batch.append(more)
                await self.one(batch)
        self.done.set()

    async def one(self, batch: list[DurableMessage]) -> None:
        tx: Transaction | None = None
        try:
            tx = await self.conn.begin("worker")
            await tx.publish_many("out", [(b"o" + m.body[1:], m.key) for m in batch])
            await tx.ack(*batch)
        except TandemError as exc:
            self.errors[type(exc).__name__] += 1
            committed = False
        else:
            committed = await outcome(tx)
        if committed:
            self.committed.update(m.body for m in batch)
            return
        self.aborted += 1
        if tx is not None and not tx.done:
            try:
                await tx.abort()
            except TandemError:
                pass  # (the link's closing or the timeout aborts it)
        for m in batch:  # (what its acks did not hold comes back now; what they held, at the abort)
            if not m.settled:
                try:
                    await m.nack()
                except TandemError:
                    pass  # (its link failed: delivered again)


async def test_consume_transform_produce_through_two_kill_9s_writes_each_output_once(tmp_path: Path) -> None:
    cl = LocalCluster(tmp_path, console=False, nodes=3, base_port=0, password="test-password",
                      extra_args=[*FAST, "--transaction-timeout", "5"])
    await cl.start()
    try:
        await cl.finalize()
        async with await client.connect(cl.url) as conn:
            await conn.declare_queue("in", partitions=3)
            await conn.declare_queue("out", partitions=3)

            async def served() -> bool:
                return all([len(await cl.actives(q, 3)) == 3 for q in ("in", "out")])

            await wait_until(served, timeout=60, what="the queues active")
            # a zombie: its producer starts again elsewhere before it commits
            async with await client.connect_link(cl.url_of("node1")) as old, \
                    await client.connect_link(cl.url_of("node2")) as new:
                zombie = await old.begin("fenced")
                await zombie.publish("out", b"zombie", key="z")
                async with new.transaction("fenced") as tx:
                    await tx.publish("out", b"o-new", key="z")
                with pytest.raises(ProducerFencedError):
                    await zombie.commit()
            await conn.producer("in").send_many([(f"i{n}".encode(), f"k{n}") for n in range(INPUTS)])

            worker = Worker(conn)
            task = asyncio.create_task(worker.run())
            producer = await (await conn.primary()).init_producer("worker")
            coordinator = (await cl.actives(COORDINATOR_QUEUE))[coordinator_partition(producer.name)]
            await wait_until(lambda: len(worker.committed) >= 100 or task.done(), timeout=60, what="100 committed")
            await cl.nodes[coordinator].kill()
            await cl.nodes[coordinator].start()
            await wait_until(lambda: len(worker.committed) >= 200 or task.done(), timeout=90, what="200 committed")
            victim = next(n for n in (await cl.actives("out", 3)).values() if n != coordinator)
            await cl.nodes[victim].kill()
            await cl.nodes[victim].start()
            try:
                await asyncio.wait_for(asyncio.shield(task), timeout=120)
            except TimeoutError:
                task.cancel()
                raise AssertionError(f"{len(worker.committed)} of {INPUTS} inputs committed; "
                                     f"{worker.aborted} batches aborted ({dict(worker.errors)})") from None

            want = {f"o{n}".encode() for n in range(INPUTS)} | {b"o-new"}
            got: Counter[bytes] = Counter()
            async with conn.consumer("out", prefetch=100) as c:
                while (m := await c.next(3 if len(got) >= len(want) else 30)) is not None:
                    got[m.body] += 1
                    await m.ack()
            assert await (await conn.primary()).get("in") is None  # (every input settled)
        lost, unexpected = want - set(got), set(got) - want
        duplicated = {b for b, n in got.items() if n > 1}
        assert (len(lost), len(duplicated), len(unexpected)) == (0, 0, 0), (
            sorted(lost)[:5], sorted(duplicated)[:5], sorted(unexpected)[:5])
        assert max(worker.committed.values()) == 1, worker.committed.most_common(3)  # (no input committed twice)
    finally:
        await cl.stop()
