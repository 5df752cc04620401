"""A member that has not applied a declare the group confirmed, on the in-process group
harness, asked through a client session (tests/harness/sessions.py): it catches up with the
catalogue's active before it calls a queue missing, and when it cannot ask the active it
answers UNAVAILABLE (retry), never "does not exist", which would end a group consumer for
good on a queue that exists."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from client.errors import ErrorCode
from client.protocol.frames import Declare, Error, Get, GetOk, Metadata, MetadataOk, PublishMessage, Subscribe, SubscribeOk
from tests.harness.clients import Consumer, Ledger, spawn_clients
from tests.harness.group import Group, Member
from tests.harness.replication import active
from tests.harness.sessions import ClientSession

pytestmark = pytest.mark.asyncio


def outsider(g: Group) -> tuple[Member, list[str]]:
    """A member that is not the catalogue's active, and the others."""
    cat = g.catalogue_active()
    assert cat is not None
    iso = next(m for m in reversed(g.alive()) if m is not cat)
    return iso, [n for n in g.members if n != iso.name]


async def declare_at(g: Group, m: Member, queue: str, partitions: int) -> None:
    """Declare ``queue`` through member ``m`` (it forwards to the catalogue's active): once confirmed."""
    assert m.node is not None and m.life is not None
    task = m.life.spawn(m.node.catalogue.declare(Declare(rid=0, queue=queue, partitions=partitions)),
                        name="harness-declare")
    await g.until(task.done, 30.0, what=f"declare {queue} at {m.name}")
    task.result()


async def publish_all(g: Group, m: Member, queue: str, bodies: list[bytes]) -> None:
    """Publish ``bodies`` (each its own key) at ``m``, 20 a batch; each batch confirmed."""
    for i in range(0, len(bodies), 20):
        batch = [PublishMessage(b.decode(), {}, b, i + j) for j, b in enumerate(bodies[i:i + 20])]
        out = g.publish(m, queue, "p0", batch)
        await g.until(out.done, 10.0, what=f"batch {i} confirmed")
        assert out.exception() is None, out.exception()


def unavailable(reply: object) -> bool:
    return isinstance(reply, Error) and reply.code == ErrorCode.UNAVAILABLE


async def test_a_member_that_missed_a_declare_and_cannot_ask_says_unavailable_not_missing(tmp_path: Path) -> None:
    """A member is cut off while the others declare a queue and fill it.  It cannot ask the
    catalogue's active how far the catalogue goes, so it cannot tell whether the queue
    exists: it answers UNAVAILABLE.  A consumer on every member is served by the others (its
    subscription there waits), every message once.  Once healed, the member finds the queue."""
    async with Group(tmp_path) as g:
        await g.start()
        iso, others = outsider(g)
        g.net.isolate(iso.name, others)
        await declare_at(g, g[others[0]], "missed", 3)  # committed by the other two
        assert "missed" not in iso.node.catalogue.queues  # type: ignore[union-attr]
        bodies = [f"missed-{i}".encode() for i in range(60)]
        await publish_all(g, g[others[0]], "missed", bodies)
        s = ClientSession(g, iso)
        reply = await s.ask(Metadata(rid=1, queue="missed"))
        assert unavailable(reply), reply
        reply = await s.ask(Subscribe(rid=2, queue="missed"))
        assert unavailable(reply), reply

        ledger = Ledger()
        consumer = Consumer(g, ledger, "missed", "c0", random.Random(0))
        tasks = spawn_clients(consumer.run())
        meta = g[others[0]].node.catalogue.queues["missed"].meta  # type: ignore[union-attr]

        def drained() -> bool:
            if len(ledger.deliveries) < len(bodies) or consumer.pending:
                return False
            for p in range(3):
                a = active(g, (meta.id, p))
                q = a.node.catalogue.queues["missed"] if a is not None and a.node is not None else None
                if q is None or q.partitions[p].ready or q.unacked_count or q.pending_count:
                    return False
            return True

        await g.until(drained, 30.0, what="missed consumed on the other members")
        for t in tasks:
            t.cancel()
        got = [d.body for d in ledger.deliveries]
        assert sorted(got) == sorted(bodies)  # none lost, none twice, nothing unexpected
        assert {d.node for d in ledger.deliveries} <= set(others)

        g.net.heal()
        rid = 3

        async def found() -> bool:
            nonlocal rid
            rid += 1
            reply = await s.ask(Metadata(rid=rid, queue="missed"))
            if unavailable(reply):
                await g.run_for(0.2)
                return False
            assert isinstance(reply, MetadataOk), reply
            return reply.map.queue.partitions == 3

        for _ in range(50):
            if await found():
                break
        else:
            raise AssertionError(f"{iso.name} did not find the queue after the heal")


async def test_a_queue_declared_through_one_member_can_be_used_at_once_on_a_lagging_one(tmp_path: Path) -> None:
    """One member's peer links are slow (up to 400 ms each way): a declare commits on the
    catalogue's active and the third member without it.  A client that then uses the queue
    on the lagging member is not told it does not exist: the member catches up with the
    catalogue's active first.  A queue that really does not exist is still refused."""
    async with Group(tmp_path) as g:
        await g.start()
        first = g.catalogue_active()
        assert first is not None
        lagging, others = outsider(g)
        for o in others:
            g.net.set_delay(lagging.name, o, 0.4)
            g.net.set_delay(o, lagging.name, 0.4)
        assert lagging.node is not None
        queues = lagging.node.catalogue.queues
        at_first, at_lagging = ClientSession(g, first), ClientSession(g, lagging)
        for i in range(3):
            declared = await at_first.ask(Declare(rid=10 + i, queue=f"lag{i}", partitions=2))
            assert not isinstance(declared, Error), declared
            assert f"lag{i}" not in queues  # (the declare has not reached it)
            reply = await at_lagging.ask(Metadata(rid=10 + i, queue=f"lag{i}"))
            assert isinstance(reply, MetadataOk) and reply.map.queue.partitions == 2, reply
        assert not isinstance(await at_first.ask(Declare(rid=20, queue="lag-consume")), Error)
        assert "lag-consume" not in queues  # (the declare has not reached it)
        reply = await at_lagging.ask(Subscribe(rid=20, queue="lag-consume"))
        assert isinstance(reply, SubscribeOk), reply
        assert not isinstance(await at_first.ask(Declare(rid=21, queue="lag-get")), Error)
        assert "lag-get" not in queues
        reply = await at_lagging.ask(Get(rid=21, queue="lag-get"))
        assert isinstance(reply, GetOk) and reply.message is None, reply  # found, and empty
        reply = await at_lagging.ask(Metadata(rid=22, queue="never-declared"))
        assert isinstance(reply, Error) and reply.code == ErrorCode.QUEUE_NOT_FOUND, reply
