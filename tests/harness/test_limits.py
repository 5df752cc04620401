"""A queue's overflow in a group, on the in-process group harness: refused until the group is
finalized at feature level 3, then drop-head sheds the oldest messages on each partition's
active, and what it shed stays shed when that active is killed and another takes over."""

from __future__ import annotations

from pathlib import Path

import pytest

from client.errors import ErrorCode
from client.protocol.frames import Declare, DeclareOk, Error, Get, GetOk, PublishMessage
from tests.harness.group import Group, Member
from tests.harness.replication import active
from tests.harness.sessions import ClientSession

pytestmark = pytest.mark.asyncio


async def finalize(g: Group, m: Member, level: int) -> None:
    assert m.node is not None and m.life is not None
    task = m.life.spawn(m.node.ops.levels.finalize(level, "test"), name="harness-finalize")
    await g.until(task.done, 30.0, what=f"finalize to level {level}")
    task.result()
    await g.until(lambda: all(x.node is not None and x.node.ops.levels.level == level for x in g.alive()), 30.0,
                  what=f"level {level} applied on every member")


async def test_drop_head_in_a_group_needs_level_3_and_what_it_shed_survives_a_failover(tmp_path: Path) -> None:
    async with Group(tmp_path) as g:
        await g.start()
        s = ClientSession(g, g["n1"])
        decl = Declare(rid=1, queue="ring", partitions=1, max_length=5, overflow="drop-head")
        reply = await s.ask(decl)
        assert isinstance(reply, Error) and reply.code == ErrorCode.INVALID_ARGUMENT, reply
        assert "feature level 3 (it is at 1)" in reply.message and "tandem upgrade finalize" in reply.message
        await finalize(g, g["n1"], 3)
        reply = await s.ask(decl)
        assert isinstance(reply, DeclareOk), reply
        await g.until(lambda: all(x.node is not None and "ring" in x.node.catalogue.queues for x in g.alive()),
                      30.0, what="ring known everywhere")
        for x in g.alive():  # every member has the queue's bound, as the catalogue's log carried it
            assert x.node is not None
            meta = x.node.catalogue.queues["ring"].meta
            assert (meta.max_length, meta.overflow) == (5, "drop-head")
        key = (g["n1"].node.catalogue.queues["ring"].meta.id, 0)  # type: ignore[union-attr]
        await g.until(lambda: active(g, key) is not None, 30.0, what="ring's partition active")
        first = active(g, key)
        assert first is not None
        for i in range(12):
            out = g.publish(first, "ring", None, [PublishMessage(None, {}, f"m{i}".encode(), None)])
            await g.until(out.done, 10.0, what=f"m{i} confirmed")
            assert out.exception() is None, out.exception()
        await g.kill(first.name)
        await g.until(lambda: active(g, key) not in (None, first), 60.0, what="a new active for ring")
        survivor = next(x for x in g.alive())
        reader = ClientSession(g, survivor)
        got = []
        for rid in range(10, 30):
            reply = await reader.ask(Get(rid=rid, queue="ring", auto_ack=True))
            assert isinstance(reply, GetOk), reply
            if reply.message is None:
                break
            got.append(reply.message.body)
        assert got == [f"m{i}".encode() for i in range(7, 12)]
