""":class:`Replication`: the I/O that feeds each partition's :class:`ha.replica.Replica`.

It ticks every log's core, carries out each Ready the cores return (log writes, then
messages, then the confirms of committed proposals), and wires the parts of the
package together: proposals (commit.py), applying committed entries (apply.py), who
serves what (serving.py), peer messages (transport.py), which logs this node holds and
their members (reconcile.py), what happened (events.py).

* **Persist before send.**  A Ready's log changes and hard state are one writer
  submission: ``sync`` on the active, ``remote_sync`` on replicas.  A replica's
  messages (votes, append replies) leave only once that write is committed, in order;
  the active ships appends at once and counts itself toward a commit only when
  :meth:`Replica.persisted` says its write is done.
* **Alive while a disk is slow.**  A replica whose replies wait for its log write
  tells the active it is up (``Alive``), so a disk's hiccup does not cost an election
  (:meth:`Replication._keep_alive`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from broker.config import ALIVE_GIVE_UP, NodeConfig
from broker.modes.replicated.apply import CatalogueOps, HeldWrites, apply_entries, install_ops
from broker.modes.replicated.commit import Proposals
from broker.modes.replicated.compaction import (COMPACT_BYTES, COMPACT_EVERY, KEEP_BYTES, WEAK_COMPACT_FACTOR,
                                                compact_upto, weak_cap)
from broker.modes.replicated.events import EventLog, HaEvent
from broker.modes.replicated.host import (Applier, Callback, GroupState, GroupView, NodeEvents, PeerGroup, Placements,
                                          Quarantine, Queues, Respread, StoreWriter)
from broker.modes.replicated.partlog import PartLog, compacted, replica_config
from broker.modes.replicated.reconcile import Reconciler, streaming_key
from broker.modes.replicated.segments import UNPIN_EVERY, unpin_segments
from broker.modes.replicated.serving import PartitionNotifier, Serving
from broker.modes.replicated.transport import Transport
from broker.peers.codec import CATALOGUE, Key, streamed_parts
from client.clock import Clock
from client.errors import NotActiveError, UnavailableError
from client.protocol.frames import PartitionInfo
from ha.messages import Alive, EntriesDiscarded, Envelope, Ready
from ha.placement import DistributionPolicy, NodeList
from ha.replica import ReplicaConfig, Role
from storage.base import (DurabilityPolicy, Engine, LogAppend, LogCompact, LogRecord, LogState, LogTruncate,
                          PutApplied, PutHardState, PutMeta, SetDrained, SetUpdating, WriteOp)

log = logging.getLogger("tandem.ha")


class Replication:
    """This node's replication logs (one per partition it holds, and the catalogue) and
    the parts around them: ``proposals`` (commit.py), ``roles`` (who serves what,
    serving.py), ``held`` (store writes held back, apply.py), ``transport``,
    ``reconciler`` (the logs held here and their members, reconcile.py), ``event_log``
    (events.py)."""

    def __init__(self, config: NodeConfig, clock: Clock, *, engine: Engine, writer: StoreWriter,
                 peers: PeerGroup | None, queues: Queues, moves: Placements, security: Applier[WriteOp],
                 drains: Applier[SetDrained], remaps: Applier[SetUpdating], respread: Respread,
                 state: GroupState, placement: GroupView, quarantine: Quarantine, node: NodeEvents,
                 logs: dict[Key, LogState], meta: dict[str, str] | None = None) -> None:
        self.config = cfg = config
        self.clock = clock
        self._engine = engine
        self._writer = writer
        self._peers = peers
        self._queues = queues
        self._moves = moves
        self._state = state
        self._view = placement
        self._node = node
        self.me = cfg.name
        self.priority = cfg.priority
        self.quorum_override: int | None = None
        self.designated_primary: str | None = cfg.name if cfg.designated_primary else None
        #: the LockFile arbiter's say (broker.arbiters.lockfile): None under majority elections, else
        #: (this node holds the lock, it commits alone); see partlog.replica_config
        self.lock_role: tuple[bool, bool] | None = None
        #: the LockFile arbiter's gate: while it says False this node proposes and confirms nothing
        self.confirm_gate: Callable[[], bool] | None = None
        self.gate_refusals = 0  # proposals and confirms the gate refused
        self.logs: dict[Key, PartLog] = {}
        self._stopping = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._broken = False
        self.proposals = Proposals(config, clock, self.logs, guarded=self._guarded, broken=lambda: self._broken)
        self.roles = Serving(self.me, clock, self.logs, engine=engine, peers=peers, queues=queues, moves=moves,
                             node=node, placed=self.placed, spawn=self._spawn,
                             fail_waiters=self.proposals.fail_waiters)
        self.event_log = EventLog(self.me, clock, self.roles, quarantine)
        self.held = HeldWrites(clock, writer, self.logs, stored=self.roles.stored_upto, fatal=self._fatal)
        members, policy = placement.placement()
        self.reconciler = Reconciler(
            config, clock, self.logs, stored=logs, meta=meta or {}, members=members, policy=policy, writer=writer,
            queues=queues, moves=moves, respread=respread, roles=self.roles, proposals=self.proposals,
            held=self.held, events=self.event_log, replica_config=self._replica_config,
            stands=lambda: self.lock_role is not None and self.lock_role[0], guarded=self._guarded,
            spawn=self._spawn)
        self._catalogue_ops = CatalogueOps(state, security, drains, moves, remaps,
                                           open_queue=self.reconciler.open_queue,
                                           drop_queue=self.reconciler.drop_queue, changed=self.roles.notify)
        self.transport = Transport(config, clock, self.logs, engine=engine, writer=writer, peers=peers,
                                   queues=queues, group_state=state.security_snapshot,
                                   release_held=self.held.release, spawn=self._spawn,
                                   restart=self.reconciler.restart)

    # -- what happened here (events.py): tandem status, metrics ----------------------------------

    @property
    def events(self) -> deque[HaEvent]:
        return self.event_log.events

    @property
    def discarded_total(self) -> int:
        return self.event_log.discarded_total

    @property
    def discarded_messages(self) -> int:
        return self.event_log.discarded_messages

    @property
    def confirmed_lost(self) -> int:
        return self.event_log.confirmed_lost

    @property
    def confirmed_lost_messages(self) -> int:
        return self.event_log.confirmed_lost_messages

    @property
    def elections(self) -> int:
        return self.event_log.elections

    # -- the node's view: proposals, who is active ----------------------------------------------

    @property
    def changed(self) -> asyncio.Event:
        """Set (and replaced) whenever a role or an active changes."""
        return self.roles.changed

    def quorum_changed(self) -> None:
        """The node quorum changed: who is active, as this node knows it, may have too."""
        self.roles.notify()

    def propose(self, ops: list[WriteOp], callback: Callback | None, *, lazy: bool = False) -> None:
        if self._gate_closed(callback):
            return
        self.proposals.propose(ops, callback, lazy=lazy)

    def propose_catalogue(self, ops: list[WriteOp], callback: Callback) -> None:
        if self._gate_closed(callback):
            return
        self.proposals.propose_catalogue(ops, callback)

    def _gate_closed(self, callback: Callback | None) -> bool:
        """The LockFile arbiter does not let this node write now: refuse, naming the holder."""
        if self.confirm_gate is None or self.confirm_gate():
            return False
        self.gate_refusals += 1
        if callback is not None:
            callback(self._not_serving())
        return True

    def _not_serving(self) -> NotActiveError:
        holder = next((plog.replica.leader for plog in self.logs.values()
                       if plog.replica.leader not in (None, self.me)), None)
        return NotActiveError(f"node {self.me} does not hold the group's lock"
                              + (f": {holder} is active" if holder else ""), active_hint=holder)

    def arbitrate(self, holder: bool, alone: bool, reason: str) -> None:
        """The LockFile arbiter changed its say: every log reconfigured at once; a node that
        lost the lock steps down everywhere, one that took it stands at once."""
        was = self.lock_role
        self.lock_role = (holder, alone)
        self.reconfigure()
        for plog in list(self.logs.values()):
            if not holder:
                self._guarded(plog, lambda: plog.replica.step_down(reason))
            elif was is None or not was[0]:
                plog.replica.stand_now()

    def caught_up(self, peer: str) -> bool:
        """On the LockFile holder: ``peer`` has every entry this node committed, in every log
        this node is active for (and it is active for all of them)."""
        for plog in self.logs.values():
            r = plog.replica
            if r.role is not Role.LEADER:
                return False
            if peer in r.cfg.voters + r.cfg.learners and r.progress().get(peer, 0) < r.commit:
                return False
        return True

    async def flush_lazy(self, timeout: float) -> None:
        await self.proposals.flush_lazy(timeout)

    def serving(self, key: Key) -> bool:
        return self.roles.serving(key)

    def active_of(self, key: Key) -> str | None:
        return self.roles.active_of(key)

    def catalogue_commit(self) -> int:
        return self.roles.catalogue_commit()

    def catalogue_applied(self) -> int:
        return self.roles.catalogue_applied()

    async def wait_change(self, timeout: float) -> None:
        await self.roles.wait_change(timeout)

    async def wait_active(self, key: Key, timeout: float) -> str:
        return await self.roles.wait_active(key, timeout)

    def partition_infos(self) -> list[PartitionInfo]:
        return self.roles.partition_infos()

    def foreign_infos(self) -> list[PartitionInfo]:
        return self.roles.foreign_infos()

    def served(self) -> list[tuple[Key, int]]:
        return self.roles.served()

    def holds(self, key: Key) -> bool:
        return key in self.logs

    def add_partition_notifier(self, cb: PartitionNotifier) -> None:
        self.roles.add_partition_notifier(cb)

    # -- placement (reconcile.py) and the cores' configuration ------------------------------------

    @property
    def members(self) -> list[str]:
        """The group's members partitions are placed over."""
        return self.reconciler.members

    @property
    def policy(self) -> DistributionPolicy:
        return self.reconciler.policy

    def start(self) -> None:
        self.reconciler.start()

    def placed(self, key: Key, partitions: int) -> NodeList:
        """Where partition ``key`` is placed: a move's list (broker.partitions.moves), else the policy's."""
        return self.reconciler.placed(key, partitions)

    def set_members(self, members: list[str], policy: DistributionPolicy) -> None:
        """The group's members changed (broker.partitions.members): the logs the placement
        puts here now open, and every log is reconfigured."""
        self.reconciler.set_members(members, policy)
        self.reconfigure()

    def placement_changed(self, key: Key) -> None:
        """A move of partition ``key`` started or ended (a committed catalogue entry)."""
        self.reconciler.placement_changed(key)

    def partition_event(self, key: Key, event: str, why: str) -> None:
        """The partition's state machine (ha.partition) takes ``event`` (an update's)."""
        self.reconciler.partition_event(key, event, why)

    def _replica_config(self, nodes: NodeList) -> ReplicaConfig:
        drained = self._view.drained
        peers = self._peers
        if peers is not None:
            # A node one of whose availability zones lost its quorum has its HA services off.
            # It ranks as drained: what it is active for goes to another node by failback's
            # hand-over, and it stands only where no other node with the data can (a voter
            # whose log is the most recent: it takes over, brings another up to date and
            # hands over).  It stays a replica and a voter.  Its peers learn it from its
            # keep-alives, and rank it as drained too.
            drained = drained | frozenset(peers.ha_off)
            if peers.membership.disabled_by:
                drained = drained | {self.me}
        return replica_config(self.config, nodes, priority=self.priority,
                              designated_primary=self.designated_primary, quorum_override=self.quorum_override,
                              lock=self.lock_role, drained=drained)

    def reconfigure(self) -> None:
        """Priority, quorum_override, designated_primary, the drained members or this node's
        availability zones' quorum changed: every log, at once."""
        for plog in list(self.logs.values()):
            self._guarded(plog, lambda: plog.replica.reconfigure(self.reconciler.config_of(plog)))

    # -- the loop, and peers' messages ----------------------------------------------------------

    async def run(self) -> None:
        interval = min(0.05, self.config.keepalive_interval / 2)
        clock = self.clock
        pins_at = clock.monotonic()
        while True:
            now = clock.monotonic()
            wake = now + interval
            for plog in list(self.logs.values()):
                self._guarded(plog, lambda: plog.replica.tick(now))
                r = plog.replica
                if plog.outbox and r.role is Role.FOLLOWER:  # (a learner's word counts for nothing)
                    self._keep_alive(plog, now)
                # Early only for an election timer: an active's heartbeats keep a phase of their
                # own each, and waking for every one would tick every log N times a round.
                if r.role is not Role.LEADER:
                    at = r.wake_at
                    if now < at < wake:  # (a log whose tick failed must not make this loop spin)
                        wake = at
            if self._moves.moving:
                self.reconciler.reconcile_moves()
            target = self._view.catalogue_target()
            if target is not None:
                self.reconciler.reconcile_catalogue(target, now)
            if now >= pins_at:
                pins_at = now + UNPIN_EVERY
                self._unpin_segments()
                self.reconciler.watch_repairs(now)
            # Round by round, but early for an election timer due before the next round: two
            # replicas whose random timers differ by 20 ms must not bid in the same round, or
            # they split the vote again.  (A timer a message sets, as a refusal's early stand,
            # waits for the next round or message: <= 50 ms.)
            await clock.sleep(max(0.001, wake - clock.monotonic()))

    def _unpin_segments(self) -> None:
        if self._broken or self._stopping:
            return
        try:
            unpin_segments(self.logs, self.held.hold, self.transport.streamed_at, engine=self._engine,
                           writer=self._writer, queues=self._queues, config=self.config)
        except Exception as exc:
            log.exception("compacting the partitions that keep the oldest log segment failed")
            self._fatal(f"log compaction failed: {exc!r}")

    def stop(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        self.held.cancel_timer()
        self.proposals.stop()
        for plog in self.logs.values():
            self.held.release(plog)
            self.proposals.fail_waiters(plog, UnavailableError(f"node {self.me} is shutting down"))
        self._stopping = True
        self.held.stopping = True

    def receive(self, src: str, payload: bytes) -> None:
        """A Replicate frame from peer ``src``."""
        if self._broken:
            return
        now = self.clock.monotonic()
        for plog, msg in self.transport.receive(src, payload):
            r = plog.replica
            if now - r.now > 0.01:  # the core's clock moves only in tick()
                self._guarded(plog, lambda: r.tick(now))
            self._guarded(plog, lambda: plog.replica.step(Envelope(src, self.me, msg)))

    # -- the core's Ready ------------------------------------------------------------------------

    def _handle(self, plog: PartLog, ready: Ready) -> None:
        """Carry out one Ready: one writer submission, then (or at once, on the active)
        the messages, then the callbacks of confirmed proposals."""
        if self._broken or self.logs.get(plog.key) is not plog:
            return  # a log that was replaced (resync) or dropped (queue deleted)
        self._track_leader(plog)
        if self._discards_applied(plog, ready):
            return
        leader = plog.replica.role is Role.LEADER
        policy = self.config.sync if leader else self.config.remote_sync
        ops, sync, promise = self._log_writes(plog, ready, leader, policy)
        for ev in ready.events:
            self.event_log.on(plog, ev)
        callbacks: list[list[Callback]] = []
        apply_ops, applied_size = self._committed(plog, ready, callbacks)
        apply_ops.extend(self._compact(plog))
        # Messages of a replica wait for the write (they promise what is on disk); the
        # active's appends go at once (it counts itself only once persisted), except
        # right after it won: its term must be on disk first.
        wait = bool(ops) and (promise or (not leader and policy is not DurabilityPolicy.NO_SYNC))
        if ops:
            self._write_log(plog, ready, ops, sync, leader, policy)
        if apply_ops:
            self.held.hold(plog, apply_ops, applied_size)
        if ready.messages:
            self._send(plog, ready.messages, wait, leader)
        if callbacks:
            self._confirm(plog, callbacks)

    def _track_leader(self, plog: PartLog) -> None:
        """Who the log's active is, as the node, the partition's lifecycle and what waits for
        commits learn it."""
        r = plog.replica
        if r.leader != plog.known_leader:
            plog.known_leader = r.leader
            self.roles.notify()
        self.roles.track_active(plog)
        self.proposals.undefer(plog)  # (should the term move on without a step-down: see waits_for_commit)

    def _discards_applied(self, plog: PartLog, ready: Ready) -> bool:
        """HA-1014 discarded entries this node had applied: its store is wrong for this
        partition.  Nothing of this Ready is carried out (its replies would promise a log
        about to go): its events are, then the partition starts over."""
        if plog.key == CATALOGUE or not any(isinstance(ev, EntriesDiscarded) and ev.committed
                                            for ev in ready.events):
            return False
        for ev in ready.events:
            self.event_log.on(plog, ev)
        self.reconciler.resync(plog)
        return True

    def _log_writes(self, plog: PartLog, ready: Ready, leader: bool,
                    policy: DurabilityPolicy) -> tuple[list[WriteOp], bool, bool]:
        """The log writes of ``ready`` (truncation, snapshot, appends, hard state), whether
        they are fsynced, and whether they make a promise (a new term or vote: on disk
        before anyone hears of it)."""
        key = plog.key
        ops: list[WriteOp] = []
        sync = False
        if ready.truncate_from is not None or ready.snapshot is not None:
            self.held.release(plog)  # what is held goes to the store first, in order
        if ready.truncate_from is not None:
            ops.append(LogTruncate(key[0], key[1], ready.truncate_from))
        if ready.snapshot is not None:
            m = ready.snapshot
            ops.extend(install_ops(plog, m, {q.meta.id for q in self._queues.queues.values()},
                                   self._catalogue_ops.apply, self._state.security_install))
            ops.append(compacted(key, plog.replica) if plog.replica.snap_index == m.index else
                       LogCompact(key[0], key[1], m.index, m.last_term, m.last_origin, m.weak, (0, 0)))
            ops.append(PutApplied(key[0], key[1], m.index, m.last_term, m.last_origin))
            ops.extend(self.reconciler.base_ops(plog))
            if key != CATALOGUE and streamed_parts(m.data):
                ops.append(PutMeta(streaming_key(key), "0"))  # (the stream's parts, written before, are whole)
            sync = True
        if ready.append:
            ops.append(LogAppend(key[0], key[1], [LogRecord(e.index, e.term, e.origin, e.weak, e.data or b"")
                                                  for e in ready.append], commit=plog.replica.commit))
            if leader:
                plog.appended_at.appended(ready.append[0].index, self.clock.monotonic())
            # The active fsyncs (SYNC) entries that carry publishes; settlements and delivery
            # marks are written without: losing one in an OS crash means a redelivery, as on
            # a single node.  (Replicas follow remote_sync for all.)
            if policy is DurabilityPolicy.SYNC:
                sync = sync or not leader or any(e.index in plog.must_sync for e in ready.append)
            if plog.must_sync:
                plog.must_sync.difference_update([e.index for e in ready.append])
        promise = False
        if ready.hard_state is not None:
            hs = ready.hard_state
            # Written when the term or vote changes.  A commit index that only moved is not
            # written on its own: the applied position, written with the applies, stands
            # for it on restart (a row rewrite per entry would double the WAL traffic).
            if (hs.term, hs.voted_for) != plog.promised:
                ops.append(PutHardState(key[0], key[1], hs.term, hs.voted_for, hs.commit))
                plog.promised = (hs.term, hs.voted_for)
                promise = True
                sync = True
        return ops, sync, promise

    def _committed(self, plog: PartLog, ready: Ready, callbacks: list[list[Callback]]) -> tuple[list[WriteOp], int]:
        """The store writes of the entries ``ready`` commits, and their bytes; the callbacks of
        this node's proposals among them go to ``callbacks``.  Applying them to the store can
        wait for the next commit (held): the log already has them durably, and a restart
        re-applies from the applied position."""
        if not ready.committed:
            return [], 0
        applied_size = plog.applied_bytes
        apply_ops = apply_entries(plog, ready.committed, callbacks, self._catalogue_ops.apply)
        self.proposals.undefer(plog)  # what waited for these commits goes now
        if plog.key == CATALOGUE and all(e.data is None for e in ready.committed):
            # A new active's no-op moves the catalogue's applied position too, and the node's
            # catalogue catch-up waits on that (entries with data notify in CatalogueOps.apply).
            self.roles.notify()
        return apply_ops, plog.applied_bytes - applied_size  # (before compaction recounts it)

    def _compact(self, plog: PartLog) -> list[WriteOp]:
        """Compact the log once enough is applied (COMPACT_EVERY entries or COMPACT_BYTES): the
        store writes that record it."""
        r, key = plog.replica, plog.key
        if r.applied - r.snap_index < COMPACT_EVERY and plog.applied_bytes < plog.compact_at:
            return []
        hold = self.config.weak_hold_bytes
        upto, plog.applied_bytes = compact_upto(r, self.transport.streamed_at(key, r.progress()), hold)
        # next time once COMPACT_BYTES - KEEP_BYTES more are applied (not at every Ready
        # while a slow replica holds more than COMPACT_BYTES back)
        plog.compact_at = plog.applied_bytes + COMPACT_BYTES - KEEP_BYTES
        if weak_cap(r, hold)[1] and not plog.weak_compacted:
            plog.weak_compacted = True
            log.error("partition %s on %s: more than %d bytes written under a weak override (quorum_override "
                      "or designated_primary) that no majority holds (%d x weak_hold_bytes: publishes stopped "
                      "at weak_hold_bytes, acks and deliveries went on): compacting them; should the group heal "
                      "against another active, they can be neither compared with its log nor kept in the "
                      "quarantine", plog.name, self.me, WEAK_COMPACT_FACTOR * hold, WEAK_COMPACT_FACTOR)
        if upto <= r.snap_index:
            return []
        r.compact(upto)
        return [compacted(key, r), *self.reconciler.base_ops(plog)]

    def _write_log(self, plog: PartLog, ready: Ready, ops: list[WriteOp], sync: bool, leader: bool,
                   policy: DurabilityPolicy) -> None:
        """Submit the log writes ``ops``; once written, the messages that waited for them go,
        and the core hears that its entries are persisted."""
        key, r = plog.key, plog.replica
        last = ready.append[-1] if ready.append else None
        plog.write_seq += 1
        seq = plog.write_seq
        snapshot_upto = plog.applied[0] if ready.snapshot is not None else 0

        def written(err: BaseException | None) -> None:
            if err is not None:
                self._fatal(f"replication log write of {plog.name} failed: {err}")
                return
            if self.logs.get(key) is not plog:
                return
            if plog.outbox and plog.outbox[0][0] <= seq:
                plog.replied_at = self.clock.monotonic()
            while plog.outbox and plog.outbox[0][0] <= seq:
                for env in plog.outbox.popleft()[1]:
                    self.transport.send(key, env)
            if last is not None and (policy is not DurabilityPolicy.NO_SYNC or not leader):
                self._guarded(plog, lambda: plog.replica.persisted(last))
            self.roles.stored_upto(plog, snapshot_upto)

        self._writer.submit(ops, sync=sync, callback=written)
        if last is not None and leader and policy is DurabilityPolicy.NO_SYNC:
            self._guarded(plog, lambda: r.persisted(last))

    def _send(self, plog: PartLog, messages: list[Envelope], wait: bool, leader: bool) -> None:
        """The Ready's messages: at once, or (``wait``, or others wait already) once the log
        write they follow is done."""
        if wait or plog.outbox:
            target = plog.write_seq
            if plog.outbox and plog.outbox[-1][0] == target:
                plog.outbox[-1][1].extend(messages)
            else:
                plog.outbox.append((target, list(messages), self.clock.monotonic()))
            return
        if not leader:
            plog.replied_at = self.clock.monotonic()
        for env in messages:
            self.transport.send(plog.key, env)

    def _confirm(self, plog: PartLog, callbacks: list[list[Callback]]) -> None:
        """The callbacks of this node's committed proposals."""
        err = None
        if self.confirm_gate is not None and not self.confirm_gate():
            # committed here, but this node no longer holds the group's lock: it confirms
            # nothing (the client resends to the holder; the producer sequence dedups it)
            self.gate_refusals += 1
            err = self._not_serving()
        for cbs in callbacks:
            for cb in cbs:
                try:
                    cb(err)
                except Exception:  # a confirm callback must not stop replication
                    log.exception("partition %s: a commit callback failed", plog.name)

    def _keep_alive(self, plog: PartLog, now: float) -> None:
        """A replica's replies wait for its log write, and that write can wait for long: behind
        this node's own fsyncs in the one writer thread, or for a disk that stalls for up to
        half a second.  While the active has heard nothing from this replica for half a
        keep-alive interval and a reply is held, it is told that this replica is up, every
        half interval (from the ticks, not from the active's messages, whose spacing would
        leave gaps of up to three intervals; this way at most an interval and 0.1 s, where
        the config allows anything below ``non_response_timeout``): else, hearing nothing
        for ``non_response_timeout``, it steps down, and a disk's hiccup costs the partition
        an election (docs/replication.md, "a slow disk is not a dead node").  Not for ever:
        a disk stuck for ALIVE_GIVE_UP timeouts is a node that cannot serve, and the active
        must step down so that its clients hear UNAVAILABLE instead of waiting."""
        r = plog.replica
        half = self.config.keepalive_interval / 2
        held = now - plog.outbox[0][2]
        quiet = now - max(plog.replied_at, plog.alive_at)  # since the active last heard from us
        if r.leader is None or r.leader == self.me or held < min(half, 0.05) or quiet < half:
            return  # (held: not for the millisecond a reply waits for a healthy disk)
        if held > ALIVE_GIVE_UP * self.config.non_response_timeout:
            if plog.alive_at > plog.outbox[0][2]:  # (said once per stuck write)
                plog.alive_at = -1e18
                log.error("partition %s: replies to %s held %.1f s by this node's log writes: no longer "
                          "telling it this replica is up (its disk or writer is stuck?)", plog.name, r.leader, held)
            return
        plog.alive_at = now
        self.transport.send(plog.key, Envelope(self.me, r.leader, Alive(r.term, self.me)))

    def _guarded(self, plog: PartLog, step: Callable[[], Ready]) -> None:
        """Feed the core and handle its Ready (none once stopping: the store closes next); an
        unexpected error stops this node (its state may be inconsistent)."""
        if self._stopping:
            return
        try:
            self._handle(plog, step())
        except Exception as exc:
            log.exception("partition %s: replication failed", plog.name)
            self._fatal(f"replication of {plog.name} failed: {exc!r}")

    def _fatal(self, why: str) -> None:
        if self._broken:
            return
        self._broken = True
        log.critical("%s: this node stops, its replicas elect another active", why)
        self._node.replication_failed()  # (a task of the node's own: Replication.stop cancels those it owns)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
