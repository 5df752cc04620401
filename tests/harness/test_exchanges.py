"""Exchanges and bindings in a group (broker.partitions.topology, broker.messaging.routed), on the
in-process harness: the group's level, routing by topic, fanout and headers through client
sessions on any member, a fan-out to 30 queues of 3 partitions through a kill of a member with the producer
resending what failed (each queue holds every confirmed message once), the topology surviving a
restart and reaching a member that missed it, and the refusals in words."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from client.errors import ErrorCode
from client.protocol.frames import (Bind, DeclareExchange, DeclareExchangeOk, Delete, DeleteExchange, Error, Exchanges,
                                    Frame, ListExchanges, Ok, Publish, PublishMessage, PublishOk, Unbind)
from tests.harness.group import Group, Member
from tests.harness.sessions import ClientSession, Reader
from tests.harness.test_limits import finalize
from tests.harness.test_relay import actives

pytestmark = pytest.mark.asyncio


async def ok(s: ClientSession, frame: Frame) -> Frame:
    reply = await s.ask(frame)
    assert not isinstance(reply, Error), reply
    return reply


async def drain(g: Group, m: Member, queue: str, expect: int) -> Counter[bytes]:
    reader = Reader(g, m, queue, prefetch=200)
    await reader.subscribe()
    await reader.until(expect)
    await g.run_for(0.5)
    await reader.step()
    return reader.got


def applied_everywhere(g: Group, check: object) -> bool:
    return all(m.node is not None and check(m.node.ops.topology.table) for m in g.alive())  # type: ignore[operator]


async def test_a_group_routes_by_topic_fanout_and_headers_once_at_level_4(tmp_path: Path) -> None:
    async with Group(tmp_path) as g:
        await g.start()
        s = ClientSession(g, g["n2"])
        reply = await s.ask(DeclareExchange(rid=1, exchange="t", type="topic"))
        assert isinstance(reply, Error) and "feature level 4 (it is at 1)" in reply.message, reply
        await finalize(g, g["n1"], 4)
        assert isinstance(await ok(s, DeclareExchange(rid=2, exchange="t", type="topic")), DeclareExchangeOk)
        again = await ok(s, DeclareExchange(rid=3, exchange="t", type="topic"))
        assert isinstance(again, DeclareExchangeOk) and not again.created
        for q in ("eu", "orders", "all"):
            await g.declare(q, partitions=3)
        await ok(s, Bind(rid=4, source="t", destination="eu", routing_key="*.eu.#"))
        await ok(s, Bind(rid=5, source="t", destination="orders", routing_key="orders.*"))
        await ok(s, Bind(rid=6, source="t", destination="all", routing_key="#"))
        await g.until(lambda: applied_everywhere(g, lambda t: len(t.bindings.get("t", ())) == 3), 10.0,
                      what="bindings on every member")
        sent: Counter[str] = Counter()
        publisher = ClientSession(g, g["n3"])  # (a member that is not where the bindings were made)
        for i, key in enumerate(["orders.eu", "orders.us", "news.eu.fr", "misc"] * 25):
            body = f"{key}/{i}".encode()
            r = await ok(publisher, Publish(rid=100 + i, queue="", messages=[PublishMessage(None, {}, body, i)],
                                            producer_id="p1", exchange="t", routing_key=key))
            assert isinstance(r, PublishOk) and r.unroutable == 0, r
            sent[key] += 1
        # one batch, each message its own routing key
        keys = ["orders.eu", "misc", "news.eu"]
        r = await ok(publisher, Publish(rid=200, queue="", messages=[PublishMessage(None, {}, f"{k}/x".encode(), 100 + i)
                                                                     for i, k in enumerate(keys)],
                                        producer_id="p1", exchange="t", routing_keys=keys))
        assert isinstance(r, PublishOk) and r.stored == 3 + 1 + 1 + 1, r  # (all: 3; eu: 2; orders: 1)
        r = await publisher.ask(Publish(rid=201, queue="", messages=[PublishMessage(None, {}, b"z", 200)],
                                        producer_id="p1", exchange="t", routing_keys=["a", "b"]))
        assert isinstance(r, Error) and "routing_keys: 2 for 1 messages" in r.message, r
        eu = await drain(g, g["n1"], "eu", 52)
        orders = await drain(g, g["n1"], "orders", 51)
        everything = await drain(g, g["n2"], "all", 103)
        assert sum(eu.values()) == 52 and {b.split(b"/")[0] for b in eu} == {b"orders.eu", b"news.eu.fr", b"news.eu"}
        assert sum(orders.values()) == 51 and {b.split(b"/")[0] for b in orders} == {b"orders.eu", b"orders.us"}
        assert sum(everything.values()) == 103 and max(everything.values()) == 1

        # headers, fanout, an alternate exchange, mandatory
        await ok(s, DeclareExchange(rid=10, exchange="rest", type="fanout"))
        await ok(s, DeclareExchange(rid=11, exchange="h", type="headers", alternate="rest"))
        await g.declare("pdf")
        await g.declare("leftover")
        await ok(s, Bind(rid=12, source="h", destination="pdf", arguments={"x-match": "any", "format": "pdf"}))
        await ok(s, Bind(rid=13, source="rest", destination="leftover"))
        msgs = [PublishMessage(None, {"format": f}, f"{f}{n}".encode(), n) for n, f in enumerate(["pdf", "zip", "pdf"])]
        r = await ok(publisher, Publish(rid=20, queue="", messages=msgs, producer_id="p2", exchange="h"))
        assert isinstance(r, PublishOk) and r.stored == 3 and r.unroutable == 0
        assert sum((await drain(g, g["n3"], "pdf", 2)).values()) == 2
        assert set(await drain(g, g["n3"], "leftover", 1)) == {b"zip1"}
        await ok(s, DeclareExchange(rid=21, exchange="lonely", type="direct"))
        r = await s.ask(Publish(rid=22, queue="", messages=[PublishMessage(None, {}, b"x", 0)], producer_id="p3",
                                exchange="lonely", routing_key="k", mandatory=True))
        assert isinstance(r, Error) and r.code == ErrorCode.NO_ROUTE and "nothing of the batch" in r.message, r
        r = await ok(s, Publish(rid=23, queue="", messages=[PublishMessage(None, {}, b"x", 1)], producer_id="p3",
                                exchange="lonely", routing_key="k"))
        assert isinstance(r, PublishOk) and (r.stored, r.unroutable) == (0, 1)

        listed = await ok(s, ListExchanges(rid=30))
        assert isinstance(listed, Exchanges)
        by_name = {e.name: e for e in listed.exchanges}
        assert by_name["h"].alternate == "rest" and by_name["h"].bindings[0].arguments == {"x-match": "any",
                                                                                            "format": "pdf"}
        assert sorted(b.destination for b in by_name["t"].bindings) == ["all", "eu", "orders"]


async def test_refusals_say_what_is_wrong(tmp_path: Path) -> None:
    async with Group(tmp_path) as g:
        await g.start()
        await finalize(g, g["n1"], 4)
        s = ClientSession(g, g["n1"])
        await ok(s, DeclareExchange(rid=1, exchange="d", type="direct"))
        cases: list[tuple[Frame, ErrorCode, str]] = [
            (DeclareExchange(rid=2, exchange="d", type="fanout"), ErrorCode.EXCHANGE_EXISTS_DIFFERENT,
             "exists as type direct"),
            (DeclareExchange(rid=3, exchange="e", type="topic", alternate="ghost"), ErrorCode.INVALID_ARGUMENT,
             "no such exchange"),
            (DeclareExchange(rid=4, exchange="e", type="bogus"), ErrorCode.INVALID_ARGUMENT, "one of direct"),
            (Bind(rid=5, source="d", destination="nowhere"), ErrorCode.QUEUE_NOT_FOUND, "no queue 'nowhere'"),
            (Bind(rid=6, source="ghost", destination="q"), ErrorCode.EXCHANGE_NOT_FOUND, "no exchange 'ghost'"),
            (Bind(rid=7, source="d", destination="tandem.quarantine"), ErrorCode.ACCESS_REFUSED, "group only"),
            (DeleteExchange(rid=8, exchange="ghost"), ErrorCode.EXCHANGE_NOT_FOUND, "no exchange"),
            (Publish(rid=9, queue="", messages=[], exchange="ghost"), ErrorCode.EXCHANGE_NOT_FOUND, "no exchange"),
        ]
        for frame, code, words in cases:
            r = await s.ask(frame)
            assert isinstance(r, Error) and r.code == code and words in r.message, (frame, r)
        await g.declare("q")
        await ok(s, Bind(rid=10, source="d", destination="q", routing_key="k"))
        r = await s.ask(DeleteExchange(rid=11, exchange="d", if_unused=True))
        assert isinstance(r, Error) and "in use" in r.message
        await ok(s, DeclareExchange(rid=12, exchange="front", type="fanout", alternate="d"))
        r = await s.ask(DeleteExchange(rid=13, exchange="d"))
        assert isinstance(r, Error) and "alternate exchange of front" in r.message
        await ok(s, Unbind(rid=14, source="d", destination="q", routing_key="k"))
        await ok(s, Unbind(rid=15, source="d", destination="q", routing_key="k"))  # (nothing to remove: no change)
        assert isinstance(await s.ask(DeleteExchange(rid=16, exchange="front")), Ok)
        assert isinstance(await s.ask(DeleteExchange(rid=17, exchange="d", if_unused=True)), Ok)


async def test_a_fan_out_through_a_kill_stores_each_message_once_per_queue(tmp_path: Path) -> None:
    async with Group(tmp_path) as g:
        await g.start()
        await finalize(g, g["n1"], 4)
        s = ClientSession(g, g["n1"])
        await ok(s, DeclareExchange(rid=1, exchange="fan", type="fanout"))
        queues = [f"q{i:02d}" for i in range(30)]  # (as many as with real processes: tests/integration/test_exchanges.py)
        for q in queues:  # (three partitions each: every member is active for some of them)
            await g.declare(q, partitions=3)
            await ok(s, Bind(rid=2, source="fan", destination=q))
        await g.until(lambda: all(all(actives(g, q)) for q in queues), 30.0, what="every partition active")
        assert {a for q in queues for a in actives(g, q)} == {"n1", "n2", "n3"}
        victim = next(m.name for m in g.alive() if m.name != "n1")
        confirmed: list[bytes] = []
        seq = 0
        for batch in range(30):
            msgs = [PublishMessage(None, {}, f"b{batch}-{i}".encode(), seq + i) for i in range(5)]
            seq += len(msgs)
            for attempt in range(40):  # the SDK's idempotent resend: the same seqs until confirmed
                frame = Publish(rid=1000 + batch * 100 + attempt, queue="", messages=msgs, producer_id="fan-producer",
                                exchange="fan")
                if batch == 10 and attempt == 0:  # the kill lands as this batch is routed
                    s.life.spawn(s.session._handle(frame), name="publish-in-flight")
                    await g.kill(victim)
                r = await s.ask(frame) if not (batch == 10 and attempt == 0) else await s.answer(frame.rid)
                if isinstance(r, PublishOk):
                    confirmed += [m.body for m in msgs]
                    break
                assert r.code in (ErrorCode.UNAVAILABLE, ErrorCode.NOT_ACTIVE), r
                await g.run_for(0.5)
            else:
                raise AssertionError(f"batch {batch} never confirmed")
        if not g[victim].alive:
            await g.restart(victim)
        await g.until(g.formed, 30.0, what="the group formed again")
        lost = duplicated = unexpected = 0
        for q in queues:
            got = await drain(g, g["n1"], q, len(confirmed))
            lost += len(set(confirmed) - set(got))
            duplicated += sum(1 for n in got.values() if n > 1)
            unexpected += len(set(got) - set(confirmed))
        assert (lost, duplicated, unexpected) == (0, 0, 0)
        assert len(confirmed) == 150


async def test_the_topology_survives_a_restart_and_reaches_a_member_that_missed_it(tmp_path: Path) -> None:
    async with Group(tmp_path) as g:
        await g.start()
        await finalize(g, g["n1"], 4)
        await g.kill("n3")
        s = ClientSession(g, g["n1"])
        await ok(s, DeclareExchange(rid=1, exchange="x", type="direct"))
        await g.declare("q")
        await ok(s, Bind(rid=2, source="x", destination="q", routing_key="k"))
        await g.restart("n3")
        await g.until(lambda: applied_everywhere(g, lambda t: "x" in t.exchanges and t.bindings.get("x")), 30.0,
                      what="n3 has the exchange and its binding")
        await g.kill("n1")
        await g.restart("n1")
        await g.until(lambda: applied_everywhere(g, lambda t: "x" in t.exchanges and t.bindings.get("x")), 30.0,
                      what="n1 has them again from its store")
        r = await ok(ClientSession(g, g["n1"]), Publish(rid=3, queue="", messages=[PublishMessage(None, {}, b"m", 0)],
                                                        producer_id="p", exchange="x", routing_key="k"))
        assert isinstance(r, PublishOk) and r.stored == 1
        # deleting the queue takes its binding with it, on every member
        await ok(ClientSession(g, g["n2"]), Delete(rid=4, queue="q"))
        await g.until(lambda: applied_everywhere(g, lambda t: not t.bindings.get("x")), 30.0,
                      what="the binding gone with its queue")
