"""Named consumers' offsets in a stream: where each consumer stopped reading, kept by the group.

A consumer stores the next offset it will read of a partition (``tandem`` SDK:
``store_offset``; Spark keeps its own in its checkpoint).  The offset is a *register* of the
partition's producer table (``message.REGISTER`` + the consumer's name -> the offset): the
table is written through the partition's log by ``PUT_PRODUCER``, stored by every replica,
carried in snapshots and loaded by a new active, so an offset survives a failover, a restart
and a member's rebuild as a producer's last sequence does, and needs no op of its own.  A
publish may not use such a producer id (broker.messaging.publish), and producer expiry never
sees the registers (``Partition.offsets`` holds them apart).

In a group the partition's active answers, as for a read: a request made on another member is
forwarded there.
"""

from __future__ import annotations

import re

from broker.messaging.forward import Forwarding, OffsetFwd, decode_reply
from broker.messaging.message import REGISTER
from broker.messaging.queues import Queue
from broker.messaging.streams import StreamHost, active_elsewhere
from client.errors import InvalidArgumentError, PartitionNotFoundError
from storage.base import PutProducer

CONSUMER_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")


def _partition(node: Forwarding, queue: str, partition: int, consumer: str) -> Queue:
    q = node.queue(queue)
    if not q.stream:
        raise InvalidArgumentError(f"queue {queue!r} is not a stream: named offsets are a stream's (a classic "
                                   f"queue's consumers ack what they took)")
    if not 0 <= partition < len(q.partitions):
        raise PartitionNotFoundError(f"queue {queue!r} has no partition {partition}")
    if not CONSUMER_NAME.match(consumer):
        raise InvalidArgumentError(f"consumer {consumer!r}: 1-128 characters from A-Z a-z 0-9 _ . : -")
    return q


async def store_offset(node: StreamHost, queue: str, partition: int, consumer: str, offset: int,
                       *, hops: int = 0) -> None:
    """Commit ``offset`` as ``consumer``'s in the partition (on its active)."""
    q = _partition(node, queue, partition, consumer)
    who = await active_elsewhere(node, q, partition, hops)
    if who is not None:
        await node.forward(who, OffsetFwd(hops + 1, queue, partition, consumer, True, offset))
        return
    part = q.partitions[partition]
    if not 0 <= offset <= part.committed_end:
        raise InvalidArgumentError(f"offset {offset}: must be 0..{part.committed_end} (the end of "
                                   f"{queue}/{partition})")
    generation = part.generation
    await node.commit_ops((q.meta.id, partition), [PutProducer(q.meta.id, partition, REGISTER + consumer, offset)])
    if part.generation == generation:  # (still served here as it was: the copy in memory follows)
        part.offsets[consumer] = offset


async def fetch_offset(node: Forwarding, queue: str, partition: int, consumer: str, *, hops: int = 0) -> int | None:
    """The offset ``consumer`` stored in the partition (None: none)."""
    q = _partition(node, queue, partition, consumer)
    who = await active_elsewhere(node, q, partition, hops)
    if who is not None:
        reply = decode_reply(await node.forward(who, OffsetFwd(hops + 1, queue, partition, consumer, False, 0)))
        if not (isinstance(reply, list) and len(reply) == 2 and type(reply[0]) is bool and type(reply[1]) is int):
            raise InvalidArgumentError("forwarded OFFSET: the reply is not [found, offset]")
        return reply[1] if reply[0] else None
    return q.partitions[partition].offsets.get(consumer)
