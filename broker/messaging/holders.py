"""The deliveries client sessions (and relays, broker.sessions.relayed) hold: a partition's depth
with them, and taking them back when the partition's messages move."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from broker.messaging.message import Msg
from broker.messaging.queues import Consumer, Queue, Recipient


class Holder(Protocol):
    """A session holding deliveries (delivered, not yet settled)."""

    @property
    def deliveries(self) -> Mapping[int, tuple[Consumer, Msg]]: ...


def partition_depth(holders: Iterable[Holder], q: Queue, pidx: int, ready_only: bool = False) -> int:
    """Ready (and delayed) and, unless ``ready_only``, delivered-but-unsettled messages of one
    partition served here."""
    part = q.partitions[pidx]
    ready = len(part.ready) + part.cold_count + len(part.delayed)
    if ready_only:
        return ready
    return ready + sum(1 for h in holders for c, m in h.deliveries.values() if c.queue is q and m.partition == pidx)


def take_back_deliveries(holders: Iterable[Recipient], q: Queue, pidx: int) -> list[Msg]:
    """Take back the unsettled deliveries of a partition this node still serves (its
    messages are about to be re-mapped, broker.partitions.remap): the messages, for the caller to make
    ready again.  A consumer's later ack of one gets an unknown-tag error."""
    out: list[Msg] = []
    for h in holders:
        gone = [t for t, (c, m) in h.deliveries.items() if c.queue is q and m.partition == pidx]
        for t in gone:
            c, m = h.deliveries.pop(t)
            c.unacked -= 1
            q.unacked_count -= 1
            out.append(m)
    return out


def revoke_deliveries(holders: Iterable[Recipient], q: Queue, pidx: int) -> int:
    """Drop the unsettled deliveries of a partition this node no longer serves (the new active
    delivers them again); how many."""
    return len(take_back_deliveries(holders, q, pidx))
