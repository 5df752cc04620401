"""The durable connection as the application uses it: requests that are not about one
partition, producers and consumers, and close.  Its links and failover are
:class:`~client.durable.links.DurableLinks`."""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any
from collections.abc import Callable, Mapping

from client.durable.consumer import DurableConsumer
from client.durable.exchange import DurableExchangeProducer
from client.durable.links import DurableLinks
from client.durable.producer import DurableProducer
from client.errors import ConnectionClosedError, TandemError
from client.transactions import Producer, Transaction, TransactionScope
from client.protocol.frames import AclInfo, Frame, ExchangeInfo, QueueInfo, StatusOk, StreamMessage, UserInfo


class _AnyLink:
    """Requests through the durable connection's primary link, asked again after a failover."""

    def __init__(self, conn: DurableLinks) -> None:
        self._links = conn
        self.clock = conn.clock

    async def request(self, make: Callable[[int], Frame]) -> Frame:
        return await self._links._call(lambda c: c.request(make))


class DurableConnection(DurableLinks):
    """A client that rides through failovers (see :mod:`client.durable`)."""

    _tx_producers: dict[str, Producer]  # (transactions: the producers it started)
    _tx_starting: asyncio.Lock

    # -- requests that are not about one partition ---------------------------------------------

    async def declare_queue(self, name: str, **settings: Any) -> QueueInfo:
        """Create ``name`` (idempotent); see :meth:`Connection.declare_queue`."""
        return await self._call(lambda c: c.declare_queue(name, **settings))

    async def delete_queue(self, name: str, *, if_empty: bool = False) -> None:
        """Not retried once sent: a retry could not tell "deleted just now" from "never was"."""
        await self._call(lambda c: c.delete_queue(name, if_empty=if_empty), retry=False)

    async def purge_queue(self, name: str) -> int:
        return await self._call(lambda c: c.purge_queue(name), retry=False)

    async def list_queues(self) -> list[QueueInfo]:
        return await self._call(lambda c: c.list_queues())

    async def status(self) -> StatusOk:
        return await self._call(lambda c: c.status())

    async def set_quorum_override(self, nodes: int | None) -> StatusOk:
        return await self._call(lambda c: c.set_quorum_override(nodes))

    async def set_priority(self, priority: int) -> StatusOk:
        return await self._call(lambda c: c.set_priority(priority))

    async def drain_node(self, node: str, drained: bool = True) -> StatusOk:
        return await self._call(lambda c: c.drain_node(node, drained))

    async def move_partition(self, queue: str, partition: int, nodes: list[str]) -> StatusOk:
        return await self._call(lambda c: c.move_partition(queue, partition, nodes))

    async def set_designated_primary(self, on: bool) -> StatusOk:
        return await self._call(lambda c: c.set_designated_primary(on))

    # -- transactions (client.transactions) ---------------------------------------------------

    def transaction(self, transactional_id: str) -> TransactionScope:
        """``async with conn.transaction("app") as tx:``: see
        :meth:`client.transactions.TransactionAdmin.transaction`.  Its publishes go through the
        connection's primary link, its acks through the link each message came on, and its end
        through whichever link is primary then (asked again after a failover: the first decision
        on a transaction stands).  A publish or an ack that failed with its link fails the
        transaction; if that link's closing aborted it first, the commit raises
        TransactionAbortedError: run it again."""
        return TransactionScope(self.begin, transactional_id)

    async def begin(self, transactional_id: str) -> Transaction:
        producer = await self.init_producer(transactional_id)
        return Transaction(await self.primary(), producer.next_id(), ender=_AnyLink(self))

    async def init_producer(self, transactional_id: str, *, again: bool = False) -> Producer:
        """Start the producer once for the connection (or ``again``): its epoch goes up, fencing
        any earlier instance; it stays this connection's across failovers.  See
        :meth:`client.transactions.TransactionAdmin.init_producer`."""
        if not hasattr(self, "_tx_producers"):
            self._tx_producers, self._tx_starting = {}, asyncio.Lock()
        async with self._tx_starting:
            producer = self._tx_producers.get(transactional_id)
            if producer is None or again:
                producer = await self._call(lambda c: c.init_producer(transactional_id, again=True))
                self._tx_producers[transactional_id] = producer
        return producer

    async def create_user(self, name: str, password: str, role: str = "user") -> None:
        """Not retried once sent: a retry could not tell "created just now" from "exists"."""
        await self._call(lambda c: c.create_user(name, password, role), retry=False)

    async def change_password(self, name: str, password: str) -> None:
        await self._call(lambda c: c.change_password(name, password))

    async def delete_user(self, name: str) -> None:
        await self._call(lambda c: c.delete_user(name), retry=False)

    async def list_users(self) -> list[UserInfo]:
        return await self._call(lambda c: c.list_users())

    async def grant(self, user: str, pattern: str, permissions: list[str]) -> None:
        await self._call(lambda c: c.grant(user, pattern, permissions))

    async def revoke(self, user: str, pattern: str, permissions: list[str]) -> None:
        await self._call(lambda c: c.revoke(user, pattern, permissions))

    async def list_acls(self, user: str | None = None) -> list[AclInfo]:
        return await self._call(lambda c: c.list_acls(user))

    async def read(self, queue: str, partition: int, offset: int | str = 0, max_messages: int = 1000, *,
                   timestamp: float | None = None) -> tuple[list[StreamMessage], int, int]:
        """See :meth:`client.streams.StreamAdmin.read`."""
        return await self._call(lambda c: c.read(queue, partition, offset, max_messages, timestamp=timestamp))

    # -- streams (client.streams): each is idempotent, retried -------------------------------------

    async def declare_stream(self, name: str, **settings: Any) -> QueueInfo:
        """See :meth:`client.streams.StreamAdmin.declare_stream`."""
        return await self._call(lambda c: c.declare_stream(name, **settings))

    async def store_offset(self, queue: str, consumer: str, partition: int, offset: int) -> None:
        await self._call(lambda c: c.store_offset(queue, consumer, partition, offset))

    async def fetch_offset(self, queue: str, consumer: str, partition: int) -> int | None:
        return await self._call(lambda c: c.fetch_offset(queue, consumer, partition))

    # -- exchanges and bindings (client.exchanges): each change is idempotent, retried ------------

    async def declare_exchange(self, name: str, type: str = "direct", *, alternate: str | None = None) -> bool:
        return await self._call(lambda c: c.declare_exchange(name, type, alternate=alternate))

    async def delete_exchange(self, name: str, *, if_unused: bool = False) -> None:
        """Not retried once sent: a retry could not tell "deleted just now" from "never was"."""
        await self._call(lambda c: c.delete_exchange(name, if_unused=if_unused), retry=False)

    async def bind_queue(self, queue: str, exchange: str, routing_key: str = "", *,
                         arguments: Mapping[str, str] | None = None) -> None:
        await self._call(lambda c: c.bind_queue(queue, exchange, routing_key, arguments=arguments))

    async def unbind_queue(self, queue: str, exchange: str, routing_key: str = "", *,
                           arguments: Mapping[str, str] | None = None) -> None:
        await self._call(lambda c: c.unbind_queue(queue, exchange, routing_key, arguments=arguments))

    async def bind_exchange(self, destination: str, source: str, routing_key: str = "", *,
                            arguments: Mapping[str, str] | None = None) -> None:
        await self._call(lambda c: c.bind_exchange(destination, source, routing_key, arguments=arguments))

    async def unbind_exchange(self, destination: str, source: str, routing_key: str = "", *,
                              arguments: Mapping[str, str] | None = None) -> None:
        await self._call(lambda c: c.unbind_exchange(destination, source, routing_key, arguments=arguments))

    async def list_exchanges(self) -> list[ExchangeInfo]:
        return await self._call(lambda c: c.list_exchanges())

    async def get(self, queue: str, *, auto_ack: bool = False) -> Any:
        """One message from the primary link's node, or None (not retried once sent)."""
        return await self._call(lambda c: c.get(queue, auto_ack=auto_ack), retry=False)

    # -- producers and consumers ---------------------------------------------------------------

    def producer(self, queue: str, *, producer_id: str | None = None, max_batch: int = 256,
                 max_in_flight: int = 16, send_timeout: float | None = None) -> DurableProducer:
        """A producer that sends each partition's messages to its active and resends across
        failovers.  Give ``producer_id`` to continue an earlier producer (its buffer, its
        sequences); by default a new random one."""
        p = DurableProducer(self, queue, producer_id=producer_id, max_batch=max_batch,
                            max_in_flight=max_in_flight, send_timeout=send_timeout or self.send_timeout)
        self._producers.add(p)
        return p

    def exchange_producer(self, exchange: str, routing_key: str = "", *, mandatory: bool = False,
                          producer_id: str | None = None, max_batch: int = 256) -> DurableExchangeProducer:
        """A producer to ``exchange`` that resends across failovers, each message stored once in
        every queue it is routed to (client.durable.exchange); see
        :meth:`Connection.exchange_producer`."""
        return DurableExchangeProducer(self, exchange, routing_key, mandatory=mandatory, producer_id=producer_id,
                                       max_batch=max_batch)

    def consumer(self, queue: str, *, prefetch: int = 256) -> DurableConsumer:
        """A consumer of the whole queue: every member's partitions, resubscribed after failures."""
        c = DurableConsumer(self, queue, prefetch=prefetch)
        self._consumers.add(c)
        return c

    group_consumer = consumer

    # -- close -----------------------------------------------------------------------------------

    async def close(self, *, timeout: float = 5.0) -> None:
        """Stop consumers and producers (what is unconfirmed fails), then every link."""
        if self._closed:
            return
        self.closed_by_client = True
        for c in list(self._consumers):
            try:
                await c.close()
            except TandemError:
                pass  # its links are gone: nothing to cancel there
        for p in list(self._producers):
            await p._stop(ConnectionClosedError("connection closed by the client"))
        self._closed = True
        self._changed()
        if self._keeper is not None:
            self._keeper.cancel()
            await asyncio.gather(self._keeper, return_exceptions=True)
        for t in list(self._opening.values()):
            t.cancel()
        await asyncio.gather(*self._opening.values(), return_exceptions=True)
        await asyncio.gather(*(link.close(timeout=timeout) for link in list(self.links.values())),
                             return_exceptions=True)
        self.links.clear()

    async def __aenter__(self) -> DurableConnection:
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()
