"""A participant: a partition a transaction wrote to, on its active.  It holds what the
transaction prepared there (broker.messaging.prepared) until it learns the outcome, and then
writes one entry of its log:

* commit: the acked deliveries settled, the registers dropped; the prepared messages ready;
* abort: the prepared messages settled, the registers dropped; the acked deliveries ready again.

It learns the outcome from the transaction's end (``resolve``, from the member the client's
``TxEnd`` reached), or asks for it: every ``tx_check`` seconds it asks the coordinator about
each transaction it has held for longer than that, and decides abort for one nobody decided
within ``transaction_timeout`` (:meth:`Participants.check`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Protocol

from broker.messaging import prepared
from broker.messaging.forward import Forwarding, TxResolveFwd
from broker.messaging.message import Msg, PreparedTx
from broker.messaging.publish import Delivering
from broker.messaging.queues import Consumer, Queue
from broker.messaging.streams import active_elsewhere
from broker.transactions.coordinator import Coordinator
from broker.transactions.ids import ABORT, COMMIT
from client.clock import Clock
from client.errors import InvalidArgumentError, QueueNotFoundError, TandemError
from storage.base import DropProducers, PutProducer, Settle, WriteOp

log = logging.getLogger("tandem.broker")


class ParticipantHost(Forwarding, Protocol):
    @property
    def clock(self) -> Clock: ...

    @property
    def delivery(self) -> Delivering: ...

    @property
    def queues(self) -> Mapping[str, Queue]: ...

    def serves(self, q: Queue, pidx: int) -> bool: ...

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...

    async def commit_ops(self, key: tuple[int, int], ops: list[WriteOp]) -> None: ...


class Participants:
    def __init__(self, node: ParticipantHost, coordinator: Coordinator, *, timeout: Callable[[], float],
                 check_every: Callable[[], float]) -> None:
        self.node, self.coordinator = node, coordinator
        self._timeout, self._check_every = timeout, check_every
        self._asking: set[str] = set()
        self._resolving: set[tuple[int, int, str]] = set()  # (queue id, partition, transaction) under way

    # -- the outcome --------------------------------------------------------------------------

    async def resolve(self, queue: str, partition: int, txid: str, outcome: int, *, hops: int = 0) -> None:
        """Apply ``outcome`` to what ``txid`` prepared in ``queue``'s partition (-1: in every
        partition), on its active."""
        if outcome not in (COMMIT, ABORT):
            raise InvalidArgumentError(f"transaction outcome {outcome}: 1 (commit) or 2 (abort)")
        try:
            q = self.node.queue(queue)
        except QueueNotFoundError:
            return  # (deleted: nothing of it is left to settle)
        if partition >= len(q.partitions):
            raise InvalidArgumentError(f"queue {queue!r} has no partition {partition}")

        async def one(p: int) -> None:
            who = await active_elsewhere(self.node, q, p, hops)
            if who is None:
                await self.resolve_here(q, p, txid, outcome)
            else:
                await self.node.forward(who, TxResolveFwd(hops + 1, queue, p, txid, outcome))

        # (every partition at once: a partition that fails does not hold up the others)
        done = await asyncio.gather(*(one(p) for p in (range(len(q.partitions)) if partition < 0 else (partition,))),
                                    return_exceptions=True)
        for r in done:
            if isinstance(r, BaseException):
                raise r

    async def resolve_here(self, q: Queue, p: int, txid: str, outcome: int) -> None:
        part = q.partitions[p]
        regs = prepared.registers_of(part, txid)
        busy = (q.meta.id, p, txid)
        if not regs or busy in self._resolving:
            return  # never prepared here, resolved already, or being resolved
        tx = part.txs.pop(txid, None)
        self._resolving.add(busy)
        try:
            await self._resolve(q, p, txid, outcome, regs, tx)
        finally:
            self._resolving.discard(busy)

    async def _resolve(self, q: Queue, p: int, txid: str, outcome: int, regs: list[str],
                       tx: PreparedTx | None) -> None:
        part = q.partitions[p]
        made, acked = prepared.prepared_offsets(part, txid), prepared.acked_offsets(part, txid)
        settle = acked if outcome == COMMIT else made
        ops: list[WriteOp] = [Settle(q.meta.id, p, settle)] if settle else []
        ops.append(DropProducers(q.meta.id, p, regs))
        generation = part.generation
        try:
            await self.node.commit_ops((q.meta.id, p), ops)
        except BaseException:
            if tx is not None and part.generation == generation:
                part.txs[txid] = tx  # (still held here: asked again later)
            raise
        if part.generation != generation:
            return  # (served elsewhere now: the new active loaded the outcome with the log)
        for name in regs:
            part.registers.pop(name, None)
        for o in made + acked:
            part.tx_offsets.pop(o, None)
        q.pending_count -= len(made)
        q.unacked_count -= len(acked)
        if tx is None:
            return
        if outcome == COMMIT:
            q.acked += len(tx.acked)
            back = tx.msgs
        else:
            back = tx.acked
        if back and not q.deleted:
            q.requeue(back)
            self.node.delivery.make_ready(q, {})
        log.debug("transaction %s %s in %s/%d: %d published, %d acked", txid,
                  "committed" if outcome == COMMIT else "aborted", q.name, p, len(tx.msgs), len(tx.acked))

    # -- acks in a transaction ------------------------------------------------------------------

    async def hold_acks(self, txid: str, settled: list[tuple[Consumer, Msg]],
                        release: Callable[[list[tuple[Consumer, Msg]]], None]) -> None:
        """The deliveries ``settled`` (taken from a session) are held by ``txid``: written as its
        registers in their partitions' logs, then theirs until its outcome.  ``release`` frees
        their consumers' slots; those whose write failed are ready again."""
        by_part: dict[tuple[Queue, int], list[tuple[Consumer, Msg]]] = {}
        for c, m in settled:
            by_part.setdefault((c.queue, m.partition), []).append((c, m))
        release(settled)
        error: BaseException | None = None
        now = self.node.clock.monotonic()
        for (q, p), items in by_part.items():
            regs = {prepared.acked_register(txid, m.offset): 1 for _c, m in items}
            part = q.partitions[p]
            generation = part.generation
            try:
                ops: list[WriteOp] = [PutProducer(q.meta.id, p, k, v) for k, v in regs.items()]
                await self.node.commit_ops((q.meta.id, p), ops)
            except TandemError as exc:
                q.unacked_count -= len(items)
                if part.generation == generation and not q.deleted:  # (else the new active delivers them)
                    q.requeue([m for _c, m in items])
                    self.node.delivery.make_ready(q, {})
                error = error or exc
                continue
            if part.generation != generation:  # (the new active loaded them as held, and counts them)
                q.unacked_count -= len(items)
                continue
            part.registers.update(regs)
            held = part.txs.get(txid)
            if held is None:
                held = part.txs[txid] = PreparedTx(now)
            held.acked.extend(m for _c, m in items)
        if error is not None:
            raise error

    # -- in doubt -------------------------------------------------------------------------------

    def check(self) -> None:
        """Ask about each transaction held here for longer than ``tx_check`` (the node's timer)."""
        now = self.node.clock.monotonic()
        wait = self._check_every()
        for q in list(self.node.queues.values()):
            for p, part in enumerate(q.partitions):
                if not part.txs or not self.node.serves(q, p):
                    continue
                for txid, tx in list(part.txs.items()):
                    if now - tx.since >= wait and txid not in self._asking:
                        self._asking.add(txid)
                        self.node.spawn(self._ask(q, p, txid, now - tx.since))

    async def _ask(self, q: Queue, p: int, txid: str, age: float) -> None:
        try:
            outcome = await self.coordinator.status(txid)
            if not outcome and age >= self._timeout():
                committed, _ = await self.coordinator.decide(txid, False)
                outcome = COMMIT if committed else ABORT
                if not committed:
                    log.info("transaction %s aborted: held in %s/%d for %.0f s with no outcome", txid, q.name, p, age)
            if outcome:
                await self.resolve_here(q, p, txid, outcome)
        except TandemError as exc:
            log.debug("transaction %s in %s/%d: asking its coordinator failed (%s): again later", txid, q.name, p, exc)
        finally:
            self._asking.discard(txid)
