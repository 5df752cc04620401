"""Time in the queues: delayed messages become ready when they are due, expired ones leave.

A message is timed by its headers, in milliseconds as decimal text: ``x-delay`` (ready that long
after its publish) or ``x-deliver-at`` (ready at that time since the epoch), and ``expiration``
(gone that long after its publish); a queue's ``message_ttl`` expires every message that long
after its publish, whichever comes first.  The times are the active's clock at the publish
(``Msg.ts``, stored with the message), so they are part of the partition's log: a node that
becomes the partition's active, or restarts, reads them back with the messages and holds the
delayed ones aside again (``Partition.delayed``, a heap by due time) until they are due.

No message has a timer of its own: one loop per node (:meth:`QueueTimes.run`) looks every
:data:`TICK` at the head of each queue's heaps and moves what is due to the ready messages, and
takes the expired messages at the head of each partition's ready ones; those, and an expired
message a consumer would have been given, are dead-lettered with ``x-death-reason: expired``
(dropped without a dead-letter queue) and counted (``Queue.expired``), never delivered.  A
message that expires behind one that does not waits until it reaches the head or a consumer's
turn, as in RabbitMQ.  Delayed messages are held in memory outside ``max_memory``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Protocol

from broker.messaging.declare import MAX_DELAY_MS
from broker.messaging.message import DELIVER_AT_HEADER, TIMING_HEADERS, Msg
from broker.messaging.queues import Queue
from client.clock import Clock
from client.errors import InvalidArgumentError
from client.protocol.frames import PublishMessage

log = logging.getLogger("tandem.broker")

#: seconds between two looks at the queues' delayed and expiring messages
TICK = 0.1


class Expiring(Protocol):
    """What the loop hands its results to (broker.messaging.delivery.Delivery)."""

    def schedule(self, q: Queue) -> None: ...

    def expire(self, q: Queue, msgs: list[Msg]) -> None: ...


def timed(messages: Iterable[PublishMessage]) -> bool:
    """Whether any of a publish's messages is timed (delayed or expiring)."""
    return any(m.headers and not m.headers.keys().isdisjoint(TIMING_HEADERS) for m in messages)


def check(messages: Iterable[PublishMessage], now: float) -> None:
    """InvalidArgumentError naming the first timing header that is not decimal milliseconds in range."""
    for m in messages:
        if not m.headers:
            continue
        for name in TIMING_HEADERS:
            v = m.headers.get(name)
            if v is None:
                continue
            if not (v.isascii() and v.isdigit()) or len(v) > 16:
                raise InvalidArgumentError(f"header {name}: {v[:20]!r} is not a whole number of milliseconds")
            limit = now * 1000 + MAX_DELAY_MS if name == DELIVER_AT_HEADER else MAX_DELAY_MS
            if int(v) > limit:
                what = "a time at most 2**32-1 ms from now" if name == DELIVER_AT_HEADER else "at most 2**32-1 ms"
                raise InvalidArgumentError(f"header {name}: {v} must be {what} (49.7 days)")


class QueueTimes:
    """The node's one loop over its queues' delayed and expiring messages."""

    def __init__(self, queues: Callable[[], Iterable[Queue]], delivery: Expiring, clock: Clock) -> None:
        self.queues, self.delivery, self.clock = queues, delivery, clock

    async def run(self) -> None:
        while True:
            await self.clock.sleep(TICK)
            try:
                self.tick()
            except Exception:  # a bug must not stop time for every queue here: say so, go on
                log.exception("the queues' timing loop failed a look (it goes on)")

    def tick(self) -> None:
        now = self.clock.time()
        for q in list(self.queues()):
            if q.deleted:
                continue
            if q.delayed_count and q.promote(now):
                self.delivery.schedule(q)
            if q.meta.message_ttl or q.expiring:
                gone = q.take_expired(now)
                if gone:
                    self.delivery.expire(q, gone)
