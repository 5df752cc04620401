"""What a durable connection tells its application: connection events and send results."""

from __future__ import annotations

from dataclasses import dataclass

from client.errors import TandemError


@dataclass(frozen=True, slots=True)
class ConnectionEvent:
    """What happened to a durable connection.

    ``kind``: ``connected`` (first link up), ``disconnected`` (a link failed),
    ``failed_over`` (the primary link moved to ``node``), ``buffering`` (a send went to
    the local buffer), ``drained`` (the buffer is empty again), ``buffer_blocked`` (a
    node refused buffered messages; they stay in the buffer), ``messages_lost``
    (``error`` is the :class:`~client.errors.ConfirmedMessagesLost`)."""

    kind: str
    node: str = ""
    detail: str = ""
    error: TandemError | None = None


@dataclass(frozen=True, slots=True)
class SendResult:
    """What ``send`` returns: where the message went, or that it waits in the local buffer."""

    partition: int
    seq: int
    buffered: bool = False
    duplicate: bool = False
