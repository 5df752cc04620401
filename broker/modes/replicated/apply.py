"""Committed entries and installed snapshots, turned into store writes (the catalogue's ops
applied here first, :class:`CatalogueOps`); and those writes held back for a moment
(:class:`HeldWrites`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from broker.messaging.window import learn
from broker.peers.codec import (CATALOGUE, Key, MalformedReplicationError, decode_catalogue_snapshot, decode_ops,
                                      snapshot_ops)
from broker.modes.replicated.host import Applier, Callback, GroupState, Placements, StoreWriter
from broker.modes.replicated.partlog import PartLog
from client.clock import Cancellable, Clock
from ha.members import is_change
from ha.messages import Entry, InstallSnapshot
from storage.topology import DropExchange, PutExchange, SetBinding
from storage.base import (Append, DropQueue, DropUser, GrantAcl, PutApplied, PutQueue, PutUser, QueueMeta, RevokeAcl,
                          SeedAdmin, SetDrained, SetFeatureLevel, SetGroup, SetPlacement, SetUpdating, WriteOp)

log = logging.getLogger("tandem.ha")

# Committed entries reach the store this long after they commit (or once this many bytes of
# them are waiting): the log has them on disk already, and a message acked in the meantime
# is never written to the store at all.  The log is the record until then: a restart
# applies again from the store's applied position; a node that becomes active applies what
# it holds at once.  0.2 s: long enough that a consumer keeping up acks its messages before
# they are written (publish, deliver, ack and the ack's commit take ~0.1 s under full load
# here); the writer commits such a batch in slices behind log appends (storage/writer.py), so
# a confirm does not wait for it (docs/replication.md).
HOLD_APPLY = 0.2
HOLD_APPLY_BYTES = 8 * 1024 * 1024

#: catalogue ops that change the users or their grants (the node applies them)
SECURITY_OPS = (PutUser, DropUser, GrantAcl, RevokeAcl, SeedAdmin)

#: applies committed catalogue ops here; returns the ops to store
CatalogueApply = Callable[[list[WriteOp]], list[WriteOp]]
#: installs the users and grants of a catalogue snapshot here; returns the ops to store
SecurityInstall = Callable[[dict[str, Any]], list[WriteOp]]


def apply_entries(plog: PartLog, entries: list[Entry], callbacks: list[list[Callback]],
                  catalogue: CatalogueApply) -> list[WriteOp]:
    """The store writes of ``entries``, committed, with the new applied position last; the
    callbacks of this node's proposals among them go to ``callbacks``."""
    ops: list[WriteOp] = []
    key = plog.key
    for e in entries:
        waiting = plog.waiters.pop(e.index, None)
        if e.data is not None and not is_change(e.data):  # (a membership change is the core's)
            if waiting is not None and waiting[0] is not None:
                entry_ops = waiting[0]
            else:
                entry_ops = decode_ops(key, e.data)
            if key == CATALOGUE:
                entry_ops = catalogue(entry_ops)
            else:
                learn(plog.windows, entry_ops)
            ops.extend(entry_ops)
        if waiting is not None:
            callbacks.append(waiting[1])
        plog.applied = (e.index, e.term, e.origin)
        plog.applied_bytes += len(e.data or b"")
    ops.append(PutApplied(key[0], key[1], *plog.applied))
    return ops


def install_ops(plog: PartLog, m: InstallSnapshot, queue_ids: set[int], catalogue: CatalogueApply,
                security: SecurityInstall) -> list[WriteOp]:
    """The store writes of installing snapshot ``m`` (``queue_ids``: the queues known here)."""
    log.info("partition %s: installing a snapshot from %s at index %d", plog.name, m.leader, m.index)
    plog.applied = (m.index, m.last_term, m.last_origin)
    plog.applied_bytes = 0  # the log before it is gone
    plog.windows.clear()  # (the seqs it took are not in a snapshot: the producers' last ones are)
    if plog.key == CATALOGUE:
        metas, users = decode_catalogue_snapshot(m.data)
        # the group's members and placements first: the queues open where they place them
        out = security(users) if users is not None else []
        # (every queue: one known here may have got partitions or another mapper since, broker.partitions.remap;
        # one unchanged is a no-op)
        ops: list[WriteOp] = [PutQueue(meta) for meta in metas]
        ops.extend(DropQueue(qid) for qid in queue_ids - {meta.id for meta in metas})
        out.extend(catalogue(ops))
        return out
    return snapshot_ops(plog.key, m.data)


class CatalogueOps:
    """Committed catalogue ops applied here, each by the part of the node it changes: a
    declare or a delete by the catalogue (``state``), which then has the queue's logs opened
    (``open_queue``) or dropped (``drop_queue``); users and grants, drains, placements, the
    group's members and updates by their own parts.  ``changed()`` once they are applied."""

    def __init__(self, state: GroupState, security: Applier[WriteOp], drains: Applier[SetDrained],
                 moves: Placements, remaps: Applier[SetUpdating], *, open_queue: Callable[[QueueMeta], None],
                 drop_queue: Callable[[int], None], changed: Callable[[], None]) -> None:
        self._state = state
        self._security = security
        self._drains = drains
        self._moves = moves
        self._remaps = remaps
        self._open_queue = open_queue
        self._drop_queue = drop_queue
        self._changed = changed

    def apply(self, ops: list[WriteOp]) -> list[WriteOp]:
        """Apply committed catalogue ops here; the ops to store (a declare that lost a race
        for its name is a no-op everywhere)."""
        out: list[WriteOp] = []
        declared = {op.queue.id for op in ops if isinstance(op, PutQueue)}
        for op in ops:
            if isinstance(op, PutQueue):
                if self._state.catalogue_put(op.queue):
                    out.append(op)
                    # a queue declared with explicit node lists: its entry places its partitions
                    for sp in ops:
                        if isinstance(sp, SetPlacement) and sp.queue_id == op.queue.id:
                            out.extend(self._moves.apply(sp))
                    self._open_queue(op.queue)
            elif isinstance(op, DropQueue):
                self._state.catalogue_drop(op.queue_id)
                self._drop_queue(op.queue_id)
                out.append(op)
            elif isinstance(op, SECURITY_OPS):
                out.extend(self._security.apply(op))
            elif isinstance(op, SetDrained):
                out.extend(self._drains.apply(op))
            elif isinstance(op, SetPlacement) and op.queue_id not in declared:
                out.extend(self._moves.apply(op))
            elif isinstance(op, SetGroup):
                out.extend(self._state.group_apply(op))
            elif isinstance(op, SetUpdating):
                out.extend(self._remaps.apply(op))
            elif isinstance(op, SetFeatureLevel):
                out.extend(self._state.level_apply(op))
            elif isinstance(op, (PutExchange, DropExchange, SetBinding)):
                out.extend(self._state.topology_apply(op))
        self._changed()
        return out


def one_applied_position(ops: list[WriteOp]) -> list[WriteOp]:
    """Store writes held across several Readies, with one applied position: the newest.
    A Ready that only compacted the log brings none, so the newest is not always the last
    op; the newest must be the one written, or a restart would apply entries again over
    rows that already have them."""
    out: list[WriteOp] = []
    newest: WriteOp | None = None
    for op in ops:
        if type(op) is PutApplied:
            newest = op
        else:
            out.append(op)
    if newest is not None:
        out.append(newest)
    return out


def messages_in(key: Key, payloads: tuple[bytes | None, ...]) -> int:
    """How many published messages these log entries carried."""
    n = 0
    for data in payloads:
        if data is None or key == CATALOGUE or is_change(data):
            continue
        try:
            n += sum(len(op.messages) for op in decode_ops(key, data) if isinstance(op, Append))
        except MalformedReplicationError:
            log.warning("HA-1014 on %s: a discarded entry could not be decoded to count its messages", key)
    return n


class HeldWrites:
    """Store writes of committed entries, held back for HOLD_APPLY; written at once while a
    new active waits for them to start serving, for the catalogue, and once
    HOLD_APPLY_BYTES of them wait.

    ``stored(plog, index)`` runs once the store has every entry of ``plog`` up to
    ``index`` applied; ``fatal(why)`` when a write fails."""

    def __init__(self, clock: Clock, writer: StoreWriter, logs: Mapping[Key, PartLog], *,
                 stored: Callable[[PartLog, int], None], fatal: Callable[[str], None]) -> None:
        self._clock = clock
        self._writer = writer
        self._logs = logs
        self._stored = stored
        self._fatal = fatal
        self._held: set[PartLog] = set()  # logs holding store writes back
        self._timer: Cancellable | None = None
        self.stopping = False  # the writer is closing: nothing more is held

    def hold(self, plog: PartLog, ops: list[WriteOp], size: int) -> None:
        if self.stopping:
            return  # the log has them, a restart applies them
        plog.held_ops.extend(ops)
        plog.held_bytes += size
        plog.held_upto = plog.applied[0]
        if plog.serve_from or plog.key == CATALOGUE or plog.held_bytes >= HOLD_APPLY_BYTES:
            self.release(plog, eager=bool(plog.serve_from))
            return
        if plog not in self._held:
            clock = self._clock
            plog.held_since = clock.monotonic()
            self._held.add(plog)
            if self._timer is None:
                self._timer = clock.call_later(HOLD_APPLY, self._release_due)

    def _release_due(self) -> None:
        self._timer = None
        clock = self._clock
        now = clock.monotonic()
        for plog in sorted(self._held, key=lambda p: p.key):  # (in key order: the same order on every run)
            if now - plog.held_since >= HOLD_APPLY:
                self.release(plog)
        if self._held:
            wait = min(plog.held_since for plog in self._held) + HOLD_APPLY - now
            self._timer = clock.call_later(max(0.001, wait), self._release_due)

    def release(self, plog: PartLog, *, eager: bool = False) -> None:
        """Submit the store writes ``plog`` holds (eager: commit them now).  A log that was
        replaced (resync) or dropped (queue deleted) writes nothing: its rows are reset."""
        held, plog.held_ops = plog.held_ops, []
        plog.held_bytes = 0
        self._held.discard(plog)
        key = plog.key
        if not held or self._logs.get(key) is not plog:
            return
        ops = one_applied_position(held)
        applied_upto = plog.held_upto

        def applied(err: BaseException | None) -> None:
            if err is not None:
                self._fatal(f"applying {plog.name} to the store failed: {err}")
            elif self._logs.get(key) is plog:
                self._stored(plog, applied_upto)

        self._writer.submit(ops, sync=False, callback=applied, lazy=not eager)

    def cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
