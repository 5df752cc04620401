"""What a declare may ask for: the checks every member runs on a ``Declare`` before it acts on it
(the client's session, a forwarded declare, the console's form).  The stores keep the numbers as
signed 64-bit integers."""

from __future__ import annotations

import re

from broker.messaging.exchanges import EXCHANGE_NAME, MAX_ROUTING_KEY
from broker.messaging.mapper import MAPPERS, make_mapper, mapper_names
from client.errors import InvalidArgumentError
from client.protocol.frames import Declare

QUEUE_NAME = re.compile(r"^[A-Za-z0-9_.:@\-]{1,255}$")
MAX_PARTITIONS = 1024
MAX_RING_SIZE = 1 << 20
#: characters of a declare's explicit node lists (``static`` distribution)
MAX_PLACEMENT = 256 * 1024
#: the longest time to live or delay, in milliseconds (2**32 - 1: 49.7 days, as RabbitMQ's)
MAX_DELAY_MS = 2**32 - 1
#: what a publish past a queue's max_length or max_length_bytes does (broker.messaging.limits)
OVERFLOWS = ("reject-publish", "drop-head")
#: a queue's types: a classic queue's consumed messages go, a stream's stay (broker.messaging.retention)
QUEUE_TYPES = ("classic", "stream")


MAX_INT64 = 2**63 - 1


def validate_declare(frame: Declare) -> None:
    """Raise InvalidArgumentError naming the first bad field of a declare."""
    if not QUEUE_NAME.match(frame.queue):
        raise InvalidArgumentError(
            f"queue name {frame.queue!r}: 1-255 characters from A-Z a-z 0-9 _ . : - @"
        )
    if not 1 <= frame.partitions <= MAX_PARTITIONS:
        raise InvalidArgumentError(f"partitions {frame.partitions}: must be 1..{MAX_PARTITIONS}")
    if frame.mapper and frame.mapper not in mapper_names():
        raise InvalidArgumentError(f"mapper {frame.mapper!r}: choose {', '.join(mapper_names())} (a custom mapper "
                                   f"is an installed package's 'tandem.mappers' entry point)")
    if not frame.partitions <= frame.ring_size <= MAX_RING_SIZE:
        raise InvalidArgumentError(f"ring_size {frame.ring_size}: must be partitions..{MAX_RING_SIZE}")
    if frame.mapper and frame.mapper not in MAPPERS:
        make_mapper(frame.mapper, frame.partitions, frame.ring_size)  # a custom one must load: its error if not
    # (the stores keep them as signed 64-bit integers)
    if not 0 <= frame.max_deliveries <= MAX_INT64:
        raise InvalidArgumentError(f"max_deliveries: must be 0..{MAX_INT64} (0 = unlimited)")
    if not 0 <= frame.max_length <= MAX_INT64:
        raise InvalidArgumentError(f"max_length: must be 0..{MAX_INT64} (0 = unlimited)")
    if not 0 <= frame.max_length_bytes <= MAX_INT64:
        raise InvalidArgumentError(f"max_length_bytes: must be 0..{MAX_INT64} (0 = unlimited)")
    if not 0 <= frame.message_ttl <= MAX_DELAY_MS:
        raise InvalidArgumentError(f"message_ttl: must be 0..{MAX_DELAY_MS} milliseconds (0 = for ever)")
    if not 0 <= frame.expires <= MAX_DELAY_MS:
        raise InvalidArgumentError(f"expires: must be 0..{MAX_DELAY_MS} milliseconds (0 = never)")
    if frame.overflow not in OVERFLOWS:
        raise InvalidArgumentError(f"overflow {frame.overflow!r}: one of {', '.join(OVERFLOWS)}")
    if frame.type not in QUEUE_TYPES:
        raise InvalidArgumentError(f"type {frame.type!r}: one of {', '.join(QUEUE_TYPES)}")
    if not 0 <= frame.max_age <= MAX_INT64 or not 0 <= frame.max_bytes <= MAX_INT64:
        raise InvalidArgumentError(f"max_age and max_bytes: must be 0..{MAX_INT64} (0 = no bound)")
    if frame.type == "stream":
        _check_stream(frame)
    elif frame.max_age or frame.max_bytes:
        raise InvalidArgumentError("max_age and max_bytes are a stream's retention: declare it with type stream "
                                   "(a classic queue is bounded by max_length, max_length_bytes and message_ttl)")
    if len(frame.placement) > MAX_PLACEMENT:
        raise InvalidArgumentError(f"placement: at most {MAX_PLACEMENT} characters")
    dlq = frame.dead_letter_queue
    if dlq is not None:
        if not QUEUE_NAME.match(dlq):
            raise InvalidArgumentError(f"dead_letter_queue {dlq!r}: not a valid queue name")
        if dlq == frame.queue:
            raise InvalidArgumentError("dead_letter_queue: a queue cannot dead-letter into itself")
    dlx, dlk = frame.dead_letter_exchange, frame.dead_letter_routing_key
    if dlx is not None:
        if dlq is not None:
            raise InvalidArgumentError("dead_letter_exchange and dead_letter_queue: give one (where its dead letters "
                                       "go: through an exchange, or into a queue)")
        if not EXCHANGE_NAME.match(dlx):
            raise InvalidArgumentError(f"dead_letter_exchange {dlx!r}: not a valid exchange name (a queue by its name: "
                                       f"dead_letter_queue)")
    if dlk is not None:
        if dlx is None:
            raise InvalidArgumentError("dead_letter_routing_key: only with a dead_letter_exchange")
        if len(dlk) > MAX_ROUTING_KEY:
            raise InvalidArgumentError(f"dead_letter_routing_key: at most {MAX_ROUTING_KEY} characters")


def _check_stream(frame: Declare) -> None:
    """A stream keeps what is published until its retention drops it: nothing of a classic
    queue's consuming, bounds or dead letters applies."""
    asked = [name for name, value, default in (
        ("max_deliveries", frame.max_deliveries, 0), ("dead_letter_queue", frame.dead_letter_queue, None),
        ("dead_letter_exchange", frame.dead_letter_exchange, None),
        ("max_length", frame.max_length, 0), ("max_length_bytes", frame.max_length_bytes, 0),
        ("overflow", frame.overflow, "reject-publish"), ("message_ttl", frame.message_ttl, 0))
        if value != default]
    if asked:
        raise InvalidArgumentError(f"{', '.join(asked)}: not for a stream (its messages are read by offset and "
                                   f"kept until its retention, max_age and max_bytes, drops them)")
