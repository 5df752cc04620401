"""Streams in a group on the in-process harness (virtual time): a stream's declare needs feature
level 5; every member reads the same messages, named offsets and retention cut after the active
of a partition is killed (a node object stopped without cleanup) and another takes over; a
stream's partitions are never re-mapped."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.messaging.retention import Retention
from client.errors import InvalidArgumentError
from client.protocol.frames import (Declare, Error, FetchOffset, Ok, OffsetOk, Publish, PublishMessage, PublishOk,
                                    Read, ReadOk, StoreOffset)
from tests.harness.group import Group, Member
from tests.harness.replication import active, key_of
from tests.harness.sessions import ClientSession
from tests.harness.test_limits import finalize
from tests.harness.repartition import ask

pytestmark = pytest.mark.asyncio


async def _read_all(s: ClientSession, queue: str, partition: int) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    offset, rid = 0, 1000
    while True:
        rid += 1
        r = await s.ask(Read(rid=rid, queue=queue, partition=partition, offset=offset, start="" if out else "first"))
        assert isinstance(r, ReadOk), r
        out.extend((m.offset, m.body) for m in r.messages)
        if r.next_offset >= r.end_offset:
            return out
        offset = r.next_offset


async def _retention(g: Group, m: Member) -> None:
    assert m.node is not None and m.life is not None
    node = m.node
    sweep = m.life.spawn(Retention(lambda: node.catalogue.queues, node.holding.serves, node.services,
                                   g.clock).sweep(), name="harness-retention")
    await g.until(sweep.done, 10.0, what="a retention sweep")
    sweep.result()


async def test_a_stream_in_a_group_reads_alike_through_a_kill_of_its_active(tmp_path: Path) -> None:
    async with Group(tmp_path) as g:
        await g.start()
        s = ClientSession(g, g["n2"])
        r = await s.ask(Declare(rid=1, queue="ev", partitions=2, type="stream"))
        assert isinstance(r, Error) and "streams need the group at feature level 5 (it is at 1)" in r.message, r
        await finalize(g, g["n1"], 5)
        await g.declare("ev", partitions=2, type="stream", max_bytes=3 * 2000)
        sent = 0
        for batch in range(6):  # six batches of 20 to each partition: a chunk each
            for p in (0, 1):
                msgs = [PublishMessage(None, {}, f"{p}/{batch}/{i}".encode() + b"x" * 90, batch * 20 + i)
                        for i in range(20)]
                r = await s.ask(Publish(rid=10 + sent, queue="ev", messages=msgs, producer_id=f"p{p}", partition=p))
                assert isinstance(r, PublishOk) and r.stored == 20, r
                sent += 1
        stored = await s.ask(StoreOffset(rid=50, queue="ev", partition=0, consumer="billing", offset=37))
        assert isinstance(stored, Ok), stored
        await g.run_for(1.0)  # (the stores write what committed a moment later)
        before = [await _read_all(ClientSession(g, m), "ev", 0) for m in g.alive()]
        assert all(b == before[0] for b in before) and [o for o, _ in before[0]] == list(range(120))

        key = key_of(g, "ev", 0)
        first_active = active(g, key)
        assert first_active is not None
        await _retention(g, first_active)  # about 12 KB held, 6 KB kept: the oldest half goes

        def cut_everywhere() -> set[int]:
            return {m.node.store.engine.chunks(*key)[0][0] for m in g.alive() if m.node is not None}

        await g.until(lambda: len(cut_everywhere()) == 1 and 50 <= min(cut_everywhere()) <= 70, 10.0,
                      what=f"the same cut on every member (first offsets held: {cut_everywhere()})")
        (cut,) = cut_everywhere()
        await g.kill(first_active.name)
        await g.until(lambda: active(g, key) not in (None, first_active), 30.0, what="a new active for ev/0")
        reader = ClientSession(g, next(m for m in g.alive() if m is not first_active))
        after = await _read_all(reader, "ev", 0)
        assert [o for o, _ in after] == list(range(cut, 120)) and after == before[0][cut:]
        got = await reader.ask(FetchOffset(rid=60, queue="ev", partition=0, consumer="billing"))
        assert isinstance(got, OffsetOk) and (got.offset, got.found) == (37, True), got
        other = await _read_all(reader, "ev", 1)
        assert [o for o, _ in other] == list(range(120))

        n1 = g["n1"] if g["n1"] is not first_active else g["n2"]
        assert n1.node is not None
        refused = await ask(g, n1, n1.node.ops.remaps.update("ev", "", "test"), "update ev")
        assert isinstance(refused, InvalidArgumentError) and "ev is a stream: its messages keep their partitions" \
            in refused.message, refused
