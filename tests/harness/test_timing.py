"""Time in the queues (broker.messaging.timing), on the in-process group harness in virtual time:
10,000 delayed messages across a failover of their partitions' active, each delivered no
earlier than its time and within a second after it once an active serves it; a queue's
message_ttl and a message's own expiration dead-letter what expired, counted, never delivered;
a restart keeps what is delayed; timing headers are refused below feature level 3 or malformed."""

from __future__ import annotations

import random
import statistics
from pathlib import Path

import pytest

from client.errors import ErrorCode
from client.protocol.frames import Error, PublishMessage, Publish, PublishOk
from tests.harness.group import Group, Member
from tests.harness.replication import active
from tests.harness.sessions import ClientSession, Reader
from tests.harness.test_limits import finalize

pytestmark = pytest.mark.asyncio


async def publish(g: Group, m: Member, queue: str, producer: str, msgs: list[PublishMessage]) -> None:
    for i in range(0, len(msgs), 200):
        out = g.publish(m, queue, producer, msgs[i:i + 200])
        await g.until(out.done, 30.0, what=f"batch {i} confirmed")
        assert out.exception() is None, out.exception()


def key_of(g: Group, queue: str, p: int = 0) -> tuple[int, int]:
    return (g.alive()[0].node.catalogue.queues[queue].meta.id, p)  # type: ignore[union-attr]


async def test_ten_thousand_delayed_messages_across_a_failover(tmp_path: Path) -> None:
    async with Group(tmp_path, seed=3) as g:
        await g.start()
        await finalize(g, g["n1"], 3)
        await g.declare("later", partitions=3)
        await g.until(lambda: all(active(g, key_of(g, "later", p)) for p in range(3)), 30.0, what="actives")
        rng = random.Random(11)
        start = g.clock.time()
        due: dict[bytes, float] = {}
        msgs = []
        for i in range(10_000):
            delay_ms = rng.randrange(0, 30_000)
            body = f"d{i}".encode()
            msgs.append(PublishMessage(f"k{i}", {"x-delay": str(delay_ms)}, body, i))
            due[body] = delay_ms / 1000
        at = g["n1"]
        await publish(g, at, "later", "p-later", msgs)
        published = g.clock.time()
        for body in due:  # (the broker stamps each with its publish time: no earlier than the start)
            due[body] += start
        reader = Reader(g, g["n2"], "later", prefetch=500)
        await reader.subscribe()
        victim = active(g, key_of(g, "later", 0))
        assert victim is not None
        # ten virtual seconds in, the active of partition 0 dies; its partitions fail over
        while g.clock.time() < start + 10:
            await g.run_for(0.05)
            await reader.step()
        if victim.name == reader.s.m.name:
            victim = next(m for m in g.alive() if m is not reader.s.m and any(
                active(g, key_of(g, "later", p)) is m for p in range(3)))
        killed = g.clock.time()
        await g.kill(victim.name)
        await g.until(lambda: all(active(g, key_of(g, "later", p)) not in (None, victim) for p in range(3)), 60.0,
                      what="every partition served again")
        served_again = g.clock.time()
        await reader.until(10_000, timeout=120.0)
        assert set(reader.got) == set(due)  # none lost, nothing unexpected
        late = {b: reader.when[b] - max(due[b], published) for b in due}
        assert min(late.values()) >= 0, min(late.values())  # never early
        after = [v for b, v in late.items() if due[b] >= served_again or due[b] < killed]
        outage = [reader.when[b] - served_again for b in due if killed <= due[b] < served_again]
        assert max(after) <= 1.0, max(after)
        assert not outage or max(outage) <= 1.0, max(outage)  # due while no active served: within 1 s of its return
        twice = sum(1 for n in reader.got.values() if n > 1)
        print(f"10,000 delayed 0-30 s, failover {served_again - killed:.1f} s: lateness p50 "
              f"{statistics.median(after) * 1000:.0f} ms, p99 {sorted(after)[len(after) * 99 // 100] * 1000:.0f} ms, "
              f"max {max(after) * 1000:.0f} ms; {len(outage)} due during the failover, delivered within "
              f"{max(outage, default=0) * 1000:.0f} ms of it; {twice} delivered twice")


async def test_a_queue_ttl_dead_letters_what_expired_and_a_message_expiration_too(tmp_path: Path) -> None:
    async with Group(tmp_path, seed=5) as g:
        await g.start()
        await finalize(g, g["n1"], 3)
        await g.declare("expired")
        await g.declare("short", partitions=2, message_ttl=5_000, dead_letter_queue="expired")
        await g.declare("mixed", partitions=1, dead_letter_queue="expired")
        await g.until(lambda: all(active(g, key_of(g, q)) for q in ("expired", "short", "mixed")), 30.0,
                      what="actives")
        await publish(g, g["n1"], "short", "p-short", [PublishMessage(f"k{i}", {}, f"s{i}".encode(), i)
                                                        for i in range(100)])
        await publish(g, g["n1"], "mixed", "p-mixed", [
            PublishMessage(None, {"expiration": "1000"} if i % 2 else {}, f"x{i}".encode(), i) for i in range(20)])
        await g.run_for(6.0)  # past both, nobody consuming: the queue's ttl expires every message at its head
        src = Reader(g, g["n3"], "short")
        await src.subscribe()
        await g.run_for(1.0)
        await src.step()
        assert not src.got  # expired: never delivered
        expired = sum(m.node.catalogue.queues["short"].expired for m in g.alive())  # type: ignore[union-attr]
        assert expired == 100
        # x1, x3, ... expired behind x0, x2, ... (which never do): they go as a consumer reaches them
        mixed = Reader(g, g["n1"], "mixed")
        await mixed.subscribe()
        await mixed.until(10)
        await g.run_for(1.0)
        await mixed.step()
        assert set(mixed.got) == {f"x{i}".encode() for i in range(0, 20, 2)}
        dlq = Reader(g, g["n3"], "expired", prefetch=200)
        await dlq.subscribe()
        await dlq.until(100 + 10)
        assert set(dlq.got) == {f"s{i}".encode() for i in range(100)} | {f"x{i}".encode() for i in range(1, 20, 2)}


async def test_delayed_messages_survive_a_restart_and_bad_or_early_headers_are_refused(tmp_path: Path) -> None:
    async with Group(tmp_path, names=("n1",), seed=2) as g:
        await g.start()
        s = ClientSession(g, g["n1"])
        await g.declare("later")
        await g.until(lambda: active(g, key_of(g, "later")) is not None, 30.0, what="an active")
        for rid, headers, what in ((1, {"x-delay": "soon"}, "header x-delay: 'soon' is not a whole number"),
                                   (2, {"expiration": "-5"}, "header expiration: '-5' is not a whole number"),
                                   (3, {"x-delay": str(2**32)}, "header x-delay: 4294967296 must be at most")):
            reply = await s.ask(Publish(rid=rid, queue="later", messages=[PublishMessage(None, headers, b"m", None)]))
            assert isinstance(reply, Error) and reply.code == ErrorCode.INVALID_ARGUMENT, reply
            assert what in reply.message, reply.message
        await finalize(g, g["n1"], 3)
        start = g.clock.time()
        reply = await s.ask(Publish(rid=4, queue="later", messages=[
            PublishMessage(None, {"x-delay": "20000"}, b"in 20 s", None),
            PublishMessage(None, {"x-deliver-at": str(round((start + 30) * 1000))}, b"at +30 s", None)]))
        assert isinstance(reply, PublishOk) and reply.stored == 2, reply
        await g.run_for(5.0)
        await g.kill("n1")  # (abandoned: what was committed is on its disk)
        await g.restart("n1")
        reader = Reader(g, g["n1"], "later")
        await reader.subscribe()
        await reader.until(2, timeout=60.0)
        assert start + 20 <= reader.when[b"in 20 s"] <= start + 21
        assert start + 30 <= reader.when[b"at +30 s"] <= start + 31


async def test_timing_headers_in_a_group_need_feature_level_3(tmp_path: Path) -> None:
    async with Group(tmp_path, seed=4) as g:
        await g.start()
        await g.declare("later")
        await g.until(lambda: active(g, key_of(g, "later")) is not None, 30.0, what="an active")
        s = ClientSession(g, g["n1"])
        reply = await s.ask(Publish(rid=1, queue="later", messages=[PublishMessage(None, {"x-delay": "10"}, b"m",
                                                                                   None)]))
        assert isinstance(reply, Error) and "feature level 3 (it is at 1)" in reply.message, reply
