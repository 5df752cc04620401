"""Consuming from any node (broker.sessions.relay), on the in-process group harness: a client
session on one member consumes every partition of a queue, wherever each is active, through
link cuts and a member's death; gets, cancels, rejects and a session's end act on the member
that holds the message.  Every run counts what was lost, delivered twice and unexpected."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from client.errors import ErrorCode
from client.protocol.frames import (Ack, Cancel, Deliver, Error, Get, GetOk, Ok, PublishMessage, Reject,
                                    Subscribe, SubscribeOk)
from tests.harness.group import Group, Member
from tests.harness.replication import active
from tests.harness.sessions import ClientSession, Reader

pytestmark = pytest.mark.asyncio


async def publish_all(g: Group, m: Member, queue: str, bodies: list[bytes]) -> None:
    """Publish ``bodies`` (each its own key, so they spread over the partitions) at ``m``, 50 a
    batch, as a producer of its own; each batch confirmed."""
    producer = bodies[0].decode()
    for i in range(0, len(bodies), 50):
        batch = [PublishMessage(b.decode(), {}, b, i + j) for j, b in enumerate(bodies[i:i + 50])]
        out = g.publish(m, queue, producer, batch)
        await g.until(out.done, 10.0, what=f"batch {i} confirmed")
        assert out.exception() is None, out.exception()


def actives(g: Group, queue: str) -> list[str]:
    q = g.alive()[0].node.catalogue.queues[queue]  # type: ignore[union-attr]
    return [a.name if (a := active(g, (q.meta.id, p))) is not None else "" for p in range(q.meta.partitions)]


def check(bodies: list[bytes], got: Counter[bytes]) -> tuple[int, int, int]:
    """(lost, delivered more than once, unexpected)."""
    want = set(bodies)
    return (len(want - set(got)), sum(1 for b, n in got.items() if n > 1), len(set(got) - want))


async def queue_spread(g: Group, queue: str, partitions: int = 6) -> None:
    """Declare ``queue`` and wait until its partitions are active on at least two members."""
    await g.declare(queue, partitions=partitions)
    await g.until(lambda: all(actives(g, queue)) and len(set(actives(g, queue))) >= 2, 30.0,
                  what=f"{queue}'s partitions active on two members")


async def reading_on_n1(g: Group) -> tuple[list[bytes], list[str], str, Reader]:
    """Start the group, fill a 6-partition queue spread over the members with 600 messages, and
    subscribe a reader on n1: (the bodies, each partition's active, a member other than n1 that is
    active for some, the reader)."""
    await g.start()
    await queue_spread(g, "q")
    bodies = [f"m{i}".encode() for i in range(600)]
    await publish_all(g, g["n1"], "q", bodies)
    where = actives(g, "q")
    reader = Reader(g, g["n1"], "q", prefetch=20)
    await reader.subscribe()
    return bodies, where, next(a for a in where if a != "n1"), reader


async def test_one_session_on_one_member_consumes_every_partition(tmp_path: Path) -> None:
    async with Group(tmp_path) as g:
        await g.start()
        await queue_spread(g, "q")
        bodies = [f"m{i}".encode() for i in range(600)]
        await publish_all(g, g["n2"], "q", bodies)
        where = actives(g, "q")
        reader = Reader(g, g["n1"], "q")
        await reader.subscribe()
        await reader.until(600)
        await g.run_for(1.0)
        await reader.step()
        assert check(bodies, reader.got) == (0, 0, 0)
        assert reader.partitions == set(range(6)), where
        assert any(a != "n1" for a in where)  # (some came through a relay)
        await g.until(lambda: all(g[a].node.catalogue.queues["q"].depth == 0 for a in set(where)),  # type: ignore[union-attr]
                      10.0, what="every partition settled on its active")

        reply = await reader.s.ask(Cancel(rid=reader.next_rid(), consumer=reader.consumer))
        assert isinstance(reply, Ok), reply
        local = Reader(g, g["n1"], "q", local=True)  # only the partitions active on n1
        await local.subscribe()
        more = [f"l{i}".encode() for i in range(120)]
        await publish_all(g, g["n2"], "q", more)
        await g.run_for(2.0)
        await local.step()
        assert local.partitions == {p for p, a in enumerate(where) if a == "n1"}
        assert not reader.s.pushed(Deliver)  # (cancelled: nothing more, relayed or not)


async def test_a_cut_link_gives_back_what_it_held_and_the_relay_comes_back(tmp_path: Path) -> None:
    """The link from the consumer's member to another that is active for some partitions is cut
    with deliveries unacked: that member makes them ready again; once healed they come again
    and every message is delivered, none lost."""
    async with Group(tmp_path) as g:
        bodies, where, other, reader = await reading_on_n1(g)
        await reader.until(100)
        reader.hold = True  # what comes now stays unacked across the cut
        await g.run_for(0.5)
        await reader.step()
        assert reader.held
        g.net.cut("n1", other)
        await g.run_for(8.0)  # both ends see the link down
        reader.hold = False
        # the tags relayed over the cut link are forgotten: acking them is refused, as after a failover
        reply = await reader.s.ask(Ack(rid=reader.next_rid(), tags=reader.held))
        assert isinstance(reply, Error) and reply.code == ErrorCode.UNKNOWN_DELIVERY_TAG, reply
        g.net.heal()
        await reader.until(600)
        lost, twice, unexpected = check(bodies, reader.got)
        assert (lost, unexpected) == (0, 0)
        assert twice  # (what the cut link held came again)
        await g.until(lambda: all(g[a].node.catalogue.queues["q"].depth == 0 for a in set(where)),  # type: ignore[union-attr]
                      30.0, what="every partition settled on its active")


@pytest.mark.parametrize("seed", range(5))
async def test_a_member_killed_mid_consume_loses_nothing(tmp_path: Path, seed: int) -> None:
    """The member active for some of the queue's partitions dies while a session on another
    consumes (links delayed by up to 20 ms, a schedule per seed): the partitions fail over, and
    the one session still gets every message."""
    async with Group(tmp_path, seed=seed, max_delay=0.02) as g:
        bodies, _where, victim, reader = await reading_on_n1(g)
        await reader.until(150)
        await g.kill(victim)
        await reader.until(600, timeout=120.0)
        lost, _twice, unexpected = check(bodies, reader.got)
        assert (lost, unexpected) == (0, 0)


async def test_get_reject_cancel_and_a_session_end_act_where_the_message_is(tmp_path: Path) -> None:
    async with Group(tmp_path) as g:
        await g.start()
        await g.declare("dlq", partitions=1)
        await g.declare("q", partitions=6, dead_letter_queue="dlq")
        await g.until(lambda: all(actives(g, "q")) and len(set(actives(g, "q"))) >= 2, 30.0,
                      what="q's partitions active on two members")
        bodies = [f"m{i}".encode() for i in range(60)]
        await publish_all(g, g["n2"], "q", bodies)
        s = ClientSession(g, g["n1"])
        # gets: one connection takes every message, whichever member holds it
        got, tags = [], []
        for rid in range(1, 200):
            reply = await s.ask(Get(rid=rid, queue="q"))
            assert isinstance(reply, GetOk), reply
            if reply.message is None:
                break
            got.append(reply.message.body)
            tags.append(reply.message.tag)
        assert sorted(got) == sorted(bodies)
        # reject half: dead-lettered on the members that hold them; ack the rest
        reply = await s.ask(Reject(rid=300, tags=tags[:30]))
        assert isinstance(reply, Ok), reply
        reply = await s.ask(Ack(rid=301, tags=tags[30:]))
        assert isinstance(reply, Ok), reply
        reply = await s.ask(Ack(rid=302, tags=tags[:1]))
        assert isinstance(reply, Error) and reply.code == ErrorCode.UNKNOWN_DELIVERY_TAG, reply
        dlq = Reader(g, g["n1"], "dlq")
        await dlq.subscribe()
        await dlq.until(30)
        assert set(dlq.got) == set(got[:30])

        # a session that ends with relayed deliveries unacked: they go to the next consumer
        more = [f"x{i}".encode() for i in range(60)]
        await publish_all(g, g["n2"], "q", more)
        first = Reader(g, g["n1"], "q")
        first.hold = True
        await first.subscribe()
        await first.until(60)
        reply = await first.s.ask(Cancel(rid=first.next_rid(), consumer=first.consumer))
        assert isinstance(reply, Ok), reply
        await end_session(g, first.s)
        second = Reader(g, g["n3"], "q")
        await second.subscribe()
        await second.until(60)
        assert set(second.got) == set(more)


async def end_session(g: Group, s: ClientSession) -> None:
    """The client's connection ends: the node releases the session as it does at a disconnect."""
    node = s.m.node
    assert node is not None
    s.m.run(node.relays.release, s.session)
    s.m.run(node.delivery.release, s.session)
    await g.run_for(0.5)
