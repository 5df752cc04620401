"""broker.sessions.status: what a node answers about its queues (depth, pstats, counters) and the
operator settings it applies, on a node stand-in that has only what the helpers read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack
import pytest

from broker.config import NodeConfig
from broker.messaging.message import Msg
from broker.messaging.queues import Consumer, Queue
from broker.sessions.status import (
    add_counters,
    apply_option,
    local_pstats,
    partition_depth,
    pstats_payload,
    queue_counters,
)
from client.errors import InvalidArgumentError, QueueNotFoundError, UnavailableError
from storage.base import QueueMeta


@dataclass
class FakeSession:
    deliveries: dict[int, tuple[Consumer, Msg]] = field(default_factory=dict)


@dataclass
class FakeNode:
    config: NodeConfig
    queues: dict[str, Queue] = field(default_factory=dict)
    sessions: list[FakeSession] = field(default_factory=list)
    served: set[tuple[str, int]] = field(default_factory=set)
    settings: list[tuple[str, Any, str]] = field(default_factory=list)

    @property
    def holders(self) -> list[FakeSession]:
        return self.sessions

    def queue(self, name: str) -> Queue:
        if name not in self.queues:
            raise QueueNotFoundError(f"no queue {name!r}")
        return self.queues[name]

    def serves(self, q: Queue, pidx: int) -> bool:
        return (q.meta.name, pidx) in self.served

    def set_quorum_override(self, nodes: int | None, *, by: str) -> None:
        self.settings.append(("quorum_override", nodes, by))

    def set_option(self, name: str, value: int, *, by: str) -> None:
        self.settings.append((name, value, by))


def msg(partition: int, offset: int) -> Msg:
    return Msg(partition, offset, None, {}, b"\x80", b"", None, None, 0.0)


def a_node(tmp_path: Any) -> tuple[FakeNode, Queue]:
    q = Queue(QueueMeta(id=1, name="orders", partitions=2, mapper="round_robin", ring_size=1, max_deliveries=0,
                        dead_letter_queue=None, max_length=0))
    q.add_ready(q.partitions[0], [msg(0, 0), msg(0, 1), msg(0, 2)])
    q.partitions[0].next_offset = 4
    q.published, q.delivered, q.acked = 4, 1, 0
    node = FakeNode(NodeConfig(data_dir=tmp_path), queues={"orders": q}, served={("orders", 0)})
    sess = FakeSession()
    sess.deliveries[1] = (Consumer(1, q, sess, 10), msg(0, 3))  # type: ignore[arg-type]  # a stand-in session
    node.sessions.append(sess)
    return node, q


def test_depth_counts_ready_and_delivered_unsettled(tmp_path: Any) -> None:
    node, q = a_node(tmp_path)
    assert partition_depth(node, q, 0) == 4
    assert partition_depth(node, q, 1) == 0
    assert local_pstats(node, q, 0) == {"ready": 3, "unacked": 1, "delayed": 0, "depth": 4, "active": "node1", "next_offset": 4}


def test_pstats_only_for_a_partition_served_here(tmp_path: Any) -> None:
    node, _q = a_node(tmp_path)
    assert msgpack.unpackb(pstats_payload(node, "orders", 0))["depth"] == 4
    with pytest.raises(UnavailableError):
        pstats_payload(node, "orders", 1)
    with pytest.raises(InvalidArgumentError):
        pstats_payload(node, "orders", 2)
    with pytest.raises(QueueNotFoundError):
        pstats_payload(node, "nope", 0)


def test_counters_of_the_members_add_up(tmp_path: Any) -> None:
    node, _q = a_node(tmp_path)
    total = {name: list(v)[:5] for name, v in queue_counters(node).items()}
    assert total == {"orders": [4, 1, 0, 0, 0]}
    add_counters(total, {"orders": [2, 2, 1], "jobs": [1, 0, 0, 3, 4]})  # (an older member's: three)
    assert total == {"orders": [6, 3, 1, 0, 0], "jobs": [1, 0, 0, 3, 4]}


def test_apply_option(tmp_path: Any) -> None:
    node, _q = a_node(tmp_path)
    apply_option(node, "quorum_override", -1, "ops")
    apply_option(node, "quorum_override", 2, "ops")
    apply_option(node, "priority", 3, "ops")
    apply_option(node, "designated_primary", 1, "ops")
    assert node.settings == [("quorum_override", None, "ops"), ("quorum_override", 2, "ops"),
                             ("priority", 3, "ops"), ("designated_primary", 1, "ops")]
    with pytest.raises(InvalidArgumentError):
        apply_option(node, "colour", 1, "ops")
