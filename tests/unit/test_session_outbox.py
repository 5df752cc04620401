"""A session's deliveries wait for their delivered mark to commit (broker.sessions.session
``send_after``): a consumer must never see a message whose delivery a new active would not
count.  When the mark fails (in a group: the partition moved to another node), the Deliver
frame never leaves, the deliveries are undone, and what was queued behind it still goes, in
order."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from broker.messaging.delivery import Delivery
from broker.messaging.message import EMPTY_HEADERS, Msg
from broker.messaging.queues import Consumer, Queue
from broker.sessions.session import Session, SessionParts
from client.clock import SYSTEM_CLOCK
from client.errors import NotActiveError, StorageError
from client.protocol.frames import Deliver, Ok
from storage.base import MarkDelivered, QueueMeta


class _Writer:
    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else None

    def is_closing(self) -> bool:
        return False


class _Node:
    def __init__(self) -> None:
        self.config = SimpleNamespace(client_heartbeat=10.0, max_frame_size=1 << 20)
        self.clock = SYSTEM_CLOCK
        self.serving = True
        self.writes: list[tuple[list[Any], Any]] = []
        self.delivery = Delivery(self, self, self)  # type: ignore[arg-type]

    def serves(self, q: Queue, pidx: int) -> bool:
        return self.serving

    def write_later(self, ops: list[Any], callback: Any = None, *, lazy: bool = True) -> None:
        self.writes.append((ops, callback))


def _session() -> tuple[_Node, Session, Consumer, list[Any]]:
    node = _Node()
    s = Session(SessionParts(node, None, None, node.delivery, {}), None, _Writer())  # type: ignore[arg-type]
    sent: list[Any] = []
    s.send = sent.append  # type: ignore[method-assign]
    q = Queue(QueueMeta(id=1, name="q", partitions=1, mapper="round_robin", ring_size=1024, max_deliveries=0,
                        dead_letter_queue=None, max_length=0))
    q.add_ready(q.partitions[0], [Msg(0, i, None, {}, EMPTY_HEADERS, b"x", None, None, 0.0) for i in range(3)])
    c = Consumer(1, q, s, 10)
    q.consumers.append(c)
    s.deliver(c, q.take(3, 1 << 20))
    s.send_in_order(Ok(rid=7))  # (queued behind the Deliver)
    return node, s, c, sent


def test_a_delivery_leaves_once_its_mark_is_committed_and_in_order() -> None:
    node, s, c, sent = _session()
    [(ops, committed)] = node.writes
    assert ops == [MarkDelivered(1, 0, 3)] and sent == []
    committed(None)
    assert [type(f) for f in sent] == [Deliver, Ok]
    assert [d.offset for d in sent[0].messages] == [0, 1, 2] and len(s.deliveries) == 3
    assert c.queue.partitions[0].marked_upto == 3


def test_a_delivery_whose_mark_failed_because_the_partition_moved_never_leaves() -> None:
    node, s, c, sent = _session()
    [(_ops, committed)] = node.writes
    node.serving = False  # (another node serves the partition: it delivers them, counted)
    committed(NotActiveError("partition 1/0 is not active here", active_hint=None))
    assert [type(f) for f in sent] == [Ok]
    assert s.deliveries == {} and c.unacked == 0 and c.queue.unacked_count == 0
    assert c.queue.ready_count == 0  # (not this node's any more)
    assert c.queue.partitions[0].marked_upto == 0


def test_a_delivery_whose_mark_failed_here_is_ready_again_uncounted() -> None:
    node, s, c, sent = _session()
    [(_ops, committed)] = node.writes
    committed(StorageError("disk full"))
    assert [type(f) for f in sent] == [Ok]
    assert s.deliveries == {} and c.unacked == 0
    part = c.queue.partitions[0]
    assert [(m.offset, m.dc) for m in part.ready] == [(0, 0), (1, 0), (2, 0)]
