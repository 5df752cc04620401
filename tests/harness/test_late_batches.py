"""A batch of an idempotent producer that reaches a partition after a later batch of the same
producer (broker.messaging.sequences), on the in-process group harness: the partition stores
it, at the active that took the later batch and at the members that become the active after
it, and a resend of anything stored is a duplicate on each of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.messaging.publish import PublishResult
from client.protocol.frames import PublishMessage
from tests.harness.group import Group, Member
from tests.harness.replication import active, declared_with_active
from tests.harness.sessions import Reader

pytestmark = pytest.mark.asyncio


def batch(seqs: range) -> list[PublishMessage]:
    return [PublishMessage(None, {}, f"p:{s}".encode(), s) for s in seqs]


async def publish(g: Group, m: Member, seqs: range) -> PublishResult:
    out = g.publish(m, "q", "p", batch(seqs))
    await g.until(out.done, 10.0, what=f"seqs {seqs.start}..{seqs.stop - 1} confirmed at {m.name}")
    r = out.result()
    assert isinstance(r, PublishResult)
    return r


async def next_active(g: Group, key: tuple[int, int], gone: str) -> Member:
    await g.until(lambda: (a := active(g, key)) is not None and a.name != gone, 30.0, what=f"an active other than {gone}")
    a = active(g, key)
    assert a is not None
    return a


async def test_a_late_batch_is_stored_by_each_active_in_turn_and_resends_are_duplicates(tmp_path: Path) -> None:
    async with Group(tmp_path) as g:
        await g.start()
        key, first = await declared_with_active(g, "q")
        assert (await publish(g, first, range(9, 11))).stored == 2  # the later batch gets there first
        await g.kill(first.name)
        second = await next_active(g, key, first.name)
        late = await publish(g, second, range(0, 9))  # the earlier one, late, at the new active
        assert (late.stored, late.duplicates) == (9, 0)
        assert (await publish(g, second, range(0, 11))).duplicates == 11
        await g.restart(first.name)
        await g.until(lambda: all(m.node is not None for m in g.members.values()), 30.0, what="all back")
        await g.kill(second.name)
        third = await next_active(g, key, second.name)
        again = await publish(g, third, range(0, 11))  # every seq known to the next active too
        assert (again.stored, again.duplicates) == (0, 11)
        reader = Reader(g, third, "q")
        await reader.subscribe()
        await reader.until(11)
        await g.run_for(1.0)
        await reader.step()
        assert sorted(reader.got.values()) == [1] * 11


async def test_a_batch_sent_again_after_its_active_changed_counts_what_it_stored_as_stored(tmp_path: Path) -> None:
    """The active stores a batch, its followers take the entry, and it never hears them: it
    gives up the role before the entry commits, and sends the batch to the next active, which
    has the entry committed by then and finds every seq held.  What the batch itself stored is
    stored, not a duplicate; a seq held before it came stays a duplicate."""
    async with Group(tmp_path) as g:
        await g.start()
        key, first = await declared_with_active(g, "q")
        assert (await publish(g, first, range(0, 2))).stored == 2
        others = [n for n in g.members if n != first.name]
        for o in others:  # (its appends reach them; their answers do not reach it)
            g.net.cut(o, first.name, both=False)
        out = g.publish(first, "q", "p", batch(range(1, 5)))  # seq 1 held already
        await g.until(lambda: (a := active(g, key)) is not None and a.name != first.name, 30.0,
                      what="an active other than the one that never heard its followers")
        g.net.heal()
        await g.until(out.done, 30.0, what="the batch confirmed through the next active")
        r = out.result()
        assert (r.stored, r.duplicates) == (3, 1), r
        second = active(g, key)
        assert second is not None
        again = await publish(g, second, range(0, 5))
        assert (again.stored, again.duplicates) == (0, 5)
