"""The transaction requests of a client session: ``TxInit`` and ``TxEnd``, and the checks a
transactional ``Publish`` or ``Ack`` passes (broker.sessions.messaging): a transaction belongs to
the user whose producer began it, and the session remembers the transactions it wrote in, to
abort them if its link closes before they end (docs/transactions.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from broker.sessions.requests import Handler, Requester
from broker.transactions.ids import owned_by, parse_txid, producer_name
from broker.transactions.service import Transactions
from client.errors import AccessRefusedError
from client.protocol.frames import Frame, TxEnd, TxEndOk, TxInit, TxInitOk
from storage.base import UserRecord


class TxSession(Requester, Protocol):
    #: the transactions this connection wrote in and did not end -> the partitions it wrote to
    #: (queue, partition; -1: the node mapped its messages)
    txs: dict[str, set[tuple[str, int]]]


class TxHost(Protocol):
    def require_quorum(self, what: str) -> None: ...


def check_tx(s: TxSession, user: UserRecord, txid: str) -> set[tuple[str, int]]:
    """A request in transaction ``txid``: it must be the user's own.  The partitions the session
    knows it wrote to, for the request to add to."""
    producer, _epoch, _n = parse_txid(txid)
    if not owned_by(producer, user.name):
        raise AccessRefusedError(f"transaction {txid}: not begun by user {user.name!r}")
    return s.txs.setdefault(txid, set())


class TransactionRequests:
    def __init__(self, node: TxHost, transactions: Transactions) -> None:
        self.node, self.transactions = node, transactions

    def handlers(self) -> Mapping[type[Frame], Handler[TxSession]]:
        return {TxInit: self.init, TxEnd: self.end}

    async def init(self, s: TxSession, user: UserRecord, f: TxInit) -> None:
        self.node.require_quorum("begin transactions")
        producer = producer_name(f.transactional_id, user.name)
        epoch, batch = await self.transactions.init(producer)
        s.send(TxInitOk(rid=f.rid, producer=producer, epoch=epoch, next_batch=batch + 1))

    async def end(self, s: TxSession, user: UserRecord, f: TxEnd) -> None:
        check_tx(s, user, f.txid)
        self.node.require_quorum("end transactions")
        parts = {(p.queue, -1 if p.partition is None else p.partition) for p in f.parts} | s.txs.get(f.txid, set())
        committed, written = await self.transactions.end(f.txid, f.commit, sorted(parts),
                                                         -1 if f.batch is None else f.batch)
        s.txs.pop(f.txid, None)
        s.send(TxEndOk(rid=f.rid, committed=committed, written=written))
