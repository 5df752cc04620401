""":class:`Replication`: the I/O that feeds each partition's :class:`ha.replica.Replica`.

It ticks every log's core, carries out each Ready the cores return (log writes, then
messages, then the confirms of committed proposals), and wires the parts of the
package together: proposals (commit.py), applying committed entries (apply.py), who
serves what (serving.py), peer messages (transport.py).

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
import dataclasses
import json
import logging
import random
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from broker.config import ALIVE_GIVE_UP, NodeConfig
from broker.modes.replicated.apply import HeldWrites, apply_entries, install_ops, messages_in
from broker.peers.codec import CATALOGUE, Key, MalformedReplicationError, decode_ops, streamed_parts
from broker.modes.replicated.commit import Proposals
from broker.modes.replicated.compaction import (COMPACT_BYTES, COMPACT_EVERY, KEEP_BYTES, WEAK_COMPACT_FACTOR,
                                          compact_upto, weak_cap)
from broker.modes.replicated.host import (Applier, Callback, GroupState, GroupView, NodeEvents, PeerGroup, Placements,
                                          Quarantine, Queues, Respread, StoreWriter)
from broker.modes.replicated.partlog import PartLog, compacted, open_log, replica_config
from broker.modes.replicated.segments import UNPIN_EVERY, unpin_segments
from broker.modes.replicated.serving import PartitionNotifier, Serving
from broker.modes.replicated.transport import Transport
from client.clock import Clock
from client.errors import NotActiveError, UnavailableError
from client.protocol.frames import PartitionInfo
from ha.members import Members, is_change
from ha.messages import Alive, EntriesDiscarded, Envelope, HandingOver, Ready, RoleChanged
from ha.moves import arrived, copying, leaving, next_members
from ha.partition import PartitionState as LifecycleState
from ha.placement import DistributionPolicy, NodeList, ReplicaKind, listed, place
from ha.replica import MembershipRefused, Replica, ReplicaConfig, Role
from storage.base import (
    DropQueue,
    DropUser,
    GrantAcl,
    PutUser,
    RevokeAcl,
    SeedAdmin,
    SetDrained,
    SetGroup,
    SetPlacement,
    SetUpdating,
    DurabilityPolicy,
    Engine,
    LogAppend,
    LogCompact,
    LogRecord,
    LogState,
    LogTruncate,
    PutApplied,
    PutHardState,
    PutMeta,
    PutQueue,
    QueueMeta,
    ResetPartition,
    WriteOp,
)

log = logging.getLogger("tandem.ha")

#: catalogue ops that change the users or their grants (the node applies them)
SECURITY_OPS = (PutUser, DropUser, GrantAcl, RevokeAcl, SeedAdmin)

#: ``Recovered.meta`` key of a partition log's members as of its snapshot:
#: "members.<qid>.<p>" -> JSON [voters, learners] (ha.members; the log's changes after it are in the log)
MEMBERS_KEY = "members."

#: ``Recovered.meta`` key of a partition taking a streamed snapshot: "streaming.<qid>.<p>" -> "1"
#: while its parts are written (a restart then starts the partition over), "0" once installed
STREAMING_KEY = "streaming."

MAX_EVENTS = 200

#: seconds between rounds of a re-spread (broker.partitions.members): each round starts the moves it can
RESPREAD_EVERY = 0.5

#: seconds the catalogue's active waits for a removed member to learn of its removal before it
#: stops feeding it (one that is down is let go after this)
FAREWELL_WAIT = 10.0


@dataclass(frozen=True, slots=True)
class HaEvent:
    at: float
    kind: str  # role, failback, drain, HA-1014
    partition: str
    text: str


def discarded_text(ev: EntriesDiscarded, messages: int, lost_messages: int) -> str:
    """What HA-1014 says of ``ev``: how many entries (and messages) went, how many of them
    had been confirmed (lost), and an override only where one wrote them."""
    text = f"{ev.count} entries ({messages} messages) from index {ev.first_index} discarded in term {ev.term}: "
    if not ev.committed:
        return text + "none of them was confirmed by this node (it never counted them as committed)"
    if ev.upto:
        text += (f"up to {ev.committed} of them ({lost_messages} messages) had been confirmed (confirmed and "
                 f"lost; {ev.certain} for certain: a snapshot replaced them and does not say which of the others "
                 f"it holds)")
    else:
        text += f"{ev.committed} of them ({lost_messages} messages) had been confirmed (confirmed and lost)"
    if ev.compacted:
        text += ("; the first of them was the last entry this node had compacted, and the group's log differs "
                 "there: more entries before it went too, uncounted and not kept (written under a weak override "
                 "past what a node keeps of such writes in its log, twice weak_hold_bytes, or confirmed by a "
                 "majority that lost them); the partition is rebuilt from the active")
    elif ev.weak:
        text += f"; {ev.weak} of those were written by an active under a weak override"
    else:
        text += (f"; {'where lost, ' if ev.upto else ''}the nodes that had acknowledged them lost them "
                 f"(unsynced writes lost to a crash?) and elected an active without them")
    if ev.count > ev.committed:
        text += (f"; the other {ev.count - ev.committed} were not known here as committed (its log records "
                 f"what it knew committed with each append: the last entries before a crash may have been "
                 f"confirmed all the same)")
    return text


def stored_members(meta: dict[str, str]) -> dict[Key, Members]:
    """The members as of each partition log's snapshot, as the store recovered them."""
    out: dict[Key, Members] = {}
    for k, v in meta.items():
        if k.startswith(MEMBERS_KEY):
            try:
                qid, p = (int(x) for x in k[len(MEMBERS_KEY):].split("."))
                voters, learners = json.loads(v)
                out[(qid, p)] = Members(tuple(voters), tuple(learners))
            except (ValueError, TypeError):
                log.error("store: ignoring malformed partition members %s=%r", k, v)
    return out


def members_meta(key: Key, m: Members) -> PutMeta:
    return PutMeta(f"{MEMBERS_KEY}{key[0]}.{key[1]}", json.dumps([list(m.voters), list(m.learners)]))


def _emptied(key: Key, term: int, voted_for: str | None, members: Members) -> list[WriteOp]:
    """The store writes that leave partition ``key`` empty here: no messages, no log, applied
    nothing, its term kept, its members (as of its empty snapshot) ``members``."""
    return [ResetPartition(*key), LogTruncate(key[0], key[1], 0), LogCompact(key[0], key[1], 0, 0, ""),
            PutApplied(key[0], key[1], 0, 0, ""), PutHardState(key[0], key[1], term, voted_for, 0),
            members_meta(key, members)]


def _streaming_key(key: Key) -> str:
    return f"{STREAMING_KEY}{key[0]}.{key[1]}"


def _shown(m: Members) -> str:
    return ",".join(m.voters) + (f" (learners {','.join(m.learners)})" if m.learners else "")


class Replication:
    """This node's replication logs (one per partition it holds, and the catalogue) and
    the parts around them: ``proposals`` (commit.py), ``roles`` (who serves what,
    serving.py), ``held`` (store writes held back, apply.py), ``transport``."""

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
        self._security = security
        self._drains = drains
        self._remaps = remaps
        self._group_change = respread
        self._state = state
        self._view = placement
        self._quarantine = quarantine
        self._node = node
        self.me = cfg.name
        self.members, self.policy = placement.placement()
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
        self._stored = logs
        #: each partition log's members as of its snapshot, as stored (MEMBERS_KEY)
        self._bases = stored_members(meta or {})
        #: partitions whose streamed snapshot a stop interrupted: started over when opened
        self._half_streamed = {k for k, v in (meta or {}).items() if k.startswith(STREAMING_KEY) and v == "1"}
        self._finishing: set[Key] = set()  # moves whose end this node (their active) is reporting
        self._retry_at: dict[Key, float] = {}  # when to report a move's end again after a failure
        self._lists: dict[int, list[NodeList]] = {}  # partitions -> the policy's node lists
        self._respreading = False  # a round of a re-spread (broker.partitions.members) is running here
        self._respread_at = 0.0  # when the next round may start
        #: a removed member -> when it has had time to learn of its removal (caught up, then keep-alives)
        self._farewell_at: dict[str, float] = {}
        self._farewell_by: dict[str, float] = {}  # a removed member -> when it is let go even if it has not
        self._rng = random.Random()
        self._stopping = False
        self.events: deque[HaEvent] = deque(maxlen=MAX_EVENTS)
        self.discarded_total = 0
        self.discarded_messages = 0  # messages in those entries
        #: of those, entries (and their messages) this node had counted as committed: confirmed
        #: writes lost (at most that many where a snapshot replaced them, see EntriesDiscarded)
        self.confirmed_lost = 0
        self.confirmed_lost_messages = 0
        self.elections = 0  # times this node became active for a partition (metrics)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._broken = False
        self.proposals = Proposals(config, clock, self.logs, guarded=self._guarded, broken=lambda: self._broken)
        self.roles = Serving(self.me, clock, self.logs, engine=engine, peers=peers, queues=queues, moves=moves,
                             node=node, placed=self.placed, spawn=self._spawn,
                             fail_waiters=self.proposals.fail_waiters)
        self.held = HeldWrites(clock, writer, self.logs, stored=self.roles.stored_upto, fatal=self._fatal)
        self.transport = Transport(config, clock, self.logs, engine=engine, writer=writer, peers=peers,
                                   queues=queues, group_state=state.security_snapshot,
                                   release_held=self.held.release, spawn=self._spawn, restart=self._restart)

    # -- the node's view: proposals, who is active ----------------------------------------------

    @property
    def changed(self) -> asyncio.Event:
        """Set (and replaced) whenever a role or an active changes."""
        return self.roles.changed

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

    def _disabled(self) -> bool:
        return self.roles.disabled()

    # -- set-up -------------------------------------------------------------------------------

    def start(self) -> None:
        self._open(CATALOGUE, NodeList(tuple(self.members), (ReplicaKind.SYNC,) * len(self.members)))
        for q in self._queues.queues.values():
            self._open_queue(q.meta)

    def _open_queue(self, meta: QueueMeta) -> None:
        initial = self._policy_lists(meta.partitions)
        for p in range(meta.partitions):
            key = (meta.id, p)
            nodes = self.placed(key, meta.partitions, initial)
            moved = self._moves.placed.get(key) is not None
            if key in self.logs or (self.me not in nodes.nodes and not (moved and key in self._stored)):
                continue
            # (a copy stored here is opened even where a move is taking it off this node: it
            # is a member until the move removes it)
            self._open(key, nodes, self._initial(key, meta.partitions, initial))
            if self.me not in nodes.nodes and key not in self._moves.moving:
                self._drop(self.logs[key])  # a move took it off this node while it was down

    def placed(self, key: Key, partitions: int, initial: list[NodeList] | None = None) -> NodeList:
        """Where partition ``key`` is placed: a move's list (broker.partitions.moves), else the policy's."""
        moved = self._moves.placed.get(key)
        if moved is not None:
            return listed(self.policy, moved)
        return (initial or self._policy_lists(partitions))[key[1]]

    def _initial(self, key: Key, partitions: int, lists: list[NodeList] | None = None) -> NodeList:
        """The node list partition ``key`` was opened on when its queue was declared, as far
        as a node that has no members stored for it can tell: a ``static`` queue's own list
        (it has not moved since, or a move would have stored them); else the policy's."""
        if key in self._moves.static and key not in self._moves.moving:
            return self.placed(key, partitions)
        return (lists or self._policy_lists(partitions))[key[1]]

    def _policy_lists(self, partitions: int) -> list[NodeList]:
        """The policy's node lists for a queue of ``partitions`` (the members and the policy
        are the settings': fixed while the node runs)."""
        lists = self._lists.get(partitions)
        if lists is None:
            lists = self._lists[partitions] = place(self.policy, partitions, self.members)
        return lists

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

    def _config_of(self, plog: PartLog) -> ReplicaConfig:
        """A log's configuration: while it moves (broker.partitions.moves), the voters other than the new
        list's first rank as drained (:func:`ha.moves.leaving`), so an active elsewhere hands
        the partition to it and elections prefer it."""
        cfg = self._replica_config(plog.nodes)
        if plog.key in self._moves.moving and cfg.preferred is not None:
            out = leaving(plog.replica.members, cfg.preferred) - set(cfg.witnesses)
            if out - cfg.drained:
                cfg = dataclasses.replace(cfg, drained=cfg.drained | out)
        return cfg

    def _open(self, key: Key, nodes: NodeList, initial: NodeList | None = None) -> None:
        """Open a log placed on ``nodes``; ``initial``: where the policy placed it when its
        queue was declared (its members until a change or a stored snapshot says otherwise)."""
        st = self._stored.pop(key, None) or LogState()
        config = self._replica_config(nodes)
        recovering = _streaming_key(key) in self._half_streamed
        if recovering:
            # a streamed snapshot was being written when this node stopped: what it holds of the
            # partition is part of one (the stream's start emptied the log and the applied
            # position); it starts over, and neither votes nor stands until caught up (what it
            # acknowledged before the stream is gone)
            log.warning("partition %d/%d: a streamed snapshot was cut short by a stop: starting the partition "
                        "over (the active sends it again)", key[0], key[1])
            self._writer.submit([ResetPartition(*key), PutMeta(_streaming_key(key), "0")], sync=True)
            self._half_streamed.discard(_streaming_key(key))
            st = LogState(term=st.term, voted_for=st.voted_for)
        if key == CATALOGUE:
            # The catalogue's members are the settings' until a change of the group's members
            # (broker.partitions.members) changes its log's: then the log's, as of its snapshot.  A node
            # that joins a running group is a learner of it until the group makes it a voter.
            base = self._bases.get(key)
            if base is None and self.me not in config.voters:
                base = Members(config.voters, (self.me,))
            if base is not None:
                config = config.with_members(base)
        else:
            # A moved partition's members are its log's (as of its snapshot, then its changes);
            # one never moved has the policy's, from the settings (a restart with other
            # settings places it anew, as far as _check_placement allows)
            stored = self._bases.get(key)
            base = stored if self._moves.placed.get(key) is not None else None
            if base is None:
                first = self._replica_config(initial or nodes)
                # a node the move added and that has nothing yet: a learner until the active
                # makes it a voter (it must not vote or stand with an empty log meanwhile)
                base = Members(first.voters, first.learners) if self.me in first.voters + first.learners else \
                    Members(first.voters, first.learners + (self.me,))
            if base != stored:
                self._bases[key] = base
                self._writer.submit([members_meta(key, base)], sync=False)
            config = config.with_members(base)
        plog = open_log(key, nodes, st, config, rng=random.Random(self._rng.random()),
                        now=self.clock.monotonic(), recovering=recovering)
        self.roles.start_lifecycle(plog)
        self.logs[key] = plog
        if self.lock_role is not None and self.lock_role[0]:
            plog.replica.stand_now()  # the LockFile holder: a new queue's partitions at once

    def set_members(self, members: list[str], policy: DistributionPolicy) -> None:
        """The group's members changed (broker.partitions.members): new queues are placed over them, the
        partitions the policy places here now open (those that existed are pinned where they
        were: only moves take them elsewhere), and every log is reconfigured."""
        self.members, self.policy = members, policy
        self._lists.clear()
        cat = self.logs.get(CATALOGUE)
        if cat is not None and members:
            cat.nodes = NodeList(tuple(members), (ReplicaKind.SYNC,) * len(members))
        for q in list(self._queues.queues.values()):
            self._open_queue(q.meta)
        self.reconfigure()

    def reconfigure(self) -> None:
        """Priority, quorum_override, designated_primary, the drained members or this node's
        availability zones' quorum changed: every log, at once."""
        for plog in list(self.logs.values()):
            self._guarded(plog, lambda: plog.replica.reconfigure(self._config_of(plog)))

    # -- moves (broker.partitions.moves) -------------------------------------------------------------------

    def placement_changed(self, key: Key) -> None:
        """A move of partition ``key`` started or ended (a committed catalogue entry): open
        the log here if the new list names this node, drop it if the move has ended without
        it, else take the new list (its first node is the one to hand over to)."""
        q = self._queues.by_id(key[0])
        if q is None or key[1] >= q.meta.partitions:
            return
        nodes = self.placed(key, q.meta.partitions)
        plog = self.logs.get(key)
        if plog is None:
            if self.me in nodes.nodes:
                self._open(key, nodes, self._initial(key, q.meta.partitions))
            return
        plog.nodes = nodes
        lc = plog.lifecycle
        if key not in self._moves.moving:
            if lc is not None and lc.state in (LifecycleState.MIGRATING, LifecycleState.REPLICATING):
                lc.on("done", f"moved to {', '.join(nodes.nodes)}")
            if self.me not in nodes.nodes:
                self._drop(plog)
                return
        self._guarded(plog, lambda: plog.replica.reconfigure(self._config_of(plog)))

    def partition_event(self, key: Key, event: str, why: str) -> None:
        """The partition's state machine (ha.partition) takes ``event`` (an update's "update"
        and "done"), where this node holds it and the event applies."""
        plog = self.logs.get(key)
        lc = plog.lifecycle if plog is not None else None
        if lc is not None and lc.state is (LifecycleState.ACTIVE if event == "update" else LifecycleState.UPDATING):
            lc.on(event, why)

    def _drop(self, plog: PartLog) -> None:
        """The partition moved off this node: forget its log and its data here."""
        key, r = plog.key, plog.replica
        log.warning("partition %s moved off %s: dropping its copy here", plog.name, self.me)
        self.roles.stop(plog, f"partition {plog.name} moved off {self.me}")
        self.proposals.fail_waiters(plog, UnavailableError(f"partition {plog.name} moved off {self.me}"))
        self.held.release(plog)
        del self.logs[key]
        self._bases[key] = r.members  # (without this node: should it come back, it does as a learner)
        self._writer.submit(_emptied(key, r.term, None, r.members), sync=True)
        self.roles.notify()

    def _reconcile(self) -> None:
        """Each moving partition: its ranking follows the members; on its active, the next
        membership change toward the new list, its state, and the move's end once there."""
        for key in list(self._moves.moving):
            plog = self.logs.get(key)
            if plog is None:
                continue
            r = plog.replica
            cfg = self._config_of(plog)
            if cfg.drained != r.cfg.drained:
                self._guarded(plog, lambda: r.reconfigure(cfg))
            if r.role is not Role.LEADER or not plog.serving:
                continue
            target = Members(cfg.voters, cfg.learners)
            current, progress = r.members, r.progress()
            self._move_state(plog, "replicate" if copying(current, target, progress, r.commit) else "migrate")
            if arrived(current, target):
                placed = self._moves.placed.get(key)
                if (r.members_committed and cfg.preferred == self.me and placed is not None
                        and key not in self._finishing and self.clock.monotonic() >= self._retry_at.get(key, 0)):
                    self._finishing.add(key)
                    self._spawn(self._finish(key, placed))
                continue
            nxt = next_members(current, target, self.me, progress, r.commit)
            if nxt is not None:
                self._change_members(plog, nxt, "move", f"partition {plog.name}: move to "
                                                        f"{','.join(plog.nodes.nodes)}: members")

    def _reconcile_catalogue(self, target: Members, now: float) -> None:
        """On the catalogue's active: its log's members toward the group's (one change at a
        time, :func:`ha.moves.next_members`), and while partitions re-spread, the next round
        of the re-spread (at most one at a time, every :data:`RESPREAD_EVERY` seconds)."""
        plog = self.logs.get(CATALOGUE)
        if plog is None:
            return
        r = plog.replica
        cfg = self._config_of(plog)
        if cfg.drained != r.cfg.drained:
            self._guarded(plog, lambda: r.reconfigure(cfg))
        if r.role is not Role.LEADER or not plog.serving:
            return
        current, progress = r.members, r.progress()
        settled = arrived(current, target)
        if not settled:
            nxt = next_members(current, target, self.me, progress, r.commit)
            gone = [n for n in current.learners if n not in nxt] if nxt is not None else []
            if gone and not self._farewell_said(gone, progress, r.commit, now):
                nxt = None  # a removed member learns of its removal first (then it stops linking to the group)
            if nxt is not None:
                self._change_members(plog, nxt, "members", "catalogue: group members")
        if self._group_change.respread and not self._respreading and now >= self._respread_at:
            self._respreading = True
            self._respread_at = now + RESPREAD_EVERY
            self._spawn(self._respread(settled and r.members_committed))

    def _change_members(self, plog: PartLog, nxt: Members, kind: str, what: str) -> None:
        """Propose the next membership change of ``plog`` (its active): logged as ``what``,
        recorded as a ``kind`` event; a change the core refuses now (the previous one not
        committed yet, ...) is tried again next round."""
        current = plog.replica.members
        try:
            ready, entry = plog.replica.change_members(nxt)
        except MembershipRefused:
            return
        log.warning("%s %s -> %s (entry %d)", what, _shown(current), _shown(nxt), entry.index)
        self.events.append(HaEvent(self.clock.time(), kind, plog.name,
                                   f"{self.me}: members {_shown(current)} -> {_shown(nxt)}"))
        self._guarded(plog, lambda: ready)

    def _farewell_said(self, gone: list[str], progress: dict[str, int], commit: int, now: float) -> bool:
        """Whether the members about to stop learning the catalogue have had time to learn that
        they are no longer members: their logs hold every committed entry and a few keep-alives
        (which carry the commit index) have gone out since; or they are not answering and
        :data:`FAREWELL_WAIT` has passed."""
        if now >= min(self._farewell_by.setdefault(n, now + FAREWELL_WAIT) for n in gone):
            return True
        if any(progress.get(n, 0) < commit for n in gone):
            for n in gone:
                self._farewell_at.pop(n, None)
            return False
        return now >= max(self._farewell_at.setdefault(n, now + 4 * self.config.keepalive_interval)
                          for n in gone)

    async def _respread(self, settled: bool) -> None:
        try:
            await self._group_change.step(settled)
        except Exception as exc:  # (an election, a refused move: the next round tries again)
            log.info("group change: a round of the re-spread failed (%s): trying again", exc)
        finally:
            self._respreading = False

    def _move_state(self, plog: PartLog, event: str) -> None:
        lc = plog.lifecycle
        busy = LifecycleState.REPLICATING if event == "replicate" else LifecycleState.MIGRATING
        if lc is not None and lc.state is not busy and lc.state in (
                LifecycleState.ACTIVE, LifecycleState.MIGRATING, LifecycleState.REPLICATING):
            lc.on(event, f"moving to {', '.join(plog.nodes.nodes)}")

    async def _finish(self, key: Key, nodes: tuple[str, ...]) -> None:
        try:
            await self._moves.finished(key, nodes)
            self._retry_at.pop(key, None)
        except Exception as exc:  # (an election, a lost link: tried again a second later)
            log.info("partition %d/%d: reporting the end of its move failed (%s): trying again", key[0], key[1], exc)
            self._retry_at[key] = self.clock.monotonic() + 1.0
        finally:
            self._finishing.discard(key)

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
                self._reconcile()
            target = self._view.catalogue_target()
            if target is not None:
                self._reconcile_catalogue(target, now)
            if now >= pins_at:
                pins_at = now + UNPIN_EVERY
                self._unpin_segments()
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
        r = plog.replica
        key = plog.key
        if r.leader != plog.known_leader:
            plog.known_leader = r.leader
            self.roles.notify()
        self.roles.track_active(plog)
        self.proposals.undefer(plog)  # (should the term move on without a step-down: see waits_for_commit)
        if key != CATALOGUE and any(isinstance(ev, EntriesDiscarded) and ev.committed for ev in ready.events):
            # It had applied entries the group discarded: its store is wrong for this partition.
            # Nothing of this Ready is carried out (its replies would promise a log about to go).
            for ev in ready.events:
                self._event(plog, ev)
            self._resync(plog)
            return
        leader = r.role is Role.LEADER
        policy = self.config.sync if leader else self.config.remote_sync
        ops, sync, promise = self._log_writes(plog, ready, leader, policy)
        for ev in ready.events:
            self._event(plog, ev)
        # Applying committed entries to the store can wait for the next commit (held): the
        # log already has them durably, and a restart re-applies from the applied position.
        callbacks: list[list[Callback]] = []
        apply_ops: list[WriteOp] = []
        applied_size = plog.applied_bytes
        if ready.committed:
            apply_ops = apply_entries(plog, ready.committed, callbacks, self._apply_catalogue)
            self.proposals.undefer(plog)  # what waited for these commits goes now
            if key == CATALOGUE and all(e.data is None for e in ready.committed):
                # A new active's no-op moves the catalogue's applied position too, and the
                # node's catalogue catch-up waits on that (entries with data notify in
                # _apply_catalogue).
                self.roles.notify()
        applied_size = plog.applied_bytes - applied_size  # (before compaction recounts it)
        if r.applied - r.snap_index >= COMPACT_EVERY or plog.applied_bytes >= plog.compact_at:
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
            if upto > r.snap_index:
                r.compact(upto)
                apply_ops.append(compacted(key, r))
                apply_ops.extend(self._base_ops(plog))
        last = ready.append[-1] if ready.append else None
        # Messages of a replica wait for the write (they promise what is on disk); the
        # active's appends go at once (it counts itself only once persisted), except
        # right after it won: its term must be on disk first.
        wait = bool(ops) and (promise or (not leader and policy is not DurabilityPolicy.NO_SYNC))
        if ops:
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
        if apply_ops:
            self.held.hold(plog, apply_ops, applied_size)
        if ready.messages:
            if wait or plog.outbox:
                target = plog.write_seq
                if plog.outbox and plog.outbox[-1][0] == target:
                    plog.outbox[-1][1].extend(ready.messages)
                else:
                    plog.outbox.append((target, list(ready.messages), self.clock.monotonic()))
            else:
                if not leader:
                    plog.replied_at = self.clock.monotonic()
                for env in ready.messages:
                    self.transport.send(key, env)
        err = None
        if callbacks and self.confirm_gate is not None and not self.confirm_gate():
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
            ops.extend(install_ops(plog, m, {q.meta.id for q in self._queues.queues.values()}, self._apply_catalogue,
                                   self._state.security_install))
            ops.append(compacted(key, plog.replica) if plog.replica.snap_index == m.index else
                       LogCompact(key[0], key[1], m.index, m.last_term, m.last_origin, m.weak, (0, 0)))
            ops.append(PutApplied(key[0], key[1], m.index, m.last_term, m.last_origin))
            ops.extend(self._base_ops(plog))
            if key != CATALOGUE and streamed_parts(m.data):
                ops.append(PutMeta(_streaming_key(key), "0"))  # (the stream's parts, written before, are whole)
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

    def _base_ops(self, plog: PartLog) -> list[WriteOp]:
        """The store write of the log's members as of its snapshot, if they changed (a
        compaction or a snapshot went past a membership change)."""
        key, base = plog.key, plog.replica.snapshot_members
        if self._bases.get(key) == base:
            return []
        self._bases[key] = base
        return [members_meta(key, base)]

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
        """Feed the core and handle its Ready; an unexpected error stops this node (its
        state may be inconsistent) rather than the replication task or a peer link."""
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
        self._spawn(self._node.stop())

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    # -- committed catalogue entries, roles, HA-1014 ---------------------------------------------

    def _apply_catalogue(self, ops: list[WriteOp]) -> list[WriteOp]:
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
                for key in [k for k in self.logs if k[0] == op.queue_id]:
                    plog = self.logs.pop(key)
                    self.proposals.fail_waiters(plog, UnavailableError("the queue was deleted"))
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
        self.roles.notify()
        return out

    def _event(self, plog: PartLog, ev: RoleChanged | EntriesDiscarded | HandingOver) -> None:
        """Log it, record it, act on a role change."""
        now = self.clock.time()
        if isinstance(ev, HandingOver) and ev.drained:
            log.warning("partition %s on %s: drain: this node is drained, handing the partition to %s (term %d; "
                        "writes wait until it has taken over, or given up after an election timeout)", plog.name,
                        self.me, ev.to, ev.term)
            self.events.append(HaEvent(now, "drain", plog.name, f"{self.me}: drained, handing over to {ev.to} "
                                                                 f"in term {ev.term}"))
            return
        if isinstance(ev, HandingOver):
            log.warning("partition %s on %s: failback: handing it to %s, its placement's choice, back and "
                        "answering (term %d; writes wait until it has taken over, or given up after an "
                        "election timeout)", plog.name, self.me, ev.to, ev.term)
            self.events.append(HaEvent(now, "failback", plog.name, f"{self.me}: handing over to {ev.to} "
                                                                   f"in term {ev.term}"))
            return
        if isinstance(ev, RoleChanged):
            level = logging.WARNING if ev.old == "active" or ev.new == "active" else logging.DEBUG
            log.log(level, "partition %s on %s: %s -> %s in term %d (%s)", plog.name, self.me, ev.old, ev.new,
                    ev.term, ev.reason)
            if ev.new == "active" or ev.old == "active":
                self.events.append(HaEvent(now, "role", plog.name, f"{self.me}: {ev.old} -> {ev.new} in term "
                                                                   f"{ev.term} ({ev.reason})"))
            if ev.new == "active":
                self.elections += 1
                plog.serve_from = plog.replica.last_index  # its no-op
                plog.serve_term = ev.term
            elif ev.old == "active":
                self.roles.stop(plog, f"partition {plog.name} is no longer active on {self.me} ({ev.reason})")
            self.roles.notify()
            return
        self.discarded_total += ev.count
        lost_messages = messages_in(plog.key, ev.payloads[:ev.committed])
        messages = lost_messages + messages_in(plog.key, ev.payloads[ev.committed:])
        self.discarded_messages += messages
        self.confirmed_lost += ev.committed
        self.confirmed_lost_messages += lost_messages
        text = discarded_text(ev, messages, lost_messages)
        if plog.key != CATALOGUE and messages:
            entries = []
            for data in ev.payloads:
                try:
                    entries.append(decode_ops(plog.key, data) if data is not None and not is_change(data) else [])
                except MalformedReplicationError:
                    entries.append([])  # (counted as undecodable already, messages_in)
            kept = self._quarantine.keep(plog.key, ev.term, ev.first_index, entries, ev.committed, ev.written)
            text += f"; {kept} message(s) kept in the quarantine queue (tandem restore)"
        log.error("HA-1014 partition %s on %s: %s", plog.name, self.me, text)
        self.events.append(HaEvent(now, "HA-1014", plog.name, f"{self.me}: {text}"))

    def _resync(self, plog: PartLog) -> None:
        """Entries this node had applied were discarded (it confirmed them under a weak
        override): its store is wrong for this partition.  Start the partition over
        empty; the active sends it all again (or a snapshot)."""
        log.error("partition %s on %s: rebuilding from the active after HA-1014", plog.name, self.me)
        self._start_over(plog, f"partition {plog.name} is being rebuilt on {self.me}")

    def _restart(self, plog: PartLog, why: str) -> PartLog:
        """A snapshot is streamed here (transport.py): the partition starts over empty, with
        the store's mark that a stream is under way."""
        log.info("partition %s on %s: %s: starting it over", plog.name, self.me, why)
        return self._start_over(plog, f"partition {plog.name} is being rebuilt on {self.me} ({why})",
                                [PutMeta(_streaming_key(plog.key), "1")])

    def _start_over(self, plog: PartLog, why: str, extra: list[WriteOp] | None = None) -> PartLog:
        """Start partition ``plog`` over empty, after everything already submitted (held
        writes first): store and core.  Until an active has brought it up to that active's
        commit index it neither votes nor stands (``recovering``)."""
        key = plog.key
        r = plog.replica
        self.roles.stop(plog, why)
        self.proposals.fail_waiters(plog, UnavailableError(why))
        self.held.release(plog)
        self._bases[key] = r.members
        self._writer.submit(_emptied(key, r.term, r.voted_for, r.members) + (extra or []), sync=True)
        replica = Replica(self._config_of(plog).with_members(r.members), rng=random.Random(self._rng.random()),
                          now=self.clock.monotonic(), term=r.term, voted_for=r.voted_for, recovering=True)
        new = PartLog(key, replica, plog.nodes, promised=(r.term, r.voted_for))
        self.roles.start_lifecycle(new)
        self.logs[key] = new
        return new
