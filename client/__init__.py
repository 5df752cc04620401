"""Tandem client SDK: ``await client.connect(url)`` or ``client.blocking.connect(url)``.

``connect`` gives a durable connection (:mod:`client.durable`): it fails over to
another node of the URL's group, resends unconfirmed messages exactly once and
resubscribes consumers.  ``connect_link`` gives one plain link to one node.
"""

from __future__ import annotations

import ssl

from client.clock import SYSTEM_CLOCK, Clock
from client.connection import Connection, connect_link
from client.consumer import Consumer, Message
from client.durable import (
    DEFAULT_BUFFER_MAX_BYTES,
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_SEND_TIMEOUT,
    ConnectionEvent,
    DurableConnection,
    DurableConsumer,
    DurableMessage,
    DurableProducer,
    SendResult,
)
from client.producer import Producer
from client.url import ConnectParams, parse_url


async def connect(url: str, *, client_name: str | None = None, clock: Clock = SYSTEM_CLOCK,
                  send_timeout: float = DEFAULT_SEND_TIMEOUT, request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
                  buffer_path: str | None = None,
                  buffer_max_bytes: int = DEFAULT_BUFFER_MAX_BYTES,
                  ssl_context: ssl.SSLContext | None = None) -> DurableConnection:
    """A durable connection to the group of ``url`` (``tandem://user:pw@h1:7780,h2:7790``).

    ``send_timeout``: how long ``send`` may take across failovers before it raises.
    ``request_timeout``: the same for declare, status and the like.
    ``buffer_path``: a SQLite file that takes sends while no node is reachable (then
    ``connect`` returns even if none is), bounded by ``buffer_max_bytes``.
    ``ssl_context``: for ``tandems://``, the TLS context every link uses instead of one
    that trusts the URL's ``ca`` (or the system's CAs)."""
    params = parse_url(url)
    if client_name or ssl_context is not None:
        params = ConnectParams(**{**{k: getattr(params, k) for k in params.__dataclass_fields__},
                                  "client_name": client_name or params.client_name,
                                  "ssl_context": ssl_context or params.ssl_context})
    conn = DurableConnection(params, clock=clock, send_timeout=send_timeout, request_timeout=request_timeout,
                             buffer_path=buffer_path, buffer_max_bytes=buffer_max_bytes)
    await conn._open()
    return conn


__all__ = ["Connection", "ConnectionEvent", "Consumer", "DurableConnection", "DurableConsumer", "DurableMessage",
           "DurableProducer", "Message", "Producer", "SendResult", "connect", "connect_link"]
