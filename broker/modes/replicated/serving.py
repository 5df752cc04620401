"""Who serves each partition: this node starting and stopping to serve, each partition's
lifecycle (Active, Unavailable, ...), and waiting for an active.

A node that wins an election first commits its no-op (so everything earlier is applied),
then loads the partition from its store and starts serving; a node that steps down drops
the partition's in-memory state, fails what was waiting on it, and forgets its
deliveries.  Only the active holds messages in memory.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from broker.messaging.message import Msg, msg_from_store
from broker.peers.codec import CATALOGUE, Key
from broker.modes.replicated.host import NodeEvents, PeerGroup, Placements, Queues
from broker.modes.replicated.partlog import PartLog
from client.clock import Clock
from client.errors import NotActiveError, TandemError, UnavailableError
from client.protocol.frames import PartitionInfo, ReplicaInfo
from ha.membership import QuorumState
from ha.partition import PartitionChanged, PartitionLifecycle
from ha.partition import PartitionState as LifecycleState
from ha.placement import NodeList
from ha.replica import Role
from storage.base import Engine, PartitionState

log = logging.getLogger("tandem.ha")

PartitionNotifier = Callable[[PartitionChanged], None]


def _log_partition_change(c: PartitionChanged) -> None:
    if c.old_state is not c.new_state or c.reason.startswith("active"):
        log.info("partition %s/%d state %s -> %s (%s)", c.queue, c.partition, c.old_state.value,
                 c.new_state.value, c.reason)


class Serving:
    """``changed`` is set (and replaced) whenever a role or an active changes.
    ``spawn`` runs a coroutine as a task replication owns; ``fail_waiters`` fails what a
    log's proposals wait for."""

    def __init__(self, me: str, clock: Clock, logs: Mapping[Key, PartLog], *, engine: Engine,
                 peers: PeerGroup | None, queues: Queues, moves: Placements, node: NodeEvents,
                 placed: Callable[[Key, int], NodeList], spawn: Callable[[Coroutine[Any, Any, None]], None],
                 fail_waiters: Callable[[PartLog, TandemError], None]) -> None:
        self._clock = clock
        self._engine = engine
        self._peers = peers
        self._queues = queues
        self._moves = moves
        self._node = node
        self._logs = logs
        self.me = me
        self._placed = placed  # (key, the queue's partitions) -> where the partition is placed
        self._spawn = spawn
        self._fail_waiters = fail_waiters
        self.changed = asyncio.Event()
        #: partition state notifiers (Python callbacks), called in order of the changes
        self.partition_notifiers: list[PartitionNotifier] = [_log_partition_change]

    def notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()
        self._node.map_changed()

    def disabled(self) -> bool:
        """This node has no node quorum: it serves nothing and knows no active."""
        peers = self._peers
        return peers is not None and peers.membership.quorum_state is QuorumState.DISABLED

    # -- partition lifecycles ----------------------------------------------------------------

    def start_lifecycle(self, plog: PartLog) -> None:
        q = self._queues.by_id(plog.key[0])
        name = "(catalogue)" if plog.key == CATALOGUE else (q.name if q is not None else f"#{plog.key[0]}")
        plog.lifecycle = lc = PartitionLifecycle(name, plog.key[1], notifiers=[self._notify_partition])
        lc.set_status("define_local", "defined by the catalogue")
        lc.set_status("enable_local", "this node holds a replica")  # -> Unavailable until an active is known

    def _notify_partition(self, change: PartitionChanged) -> None:
        for cb in list(self.partition_notifiers):
            try:
                cb(change)
            except Exception:  # one bad notifier must not stop the others or replication
                log.exception("partition notifier failed")

    def add_partition_notifier(self, cb: PartitionNotifier) -> None:
        """Install ``cb``; it is called at once with every partition's current state."""
        self.partition_notifiers.append(cb)
        for plog in self._logs.values():
            lc = plog.lifecycle
            if lc is not None:
                cb(PartitionChanged(lc.queue, lc.partition, lc.state, lc.state, lc.status, lc.status, "installed"))

    def track_active(self, plog: PartLog) -> None:
        """Tell the partition's lifecycle when it gets, changes or loses its active."""
        lc = plog.lifecycle
        who = self.active_of(plog.key)
        if lc is None or who == plog.known_active:
            return
        plog.known_active = who
        if who is not None:
            lc.on("active_elected", f"active {who}")
        elif lc.state is not LifecycleState.UNAVAILABLE:
            lc.on("quorum_lost" if self.disabled() else "active_lost",
                  "this node has no quorum" if self.disabled() else "no active known")

    # -- this node serving -------------------------------------------------------------------

    def stored_upto(self, plog: PartLog, index: int) -> None:
        """The store has every entry up to ``index`` applied: a new active waiting for
        that starts serving."""
        plog.durable_applied = max(plog.durable_applied, index)
        if plog.serve_from and not plog.serving and plog.durable_applied >= plog.serve_from:
            self.start(plog)

    def start(self, plog: PartLog) -> None:
        r = plog.replica
        if r.role is not Role.LEADER or r.term != plog.serve_term:
            return
        plog.serve_from = 0
        if plog.key == CATALOGUE:
            plog.serving = True
            self.track_active(plog)
            self.notify()
            return
        term = r.term

        async def load() -> None:
            st, ready = await asyncio.to_thread(self._read, plog.key, self._node.load_budget(plog.key[0]))
            if r.role is not Role.LEADER or r.term != term or self._logs.get(plog.key) is not plog:
                return
            messages = len(ready) + st.cold_count
            self._node.partition_loaded(plog.key, st, plog.windows, ready)
            plog.serving = True
            log.warning("partition %s active on %s in term %d (%d messages)", plog.name, self.me, term, messages)
            self.track_active(plog)
            self.notify()

        self._spawn(load())

    def _read(self, key: Key, budget: int) -> tuple[PartitionState, list[Msg]]:
        """In a storage thread: the partition as the store has it, its messages made into the
        node's (a backlog of many thousand takes longer to make than a peer waits for an
        answer, so never on the loop)."""
        st = self._engine.load_partition(*key, budget)
        ready = [msg_from_store(key[1], m) for m in st.messages]
        st.messages = []
        return st, ready

    def stop(self, plog: PartLog, why: str) -> None:
        was = plog.serving
        plog.serving = False
        plog.serve_from = 0
        self.track_active(plog)
        self._fail_waiters(plog, NotActiveError(why, active_hint=None))
        if was and plog.key != CATALOGUE:
            self._node.partition_unloaded(plog.key)

    # -- who is active -----------------------------------------------------------------------

    def serving(self, key: Key) -> bool:
        plog = self._logs.get(key)
        return plog is not None and plog.serving

    def active_of(self, key: Key) -> str | None:
        """The node serving ``key`` as far as this node knows (None without node quorum)."""
        plog = self._logs.get(key)
        if plog is None:
            peers = self._peers
            return peers.foreign_active(key) if peers is not None and not self.disabled() else None
        if self.disabled():
            return None
        r = plog.replica
        if r.role is Role.LEADER:
            return self.me if plog.serving else None
        return r.leader

    def catalogue_commit(self) -> int:
        """On the catalogue's active: how far the catalogue is committed (every change
        confirmed so far).  NotActiveError elsewhere: another member's answer could name
        entries a new active will truncate, which nobody would ever apply."""
        plog = self._logs[CATALOGUE]
        if not plog.serving:
            raise NotActiveError(f"the catalogue is not active on {self.me}")
        return plog.replica.commit

    def catalogue_applied(self) -> int:
        """How far the catalogue is applied here (queues declared and deleted)."""
        return self._logs[CATALOGUE].applied[0]

    async def wait_change(self, timeout: float) -> None:
        """Until a role or an active changes, or ``timeout``."""
        try:
            async with self._clock.timeout(timeout):
                await self.changed.wait()
        except TimeoutError:
            pass  # nothing changed: the caller looks again

    async def wait_active(self, key: Key, timeout: float) -> str:
        """The node serving ``key``, waiting up to ``timeout`` for an election."""
        if key not in self._logs:
            # not a replica of it (a group larger than the copies): ask one that is
            q = self._queues.by_id(key[0])
            peers = self._peers
            if q is not None and peers is not None and key[1] < q.meta.partitions:
                active = self.active_of(key)
                if active is not None:
                    return active
                holders = self._placed(key, q.meta.partitions).nodes
                for n in holders:
                    if n in peers.links:
                        return n
            raise UnavailableError(f"partition {key[0]}/{key[1]}: no member holding it is reachable from {self.me}")
        try:
            async with self._clock.timeout(timeout):
                while True:
                    who = self.active_of(key)
                    if who is not None and (who != self.me or self.serving(key)):
                        return who
                    await self.changed.wait()
        except TimeoutError:
            raise UnavailableError(f"partition {key[0]}/{key[1]} has no active (waited {timeout:.1f} s): "
                                   f"too few nodes up for a quorum?") from None

    def partition_infos(self) -> list[PartitionInfo]:
        names = {q.meta.id: q.name for q in self._queues.queues.values()}
        out = []
        for key in sorted(self._logs):
            plog = self._logs[key]
            r = plog.replica
            active = self.active_of(key) or ""
            state = plog.lifecycle.state.value if plog.lifecycle is not None else "Unavailable"
            progress = r.progress()
            replicas = []
            now = self._clock.monotonic()
            for n, kind in zip(plog.nodes.nodes, plog.nodes.kinds):
                if n == self.me:
                    continue
                match = progress.get(n, 0)
                lag = max(0, r.last_index - match) if progress else 0
                replicas.append(ReplicaInfo(n, kind.value, match, lag, lag_seconds(plog, match, now) if lag else 0.0))
            out.append(PartitionInfo("" if key == CATALOGUE else names.get(key[0], f"#{key[0]}"), key[1], state,
                                     r.role.value, active, r.term, r.commit, r.applied, r.last_index, replicas,
                                     plog.lifecycle.status.value if plog.lifecycle is not None
                                     and plog.lifecycle.status is not None else "", key in self._moves.static))
        return out

    def served(self) -> list[tuple[Key, int]]:
        """(key, term) of every queue partition this node serves (broker.peers.foreign)."""
        return [(key, plog.replica.term) for key, plog in self._logs.items()
                if key != CATALOGUE and plog.serving and plog.replica.role is Role.LEADER]

    def foreign_infos(self) -> list[PartitionInfo]:
        """The partitions this node holds no copy of, as it knows them (broker.peers.foreign): its
        active if a member said it serves it (RemoteEnabled), else none (RemoteDefined); the
        replicas listed are the nodes placement puts it on."""
        peers = self._peers
        out = []
        for q in sorted(self._queues.queues.values(), key=lambda q: q.meta.id):
            for p in range(q.meta.partitions):
                key = (q.meta.id, p)
                if key in self._logs:
                    continue
                placed = self._placed(key, q.meta.partitions)
                active = self.active_of(key) or ""
                term = peers.foreign_term(key) if peers is not None and active else 0
                holders = [ReplicaInfo(n, k.value, 0, 0) for n, k in zip(placed.nodes, placed.kinds)]
                out.append(PartitionInfo(q.name, p, "Active" if active else "Unavailable", "", active, term, 0, 0, 0,
                                         holders, "RemoteEnabled" if active else "RemoteDefined",
                                         key in self._moves.static))
        return out


def lag_seconds(plog: PartLog, match: int, now: float) -> float:
    """How long ago the active wrote the first entry the replica lacks (0 if unknown)."""
    at = plog.appended_at.written_at(match + 1)
    return 0.0 if at is None else round(max(0.0, now - at), 3)
