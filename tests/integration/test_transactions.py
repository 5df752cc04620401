"""Transactions with real node processes: a consume-transform-produce worker on a durable
connection turns 300 inputs into 300 outputs, one transaction per batch (its publishes and the
acks of its inputs), while ``kill -9`` takes the active of its coordinator partition and then
the active of a partition it writes to, each restarted.  The checker counts outputs lost,
duplicated and unexpected (a zombie producer's publish among them): with transactions, each
input's output is there exactly once whatever failed."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import client
from broker.tools.checker import atomicity
from broker.tools.cluster import LocalCluster
from broker.transactions.ids import COORDINATOR_QUEUE, coordinator_partition
from client.clock import Backoff
from client.durable.consumer import DurableMessage
from client.errors import ProducerFencedError, StaleDeliveryError, TandemError, TransactionAbortedError
from client.transactions import Transaction
from tests.conftest import FAST
from tests.helpers import wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.timeout(240)]

INPUTS = 300
BATCH = 10
#: the staged cases whose output goes through an exchange, to a queue active on another node
ROUTED = {"after-prepare", "participant-mid-commit", "routed"}


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
            producer = await conn.init_producer("worker")
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
                    try:
                        await m.ack()
                    except StaleDeliveryError:
                        continue  # (its link was replaced before the ack: it is delivered again, and counted then)
                    got[m.body] += 1
            assert await (await conn.primary()).get("in") is None  # (every input settled)
        lost, unexpected = want - set(got), set(got) - want
        duplicated = {b for b, n in got.items() if n > 1}
        assert (len(lost), len(duplicated), len(unexpected)) == (0, 0, 0), (
            sorted(lost)[:5], sorted(duplicated)[:5], sorted(unexpected)[:5])
        assert max(worker.committed.values()) == 1, worker.committed.most_common(3)  # (no input committed twice)
    finally:
        await cl.stop()


class Staged:
    """One transaction per case, each from its own input queue to its own output queue, with a
    fault at one step of its first attempt; attempts again until one commits (what an
    application does)."""

    def __init__(self, cl: LocalCluster, conn: client.DurableConnection) -> None:
        self.cl, self.conn = cl, conn
        self.transactions: dict[str, tuple[bool, frozenset[bytes]]] = {}

    async def coordinator(self) -> tuple[str, int]:
        """The node active for the producer's coordinator partition, and that partition."""
        producer = await self.conn.init_producer("staged")
        p = coordinator_partition(producer.name)
        where: dict[int, str] = {}

        async def served() -> bool:
            where.update(await self.cl.actives(COORDINATOR_QUEUE))
            return p in where

        await wait_until(served, timeout=60, what="the coordinator partition active")
        return where[p], p

    async def decided(self, p: int) -> int:
        """The coordinator partition's highest commit index among the live nodes."""
        return max(x.commit for _name, st in await self.cl._statuses() for x in st.partitions
                   if x.queue == COORDINATOR_QUEUE and x.partition == p)

    async def caught_up(self, p: int) -> None:
        """Until the coordinator partition's active has every other member as a replica at lag 0
        (a member restarted by an earlier case has caught up: any two of the three decide)."""
        async def matched() -> bool:
            return any(x.queue == COORDINATOR_QUEUE and x.partition == p and x.role == "active"
                       and len(x.replicas) == len(self.cl.nodes) - 1 and all(r.lag == 0 for r in x.replicas)
                       for _name, st in await self.cl._statuses() for x in st.partitions)

        await wait_until(matched, timeout=60, what="the coordinator partition's replicas caught up")

    async def setup(self, case: str, node: str) -> None:
        """The case's queues, active on ``node``, and its input."""
        others = [n for n in self.cl.nodes if n != node]
        for q in (f"in-{case}", f"out-{case}"):
            await self.conn.declare_queue(q, placement=[[node, *others]])

        async def served() -> bool:
            return all([(await self.cl.actives(q, 1)).get(0) == node for q in (f"in-{case}", f"out-{case}")])

        await wait_until(served, timeout=60, what=f"{case}'s queues active on {node}")
        await self.conn.declare_exchange(f"x-{case}", "fanout")
        await self.conn.bind_queue(f"out-{case}", f"x-{case}")
        await self.conn.producer(f"in-{case}").send(f"{case}-in".encode())

    async def run(self, case: str, fault: dict[str, Callable[[Transaction], Awaitable[None]]]) -> None:
        async with self.conn.consumer(f"in-{case}") as c:
            for attempt in range(5):
                m = await c.next(30)
                assert m is not None, f"{case}: the input did not come (attempt {attempt})"
                hooks = fault if attempt == 0 else {}
                tx: Transaction | None = None
                try:
                    tx = await self.conn.begin("staged")
                    if "begun" in hooks:
                        await hooks["begun"](tx)
                    if case in ROUTED:  # (through the case's exchange: a routed publish forwarded to the node)
                        await tx.publish_to_exchange(f"x-{case}", f"{case}-out".encode(), headers={"tx": tx.id})
                    else:
                        await tx.publish(f"out-{case}", f"{case}-out".encode(), headers={"tx": tx.id})
                    await tx.ack(m)
                    if "prepared" in hooks:
                        await hooks["prepared"](tx)
                    committed = tx.done or await outcome(tx)  # (a hook that ended it asserted it committed)
                except TandemError:
                    committed = False
                if tx is not None:
                    self.transactions[tx.id] = (committed, frozenset({f"{case}-out".encode()}))
                if committed:
                    return
                if tx is not None and not tx.done:
                    try:
                        await tx.abort()
                    except TandemError:
                        pass
                if not m.settled:
                    try:
                        await m.nack()
                    except TandemError:
                        pass
        raise AssertionError(f"{case}: no attempt committed")

    async def outputs(self, case: str) -> list[tuple[bytes, str]]:
        """Every output of the case stored, consumed: (body, the transaction that published it),
        once per stored message.  An ack answered just before its active died may not have
        reached the group: that message comes again, flagged redelivered, and is one output."""
        out: dict[str, tuple[bytes, str]] = {}
        async with self.conn.consumer(f"out-{case}") as c:
            while (m := await c.next(3 if out else 30)) is not None:
                try:
                    await m.ack()
                except StaleDeliveryError:
                    continue  # (its link was replaced before the ack: it is delivered again, and counted then)
                assert m.id not in out or m.redelivered, f"{case}: {m.id} delivered twice, not flagged redelivered"
                out[m.id] = (m.body, m.headers.get("tx", ""))
        return list(out.values())


async def test_kill_9_or_a_cut_link_at_each_step_of_a_transaction_leaves_it_all_or_nothing(tmp_path: Path) -> None:
    """A 3-node group; each case's queues (its participants) active on one node.  Faults: kill -9
    of the coordinator's active before the prepare, after it, and after the decision (the
    participants' node held by SIGSTOP keeps the commit from ending); kill -9 of the
    participants' active mid-commit (two of the cases publish through an exchange); the client's
    link cut (reset) mid-prepare, whose closing aborts the transaction.  Every case ends with its output once and its input settled, and
    every transaction all or nothing."""
    cl = LocalCluster(tmp_path, console=False, nodes=3, base_port=0, password="test-password", extra_args=FAST)
    await cl.start()
    try:
        await cl.finalize()
        async with await client.connect(cl.url) as conn:
            staged = Staged(cl, conn)

            async def restart(node: str) -> None:
                await cl.nodes[node].kill()
                await cl.nodes[node].start()

            async def kill_coordinator(_tx: Transaction) -> None:
                await restart((await staged.coordinator())[0])

            async def held_after_the_decision(tx: Transaction, then: Callable[[str, str], Awaitable[None]]) -> None:
                """The commit sent while the participants' node is frozen; once the decision is
                replicated, ``then(coordinator, participants' node)``; the commit must end committed."""
                coordinator, p = await staged.coordinator()
                await staged.caught_up(p)
                before = await staged.decided(p)
                cl.nodes[node].pause()
                try:
                    ending = asyncio.ensure_future(outcome(tx))

                    async def decided() -> bool:
                        return await staged.decided(p) > before

                    await wait_until(decided, timeout=30, what="the decision replicated")
                    await then(coordinator, node)
                finally:
                    cl.nodes[node].resume()
                assert await ending, f"{tx.id}: decided, then aborted"

            async def kill_the_coordinator_after(tx: Transaction) -> None:
                await held_after_the_decision(tx, lambda coordinator, _p: restart(coordinator))

            async def kill_the_participant_after(tx: Transaction) -> None:
                await held_after_the_decision(tx, lambda _c, participants: restart(participants))

            faults: list[tuple[str, dict[str, Callable[[Transaction], Awaitable[None]]]]] = [
                ("before-prepare", {"begun": kill_coordinator}),
                ("after-prepare", {"prepared": kill_coordinator}),
                ("after-decision", {"prepared": kill_the_coordinator_after}),
                ("participant-mid-commit", {"prepared": kill_the_participant_after})]
            for case, fault in faults:
                # the participants on a node that neither coordinates nor carries the client's requests
                coordinator, _ = await staged.coordinator()
                busy = {coordinator, (await conn.primary()).node}
                node = next(n for n in ("node3", "node2", "node1") if n not in busy)
                await staged.setup(case, node)
                await staged.run(case, fault)

            # the cut link: a plain link to the participants' node, reset after the publish and the ack
            await staged.setup("cut-link", "node2")
            async with await client.connect_link(cl.url_of("node2")) as link:
                async with link.consumer("in-cut-link") as lc:
                    first = await lc.next(30)
                    assert first is not None
                    tx = await link.begin("cut")
                    await tx.publish("out-cut-link", b"cut-link-out", headers={"tx": tx.id})
                    await tx.ack(first)
                link._writer.transport.abort()  # type: ignore[union-attr]  # (a reset: no goodbye)
            staged.transactions[tx.id] = (False, frozenset({b"cut-link-out"}))
            await staged.run("cut-link", {})  # (its input comes back once the abort resolved)
            with pytest.raises(TransactionAbortedError):  # (the decision: asked on another link)
                await Transaction(await conn.primary(), tx.id).commit()

            # a routed publish forwarded to the output's node: held there, unseen, until the outcome
            busy = {(await conn.primary()).node}
            await staged.setup("routed", next(n for n in ("node3", "node2", "node1") if n not in busy))
            tx = await conn.begin("staged")
            await tx.publish_to_exchange("x-routed", b"routed-out", headers={"tx": tx.id})
            assert await (await conn.primary()).get("out-routed") is None
            await tx.abort()
            staged.transactions[tx.id] = (False, frozenset({b"routed-out"}))
            await staged.run("routed", {})

            cases = [case for case, _ in faults] + ["cut-link", "routed"]
            outputs = {case: await staged.outputs(case) for case in cases}
            for case in cases:
                assert await (await conn.primary()).get(f"in-{case}") is None, f"{case}: its input is back"
        for case in cases:
            assert [b for b, _ in outputs[case]] == [f"{case}-out".encode()], (case, outputs[case])
        verdict = atomicity(staged.transactions, [o for out in outputs.values() for o in out])
        assert (verdict.partial, verdict.acked_twice) == (0, 0), (verdict, staged.transactions, outputs)
    finally:
        await cl.stop()
