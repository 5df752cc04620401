"""Stream reads: a partition's messages from an offset, without consuming them (Spark, replay).

In a group the partition's active answers: a read made on another member is forwarded there
(another member's store may lag, and only the active knows the committed end).
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from broker.forward import MAX_HOPS, Forwarding, ReadFwd
from broker.queues import ID_HEADER, MESSAGE_OVERHEAD, decode_headers
from client.errors import InvalidArgumentError, PartitionNotFoundError, UnavailableError
from client.protocol.codec import decode_payload
from client.protocol.frames import ReadOk, StreamMessage, expect
from storage.base import Engine, StoredMessage

MAX_READ_BATCH = 10000  # messages in one stream read


class StreamHost(Forwarding, Protocol):
    engine: Engine


async def read_stream(node: StreamHost, queue: str, partition: int, offset: int, max_messages: int,
                      *, hops: int = 0) -> tuple[list[StreamMessage], int, int]:
    """(messages, next offset, end offset) of one partition from ``offset``."""
    q = node.queue(queue)
    if not 0 <= partition < len(q.partitions):
        raise PartitionNotFoundError(f"queue {queue!r} has no partition {partition}")
    if offset < 0 or not 1 <= max_messages <= MAX_READ_BATCH:
        raise InvalidArgumentError(f"offset must be >= 0 and max_messages 1..{MAX_READ_BATCH}")
    commit = node.commit
    if not commit.serving((q.meta.id, partition)):
        who = await commit.wait_active((q.meta.id, partition), node.election_wait)
        if who != node.config.name:
            if hops >= MAX_HOPS:
                raise UnavailableError(f"partition {q.meta.id}/{partition}: its active keeps moving; retry")
            out = await node.forward(who, ReadFwd(hops + 1, queue, partition, offset, max_messages))
            ok = expect(decode_payload(out), ReadOk)
            return ok.messages, ok.next_offset, ok.end_offset
    part = q.partitions[partition]
    engine = node.engine

    def read() -> tuple[int, list[StoredMessage]]:
        # the store's end first: below it every message is in the store or settled.  In a
        # group the log commits before the store is written (held back a little), and a read
        # that trusted committed_end alone would step over messages not yet there.
        stored = engine.stored_end(q.meta.id, partition)
        return stored, engine.read(q.meta.id, partition, offset, max_messages)

    stored, rows = await asyncio.to_thread(read)
    end = min(part.committed_end, stored)
    full = len(rows) == max_messages
    budget = node.config.max_frame_size - 4096
    msgs: list[StreamMessage] = []
    for r in rows:
        if r.offset >= end:
            break
        budget -= len(r.body) + len(r.headers_blob) + len(r.key or "") + MESSAGE_OVERHEAD
        if msgs and budget < 0:
            full = True  # the frame is full: the reader continues after the last one sent
            break
        headers = decode_headers(r.headers_blob)
        msgs.append(StreamMessage(partition, r.offset, r.key, headers, r.body, r.ts,
                                  headers.get(ID_HEADER) or f"{partition}-{r.offset}"))
    nxt = msgs[-1].offset + 1 if msgs and full else max(end, offset)
    return msgs, nxt, end
