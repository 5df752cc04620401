"""What a node reports about its queues, for its console, its metrics and its peers.

The management console (``webconsole/``) shows the whole group: for each partition
it asks the member active for it (the forwarded ``pstats`` request), and it sums
the counters every member keeps of what it did as an active (``qstats``).  The
answers are computed here, on the node's own state, so that the broker answers
its peers without importing the console; ``apply_option`` applies an operator
setting sent by a member's console (forwarded ``option``).

The helpers read the node through :class:`NodeState`, the few things they need.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Protocol

import msgpack

from broker.config import NodeConfig
from broker.queues import Consumer, Msg, Queue
from client.errors import InvalidArgumentError, UnavailableError

class HoldsDeliveries(Protocol):
    """A client session: the messages delivered to it and not yet settled."""

    @property
    def deliveries(self) -> Mapping[int, tuple[Consumer, Msg]]: ...


class NodeState(Protocol):
    """What the status helpers read and set on a node."""

    @property
    def config(self) -> NodeConfig: ...

    @property
    def queues(self) -> Mapping[str, Queue]: ...

    @property
    def sessions(self) -> Collection[HoldsDeliveries]: ...

    def queue(self, name: str) -> Queue: ...

    def serves(self, q: Queue, pidx: int) -> bool: ...

    def set_quorum_override(self, nodes: int | None, *, by: str) -> None: ...

    def set_option(self, name: str, value: int, *, by: str) -> None: ...


def partition_depth(node: NodeState, q: Queue, pidx: int) -> int:
    """Ready and delivered-but-unsettled messages of one partition served here."""
    held = sum(1 for sess in node.sessions for c, m in sess.deliveries.values()
               if c.queue is q and m.partition == pidx)
    return len(q.partitions[pidx].ready) + held


def local_pstats(node: NodeState, q: Queue, pidx: int) -> dict[str, Any]:
    """ready, unacked, depth and next offset of a partition this node serves."""
    part = q.partitions[pidx]
    depth = partition_depth(node, q, pidx)
    ready = len(part.ready)
    return {"ready": ready, "unacked": depth - ready, "depth": depth, "active": node.config.name,
            "next_offset": part.next_offset}


def pstats_payload(node: NodeState, qname: str, pidx: int) -> bytes:
    """The answer to a forwarded ``pstats`` request: a partition this node is active for."""
    q = node.queue(qname)
    if not 0 <= pidx < q.meta.partitions:
        raise InvalidArgumentError(f"queue {qname!r} has no partition {pidx}")
    if not node.serves(q, pidx):
        raise UnavailableError(f"partition {qname}/{pidx} is not active on {node.config.name}")
    return msgpack.packb(local_pstats(node, q, pidx))


def queue_counters(node: NodeState) -> dict[str, list[int]]:
    """What this node counted, per queue: [published, delivered, acked]."""
    return {name: [q.published, q.delivered, q.acked] for name, q in node.queues.items()}


def add_counters(total: dict[str, list[int]], counts: Mapping[str, list[int]]) -> None:
    """Add one member's :func:`queue_counters` into ``total`` (the whole group's)."""
    for qname, v in counts.items():
        acc = total.setdefault(qname, [0, 0, 0])
        for i in range(3):
            acc[i] += v[i]


def apply_option(node: NodeState, option: str, value: int, by: str) -> None:
    """An operator setting on this node (from its console, or forwarded by a member).
    ``quorum_override`` below 0 clears the override."""
    if option == "quorum_override":
        node.set_quorum_override(None if value < 0 else value, by=by)
    elif option in ("priority", "designated_primary"):
        node.set_option(option, value, by=by)
    else:
        raise InvalidArgumentError(f"unknown option {option!r}")
