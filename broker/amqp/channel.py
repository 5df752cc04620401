"""One AMQP channel's state: its confirm or tx mode, prefetch, consumers and delivery tags.

AMQP numbers deliveries per channel; the node numbers them per connection (the session's
tags).  A channel maps its own delivery tags to the session's, in order, so ``multiple``
settles "every tag up to this one" on this channel alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from collections import deque
from dataclasses import dataclass, field
from typing import Literal, Protocol

from client.protocol.frames import Delivery


class Reading(Protocol):
    """A stream consumer's reader (broker.amqp.streams): acks give it room; a cancel stops it."""

    def acked(self, n: int) -> None: ...

    def stop(self) -> None: ...


@dataclass
class ChannelConsumer:
    tag: str  # the client's consumer tag
    queue: str
    no_ack: bool
    stream: Reading | None = None  # a stream's consumer: its reader (it has no consumer on the node)


@dataclass(frozen=True, slots=True)
class TxSettle:
    """A settlement in tx mode, held by the channel until ``tx.commit`` (broker.amqp.transactions)."""
    tag: int  # the channel's
    session_tag: int
    kind: Literal["ack", "requeue", "reject"]


@dataclass
class Channel:
    number: int
    prefetch: int = 0  # basic.qos prefetch_count for the consumers made after it (0: no limit)
    #: basic.qos global: unacked deliveries on the whole channel at most (0: no limit)
    shared_prefetch: int = 0
    #: deliveries the node made to the channel's consumers that wait for room under ``shared_prefetch``
    waiting: deque[tuple[int, Delivery]] = field(default_factory=deque)
    confirming: bool = False  # confirm.select: each publish is acked (or nacked) by its number
    published: int = 0  # publishes since confirm.select (their numbers)
    acked: int = 0  # every publish up to this number has had its basic.ack or basic.nack
    #: publishes settled beyond ``acked`` (not yet answered): first number -> (last, stored)
    _settled: dict[int, tuple[int, bool]] = field(default_factory=dict)
    closing: bool = False  # channel.close sent: everything but close-ok is dropped
    consumers: dict[int, ChannelConsumer] = field(default_factory=dict)  # by the node's consumer id
    #: this channel's delivery tags -> the session's, unsettled, in order
    tags: dict[int, int] = field(default_factory=dict)
    next_tag: int = 1
    #: this channel's delivery tags of stream consumers' deliveries, unacked -> their reader
    stream_tags: dict[int, Reading] = field(default_factory=dict)
    deleting: set[str] = field(default_factory=set)  # queue.delete asked on it and not answered yet
    #: the tags of its consumers that queue.delete on it ended: basic.cancel after its delete-ok
    cancelled_by_delete: list[str] = field(default_factory=list)
    tx: str = ""  # tx.select: the transaction its publishes and settlements are part of now
    tx_settles: list[TxSettle] = field(default_factory=list)  # settled in tx mode, until tx.commit
    unstored: int = 0  # publish requests of the channel not answered yet (stored, or refused)
    _stored: asyncio.Event | None = None

    def deliver(self, session_tag: int) -> int:
        """The channel's tag for a delivery of the session's tag ``session_tag``."""
        tag = self.next_tag
        self.next_tag += 1
        self.tags[tag] = session_tag
        return tag

    def deliver_stream(self, reader: Reading) -> int:
        """The channel's tag for a stream consumer's delivery (acked to its reader, not the node)."""
        tag = self.next_tag
        self.next_tag += 1
        self.stream_tags[tag] = reader
        return tag

    def settle_streams(self, tag: int, multiple: bool) -> int:
        """Settle stream consumers' deliveries among ``tag`` (``multiple``: up to it, 0: all):
        room for their readers.  How many."""
        done = [t for t in self.stream_tags if tag == 0 or t <= tag] if multiple else \
            [tag] if tag in self.stream_tags else []
        for t in done:
            self.stream_tags.pop(t).acked(1)
        return len(done)

    def settle(self, tag: int, multiple: bool) -> list[int]:
        """The session's tags settled by the client's ``tag`` (0 with ``multiple``: all of them)."""
        if multiple:
            done = [t for t in self.tags if tag == 0 or t <= tag]
        else:
            done = [tag] if tag in self.tags else []
        return [self.tags.pop(t) for t in done]

    def settled(self, first: int, last: int, *, stored: bool) -> int:
        """Publishes ``first``..``last`` (confirm mode) are stored, or refused (nacked already):
        the number to ack now with ``multiple`` (every one before it is answered), 0: none yet.
        Publishes to different partitions are stored in any order; the acks go out in order."""
        self._settled[first] = (last, stored)
        top = 0
        while (nxt := self._settled.pop(self.acked + 1, None)) is not None:
            self.acked, ok = nxt
            if ok:
                top = self.acked
        return top

    def unsettle(self, settles: list[TxSettle]) -> None:
        """A rolled-back transaction's settlements: unsettled again, in tag order."""
        self.tags.update((t.tag, t.session_tag) for t in settles)
        self.tags = dict(sorted(self.tags.items()))

    def publishing(self, delta: int) -> None:
        """One more (+1) or one fewer (-1) publish request of the channel not answered yet."""
        self.unstored += delta
        if self.unstored == 0 and self._stored is not None:
            self._stored.set()
            self._stored = None

    def close(self) -> None:
        """The channel closes (or its connection does): nothing waits on it any more."""
        self.closing = True
        if self._stored is not None:
            self._stored.set()

    async def stored(self) -> None:
        """Until every publish made on the channel so far is stored (or refused), or the channel
        closes: what the channel asks next sees them, as AMQP orders a channel's methods."""
        if self.unstored and not self.closing:
            if self._stored is None:
                self._stored = asyncio.Event()
            await self._stored.wait()

    def room(self) -> bool:
        """Whether one more delivery may go to the client under ``shared_prefetch``."""
        return not self.shared_prefetch or len(self.tags) < self.shared_prefetch

    def consumer_id(self, tag: str) -> int | None:
        return next((cid for cid, c in self.consumers.items() if c.tag == tag), None)

    def unsettled(self) -> Iterator[int]:
        return iter(list(self.tags.values()))
