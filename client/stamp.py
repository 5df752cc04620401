"""Message bodies stamped for load tests: the send time and a unique id up front.

    body = MAGIC (4 bytes) | sent_at (float64, seconds since the epoch) | producer (8 bytes) | n (uint64)
           | padding up to the body size

``producer`` is random per sending user, ``n`` counts its messages from 0: together they name
one send (what the soak's checker counts).  The wall clock, not a monotonic one: the
consumer that measures publish-to-delivery time is another process on the same machine.
No third-party imports: the soak's asyncio side reads these bodies without locust or gevent.
"""

from __future__ import annotations

import os
import struct
from typing import NamedTuple

MAGIC = b"TLD1"
_HEAD = struct.Struct(">4sd8sQ")
HEADER_SIZE = _HEAD.size  # 28


class Stamp(NamedTuple):
    sent_at: float
    producer: bytes
    n: int

    @property
    def key(self) -> bytes:
        """The 16 bytes naming this send: producer + n."""
        return self.producer + self.n.to_bytes(8, "big")


def new_producer() -> bytes:
    return os.urandom(8)


def stamp(sent_at: float, producer: bytes, n: int, size: int) -> bytes:
    """A body of ``size`` bytes (at least :data:`HEADER_SIZE`)."""
    head = _HEAD.pack(MAGIC, sent_at, producer, n)
    return head + b"." * (size - len(head))


def read_stamp(body: bytes) -> Stamp | None:
    """The stamp of ``body``, or None if it carries none (a message someone else sent)."""
    if len(body) < HEADER_SIZE or body[:4] != MAGIC:
        return None
    _magic, sent_at, producer, n = _HEAD.unpack_from(body)
    return Stamp(sent_at, producer, n)
