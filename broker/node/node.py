"""A Tandem node: its store, its queues, its client listener, its lifecycle.

The node wires its parts together and owns their lifetimes; each part takes the narrow
interface it needs (a typing Protocol), never the whole node:

* :mod:`broker.sessions.session`: one client connection, a handler per frame;
* :mod:`broker.messaging.publish`: the publish path, a batch from frame to confirm;
* :mod:`broker.messaging.delivery`: consumers, deliveries, settlements;
* :mod:`broker.messaging.catalogue`: declare, delete, purge (on one node or across the group);
* :mod:`broker.messaging.streams`: stream reads by offset;
* :mod:`broker.messaging.commit`: the commit path, the seam between all of the above and the HA mode
  (a single node's store writer, or :mod:`broker.modes.replicated`'s replicated logs);
* :mod:`broker.peers.peers` and :mod:`broker.messaging.forward`: the links to the other members and the
  requests forwarded over them.

The console and the operator tools are built on top, at the entry point (``broker.cli``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import secrets
from pathlib import Path
from collections.abc import Callable, Collection, Coroutine, Mapping, Sequence
from typing import Any, Protocol

from broker.messaging import sequences
from broker.security import tls
from broker.messaging.catalogue import Catalogue
from broker.messaging.commit import CommitPath, LocalCommitPath, ReplicatedCommitPath
from broker.config import ConfigError, NodeConfig, placement_of, redact_url
from broker.partitions.compensation import check_compensation
from broker.messaging.delivery import Delivery
from broker.node.diskalarm import FULL_BELOW, DiskAlarm, free_bytes, full_disk_error, start_error
from broker.messaging.forward import ForwardRequest
from broker.node.forwarded import ForwardHandlers
from broker.arbiters.lockfile import LockFileDriver
from broker.peers.links import host_port
from broker.peers.peers import PeerManager
from broker.peers.placement import placement_diff
from broker.security.secret import decoy_key, group_secret
from broker.messaging.outcome import Outcome
from broker.messaging.publish import Publisher, PublishRequest, PublishResult
from broker.messaging.mapper import MAPPERS, dead_letter_partition, mapper_names
from broker.messaging.queues import MemoryBudget, Msg, Queue, Recipient, revoke_deliveries, take_back_deliveries
from broker.modes.replicated import Replication
from broker.peers.codec import group_out, placement_out, updating_out
from broker.sessions.session import Session
from broker.modes.shared.mode import SharedCommitPath, SharedMode
from broker.sessions.status import HaReport, NodeEvent
from broker.node.tasks import TaskOwner
from broker.messaging.streams import Produced, produced, read_stream
from broker.security.auth import ClientGuard, oldest_waiting
from broker.security.acl import AclTable
from broker.peers.discovery import Discovery
from broker.partitions.drain import Drains
from broker.partitions.members import GroupMembers
from broker.partitions.moves import Moves, check_nodes, without_leaving
from broker.partitions.quarantine import QUEUE as QUARANTINE, Quarantine
from broker.partitions.remap import Remaps
from broker.partitions.restore import MAX_EVENTS as RESTORE_EVENTS, Restores
from broker.security.security import SEEDED_KEY, Security
from broker.security.users import UserRegistry, bootstrap_admin
from client.clock import SYSTEM_CLOCK, Clock
from client.errors import InvalidArgumentError, NotActiveError, ShuttingDownError, \
    TandemError, UnavailableError
from client.protocol.frames import Declare, MapChanged, PartitionMap, PublishMessage, QueueInfo, StreamMessage
from ha.members import Members
from ha.placement import DistributionPolicy, listed, place, spec_of, unsafe_to_replace
from ha.membership import QuorumState
from storage.base import (AclRecord, DropProducers, DurabilityPolicy, Engine, PartitionState, QueueMeta, Recovered,
                          SetDrained, SetGroup, SetPlacement, SetUpdating, Settle, StoredMessage, UserRecord, WriteOp)
from storage.shared import SharedStore
from storage.shared_factory import open_shared
from storage.sqlite import SqliteEngine
from storage.writer import Callback, GroupCommitWriter

log = logging.getLogger("tandem.broker")

#: bytes of ready messages a new active loads before it serves a partition (of its share of
#: max_memory): reading 256 MiB of a 1 GiB backlog held its writes for about 0.9 s
TAKEOVER_HEAD = 16 * 1024 * 1024

#: ``Recovered.meta`` key: the placement settings the store's queues were placed under
PLACEMENT_KEY = "placement"

EngineFactory = Callable[[NodeConfig], Engine]


def sqlite_engine(config: NodeConfig) -> Engine:
    return SqliteEngine(config.db_path, log_segment_bytes=config.log_segment_size)


class Console(Protocol):
    """The management console the entry point attaches (``webconsole``)."""

    @property
    def url(self) -> str: ...

    async def start(self, host: str, port: int) -> None: ...

    async def stop(self) -> None: ...


ConsoleFactory = Callable[["Node"], Console]


class Node:
    def __init__(self, config: NodeConfig, *, clock: Clock = SYSTEM_CLOCK,
                 engine: EngineFactory = sqlite_engine, console: ConsoleFactory | None = None) -> None:
        self.config = config
        check_compensation(config)
        self.clock = clock
        self.catalogue = Catalogue(self)
        self.users = UserRegistry([])
        self.guard = ClientGuard(config, clock)  # failed-login throttle, per-user connections, limits
        self.acls = AclTable()
        self.security = Security(self)
        self.drains = Drains(self)  # the group's members drained for maintenance
        self.moves = Moves(self)  # partitions placed off the policy (tandem partition move)
        self.remaps = Remaps(self)  # queues re-mapping their messages (tandem partition update)
        self.quarantine = Quarantine(self)  # what HA-1014 discards, kept (tandem restore)
        self.restores = Restores(self)  # merging it back, run in the group (admin API, console)
        founding, _policy = config.placement()
        #: the group's members (tandem group add / remove); the settings' until the first change
        self.group = GroupMembers(self, tuple(founding),
                                  {n: z for n, z in config.zone_map().items() if n in founding})
        self.sessions: set[Session] = set()
        #: holders of deliveries inside the node (a restore's consumer): revoked like a session's
        self.local_holders: set[Recipient] = set()
        self.map_watchers: set[Session] = set()  # sessions told MapChanged (they asked for a map)
        self._map_push_scheduled = False
        self.store_stamp = ""
        #: what this node has to say of itself in ``tandem status`` events (an unclean stop)
        self.node_events: list[NodeEvent] = []
        #: shared mode: the group's database, opened by this node only while it holds the lock
        self._shared_store: SharedStore | None = open_shared(config.database) \
            if config.mode == "shared" and config.database else None
        self.shared: SharedMode | None = None
        self.engine = self._shared_store.engine() if self._shared_store is not None else engine(config)
        self._engine_open = False
        self._writer: GroupCommitWriter | None = None
        self._commit: CommitPath | None = None
        self._server: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.delivery = Delivery(self)
        self.publisher = Publisher(self)
        self.forwarded = ForwardHandlers(self)
        self.peers: PeerManager | None = None
        self._peer_secret: bytes | None = None  # the group secret (broker.security.secret), read at start
        self.replication: Replication | None = None
        #: the HA arbiter's driver (shared mode, LockFile), for status, console and metrics
        self.ha: HaReport | None = None
        self._lockfile: LockFileDriver | None = None  # arbiter = "lockfile"
        self._lockfile_task: asyncio.Task[None] | None = None
        self._peer_task: asyncio.Task[None] | None = None
        #: seeds and the gossip of member addresses (replicated mode)
        self.discovery: Discovery | None = None
        self._discovery_task: asyncio.Task[None] | None = None
        #: peer addresses found by discovery for members that had none here
        self.learned: dict[str, tuple[str, int]] = {}
        #: one look at a producer's messages (broker.messaging.streams.produced) at a time: each reads a
        #: partition's store, and a client asking many at once waits for each in turn
        self.scans = asyncio.Semaphore(1)
        self._replication_task: asyncio.Task[None] | None = None
        self.stopping = False
        self.stopped = asyncio.Event()
        self._spawned = TaskOwner(f"node {config.name}")  # broker/node/tasks.py: ended by stop()
        self._console_factory = console
        self.console: Console | None = None
        #: the disk alarm (broker/node/diskalarm.py): None in shared mode (the data is in the
        #: group's database) and with disk_free_limit = 0
        self.disk_alarm: DiskAlarm | None = None
        self._disk_task: asyncio.Task[None] | None = None
        self.confirms = 0  # messages confirmed to publishers (metrics)
        #: called on the writer thread with each commit's duration and sync flag (metrics); every
        #: writer the node opens shares this list (shared mode opens one per activation)
        self.commit_observers: list[Callable[[float, bool], None]] = []
        self.address: tuple[str, int] = (config.host, config.port)
        self.priority = config.priority  # changeable at runtime (tandem admin set-priority)
        self.data_path = config.data_dir

    @property
    def queues(self) -> dict[str, Queue]:
        return self.catalogue.queues

    @property
    def memory(self) -> MemoryBudget:
        """Ready messages held in memory against ``max_memory`` (broker.messaging.queues)."""
        return self.catalogue.budget

    @property
    def holders(self) -> Collection[Recipient]:
        return [*self.sessions, *self.local_holders] if self.local_holders else self.sessions

    @property
    def has_quorum(self) -> bool:
        """False while this group member has no node quorum (its partitions are Unavailable);
        in shared mode, while it does not hold the lock."""
        if self.shared is not None:
            return self.shared.serving()
        return self.peers is None or self.peers.membership.quorum_state is not QuorumState.DISABLED

    @property
    def commit(self) -> CommitPath:
        if self._commit is None:
            raise ShuttingDownError("the node is not started")
        return self._commit

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        cfg = self.config
        self._loop = asyncio.get_running_loop()
        log.info("node start started name=%s data_dir=%s sync=%s", cfg.name, cfg.data_dir, cfg.sync.value)
        found = await asyncio.to_thread(mapper_names)  # scans the import path once, off the loop
        if len(found) > len(MAPPERS):
            log.info("custom data mappers: %s", ", ".join(found[len(MAPPERS):]))
        try:
            await self._start()
        except BaseException as exc:
            full = await asyncio.to_thread(start_error, cfg.name, cfg.data_dir, exc) \
                if isinstance(exc, Exception) and cfg.mode != "shared" else None
            log.error("node start failed name=%s error=%s", cfg.name, full.message if full is not None else exc)
            await self._stop_disk_alarm()
            await self._spawned.close()
            try:
                await self._stop_peers()
                await self._close_store()
            except Exception as close_exc:
                if full is None:
                    raise
                log.debug("closing after a start on a full disk: %s", close_exc)
            if full is not None:
                raise full from None
            raise
        total = sum(q.depth for q in self.queues.values())
        log.info(
            "node start complete name=%s url=%s://%s:%d data_dir=%s sync=%s queues=%d messages=%d",
            cfg.name, "tandems" if cfg.tls_cert is not None else "tandem", self.address[0], self.address[1],
            self.data_path, cfg.sync.value, len(self.queues), total,
        )
        if self.replication is not None:
            self.quarantine.drain()  # (what a stop kept from reaching the quarantine queue)
        else:
            self.remaps.start()  # (every partition is served here from the start)

    async def _start(self) -> None:
        cfg = self.config
        assert self._loop is not None  # set by start(), which is the only caller
        await asyncio.to_thread(tls.check, cfg)  # a bad certificate or key stops the start, named
        if cfg.peer_port is not None:  # before anything is made: a member without a secret does not start
            self._peer_secret = await asyncio.to_thread(group_secret, cfg)
        await asyncio.to_thread(cfg.data_dir.mkdir, parents=True, exist_ok=True)
        self.data_path = await asyncio.to_thread(cfg.data_dir.resolve)
        self.users.decoy_key = await asyncio.to_thread(decoy_key, self._peer_secret, self.data_path)
        if self._shared_store is not None:
            await self._start_shared(self._shared_store)
            return
        free = await asyncio.to_thread(free_bytes, self.data_path)
        if free < FULL_BELOW:  # nothing could be written: refuse to start, in one line
            raise full_disk_error(cfg.name, self.data_path, free)
        if cfg.disk_free_limit > 0:  # raised at once on a nearly full disk
            self.disk_alarm = DiskAlarm(cfg.name, self.data_path, cfg.disk_free_limit, clock=self.clock)
            self.disk_alarm.update(free)
        self.engine.load_budget = cfg.max_memory
        recovered = await asyncio.to_thread(self.engine.open)
        if recovered.unclean_stop:
            self._unclean_stop()
        self._writer = GroupCommitWriter(self.engine, self._loop.call_soon_threadsafe, clock=self.clock)
        self._writer.commit_observers = self.commit_observers
        self._commit = LocalCommitPath(self._writer, cfg.name, sync=cfg.sync.value == "SYNC")
        self._restore(recovered, group=cfg.peer_port is not None)
        if "store_stamp" not in recovered.meta:
            self.store_stamp = f"{int(self.clock.time() * 1000):x}-{secrets.token_hex(4)}"
            await asyncio.to_thread(self.engine.set_meta, "store_stamp", self.store_stamp)
        else:
            self.store_stamp = recovered.meta["store_stamp"]
        if cfg.peer_port is not None and self._joining() and not cfg.peers:
            cfg = await self._find_group()
        if cfg.peer_port is not None:
            await self._check_placement(recovered.meta.get(PLACEMENT_KEY))
        if not len(self.users):
            op, how = await asyncio.to_thread(bootstrap_admin, cfg.data_dir)
            await self.write([op], sync=True)
            self.users.put(op.user)
            log.warning("created user admin: password %s", how)
        server = await self._bind_clients()
        if cfg.peer_port is not None:
            self.peers = PeerManager(self, secret=self._peer_secret)
            self.discovery = Discovery(self, self.peers)
            self.peers.on_addresses = self.discovery.heard
            if self.group.changed():
                self.peers.set_members(self._member_addresses(), self.placement_text())
            self.replication = Replication(self, recovered.logs, recovered.meta)
            self._commit = ReplicatedCommitPath(self.replication)
            if cfg.arbiter == "lockfile":  # before the logs open: they stand for nothing until it says so
                self._lockfile = LockFileDriver(cfg, self.clock, self.replication, self.peers)
                self.ha = self._lockfile
            self.replication.start()
            await self.peers.start()
            self._peer_task = asyncio.create_task(self.peers.run(), name="tandem-peers")
            self._discovery_task = asyncio.create_task(self.discovery.run(), name="tandem-discovery")
            self._replication_task = asyncio.create_task(self.replication.run(), name="tandem-replication")
            if self._lockfile is not None:
                self._lockfile_task = asyncio.create_task(self._lockfile.run(), name="tandem-lockfile")
        await server.start_serving()
        if self.disk_alarm is not None:
            self._disk_task = asyncio.create_task(self.disk_alarm.run(), name="tandem-disk-alarm")
        self._spawned.spawn(self._expire_producers(), "tandem-producer-expiry")
        await self._start_console()

    async def _check_placement(self, was: str | None) -> None:
        """The placement settings (members, replicas, zones) a store's queues were placed under
        are the ones it starts with: other ones would move partitions to nodes that hold no
        copy of them (and a majority of such nodes could elect one that has nothing).  Stored
        at the first start in a group, and again while the store holds no queue."""
        now = self.config.placement_settings()
        if was == now or self.group.changed():
            return  # (once the members changed while the group ran, the group's list is the one)
        if was is not None and self.queues:
            unsafe = self._unsafe_moves(was)
            diff = placement_diff(now, was, "now", "then")
            if unsafe:
                raise ConfigError(
                    f"node {self.config.name} cannot start: its store's queues were placed under other group "
                    f"settings ({diff}), and under these {len(unsafe)} partition(s) would be on voters a majority "
                    f"of which may lack confirmed messages, e.g. {'; '.join(unsafe[:3])}; partitions are not "
                    f"copied when settings change, so start it with its former peers, replicas, sync_replicas and "
                    f"zones, or give a group of another shape a data directory of its own "
                    f"(tandem cluster up --data-dir)")
            log.warning("placement settings changed since the last start (%s): every partition's new voters "
                        "include enough of its former ones", diff)
        await asyncio.to_thread(self.engine.set_meta, PLACEMENT_KEY, now)

    def _unsafe_moves(self, was: str) -> list[str]:
        """The partitions whose node list under the settings ``was`` may not be replaced by the
        one under this node's (:func:`ha.placement.unsafe_to_replace`), as "queue/p: old -> new"."""
        old_members, old_policy = placement_of(was)
        new_members, new_policy = self.config.placement()
        out = []
        for q in sorted(self.queues.values(), key=lambda q: q.meta.id):
            try:
                before = place(old_policy, q.meta.partitions, old_members)
            except ValueError:
                before = []  # (settings this build cannot place by: every list counts as new)
            after = place(new_policy, q.meta.partitions, new_members)
            for p, new in enumerate(after):
                old = before[p] if before else None
                if old is None or unsafe_to_replace(old, new):
                    out.append(f"{q.name}/{p}: {','.join(old.nodes) if old else '?'} -> {','.join(new.nodes)}")
        return out

    async def _stop_disk_alarm(self) -> None:
        if self._disk_task is not None:
            self._disk_task.cancel()
            await asyncio.gather(self._disk_task, return_exceptions=True)
            self._disk_task = None

    def check_disk(self, what: str) -> None:
        """Refuse ``what`` (a write to this node's own store) while the disk alarm is raised."""
        if self.disk_alarm is not None:
            self.disk_alarm.refuse(what)

    async def _bind_clients(self) -> asyncio.Server:
        """Bind the client port now (peers learn the address in the handshake); serving
        starts once everything is set up."""
        cfg = self.config
        self._server = server = await asyncio.start_server(self._on_client, cfg.host, cfg.port, limit=1 << 20,
                                                           ssl=tls.client_server_context(cfg),
                                                           start_serving=False)
        sock = server.sockets[0].getsockname()
        self.address = (sock[0], sock[1])
        return server

    async def _start_console(self) -> None:
        cfg = self.config
        if cfg.http_port is not None and self._console_factory is not None:
            self.console = self._console_factory(self)
            await self.console.start(cfg.host, cfg.http_port)

    # -- shared mode ------------------------------------------------------------------------

    async def _start_shared(self, store: SharedStore) -> None:
        """Shared mode: listen, link to the peers, and leave the store to the lock: this node
        opens it when it takes the lock (:meth:`activate_shared`)."""
        cfg = self.config
        password = os.environ.get("TANDEM_ADMIN_PASSWORD")
        if password and len(password) < 8:  # now, not at the first activation, maybe much later
            raise InvalidArgumentError("TANDEM_ADMIN_PASSWORD: the password must be at least 8 characters")
        self.store_stamp = await asyncio.to_thread(_node_stamp, cfg.data_dir, self.clock.time())
        lease = await asyncio.to_thread(store.lease)
        self.shared = SharedMode(self, lease, name=cfg.name, lease_seconds=cfg.lease, lock=cfg.lock, clock=self.clock)
        self.ha = self.shared
        server = await self._bind_clients()
        if cfg.peer_port is not None:
            self.peers = PeerManager(self, secret=self._peer_secret)
            await self.peers.start()
            self._peer_task = asyncio.create_task(self.peers.run(), name="tandem-peers")
        await server.start_serving()
        self.shared.start()
        await self._start_console()
        log.info("shared mode: %s is PASSIVE until it holds the lock (database %s, lock %s, lease %.2f s)",
                 cfg.name, redact_url(cfg.database or ""), cfg.lock, cfg.lease)

    async def activate_shared(self, epoch: int) -> None:
        """ACTIVATING: open the group's store fenced by ``epoch`` and load every queue.
        Messages delivered but not settled under the previous active are ready again, their
        delivery counts kept (counted once more if they may have been out with a consumer)."""
        if self._shared_store is None or self.shared is None or self._loop is None:
            raise ShuttingDownError(f"node {self.config.name} is not a started shared-mode node: nothing to activate")
        cfg = self.config
        started = self.clock.monotonic()
        engine = self._shared_store.engine()
        engine.fence(epoch)
        engine.load_budget = cfg.max_memory
        recovered = await asyncio.to_thread(engine.open)
        self.engine, self._engine_open = engine, True
        self._writer = GroupCommitWriter(engine, self._loop.call_soon_threadsafe, clock=self.clock)
        self._writer.commit_observers = self.commit_observers
        self._commit = SharedCommitPath(self._writer, self.shared, sync=cfg.sync.value == "SYNC")
        self.catalogue = Catalogue(self)
        self.users = UserRegistry([], decoy_key=self.users.decoy_key)
        self.acls = AclTable()
        self._restore(recovered)
        if not len(self.users):
            op, how = await asyncio.to_thread(bootstrap_admin, cfg.data_dir)
            await self.write([op], sync=True)
            self.users.put(op.user)
            log.warning("created user admin: password %s", how)
        total = sum(q.depth for q in self.queues.values())
        log.warning("shared mode: %s activated under epoch %d in %.2f s: %d queue(s), %d message(s) loaded",
                    cfg.name, epoch, self.clock.monotonic() - started, len(self.queues), total)
        for q in self.queues.values():
            self.delivery.schedule(q)
        self._spawned.spawn(self._expire_producers(), "tandem-producer-expiry")  # (while active)
        self.map_changed()

    def shared_active(self) -> None:
        self.remaps.start()  # (an update the previous lock holder had under way goes on here)

    def passive_users(self, users: list[UserRecord], acls: list[AclRecord] | None = None) -> None:
        """Shared mode, a passive: the group's users and grants as the database holds them."""
        if not self._engine_open:
            self.users = UserRegistry(users, decoy_key=self.users.decoy_key)
            if acls is not None:
                self.acls = AclTable(acls)

    def user_changed(self, name: str, *, seeded: bool = False) -> None:
        """A change of user ``name`` was applied here: recheck its sessions (broker.security.standing)."""
        for s in list(self.sessions):
            if s.user is not None and s.user.name == name:
                if seeded:
                    s.renew_standing()
                else:
                    s.recheck_standing()

    async def deactivate_shared(self, error: NotActiveError) -> None:
        """Stop serving (the lock is lost or this node stops): close every session with
        ``error``, forget the queues (the store has them) and close the store."""
        if not self._engine_open:
            return
        self._engine_open = False
        log.warning("shared mode: %s stops serving: %s", self.config.name, error.message)
        for s in list(self.sessions):
            s.shutdown(error)
        if self.sessions:
            await asyncio.gather(*(s.finished.wait() for s in list(self.sessions)))
        self.catalogue = Catalogue(self)  # (the users stay: a passive answers status requests)
        await self._spawned.cancel_all()  # the active's work: before the store closes
        await self._close_store()
        self.map_changed()

    def _unclean_stop(self) -> None:
        """The store was not closed when it was last open.  Under a policy that confirms
        before an fsync, what was confirmed since the last one is gone if the machine went
        down (power, OS crash); a process that was only killed left it with the OS.  Said
        once at start (log, and ``tandem status`` events); a clean stop says nothing."""
        cfg = self.config
        weak = sorted({p.value for p in ((cfg.sync, cfg.remote_sync) if cfg.peer_port is not None else (cfg.sync,))
                       if p is not DurabilityPolicy.SYNC})
        if not weak:
            return
        group = " (the group's other nodes hold what they confirmed: HA-1014 reports what this node " \
                "discards on rejoin)" if cfg.peer_port is not None else ""
        text = (f"{cfg.name} did not stop cleanly (killed, or the machine went down) and writes under "
                f"{' and '.join(weak)} without an fsync: if the machine went down (power cut, OS crash), "
                f"writes confirmed since the last fsync may be lost; how many is not known here{group}")
        log.warning("store: %s", text)
        self.node_events.append(NodeEvent(self.clock.time(), "unclean-stop", "-", text))

    def _restore(self, rec: Recovered, *, group: bool = False) -> None:
        """Queues, partitions and users from the store.  In a group a partition's messages
        are loaded only when this node becomes its active (:meth:`partition_loaded`)."""
        cat = self.catalogue
        for meta in rec.queues:
            cat.add(meta)
        cat.next_id = max(cat.next_id, int(rec.meta.get("queue_id_hwm", "0")) + 1)
        for (qid, pidx), st in rec.partitions.items():
            q = cat.by_id(qid)
            if q is None or pidx >= len(q.partitions):
                log.warning("recovery ignored rows of unknown queue_id=%d partition=%d", qid, pidx)
                continue
            q.load_partition(pidx, st, messages=not group)
        for u in rec.users:
            self.users.put(u)
        self.acls = AclTable(rec.acls)
        self.security.seeded = rec.meta.get(SEEDED_KEY) == "group"
        self.drains.load(rec.meta)
        self.moves.load(rec.meta, {m.id for m in rec.queues})
        self.remaps.load(rec.meta, {m.id for m in rec.queues})
        for qid, parts in self.remaps.pending.items():
            q = cat.by_id(qid)
            if q is not None:
                q.paused = parts
        self.group.load(rec.meta)

    async def stop(self) -> None:
        """Stop accepting, close sessions, commit what is pending, close the store."""
        if self.stopping:
            await self.stopped.wait()
            return
        self.stopping = True
        log.info("node stop started name=%s sessions=%d", self.config.name, len(self.sessions))
        if self.shared is not None:
            # the lock loop first, then the sessions (their last acks commit), then the lock
            # goes: the peer takes over at once rather than after the lease
            await self.shared.halt()
            for s in list(self.sessions):
                s.shutdown(ShuttingDownError(f"node {self.config.name} is shutting down"))
            if self.sessions:
                await asyncio.gather(*(s.finished.wait() for s in list(self.sessions)))
            await self._spawned.close()  # (before the store closes: they may write)
            await self._close_store()
            await self.shared.release()
        if self.console is not None:
            await self.console.stop()
        await self._stop_disk_alarm()
        if self._server is not None:
            self._server.close()
        for s in list(self.sessions):
            s.shutdown(ShuttingDownError(f"node {self.config.name} is shutting down"))
        if self.sessions:
            await asyncio.gather(*(s.finished.wait() for s in list(self.sessions)))
        if self._server is not None:
            await self._server.wait_closed()
        await self._spawned.close()  # the sessions' work done: before the links and the store go
        if self.replication is not None:
            # the acks still waiting for a partition's next entry: out while the links are up
            await self.replication.flush_lazy(timeout=self.config.non_response_timeout)
        await self._stop_peers()
        try:
            await self._close_store()
        except (OSError, TandemError) as exc:  # a failing disk: the node stops all the same
            log.error("closing the store failed: %s", exc)
        log.info("node stop complete name=%s", self.config.name)
        self.stopped.set()

    async def _stop_peers(self) -> None:
        if self._lockfile_task is not None:
            self._lockfile_task.cancel()
            await asyncio.gather(self._lockfile_task, return_exceptions=True)
            self._lockfile_task = None
        if self._lockfile is not None:
            await self._lockfile.stop()  # the lock released: the peer may take over at once
        if self._replication_task is not None:
            self._replication_task.cancel()
            try:
                await self._replication_task
            except asyncio.CancelledError:
                pass  # we cancelled it
            self._replication_task = None
        if self.replication is not None:
            self.replication.stop()
        if self._discovery_task is not None:
            self._discovery_task.cancel()
            try:
                await self._discovery_task
            except asyncio.CancelledError:
                pass  # we cancelled it
            self._discovery_task = None
        if self._peer_task is not None:
            self._peer_task.cancel()
            try:
                await self._peer_task
            except asyncio.CancelledError:
                pass  # we cancelled it: the expected end of the peer tasks
            self._peer_task = None
        if self.peers is not None:
            await self.peers.stop()

    async def _close_store(self) -> None:
        if self._shared_store is not None and not self._engine_open and self._writer is None:
            return  # shared mode, passive: this node has not opened the group's store
        self._engine_open = False
        if self._writer is not None:
            await asyncio.to_thread(self._writer.close)
            st = self._writer.stats
            log.info("store writer stats commits=%d synced=%d failed=%d retried_ops=%d ops=%d "
                     "max_batch_ops=%d busy_s=%.2f", st.commits, st.synced_commits, st.failed_commits,
                     st.retried_ops, st.ops, st.max_batch_ops, st.commit_seconds_total)
            self._writer = None
        await asyncio.to_thread(self.engine.close)

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.stopping:
            Session.refuse(writer, ShuttingDownError("node is shutting down"))
            return
        if len(self.sessions) >= self.config.max_connections:
            waiting = oldest_waiting(self.sessions)
            if waiting is None:
                Session.refuse(writer, UnavailableError(f"node is at max_connections ({self.config.max_connections})"))
                return
            waiting.give_up_slot()
        session = Session(self, reader, writer)
        self.sessions.add(session)
        try:
            await session.run()
        finally:
            self.sessions.discard(session)
            self.map_watchers.discard(session)
            self.delivery.release(session)

    def set_quorum_override(self, nodes: int | None, *, by: str) -> None:
        if self.peers is None:
            raise InvalidArgumentError("this node is not in a replication group: there is no quorum to override")
        try:
            changes = self.peers.membership.set_quorum_override(nodes)
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from None
        log.warning("QUORUM OVERRIDE %s by %s on node %s: %s", "SET" if nodes is not None else "CLEARED", by,
                    self.config.name, f"at least {nodes} node(s) up" if nodes is not None else
                    f"back to policy {self.config.quorum_policy}")
        self.peers.report(changes)
        if self.replication is not None:
            self.replication.quorum_override = nodes
            self.replication.reconfigure()

    def set_option(self, name: str, value: int, *, by: str) -> None:
        """Runtime ``priority`` or ``designated_primary``: effective at once, logged loudly."""
        rep, peers = self._group(f"{name} has no effect")
        if name == "priority":
            if not 0 <= value <= 3:
                raise InvalidArgumentError(f"priority {value}: 0 (never active), 1, 2 or 3 (highest)")
            old, self.priority = self.priority, value
            rep.priority = value
            log.warning("PRIORITY SET by %s on node %s: %d -> %d", by, self.config.name, old, value)
        elif name == "designated_primary":
            if self.config.arbiter != "majority":
                raise InvalidArgumentError(f"designated_primary: not with arbiter = \"{self.config.arbiter}\" "
                                           "(the arbiter decides who goes on alone)")
            if value not in (0, 1):
                raise InvalidArgumentError("designated_primary: 1 (on) or 0 (off)")
            if value and len(rep.members) != 2:
                raise InvalidArgumentError(f"designated_primary: only in a two-node group (this one has "
                                           f"{len(rep.members)} members)")
            rep.designated_primary = self.config.name if value else None
            peers.report(peers.membership.set_designated_primary(bool(value)))
            log.warning("DESIGNATED PRIMARY %s by %s on node %s", "SET" if value else "CLEARED", by,
                        self.config.name)
        else:
            raise InvalidArgumentError(f"unknown setting {name!r}: priority or designated_primary")
        rep.reconfigure()

    def refusal(self) -> NotActiveError | None:
        """Why this node serves no client now: a shared-mode node without the lock (or still
        loading the queues) names the active; None when it serves."""
        if self.replication is not None and self.config.name not in self.group.members:
            return NotActiveError(f"node {self.config.name} is no longer a member of its group (tandem group "
                                  f"remove): connect to another member")
        if self.shared is None or (self._engine_open and self.shared.serving()):
            return None
        return self.shared.not_active()

    def require_quorum(self, what: str) -> None:
        """Refuse ``what`` while this node has no node quorum: its partitions are Unavailable
        (in shared mode: while it does not hold the lock)."""
        if self.shared is not None:
            if not self.shared.serving():
                raise self.shared.not_active(f"cannot {what}")
            return
        if self.peers is None:
            return
        m = self.peers.membership
        if m.quorum_state is QuorumState.DISABLED:
            zq = next((z for z in m.zone_quorums() if z.zone.name == m.disabled_by), None)
            if zq is not None:
                raise UnavailableError(
                    f"node {self.config.name} has no quorum in availability zone {zq.zone.name} ({zq.up_votes} of "
                    f"{zq.total_votes} votes up, policy {zq.zone.policy}): its HA services are off, cannot "
                    f"{what} here")
            up = 1 + len(m.up())
            raise UnavailableError(
                f"node {self.config.name} has no quorum ({up} of {1 + len(self.peers.addresses)} nodes up, policy "
                f"{self.config.quorum_policy}): partitions are Unavailable here, cannot {what}")



    @property
    def writer(self) -> GroupCommitWriter:
        if self._writer is None:
            raise ShuttingDownError("the node's store is not open")
        return self._writer

    def write(self, ops: list[WriteOp], *, sync: bool) -> asyncio.Future[None]:
        """Commit ``ops`` now; the future resolves when they are committed."""
        if self._loop is None:
            raise ShuttingDownError("the node is not started")
        fut: asyncio.Future[None] = self._loop.create_future()

        def done(err: BaseException | None) -> None:
            if not fut.done():
                fut.set_exception(err) if err else fut.set_result(None)

        self.writer.submit(ops, sync=sync, callback=done)
        return fut

    def write_later(self, ops: list[WriteOp], callback: Callback | None = None, *, lazy: bool = True) -> None:
        """Write ops nobody waits for: retried until committed; ``callback`` runs then.

        In a group these are partition ops (settlements, marks, counts): they are
        replicated, and fail (callback gets the error) for partitions this node no
        longer serves; the new active redelivers those messages."""
        if not ops:
            return
        self.commit.propose(ops, callback, lazy=lazy)


    # -- replicated mode: what the replication driver tells the node -------------------------------


    # -- what the replication driver tells the node ---------------------------------------

    def queue_by_id(self, queue_id: int) -> Queue | None:
        return self.catalogue.by_id(queue_id)

    def catalogue_put(self, meta: QueueMeta) -> bool:
        had = self.catalogue.queues.get(meta.name)
        was = had.meta if had is not None else None
        applied = self.catalogue.apply_put(meta)
        if applied and was != meta:
            self.updating_changed(meta.id)  # (a queue a snapshot brings may be being updated)
            if was is not None:
                self.map_changed()  # (clients learn the new partitions and mapper)
        return applied

    def catalogue_drop(self, queue_id: int) -> None:
        self.catalogue.apply_drop(queue_id)
        self.moves.forget(queue_id)
        self.remaps.forget(queue_id)

    def security_apply(self, op: WriteOp) -> list[WriteOp]:
        return self.security.apply(op)

    def security_snapshot(self) -> dict[str, Any]:
        group = self.group.snapshot()
        return {**self.security.snapshot(), "drained": self.drains.snapshot(),
                "placed": [placement_out(op) for op in self.moves.snapshot()],
                "updating": [updating_out(op) for op in self.remaps.snapshot()],
                **({"group": group_out(group)} if group is not None else {})}

    def security_install(self, data: dict[str, Any]) -> list[WriteOp]:
        ops = self.security.install(data)
        if "group" in data:  # (before the placements: their nodes are members)
            ops.extend(self.group.install(data["group"]))
        if "drained" in data:
            ops.extend(self.drains.install(data["drained"]))
        if "placed" in data:
            ops.extend(self.moves.install(data["placed"]))
        if "updating" in data:
            ops.extend(self.remaps.install(data["updating"]))
        return ops

    def updates_under_way(self) -> list[str]:
        return self.remaps.under_way({q.meta.id: q.name for q in self.catalogue.queues.values()})

    def moves_under_way(self) -> list[str]:
        out = []
        m = self.moves
        for key in sorted(m.moving | set(m.forcing)):
            q = self.catalogue.by_id(key[0])
            if q is not None:
                forcing = f" (forced replication: {m.forcing[key]})" if key in m.forcing else ""
                out.append(f"{q.name}/{key[1]} {','.join(m.placed.get(key) or self.nodes_of(key))}{forcing}")
        return out

    def move_apply(self, op: SetPlacement) -> list[WriteOp]:
        return self.moves.apply(op)

    def placed(self, key: tuple[int, int]) -> tuple[str, ...] | None:
        return self.moves.placed.get(key)

    @property
    def moving(self) -> Collection[tuple[int, int]]:
        return self.moves.moving

    @property
    def static(self) -> Collection[tuple[int, int]]:
        return self.moves.static

    async def move_finished(self, key: tuple[int, int], nodes: tuple[str, ...]) -> None:
        await self.moves.finished(key, nodes)

    def move_refusal(self) -> str | None:
        refusal = self.drain_refusal()
        return refusal.replace("node drain", "partition move") if refusal else None

    def queue_meta(self, name: str) -> QueueMeta | None:
        q = self.catalogue.queues.get(name)
        return q.meta if q is not None else None

    def queue_meta_of(self, queue_id: int) -> QueueMeta | None:
        q = self.catalogue.by_id(queue_id)
        return q.meta if q is not None else None

    def nodes_of(self, key: tuple[int, int]) -> tuple[str, ...]:
        q = self.catalogue.by_id(key[0])
        if self.replication is None or q is None:
            return ()
        return spec_of(self.replication.placed(key, q.meta.partitions))

    def spec_of(self, nodes: tuple[str, ...]) -> tuple[str, ...]:
        if self.replication is None:
            return nodes
        return spec_of(listed(self.replication.policy, nodes))

    def placement_changed(self, key: tuple[int, int]) -> None:
        if self.replication is not None:
            self.replication.placement_changed(key)

    def static_lists(self, queue_id: int) -> tuple[tuple[str, ...], ...] | None:
        q = self.catalogue.by_id(queue_id)
        if q is None or (queue_id, 0) not in self.moves.static:
            return None
        return tuple(self.nodes_of((queue_id, p)) for p in range(q.meta.partitions))

    def static_placement(self, meta: QueueMeta, lists: tuple[tuple[str, ...], ...],
                         first: int = 0) -> list[WriteOp]:
        refusal = self.drain_refusal()
        if refusal:
            raise InvalidArgumentError(refusal.replace("node drain", "placement"))
        members, policy = self.placement()
        out: list[WriteOp] = []
        for p, nodes in enumerate(lists, first):
            check_nodes(f"placement: partition {p}", nodes, members)
            placed = listed(policy, nodes)
            if all(self._priority_of(n) == 0 for n in placed.voters):
                raise InvalidArgumentError(f"placement: partition {p}: every voter of {','.join(nodes)} has priority "
                                           f"0 (never active): it could never have an active")
            out.append(SetPlacement(meta.id, p, spec_of(placed), False, True))
        return out

    def _priority_of(self, name: str) -> int | None:
        """A member's priority as its handshake gave it (None: not known here now)."""
        if name == self.config.name:
            return self.priority
        ident = self.peers.membership.identity(name) if self.peers is not None else None
        return ident.priority if ident is not None else None

    def drain_apply(self, op: SetDrained) -> list[WriteOp]:
        return self.drains.apply(op)

    @property
    def drained(self) -> frozenset[str]:
        return self.drains.drained | self.group.leaving  # (a leaving member's actives move off it too)

    def group_members(self) -> tuple[str, ...]:
        return tuple(self.replication.members) if self.replication is not None else ()

    # -- the group's members (broker.partitions.members) ----------------------------------------------------

    def placement(self) -> tuple[list[str], DistributionPolicy]:
        """The members partitions are placed on, and the policy (with the members' zones)."""
        members, policy = self.config.placement()
        if not self.group.changed():
            return members, policy
        placing = list(self.group.placing)
        zones = tuple((n, z) for n, z in sorted(self.group.zones.items()) if n in placing)
        return placing, dataclasses.replace(policy, zones=zones)

    def placement_text(self) -> str:
        """What the peer handshake says this node places partitions by: the settings', or,
        once the members changed while the group ran, the parts that are still settings
        (members and zones are the group's state then, the same on every member that has it)."""
        if not self.group.changed():
            return self.config.placement_settings()
        return f"group=changed replicas={self.config.replicas} sync_replicas={self.config.sync_replicas}"

    def _member_addresses(self) -> dict[str, tuple[str, int]]:
        """Every other member's peer address (the witness, under that arbiter, included)."""
        founding = self.config.peer_addresses()
        added = self.group.addresses
        out = {}
        for n in self.group.members:
            if n == self.config.name:
                continue
            addr = added.get(n) or founding.get(n) or self.learned.get(n)
            if addr is None:
                log.warning("group member %s: its peer address is in neither this node's peers nor the group's "
                            "state: not linking to it until a member or a seed gives it (broker.peers.discovery)", n)
                continue
            out[n] = addr
        witness = self.config.witness_address()
        if witness is not None:
            out[witness[0]] = witness[1]
        return out

    # -- discovery (broker.peers.discovery) -------------------------------------------------------------

    def _joining(self) -> bool:
        """A node that joins and has not got the group's state yet."""
        return self.config.join and not self.group.changed()

    async def _find_group(self) -> NodeConfig:
        """A node that joins by seeds alone: ask them until one answers, then start as if the
        members it named were this node's ``peers``."""
        seeker = PeerManager(self, secret=self._peer_secret)
        found = await Discovery(self, seeker).find_group()
        self.learned.update(found)
        self.config = cfg = dataclasses.replace(
            self.config, peers=tuple(f"{n}={host_port(h, p)}" for n, (h, p) in sorted(found.items())))
        founding, _policy = cfg.placement()
        self.group = GroupMembers(self, tuple(founding), {n: z for n, z in cfg.zone_map().items() if n in founding})
        log.warning("joining the group its seeds belong to: members %s", ", ".join(sorted(found)))
        return cfg

    def missing_addresses(self) -> list[str]:
        peers = self.peers
        if peers is None:
            return []
        if self._joining():
            return [] if peers.addresses else ["*"]
        return [n for n in self.group.members if n != self.config.name and n not in peers.addresses]

    def learn_addresses(self, found: dict[str, tuple[str, int]]) -> None:
        peers = self.peers
        if peers is None:
            return
        joining = self._joining()
        new = {n: a for n, a in found.items()
               if n != self.config.name and n not in peers.addresses and n not in self.learned
               and (joining or n in self.group.members)}
        if not new:
            return
        self.learned.update(new)
        log.info("member addresses found: %s", ", ".join(f"{n}={h}:{p}" for n, (h, p) in sorted(new.items())))
        if joining:  # (the members it finds the group by, as peers would name them)
            peers.set_members({**peers.addresses, **new}, self.placement_text())
        else:
            self.members_changed()

    def member_book(self) -> list[str]:
        return self.peers.book() if self.peers is not None else []

    def group_apply(self, op: SetGroup) -> list[WriteOp]:
        out: list[WriteOp] = []
        for qid, p, nodes in op.pins:
            if (qid, p) not in self.moves.placed:
                out.extend(self.moves.apply(SetPlacement(qid, p, nodes, False)))
        out.extend(self.group.apply(op))
        return out

    def members_changed(self) -> None:
        out = self.config.name not in self.group.members
        if out:
            log.warning("this node, %s, is no longer a member of the group: it links to none of them; stop it "
                        "(its copies are on the other members now)", self.config.name)
        if self.peers is not None:
            self.peers.set_members({} if out else self._member_addresses(), self.placement_text())
        refusal = self.refusal()
        if out and refusal is not None:
            for session in list(self.sessions):
                if not session.observer:
                    session.shutdown(refusal)  # durable clients go on at another member
        if self.replication is not None:
            self.replication.set_members(*self.placement())

    def group_refusal(self) -> str | None:
        if self.replication is None:
            return "group: this node is not in a replication group (a single node, or shared mode)"
        if self.config.arbiter != "majority":
            return f'group: not with arbiter = "{self.config.arbiter}" (a two-node group\'s members are fixed)'
        return None

    def founding_address(self, name: str) -> str | None:
        addr = self.config.peer_addresses().get(name)
        return f"{addr[0]}:{addr[1]}" if addr is not None else None

    def unplaced(self) -> list[tuple[int, int, tuple[str, ...]]]:
        out = []
        for q in sorted(self.catalogue.queues.values(), key=lambda q: q.meta.id):
            for p in range(q.meta.partitions):
                if (q.meta.id, p) not in self.moves.placed:
                    out.append((q.meta.id, p, self.nodes_of((q.meta.id, p))))
        return out

    def feasible(self, members: tuple[str, ...], zones: Mapping[str, str]) -> str | None:
        _members, policy = self.placement()
        try:
            place(dataclasses.replace(policy, zones=tuple(sorted(zones.items()))), 1, list(members))
        except ValueError as exc:
            return str(exc)
        return None

    def policy_targets(self) -> dict[tuple[int, int], tuple[str, ...]]:
        """Where the policy places every partition over the members (not leaving), as
        ``name:sync`` / ``name:async`` lists: what a re-spread moves them to."""
        if self.replication is None:
            return {}
        members, policy = self.placement()
        out = {}
        for q in self.catalogue.queues.values():
            for p, nodes in enumerate(place(policy, q.meta.partitions, members)):
                key = (q.meta.id, p)
                out[key] = spec_of(nodes) if key not in self.moves.static else \
                    without_leaving(self.nodes_of(key), members, self.group.zones)
        return out

    def catalogue_target(self) -> Members | None:
        """The catalogue log's members once the group's list changed: the members not
        leaving vote, the leaving ones learn (None: the settings' members, as opened)."""
        if not self.group.changed():
            return None
        return Members(self.group.placing, tuple(sorted(self.group.leaving)))

    def group_view(self) -> tuple[list[str], dict[str, str], str]:
        g = self.group
        change = ""
        if g.respread:
            what = f"{', '.join(sorted(g.leaving))} leaving" if g.leaving else "a member added"
            change = f"{what}: partitions re-spreading over {', '.join(g.placing)}"
        return list(g.members), g.zones, change

    @property
    def respreading(self) -> bool:
        return self.group.respread

    async def respread_step(self, settled: bool) -> None:
        await self.group.step(settled)

    async def retarget(self, key: tuple[int, int], nodes: tuple[str, ...]) -> None:
        await self.moves.retarget(key, nodes)

    async def start_move(self, key: tuple[int, int], nodes: tuple[str, ...], by: str) -> None:
        q = self.catalogue.by_id(key[0])
        if q is not None:
            await self.moves.move(q.name, key[1], nodes, by)

    def drain_refusal(self) -> str | None:
        if self.replication is None:
            return "node drain: this node is not in a replication group (a single node, or shared mode)"
        if self.config.arbiter == "lockfile":
            return 'node drain: not with arbiter = "lockfile" (the lock, not the placement, decides the active)'
        return None

    def drained_changed(self) -> None:
        if self.replication is not None:
            self.replication.reconfigure()

    def ha_disabled_changed(self) -> None:
        self.drained_changed()

    def load_budget(self) -> int:
        """Bytes of messages a partition loads when this node becomes its active: its share of
        ``max_memory``, at most :data:`TAKEOVER_HEAD` (0: all, where memory is not bounded).
        The rest is a cold region, read as consumers reach it, so a takeover (a failover, a
        drain's or a move's hand-over) does not wait for a large backlog to be read."""
        share = self.catalogue.budget.share()
        return min(share, TAKEOVER_HEAD) if share else 0

    async def read_cold(self, q: Queue, pidx: int, offset: int, limit: int) -> tuple[int, list[StoredMessage]]:
        engine = self.engine

        def read() -> tuple[int, list[StoredMessage]]:
            # the end first: what it says is in the store stays there while the read runs
            end = engine.stored_end(q.meta.id, pidx)
            return end, engine.read(q.meta.id, pidx, offset, limit)

        return await asyncio.to_thread(read)

    def partition_loaded(self, key: tuple[int, int], st: PartitionState) -> None:
        """This node is now the partition's active: its messages come from the store."""
        q = self.queue_by_id(key[0])
        if q is None or key[1] >= len(q.partitions):
            return
        q.load_partition(key[1], st)
        self.delivery.schedule(q)
        # (once it serves, right after this: a partition of a queue being updated is swept)
        asyncio.get_running_loop().call_soon(self.remaps.served, key)

    # -- the quarantine (broker.partitions.quarantine) ---------------------------------------------------------

    @property
    def data_dir(self) -> Path:
        return self.data_path

    @property
    def name(self) -> str:
        return self.config.name

    def queue_name(self, queue_id: int) -> str | None:
        q = self.catalogue.by_id(queue_id)
        return q.name if q is not None else None

    def quarantine_keep(self, key: tuple[int, int], term: int, first_index: int, entries: list[list[WriteOp]],
                        confirmed: int, written: Sequence[tuple[str, int]] = ()) -> int:
        return self.quarantine.keep(key, term, first_index, entries, confirmed, written)

    async def quarantine_actives(self) -> list[str]:
        """The members serving a partition of the quarantine queue (broker.partitions.restore)."""
        if QUARANTINE not in self.queues:
            await self.catch_up_catalogue()  # (discarded on another member a moment ago?)
        q = self.queues.get(QUARANTINE)
        if q is None:
            return []
        return sorted({await self.commit.wait_active((q.meta.id, p), self.election_wait)
                       for p in range(q.meta.partitions)})

    def restore_event(self, text: str) -> None:
        """A restore run here, in ``tandem status`` events (the last RESTORE_EVENTS)."""
        self.node_events.append(NodeEvent(self.clock.time(), "restore", "-", text))
        runs = [e for e in self.node_events if e.kind == "restore"]
        if len(runs) > RESTORE_EVENTS:
            self.node_events.remove(runs[0])

    # -- re-partitioning (broker.partitions.remap) ----------------------------------------------------------

    def remap_refusal(self) -> str | None:
        return None

    def update_apply(self, op: SetUpdating) -> list[WriteOp]:
        return self.remaps.apply(op)

    def publish(self, req: PublishRequest) -> Outcome[PublishResult]:
        return self.publisher.publish(req)

    async def commit_ops(self, key: tuple[int, int], ops: list[WriteOp]) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def done(err: BaseException | None) -> None:
            if not fut.done():
                fut.set_exception(err) if err is not None else fut.set_result(None)

        self.commit.propose(ops, done, durable=True)
        await fut

    def take_back(self, q: Queue, pidx: int) -> int:
        msgs = take_back_deliveries(self.holders, q, pidx)
        if msgs:
            q.requeue(msgs)
        return len(msgs)

    def partition_event(self, key: tuple[int, int], event: str, why: str) -> None:
        if self.replication is not None:
            self.replication.partition_event(key, event, why)

    def updating_changed(self, queue_id: int) -> None:
        q = self.queue_by_id(queue_id)
        if q is not None:
            q.paused = self.remaps.paused(queue_id)
            self.delivery.schedule(q)

    def partition_unloaded(self, key: tuple[int, int]) -> None:
        """No longer the active: its messages and its deliveries are the new active's.  A
        consumer's later ack of one of them gets an unknown-tag error, never a wrong message."""
        q = self.queue_by_id(key[0])
        if q is None or key[1] >= len(q.partitions):
            return
        q.clear_partition(key[1])
        revoked = revoke_deliveries(self.holders, q, key[1])
        if revoked:
            log.warning("partition %d/%d: %d unacked deliveries revoked (the new active redelivers them)",
                        key[0], key[1], revoked)
            self.delivery.schedule(q)

    @property
    def client_address(self) -> str:
        """host:port clients reach this node at (``advertise``, else where it listens)."""
        if self.config.advertise:
            return self.config.advertise
        host, port = self.address
        return f"{host}:{port}"

    def serves(self, q: Queue, pidx: int) -> bool:
        """Whether this node holds the partition's messages (always, on a single node)."""
        if self.shared is not None:
            return self.shared.serving() and self.catalogue.by_id(q.meta.id) is q  # (not one of an earlier term)
        return self.replication is None or self.replication.serving((q.meta.id, pidx))

    def dead_letter_remote(self, src: Queue, m: Msg, dlq: Queue, headers: dict[str, str]) -> None:
        """Dead-letter ``m`` into a partition active on another member; settle it here once
        stored there, put it back if that fails."""
        req = PublishRequest(dlq.name, None, [PublishMessage(m.key, headers, m.body, None)],
                             partition=dead_letter_partition(dlq.name, dlq.mapper, dlq.meta.partitions, m.key))
        generation = src.partitions[m.partition].generation  # (loaded anew since: the store's copy is there)

        def done(fut: Outcome[PublishResult]) -> None:
            err = fut.exception()
            if err is None:
                # eager: until it commits, a failover here would deliver the message again
                # while its copy sits in the dead-letter queue
                self.write_later([Settle(src.meta.id, m.partition, [m.offset])], lazy=False)
                return
            log.error("dead-lettering %s of %s into %s failed (%s): back to the queue", m.id, src.name, dlq.name, err)
            if not src.deleted and self.serves(src, m.partition) \
                    and src.partitions[m.partition].generation == generation:
                src.requeue([m])
                self.delivery.schedule(src)

        try:
            self.publisher.publish(req).add_done_callback(done)
        except Exception as exc:
            done(Outcome.failed(exc))

    # -- partition maps (durable connections send straight to each partition's active) --------

    def partition_map(self, name: str, session: Session | None = None) -> PartitionMap:
        """Where ``name``'s partitions are active, as this node knows it; ``session`` is
        told MapChanged from now on whenever that may have changed."""
        q = self.queue(name)
        me = self.config.name
        addresses = {me: self.client_address}
        if self.replication is None:
            actives = [me] * q.meta.partitions
        else:
            rep, peers = self._group()
            actives = [rep.active_of((q.meta.id, p)) or "" for p in range(q.meta.partitions)]
            addresses.update((n, a) for n, a in peers.client_addresses.items() if a)
        if session is not None:
            self.map_watchers.add(session)
        return PartitionMap(q.info(), actives, addresses)

    def map_changed(self) -> None:
        """A partition got or lost an active: tell the watching sessions, once per loop turn."""
        self.security.maybe_seed()
        if self._map_push_scheduled or not self.map_watchers:
            return
        self._map_push_scheduled = True
        asyncio.get_running_loop().call_soon(self._push_map)

    def _push_map(self) -> None:
        self._map_push_scheduled = False
        frame = MapChanged(node=self.config.name)
        for s in list(self.map_watchers):
            s.send(frame)

    # -- queues -------------------------------------------------------------------------

    def queue(self, name: str) -> Queue:
        return self.catalogue.queue(name)

    async def declare(self, frame: Declare, owner: str | None = None) -> tuple[QueueInfo, bool]:
        return await self.catalogue.declare(frame, owner=owner)

    async def delete(self, name: str, if_empty: bool) -> None:
        await self.catalogue.delete(name, if_empty)

    async def purge(self, name: str) -> int:
        return await self.catalogue.purge(name)

    async def catch_up_catalogue(self) -> bool:
        return await self.catalogue.catch_up()

    def catalogue_commit(self) -> int:
        """How far the catalogue's log is committed here (asked of the catalogue's active)."""
        rep, _peers = self._group()
        return rep.catalogue_commit()

    def catalogue_applied(self) -> int:
        return self.replication.catalogue_applied() if self.replication is not None else 0

    async def applied(self, what: str, done: Callable[[], bool]) -> None:
        """Until ``done()`` (a committed catalogue change applied here); UnavailableError after
        the election wait."""
        rep = self.replication
        if rep is None or done():
            return
        try:
            async with self.clock.timeout(self.election_wait):
                while not done():
                    await rep.changed.wait()
        except TimeoutError:
            raise UnavailableError(f"{what}: the change is committed but not yet applied on "
                                   f"{self.config.name}: retry") from None

    async def read_stream(self, queue: str, partition: int, offset: int, max_messages: int,
                          *, hops: int = 0) -> tuple[list[StreamMessage], int, int]:
        return await read_stream(self, queue, partition, offset, max_messages, hops=hops)

    async def produced(self, queue: str, partition: int, producer: str, offset: int,
                       *, hops: int = 0) -> Produced:
        return await produced(self, queue, partition, producer, offset, hops=hops)

    # -- producers --------------------------------------------------------------------------

    async def _expire_producers(self) -> None:
        """Forget producers idle longer than ``producer_expiry`` in the partitions served here
        (a replicated op: every copy forgets them), so short-lived producer ids (a Spark task,
        a process that restarts) do not pile up for ever."""
        expiry = self.config.producer_expiry
        while not self.stopping:
            await self.clock.sleep(min(60.0, expiry / 4))
            now = self.clock.monotonic()
            for q in list(self.queues.values()):
                for pidx, part in enumerate(q.partitions):
                    if self.serves(q, pidx):
                        idle = sequences.idle_producers(part, now, expiry)
                        if idle:
                            self._drop_producers(q, pidx, idle[:1000], now)

    def _drop_producers(self, q: Queue, pidx: int, pids: list[str], decided: float) -> None:
        part = q.partitions[pidx]
        expiry = self.config.producer_expiry

        def done(err: BaseException | None) -> None:
            if err is not None:
                log.warning("expiring %d producers of %s/%d failed: %s", len(pids), q.name, pidx, err)
                return
            sequences.forget(part, pids, decided - expiry)
            log.info("forgot %d producer(s) of %s/%d idle for over %.0f s", len(pids), q.name, pidx, expiry)

        self.commit.propose([DropProducers(q.meta.id, pidx, pids)], done)

    # -- the group ---------------------------------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` as a task the node owns (broker/node/tasks.py): failures logged, ended by stop."""
        self._spawned.spawn(coro)

    @property
    def election_wait(self) -> float:
        """How long a request waits for a partition to get an active."""
        return max(5.0, 4 * self.config.non_response_timeout)

    def _group(self, why: str = "") -> tuple[Replication, PeerManager]:
        """This node's replication and peer links (a group member has both)."""
        if self.replication is None or self.peers is None:
            raise InvalidArgumentError(f"this node is not in a replication group{': ' + why if why else ''}")
        return self.replication, self.peers

    async def forward(self, who: str, request: ForwardRequest) -> bytes:
        """Ask member ``who`` to do ``request``; its reply, or the error it raised."""
        _rep, peers = self._group()
        return await peers.forward(who, request)

    async def handle_forward(self, kind: int, payload: bytes) -> bytes:
        """A request another member forwarded here because this node is active for it."""
        return await self.forwarded.handle(kind, payload)


def _node_stamp(data_dir: Path, now: float) -> str:
    """Shared mode: this node's own stamp (the store is the group's), kept in its data dir."""
    path = data_dir / "node-stamp"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        stamp = f"{int(now * 1000):x}-{secrets.token_hex(4)}"
        path.write_text(stamp + "\n")
        return stamp
