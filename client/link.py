"""What producers, consumers and messages need of the connection they run on, and what a
connection needs of a consumer: two typing Protocols.

:class:`client.connection.Connection` builds producers and consumers, and they talk back
to it; with these Protocols between them, :mod:`client.producer` and :mod:`client.consumer`
import nothing of :mod:`client.connection`, and the imports point one way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from client.clock import Clock
from client.errors import TandemError
from client.protocol.frames import Delivery, Frame, StatusOk


class Subscriber(Protocol):
    """A consumer as its connection sees it: the connection hands it deliveries and says
    when its subscription ended."""

    queue: str
    prefetch: int
    local: bool  # only the partitions active on the connection's node (Subscribe.local)
    consumer_id: int | None

    def _deliver(self, deliveries: list[Delivery]) -> None: ...

    def _closed(self, exc: TandemError) -> None: ...

    def _return_unseen(self) -> None:
        """Give back (uncounted) what arrived but was never handed out."""


class Link(Protocol):
    """One open link to one node, as producers, consumers and messages use it."""

    clock: Clock
    node: str | None
    max_message_size: int
    max_frame_size: int
    closed_by_client: bool
    closed_event: asyncio.Event

    @property
    def is_closed(self) -> bool: ...

    @property
    def close_error(self) -> TandemError | None:
        """Why the link closed (None while it is open)."""

    def next_rid(self) -> int: ...

    def request_nowait(self, frame: Frame) -> asyncio.Future[Frame]: ...

    async def request(self, make: Callable[[int], Frame]) -> Frame: ...

    async def status(self) -> StatusOk: ...

    async def sibling(self, name: str, address: str) -> Link: ...

    async def subscribe(self, c: Subscriber) -> int: ...

    def _unregister(self, consumer_id: int) -> None: ...

    def settle(self, kind: type, tag: int, requeue: bool = True, *, delivered: bool = True,
               multiple: bool = False) -> asyncio.Future[None]: ...
