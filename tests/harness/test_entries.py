"""What goes into a partition's log entries, on the in-process group harness
(docs/replication.md, "one entry in flight" and "settlements ride in the next entry"):
publishes that arrive while an entry waits for its commit go together in the next one; an
ack rides in the entry of the next publish, or goes alone once ``ack_linger`` is over; the
ack still waiting when the active stops cleanly is committed before it goes."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from client.protocol.frames import PublishMessage
from tests.harness.clients import Consumer, Ledger, spawn_clients
from tests.harness.group import Group, Member
from tests.harness.replication import active, declared_with_active

pytestmark = pytest.mark.asyncio


def commit_of(m: Member, queue: str) -> int:
    rep = m.node.ha.replication if m.node is not None else None
    assert rep is not None
    return next(pi.commit for pi in rep.partition_infos() if pi.queue == queue)


def stored(m: Member, key: tuple[int, int]) -> int:
    """Unsettled messages of partition ``key`` on ``m``'s disk."""
    part = m.disk.parts.get(key)
    return len(part.messages) if part is not None else 0


async def publish(g: Group, m: Member, queue: str, seq: int) -> None:
    out = g.publish(m, queue, "p0", [PublishMessage("k", {}, b"m%d" % seq, seq)])
    await g.until(out.done, 5.0, what=f"the confirm of m{seq}")
    out.result()


async def test_while_an_entry_is_in_flight_what_follows_waits_for_its_commit_and_goes_as_one(
        tmp_path: Path) -> None:
    """The active's links to both replicas are cut, so that the first entry cannot commit
    while the rest arrive, one publish at a time; ``non_response_timeout`` 4 s keeps the
    active in office meanwhile.  After the heal: the first publish in an entry of its own,
    the other n - 1 in one more (an entry each would be n)."""
    n = 30
    async with Group(tmp_path, non_response_timeout=4.0) as g:
        await g.start()
        key, a = await declared_with_active(g, "inflight")
        assert a.node is not None
        await publish(g, a, "inflight", 0)  # (the partition's first entry after its no-op)
        before = commit_of(a, "inflight")
        q = a.node.catalogue.queues["inflight"]
        published = q.published
        others = [m.name for m in g.alive() if m is not a]
        for o in others:
            g.net.cut(a.name, o)
        sent = []
        for i in range(1, n + 1):  # each in a publish of its own, each taken by the active before the next
            sent.append(g.publish(a, "inflight", "p0", [PublishMessage("k", {}, b"m%d" % i, i)]))
            await g.until(lambda: q.published == published + i, 1.0, what=f"publish {i} on the active")
        assert not any(s.done() for s in sent)
        assert commit_of(a, "inflight") == before
        g.net.heal()
        await g.until(lambda: all(s.done() for s in sent), 5.0, what="every confirm")
        for s in sent:
            s.result()
        assert active(g, key) is a
        assert commit_of(a, "inflight") - before == 2
        await g.until(lambda: all(stored(m, key) == n + 1 for m in g.alive()), 5.0,
                      what="every message on every member")


async def test_acks_ride_in_the_partitions_next_entry_and_a_clean_stop_proposes_the_rest(tmp_path: Path) -> None:
    """While messages flow, each ack travels in the entry of the next publish instead of an
    entry of its own (a message costs the group one entry, not two); the ack still waiting
    when the active is stopped cleanly is proposed and committed before it goes, not lost
    with it.  (``ack_linger`` 30 s keeps the timer out of the way.)"""
    n = 40
    async with Group(tmp_path, ack_linger=30.0) as g:
        await g.start()
        key, a = await declared_with_active(g, "acks")
        before = commit_of(a, "acks")
        ledger = Ledger()
        consumer = Consumer(g, ledger, "acks", "c0", random.Random(0), prefetch=1, ack_delay=0.0)
        tasks = spawn_clients(consumer.run())
        for i in range(n):
            await publish(g, a, "acks", i)
            await g.until(lambda: (0, i) in ledger.acked, 5.0, what=f"m{i} delivered and acked")
        await g.run_for(1.0)  # (nothing more is proposed: the last ack waits for the next entry)
        # one entry a publish, each carrying the ack before it; the last ack still waits
        # (with an entry per ack this is 2 n)
        assert n <= commit_of(a, "acks") - before <= n + 2
        assert [d.body for d in ledger.deliveries] == [b"m%d" % i for i in range(n)]
        others = [m for m in g.alive() if m is not a]
        # the last message, unsettled, once the members have applied it (they learn of its
        # commit with the active's next message, and hold store writes back for HOLD_APPLY)
        await g.until(lambda: all(stored(m, key) == 1 for m in others), 10.0,
                      what="the last message applied, unsettled, on the other members")
        for t in tasks:
            t.cancel()
        await g.stop(a.name)
        await g.until(lambda: all(stored(m, key) == 0 for m in others), 10.0,
                      what="the last ack committed and applied on the members that stay")


async def test_a_lone_ack_commits_once_its_linger_is_over(tmp_path: Path) -> None:
    """With nothing else to send, an ack goes in an entry of its own after ``ack_linger``
    (10 ms by default): every member's store drops the acked message."""
    async with Group(tmp_path) as g:
        await g.start()
        key, a = await declared_with_active(g, "lone")
        await publish(g, a, "lone", 0)
        await g.until(lambda: all(stored(m, key) == 1 for m in g.alive()), 10.0,
                      what="the message in every member's store")
        ledger = Ledger()
        consumer = Consumer(g, ledger, "lone", "c0", random.Random(0), prefetch=1, ack_delay=0.0)
        tasks = spawn_clients(consumer.run())
        await g.until(lambda: (0, 0) in ledger.acked, 5.0, what="the message delivered and acked")
        await g.until(lambda: all(stored(m, key) == 0 for m in g.alive()), 10.0,
                      what="the ack committed and applied on every member")
        for t in tasks:
            t.cancel()
