"""Members that never stand, on the in-process group harness: a priority-0 node votes and
keeps a copy of every partition but never stands, not even when it is the only other member
left; an async replica (a learner) is fed, never counts toward a commit and never stands."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from client.protocol.frames import PublishMessage
from tests.harness.clients import Consumer, Ledger, Producer, spawn_clients
from tests.harness.group import Group
from tests.harness.replication import active, declared_with_active, key_of, with_settings

pytestmark = pytest.mark.asyncio

PARTITIONS = 6


async def test_a_priority_0_node_is_never_active(tmp_path: Path) -> None:
    async with Group(tmp_path) as g:
        with_settings(g, "n1", priority=0)
        await g.start()
        await g.declare("q", partitions=PARTITIONS)
        keys = [key_of(g, "q", p) for p in range(PARTITIONS)]
        ledger = Ledger()
        producer = Producer(g, ledger, "q", "p0", random.Random(0), total=3, max_batch=3, keys=6)
        tasks = spawn_clients(producer.run())
        await g.until(lambda: producer.done, 10.0, what="3 messages confirmed")
        await g.until(lambda: all(active(g, k) is not None for k in keys), 10.0, what="an active for each partition")
        holders = [active(g, k) for k in keys]
        assert g["n1"] not in holders
        for m in g.alive():  # every member's view
            rep = m.node.ha.replication if m.node is not None else None
            assert rep is not None and all(rep.active_of(k) != "n1" for k in keys), m
        busiest = max((g["n2"], g["n3"]), key=holders.count)
        other = g["n3"] if busiest is g["n2"] else g["n2"]
        await g.kill(busiest.name)
        await g.until(lambda: all(active(g, k) is other for k in keys), 10.0,
                      what=f"every partition active on {other.name}")  # n1 votes, keeps a copy, never stands
        await g.run_for(2.0)  # (n1 would have stood meanwhile)
        assert all(active(g, k) is other for k in keys)
        consumer = Consumer(g, ledger, "q", "c0", random.Random(1))
        tasks += spawn_clients(consumer.run())
        await g.until(lambda: not ledger.unacked_confirmed(), 10.0, what="the 3 messages delivered and acked")
        for t in tasks:
            t.cancel()
        assert sorted(d.body for d in ledger.deliveries) == [b"p0:0", b"p0:1", b"p0:2"]
        assert ledger.violations() == [], ledger.violations()


async def test_async_replicas_are_fed_and_never_count(tmp_path: Path) -> None:
    """replicas=2, sync_replicas=1: each partition has an active, a sync replica (votes) and an
    async one (a learner).  The learner catches up; losing it stops nothing; it never stands."""
    async with Group(tmp_path, replicas=2, sync_replicas=1) as g:
        await g.start()
        key, a = await declared_with_active(g, "q")

        def replicas() -> dict[str, tuple[str, int, int]]:
            rep = a.node.ha.replication if a.node is not None else None
            assert rep is not None
            (part,) = [p for p in rep.partition_infos() if p.queue == "q"]
            return {r.node: (r.kind, r.lag, r.match) for r in part.replicas}

        assert sorted(k for k, _lag, _match in replicas().values()) == ["async", "sync"]
        learner = next(n for n, (k, _lag, _match) in replicas().items() if k == "async")
        ledger = Ledger()
        producer = Producer(g, ledger, "q", "p0", random.Random(0), total=50, max_batch=5, keys=6)
        tasks = spawn_clients(producer.run())
        await g.until(lambda: producer.done, 30.0, what="50 messages confirmed")
        await g.until(lambda: replicas()[learner][1] == 0 and replicas()[learner][2] > 0, 10.0,
                      what="the async replica caught up")
        await g.kill(learner)
        after = g.publish(a, "q", "p1", [PublishMessage("k", {}, b"after the learner died", 0)])
        await g.until(after.done, 1.0, what="a confirm without the learner")  # it never counted
        after.result()
        assert active(g, key) is a
        consumer = Consumer(g, ledger, "q", "c0", random.Random(1))
        tasks += spawn_clients(consumer.run())
        ledger.sent[b"after the learner died"] = "k"
        ledger.confirmed.add(b"after the learner died")
        await g.until(lambda: not ledger.unacked_confirmed(), 10.0, what="51 messages delivered and acked")
        for t in tasks:
            t.cancel()
        assert len({d.body for d in ledger.deliveries}) == 51
        assert ledger.violations() == [], ledger.violations()
