"""Helpers for the harness's re-partitioning and group-change tests
(tests/harness/test_repartition.py, tests/harness/test_group_change.py): a member's status as
``tandem status`` shows it, an operation asked of a member as a client session asks it, keyed
messages loaded and consumed, and producers with a consumer that records each message's id."""

from __future__ import annotations

import random
from collections.abc import Coroutine
from typing import Any

from broker.sessions.status import status_of
from client.protocol.frames import PublishMessage, StatusOk
from tests.harness.clients import Consumer, Ledger, _Session, spawn_clients
from tests.harness.group import Group, Member
from tests.harness.replication import Traffic, active, quiet


def status(m: Member) -> StatusOk:
    """What ``tandem status`` asked of ``m`` shows."""
    node = m.node
    assert node is not None, f"{m.name} is not running"
    return m.run(status_of, node.report, node.placing, 0)


async def ask(g: Group, m: Member, request: Coroutine[Any, Any, Any], what: str, timeout: float = 30.0) -> Any:
    """Run ``request`` (a call on ``m``'s node, as a session's handler makes it) as ``m``'s own
    code: its result, or the exception it raised."""
    assert m.life is not None, f"{m.name} is not running"
    task = m.life.spawn(request, name=f"harness-{what}")
    await g.until(task.done, timeout, what=what)
    return task.exception() or task.result()


def partitions_of(g: Group, queue: str) -> int:
    m = g.alive()[0]
    assert m.node is not None
    return m.node.catalogue.queues[queue].meta.partitions


def all_active(g: Group, queue: str, partitions: int) -> bool:
    """Every live member knows ``queue`` with ``partitions`` partitions, each with an active."""
    for m in g.alive():
        q = m.node.catalogue.queues.get(queue) if m.node is not None else None
        if q is None or q.meta.partitions != partitions:
            return False
        qid = q.meta.id
    return all(active(g, (qid, p)) is not None for p in range(partitions))


def updates_done(g: Group) -> bool:
    """No live member has an update under way."""
    return all(m.node is not None and not m.node.ops.remaps.pending for m in g.alive())


async def load(g: Group, queue: str, bodies: list[tuple[bytes, str]], batch: int = 500) -> None:
    """Publish ``(body, key)`` pairs to ``queue`` at the first live member, a batch at a time."""
    m = g.alive()[0]
    for i in range(0, len(bodies), batch):
        out = g.publish(m, queue, None, [PublishMessage(k, {}, b, 0) for b, k in bodies[i:i + batch]])
        await g.until(out.done, 30.0, what=f"{queue}: a batch stored")
        out.result()


class IdConsumer(Consumer):
    """A :class:`Consumer` that also keeps (body, message id) of every delivery, as the drill's
    checker (:func:`broker.tools.checker.classify`) reads them: a re-mapped message keeps its id."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ids: list[tuple[bytes, str]] = []

    def received(self, s: _Session, tags: list[int]) -> None:
        for tag in tags:
            _c, m = s.deliveries[tag]
            self.ids.append((m.body, m.id))
        super().received(s, tags)


class Load(Traffic):
    """Two producers (16 keys) and an :class:`IdConsumer` on ``queue``, until :meth:`drain`."""

    consumer_class = IdConsumer
    consumer: IdConsumer

    def drained(self) -> bool:
        """Producers done, every confirmed message delivered (by id) and acked, and on each
        partition's active nothing ready, unacked or waiting to commit."""
        if not all(p.done for p in self.producers) or self.consumer.pending:
            return False
        if self.ledger.confirmed - {b for b, _id in self.consumer.ids}:
            return False
        return quiet(self.g, self.queue)


async def consume(g: Group, queue: str, count: int, prefetch: int = 200) -> list[tuple[bytes, str | None, int, str]]:
    """Consume ``queue`` (subscribed on every live member, acking each) until ``count``
    messages came and the queue is quiet: (body, key, partition, id) of each delivery."""
    consumer = IdConsumer(g, Ledger(), queue, "reader", random.Random(0), prefetch=prefetch)
    tasks = spawn_clients(consumer.run())
    got = consumer.ledger.deliveries

    def done() -> bool:
        return len(got) >= count and not consumer.pending and quiet(g, queue)

    await g.until(done, 60.0, what=f"{count} messages of {queue} consumed (got {len(got)})")
    for t in tasks:
        t.cancel()
    return [(d.body, d.key, d.partition, mid) for d, (_b, mid) in zip(got, consumer.ids, strict=True)]
