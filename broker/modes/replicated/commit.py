"""Proposals: the ops this node's clients change partitions with, staged into log entries.

Ops become one entry per log per turn of the event loop.  Two things make entries
fewer and larger, because every entry costs each node a write, a frame, a reply and an
apply (docs/replication.md, "one entry in flight"):

* While an entry of a partition this node proposed is not yet committed, what is staged
  for that partition waits for the commit (MAX_UNCOMMITTED; or until STAGE_BYTES of
  message bodies pile up) and then goes as one entry: under load, entries grow with the
  commit's round trip instead of one per turn of the loop.
* Settlements (acks) are proposed lazily: they ride in the partition's next entry, a
  publish's most often, or go on their own after the node's ``ack_linger`` (or once
  LAZY_PROPOSE_OPS ops wait).  An ack is answered before it commits in any case; a crash
  of the active in this window redelivers the message, as an OS crash does on a single
  node (docs/replication.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from broker.config import NodeConfig
from broker.peers.codec import CATALOGUE, Key, encode_ops
from broker.modes.replicated.compaction import WeakHold
from broker.modes.replicated.host import Callback
from broker.modes.replicated.partlog import PartLog
from client.clock import Cancellable, Clock
from client.errors import NotActiveError, TandemError, UnavailableError
from ha.messages import Ready
from storage.topology import DropExchange, PutExchange, SetBinding
from storage.base import Append, DropQueue, DropUser, GrantAcl, PackedRun, PutQueue, PutUser, RevokeAcl, SeedAdmin, \
    SetDrained, SetFeatureLevel, SetGroup, SetPlacement, WriteOp

log = logging.getLogger("tandem.ha")

LAZY_PROPOSE_OPS = 4096
MAX_UNCOMMITTED = 1
STAGE_BYTES = 1024 * 1024

#: feeds a log's core a step and carries out the Ready it returns
Guarded = Callable[[PartLog, Callable[[], Ready]], None]


def waits_for_commit(plog: PartLog) -> bool:
    """Whether what is staged for ``plog`` waits for this node's entry in flight to commit
    (MAX_UNCOMMITTED) rather than go now.  It goes now once it is big (STAGE_BYTES of bodies,
    or LAZY_PROPOSE_OPS ops), for the catalogue, and once the term has moved on since the
    entry in flight was proposed: an entry of an older term commits only with one of the
    current term, which only the next proposal can be.  (The core steps down whenever it
    raises its own term, ha/replica.py ``_follow``, which fails what waits; the term check is
    the second line, should an active's term ever move on without a step-down.)"""
    return (len(plog.waiters) >= MAX_UNCOMMITTED and plog.staged_bytes < STAGE_BYTES
            and len(plog.staged_ops) < LAZY_PROPOSE_OPS and plog.key != CATALOGUE
            and plog.proposed_term == plog.replica.term)


class Proposals:
    """Staging and proposing.  ``guarded`` hands a proposal's Ready to the coordinator;
    ``broken()`` says the node is stopping for an inconsistent state (nothing more is
    proposed)."""

    def __init__(self, config: NodeConfig, clock: Clock, logs: Mapping[Key, PartLog], *, guarded: Guarded,
                 broken: Callable[[], bool]) -> None:
        self.me = config.name
        self.linger = config.ack_linger
        self.hold = config.weak_hold_bytes
        self._clock = clock
        self._logs = logs
        self._guarded = guarded
        self._broken = broken
        self._scheduled: set[PartLog] = set()  # logs to propose for at the next flush
        self._deferred: set[PartLog] = set()  # logs whose staged ops wait for a commit (MAX_UNCOMMITTED)
        self._lazy: set[PartLog] = set()  # logs holding lazily staged ops only, for the timer
        self._lazy_timer: Cancellable | None = None

    def propose(self, ops: list[WriteOp], callback: Callback | None, *, lazy: bool = False) -> None:
        """Replicate partition ops; ``callback(err)`` once all of them are committed (or not).

        Ops of partitions not served here fail with NotActiveError (their messages are
        the new active's business: a settlement lost this way means a redelivery).
        ``lazy``: no hurry (settlements): they wait for the partition's next entry, at
        most the node's ``ack_linger``."""
        by_key: dict[Key, list[WriteOp]] = {}
        for op in ops:
            by_key.setdefault((op.queue_id, op.partition), []).append(op)  # type: ignore[union-attr]
        if not by_key:
            if callback is not None:
                callback(None)
            return
        if len(by_key) == 1 and callback is not None:  # (a publish: one partition, its callback as it is)
            [(key, kops)] = by_key.items()
            self._stage_one(key, kops, callback, lazy)
            return
        remaining = len(by_key)
        first_error: BaseException | None = None

        def one(err: BaseException | None) -> None:
            nonlocal remaining, first_error
            if err is not None and first_error is None:
                first_error = err
            remaining -= 1
            if remaining == 0 and callback is not None:
                callback(first_error)

        for key, kops in by_key.items():
            self._stage_one(key, kops, one, lazy)

    def _stage_one(self, key: Key, ops: list[WriteOp], callback: Callback, lazy: bool) -> None:
        plog = self._logs.get(key)
        if plog is None or not plog.serving:
            callback(NotActiveError(f"partition {key[0]}/{key[1]} is not active on {self.me}"))
        elif self._weak_full(plog, ops):
            callback(UnavailableError(
                f"partition {plog.name} on {self.me}: this publish would take what it holds of writes under a "
                f"quorum override or as designated primary, which no majority holds yet, past weak_hold_bytes "
                f"({self.hold} bytes); it takes none until the group heals (what the other side's active "
                f"discards then goes to the quarantine) or the node runs with a larger --weak-hold-bytes: retry"))
        else:
            self.stage(plog, ops, callback, lazy=lazy)

    def _weak_full(self, plog: PartLog, ops: list[WriteOp]) -> bool:
        """Whether ``ops`` would take what ``plog``'s active wrote under a weak override past
        what the node keeps of such writes (compaction.WeakHold, with what is staged): past
        it they could be compacted and lost on a heal, so they are refused instead."""
        if not plog.replica.unheld_tail() or not any(type(op) is Append for op in ops):  # (cheap: first)
            return False
        if plog.weak_hold is None:
            plog.weak_hold = WeakHold(self.hold)
        return plog.weak_hold.reached(plog.replica, plog.applied_bytes, plog.staged_bytes + _body_bytes(ops))

    def propose_catalogue(self, ops: list[WriteOp], callback: Callback) -> None:
        plog = self._logs[CATALOGUE]
        if not plog.serving:
            callback(NotActiveError(f"the catalogue is not active on {self.me}"))
            return
        self.stage(plog, ops, callback)

    def stage(self, plog: PartLog, ops: list[WriteOp], callback: Callback, *, lazy: bool = False) -> None:
        """Ops become one entry per log per turn of the event loop.  Lazy ops wait for the
        log's next eager ones (one entry for both, in the order they were staged) or for
        the lazy timer: with consumers on, an ack per message would double the entries
        every node writes, ships and applies."""
        plog.staged_ops.extend(ops)
        plog.staged_cbs.append(callback)
        plog.staged_bytes += _body_bytes(ops)
        if plog in self._deferred:
            if waits_for_commit(plog):
                return  # it goes once the entry in flight commits (undefer)
            self._deferred.discard(plog)
        if lazy and self.linger > 0 and len(plog.staged_ops) < LAZY_PROPOSE_OPS:
            if plog not in self._scheduled and plog not in self._lazy:
                plog.lazy_since = self._clock.monotonic()
                self._lazy.add(plog)
                if self._lazy_timer is None:
                    self._lazy_timer = self._clock.call_later(self.linger, self._lazy_due)
            return
        self._lazy.discard(plog)
        self._schedule(plog)

    def _schedule(self, plog: PartLog) -> None:
        if not self._scheduled:
            asyncio.get_running_loop().call_soon(self._flush)
        self._scheduled.add(plog)

    def _lazy_due(self) -> None:
        """The timer: propose the logs whose oldest lazy op has waited ``ack_linger`` (each
        its full wait, as HeldWrites does for held writes), and re-arm for the rest."""
        self._lazy_timer = None
        now = self._clock.monotonic()
        due = {plog for plog in self._lazy if now - plog.lazy_since >= self.linger}
        if due:
            self._lazy -= due
            self._scheduled |= due
            self._flush()
        if self._lazy:
            wait = min(plog.lazy_since for plog in self._lazy) + self.linger - now
            self._lazy_timer = self._clock.call_later(max(0.001, wait), self._lazy_due)

    async def flush_lazy(self, timeout: float) -> None:
        """Propose every staged op now (lazy ones, and those waiting for an entry in flight
        to commit) and wait, at most ``timeout`` seconds, until their entries are committed
        or failed (a clean stop, so that the acks of its last ``ack_linger`` are not lost
        with it)."""
        self.cancel_lazy()
        lazy, self._lazy = self._lazy | self._deferred, set()
        self._deferred = set()
        if not lazy or self._broken():
            return  # (broken: nothing more is written; the waiters fail with the stop)
        # one more callback in each entry about to go: it runs once the entry commits or fails
        loop = asyncio.get_running_loop()
        settled: list[asyncio.Future[None]] = []

        def settle(fut: asyncio.Future[None]) -> Callback:
            return lambda _err: None if fut.done() else fut.set_result(None)

        for plog in lazy:
            if plog.staged_cbs:
                settled.append(loop.create_future())
                plog.staged_cbs.append(settle(settled[-1]))
        self._scheduled |= lazy
        self._flush(force=True)
        try:
            async with self._clock.timeout(timeout):
                await asyncio.gather(*settled)
        except TimeoutError:
            log.warning("stopping with acks not yet committed on %d partition(s): their messages "
                        "will be delivered again", sum(not f.done() for f in settled))

    def cancel_lazy(self) -> None:
        """Stop the lazy timer (what it waited for stays staged)."""
        if self._lazy_timer is not None:
            self._lazy_timer.cancel()
            self._lazy_timer = None

    def stop(self) -> None:
        self.cancel_lazy()
        self._lazy.clear()

    def undefer(self, plog: PartLog) -> None:
        """Schedule what ``plog`` holds back for its entry in flight, once it need wait no more."""
        if plog in self._deferred and not waits_for_commit(plog) and not plog.replica.handing_over:
            self._deferred.discard(plog)
            self._schedule(plog)

    def _flush(self, *, force: bool = False) -> None:
        """Propose what is staged, an entry per log; a log with an entry of its own in flight
        waits for its commit instead (MAX_UNCOMMITTED), unless ``force``."""
        plogs, self._scheduled = self._scheduled, set()
        for plog in sorted(plogs, key=_log_key):  # (in key order: the same order on every run)
            if not plog.staged_cbs:
                continue
            if plog.replica.handing_over or (not force and waits_for_commit(plog)):
                # Handing over (failback): they go once it gives up, or fail with the
                # step-down that unloads the partition, never while it goes on serving.
                self._deferred.add(plog)
                continue
            self._deferred.discard(plog)
            ops, cbs = plog.staged_ops, plog.staged_cbs
            plog.staged_ops, plog.staged_cbs = [], []
            plog.staged_bytes = 0
            if self._logs.get(plog.key) is not plog:
                continue
            data, ops = encode_ops(ops)
            ready, entry = plog.replica.propose(data)
            if entry is None:
                err = NotActiveError(f"partition {plog.name} is not active on {self.me}")
                for cb in cbs:
                    cb(err)
            else:
                plog.waiters[entry.index] = (ops, cbs)
                plog.proposed_term = entry.term
                if any(isinstance(op, (Append, PutQueue, DropQueue, PutUser, DropUser, GrantAcl, RevokeAcl,
                                       SeedAdmin, SetDrained, SetPlacement, SetGroup, SetFeatureLevel, PutExchange,
                                       DropExchange, SetBinding)) for op in ops):
                    plog.must_sync.add(entry.index)
            self._guarded(plog, lambda: ready)

    def fail_waiters(self, plog: PartLog, err: TandemError) -> None:
        """Fail what ``plog``'s proposals and staged ops wait for."""
        waiters, plog.waiters = plog.waiters, {}
        staged, plog.staged_cbs = plog.staged_cbs, []
        plog.staged_ops = []
        plog.staged_bytes = 0
        self._deferred.discard(plog)
        for _ops, cbs in waiters.values():
            for cb in cbs:
                cb(err)
        for cb in staged:
            cb(err)


def _log_key(plog: PartLog) -> Key:
    return plog.key


def _body_bytes(ops: list[WriteOp]) -> int:
    """The message bodies the ``Append`` ops of ``ops`` carry."""
    n = 0
    for op in ops:
        if type(op) is Append:
            msgs = op.messages
            n += len(msgs.payload) if type(msgs) is PackedRun else sum(len(m.body) for m in msgs)
    return n
