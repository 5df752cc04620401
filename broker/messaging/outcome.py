"""One result, delivered once, to listeners that run at once.

An :class:`Outcome` is what an asyncio ``Future`` is to its awaiters, with one difference
that matters on the message path: its listeners run in the call that settles it, where a
Future's run a loop turn later.  A publish's confirm is sent from its commit's callback; one
more loop turn per batch is latency a loaded node adds to every confirm, and with a window of
batches in flight, throughput lost.  An Outcome is awaitable too (a forwarded publish awaits
the local one), through an asyncio Future made only when something awaits it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator
from typing import Any, Generic, Protocol, TypeVar

T = TypeVar("T")
T_contra = TypeVar("T_contra", contravariant=True)


class Reply(Protocol[T_contra]):
    """Where one result goes, settled once: an :class:`Outcome`, or a session's reply to its
    client sent in the call that settles it (no listener between the commit and the client)."""

    def done(self) -> bool: ...

    def set_result(self, value: T_contra) -> None: ...

    def set_exception(self, error: BaseException) -> None: ...


class Outcome(Generic[T]):
    __slots__ = ("_value", "_error", "_settled", "_listeners")

    def __init__(self) -> None:
        self._value: T | None = None
        self._error: BaseException | None = None
        self._settled = False
        self._listeners: list[Callable[[Outcome[T]], None]] = []

    @classmethod
    def failed(cls, error: BaseException) -> Outcome[T]:
        o: Outcome[T] = cls()
        o.set_exception(error)
        return o

    def done(self) -> bool:
        return self._settled

    def result(self) -> T:
        if not self._settled:
            raise asyncio.InvalidStateError("the outcome is not settled yet")
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]

    def exception(self) -> BaseException | None:
        if not self._settled:
            raise asyncio.InvalidStateError("the outcome is not settled yet")
        return self._error

    def set_result(self, value: T) -> None:
        self._settle(value, None)

    def set_exception(self, error: BaseException) -> None:
        self._settle(None, error)

    def _settle(self, value: T | None, error: BaseException | None) -> None:
        if self._settled:
            raise asyncio.InvalidStateError("the outcome is settled already")
        self._value, self._error, self._settled = value, error, True
        listeners, self._listeners = self._listeners, []
        for cb in listeners:
            cb(self)

    def add_done_callback(self, cb: Callable[[Outcome[T]], None]) -> None:
        """``cb(self)`` once settled: now if it is, else in the call that settles it."""
        if self._settled:
            cb(self)
        else:
            self._listeners.append(cb)

    def __await__(self) -> Generator[Any, None, T]:
        if not self._settled:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

            def wake(_o: Outcome[T]) -> None:
                if not fut.done():
                    fut.set_result(None)

            self._listeners.append(wake)
            yield from fut.__await__()
        return self.result()
