"""Re-partitioning on the in-process group harness (broker/partitions/remap.py): partitions
added to a running queue and an update that re-maps its messages while producers and a
consumer run; the refusals; an update asked of a member cut off from the others, answered
UNAVAILABLE and asked again as ``tandem partition update`` asks it, until it goes through;
and the messages a cut sweep had published, settled and not stored twice.

The CLI's own output and an update cut by kill -9 of a sweeping active stay with real
processes (tests/integration/test_repartition.py)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

import broker.tools.partition_cli as partition_cli
from broker.tools.checker import classify
from client.errors import InvalidArgumentError, TandemError, UnavailableError
from client.mapper import JumpHashMapper
from client.protocol.frames import PublishMessage
from tests.harness.group import Group, Member
from tests.harness.repartition import Load, all_active, ask, consume, load, status, updates_done
from tests.harness.replication import active, key_of, only_retriable

pytestmark = pytest.mark.asyncio

QUEUE, HELD = "orders", "held"


def remapped(caplog: pytest.LogCaptureFixture, queue: str) -> int:
    """Messages of ``queue`` the sweeps re-mapped, as their log lines count them."""
    n = 0
    for r in caplog.records:
        text = r.getMessage()
        if f"partition {queue}/" in text and " message(s) re-mapped" in text:
            n += int(text.split(" message(s) re-mapped")[0].rsplit(" ", 1)[1])
    return n


async def test_add_partitions_and_update_under_load_loses_nothing(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "tandem.broker")
    async with Group(tmp_path) as g:
        await g.start()
        await g.declare(QUEUE, partitions=2)
        await g.declare(HELD, partitions=2)
        await load(g, HELD, [(f"h{i}".encode(), f"key{i}") for i in range(1000)])
        await g.until(lambda: all_active(g, QUEUE, 2), 10.0, what="an active for each partition")
        # a consumer slow to ack: a backlog builds, and deliveries are outstanding when the update starts
        t = Load(g, QUEUE, prefetch=20, ack_delay=1.0)
        await g.until(lambda: len(t.ledger.confirmed) >= 300, 30.0, what="300 messages confirmed")
        n2, n3 = g["n2"], g["n3"]
        for queue in (QUEUE, HELD):
            assert n2.node is not None
            meta = await ask(g, n2, n2.node.ops.remaps.add(queue, 2, "", "test"), f"add to {queue}")
            assert not isinstance(meta, BaseException), meta
            assert meta.partitions == 4
        await g.until(lambda: all_active(g, QUEUE, 4) and all_active(g, HELD, 4), 10.0,
                      what="the new partitions active")
        for queue in (QUEUE, HELD):
            assert n3.node is not None
            got = await ask(g, n3, n3.node.ops.remaps.update(queue, "", "test"), f"update {queue}")
            assert not isinstance(got, BaseException), got
        await g.until(lambda: updates_done(g), 60.0, what="the updates done on every member")
        mark = len(t.ledger.confirmed)
        await g.until(lambda: len(t.ledger.confirmed) >= mark + 200, 30.0, what="writes after the update")
        await t.drain()
        await t.stop()
        v = classify(t.ledger.sent, t.ledger.confirmed, t.consumer.ids)
        assert (v.lost, v.duplicated, v.unexpected) == (0, 0, 0), v
        assert t.ledger.unexpected == [] and only_retriable(t.ledger) == [], (t.ledger.unexpected, t.ledger.errors)
        assert remapped(caplog, QUEUE) > 0, "the update moved nothing: the test did not exercise it"
        for m in g.alive():
            st = status(m)
            assert st.updating == [] and all(p.state == "Active" for p in st.partitions), m.name

        # every message of the queue nobody consumed is where the mapper places it now, once
        mapper = JumpHashMapper(4)
        got_held = await consume(g, HELD, 1000)
        bodies = [b for b, _k, _p, _id in got_held]
        assert sorted(bodies) == sorted(f"h{i}".encode() for i in range(1000)), "each message once"
        assert all(p == mapper.partition(k) for _b, k, p, _id in got_held)
        assert {p for _b, _k, p, _id in got_held} == {0, 1, 2, 3}


async def test_refusals(tmp_path: Path) -> None:
    async with Group(tmp_path, replicas=1, sync_replicas=1) as g:
        await g.start()
        await g.declare("q", partitions=2)
        await g.declare("rr", partitions=2, mapper="round_robin")
        await g.declare("fixed", partitions=1, placement="n1,n2")
        n1 = g["n1"]
        assert n1.node is not None
        remaps = n1.node.ops.remaps
        cases: list[tuple[Any, str]] = [
            (lambda: remaps.add("nope", 1, "", "test"), "partition add: no queue 'nope'"),
            (lambda: remaps.add("q", 0, "", "test"), "partition add: 0: add one partition at least"),
            (lambda: remaps.add("q", 1024, "", "test"), "partition add: 2 + 1024 partitions: at most 1024"),
            (lambda: remaps.add("fixed", 1, "", "test"),
             "partition add: queue fixed places its partitions on explicit node lists: give the new ones' "
             "(--placement)"),
            (lambda: remaps.add("fixed", 1, "n1,n9", "test"),
             "placement: partition 1: no member n9 (members: n1, n2, n3)"),
            (lambda: remaps.update("nope", "", "test"), "partition update: no queue 'nope'"),
            (lambda: remaps.update("rr", "", "test"),
             "partition update: the mapper round_robin places messages in turn, not by key: there is nothing to "
             "re-map (name a keyed mapper with --mapper)"),
            (lambda: remaps.update("q", "nosuch", "test"), "mapper 'nosuch'"),
        ]
        for call, want in cases:
            got = await ask(g, n1, call(), want)
            assert isinstance(got, InvalidArgumentError) and want in got.message, (want, got)
        assert updates_done(g)
        assert all(m.node is not None and m.node.catalogue.queues["q"].meta.partitions == 2 for m in g.alive())

        meta = await ask(g, n1, remaps.add("fixed", 1, "n3,n1", "test"), "add to fixed")
        assert not isinstance(meta, BaseException) and meta.partitions == 2, meta
        got = await ask(g, n1, remaps.update("rr", "jump_hash", "test"), "update rr")
        assert not isinstance(got, BaseException), got
        key = key_of(g, "fixed", 1)

        def changed_everywhere() -> bool:
            for m in g.alive():
                assert m.node is not None
                queues = m.node.catalogue.queues
                if (queues["rr"].meta.mapper, queues["fixed"].meta.partitions) != ("jump_hash", 2) \
                        or m.node.ops.remaps.queues.nodes_of(key) != ("n3:sync", "n1:sync"):
                    return False
            return updates_done(g)

        await g.until(changed_everywhere, 30.0, what="rr updated and fixed/1 on n3,n1, on every member")


async def test_an_update_whose_answer_is_lost_is_asked_again_once_the_links_are_back(tmp_path: Path) -> None:
    """n2's peer links are cut (what is sent is held, the connections stay) and n2 sees its
    peers Down; an update asked of n2 is answered UNAVAILABLE (the audit cannot reach the
    other members), so ``tandem partition update``'s loop (``_start_update``, here on the
    group's clock and against n2's node) looks whether the update started and asks again;
    once the links are back, the update goes through.  Every message is then where the
    mapper places it, once."""
    n = 600
    async with Group(tmp_path) as g:
        await g.start()
        await g.declare("lost", partitions=2)
        await load(g, "lost", [(f"l{i}".encode(), f"key{i}") for i in range(n)])
        n1, n2 = g["n1"], g["n2"]
        assert n1.node is not None and n2.life is not None
        meta = await ask(g, n1, n1.node.ops.remaps.add("lost", 1, "", "test"), "add to lost")
        assert not isinstance(meta, BaseException), meta
        await g.until(lambda: all_active(g, "lost", 3), 10.0, what="the new partition active")
        g.net.isolate("n2", ["n1", "n3"])
        await g.until(lambda: all(r.state == "Down" for r in status(n2).remotes), 10.0,
                      what="n2 seeing its peers Down")
        refusals: list[TandemError] = []

        class Link:
            """What ``_start_update`` asks of its connection, answered by n2's node."""

            async def update_partitions(self, queue: str, *, mapper: str = "") -> Any:
                node = n2.node
                assert node is not None
                try:
                    await node.ops.remaps.update(queue, mapper, "test (tandem-cli)")
                except TandemError as exc:
                    refusals.append(exc)
                    raise
                return status(n2)

            async def status(self) -> Any:
                return status(n2)

        with mock.patch.object(partition_cli, "SYSTEM_CLOCK", g.clock):
            asked = n2.life.spawn(partition_cli._start_update(Link(), "lost", ""),  # type: ignore[arg-type]
                                  name="harness-cli")
            await g.until(lambda: bool(refusals), 10.0, what="the update refused while n2 is cut off")
            assert isinstance(refusals[0], UnavailableError), refusals
            assert "did not answer the audit" in refusals[0].message, refusals[0].message
            await g.until(lambda: len(refusals) > 1, 5.0, what="the update asked again while n2 is cut off")
            assert not asked.done()
            g.net.heal()
            g.net.drop("n2", "n1")  # (the held connections go; new ones pass)
            g.net.drop("n2", "n3")
            await g.until(asked.done, 30.0, what="the update asked again and started")
        st = asked.result()
        assert partition_cli.updating(st, "lost") or st.updating == [], st
        await g.until(lambda: updates_done(g), 60.0, what="the update done on every member")
        # consumed: each message once, from the partition the mapper gives its key over three
        mapper = JumpHashMapper(3)
        got = await consume(g, "lost", n)
        assert sorted(b for b, _k, _p, _i in got) == sorted(f"l{i}".encode() for i in range(n)), "each message once"
        assert all(k is not None and p == mapper.partition(k) for _b, k, p, _i in got)


async def grown(g: Group, n: int) -> Member:
    """A started group whose queue HELD of 2 partitions, ``n`` messages in it, has 2 more
    partitions, all of them active; the member that asked for them (n1)."""
    await g.start()
    await g.declare(HELD, partitions=2)
    await load(g, HELD, [(f"h{i}".encode(), f"key{i}") for i in range(n)])
    n1 = g["n1"]
    assert n1.node is not None
    meta = await ask(g, n1, n1.node.ops.remaps.add(HELD, 2, "", "test"), "add")
    assert not isinstance(meta, BaseException), meta
    await g.until(lambda: all_active(g, HELD, 4), 10.0, what="the new partitions active")
    return n1


async def test_messages_a_cut_sweep_had_published_are_settled_and_not_stored_twice(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A sweep cut between publishing a batch and settling it leaves the batch in its target
    partition and in its own.  Made here on purpose: before the update, 300 of partition 0's
    messages are published to where the mapper now places them exactly as a sweep does (its
    producer id, their offsets as sequence numbers, their ids in the header).  The update's
    sweep finds them there (the target drops them as duplicates), settles them in partition 0,
    and every message is consumed once."""
    caplog.set_level(logging.WARNING, "tandem.broker")
    n = 4000
    async with Group(tmp_path) as g:
        n1 = await grown(g, n)
        assert n1.node is not None
        mapper = JumpHashMapper(4)
        key0 = key_of(g, HELD, 0)
        a = active(g, key0)
        assert a is not None and a.node is not None
        stored = list(a.node.catalogue.queues[HELD].partitions[0].ready)[:1000]
        away = [m for m in stored if m.key is not None and mapper.partition(m.key) != 0][:300]
        assert len(away) == 300
        out = g.publish(a, HELD, f"remap.{key0[0]}.0", [
            PublishMessage(m.key, {**m.headers, "x-tandem-id": m.id}, m.body, m.offset) for m in away])
        await g.until(out.done, 10.0, what="the 300 published")
        assert out.result().stored == 300
        got = await ask(g, n1, n1.node.ops.remaps.update(HELD, "", "test"), "update")
        assert not isinstance(got, BaseException), got
        await g.until(lambda: updates_done(g), 60.0, what="the update done on every member")
        swept = [r.getMessage() for r in caplog.records if f"partition {HELD}/0: update: " in r.getMessage()]
        assert len(swept) == 1 and "300 of them were there already" in swept[0], swept
        got_all = await consume(g, HELD, n)
        bodies = [b for b, _k, _p, _i in got_all]
        assert len(bodies) == len(set(bodies)) == n, f"{len(bodies)} deliveries of {len(set(bodies))} messages"
        assert all(k is not None and p == mapper.partition(k) for _b, k, p, _i in got_all)


async def test_a_sweep_over_a_large_head_leaves_its_node_time_to_answer_its_peers(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Placing each message of the partition's in-memory head takes time (here the mapper of
    partition 0's active costs 0.4 ms of the group's clock a key: 0.8 s for its 2,000, more
    than the peers' non-response timeout of 0.5 s).  The active answers its peers between
    slices of the head, so it stays the active and its one sweep ends the partition's update."""
    caplog.set_level(logging.WARNING, "tandem")
    n = 4000
    async with Group(tmp_path) as g:
        n1 = await grown(g, n)
        assert n1.node is not None
        key0 = key_of(g, HELD, 0)
        a = active(g, key0)
        assert a is not None and a.node is not None
        mapper = a.node.catalogue.queues[HELD].mapper
        place = mapper.partition

        def slow(key: str | None, anchor: int | None = None) -> int:
            g.clock.advance(0.0004)  # (the loop runs nothing else meanwhile: only timers fire)
            return place(key, anchor)

        mapper.partition = slow  # type: ignore[method-assign]
        caplog.clear()
        got = await ask(g, n1, n1.node.ops.remaps.update(HELD, "", "test"), "update")
        assert not isinstance(got, BaseException), got
        await g.until(lambda: updates_done(g), 60.0, what="the update done on every member")
        lost = [r.getMessage() for r in caplog.records if "active -> follower" in r.getMessage()]
        assert lost == [] and active(g, key0) is a, lost
        swept = [r.getMessage() for r in caplog.records if f"partition {HELD}/0: update" in r.getMessage()]
        assert len(swept) == 1 and " re-mapped to other partitions" in swept[0], swept
