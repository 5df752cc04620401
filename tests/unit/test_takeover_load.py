"""A node that becomes a partition's active reads it from the store and makes its backlog into
the node's messages in a storage thread, never on the loop: many thousand of them take longer
to make than a peer waits for an answer (broker.modes.replicated.serving ``Serving.start``)."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace
from typing import Any

import pytest

import broker.messaging.queues as queues
import broker.modes.replicated.serving as serving
from broker.messaging.message import EMPTY_HEADERS
from broker.messaging.queues import Queue
from broker.modes.replicated.serving import Serving
from client.clock import SystemClock
from ha.replica import Role
from storage.base import PartitionState, QueueMeta, StoredMessage

N = 2000


class _Engine:
    def load_partition(self, queue_id: int, partition: int, budget: int = 0) -> PartitionState:
        return PartitionState(next_offset=N, messages=[
            StoredMessage(i, f"k{i}", EMPTY_HEADERS, b"x", None, None, 0.0) for i in range(N)])


class _Node:
    def __init__(self, q: Queue) -> None:
        self.q = q

    def load_budget(self, queue_id: int = 0) -> int:
        return 0

    def partition_loaded(self, key: Any, st: PartitionState, windows: Any, ready: Any = None) -> None:
        self.q.load_partition(key[1], st, windows=windows, ready=ready)  # (as broker.node.holding does)

    def map_changed(self) -> None:
        pass


@pytest.mark.asyncio
async def test_a_new_active_makes_its_messages_off_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    made_on: list[int] = []

    def recorded(make: Any) -> Any:
        def record(partition: int, m: StoredMessage) -> Any:
            made_on.append(threading.get_ident())
            return make(partition, m)
        return record

    monkeypatch.setattr(serving, "msg_from_store", recorded(queues.msg_from_store), raising=False)
    monkeypatch.setattr(queues, "msg_from_store", recorded(queues.msg_from_store))
    q = Queue(QueueMeta(id=1, name="q", partitions=1, mapper="jump_hash", ring_size=1024, max_deliveries=0,
                        dead_letter_queue=None, max_length=0))
    node = _Node(q)
    key = (1, 0)
    plog = SimpleNamespace(key=key, name="q/0", replica=SimpleNamespace(role=Role.LEADER, term=3, leader="n1"),
                           serve_term=3, serve_from=0, serving=False, windows={}, lifecycle=None, known_active=None)
    tasks: list[asyncio.Task[None]] = []
    s = Serving("n1", SystemClock(), {key: plog}, engine=_Engine(), peers=None, queues=None,  # type: ignore[arg-type]
                moves=None, node=node, placed=None, spawn=lambda c: tasks.append(asyncio.ensure_future(c)),
                fail_waiters=lambda _plog, _exc: None)
    s.start(plog)  # type: ignore[arg-type]
    await asyncio.wait_for(tasks[0], 10)
    assert [m.offset for m in q.partitions[0].ready] == list(range(N)) and plog.serving
    assert len(made_on) == N and threading.get_ident() not in made_on


@pytest.mark.asyncio
async def test_a_node_that_wins_a_partition_back_drops_what_it_delivered_in_an_earlier_term() -> None:
    """A node that lost a partition and won it again with no unload between (a flapping link)
    still held a session's delivery of its earlier term; another active may have settled that
    message since (a transaction's ack).  Loading the partition again revokes the delivery: an
    ack of it is an unknown tag, never a second settlement of a message the store settled."""
    from broker.messaging.message import Msg, msg_from_store
    from broker.messaging.queues import Consumer
    from broker.node.holding import Holding

    q = Queue(QueueMeta(id=1, name="q", partitions=1, mapper="jump_hash", ring_size=1024, max_deliveries=0,
                        dead_letter_queue=None, max_length=0))
    session = SimpleNamespace(deliveries={})
    c = Consumer(1, q, session, 10)  # type: ignore[arg-type]
    old: Msg = msg_from_store(0, StoredMessage(5, "k", EMPTY_HEADERS, b"x", None, None, 0.0))
    session.deliveries[7] = (c, old)
    c.unacked, q.unacked_count = 1, 1
    host = SimpleNamespace(catalogue=SimpleNamespace(by_id=lambda _i: q), holders=[session],
                           delivery=SimpleNamespace(schedule=lambda _q: None),
                           remaps=SimpleNamespace(served=lambda _k: None))
    settled_since = PartitionState(next_offset=6, messages=[])  # (offset 5 settled by another active)
    Holding.partition_loaded(host, (1, 0), settled_since, {})  # type: ignore[arg-type]
    assert session.deliveries == {} and c.unacked == 0 and q.unacked_count == 0
    assert not q.partitions[0].ready and q.depth == 0
