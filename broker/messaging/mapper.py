"""Data mappers live in :mod:`client.mapper`: a durable connection maps messages to
partitions itself, with exactly the broker's code."""

import logging

from client.errors import InvalidArgumentError
from client.mapper import (DEFAULT_MAPPER, MAPPERS, ConsistentHashMapper, DataMapper, JumpHashMapper, MissingMapper,
                           RoundRobinMapper, make_mapper, mapper_names)

__all__ = ["DEFAULT_MAPPER", "MAPPERS", "ConsistentHashMapper", "DataMapper", "JumpHashMapper", "RoundRobinMapper",
           "make_mapper", "mapper_names", "queue_mapper", "dead_letter_partition", "parse_static"]

log = logging.getLogger("tandem.broker")


def queue_mapper(queue: str, name: str, partitions: int, ring_size: int) -> DataMapper:
    """An existing queue's mapper; one that is not installed on this node (a custom mapper)
    is logged and refuses keyed publishes, so the queue and the node still load."""
    try:
        return make_mapper(name, partitions, ring_size)
    except InvalidArgumentError as exc:
        log.error("queue %s: %s: its keyed publishes are refused on this node until it is", queue, exc.message)
        return MissingMapper(name, partitions, f"queue {queue!r}: {exc.message}")


def dead_letter_partition(dlq: str, mapper: DataMapper, partitions: int, key: str | None) -> int:
    """The partition of the dead-letter queue ``dlq`` a message with ``key`` goes to: its
    mapper's, or where the default mapper puts the key when that mapper refuses it (a custom
    mapper failing or missing): a dead letter is not lost to a plug-in's error."""
    try:
        return mapper.partition(key)
    except InvalidArgumentError as exc:
        log.warning("dead-letter queue %s: %s: placed by %s instead", dlq, exc.message, DEFAULT_MAPPER)
        return JumpHashMapper(partitions).partition(key)


def parse_static(text: str, partitions: int) -> tuple[tuple[str, ...], ...]:
    """A declare's ``placement``: one node list per partition, lists separated by ``;``,
    nodes by ``,`` ("node1,node2,node3:async;node2,node3,node1").  InvalidArgumentError
    unless it gives exactly ``partitions`` lists (the members are checked where the
    declare commits)."""
    lists = tuple(tuple(n.strip() for n in part.split(",") if n.strip()) for part in text.split(";"))
    if len(lists) != partitions:
        raise InvalidArgumentError(f"placement: {len(lists)} node list(s) for {partitions} partition(s): give one "
                                   f"per partition, separated by ';' (node1,node2;node2,node1)")
    for p, nodes in enumerate(lists):
        if not nodes:
            raise InvalidArgumentError(f"placement: partition {p} has no nodes")
    return lists
