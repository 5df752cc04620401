"""The group harness itself: a group forms over the in-memory network and confirms a publish;
a kill ends exactly one node, the others elect a new active, and the killed node comes back
from its disk; a cut node loses its quorum and regains it on the heal."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from client.protocol.frames import PublishMessage
from ha.membership import QuorumState
from tests.harness.group import Group, Member

pytestmark = pytest.mark.asyncio


def key_of(g: Group) -> tuple[int, int]:
    m = g.alive()[0]
    assert m.node is not None
    return (m.node.catalogue.queues["q"].meta.id, 0)


def active(g: Group, key: tuple[int, int]) -> Member | None:
    serving = [m for m in g.alive() if m.node is not None and m.node.ha.replication is not None
               and m.node.ha.replication.serving(key)]
    return serving[0] if len(serving) == 1 else None


async def publish(g: Group, m: Member, seqs: range) -> None:
    out = g.publish(m, "q", "p1", [PublishMessage("k", {}, b"m%d" % i, i) for i in seqs])
    await g.until(out.done, 5.0, what="the confirm")
    assert out.result().stored == len(seqs)


async def test_a_group_forms_over_the_memory_network_and_confirms_a_publish(tmp_path: Path) -> None:
    async with Group(tmp_path) as g:
        await g.start()
        assert all(m.quorum is QuorumState.ACTIVE for m in g.alive())
        await g.declare("q", partitions=1)
        key = key_of(g)
        await g.until(lambda: active(g, key) is not None, 5.0, what="an active")
        await publish(g, g["n2"], range(10))  # (to any member: forwarded to the active)
        assert g.net.sent > 0 and g.clock.monotonic() < 5.0


async def test_a_killed_active_is_replaced_and_comes_back_from_its_disk(tmp_path: Path) -> None:
    async with Group(tmp_path) as g:
        await g.start()
        await g.declare("q", partitions=1)
        key = key_of(g)
        await g.until(lambda: active(g, key) is not None, 5.0, what="an active")
        first = active(g, key)
        assert first is not None
        await publish(g, first, range(5))
        life = first.life
        assert life is not None
        await g.kill(first.name)
        assert not [t for t in life.tasks if not t.done()]  # nothing of the dead node runs on
        await g.until(lambda: active(g, key) not in (None, first), 10.0, what="a new active")
        second = active(g, key)
        assert second is not None and second.node is not None
        await publish(g, second, range(5, 10))
        assert second.node.catalogue.queues["q"].ready_count == 10  # the confirmed five kept
        stamp = first.disk.meta["store_stamp"]
        await g.restart(first.name)
        assert first.node is not None and first.node.store.stamp == stamp and first.lives == 2
        await g.until(g.formed, 10.0, what="the group whole again")
        applied = lambda: first.disk.parts.get(key) is not None and len(first.disk.parts[key].messages) == 10  # noqa: E731
        await g.until(applied, 10.0, what="the restarted node caught up")


async def test_a_cut_off_member_loses_quorum_and_regains_it_on_the_heal(tmp_path: Path) -> None:
    async with Group(tmp_path) as g:
        await g.start()
        g.net.isolate("n3", ["n1", "n2"])
        await g.until(lambda: g["n3"].quorum is QuorumState.DISABLED, 5.0, what="n3 without quorum")
        assert g["n1"].quorum is QuorumState.PARTIAL
        g.net.heal()
        await g.until(g.formed, 10.0, what="the group whole again")


async def test_time_is_virtual(tmp_path: Path) -> None:
    """Two minutes of the group's life pass without waiting two minutes: every wait in the
    nodes is a timer on the fake clock."""
    async with Group(tmp_path) as g:
        await g.start()
        started = g.clock.monotonic()
        loop = asyncio.get_running_loop()
        before = loop.time()
        await g.run_for(120.0)
        assert g.clock.monotonic() - started == pytest.approx(120.0)
        assert g.formed() and loop.time() - before < 120.0
