"""One AMQP channel's state: its confirm mode, prefetch, consumers and delivery tags.

AMQP numbers deliveries per channel; the node numbers them per connection (the session's
tags).  A channel maps its own delivery tags to the session's, in order, so ``multiple``
settles "every tag up to this one" on this channel alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass
class ChannelConsumer:
    tag: str  # the client's consumer tag
    queue: str
    no_ack: bool


@dataclass
class Channel:
    number: int
    prefetch: int = 0  # basic.qos prefetch_count for the consumers made after it (0: no limit)
    confirming: bool = False  # confirm.select: each publish is acked (or nacked) by its number
    published: int = 0  # publishes since confirm.select (their numbers)
    closing: bool = False  # channel.close sent: everything but close-ok is dropped
    consumers: dict[int, ChannelConsumer] = field(default_factory=dict)  # by the node's consumer id
    #: this channel's delivery tags -> the session's, unsettled, in order
    tags: dict[int, int] = field(default_factory=dict)
    next_tag: int = 1

    def deliver(self, session_tag: int) -> int:
        """The channel's tag for a delivery of the session's tag ``session_tag``."""
        tag = self.next_tag
        self.next_tag += 1
        self.tags[tag] = session_tag
        return tag

    def settle(self, tag: int, multiple: bool) -> list[int]:
        """The session's tags settled by the client's ``tag`` (0 with ``multiple``: all of them)."""
        if multiple:
            done = [t for t in self.tags if tag == 0 or t <= tag]
        else:
            done = [tag] if tag in self.tags else []
        return [self.tags.pop(t) for t in done]

    def consumer_id(self, tag: str) -> int | None:
        return next((cid for cid, c in self.consumers.items() if c.tag == tag), None)

    def unsettled(self) -> Iterator[int]:
        return iter(list(self.tags.values()))
