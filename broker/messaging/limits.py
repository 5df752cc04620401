"""A queue's bounds, and what a publish past them does (``max_length``, ``max_length_bytes``,
``overflow``).

Both bounds are counted on the member that serves the queue's partitions, over the partitions
it serves: ``max_length`` counts the messages the queue holds there (ready, delivered and not
yet settled, being stored), ``max_length_bytes`` the bytes of its ready messages (bodies and
headers, in memory and cold), as RabbitMQ counts its ``x-max-length-bytes``.  A publish whose
new messages would take the queue past either bound is refused with QUEUE_FULL
(``reject-publish``, the default), or, with ``drop-head``, makes room first: the oldest ready
messages in memory (by publish time, over the partitions) leave the queue, to its dead-letter
queue with ``x-death-reason: maxlen``, or dropped without one; their settlement is written with
the publish, so a failover or restart never brings them back.  A publish is still refused when
the ready messages in memory cannot make room (the others are delivered and unsettled, or in a
cold region), or when its new messages alone exceed a bound.  A resend of messages the queue
holds already (an idempotent producer's) adds nothing and is never refused.
"""

from __future__ import annotations

from collections.abc import Callable

from broker.messaging.message import Msg, encode_headers
from broker.messaging.queues import Queue
from client.errors import QueueFullError
from client.protocol.frames import PublishMessage


def admit(q: Queue, fresh: list[PublishMessage], shed: Callable[[Queue, list[Msg]], None]) -> None:
    """Make room for ``fresh`` (the new messages of a publish) within ``q``'s bounds, shedding
    its oldest ready messages with ``shed`` under ``drop-head``; QueueFullError if it cannot."""
    meta = q.meta
    if not fresh or not (meta.max_length or meta.max_length_bytes):
        return
    size = sum(len(m.body) + len(encode_headers(m.headers)) for m in fresh) if meta.max_length_bytes else 0
    refused = make_room(q, len(fresh), size, shed)
    if refused is not None:
        raise QueueFullError(refused)


def make_room(q: Queue, count: int, size: int, shed: Callable[[Queue, list[Msg]], None]) -> str | None:
    """Room in ``q`` for ``count`` more messages of ``size`` bytes (shedding under ``drop-head``);
    why not, if there is none (a dead-lettering into a full queue drops its message with it)."""
    meta = q.meta
    over = q.depth + count - meta.max_length if meta.max_length else 0
    over_bytes = q.ready_bytes + size - meta.max_length_bytes if meta.max_length_bytes else 0
    if over <= 0 and over_bytes <= 0:
        return None
    full = _full(q, count, size)
    if meta.overflow != "drop-head":
        return full
    if (meta.max_length and count > meta.max_length) or (meta.max_length_bytes and size > meta.max_length_bytes):
        return f"{full}: the publish alone is more than the queue holds"
    oldest = q.take_oldest(max(0, over), max(0, over_bytes))
    if len(oldest) < over or sum(len(m.body) + len(m.headers_blob) for m in oldest) < over_bytes:
        q.requeue(oldest)
        return (f"{full}: its ready messages cannot make room (the others are delivered and unsettled, or not "
                "yet read back from the store)")
    shed(q, oldest)
    return None


def _full(q: Queue, count: int, size: int) -> str:
    meta = q.meta
    bounds = []
    if meta.max_length:
        bounds.append(f"{q.depth} of max_length {meta.max_length}")
    if meta.max_length_bytes:
        bounds.append(f"{q.ready_bytes} bytes of max_length_bytes {meta.max_length_bytes}")
    more = f"{count} more ({size} bytes)" if meta.max_length_bytes else f"{count} more"
    return f"queue {q.name!r} is full: {', '.join(bounds)} (overflow {meta.overflow}), asked to take {more}"
