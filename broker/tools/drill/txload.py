"""The drill's transactional workload (``--workload transactional``): consume-transform-produce.

The producers send to the drill queue as in the plain workload (confirmed publishes).  Each
consumer is a *worker* on a durable connection: it takes a batch of inputs (up to
:data:`BATCH`), and in one transaction publishes each input's body to the output queue
(:data:`QUEUE_OUT`, the transaction's id in the ``tx`` header) and acks the inputs; then it
commits, asking again until the group answers.  A batch whose transaction failed or aborted is
given back (its inputs come again).  A reader (the plain workload's consumer) consumes the output
queue.

The checker classifies the outputs as the plain workload's consumed messages (an input confirmed
and never output is lost, one output twice is duplicated) and checks each transaction all or
nothing (:func:`broker.tools.checker.atomicity`): a committed one has every output visible, an
aborted one none, and no input comes again once the transaction that acked it committed.
Output order is not checked: workers interleave the partitions' inputs.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Coroutine
from typing import Any

from broker.tools.checker import Atomicity, atomicity
from broker.tools.drill.load import Load
from broker.tools.drill.model import QUEUE, DrillConfig
from client.clock import Backoff, Clock
from client.durable.consumer import DurableMessage
from client.errors import ProducerFencedError, TandemError, TransactionAbortedError
from client.transactions import Transaction

log = logging.getLogger("tandem.drill")

QUEUE_OUT = "drill-out"
#: inputs per transaction at most
BATCH = 64
#: seconds a worker asks for a commit's outcome before it counts the transaction unknown
OUTCOME_WAIT = 120.0


class TxLoad(Load):
    """Producers, transactional workers and the output's reader of one run."""

    def __init__(self, cl: Any, cfg: DrillConfig, run: int, rng: random.Random, clock: Clock,
                 queue: str = QUEUE) -> None:
        super().__init__(cl, cfg, run, rng, clock, queue)
        self.out = f"{queue}-out" if queue != QUEUE else QUEUE_OUT
        #: transaction id -> (committed, the input bodies it carried)
        self.transactions: dict[str, tuple[bool, frozenset[bytes]]] = {}
        self.outputs: list[tuple[bytes, str]] = []  # (body, transaction id) as the reader got them
        self.unknown = 0  # transactions whose outcome no answer told
        self.errors: Counter[str] = Counter()  # what failed batches before their commit, by error

    def consumers(self) -> list[Coroutine[Any, Any, None]]:
        return [*(self.work(i) for i in range(self.cfg.consumers)), self.consume(self.cfg.consumers, self.out)]

    def queues(self) -> tuple[str, ...]:
        return (self.queue, self.out)

    def atomicity(self) -> Atomicity:
        return atomicity(self.transactions, self.outputs)

    def duplicates(self) -> dict[str, list[str]]:
        """Each output stored more than once (consumed under two message ids): the transactions
        that published it (at most 10)."""
        ids: dict[bytes, set[str]] = {}
        for body, mid in self.consumed:
            ids.setdefault(body, set()).add(mid)
        twice = {b for b, found in ids.items() if len(found) > 1}
        out: dict[str, list[str]] = {}
        for body, txid in self.outputs:
            if body in twice and (len(out) < 10 or body.decode(errors="replace") in out):
                out.setdefault(body.decode(errors="replace"), []).append(txid)
        return out

    async def work(self, index: int) -> None:
        conn = await self._connect(f"drill-worker-{index}")
        c = await conn.consumer(self.queue, prefetch=4 * BATCH).start()
        tid = f"drill-{self.run_no}-worker-{index}"
        try:
            while not self._stop_consumers.is_set():
                m = await c.next(0.2)
                if m is None:
                    continue
                batch = [m]
                while len(batch) < BATCH and (more := await c.next(0)) is not None:
                    batch.append(more)
                await self._one(conn, tid, batch)
        finally:
            await c.close()

    async def _one(self, conn: Any, tid: str, batch: list[DurableMessage]) -> None:
        tx: Transaction | None = None
        committed: bool | None = False
        try:
            tx = await conn.begin(tid)
            await tx.publish_many(self.out, [(m.body, m.key) for m in batch], headers={"tx": tx.id})
            await tx.ack(*batch)
        except TandemError as exc:
            name = type(exc).__name__
            if not self.errors[name]:
                log.warning("drill worker %s: a batch failed before its commit (%s: %s); it comes again", tid,
                            name, exc)
            self.errors[name] += 1
        else:
            committed = await self._outcome(tx)
        if tx is not None and committed is not None:
            self.transactions[tx.id] = (committed, frozenset(m.body for m in batch))
        if committed:
            return
        if committed is None:
            self.unknown += 1
        if tx is not None and not tx.done:
            try:
                await tx.abort()
            except TandemError:
                pass  # (its link's closing or the transaction timeout aborts it)
        for m in batch:  # (what the transaction's acks did not hold comes back now)
            if not m.settled:
                try:
                    await m.nack()
                except TandemError:
                    pass  # its link failed: it comes again, redelivered

    async def _outcome(self, tx: Transaction) -> bool | None:
        """True: committed; False: aborted; None: no answer in :data:`OUTCOME_WAIT` seconds."""
        backoff = Backoff()
        give_up = self.clock.monotonic() + OUTCOME_WAIT
        while True:
            try:
                return await tx.commit()
            except (TransactionAbortedError, ProducerFencedError):
                return False
            except TandemError as exc:
                if self.clock.monotonic() > give_up:
                    log.warning("drill: transaction %s: no outcome (%s)", tx.id, exc)
                    return None
                await self.clock.sleep(backoff.next())  # (asking again: the first decision stands)

    def got(self, index: int, m: Any) -> None:
        """An output, as the reader got it: the checker's consumed message, and its transaction."""
        self.outputs.append((m.body, m.headers.get("tx", "")))


def make_load(cl: Any, cfg: DrillConfig, run: int, rng: random.Random, clock: Clock, queue: str = QUEUE) -> Load:
    """The run's load: the plain workload's, or the transactional one's."""
    if cfg.workload == "transactional":
        return TxLoad(cl, cfg, run, rng, clock, queue)
    return Load(cl, cfg, run, rng, clock, queue)
