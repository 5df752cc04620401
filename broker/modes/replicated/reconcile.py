"""Which partition logs this node holds and who their members are, kept in line with the
placement: :class:`Reconciler`.

* **Opening and dropping.**  A log opens where the placement (the policy's node list, or a
  move's, broker.partitions.moves) names this node, with its members as stored as of its
  snapshot, else the list it was declared on; a move that ends without this node drops
  the copy here; a partition starts over empty after HA-1014 took entries it had applied,
  or when a snapshot is streamed to it.
* **Moves.**  On a moving partition's active, one membership change at a time toward the
  new list (:func:`ha.moves.next_members`), the partition's state (Replicating while the
  new members copy, then Migrating) and, once there, the report of the move's end.
* **The group's members.**  On the catalogue's active, its log's members toward the
  group's, a removed member let go once it has learnt of its removal, and while
  partitions re-spread (broker.partitions.members) a round of the re-spread at a time.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from broker.config import NodeConfig
from broker.modes.replicated.apply import HeldWrites
from broker.modes.replicated.commit import Guarded, Proposals
from broker.modes.replicated.events import EventLog
from broker.modes.replicated.host import Placements, Queues, Respread, StoreWriter
from broker.modes.replicated.partlog import PartLog, open_log
from broker.modes.replicated.serving import Serving
from broker.peers.codec import CATALOGUE, Key
from client.clock import Clock
from client.errors import StorageError, UnavailableError
from ha.members import Members
from ha.moves import arrived, copying, leaving, next_members
from ha.partition import PartitionState as LifecycleState
from ha.placement import DistributionPolicy, NodeList, ReplicaKind, listed, place
from ha.confchange import MembershipRefused
from ha.replica import Replica, ReplicaConfig, Role
from storage.base import (LogCompact, LogState, LogTruncate, PutApplied, PutHardState, PutMeta, QueueMeta,
                          ResetPartition, WriteOp)
from storage.segments import repair_key

log = logging.getLogger("tandem.ha")

#: ``Recovered.meta`` key of a partition log's members as of its snapshot:
#: "members.<qid>.<p>" -> JSON [voters, learners] (ha.members; the log's changes after it are in the log)
MEMBERS_KEY = "members."

#: ``Recovered.meta`` key of a partition taking a streamed snapshot: "streaming.<qid>.<p>" -> "1"
#: while its parts are written (a restart then starts the partition over), "0" once installed
STREAMING_KEY = "streaming."

#: seconds between rounds of a re-spread (broker.partitions.members): each round starts the moves it can
RESPREAD_EVERY = 0.5

#: seconds the catalogue's active waits for a removed member to learn of its removal before it
#: stops feeding it (one that is down is let go after this)
FAREWELL_WAIT = 10.0

Spawn = Callable[[Coroutine[Any, Any, None]], None]


def stored_members(meta: Mapping[str, str]) -> dict[Key, Members]:
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


def _emptied(key: Key, term: int, voted_for: str | None, members: Members | None, *,
             repairing: bool) -> list[WriteOp]:
    """The store writes that leave partition ``key`` empty here: no messages, no log, applied
    nothing, its term kept, its members (as of its empty snapshot) ``members`` (None: as stored);
    ``repairing``: it starts over here (marked under repair, storage.segments.REPAIR_KEY), else
    it is gone from here (any such mark goes with it)."""
    return [ResetPartition(*key), LogTruncate(key[0], key[1], 0), LogCompact(key[0], key[1], 0, 0, ""),
            PutApplied(key[0], key[1], 0, 0, ""), PutHardState(key[0], key[1], term, voted_for, 0),
            PutMeta(repair_key(key), "1" if repairing else "0"),
            *([members_meta(key, members)] if members is not None else [])]


def streaming_key(key: Key) -> str:
    return f"{STREAMING_KEY}{key[0]}.{key[1]}"


def _shown(m: Members) -> str:
    return ",".join(m.voters) + (f" (learners {','.join(m.learners)})" if m.learners else "")


class Reconciler:
    """The logs of ``logs`` (the driver's: opened, dropped and replaced here) and their
    members.  ``replica_config(nodes)``: the core's configuration for a log placed on
    ``nodes`` under this node's settings; ``stands()``: this node holds the LockFile (a log
    it opens stands at once); ``guarded`` feeds a log's core a step and carries out its
    Ready; ``spawn`` runs a coroutine as a task replication owns."""

    def __init__(self, config: NodeConfig, clock: Clock, logs: dict[Key, PartLog], *, stored: dict[Key, LogState],
                 meta: Mapping[str, str], members: list[str], policy: DistributionPolicy, writer: StoreWriter,
                 queues: Queues, moves: Placements, respread: Respread, roles: Serving, proposals: Proposals,
                 held: HeldWrites, events: EventLog, replica_config: Callable[[NodeList], ReplicaConfig],
                 stands: Callable[[], bool], guarded: Guarded, spawn: Spawn) -> None:
        self.config = config
        self.me = config.name
        self.clock = clock
        self.logs = logs
        self.members, self.policy = members, policy
        self._stored = stored
        #: each partition log's members as of its snapshot, as stored (MEMBERS_KEY)
        self._bases = stored_members(meta)
        #: partitions whose streamed snapshot a stop interrupted: started over when opened
        self._half_streamed = {k for k, v in meta.items() if k.startswith(STREAMING_KEY) and v == "1"}
        self._writer = writer
        self._queues = queues
        self._moves = moves
        self._group_change = respread
        self._roles = roles
        self._proposals = proposals
        self._held = held
        self._events = events
        self._replica_config = replica_config
        self._stands = stands
        self._guarded = guarded
        self._spawn = spawn
        self._rng = random.Random()
        self._lists: dict[int, list[NodeList]] = {}  # partitions -> the policy's node lists
        self._finishing: set[Key] = set()  # moves whose end this node (their active) is reporting
        self._retry_at: dict[Key, float] = {}  # when to report a move's end again after a failure
        self._respreading = False  # a round of a re-spread (broker.partitions.members) is running here
        self._respread_at = 0.0  # when the next round may start
        #: a removed member -> when it has had time to learn of its removal (caught up, then keep-alives)
        self._farewell_at: dict[str, float] = {}
        self._farewell_by: dict[str, float] = {}  # a removed member -> when it is let go even if it has not

    # -- the logs this node holds ---------------------------------------------------------------

    def start(self) -> None:
        self._open(CATALOGUE, NodeList(tuple(self.members), (ReplicaKind.SYNC,) * len(self.members)))
        for q in self._queues.queues.values():
            self.open_queue(q.meta)

    def open_queue(self, meta: QueueMeta) -> None:
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

    def config_of(self, plog: PartLog) -> ReplicaConfig:
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
        recovering = streaming_key(key) in self._half_streamed
        if recovering:
            # a streamed snapshot was being written when this node stopped: what it holds of the
            # partition is part of one (the stream's start emptied the log and the applied
            # position); it starts over, and neither votes nor stands until caught up (what it
            # acknowledged before the stream is gone)
            log.warning("partition %d/%d: a streamed snapshot was cut short by a stop: starting the partition "
                        "over (the active sends it again)", key[0], key[1])
            self._writer.submit([ResetPartition(*key), PutMeta(streaming_key(key), "0"), PutMeta(repair_key(key), "1")],
                                sync=True)
            self._half_streamed.discard(streaming_key(key))
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
        if st.damaged or st.store_damage:
            if config.voters == (self.me,):
                what = st.store_damage or f"the replication log of {self.me} is damaged"
                raise StorageError(
                    f"{what}, and partition {key[0]}/{key[1]} has no other voter to repair it from: this node does "
                    f"not start (restore its data directory from a backup: docs/reliability.md)")
            recovering = True  # (its store is its snapshot; an active brings the rest: storage.segments)
        elif st.marked and config.voters == (self.me,):
            log.warning("partition %d/%d: its repair was not finished, and it has no other voter now: it goes on "
                        "from what this node holds", key[0], key[1])
            self._writer.submit([PutMeta(repair_key(key), "0")], sync=True)
        elif st.marked:
            recovering = True  # (a repair a stop cut short: what it acknowledged may not all be here yet)
        if st.store_damage:
            # the store's copy is damaged: the partition starts over empty, and its active sends it all
            log.warning("partition %d/%d: %s: starting it over from its active (repair)", key[0], key[1],
                        st.store_damage)
            self._writer.submit(_emptied(key, st.term, st.voted_for, None, repairing=True), sync=True)
            st = LogState(term=st.term, voted_for=st.voted_for)
        plog = open_log(key, nodes, st, config, rng=random.Random(self._rng.random()),
                        now=self.clock.monotonic(), recovering=recovering)
        plog.repairing = recovering  # (the store's mark is written: by the store's open, or above)
        self._roles.start_lifecycle(plog)
        self.logs[key] = plog
        if self._stands():
            plog.replica.stand_now()  # the LockFile holder: a new queue's partitions at once

    def set_members(self, members: list[str], policy: DistributionPolicy) -> None:
        """The group's members changed (broker.partitions.members): new queues are placed over them, and the
        partitions the policy places here now open (those that existed are pinned where they
        were: only moves take them elsewhere)."""
        self.members, self.policy = members, policy
        self._lists.clear()
        cat = self.logs.get(CATALOGUE)
        if cat is not None and members:
            cat.nodes = NodeList(tuple(members), (ReplicaKind.SYNC,) * len(members))
        for q in list(self._queues.queues.values()):
            self.open_queue(q.meta)

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
        self._guarded(plog, lambda: plog.replica.reconfigure(self.config_of(plog)))

    def drop_queue(self, queue_id: int) -> None:
        """The queue was deleted: its logs go, and what waits on them fails."""
        for key in [k for k in self.logs if k[0] == queue_id]:
            plog = self.logs.pop(key)
            self._proposals.fail_waiters(plog, UnavailableError("the queue was deleted"))

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
        self._roles.stop(plog, f"partition {plog.name} moved off {self.me}")
        self._proposals.fail_waiters(plog, UnavailableError(f"partition {plog.name} moved off {self.me}"))
        self._held.release(plog)
        del self.logs[key]
        self._bases[key] = r.members  # (without this node: should it come back, it does as a learner)
        self._writer.submit(_emptied(key, r.term, None, r.members, repairing=False), sync=True)
        self._roles.notify()

    def resync(self, plog: PartLog) -> None:
        """Entries this node had applied were discarded (it confirmed them under a weak
        override): its store is wrong for this partition.  Start the partition over
        empty; the active sends it all again (or a snapshot)."""
        log.error("partition %s on %s: rebuilding from the active after HA-1014", plog.name, self.me)
        self._start_over(plog, f"partition {plog.name} is being rebuilt on {self.me}")

    def restart(self, plog: PartLog, why: str) -> PartLog:
        """A snapshot is streamed here (transport.py): the partition starts over empty, with
        the store's mark that a stream is under way."""
        log.info("partition %s on %s: %s: starting it over", plog.name, self.me, why)
        return self._start_over(plog, f"partition {plog.name} is being rebuilt on {self.me} ({why})",
                                [PutMeta(streaming_key(plog.key), "1")])

    def _start_over(self, plog: PartLog, why: str, extra: list[WriteOp] | None = None) -> PartLog:
        """Start partition ``plog`` over empty, after everything already submitted (held
        writes first): store and core.  Until an active has brought it up to that active's
        commit index it neither votes nor stands (``recovering``)."""
        key = plog.key
        r = plog.replica
        self._roles.stop(plog, why)
        self._proposals.fail_waiters(plog, UnavailableError(why))
        self._held.release(plog)
        self._bases[key] = r.members
        self._writer.submit(_emptied(key, r.term, r.voted_for, r.members, repairing=True) + (extra or []),
                            sync=True)
        replica = Replica(self.config_of(plog).with_members(r.members), rng=random.Random(self._rng.random()),
                          now=self.clock.monotonic(), term=r.term, voted_for=r.voted_for, recovering=True)
        new = PartLog(key, replica, plog.nodes, promised=(r.term, r.voted_for), repairing=True)
        self._roles.start_lifecycle(new)
        self.logs[key] = new
        return new

    def base_ops(self, plog: PartLog) -> list[WriteOp]:
        """The store write of the log's members as of its snapshot, if they changed (a
        compaction or a snapshot went past a membership change)."""
        key, base = plog.key, plog.replica.snapshot_members
        if self._bases.get(key) == base:
            return []
        self._bases[key] = base
        return [members_meta(key, base)]

    # -- on a log's active: moves and the group's members -----------------------------------------

    def reconcile_moves(self) -> None:
        """Each moving partition: its ranking follows the members; on its active, the next
        membership change toward the new list, its state, and the move's end once there."""
        for key in list(self._moves.moving):
            plog = self.logs.get(key)
            if plog is None:
                continue
            r = plog.replica
            cfg = self.config_of(plog)
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

    def watch_repairs(self, now: float) -> None:
        """The partitions whose repair is over (their core caught up) lose the store's mark of
        it: written once everything submitted before, the entries that caught it up among
        them, is on disk (the store commits before the log in one batch, so a mark's removal
        submitted with them could reach the disk first).  Then the events' watch of the
        partitions still waiting for an active."""
        for plog in self.logs.values():
            if plog.repairing and not plog.replica.recovering:
                plog.repairing = False
                key = plog.key

                def written(err: BaseException | None, key: Key = key) -> None:
                    now_open = self.logs.get(key)
                    if err is None and (now_open is None or not now_open.repairing):  # (not started over since)
                        self._writer.submit([PutMeta(repair_key(key), "0")], sync=False)

                self._writer.submit([PutMeta(repair_key(key), "1")], sync=True, callback=written)
        self._events.watch_repairs(self.logs.values(), now)

    def reconcile_catalogue(self, target: Members, now: float) -> None:
        """On the catalogue's active: its log's members toward the group's (one change at a
        time, :func:`ha.moves.next_members`), and while partitions re-spread, the next round
        of the re-spread (at most one at a time, every :data:`RESPREAD_EVERY` seconds)."""
        plog = self.logs.get(CATALOGUE)
        if plog is None:
            return
        r = plog.replica
        cfg = self.config_of(plog)
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
        self._events.record(kind, plog.name, f"{self.me}: members {_shown(current)} -> {_shown(nxt)}")
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
