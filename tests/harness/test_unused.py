"""Queues that expire unused (broker.partitions.unused), on the in-process group harness in
virtual time: a queue with a consumer on any member, or declared again, stays; once unused on
every member for its ``expires`` it is deleted everywhere, messages and all."""

from __future__ import annotations

from pathlib import Path

import pytest

from client.protocol.frames import Cancel, Declare, DeclareOk, Ok, PublishMessage
from tests.harness.group import Group
from tests.harness.replication import active
from tests.harness.sessions import ClientSession, Reader
from tests.harness.test_limits import finalize
from tests.harness.test_timing import key_of, publish

pytestmark = pytest.mark.asyncio


def everywhere(g: Group, queue: str) -> bool:
    return all(m.node is not None and queue in m.node.catalogue.queues for m in g.alive())


def nowhere(g: Group, queue: str) -> bool:
    return all(m.node is not None and queue not in m.node.catalogue.queues for m in g.alive())


async def test_a_queue_unused_on_every_member_for_its_expires_is_deleted(tmp_path: Path) -> None:
    async with Group(tmp_path, seed=8) as g:
        await g.start()
        await finalize(g, g["n1"], 3)
        await g.declare("temp", partitions=2, expires=5_000)
        await g.until(lambda: all(active(g, key_of(g, "temp", p)) for p in range(2)), 30.0, what="actives")
        await publish(g, g["n1"], "temp", "p-temp", [PublishMessage(f"k{i}", {}, b"m", i) for i in range(10)])
        cat = g.catalogue_active()
        assert cat is not None
        consumer_at = next(m for m in g.alive() if m is not cat)  # (a member that is not the one deciding)
        reader = Reader(g, consumer_at, "temp", prefetch=1)
        reader.hold = True  # (holds one message unacked: in use all along)
        await reader.subscribe()
        await g.run_for(12.0)
        assert everywhere(g, "temp")  # a consumer on one member keeps it
        reply = await reader.s.ask(Cancel(rid=reader.next_rid(), consumer=reader.consumer))
        assert isinstance(reply, Ok), reply
        cancelled = g.clock.monotonic()
        await g.until(lambda: nowhere(g, "temp"), 30.0, what="temp deleted on every member")
        assert g.clock.monotonic() - cancelled >= 5.0  # not before its expires

        # declared again now and then (by a client of any member): in use; then left alone: gone
        s = ClientSession(g, g["n3"])
        for rid in range(1, 6):
            reply = await s.ask(Declare(rid=rid, queue="again", expires=3_000))
            assert isinstance(reply, DeclareOk), reply
            await g.run_for(2.0)
        assert everywhere(g, "again")
        await g.until(lambda: nowhere(g, "again"), 30.0, what="again deleted")


async def test_expires_is_a_declared_setting_checked_like_the_others(tmp_path: Path) -> None:
    async with Group(tmp_path, seed=9) as g:
        await g.start()
        s = ClientSession(g, g["n2"])
        reply = await s.ask(Declare(rid=1, queue="e", expires=1_000))
        assert not isinstance(reply, DeclareOk) and "feature level 3" in reply.message, reply  # type: ignore[attr-defined]
        await finalize(g, g["n1"], 3)
        assert isinstance(await s.ask(Declare(rid=2, queue="e", expires=60_000)), DeclareOk)
        reply = await s.ask(Declare(rid=3, queue="e", expires=1_000))
        assert "expires: have 60000, asked 1000" in reply.message, reply  # type: ignore[attr-defined]
