"""A node's part in transactions: the coordinator partitions it is active for, the participant
partitions it is active for, the ends of the transactions its clients commit or abort (it is
their *initiator*), and the transactions its clients' links leave open (docs/transactions.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from typing import Any, Protocol

from broker.config import NodeConfig
from broker.messaging.forward import ForwardRequest, TxFwd, TxOp, TxResolveFwd, pack_reply
from broker.transactions.coordinator import Coordinator, CoordinatorHost
from broker.transactions.ids import ABORT, COMMIT, COORDINATOR_QUEUE, DECISION, decision_time, parse_txid
from broker.transactions.participant import ParticipantHost, Participants
from client.errors import InvalidArgumentError, TandemError
from storage.base import DropProducers

log = logging.getLogger("tandem.broker")

#: seconds between two looks at the transactions held here; a transaction held longer asks its coordinator
TX_CHECK = 2.0
#: seconds between two looks at the coordinator's outcome history
HISTORY_CHECK = 60.0


class TransactionHost(CoordinatorHost, ParticipantHost, Protocol):
    @property
    def config(self) -> NodeConfig: ...

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...


class Transactions:
    def __init__(self, node: TransactionHost) -> None:
        self.node = node
        self.coordinator = Coordinator(node)
        self.participants = Participants(node, self.coordinator, timeout=lambda: node.config.transaction_timeout,
                                         check_every=lambda: TX_CHECK)
        self._last_history = 0.0

    async def init(self, tid: str) -> tuple[int, int]:
        return await self.coordinator.init(tid)

    async def end(self, txid: str, commit: bool, parts: Sequence[tuple[str, int]],
                  batch: int = -1) -> tuple[bool, bool]:
        """Decide the transaction (the coordinator's first decision is its outcome), then tell
        the partitions it wrote to (queue, partition; -1: every partition of the queue);
        (committed, written).  A partition that cannot be told now
        asks for the outcome itself (broker.transactions.participant)."""
        parse_txid(txid)
        committed, written = await self.coordinator.decide(txid, commit, batch)
        outcome = COMMIT if committed else ABORT
        told = [self.participants.resolve(q, p, txid, outcome) for q, p in parts]
        results = await asyncio.gather(*told, return_exceptions=True)
        for (q, p), r in zip(parts, results):
            if isinstance(r, TandemError):
                log.info("transaction %s: telling %s/%d its outcome failed (%s): it will ask", txid, q, p, r.message)
            elif isinstance(r, BaseException):
                raise r
        return committed, written

    def ended(self, txs: Mapping[str, Iterable[tuple[str, int]]]) -> None:
        """A client's link closed with these transactions open (each with the partitions it wrote
        to through the link): abort them, a transaction whose link failed before its commit is
        rolled back everywhere.  A partition written to through another link asks for the outcome."""
        for txid, parts in txs.items():
            self.node.spawn(self._abort(txid, sorted(parts)))

    async def _abort(self, txid: str, parts: list[tuple[str, int]]) -> None:
        try:
            committed, _ = await self.end(txid, False, parts)
            log.debug("transaction %s: its link closed; outcome %s", txid, "commit" if committed else "abort")
        except TandemError as exc:
            log.debug("transaction %s: aborting it as its link closed failed (%s): its partitions will", txid, exc)

    # -- forwarded requests ---------------------------------------------------------------------

    async def forwarded(self, req: ForwardRequest) -> bytes:
        hops = max(1, getattr(req, "hops", 1))
        if isinstance(req, TxResolveFwd):
            await self.participants.resolve(req.queue, req.partition, req.txid, req.outcome, hops=hops)
            return b""
        assert isinstance(req, TxFwd)
        if req.op == TxOp.INIT:
            epoch, batch = await self.coordinator.init(req.name, hops=hops)
            return pack_reply([epoch, batch + 1])
        if req.op == TxOp.DECIDE:
            committed, written = await self.coordinator.decide(req.name, bool(req.commit), req.batch - 1, hops=hops)
            return pack_reply([int(committed), int(written)])
        if req.op == TxOp.STATUS:
            return pack_reply(await self.coordinator.status(req.name, hops=hops))
        raise InvalidArgumentError(f"forwarded TX: unknown op {req.op}")

    # -- over time ------------------------------------------------------------------------------

    async def run(self) -> None:
        """The node's timer: transactions in doubt here ask; old outcomes are forgotten."""
        clock = self.node.clock
        while True:
            await clock.sleep(TX_CHECK)
            try:
                self.participants.check()
                now = clock.monotonic()
                if now - self._last_history >= HISTORY_CHECK:
                    self._last_history = now
                    await self._forget_old_outcomes()
            except TandemError as exc:
                log.debug("transactions: a look at what is held failed (%s)", exc)

    async def _forget_old_outcomes(self) -> None:
        q = self.node.queues.get(COORDINATOR_QUEUE)
        if q is None:
            return
        horizon = self.node.clock.time() - self.node.config.transaction_history
        for p, part in enumerate(q.partitions):
            if not part.registers or not self.node.serves(q, p):
                continue
            old = [k for k, v in part.registers.items() if k.startswith(DECISION) and decision_time(v) < horizon]
            if old:
                await self.node.commit_ops((q.meta.id, p), [DropProducers(q.meta.id, p, old)])
                for k in old:
                    part.registers.pop(k, None)
