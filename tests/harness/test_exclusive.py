"""Exclusive consumers and AMQP's if_empty in a group, on the in-process harness: an exclusive
consumer on one member (broker.messaging.delivery, broker.sessions.relay) keeps every other
consumer off the queue on every member its relays reach; one that meets another consumer on
any member ends (its client is told with a Cancel), and nothing is lost or delivered twice.  A
delete ``if_empty`` with ``ready_only`` asks every partition's active for its ready messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from client.errors import ErrorCode
from client.protocol.frames import Cancel, Delete, Error, Get, GetOk, Ok, Subscribe, SubscribeOk
from tests.harness.group import Group
from tests.harness.sessions import ClientSession, Reader
from tests.harness.test_relay import check, publish_all, queue_spread

pytestmark = pytest.mark.asyncio


def consumers(g: Group, member: str, queue: str, *, exclusive: bool | None = None) -> int:
    """The consumers of ``queue`` held on ``member`` (its own and other members' relays)."""
    node = g[member].node
    assert node is not None
    return sum(1 for c in node.catalogue.queues[queue].consumers if exclusive is None or c.exclusive == exclusive)


async def test_an_exclusive_consumer_keeps_every_member_off_and_gets_everything(tmp_path: Path) -> None:
    async with Group(tmp_path) as g:
        await g.start()
        await queue_spread(g, "q")
        bodies = [f"m{i}".encode() for i in range(300)]
        await publish_all(g, g["n2"], "q", bodies)
        reader = Reader(g, g["n1"], "q")
        reply = await reader.s.ask(Subscribe(rid=reader.next_rid(), queue="q", prefetch=40, exclusive=True))
        assert isinstance(reply, SubscribeOk), reply
        reader.consumer = reply.consumer
        await g.until(lambda: all(consumers(g, m, "q", exclusive=True) == 1 for m in ("n1", "n2", "n3")), 10.0,
                      what="the exclusive consumer relayed to every member")
        for member in ("n1", "n2", "n3"):
            refused = await ClientSession(g, g[member]).ask(Subscribe(rid=1, queue="q"))
            assert isinstance(refused, Error) and refused.code == ErrorCode.ACCESS_REFUSED, refused
            assert "in exclusive use" in refused.message, refused
        await reader.until(300)
        await g.run_for(1.0)
        await reader.step()
        assert check(bodies, reader.got) == (0, 0, 0)


async def test_an_exclusive_consumer_is_refused_where_another_member_has_a_consumer(tmp_path: Path) -> None:
    async with Group(tmp_path) as g:
        await g.start()
        await queue_spread(g, "q")
        plain = Reader(g, g["n2"], "q")
        await plain.subscribe()
        await g.until(lambda: all(consumers(g, m, "q") == 1 for m in ("n1", "n2", "n3")), 10.0,
                      what="n2's consumer relayed to every member")
        refused = await ClientSession(g, g["n1"]).ask(Subscribe(rid=1, queue="q", exclusive=True))
        assert isinstance(refused, Error) and refused.code == ErrorCode.ACCESS_REFUSED, refused


async def test_an_exclusive_consumer_that_meets_a_consumer_through_its_relays_ends(tmp_path: Path) -> None:
    async with Group(tmp_path) as g:
        await g.start()
        await queue_spread(g, "q")
        g.net.cut("n1", "n2")  # (n2's consumer never reaches n1, so n1 takes an exclusive one)
        await g.until(lambda: "n2" not in g["n1"].node.services.links(), 10.0,  # type: ignore[union-attr]
                      what="n1's link to n2 down")
        plain = Reader(g, g["n2"], "q")
        await plain.subscribe()
        await g.until(lambda: consumers(g, "n3", "q") == 1, 10.0, what="n2's consumer relayed to n3")
        s = ClientSession(g, g["n1"])
        taken = await s.ask(Subscribe(rid=1, queue="q", exclusive=True))
        assert isinstance(taken, SubscribeOk), taken
        cancels: list[Cancel] = []
        await g.until(lambda: bool(cancels.extend(s.pushed(Cancel)) or cancels), 10.0,
                      what="the exclusive consumer cancelled on meeting n3's consumer")
        assert [c.consumer for c in cancels] == [taken.consumer]
        await g.until(lambda: all(consumers(g, m, "q", exclusive=True) == 0 for m in ("n1", "n3")), 10.0,
                      what="the exclusive consumer gone from n1 and n3")
        g.net.heal()
        await g.until(lambda: all(consumers(g, m, "q") == 1 for m in ("n1", "n2", "n3")), 30.0,
                      what="n2's consumer relayed to every member once healed")


async def test_delete_if_empty_of_ready_messages_asks_every_partitions_active(tmp_path: Path) -> None:
    """AMQP's if_empty (``ready_only``): delivered, unsettled messages on any member do not keep
    the queue; a ready one on any member does."""
    async with Group(tmp_path) as g:
        await g.start()
        await queue_spread(g, "q")
        bodies = [f"m{i}".encode() for i in range(30)]
        await publish_all(g, g["n2"], "q", bodies)
        s = ClientSession(g, g["n1"])
        for rid in range(1, 30):  # (all but one delivered, held unacked)
            got = await s.ask(Get(rid=rid, queue="q"))
            assert isinstance(got, GetOk) and got.message is not None, got
        refused = await s.ask(Delete(rid=100, queue="q", if_empty=True, ready_only=True))
        assert isinstance(refused, Error) and "not empty (1 messages)" in refused.message, refused
        last = await s.ask(Get(rid=101, queue="q"))
        assert isinstance(last, GetOk) and last.message is not None, last
        still = await s.ask(Delete(rid=102, queue="q", if_empty=True))  # (Tandem's own: unsettled ones count)
        assert isinstance(still, Error) and "not empty" in still.message, still
        deleted = await s.ask(Delete(rid=103, queue="q", if_empty=True, ready_only=True))
        assert isinstance(deleted, Ok), deleted
