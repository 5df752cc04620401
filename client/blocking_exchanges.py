"""Exchanges and bindings from the blocking client, as :mod:`client.exchanges` has them for the
asyncio one: a mixin of :class:`client.blocking.BlockingConnection` (``_call`` is its request,
resent after a failover where that is safe: every change here but a delete is idempotent)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from client.blocking_producer import BlockingProducer
from client.protocol.frames import (Bind, DeclareExchange, DeclareExchangeOk, DeleteExchange, ExchangeInfo, Exchanges,
                                    Frame, ListExchanges, Unbind, expect)


class BlockingExchanges:
    def _call(self, make: Any, *, retry: bool = True) -> Frame:
        raise NotImplementedError

    def declare_exchange(self, name: str, type: str = "direct", *, alternate: str | None = None) -> bool:
        """See :meth:`client.exchanges.ExchangeAdmin.declare_exchange`."""
        reply = self._call(lambda rid: DeclareExchange(rid=rid, exchange=name, type=type, alternate=alternate))
        return expect(reply, DeclareExchangeOk).created

    def delete_exchange(self, name: str, *, if_unused: bool = False) -> None:
        """Not resent after a failover: a retry could not tell "deleted now" from "never was"."""
        self._call(lambda rid: DeleteExchange(rid=rid, exchange=name, if_unused=if_unused), retry=False)

    def bind_queue(self, queue: str, exchange: str, routing_key: str = "", *,
                   arguments: Mapping[str, str] | None = None) -> None:
        self._call(lambda rid: Bind(rid=rid, source=exchange, destination=queue, routing_key=routing_key,
                                    arguments=dict(arguments or {})))

    def unbind_queue(self, queue: str, exchange: str, routing_key: str = "", *,
                     arguments: Mapping[str, str] | None = None) -> None:
        self._call(lambda rid: Unbind(rid=rid, source=exchange, destination=queue, routing_key=routing_key,
                                      arguments=dict(arguments or {})))

    def bind_exchange(self, destination: str, source: str, routing_key: str = "", *,
                      arguments: Mapping[str, str] | None = None) -> None:
        self._call(lambda rid: Bind(rid=rid, source=source, destination=destination, to_exchange=True,
                                    routing_key=routing_key, arguments=dict(arguments or {})))

    def unbind_exchange(self, destination: str, source: str, routing_key: str = "", *,
                        arguments: Mapping[str, str] | None = None) -> None:
        self._call(lambda rid: Unbind(rid=rid, source=source, destination=destination, to_exchange=True,
                                      routing_key=routing_key, arguments=dict(arguments or {})))

    def list_exchanges(self) -> list[ExchangeInfo]:
        return expect(self._call(lambda rid: ListExchanges(rid=rid)), Exchanges).exchanges

    def exchange_producer(self, exchange: str, routing_key: str = "", *, mandatory: bool = False,
                          producer_id: str | None = None) -> BlockingProducer:
        """A producer to ``exchange``: each ``send`` returns once every queue it is routed to
        stores it, resent after a failover under the same sequence numbers (stored once in
        each queue).  It keeps no local buffer."""
        return BlockingProducer(self, "", producer_id, exchange=exchange, routing_key=routing_key,  # type: ignore[arg-type]
                                mandatory=mandatory)
