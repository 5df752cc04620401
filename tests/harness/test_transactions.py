"""Transactions in a group on the in-process harness (virtual time), each ending with the
atomicity check: every message of a committed transaction ready exactly once on its
partition's active, none of an aborted one, and what it acked settled or back, all or nothing.

The faults: the coordinator partition's active killed after the decision, before any
participant heard it; a participant's active killed after the prepare; the producer gone
before its commit (its prepared writes aborted by the timeout); a participant cut off from the
initiator when the outcome is sent."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from broker.transactions.ids import coordinator_partition
from client.protocol.frames import (Ack, Declare, Error, Get, GetOk, Ok, Publish, PublishMessage, PublishOk, TxEnd,
                                    TxEndOk, TxInit, TxInitOk, TxPart)
from tests.harness.group import Group, Member
from tests.harness.replication import active, key_of
from tests.harness.sessions import ClientSession
from tests.harness.test_limits import finalize

pytestmark = pytest.mark.asyncio

N = 30  # messages a transaction publishes, over the queue's partitions


def ready(g: Group, queue: str) -> Counter[bytes]:
    """The ready messages of ``queue``, on each partition's active (bodies, counted)."""
    out: Counter[bytes] = Counter()
    for m in g.alive():
        node = m.node
        assert node is not None
        q = node.catalogue.queues.get(queue)
        if q is None:
            continue
        for p, part in enumerate(q.partitions):
            if node.ha.replication is not None and node.ha.replication.serving((q.meta.id, p)):
                out.update(msg.body for msg in part.ready)
    return out


def in_doubt(g: Group, queue: str) -> int:
    """Transactions held in doubt by the actives of ``queue``'s partitions."""
    n = 0
    for m in g.alive():
        assert m.node is not None
        q = m.node.catalogue.queues.get(queue)
        if q is not None:
            n += sum(len(part.txs) for p, part in enumerate(q.partitions) if m.node.holding.serves(q, p))
    return n


async def _prepared(g: Group, s: ClientSession, tid: str, queue: str, tag: str) -> str:
    """A transaction of producer ``tid`` that published N messages to ``queue``: its id."""
    r = await s.ask(TxInit(rid=1, transactional_id=tid))
    assert isinstance(r, TxInitOk), r
    txid = f"{r.producer}/{r.epoch}/0"
    msgs = [PublishMessage(f"k{i}", {}, f"{tag}{i}".encode(), None) for i in range(N)]
    r2 = await s.ask(Publish(rid=2, queue=queue, messages=msgs, tx=txid))
    assert isinstance(r2, PublishOk) and r2.stored == N, r2
    assert ready(g, queue) == Counter(), "a prepared message is ready"
    return txid


def _coordinator(g: Group, txid: str) -> Member:
    key = key_of(g, "tandem.transactions", coordinator_partition(txid.split("/")[0]))
    m = active(g, key)
    assert m is not None
    return m


async def _group(g: Group) -> None:
    await g.start()
    await finalize(g, g["n1"], 6)
    await g.declare("a", partitions=3)


async def test_transactions_need_level_6_and_commit_or_abort_on_every_member(tmp_path: Path) -> None:
    async with Group(tmp_path) as g:
        await g.start()
        s = ClientSession(g, g["n2"])
        r = await s.ask(TxInit(rid=1, transactional_id="app"))
        assert isinstance(r, Error) and "transactions need the group at feature level 6" in r.message, r
        await finalize(g, g["n1"], 6)
        await g.declare("a", partitions=3)
        txid = await _prepared(g, s, "app", "a", "c")
        # (ended through another member's session: that member is the initiator)
        end = await ClientSession(g, g["n3"]).ask(TxEnd(rid=3, txid=txid, commit=True, parts=[TxPart("a", None)]))
        assert isinstance(end, TxEndOk) and end.committed, end
        assert ready(g, "a") == Counter(f"c{i}".encode() for i in range(N))
        assert in_doubt(g, "a") == 0

        r = await s.ask(TxInit(rid=4, transactional_id="app"))
        assert isinstance(r, TxInitOk) and r.epoch == 2, r
        aborted = f"{r.producer}/2/0"
        msgs = [PublishMessage(f"k{i}", {}, f"x{i}".encode(), None) for i in range(N)]
        assert isinstance(await s.ask(Publish(rid=5, queue="a", messages=msgs, tx=aborted)), PublishOk)
        end = await s.ask(TxEnd(rid=6, txid=aborted, commit=False))
        assert isinstance(end, TxEndOk) and not end.committed, end
        await g.run_for(5.0)
        assert ready(g, "a") == Counter(f"c{i}".encode() for i in range(N)) and in_doubt(g, "a") == 0
        again = await s.ask(TxEnd(rid=7, txid=aborted, commit=True))
        assert isinstance(again, TxEndOk) and not again.committed, again  # (the first decision stands)


async def test_a_transactional_publish_through_an_exchange_needs_level_7_in_a_group(tmp_path: Path) -> None:
    """A member of a level-6 build would store a forwarded routed part as a plain publish."""
    async with Group(tmp_path) as g:
        await _group(g)
        s = ClientSession(g, g["n2"])
        r = await s.ask(TxInit(rid=1, transactional_id="app"))
        assert isinstance(r, TxInitOk), r
        txid = f"{r.producer}/{r.epoch}/0"
        msgs = [PublishMessage(f"k{i}", {}, f"r{i}".encode(), None) for i in range(N)]
        refused = await s.ask(Publish(rid=2, queue="", messages=msgs, tx=txid, exchange="", routing_key="a"))
        assert isinstance(refused, Error) and \
            "transactional publishes through exchanges need the group at feature level 7" in refused.message, refused
        await finalize(g, g["n1"], 7)
        ok = await s.ask(Publish(rid=3, queue="", messages=msgs, tx=txid, exchange="", routing_key="a"))
        assert isinstance(ok, PublishOk) and ok.stored == N, ok
        assert ready(g, "a") == Counter(), "a prepared message is ready"
        end = await s.ask(TxEnd(rid=4, txid=txid, commit=True, parts=[TxPart(q, None) for q in ok.queues]))
        assert isinstance(end, TxEndOk) and end.committed, end
        assert ready(g, "a") == Counter(f"r{i}".encode() for i in range(N))


async def test_the_coordinators_active_killed_after_the_decision_every_partition_commits(tmp_path: Path) -> None:
    async with Group(tmp_path) as g:
        await _group(g)
        s = ClientSession(g, g["n1"])
        txid = await _prepared(g, s, "app", "a", "m")
        coord = _coordinator(g, txid)
        m = g["n1"]
        assert m.node is not None and m.life is not None
        decided = m.life.spawn(m.node.ops.transactions.coordinator.decide(txid, True), name="harness-decide")
        await g.until(decided.done, 30.0, what="the decision")
        assert decided.result() == (True, False)
        await g.kill(coord.name)  # (no participant was told)
        await g.until(lambda: sum(ready(g, "a").values()) == N, 60.0, what="every partition committed")
        assert ready(g, "a") == Counter(f"m{i}".encode() for i in range(N)) and in_doubt(g, "a") == 0
        await g.restart(coord.name)
        await g.run_for(10.0)
        assert ready(g, "a") == Counter(f"m{i}".encode() for i in range(N))


async def test_a_participants_active_killed_after_the_prepare_holds_them_aside_until_the_commit(
        tmp_path: Path) -> None:
    async with Group(tmp_path) as g:
        await _group(g)
        key = key_of(g, "a", 0)
        await g.until(lambda: active(g, key) is not None, 30.0, what="an active for a/0")
        victim = active(g, key)
        assert victim is not None
        s = ClientSession(g, next(m for m in g.alive() if m.name != victim.name))
        txid = await _prepared(g, s, "app", "a", "p")
        await g.kill(victim.name)
        await g.until(lambda: active(g, key) is not None, 30.0, what="a new active for a/0")
        await g.run_for(3.0)
        assert ready(g, "a") == Counter(), "the new active made a prepared message ready"
        assert in_doubt(g, "a") == 3  # (a/0's new active loaded it from the log; a/1 and a/2 hold it too)
        end = await s.ask(TxEnd(rid=3, txid=txid, commit=True, parts=[TxPart("a", None)]))
        assert isinstance(end, TxEndOk) and end.committed, end
        await g.until(lambda: sum(ready(g, "a").values()) == N, 30.0, what="every message ready")
        assert ready(g, "a") == Counter(f"p{i}".encode() for i in range(N)) and in_doubt(g, "a") == 0


async def test_acks_held_by_a_transaction_survive_a_kill_of_their_active_and_settle_at_commit(
        tmp_path: Path) -> None:
    """Consume, transform, produce: the consumed messages' partition loses its active after the
    prepare; the new one holds the acked messages aside (never redelivered), and the commit
    settles them as it makes the results ready."""
    async with Group(tmp_path) as g:
        await _group(g)
        r = await ClientSession(g, g["n1"]).ask(Declare(rid=1, queue="in", partitions=1))
        assert not isinstance(r, Error), r
        key = key_of(g, "in", 0)
        await g.until(lambda: active(g, key) is not None, 30.0, what="an active for in/0")
        source = active(g, key)
        assert source is not None
        s = ClientSession(g, source)  # (consumes from the partition's active, as the durable connection does)
        msgs = [PublishMessage(None, {}, f"in{i}".encode(), None) for i in range(4)]
        assert isinstance(await s.ask(Publish(rid=2, queue="in", messages=msgs)), PublishOk)
        tags = []
        for i in range(2):
            got = await s.ask(Get(rid=10 + i, queue="in"))
            assert isinstance(got, GetOk) and got.message is not None, got
            tags.append(got.message.tag)
        r = await s.ask(TxInit(rid=3, transactional_id="worker"))
        assert isinstance(r, TxInitOk), r
        txid = f"{r.producer}/{r.epoch}/0"
        out = [PublishMessage(None, {}, f"out{i}".encode(), None) for i in range(2)]
        assert isinstance(await s.ask(Publish(rid=4, queue="a", messages=out, tx=txid)), PublishOk)
        assert isinstance(await s.ask(Ack(rid=5, tags=tags, tx=txid)), Ok)
        other = next(m for m in g.alive() if m.name != source.name)
        await g.kill(source.name)  # (its session goes with it: the link closed before the commit)
        await g.until(lambda: active(g, key) is not None, 30.0, what="a new active for in/0")
        await g.run_for(5.0)
        assert ready(g, "in") == Counter([b"in2", b"in3"]), "an acked message was delivered again"
        assert in_doubt(g, "in") == 1
        end = await ClientSession(g, other).ask(TxEnd(rid=6, txid=txid, commit=True,
                                                      parts=[TxPart("in", 0), TxPart("a", None)]))
        assert isinstance(end, TxEndOk) and end.committed, end
        await g.run_for(5.0)
        assert ready(g, "in") == Counter([b"in2", b"in3"]) and ready(g, "a") == Counter([b"out0", b"out1"])
        assert in_doubt(g, "in") == 0 and in_doubt(g, "a") == 0
        await g.restart(source.name)  # (the settlement is in the log: the old active brings nothing back)
        await g.run_for(10.0)
        assert ready(g, "in") == Counter([b"in2", b"in3"]) and ready(g, "a") == Counter([b"out0", b"out1"])


async def test_a_producer_gone_before_its_commit_is_aborted_by_the_timeout(tmp_path: Path) -> None:
    async with Group(tmp_path, transaction_timeout=5.0, transaction_history=60.0) as g:
        await _group(g)
        s = ClientSession(g, g["n3"])
        await _prepared(g, s, "app", "a", "z")
        await g.run_for(3.0)
        assert in_doubt(g, "a") > 0
        await g.until(lambda: in_doubt(g, "a") == 0, 30.0, what="the transaction aborted")
        assert ready(g, "a") == Counter()
        for m in g.alive():  # (nothing held aside is left in any member's counts)
            assert m.node is not None
            q = m.node.catalogue.queue("a")
            assert q.pending_count == 0 or not any(m.node.holding.serves(q, p) for p in range(3))


async def test_a_participant_cut_from_the_initiator_learns_the_outcome_itself(tmp_path: Path) -> None:
    async with Group(tmp_path) as g:
        await _group(g)
        s0 = ClientSession(g, g["n1"])
        r = await s0.ask(TxInit(rid=1, transactional_id="app"))
        assert isinstance(r, TxInitOk), r
        coordinator = _coordinator(g, f"{r.producer}/1/0")
        # a partition of "a" whose active is not the coordinator's, and an initiator that is neither
        await g.until(lambda: all(active(g, key_of(g, "a", p)) is not None for p in range(3)), 30.0,
                      what="an active for each partition")
        p = next(p for p in range(3) if active(g, key_of(g, "a", p)) is not coordinator)
        participant = active(g, key_of(g, "a", p))
        assert participant is not None
        initiator = next(m for m in g.alive() if m is not participant)
        s = ClientSession(g, initiator)
        r = await s.ask(TxInit(rid=1, transactional_id="app"))
        assert isinstance(r, TxInitOk), r
        txid = f"{r.producer}/{r.epoch}/0"
        msgs = [PublishMessage(None, {}, f"o{i}".encode(), None) for i in range(N)]
        assert isinstance(await s.ask(Publish(rid=2, queue="a", messages=msgs, partition=None, tx=txid)), PublishOk)
        g.net.cut(initiator.name, participant.name)
        g.net.cut(participant.name, initiator.name)
        end = await s.ask(TxEnd(rid=3, txid=txid, commit=True, parts=[TxPart("a", None)]))
        assert isinstance(end, TxEndOk) and end.committed, end
        await g.until(lambda: sum(ready(g, "a").values()) == N, 60.0, what="every partition committed")
        assert ready(g, "a") == Counter(f"o{i}".encode() for i in range(N))
        g.net.heal()
        await g.run_for(5.0)
        assert in_doubt(g, "a") == 0
