"""What the request handlers of a client session share: the session as they see it, the Error frame.

A handler is called with the session, the user it logged in as and the request's frame
(:data:`Handler`); each handler module names what it uses of the session in a Protocol of its
own, :class:`Requester` being the common part.  :func:`error_frame` is the ``Error`` that
answers a request with a :class:`~client.errors.TandemError`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

from client.errors import TandemError
from client.protocol.frames import Error, Frame
from storage.base import UserRecord

S = TypeVar("S", contravariant=True)

#: one request's handler: (the session, its user, the frame) -> None, once the reply is sent or due
Handler = Callable[[S, UserRecord, Any], Awaitable[None]]


class Requester(Protocol):
    """A client session as a request handler sees it: it answers at once or in order."""

    client_name: str

    def send(self, frame: Frame) -> None: ...

    def send_in_order(self, frame: Frame) -> None:
        """Send now, unless frames waiting on a commit must go first."""
        ...


class Requests(Protocol[S]):
    """A group of request handlers (one module's), by the frame each answers."""

    def handlers(self) -> Mapping[type[Frame], Handler[S]]: ...


def error_frame(rid: int, exc: TandemError) -> Error:
    """The Error frame that answers request ``rid`` with ``exc``."""
    return Error(rid=rid, code=int(exc.code), message=exc.message, active_hint=getattr(exc, "active_hint", None),
                 next_seq=getattr(exc, "next_seq", None))
