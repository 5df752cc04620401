"""Helpers for the harness's replication tests (tests/harness/test_failback.py and the like):
a queue's partitions and their actives, the placement's first node of a partition, its HA
events, and a run of producers and consumers that ends in a drain."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Callable
from typing import Any

import client.errors
from broker.modes.replicated.events import HaEvent
from client.mapper import make_mapper
from tests.harness.clients import Consumer, Ledger, Producer, spawn_clients
from tests.harness.group import Group, Member

DRAIN_TIMEOUT = 60.0  # virtual seconds


def key_of(g: Group, queue: str, pidx: int = 0) -> tuple[int, int]:
    for m in g.alive():
        q = m.node.catalogue.queues.get(queue) if m.node is not None else None
        if q is not None:
            return (q.meta.id, pidx)
    raise AssertionError(f"no live member knows {queue}")


def active(g: Group, key: tuple[int, int]) -> Member | None:
    """The one live member serving ``key`` (None: none, or more than one)."""
    serving = [m for m in g.alive() if m.node is not None and m.node.ha.replication is not None
               and m.node.ha.replication.serving(key)]
    return serving[0] if len(serving) == 1 else None


async def declared_with_active(g: Group, queue: str) -> tuple[tuple[int, int], Member]:
    """Declare ``queue`` with one partition; its key and its active, once it has one."""
    await g.declare(queue, partitions=1)
    key = key_of(g, queue)
    await g.until(lambda: active(g, key) is not None, 10.0, what=f"an active for {queue}")
    a = active(g, key)
    assert a is not None
    return key, a


def placed_first(g: Group, key: tuple[int, int], partitions: int) -> str:
    """The placement's choice for ``key`` (its first node), as a live member computes it."""
    m = g.alive()[0]
    assert m.node is not None and m.node.ha.replication is not None
    return m.node.ha.replication.placed(key, partitions).nodes[0]


def events(m: Member, kind: str | None = None) -> list[HaEvent]:
    rep = m.node.ha.replication if m.node is not None else None
    assert rep is not None, f"{m.name} is not running"
    return [e for e in rep.events if kind is None or e.kind == kind]


def with_settings(g: Group, name: str, **fields: Any) -> None:
    """Member ``name`` starts with these NodeConfig fields changed (call before it starts)."""
    m = g[name]
    m.config = dataclasses.replace(m.config, **fields)


def partition_of(queue_partitions: int) -> Callable[[str], int]:
    """A key's partition under declare_queue's default mapper."""
    mapper = make_mapper("jump_hash", queue_partitions, 1024)
    return mapper.partition


def only_retriable(ledger: Ledger) -> list[str]:
    """The kinds of publish error seen that the SDK does not retry (a durable connection's
    producer would fail the send): empty if every failure was retriable, or a timeout of a
    member that died."""
    return [k for k in ledger.errors if k != "timeout" and not getattr(client.errors, k).retriable]


def quiet(g: Group, queue: str) -> bool:
    """Every partition of ``queue`` has an active that holds nothing ready, unacked or
    waiting to commit."""
    m0 = g.alive()[0]
    assert m0.node is not None
    meta = m0.node.catalogue.queues[queue].meta
    for pidx in range(meta.partitions):
        a = active(g, (meta.id, pidx))
        if a is None or a.node is None:
            return False
        q = a.node.catalogue.queues[queue]
        part = q.partitions[pidx]
        if part.ready or part.cold_count or q.unacked_count or q.pending_count:
            return False
    return True


class Traffic:
    """Two producers (16 keys, every partition) and a consumer on ``queue``, running until
    :meth:`drain`."""

    #: the consumer's class (a subclass may keep more of what it receives)
    consumer_class: type[Consumer] = Consumer

    def __init__(self, g: Group, queue: str, seed: int = 0, *, prefetch: int = 20, pause: float = 0.05,
                 ack_delay: float = 0.1) -> None:
        self.g, self.queue = g, queue
        self.ledger = Ledger()
        self.producers = [Producer(g, self.ledger, queue, f"p{i}", random.Random(f"{seed}-p{i}"), total=10**6,
                                   pause=pause, keys=16) for i in range(2)]
        self.consumer = self.consumer_class(g, self.ledger, queue, "c0", random.Random(f"{seed}-c"),
                                            prefetch=prefetch, ack_delay=ack_delay)
        self.tasks = spawn_clients(*(p.run() for p in self.producers), self.consumer.run())

    def confirmed_on(self, partitions: int, pidx: int) -> int:
        """Confirmed messages whose key maps to partition ``pidx``."""
        of = partition_of(partitions)
        return sum(1 for b in self.ledger.confirmed if of(self.ledger.sent[b] or "") == pidx)

    def drained(self) -> bool:
        """Producers done, every confirmed message delivered and acked, and on each live
        partition active nothing ready, unacked or waiting to commit."""
        if not all(p.done for p in self.producers) or self.ledger.unacked_confirmed() or self.consumer.pending:
            return False
        return quiet(self.g, self.queue)

    async def drain(self) -> None:
        """Stop the producers (each finishes its batch), then run until drained."""
        for p in self.producers:
            p.stop = True
        await self.g.until(self.drained, DRAIN_TIMEOUT, what=f"{self.queue} drained ({self.ledger.summary()})")

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        ended = await asyncio.gather(*self.tasks, return_exceptions=True)
        failed = [e for e in ended if isinstance(e, Exception) and not isinstance(e, asyncio.CancelledError)]
        assert not failed, f"a client failed: {failed!r}"
