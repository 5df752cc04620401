"""Node quorum and the operator's override on the in-process group harness: a member alone
goes Disabled and refuses writes; ``quorum_override 1`` lets it serve alone; the writes an
isolated member takes under the override are weak, discarded and reported as HA-1014 when
it rejoins, and never delivered."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from client.errors import TandemError, UnavailableError
from client.protocol.frames import PublishMessage
from ha.membership import QuorumState
from tests.harness.clients import Consumer, Ledger, spawn_clients
from tests.harness.group import Group, Member
from tests.harness.replication import active, declared_with_active, events, key_of

pytestmark = pytest.mark.asyncio


def batch(prefix: str, seqs: range) -> list[PublishMessage]:
    return [PublishMessage(f"{prefix}-{i}", {}, f"{prefix}-{i}".encode(), i) for i in seqs]


async def send(g: Group, m: Member, producer: str, messages: list[PublishMessage]) -> Any:
    """Publish at ``m`` as a client session does (refused first by the node's quorum rule,
    ``Services.require_quorum``; the session's use of it is tested with real processes,
    tests/integration/test_replication.py): the result once confirmed; the error if it fails
    (a partition with no active fails after the node's election wait, 5 s)."""
    try:
        assert m.node is not None
        m.run(m.node.services.require_quorum, "publish")
        out = g.publish(m, "q", producer, messages)
    except TandemError as exc:
        return exc
    if not await g.until(out.done, 10.0, fail=False):
        return TimeoutError("no answer")
    return out.exception() or out.result()


async def send_until_confirmed(g: Group, m: Member, producer: str, messages: list[PublishMessage]) -> None:
    """Send (the same sequence numbers each time) until confirmed: an override takes effect
    within a moment."""
    for _ in range(20):
        if not isinstance(await send(g, m, producer, messages), Exception):
            return
        await g.run_for(0.2)
    raise AssertionError(f"{m.name} never took {messages[0].body!r}")


def override(m: Member, nodes: int | None) -> None:
    assert m.node is not None
    m.run(lambda: m.node.options.set_quorum_override(nodes, by="test"))  # type: ignore[union-attr]


async def consume_all(g: Group, ledger: Ledger, expect: set[bytes]) -> list[bytes]:
    """Every message of ``q`` delivered to a consumer on every live member and acked, until
    every body in ``expect`` is in and the partitions' actives hold nothing more; the bodies."""
    consumer = Consumer(g, ledger, "q", "c0", random.Random(0))
    tasks = spawn_clients(consumer.run())

    def done() -> bool:
        got = {d.body for d in ledger.deliveries}
        if not expect <= got or consumer.pending:
            return False
        m0 = g.alive()[0]
        assert m0.node is not None
        meta = m0.node.catalogue.queues["q"].meta
        for p in range(meta.partitions):
            a = active(g, (meta.id, p))
            if a is None or a.node is None:
                return False
            q = a.node.catalogue.queues["q"]
            if q.partitions[p].ready or q.partitions[p].cold_count or q.unacked_count or q.pending_count:
                return False
        return True

    await g.until(done, 30.0, what="the queue consumed")
    for t in tasks:
        t.cancel()
    return [d.body for d in ledger.deliveries]


async def test_quorum_override_1_restores_service_from_one_of_three(tmp_path: Path) -> None:
    async with Group(tmp_path) as g:
        await g.start()
        await g.declare("q", partitions=3)
        before = batch("m", range(30))
        assert not isinstance(await send(g, g["n1"], "p0", before), Exception)
        await g.kill("n2")
        await g.kill("n3")
        n1 = g["n1"]
        await g.until(lambda: n1.quorum is QuorumState.DISABLED, 5.0, what="n1 without quorum")
        refused = await send(g, n1, "p1", batch("no-quorum", range(1)))
        assert isinstance(refused, UnavailableError), refused
        override(n1, 1)
        await send_until_confirmed(g, n1, "p2", batch("alone", range(1)))
        bodies = await consume_all(g, Ledger(), {m.body for m in before} | {b"alone-0"})
        assert sorted(bodies) == sorted([m.body for m in before] + [b"alone-0"])


async def test_an_isolated_node_goes_disabled_and_its_override_writes_are_ha_1014_on_heal(tmp_path: Path) -> None:
    async with Group(tmp_path) as g:
        await g.start()
        await g.declare("q", partitions=3)
        keys = [key_of(g, "q", p) for p in range(3)]

        def everywhere() -> bool:  # every member follows each partition, with the same active
            views = []
            for m in g.alive():
                rep = m.node.ha.replication if m.node is not None else None
                assert rep is not None
                views.append([rep.active_of(k) for k in keys])
            return all(all(v) and v == views[0] for v in views)

        await g.until(everywhere, 10.0, what="every member following each partition of q")
        n3 = g["n3"]
        g.net.isolate("n3", ["n1", "n2"])
        await g.until(lambda: n3.quorum is QuorumState.DISABLED, 5.0, what="n3 Disabled")
        refused = await send(g, n3, "iso", batch("refused", range(1)))
        assert isinstance(refused, UnavailableError), refused
        # the majority side goes on, for every partition
        majority = batch("maj", range(60))
        for i in range(0, 60, 20):
            assert not isinstance(await send(g, g["n1"], "maj", majority[i:i + 20]), Exception)
        assert all(active(g, k) in (g["n1"], g["n2"]) for k in keys)
        # the operator forces the isolated node to take writes alone: weak, reported on heal
        override(n3, 1)
        await send_until_confirmed(g, n3, "solo", [PublishMessage("solo", {}, b"solo", 0)])
        override(n3, None)
        g.net.heal()
        rep = n3.node.ha.replication if n3.node is not None else None
        assert rep is not None
        await g.until(lambda: rep.discarded_total > 0 and rep.discarded_messages >= 1 and bool(events(n3, "HA-1014")),
                      10.0, what="HA-1014 on n3 after healing")
        expect = {m.body for m in majority}
        bodies = await consume_all(g, Ledger(), expect)
        assert sorted(bodies) == sorted(expect)  # each once; the solo write discarded with n3's weak entries


async def test_a_member_that_gets_its_quorum_back_names_the_active_at_once(tmp_path: Path) -> None:
    """A member without node quorum knows no active; what waits there for one (a publish for
    a partition another member serves, a hand-over) looks again as soon as the quorum is
    back, not when its wait runs out (node.election_wait: a publish would fail after it)."""
    async with Group(tmp_path) as g:
        await g.start()
        key, a = await declared_with_active(g, "q")
        b = next(m for m in g.alive() if m is not a)
        assert b.node is not None
        g.net.isolate(b.name, [m.name for m in g.alive() if m is not b])
        await g.until(lambda: b.node is not None and not b.node.services.has_quorum, 10.0,
                      what=f"{b.name} without quorum")
        waiting = b.life.spawn(b.node.services.commit.wait_active(key, 30.0), name="test-wait-active")
        await g.run_for(1.0)
        assert not waiting.done()  # (it knows no active while alone)
        g.net.heal()
        healed = g.clock.monotonic()
        await g.until(waiting.done, 30.0, what=f"{b.name} to name the active")
        assert waiting.result() == a.name
        assert g.clock.monotonic() - healed < 2.0  # its links and quorum back, not its 30 s wait over
