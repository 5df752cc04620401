"""The coordinator: each transactional producer's epoch, and the decision on each transaction.

A producer's coordinator is one partition of ``tandem.transactions`` (broker.transactions.ids);
its active answers, and a request made on another member is forwarded there (``TxFwd``).  Its
state is registers of that partition's producer table, written through the partition's log, so
every decision is replicated before anyone acts on it and survives the loss of the active:

* ``init``: the producer's epoch goes up by one.  A transaction of an older epoch can no longer
  commit: a restarted producer fences its zombie.
* ``decide``: the first decision on a transaction is its outcome; every later one (the producer
  asking again after a lost answer, a participant that timed out) gets that outcome back.  A
  commit needs the producer's current epoch; a commit of a batch the producer committed already
  (``batch``, a Spark micro-batch) is turned into an abort, and says so (``written``).
* ``status``: the outcome, or none (in progress, or decided longer ago than the history keeps).

Decisions on one transaction or one producer are made one at a time on the active (a lock per
register); in a group, the partition's log orders those of members that were active in turn.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Protocol

from broker.messaging.catalogue import TX_LEVEL
from broker.messaging.forward import Forwarding, TxFwd, TxOp, decode_reply
from broker.messaging.queues import Queue
from broker.messaging.streams import active_elsewhere
from broker.transactions.ids import (ABORT, BATCH, COMMIT, COORDINATOR_PARTITIONS, COORDINATOR_QUEUE, DECISION,
                                     EPOCH, PRODUCER, coordinator_partition, decision_outcome,
                                     decision_value, parse_txid)
from client.clock import Clock
from client.errors import InvalidArgumentError, ProducerFencedError, QueueNotFoundError
from client.protocol.frames import Declare, QueueInfo
from storage.base import PutProducer, WriteOp


class CoordinatorHost(Forwarding, Protocol):
    @property
    def clock(self) -> Clock: ...

    async def commit_ops(self, key: tuple[int, int], ops: list[WriteOp]) -> None: ...

    async def declare(self, frame: Declare) -> tuple[QueueInfo, bool]: ...

    def require_level(self, level: int, what: str) -> None: ...


class Coordinator:
    def __init__(self, node: CoordinatorHost) -> None:
        self.node = node
        self._locks: dict[str, _Lock] = {}

    # -- the requests ---------------------------------------------------------------------------

    async def init(self, tid: str, *, hops: int = 0) -> tuple[int, int]:
        """Raise producer ``tid``'s epoch (broker.transactions.ids.producer_name): (its new epoch,
        the last batch it committed or -1)."""
        if not PRODUCER.match(tid):
            raise InvalidArgumentError(f"producer {tid!r}: not a producer's name")
        self.node.require_level(TX_LEVEL, "transactions need")
        q = await self._queue(create=True)
        p = coordinator_partition(tid)
        who = await active_elsewhere(self.node, q, p, hops)
        if who is not None:
            epoch, batch = _pair(await self.node.forward(who, TxFwd(hops + 1, TxOp.INIT, tid)))
            return epoch, batch
        async with self._lock(EPOCH + tid):
            regs = q.partitions[p].registers
            epoch = regs.get(EPOCH + tid, 0) + 1
            await self._write(q, p, {EPOCH + tid: epoch})
            return epoch, regs.get(BATCH + tid, 0) - 1

    async def decide(self, txid: str, commit: bool, batch: int = -1, *, hops: int = 0) -> tuple[bool, bool]:
        """The transaction's outcome, deciding it now if nobody has: (committed, written)."""
        tid, epoch, _ = parse_txid(txid)
        q = await self._queue(create=False)
        p = coordinator_partition(tid)
        who = await active_elsewhere(self.node, q, p, hops)
        if who is not None:
            committed, written = _pair(await self.node.forward(
                who, TxFwd(hops + 1, TxOp.DECIDE, txid, int(commit), batch + 1)))
            return bool(committed), bool(written)
        async with self._lock(DECISION + txid):
            regs = q.partitions[p].registers
            have = regs.get(DECISION + txid)
            if have is not None:
                return decision_outcome(have) == COMMIT, False
            outcome, written = (COMMIT if commit else ABORT), False
            writes = {}
            if commit:
                current = regs.get(EPOCH + tid, 0)
                if epoch != current:
                    raise ProducerFencedError(
                        f"transaction {txid}: producer {tid!r} is at epoch {current} (a newer instance started "
                        f"it again): this one may not commit")
                if batch >= 0 and regs.get(BATCH + tid, 0) - 1 >= batch:
                    outcome, written = ABORT, True
                elif batch >= 0:
                    writes[BATCH + tid] = batch + 1
            writes[DECISION + txid] = decision_value(outcome, self.node.clock.time())
            await self._write(q, p, writes)
            return outcome == COMMIT, written

    async def status(self, txid: str, *, hops: int = 0) -> int:
        """COMMIT, ABORT, or 0: not decided (or decided before the history's horizon)."""
        tid, _, _ = parse_txid(txid)
        try:
            q = await self._queue(create=False)
        except QueueNotFoundError:
            return 0
        p = coordinator_partition(tid)
        who = await active_elsewhere(self.node, q, p, hops)
        if who is not None:
            value = decode_reply(await self.node.forward(who, TxFwd(hops + 1, TxOp.STATUS, txid)))
            if type(value) is not int or value not in (0, COMMIT, ABORT):
                raise InvalidArgumentError("forwarded TX status: the reply is not 0, 1 or 2")
            return value
        have = q.partitions[p].registers.get(DECISION + txid)
        return 0 if have is None else decision_outcome(have)

    # -- the coordinator's partition ------------------------------------------------------------

    async def _queue(self, *, create: bool) -> Queue:
        try:
            return self.node.queue(COORDINATOR_QUEUE)
        except QueueNotFoundError:
            if not create:
                raise
        await self.node.declare(Declare(rid=0, queue=COORDINATOR_QUEUE, partitions=COORDINATOR_PARTITIONS))
        return self.node.queue(COORDINATOR_QUEUE)

    async def _write(self, q: Queue, p: int, regs: dict[str, int]) -> None:
        part = q.partitions[p]
        generation = part.generation
        ops: list[WriteOp] = [PutProducer(q.meta.id, p, k, v) for k, v in regs.items()]
        await self.node.commit_ops((q.meta.id, p), ops)
        if part.generation == generation:  # (still served here as it was: the copy in memory follows)
            part.registers.update(regs)

    @contextlib.asynccontextmanager
    async def _lock(self, key: str) -> AsyncIterator[None]:
        entry = self._locks.get(key)
        if entry is None:
            entry = self._locks[key] = _Lock()
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if not entry.users:
                del self._locks[key]


class _Lock:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


def _pair(payload: bytes) -> tuple[int, int]:
    value = decode_reply(payload)
    if not (isinstance(value, list) and len(value) == 2 and all(type(v) is int for v in value)):
        raise InvalidArgumentError("forwarded TX: the reply is not [int, int]")
    return value[0], value[1]
