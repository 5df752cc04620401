"""Transactions from the blocking client, as :mod:`client.transactions` has them for the asyncio
one: a mixin of :class:`client.blocking.BlockingConnection`::

    with conn.transaction("enricher") as tx:
        tx.publish("out", b"result")
        tx.ack(message)
    # committed here; an exception in the block aborts

A transaction's requests are never resent on another link: the link that carried them closing
aborts the transaction (docs/transactions.md), and the commit says so
(``TransactionAbortedError``): run it again.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from client.clock import SYSTEM_CLOCK, Backoff
from client.errors import ConnectionClosedError, InvalidArgumentError, TandemError
from client.protocol.frames import Ack, Frame, Publish, PublishMessage, PublishOk, TxEndOk, TxInit, TxInitOk, expect
from client.transactions import END_TIMEOUT, Producer, Settleable, commit_outcome, end_frame, exchange_publish


class BlockingTransaction:
    """One transaction: its publishes and acks are held by the group until :meth:`commit`."""

    def __init__(self, conn: BlockingTransactions, txid: str) -> None:
        self._conn, self.id = conn, txid
        self._parts: set[tuple[str, int]] = set()
        self.done = False

    def _call(self, make: Any) -> Frame:
        if self.done:
            raise InvalidArgumentError(f"transaction {self.id} has ended")
        return self._conn._call(make, retry=False)

    def publish(self, queue: str, body: bytes, *, key: str | None = None,
                headers: dict[str, str] | None = None) -> None:
        self.publish_many(queue, [(body, key)], headers=headers)

    def publish_many(self, queue: str, items: list[tuple[bytes, str | None]], *,
                     headers: dict[str, str] | None = None) -> int:
        return self.publish_messages(queue, [PublishMessage(key, dict(headers or {}), body, None)
                                             for body, key in items])

    def publish_messages(self, queue: str, msgs: list[PublishMessage]) -> int:
        """Publish messages as they are (each with its own key and headers); how many were stored."""
        self._parts.add((queue, -1))
        reply = expect(self._call(lambda rid: Publish(rid=rid, queue=queue, messages=msgs, tx=self.id)), PublishOk)
        return reply.stored

    def publish_to_exchange(self, exchange: str, body: bytes, *, routing_key: str = "", key: str | None = None,
                            headers: dict[str, str] | None = None, mandatory: bool = False) -> None:
        """See :meth:`client.transactions.Transaction.publish_to_exchange`."""
        self.publish_many_to_exchange(exchange, [(body, key)], routing_key=routing_key, headers=headers,
                                      mandatory=mandatory)

    def publish_many_to_exchange(self, exchange: str, items: list[tuple[bytes, str | None]], *,
                                 routing_key: str = "", headers: dict[str, str] | None = None,
                                 mandatory: bool = False) -> int:
        """See :meth:`client.transactions.Transaction.publish_many_to_exchange`."""
        msgs = [PublishMessage(key, dict(headers or {}), body, None) for body, key in items]
        reply = expect(self._call(lambda rid: exchange_publish(self.id, exchange, routing_key, msgs, mandatory, rid)),
                       PublishOk)
        self._parts.update((q, -1) for q in reply.queues)
        return reply.stored

    def ack(self, *messages: Settleable) -> None:
        tags = [m.tag for m in messages]
        for m in messages:
            mark = getattr(m, "_mark_settled", None)
            if mark is not None:
                mark()
        if tags:
            self._call(lambda rid: Ack(rid=rid, tags=tags, tx=self.id))

    def commit(self, *, batch: int = -1) -> bool:
        """See :meth:`client.transactions.Transaction.commit`."""
        reply = self._end(True, batch)
        return commit_outcome(self.id, reply.committed, reply.written)

    def abort(self) -> None:
        if not self.done:
            self._end(False, -1)

    def _end(self, commit: bool, batch: int) -> TxEndOk:
        """Ask for the outcome until the group answers (as the asyncio client does)."""
        frame = end_frame(self.id, commit, self._parts, batch)
        deadline = SYSTEM_CLOCK.monotonic() + END_TIMEOUT
        backoff = Backoff()
        while True:
            try:
                reply = expect(self._call(frame), TxEndOk)
                break
            except TandemError as exc:
                if not exc.retriable or isinstance(exc, ConnectionClosedError) \
                        or SYSTEM_CLOCK.monotonic() >= deadline:
                    raise
                SYSTEM_CLOCK.sleep_blocking(backoff.next())
        self.done = True
        return reply


class _Scope:
    def __init__(self, conn: BlockingTransactions, tid: str) -> None:
        self._conn, self._tid = conn, tid
        self._tx: BlockingTransaction | None = None

    def __enter__(self) -> BlockingTransaction:
        self._tx = self._conn.begin(self._tid)
        return self._tx

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        tx = self._tx
        assert tx is not None
        if et is None:
            if not tx.done:
                tx.commit()
        elif not tx.done:
            try:
                tx.abort()
            except Exception:  # (the block's own error is the one to raise; the group aborts it anyway)
                pass


class BlockingTransactions:
    _tx_producers: dict[str, Producer]

    def _call(self, make: Any, *, retry: bool = True) -> Frame:
        raise NotImplementedError

    def transaction(self, transactional_id: str) -> _Scope:
        """See :meth:`client.transactions.TransactionAdmin.transaction`."""
        return _Scope(self, transactional_id)

    def begin(self, transactional_id: str) -> BlockingTransaction:
        producer = self.init_producer(transactional_id)
        txid = producer.next_id()
        return BlockingTransaction(self, txid)

    def init_producer(self, transactional_id: str, *, again: bool = False) -> Producer:
        if not hasattr(self, "_tx_producers"):
            self._tx_producers = {}
        producer = self._tx_producers.get(transactional_id)
        if producer is None or again:
            ok = expect(self._call(lambda rid: TxInit(rid=rid, transactional_id=transactional_id), retry=False),
                        TxInitOk)
            producer = self._tx_producers[transactional_id] = Producer(ok.producer, ok.epoch, ok.next_batch - 1)
        return producer
