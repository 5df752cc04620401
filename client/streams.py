"""Streams from the asyncio client: declare one, read a partition by offset, time or position,
and keep a named consumer's offsets in the group.

:class:`StreamAdmin` is a mixin of :class:`client.connection.Connection` (``request`` is the
connection's).  A read works on any queue (a classic queue's read shows what is not yet
settled); a stream keeps its messages until its retention drops them (docs/messaging.md).
"""

from __future__ import annotations

from collections.abc import Callable

from client.errors import InvalidArgumentError
from client.protocol.frames import (Declare, DeclareOk, FetchOffset, Frame, OffsetOk, Placement, QueueInfo, Read,
                                    ReadOk, StoreOffset, StreamMessage, expect, placement_text)

#: where a read may start instead of an offset
STARTS = ("first", "last", "next")


def read_frame(rid: int, queue: str, partition: int, offset: int | str, max_messages: int,
               timestamp: float | None) -> Read:
    """The ``Read`` for a read from ``offset`` (an offset, or "first", "last", "next") or from
    ``timestamp`` (seconds since the epoch: the first message stored at or after it)."""
    if timestamp is not None:
        if not isinstance(timestamp, (int, float)) or timestamp <= 0:
            raise InvalidArgumentError(f"timestamp {timestamp!r}: seconds since the epoch, > 0")
        return Read(rid=rid, queue=queue, partition=partition, max_messages=max_messages,
                    timestamp=max(1, int(timestamp * 1000)))
    if isinstance(offset, str):
        if offset not in STARTS:
            raise InvalidArgumentError(f"offset {offset!r}: an offset (>= 0) or one of {', '.join(STARTS)}")
        return Read(rid=rid, queue=queue, partition=partition, max_messages=max_messages, start=offset)
    return Read(rid=rid, queue=queue, partition=partition, offset=offset, max_messages=max_messages)


def stream_declare(rid: int, name: str, partitions: int, max_age: float, max_bytes: int,
                   placement: Placement, expires: int) -> Declare:
    """The ``Declare`` of a stream (``max_age`` in seconds)."""
    if max_age < 0:
        raise InvalidArgumentError(f"max_age {max_age!r}: seconds, >= 0 (0: for ever)")
    return Declare(rid=rid, queue=name, partitions=partitions, type="stream", max_age=round(max_age * 1000),
                   max_bytes=max_bytes, placement=placement_text(placement), expires=expires)


class StreamAdmin:
    """Streams: queues whose messages stay, read by offset until their retention drops them."""

    async def request(self, make: Callable[[int], Frame]) -> Frame:
        raise NotImplementedError

    async def declare_stream(self, name: str, *, partitions: int = 1, max_age: float = 0, max_bytes: int = 0,
                             placement: Placement = None, expires: int = 0) -> QueueInfo:
        """Create stream ``name`` (idempotent, as :meth:`declare_queue`).  Retention: messages
        older than ``max_age`` seconds go, and each partition keeps at most about ``max_bytes``
        bytes (whole chunks go, oldest first; 0: no bound).  Its messages are read (:meth:`read`),
        never consumed."""
        reply = await self.request(lambda rid: stream_declare(rid, name, partitions, max_age, max_bytes,
                                                              placement, expires))
        return expect(reply, DeclareOk).queue

    async def read(self, queue: str, partition: int, offset: int | str = 0, max_messages: int = 1000, *,
                   timestamp: float | None = None) -> tuple[list[StreamMessage], int, int]:
        """Read a partition without consuming: (messages, next_offset, end_offset).  From
        ``offset``: an offset, "first" (the oldest message held), "last" (the newest) or "next"
        (the end); or from ``timestamp`` (seconds since the epoch: the first message stored
        at or after it)."""
        reply = await self.request(lambda rid: read_frame(rid, queue, partition, offset, max_messages, timestamp))
        reply = expect(reply, ReadOk)
        return reply.messages, reply.next_offset, reply.end_offset

    async def store_offset(self, queue: str, consumer: str, partition: int, offset: int) -> None:
        """Keep ``offset`` (the next one to read) as ``consumer``'s position in ``partition``:
        group state, committed on return, there after a failover or a restart."""
        await self.request(lambda rid: StoreOffset(rid=rid, queue=queue, partition=partition, consumer=consumer,
                                                   offset=offset))

    async def fetch_offset(self, queue: str, consumer: str, partition: int) -> int | None:
        """The offset ``consumer`` stored for ``partition``; None if it stored none."""
        reply = expect(await self.request(lambda rid: FetchOffset(rid=rid, queue=queue, partition=partition,
                                                                  consumer=consumer)), OffsetOk)
        return reply.offset if reply.found else None
