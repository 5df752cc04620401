"""The publish path: one batch from a ``Publish`` frame to its confirm.

:meth:`Publisher.publish` reads top to bottom as the steps a batch goes through, and returns
one result, a :class:`~broker.messaging.outcome.Outcome` of :class:`PublishResult` (or of the error the
client gets), settled in the commit's own callback so the confirm goes out at once:

1. **route**: each message to a partition (the queue's data mapper, or the partition the
   client addressed).  A batch touching a partition this node does not serve goes to each
   partition's active instead (:meth:`Publisher._publish_elsewhere`).
2. **admit**: size limit, producer sequences (a dense batch must continue its producer's
   sequence; a resend of what is still being stored is refused: retry), the queue's bounds
   (:mod:`broker.messaging.limits`: refused, or the oldest messages shed), the disk alarm (:mod:`broker.node.diskalarm`: nothing is stored on a nearly full disk: retry).
3. **assign**: drop what the partition holds already (idempotent producers), give the rest
   offsets, build the broker's :class:`~broker.messaging.message.Msg` per partition.
4. **to ops**: ``Append`` per partition, ``PutProducer`` per producer (with the seqs it took,
   unless the batch is numbered per partition), ``MarkDelivered``
   when consumers wait (the delivery then needs no commit of its own).
5. **commit**: through the node's :class:`~broker.messaging.commit.CommitPath` (the store writer on a
   single node, the partition's replicated log in a group).
6. **confirm**: the messages become ready for consumers and the future resolves.  With
   ``NO_SYNC`` on a single node they are ready and confirmed before the write.

One partition per proposal in a group: each commits or fails over on its own, so a failover
never leaves half a batch committed and half to be resent.  When the partition's active moves
before its entry commits, a batch with a producer id goes to the new active (which drops what
it already has) instead of failing the client.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Coroutine
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from broker.messaging import limits, prepared, sequences, timing
from broker.messaging.forward import MAX_HOPS, Forwarding, PublishFwd, decode_reply
from broker.messaging.outcome import Outcome, Reply
from broker.messaging.message import Msg, PreparedTx, encode_headers
from broker.messaging.queues import Queue
from client.clock import Clock
from client.errors import (InvalidArgumentError, MessageTooLargeError, NotActiveError,
                           ShuttingDownError, UnavailableError)
from client.protocol.codec import encode
from client.protocol.frames import Publish, PublishMessage
from storage.base import Append, DurabilityPolicy, MarkDelivered, PutProducer, WriteOp

log = logging.getLogger("tandem.broker")


@dataclass(frozen=True, slots=True)
class PublishRequest:
    queue: str
    producer_id: str | None
    messages: list[PublishMessage]
    #: all messages go to this partition (the client, or another member, mapped them already)
    partition: int | None = None
    #: the client numbers its messages in ``partition`` 0, 1, 2, ... with no gap
    dense: bool = False
    #: how often this batch was forwarded already
    hops: int = 0
    #: the transaction it is part of ("": none): stored and held aside until its outcome
    #: (broker.messaging.prepared)
    tx: str = ""


@dataclass(frozen=True, slots=True)
class PublishResult:
    stored: int
    duplicates: int
    #: the producer's last seq in the partition (a dense batch), else -1
    last_seq: int = -1
    #: a publish to an exchange: messages routed to no queue (broker.messaging.routed)
    unroutable: int = 0
    #: a publish to an exchange in a transaction: the queues it routed to
    queues: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _Assigned:
    """A batch after step 3: what to store, per partition."""
    by_part: dict[int, list[Msg]] = field(default_factory=dict)
    seqs_of: dict[tuple[int, str], list[int]] = field(default_factory=dict)
    duplicates: int = 0
    stored: int = 0
    premark: dict[int, int] = field(default_factory=dict)


class Delivering(Protocol):
    def make_ready(self, q: Queue, by_part: dict[int, list[Msg]]) -> None: ...

    def shed(self, q: Queue, msgs: list[Msg]) -> None:
        """Ready messages leave ``q`` to make room (broker.messaging.limits)."""
        ...


class PublishHost(Forwarding, Protocol):
    """What the publish path needs from its node."""

    @property
    def clock(self) -> Clock: ...

    @property
    def stopping(self) -> bool: ...

    @property
    def delivery(self) -> Delivering: ...

    def require_level(self, level: int, what: str) -> None:
        """In a group, InvalidArgumentError unless it is at feature ``level`` (broker.partitions.upgrade)."""
        ...

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...

    def check_disk(self, what: str) -> None:
        """Raise UnavailableError while this node's disk alarm is raised."""
        ...


class Publisher:
    def __init__(self, node: PublishHost) -> None:
        self.confirms = 0  # messages confirmed to publishers (metrics)
        self.node = node

    def publish(self, req: PublishRequest) -> Outcome[PublishResult]:
        """Raises at once what refuses the batch before anything is stored (no such queue or
        partition, too large, queue full, out of sequence); the outcome holds the rest."""
        result: Outcome[PublishResult] = Outcome()
        self._publish(req, result)
        return result

    def publish_to(self, req: PublishRequest, reply: Reply[PublishResult]) -> None:
        """:meth:`publish`, settling ``reply`` itself: a session's reply goes out in the commit's
        own callback."""
        self._publish(req, reply)

    def _publish(self, req: PublishRequest, result: Reply[PublishResult]) -> None:
        q = self._queue(req)
        pidxs = self.route(q, req)
        if not self._served_here(q, req, pidxs):
            self._publish_elsewhere(q, req, pidxs, result)
            return
        last = self._admit(q, req, pidxs)
        if req.dense and not req.messages:  # a producer asks where its sequence stands
            result.set_result(PublishResult(0, 0, last))
            return
        self.node.check_disk("publishing")  # (after every check that writes nothing)
        self._bound(q, req, pidxs)
        batch = self._assign(q, req, pidxs)
        if not batch.by_part:
            result.set_result(PublishResult(0, batch.duplicates, self._last_seq(q, req)))
            return
        ops = self._to_ops(q, batch, req.dense, req.tx)
        self._commit(q, req, batch, ops, result)

    # -- 1. route -------------------------------------------------------------------------------

    def _queue(self, req: PublishRequest) -> Queue:
        if self.node.stopping:
            raise ShuttingDownError("node is shutting down")
        q = self.node.queue(req.queue)
        if req.dense and (req.partition is None or req.producer_id is None
                          or any(not isinstance(m.seq, int) for m in req.messages)):
            raise InvalidArgumentError("a publish addressed to a partition needs a producer_id and a seq "
                                       "on every message")
        return q

    @staticmethod
    def route(q: Queue, req: PublishRequest) -> list[int]:
        """Each message's partition."""
        if req.partition is not None:
            if not 0 <= req.partition < q.meta.partitions:
                raise InvalidArgumentError(f"queue {req.queue!r} has no partition {req.partition}")
            return [req.partition] * len(req.messages)
        mapper = q.mapper.partition
        if req.producer_id is None:
            return [mapper(m.key) for m in req.messages]
        # a message that spreads goes where its (producer id, seq) says: a resend after a
        # failover, on whichever node, meets the first send in the same partition (client/mapper.py)
        base = zlib.crc32(req.producer_id.encode())
        return [mapper(m.key, None if m.seq is None else base + m.seq) for m in req.messages]

    def _served_here(self, q: Queue, req: PublishRequest, pidxs: list[int]) -> bool:
        target = req.partition if req.partition is not None else pidxs[0] if pidxs else 0
        parts = {target} if len(set(pidxs)) <= 1 else set(pidxs)
        return self.node.commit.serves_together({(q.meta.id, p) for p in parts})

    # -- 2. admit -------------------------------------------------------------------------------

    def _admit(self, q: Queue, req: PublishRequest, pidxs: list[int]) -> int:
        """Refuse what cannot be stored; the producer's last seq for a dense batch, else -1."""
        limit = self.node.config.max_message_size
        for m in req.messages:
            if len(m.body) > limit:
                raise MessageTooLargeError(f"message of {len(m.body)} bytes exceeds max_message_size {limit}")
        pid = req.producer_id
        if req.tx and q.stream:
            raise InvalidArgumentError(f"queue {q.name!r} is a stream: a transaction may not publish to one "
                                       f"(its readers read by offset, with no outcome to wait for)")
        if timing.timed(req.messages):
            timing.check(req.messages, self.node.clock.time())
            self.node.require_level(3, "delayed and expiring messages (x-delay, x-deliver-at, expiration) need")
        if req.dense:
            assert req.partition is not None and pid is not None
            return sequences.check_dense(q, req.partition, pid, req.messages)
        if pid is not None:
            sequences.check_resends(q, pid, req.messages, pidxs)
        return -1

    def _bound(self, q: Queue, req: PublishRequest, pidxs: list[int]) -> None:
        """The queue's bounds (broker.messaging.limits): the last check, as it may shed messages."""
        if q.meta.max_length or q.meta.max_length_bytes:
            pid, parts = req.producer_id, q.partitions
            fresh = req.messages if pid is None else [
                m for m, p in zip(req.messages, pidxs) if not sequences.held(parts[p], pid, m.seq)]
            limits.admit(q, fresh, self.node.delivery.shed)

    # -- 3. assign ------------------------------------------------------------------------------

    def _assign(self, q: Queue, req: PublishRequest, pidxs: list[int]) -> _Assigned:
        clock, parts, pid = self.node.clock, q.partitions, req.producer_id
        ts = clock.time()
        if pid is not None:
            used = clock.monotonic()
            for pidx in set(pidxs) if req.partition is None else (req.partition,):
                parts[pidx].producer_used[pid] = used
        # locals, not the batch's attributes, in the per-message loop: it is the hot path
        by_part: dict[int, list[Msg]] = {}
        seqs_of: dict[tuple[int, str], list[int]] = {}
        duplicates = 0
        held, take = sequences.held, sequences.take
        track = not req.dense  # (a batch numbered per partition comes in order: no window)
        for m, pidx in zip(req.messages, pidxs):
            part = parts[pidx]
            seq = m.seq
            if pid is not None and seq is not None:
                if held(part, pid, seq):
                    duplicates += 1
                    continue
                take(part, pid, seq, track)
                seqs_of.setdefault((pidx, pid), []).append(seq)
            offset = part.next_offset
            part.next_offset = offset + 1
            msg = Msg(pidx, offset, m.key, m.headers, encode_headers(m.headers), m.body, pid, seq, ts)
            lst = by_part.get(pidx)
            if lst is None:
                by_part[pidx] = [msg]
            else:
                lst.append(msg)
        return _Assigned(by_part, seqs_of, duplicates, len(req.messages) - duplicates)

    # -- 4. to ops ------------------------------------------------------------------------------

    @staticmethod
    def _to_ops(q: Queue, batch: _Assigned, dense: bool, tx: str) -> list[WriteOp]:
        parts, qid = q.partitions, q.meta.id
        ops: list[WriteOp] = [Append(qid, pidx, msgs, parts[pidx].next_offset) for pidx, msgs in batch.by_part.items()]
        if tx:  # (held aside until the transaction's outcome: nothing to mark delivered)
            ops.extend(PutProducer(qid, pidx, prepared.prepared_register(tx, msgs[0].offset), len(msgs))
                       for pidx, msgs in batch.by_part.items())
        # The producer's last seq held here, not the batch's: a batch that came after a later one
        # leaves it where it is.  (A batch numbered per partition comes in order: the replicas
        # need not learn its seqs.)
        for (pidx, pid), seqs in batch.seqs_of.items():
            ops.append(PutProducer(qid, pidx, pid, parts[pidx].producers[pid], () if dense else tuple(seqs)))
        # With consumers waiting these messages are about to go out: mark them delivered in
        # this same commit.  (If they wait instead, a crash counts one delivery too many: the
        # safe direction.)
        if q.consumers and not tx:
            batch.premark = {pidx: parts[pidx].next_offset for pidx in batch.by_part}
            ops.extend(MarkDelivered(qid, pidx, upto) for pidx, upto in batch.premark.items())
        q.published += batch.stored
        return ops

    # -- 5. commit and 6. confirm --------------------------------------------------------------

    def _commit(self, q: Queue, req: PublishRequest, batch: _Assigned, ops: list[WriteOp],
                result: Reply[PublishResult]) -> None:
        node = self.node
        commit = node.commit
        policy = commit.confirm_policy

        def committed(err: BaseException | None) -> None:
            if err is not None:
                self._failed(q, req, batch, err, result)
                return
            if req.tx:
                self._prepared(q, batch, req.tx)
            else:
                self._confirm(q, batch, ready=policy is not DurabilityPolicy.NO_SYNC)
            if (policy is not DurabilityPolicy.NO_SYNC or req.tx) and not result.done():
                result.set_result(PublishResult(batch.stored, batch.duplicates, self._last_seq(q, req)))

        if policy is DurabilityPolicy.NO_SYNC and not req.tx:
            node.delivery.make_ready(q, batch.by_part)
            commit.propose(ops, committed)
            result.set_result(PublishResult(batch.stored, batch.duplicates, self._last_seq(q, req)))
            return
        q.pending_count += batch.stored
        commit.propose(ops, committed, durable=True)

    def _confirm(self, q: Queue, batch: _Assigned, *, ready: bool) -> None:
        parts = q.partitions
        for (pidx, pid), seqs in batch.seqs_of.items():
            sequences.committed(parts[pidx], pid, seqs)
        for pidx, upto in batch.premark.items():
            parts[pidx].marked_upto = max(parts[pidx].marked_upto, upto)
        if ready:
            q.pending_count -= batch.stored
            if not q.deleted:
                self.node.delivery.make_ready(q, batch.by_part)
        q.mark_committed(batch.by_part)

    def _prepared(self, q: Queue, batch: _Assigned, tx: str) -> None:
        """A transaction's messages are stored: held aside, counted as pending, until its outcome."""
        parts = q.partitions
        for (pidx, pid), seqs in batch.seqs_of.items():
            sequences.committed(parts[pidx], pid, seqs)
        now = self.node.clock.monotonic()
        for pidx, msgs in batch.by_part.items():
            part = parts[pidx]
            held = part.txs.get(tx)
            if held is None:
                held = part.txs[tx] = PreparedTx(now)
            held.msgs.extend(msgs)
            part.registers[prepared.prepared_register(tx, msgs[0].offset)] = len(msgs)
        q.mark_committed(batch.by_part)

    def _failed(self, q: Queue, req: PublishRequest, batch: _Assigned, err: BaseException,
                result: Reply[PublishResult]) -> None:
        q.pending_count -= batch.stored
        q.published -= batch.stored
        sequences.release(q, batch.seqs_of)
        if req.producer_id is not None and req.hops < MAX_HOPS and self.node.commit.moved(err):
            # The active changed before the entry committed: it may still commit (the new
            # active has it) or not.  With a producer id a resend is safe, the new active
            # drops what it already stored: send it there instead of failing the client.
            try:
                self._publish(replace(req, hops=req.hops + 1), _Resent(result, batch.duplicates))
            except Exception as exc:
                if not result.done():
                    result.set_exception(exc)
            return
        if not result.done():
            result.set_exception(err)

    @staticmethod
    def _last_seq(q: Queue, req: PublishRequest) -> int:
        if req.partition is None or req.producer_id is None:
            return -1
        return q.partitions[req.partition].producers.get(req.producer_id, -1)

    # -- partitions active elsewhere ------------------------------------------------------------

    def _publish_elsewhere(self, q: Queue, req: PublishRequest, pidxs: list[int],
                           result: Reply[PublishResult]) -> None:
        """Each partition's part to its active; the result sums theirs.  Parts served here are
        stored at once, so a producer's sequences reach every partition in the order it sent
        them."""
        if req.dense:  # one partition: its result, with the producer's last seq there
            assert req.partition is not None
            self.node.spawn(_relay(self._publish_remote(q, req.partition, req), result))
            return
        by_part: dict[int, list[PublishMessage]] = {}
        for m, p in zip(req.messages, pidxs):
            by_part.setdefault(p, []).append(m)
        parts: list[Outcome[PublishResult] | Coroutine[Any, Any, PublishResult]] = []
        for pidx, msgs in by_part.items():
            part_req = replace(req, messages=msgs, partition=pidx)
            if self.node.commit.serving((q.meta.id, pidx)):
                try:
                    parts.append(self.publish(part_req))
                except Exception as exc:
                    parts.append(Outcome.failed(exc))
            else:
                parts.append(self._publish_remote(q, pidx, part_req))  # (run by sum_parts)
        self.node.spawn(sum_parts(parts, result))

    async def _publish_remote(self, q: Queue, pidx: int, req: PublishRequest) -> PublishResult:
        node = self.node
        commit, clock = node.commit, node.clock
        deadline = clock.monotonic() + node.election_wait
        frame = Publish(rid=0, queue=q.name, messages=req.messages, producer_id=req.producer_id,
                        partition=pidx if req.dense else None, tx=req.tx)
        hops = req.hops + 1
        if hops > MAX_HOPS:
            # (at once: waiting here changes nothing, the members it passed wait and retry)
            raise UnavailableError("publish forwarded too many times while the group elects: retry")
        while True:
            try:
                who = await commit.wait_active((q.meta.id, pidx), max(0.1, deadline - clock.monotonic()))
                if who == node.config.name:
                    return await self.publish(replace(req, partition=pidx, hops=hops))
                out = await node.forward(who, PublishFwd(hops, pidx, encode(frame)[4:]))
                stored, duplicates, last = decode_reply(out)
                return PublishResult(int(stored), int(duplicates), int(last))
            except (UnavailableError, NotActiveError):
                # The active went away mid-request.  With a producer id a resend is safe (the
                # next active drops what it already has): try again until the deadline.
                if req.producer_id is None or clock.monotonic() >= deadline or node.stopping:
                    raise
                await commit.wait_change(0.2)


class _Resent:
    """The reply of a batch sent again after its active changed before its entry committed.
    The next active finds held what the first try stored, if that entry committed after all:
    those are stored by this publish, and only the seqs held before it came (``held``, as the
    first try counted them) are duplicates."""

    __slots__ = ("_reply", "_held")

    def __init__(self, reply: Reply[PublishResult], held: int) -> None:
        self._reply, self._held = reply, held

    def done(self) -> bool:
        return self._reply.done()

    def set_result(self, r: PublishResult) -> None:
        mine = max(0, r.duplicates - self._held)
        self._reply.set_result(replace(r, stored=r.stored + mine, duplicates=r.duplicates - mine))

    def set_exception(self, error: BaseException) -> None:
        self._reply.set_exception(error)


async def _relay(work: Coroutine[Any, Any, PublishResult], result: Reply[PublishResult]) -> None:
    try:
        r = await work
    except Exception as exc:
        if not result.done():
            result.set_exception(exc)
        return
    if not result.done():
        result.set_result(r)


async def sum_parts(parts: list[Outcome[PublishResult] | Coroutine[Any, Any, PublishResult]],
                     result: Reply[PublishResult]) -> None:
    """The remote parts run at once as this task's own: cancelled (the node stops), it ends them."""
    running = [asyncio.ensure_future(p) if asyncio.iscoroutine(p) else p for p in parts]
    stored = duplicates = 0
    error: BaseException | None = None
    try:
        for part in running:  # each is settled on its own: waiting in order costs nothing
            try:
                r = await part
            except Exception as exc:
                error = error or exc
                continue
            stored += r.stored
            duplicates += r.duplicates
    finally:
        left = [p for p in running if isinstance(p, asyncio.Future) and not p.done()]
        for p in left:
            p.cancel()
        if left:
            await asyncio.wait(left)
    if result.done():
        return
    if error is not None:
        result.set_exception(error)
    else:
        result.set_result(PublishResult(stored, duplicates, -1))
