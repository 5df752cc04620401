"""Queues that expire unused (a queue's ``expires``): deleted, on the catalogue's active, once no
member has had a consumer on it, a get from it or a declare of it for that long.

Each member keeps, per queue, when it was last used there (a consumer subscribed or cancelled, a
get, a declare: ``Queue.last_used``) and reports how many consumers it has there and how long it
has been idle with its queue counters (``QUEUE_STATS``, ``Queue.usage``).  The catalogue's
active looks every :data:`CHECK_EVERY` seconds at the queues with an ``expires``: one that no
answering member uses, idle for at least ``expires`` on each of them, is deleted as
``tandem queues delete`` deletes it, messages and all, and the deletion is logged.  A member
that does not answer (down, or cut off from the catalogue's active, where its clients are
refused for want of quorum) has no say; a member of an older build reports no idle time, which
keeps the queue.  Publishing does not count as use (as in RabbitMQ).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

from broker.config import NodeConfig
from broker.messaging.catalogue import Catalogue
from broker.messaging.commit import CATALOGUE, CommitPath
from broker.messaging.forward import ForwardRequest, QueueStatsFwd, decode_reply
from broker.peers.links import Link
from client.clock import Clock
from client.errors import TandemError

log = logging.getLogger("tandem.broker")

#: seconds between two looks at the queues that expire unused
CHECK_EVERY = 1.0
#: where a member's queue counters hold its consumers and idle milliseconds (broker.sessions.status)
CONSUMERS, IDLE_MS = 5, 6


class UnusedHost(Protocol):
    @property
    def config(self) -> NodeConfig: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def catalogue(self) -> Catalogue: ...

    @property
    def commit(self) -> CommitPath: ...

    def links(self) -> Mapping[str, Link]: ...

    async def forward(self, who: str, request: ForwardRequest) -> bytes: ...


class UnusedQueues:
    """The catalogue's active's look at the queues that expire unused."""

    def __init__(self, node: UnusedHost) -> None:
        self.node = node

    async def run(self) -> None:
        while True:
            await self.node.clock.sleep(CHECK_EVERY)
            try:
                await self.sweep()
            except TandemError as exc:  # (the catalogue's active moved, a member is slow: next time)
                log.debug("unused queues: %s", exc.message)
            except Exception:  # a bug must not end the look for good: say so, go on
                log.exception("the look at unused queues failed (it goes on)")

    async def sweep(self) -> list[str]:
        """Delete the queues unused for their ``expires`` (this node being the catalogue's
        active); their names."""
        node = self.node
        cat = node.catalogue
        timed = [q for q in cat.queues.values() if q.meta.expires and not q.deleted]
        if not timed or node.commit.active_of(CATALOGUE) != node.config.name:
            return []
        reports: list[Mapping[str, list[Any]]] = [{q.name: [0] * CONSUMERS + list(q.usage()) for q in timed}]
        for member in list(node.links()):
            try:
                answer = decode_reply(await node.forward(member, QueueStatsFwd()))
            except TandemError:
                continue  # (down, or not answering: no say)
            if isinstance(answer, dict):
                reports.append(answer)
        gone = []
        for q in timed:
            fresh = {q.name: [0] * CONSUMERS + list(q.usage())}  # (here again: the reports took a while)
            if all(_idle(r.get(q.name), q.meta.expires) for r in (*reports, fresh)) and not q.deleted:
                await cat.delete(q.name, False)
                log.warning("QUEUE EXPIRED %s: unused on every member for %d ms (expires): deleted", q.name,
                            q.meta.expires)
                gone.append(q.name)
        return gone


def _idle(counters: list[Any] | None, expires_ms: int) -> bool:
    """Whether a member's counters of a queue say it is unused there for ``expires_ms`` (a member
    that knows no such queue yet, or reports no idle time, keeps it)."""
    if not isinstance(counters, list) or len(counters) <= IDLE_MS:
        return False
    consumers, idle = counters[CONSUMERS], counters[IDLE_MS]
    return consumers == 0 and isinstance(idle, int) and idle >= expires_ms
