"""AMQP transactions (``tx.select``, ``tx.commit``, ``tx.rollback``) on the node's own
(:mod:`broker.transactions`, docs/transactions.md).

A channel in tx mode is always inside one transaction of the node's:

* its publishes go to the node at once, as prepared writes of the transaction (``Publish.tx``):
  stored and replicated, held aside, delivered only once it commits;
* its acks, nacks and rejects wait in the channel until ``tx.commit`` (as in RabbitMQ): then the
  acks go to the node as the transaction's (``Ack.tx``), the transaction is decided (``TxEnd``),
  and the nacks and rejects follow.  At ``tx.rollback`` they are the channel's unsettled
  deliveries again, to settle as the client likes;
* ``tx.commit`` waits for every publish of the transaction to be stored before it decides.
  ``commit-ok`` means every publish of it will be delivered and every ack of it is a settlement;
  a transaction the node aborted instead (its prepared writes outlived ``transaction_timeout``)
  closes the channel with 406, and none of it took effect.

The transactions of a node's AMQP channels are those of one transactional producer per user,
``amqp.<node>``, started at the first ``tx.select`` after the node starts (a new epoch: what an
earlier run of the node left open can no longer commit) and numbered in turn.  A channel that
closes, or a connection that ends, aborts the transaction it had open.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from pamqp import commands as C

from broker.amqp import codes
from broker.amqp.channel import Channel, TxSettle
from broker.amqp.wire import ReplyCode
from broker.config import NodeConfig
from client.clock import Backoff, Clock
from client.errors import for_code
from client.protocol.frames import Ack, Error, Frame, Nack, TxEnd, TxEndOk, TxInit, TxInitOk
from client.transactions import END_TIMEOUT

Reply = Callable[[Frame], None]


class TxNode(Protocol):
    @property
    def config(self) -> NodeConfig: ...

    @property
    def clock(self) -> Clock: ...


class TxHost(Protocol):
    """The AMQP session as its transactions see it (broker.amqp.session.AmqpSession)."""

    @property
    def node(self) -> TxNode: ...

    def method(self, channel: int, m: C.Tx.SelectOk | C.Tx.CommitOk | C.Tx.RollbackOk) -> None: ...

    async def request(self, make: Callable[[int], Frame], reply: Reply) -> None: ...

    def spawn(self, make: Callable[[int], Frame], reply: Reply | None = None) -> None: ...

    def close_channel(self, number: int, reply_code: int, text: str, class_id: int = 0, method_id: int = 0) -> None: ...

    def user_name(self) -> str: ...


@dataclass
class _Producer:
    name: str  # TxInitOk.producer
    epoch: int
    next: int = 0

    def next_id(self) -> str:
        self.next += 1
        return f"{self.name}/{self.epoch}/{self.next - 1}"


class Producers:
    """A node's AMQP transactional producers, one per user, shared by its AMQP sessions."""

    def __init__(self) -> None:
        self._by_user: dict[str, _Producer] = {}
        self._lock = asyncio.Lock()

    async def next_id(self, user: str, start: Callable[[], Awaitable[TxInitOk]]) -> str:
        """The id of the next transaction of ``user``'s producer, started with ``start()`` if
        it has not been on this node."""
        p = self._by_user.get(user)
        if p is None:
            async with self._lock:
                p = self._by_user.get(user)
                if p is None:
                    ok = await start()
                    p = self._by_user[user] = _Producer(ok.producer, ok.epoch)
        return p.next_id()


#: each node's AMQP producers (the in-process test harness runs several nodes in one process)
_PRODUCERS: weakref.WeakKeyDictionary[object, Producers] = weakref.WeakKeyDictionary()


class TxFailed(Exception):
    """A step of ``tx.select``, ``tx.commit`` or ``tx.rollback`` failed: the channel closes with
    ``reply_code`` and ``text`` (why, without the code's name)."""

    def __init__(self, reply_code: int, text: str) -> None:
        super().__init__(text)
        self.reply_code, self.text = reply_code, text


class AmqpTransactions:
    def __init__(self, s: TxHost) -> None:
        self.s = s
        node = s.node
        self.producers = _PRODUCERS.get(node) or _PRODUCERS.setdefault(node, Producers())

    async def select(self, ch: Channel, m: C.Tx.Select) -> None:
        if ch.confirming:
            self._refuse(ch, m, ReplyCode.PRECONDITION_FAILED, "cannot switch from confirm to tx mode")
            return
        if not ch.tx:
            try:
                ch.tx = await self._next_id()
            except TxFailed as exc:
                self._refuse(ch, m, exc.reply_code, exc.text)
                return
        self.s.method(ch.number, C.Tx.SelectOk())

    async def commit(self, ch: Channel, m: C.Tx.Commit) -> None:
        await self._end(ch, m, commit=True)

    async def rollback(self, ch: Channel, m: C.Tx.Rollback) -> None:
        await self._end(ch, m, commit=False)

    async def _end(self, ch: Channel, m: C.Tx.Commit | C.Tx.Rollback, *, commit: bool) -> None:
        if not ch.tx:
            self._refuse(ch, m, ReplyCode.PRECONDITION_FAILED, "channel is not transactional")
            return
        txid, settles = ch.tx, ch.tx_settles
        ch.tx_settles = []
        try:
            await ch.stored()  # (every publish of it stored, or the channel closed by its failure)
            if ch.closing:
                return
            acks = [t.session_tag for t in settles if t.kind == "ack"] if commit else []
            if acks:
                await self._ask(lambda rid: Ack(rid=rid, tags=acks, tx=txid))
            committed = await self._decide(txid, commit)
            ch.tx = await self._next_id()
        except TxFailed as exc:
            ch.tx_settles = settles  # (given back with the channel's other deliveries as it closes)
            self._refuse(ch, m, exc.reply_code, exc.text)
            return
        if commit and not committed:
            self._refuse(ch, m, ReplyCode.PRECONDITION_FAILED,
                         f"transaction {txid} was aborted before its commit (it outlived transaction_timeout): "
                         f"none of it took effect")
            return
        if commit:
            for kind in ("requeue", "reject"):
                tags = [t.session_tag for t in settles if t.kind == kind]
                if tags:
                    self.s.spawn(lambda rid, tags=tags, kind=kind: Nack(  # type: ignore[misc]
                        rid=rid, tags=tags, requeue=kind == "requeue"))
            self.s.method(ch.number, C.Tx.CommitOk())
        else:
            ch.unsettle(settles)  # (unsettled again: the client settles them as it likes)
            self.s.method(ch.number, C.Tx.RollbackOk())

    def abort(self, ch: Channel) -> None:
        """The channel closes: its open transaction is aborted."""
        if ch.tx:
            txid, ch.tx = ch.tx, ""
            self.s.spawn(lambda rid: TxEnd(rid=rid, txid=txid, commit=False))

    # -- the node's requests --------------------------------------------------------------------

    async def _next_id(self) -> str:
        cfg = self.s.node.config

        async def start() -> TxInitOk:
            ok = await self._ask(lambda rid: TxInit(rid=rid, transactional_id=f"amqp.{cfg.name}"))
            if not isinstance(ok, TxInitOk):
                raise TxFailed(ReplyCode.INTERNAL_ERROR, f"{type(ok).__name__} in reply to TxInit")
            return ok

        return await self.producers.next_id(self.s.user_name(), start)

    async def _decide(self, txid: str, commit: bool) -> bool:
        """Ask for the outcome until the group answers (the first decision on a transaction stands)."""
        clock = self.s.node.clock
        deadline = clock.monotonic() + END_TIMEOUT
        backoff = Backoff()
        while True:
            try:
                ok = await self._ask(lambda rid: TxEnd(rid=rid, txid=txid, commit=commit))
            except _Retriable as exc:
                if clock.monotonic() >= deadline:
                    raise TxFailed(exc.reply_code, exc.text) from None
                await clock.sleep(backoff.next())
                continue
            if not isinstance(ok, TxEndOk):
                raise TxFailed(ReplyCode.INTERNAL_ERROR, f"{type(ok).__name__} in reply to TxEnd")
            return ok.committed

    async def _ask(self, make: Callable[[int], Frame]) -> Frame:
        """The node's answer to ``make(rid)`` (these requests answer before they return)."""
        got: list[Frame] = []
        await self.s.request(make, got.append)
        if not got:
            raise TxFailed(ReplyCode.CONNECTION_FORCED, "the connection is closing")
        f = got[0]
        if isinstance(f, Error):
            kind = _Retriable if for_code(f.code, f.message).retriable else TxFailed
            raise kind(codes.of(f.code), f.message)
        return f

    def _refuse(self, ch: Channel, m: C.Tx.Select | C.Tx.Commit | C.Tx.Rollback, code: int, why: str) -> None:
        self.s.close_channel(ch.number, code, codes.text(code, why), *codes.ids(m))


class _Retriable(TxFailed):
    """A step failed for a while (an election, a failover): asked again, the decision stands."""
