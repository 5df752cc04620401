"""Transactions from the asyncio client: publishes to any queues and acks of delivered messages
that take effect together at commit, or not at all (docs/transactions.md).

:class:`TransactionAdmin` is a mixin of :class:`client.connection.Connection` (``request`` is the
connection's)::

    async with conn.transaction("enricher") as tx:
        await tx.publish("out", b"result")
        await tx.ack(message)
    # committed here; an exception in the block aborts

The first ``transaction(id)`` on a connection starts the producer ``id`` (``TxInit``): its epoch
goes up, and a transaction an earlier instance of it began can no longer commit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol

from client.clock import SYSTEM_CLOCK, Backoff
from client.errors import ConnectionClosedError, InvalidArgumentError, TandemError, TransactionAbortedError
from client.protocol.frames import (Ack, Frame, Publish, PublishMessage, PublishOk, TxEnd, TxEndOk, TxInit,
                                    TxInitOk, TxPart, expect)


#: seconds a commit or an abort asks for the outcome while the group elects (then its error is the caller's)
END_TIMEOUT = 30.0


class Settleable(Protocol):
    @property
    def tag(self) -> int: ...

    @property
    def partition(self) -> int: ...


class Requester(Protocol):
    async def request(self, make: Callable[[int], Frame]) -> Frame: ...


@dataclass
class Producer:
    """A transactional producer as this connection started it."""

    name: str  # the producer's name in the group (TxInitOk.producer)
    epoch: int
    batch: int  # the last batch it committed, -1: none
    next: int = 0

    def next_id(self) -> str:
        """The id of its next transaction."""
        self.next += 1
        return f"{self.name}/{self.epoch}/{self.next - 1}"


class Transaction:
    """One transaction: its publishes and acks are held by the group until :meth:`commit`."""

    def __init__(self, conn: Requester, txid: str, *, ender: Requester | None = None) -> None:
        """``conn`` carries its publishes; ``ender`` (default ``conn``) its commit or abort."""
        self._conn, self.id = conn, txid
        self._ender = ender or conn
        self._parts: set[tuple[str, int]] = set()
        self.done = False

    def _open(self) -> None:
        if self.done:
            raise InvalidArgumentError(f"transaction {self.id} has ended")

    async def publish(self, queue: str, body: bytes, *, key: str | None = None,
                      headers: dict[str, str] | None = None) -> None:
        """Publish in the transaction: stored now, delivered once it commits."""
        await self.publish_many(queue, [(body, key)], headers=headers)

    async def publish_many(self, queue: str, items: list[tuple[bytes, str | None]], *,
                           headers: dict[str, str] | None = None) -> int:
        """Publish ``(body, key)`` pairs in one batch; how many were stored."""
        self._open()
        msgs = [PublishMessage(key, dict(headers or {}), body, None) for body, key in items]
        self._parts.add((queue, -1))
        reply = expect(await self._conn.request(lambda rid: Publish(rid=rid, queue=queue, messages=msgs, tx=self.id)),
                       PublishOk)
        return reply.stored

    async def publish_to_exchange(self, exchange: str, body: bytes, *, routing_key: str = "", key: str | None = None,
                                  headers: dict[str, str] | None = None, mandatory: bool = False) -> None:
        """Publish through ``exchange`` in the transaction: each queue its bindings route the
        message to holds it until the commit.  ``mandatory``: a message routed to no queue
        refuses the publish (UnroutableError), nothing of it stored; else it is dropped."""
        await self.publish_many_to_exchange(exchange, [(body, key)], routing_key=routing_key, headers=headers,
                                            mandatory=mandatory)

    async def publish_many_to_exchange(self, exchange: str, items: list[tuple[bytes, str | None]], *,
                                       routing_key: str = "", headers: dict[str, str] | None = None,
                                       mandatory: bool = False) -> int:
        """Publish ``(body, key)`` pairs through ``exchange`` in one batch; how many copies
        the queues stored (a message routed to two queues counts twice)."""
        self._open()
        msgs = [PublishMessage(key, dict(headers or {}), body, None) for body, key in items]
        reply = expect(await self._conn.request(lambda rid: exchange_publish(self.id, exchange, routing_key, msgs,
                                                                             mandatory, rid)), PublishOk)
        self._parts.update((q, -1) for q in reply.queues)
        return reply.stored

    async def ack(self, *messages: Settleable) -> None:
        """Ack delivered messages in the transaction: settled once it commits, ready again if
        it aborts.  Each must not be settled yet; each is acked on the link it came on (a
        durable consumer's messages come from each partition's active)."""
        self._open()
        by_link: dict[int, tuple[Requester, list[int]]] = {}
        marked: list[Settleable] = []
        try:
            for m in messages:
                link: Requester = self._conn
                mark = getattr(m, "_mark_settled", None)
                if mark is not None:
                    link = mark() or link  # (a durable message names its link; a plain one is this connection's)
                marked.append(m)
                queue = getattr(m, "queue", "")
                if queue:
                    self._parts.add((queue, m.partition))
                by_link.setdefault(id(link), (link, []))[1].append(m.tag)
            for link, tags in by_link.values():
                await link.request(lambda rid, tags=tags: Ack(rid=rid, tags=tags, tx=self.id))  # type: ignore[misc]
        except TandemError:
            # one that cannot be acked (its link failed, settled already) stops the call before any
            # ack is sent, or a request fails: those marked are not held by the transaction, or not
            # known to be, and the caller may nack them
            for m in marked:
                if hasattr(m, "_settled"):
                    setattr(m, "_settled", False)
            raise

    async def commit(self, *, batch: int = -1) -> bool:
        """Commit.  True once it is committed; False if ``batch`` (>= 0) had been committed by
        another transaction of the producer (this one is aborted: nothing is missing).
        TransactionAbortedError if it was aborted before (a timeout, a closed link);
        ProducerFencedError if a newer instance of the producer started."""
        return commit_outcome(self.id, *await self._end(True, batch))

    async def abort(self) -> None:
        """Abort: its publishes are never delivered, its acked messages are ready again."""
        if not self.done:
            await self._end(False, -1)

    async def _end(self, commit: bool, batch: int) -> tuple[bool, bool]:
        """Ask for the outcome until the group answers: asking again is safe, the first
        decision on a transaction stands."""
        self._open()
        frame = end_frame(self.id, commit, self._parts, batch)
        clock = getattr(self._conn, "clock", SYSTEM_CLOCK)
        deadline = clock.monotonic() + END_TIMEOUT
        backoff = Backoff()
        while True:
            try:
                reply = expect(await self._ender.request(frame), TxEndOk)
                break
            except TandemError as exc:
                if not exc.retriable or isinstance(exc, ConnectionClosedError) or clock.monotonic() >= deadline:
                    raise
                await clock.sleep(backoff.next())
        self.done = True
        return reply.committed, reply.written


def exchange_publish(txid: str, exchange: str, routing_key: str, msgs: list[PublishMessage], mandatory: bool,
                     rid: int) -> Publish:
    """The ``Publish`` of a transaction's messages to an exchange.  The node records the queues
    it routed them to on the link; the reply names them, for a commit sent on another link."""
    return Publish(rid=rid, queue="", messages=msgs, exchange=exchange, routing_key=routing_key, mandatory=mandatory,
                   tx=txid)


def end_frame(txid: str, commit: bool, parts: set[tuple[str, int]], batch: int) -> Callable[[int], TxEnd]:
    """The ``TxEnd`` of a transaction that wrote to ``parts`` (queue, partition; -1: the node
    mapped its messages), as a request maker."""
    wire = [TxPart(q, None if p < 0 else p) for q, p in sorted(parts)]
    return lambda rid: TxEnd(rid=rid, txid=txid, commit=commit, parts=wire, batch=batch if batch >= 0 else None)


def commit_outcome(txid: str, committed: bool, written: bool) -> bool:
    """What a commit returns for its ``TxEndOk``; TransactionAbortedError if it was aborted."""
    if written:
        return False
    if not committed:
        raise TransactionAbortedError(f"transaction {txid} was aborted before its commit (it outlived "
                                      f"transaction_timeout, or a link it used closed): none of it took effect")
    return True


class TransactionScope:
    """``async with conn.transaction(id) as tx``: commit on a clean exit, abort on an exception."""

    def __init__(self, begin: Callable[[str], Awaitable[Transaction]], tid: str) -> None:
        self._begin, self._tid = begin, tid
        self._tx: Transaction | None = None

    async def __aenter__(self) -> Transaction:
        self._tx = await self._begin(self._tid)
        return self._tx

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        tx = self._tx
        assert tx is not None
        if et is None:
            if not tx.done:
                await tx.commit()
        elif not tx.done:
            try:
                await tx.abort()
            except Exception:  # (the block's own error is the one to raise; the group aborts it anyway)
                pass


class TransactionAdmin:
    """Transactions on a connection (a mixin of :class:`client.connection.Connection`)."""

    _tx_producers: dict[str, Producer]
    _tx_starting: asyncio.Lock

    async def request(self, make: Callable[[int], Frame]) -> Frame:
        raise NotImplementedError

    def transaction(self, transactional_id: str) -> TransactionScope:
        """``async with conn.transaction("my-app") as tx:``: a transaction of producer
        ``transactional_id`` (1-128 characters from A-Z a-z 0-9 _ . : -), committed when the block
        ends, aborted if it raises."""
        return TransactionScope(self.begin, transactional_id)

    async def begin(self, transactional_id: str) -> Transaction:
        """A transaction of producer ``transactional_id``, to end with ``commit`` or ``abort``."""
        producer = await self.init_producer(transactional_id)
        return Transaction(self, producer.next_id())

    async def init_producer(self, transactional_id: str, *, again: bool = False) -> Producer:
        """Start the producer (once per connection, or ``again``): its epoch goes up, fencing
        any earlier instance.  Its state: ``name``, ``epoch``, ``batch`` (the last batch it
        committed, -1: none)."""
        if not hasattr(self, "_tx_producers"):
            self._tx_producers, self._tx_starting = {}, asyncio.Lock()
        async with self._tx_starting:  # (begins at once: one TxInit, or the later would fence the earlier)
            producer = self._tx_producers.get(transactional_id)
            if producer is None or again:
                ok = expect(await self.request(lambda rid: TxInit(rid=rid, transactional_id=transactional_id)),
                            TxInitOk)
                producer = self._tx_producers[transactional_id] = Producer(ok.producer, ok.epoch, ok.next_batch - 1)
        return producer
