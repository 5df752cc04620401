"""Exchanges and bindings from the asyncio client: declare, delete, bind, unbind, list.

:class:`ExchangeAdmin` is a mixin of :class:`client.connection.Connection`
(``await conn.declare_exchange("orders", "topic")``): :meth:`request` is the connection's.
Publishing to an exchange is a producer's (``conn.exchange_producer("orders")``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from client.protocol.frames import (Bind, DeclareExchange, DeclareExchangeOk, DeleteExchange, ExchangeInfo, Exchanges,
                                    Frame, ListExchanges, Unbind, expect)


class ExchangeAdmin:
    """Exchanges (``direct``, ``fanout``, ``topic``, ``headers``) and their bindings, the
    group's (docs/messaging.md).  Each change needs ``configure`` on what it changes."""

    async def request(self, make: Callable[[int], Frame]) -> Frame:
        raise NotImplementedError

    async def declare_exchange(self, name: str, type: str = "direct", *, alternate: str | None = None) -> bool:
        """Create exchange ``name``; True if it is new (the same type and alternate: the
        existing one; others: ExchangeExistsError).  ``alternate``: an exchange, declared
        first, that gets the messages none of this one's bindings take."""
        reply = await self.request(lambda rid: DeclareExchange(rid=rid, exchange=name, type=type,
                                                               alternate=alternate))
        return expect(reply, DeclareExchangeOk).created

    async def delete_exchange(self, name: str, *, if_unused: bool = False) -> None:
        """Delete exchange ``name`` and every binding from or to it (``if_unused``: refused
        while it has bindings)."""
        await self.request(lambda rid: DeleteExchange(rid=rid, exchange=name, if_unused=if_unused))

    async def bind_queue(self, queue: str, exchange: str, routing_key: str = "", *,
                         arguments: Mapping[str, str] | None = None) -> None:
        """Messages published to ``exchange`` that match ``routing_key`` (a ``direct`` key, a
        ``topic`` pattern with ``*`` and ``#``) or ``arguments`` (a ``headers`` exchange's
        headers, with ``x-match``: ``all`` or ``any``) go to ``queue`` too."""
        await self.request(lambda rid: Bind(rid=rid, source=exchange, destination=queue, routing_key=routing_key,
                                            arguments=dict(arguments or {})))

    async def unbind_queue(self, queue: str, exchange: str, routing_key: str = "", *,
                           arguments: Mapping[str, str] | None = None) -> None:
        await self.request(lambda rid: Unbind(rid=rid, source=exchange, destination=queue, routing_key=routing_key,
                                              arguments=dict(arguments or {})))

    async def bind_exchange(self, destination: str, source: str, routing_key: str = "", *,
                            arguments: Mapping[str, str] | None = None) -> None:
        """Messages published to exchange ``source`` that match are routed by exchange
        ``destination`` in turn."""
        await self.request(lambda rid: Bind(rid=rid, source=source, destination=destination, to_exchange=True,
                                            routing_key=routing_key, arguments=dict(arguments or {})))

    async def unbind_exchange(self, destination: str, source: str, routing_key: str = "", *,
                              arguments: Mapping[str, str] | None = None) -> None:
        await self.request(lambda rid: Unbind(rid=rid, source=source, destination=destination, to_exchange=True,
                                              routing_key=routing_key, arguments=dict(arguments or {})))

    async def list_exchanges(self) -> list[ExchangeInfo]:
        """The exchanges this user may see, each with the bindings from it."""
        return expect(await self.request(lambda rid: ListExchanges(rid=rid)), Exchanges).exchanges
