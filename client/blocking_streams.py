"""Streams from the blocking client, as :mod:`client.streams` has them for the asyncio one: a
mixin of :class:`client.blocking.BlockingConnection` (``_call`` is its request, resent after a
failover: each of these is safe to repeat)."""

from __future__ import annotations

from typing import Any

from client.protocol.frames import (DeclareOk, FetchOffset, Frame, OffsetOk, Placement, QueueInfo, ReadOk,
                                    StoreOffset, StreamMessage, expect)
from client.streams import read_frame, stream_declare


class BlockingStreams:
    def _call(self, make: Any, *, retry: bool = True) -> Frame:
        raise NotImplementedError

    def declare_stream(self, name: str, *, partitions: int = 1, max_age: float = 0, max_bytes: int = 0,
                       placement: Placement = None, expires: int = 0) -> QueueInfo:
        """See :meth:`client.streams.StreamAdmin.declare_stream`."""
        reply = self._call(lambda rid: stream_declare(rid, name, partitions, max_age, max_bytes, placement, expires))
        return expect(reply, DeclareOk).queue

    def read(self, queue: str, partition: int, offset: int | str = 0, max_messages: int = 1000, *,
             timestamp: float | None = None) -> tuple[list[StreamMessage], int, int]:
        """See :meth:`client.streams.StreamAdmin.read`."""
        reply = expect(self._call(lambda rid: read_frame(rid, queue, partition, offset, max_messages, timestamp)),
                       ReadOk)
        return reply.messages, reply.next_offset, reply.end_offset

    def store_offset(self, queue: str, consumer: str, partition: int, offset: int) -> None:
        self._call(lambda rid: StoreOffset(rid=rid, queue=queue, partition=partition, consumer=consumer,
                                           offset=offset))

    def fetch_offset(self, queue: str, consumer: str, partition: int) -> int | None:
        reply = expect(self._call(lambda rid: FetchOffset(rid=rid, queue=queue, partition=partition,
                                                          consumer=consumer)), OffsetOk)
        return reply.offset if reply.found else None
