"""A Tandem node: its store, its queues, its client listener, its lifecycle.

The node wires its parts together and owns their lifetimes; each part takes the narrow
interface it needs (a typing Protocol), never the whole node:

* :mod:`broker.sessions`: one client connection (``session``), its requests' handlers by audience;
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
import secrets
from pathlib import Path
from collections.abc import Callable, Collection, Coroutine
from typing import Any, Protocol

from broker.security import tls
from broker.messaging.catalogue import Catalogue
from broker.messaging.commit import CommitPath, ReplicatedCommitPath
from broker.config import NodeConfig, redact_url
from broker.partitions.compensation import check_compensation
from broker.messaging.delivery import Delivery
from broker.node.diskalarm import FULL_BELOW, DiskAlarm, free_bytes, full_disk_error, start_error
from broker.messaging.forward import ForwardRequest
from broker.node.forwarded import ForwardHandlers
from broker.arbiters.lockfile import LockFileDriver
from broker.peers.links import host_port
from broker.peers.peers import PeerManager
from broker.security.secret import decoy_key, group_secret
from broker.messaging.publish import Publisher
from broker.messaging.mapper import MAPPERS, mapper_names
from broker.messaging.queues import MemoryBudget, Queue, Recipient
from broker.modes.replicated import Replication
from broker.sessions.admin import Admin
from broker.sessions.messaging import Messaging
from broker.sessions.session import Session, SessionParts, requests
from broker.modes.shared.mode import SharedMode
from broker.sessions.maps import PartitionMaps
from broker.sessions.status import HaReport, NodeEvent, StatusRequests
from broker.sessions.users import UserRequests
from broker.node import recovery
from broker.node.shared import SharedNode, check_admin_password, close_sessions, node_stamp, seed_admin
from broker.node.holding import Holding
from broker.node.options import RuntimeOptions
from broker.node.placement import PLACEMENT_KEY, GroupPlacement
from broker.node.store import NodeStore
from broker.node.tasks import Loops, TaskOwner
from broker.messaging.expiry import ProducerExpiry
from broker.security.auth import ClientGuard, oldest_waiting
from broker.security.acl import AclTable
from broker.peers.discovery import Discovery
from broker.partitions.drain import Drains
from broker.partitions.members import GroupMembers
from broker.partitions.moves import Moves
from broker.partitions.quarantine import Quarantine
from broker.partitions.remap import Remaps
from broker.partitions.restore_run import Restores
from broker.security.security import Security
from broker.security.users import UserRegistry
from client.clock import SYSTEM_CLOCK, Clock
from client.errors import InvalidArgumentError, NotActiveError, ShuttingDownError, \
    TandemError, UnavailableError
from ha.membership import QuorumState
from storage.base import Engine, Recovered, WriteOp
from storage.shared import SharedStore
from storage.shared_factory import open_shared
from storage.sqlite import SqliteEngine
from storage.writer import Callback, GroupCommitWriter

log = logging.getLogger("tandem.broker")

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
        self.sessions: set[Session] = set()
        #: peer addresses found by discovery for members that had none here
        self.learned: dict[str, tuple[str, int]] = {}
        #: the group's placement, members and catalogued state (broker/node/placement.py)
        self.placing = GroupPlacement(
            lambda: self.config, clock, group=lambda: self.group, replication=lambda: self.replication,
            peers=lambda: self.peers, priority=lambda: self.priority, refusal=self.refusal,
            map_changed=self.map_changed, sessions=self.sessions, learned=self.learned)
        self.catalogue = Catalogue(self, placing=self.placing)
        self.users = UserRegistry([])
        self.guard = ClientGuard(config, clock)  # failed-login throttle, per-user connections, limits
        self.acls = AclTable()
        #: the operator settings it applies at runtime (broker/node/options.py)
        self.options = RuntimeOptions(lambda: self.config, acls=self.acls, group=lambda: self.group,
                                      replication=lambda: self.replication, peers=lambda: self.peers)
        #: what this node has to say of itself in ``tandem status`` events (an unclean stop)
        self.node_events: list[NodeEvent] = []
        #: where the queues' partitions are active, and the sessions told when that changes
        self.maps = PartitionMaps(lambda: self.config, queue=self.queue, client_address=lambda: self.client_address,
                                  replication=lambda: self.replication, peers=lambda: self.peers,
                                  has_quorum=lambda: self.has_quorum, acls=self.acls,
                                  changed=lambda: self.security.maybe_seed())
        #: the partitions this node serves, their deliveries, its users (broker/node/holding.py)
        self.holding = Holding(self, clock, catalogue=self.catalogue, data_dir=lambda: self.data_path,
                               replication=lambda: self.replication, shared=lambda: self.shared,
                               has_quorum=lambda: self.has_quorum, map_changed=self.maps.map_changed,
                               failed=self._replication_failed, spawn=self.spawn, sessions=self.sessions,
                               users=self.users, acls=self.acls, guard=self.guard, events=self.node_events)
        self.delivery = Delivery(self.holding, rules=self.holding, tasks=self.holding)
        self.publisher = Publisher(self)
        self.security: Security = Security(self, accounts=self.holding, spawn=self.spawn)
        self.drains = Drains(self, group=self.placing)  # the group's members drained for maintenance
        #: partitions placed off the policy (tandem partition move)
        self.moves = Moves(self, placement=self.placing, spawn=self.spawn)
        #: queues re-mapping their messages (tandem partition update)
        self.remaps = Remaps(self, queues=self.placing, here=self.holding, publisher=self.publisher)
        self.quarantine = Quarantine(self.holding)  # what HA-1014 discards, kept (tandem restore)
        #: merging it back, run in the group (admin API, console)
        self.restores = Restores(self.holding, group=self.holding, delivery=self.delivery, publisher=self.publisher)
        founding, _policy = config.placement()
        #: the group's members (tandem group add / remove); the settings' until the first change
        self.group: GroupMembers = GroupMembers(
            self, placement=self.placing, moves=self.moves, founding=tuple(founding),
            zones={n: z for n, z in config.zone_map().items() if n in founding})
        self.store_stamp = ""
        #: shared mode: the group's database, opened by this node only while it holds the lock
        self._shared_store: SharedStore | None = open_shared(config.database) \
            if config.mode == "shared" and config.database else None
        self.shared: SharedMode | None = None
        #: the engine, its writer and the commit path in use (broker/node/store.py)
        self.store = NodeStore(config, clock, self._shared_store.engine() if self._shared_store is not None
                               else engine(config), shared=self._shared_store is not None)
        self.shared_node: SharedNode | None = None
        self._server: asyncio.Server | None = None
        self.forwarded = ForwardHandlers(self, state=self, options=self.options, report=self, changes=self.placing, streams=self,
                                         publisher=self.publisher, security=self.security, drains=self.drains,
                                         moves=self.moves, remaps=self.remaps, restores=self.restores,
                                         book=self.placing.member_book)
        #: what each client session is handed (broker.sessions): the parts its shell calls, the request handlers
        self.session_parts = SessionParts(self, self.guard, self.security, self.delivery, requests(
            Messaging(self, streams=self, delivery=self.delivery, publisher=self.publisher),
            Admin(self.options, report=self, changes=self.placing, drains=self.drains, moves=self.moves, remaps=self.remaps),
            UserRequests(self, self.security), StatusRequests(report=self, changes=self.placing, maps=self.maps)))
        self.peers: PeerManager | None = None
        self._peer_secret: bytes | None = None  # the group secret (broker.security.secret), read at start
        self.replication: Replication | None = None
        #: the HA arbiter's driver (shared mode, LockFile), for status, console and metrics
        self.ha: HaReport | None = None
        self._lockfile: LockFileDriver | None = None  # arbiter = "lockfile"
        #: seeds and the gossip of member addresses (replicated mode)
        self.discovery: Discovery | None = None
        #: one look at a producer's messages (broker.messaging.streams.produced) at a time: each reads a
        #: partition's store, and a client asking many at once waits for each in turn
        self.scans = asyncio.Semaphore(1)
        self.stopping = False
        self.stopped = asyncio.Event()
        self._spawned = TaskOwner(f"node {config.name}")  # broker/node/tasks.py: ended by stop()
        self._console_factory = console
        self.console: Console | None = None
        #: the disk alarm (broker/node/diskalarm.py): None in shared mode (the data is in the
        #: group's database) and with disk_free_limit = 0
        self.disk_alarm: DiskAlarm | None = None
        #: the long-running loops: peers, discovery, replication, lockfile, disk alarm (broker/node/tasks.py)
        self.loops = Loops()
        self.confirms = 0  # messages confirmed to publishers (metrics)
        self.producer_expiry = ProducerExpiry(lambda: self.catalogue.queues, self.holding.serves, lambda: self.commit,
                                              clock, config.producer_expiry)
        self.address: tuple[str, int] = (config.host, config.port)
        self.data_path: Path = config.data_dir
        self.placing.bind(catalogue=self.catalogue, moves=self.moves, drains=self.drains, remaps=self.remaps,
                          security=self.security, delivery=self.delivery, store=self.store)
        self.holding.bind(delivery=self.delivery, publisher=self.publisher, remaps=self.remaps, store=self.store)

    @property
    def queues(self) -> dict[str, Queue]:
        return self.catalogue.queues

    @property
    def memory(self) -> MemoryBudget:
        """Ready messages held in memory against ``max_memory`` (broker.messaging.queues)."""
        return self.catalogue.budget

    @property
    def holders(self) -> Collection[Recipient]:
        return self.holding.holders

    @property
    def has_quorum(self) -> bool:
        """False while this group member has no node quorum (its partitions are Unavailable);
        in shared mode, while it does not hold the lock."""
        if self.shared is not None:
            return self.shared.serving()
        return self.peers is None or self.peers.membership.quorum_state is not QuorumState.DISABLED

    @property
    def priority(self) -> int:
        return self.options.priority

    @property
    def commit(self) -> CommitPath:
        return self.store.commit

    @property
    def engine(self) -> Engine:
        return self.store.engine

    @property
    def commit_observers(self) -> list[Callable[[float, bool], None]]:
        """Called on the writer thread with each commit's duration and sync flag (metrics)."""
        return self.store.commit_observers

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        cfg = self.config
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
            await self.loops.stop("tandem-disk-alarm", failed_too=True)
            await self._spawned.close()
            try:
                await self._stop_peers()
                await self.store.close()
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
        recovered = await self.store.open_engine()
        event = recovery.unclean_stop(cfg, self.clock.time()) if recovered.unclean_stop else None
        if event is not None:
            self.node_events.append(event)
        self._load(recovered, messages=cfg.peer_port is None)
        if "store_stamp" not in recovered.meta:
            self.store_stamp = f"{int(self.clock.time() * 1000):x}-{secrets.token_hex(4)}"
            await asyncio.to_thread(self.engine.set_meta, "store_stamp", self.store_stamp)
        else:
            self.store_stamp = recovered.meta["store_stamp"]
        if cfg.peer_port is not None and self.placing.joining() and not cfg.peers:
            cfg = await self._find_group()
        if cfg.peer_port is not None:
            await self.placing.check_placement(recovered.meta.get(PLACEMENT_KEY))
        await seed_admin(self.users, self.store, cfg.data_dir)
        server = await self._bind_clients()
        if cfg.peer_port is not None:
            self.peers = PeerManager(self, secret=self._peer_secret)
            self.discovery = Discovery(self.placing, self.peers)
            self.peers.on_addresses = self.discovery.heard
            if self.group.changed():
                self.peers.set_members(self.placing.member_addresses(), self.placing.placement_text())
            self.replication = Replication(
                cfg, self.clock, engine=self.engine, writer=self.writer, peers=self.peers, queues=self.catalogue,
                moves=self.moves, security=self.security, drains=self.drains, remaps=self.remaps,
                respread=self.group, state=self.placing, placement=self.placing, quarantine=self.quarantine, node=self.holding,
                logs=recovered.logs, meta=recovered.meta)
            self.store.commit = ReplicatedCommitPath(self.replication)
            if cfg.arbiter == "lockfile":  # before the logs open: they stand for nothing until it says so
                self._lockfile = LockFileDriver(cfg, self.clock, self.replication, self.peers)
                self.ha = self._lockfile
            self.replication.start()
            await self.peers.start()
            self.loops.start("tandem-peers", self.peers.run())
            self.loops.start("tandem-discovery", self.discovery.run())
            self.loops.start("tandem-replication", self.replication.run())
            if self._lockfile is not None:
                self.loops.start("tandem-lockfile", self._lockfile.run())
        await server.start_serving()
        if self.disk_alarm is not None:
            self.loops.start("tandem-disk-alarm", self.disk_alarm.run())
        self._spawned.spawn(self.producer_expiry.run(), "tandem-producer-expiry")
        await self._start_console()

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
        check_admin_password()
        self.store_stamp = await asyncio.to_thread(node_stamp, cfg.data_dir, self.clock.time())
        lease = await asyncio.to_thread(store.lease)
        self.shared_node = host = SharedNode(
            cfg, self.clock, store, self.store, catalogue=self.catalogue, users=self.users, acls=self.acls,
            delivery=self.delivery, remaps=self.remaps, sessions=self.sessions, restore=self._load,
            started=lambda: self._spawned.spawn(self.producer_expiry.run(), "tandem-producer-expiry"),
            stopped=self._spawned.cancel_all, map_changed=self.map_changed, client_address=lambda: self.client_address)
        self.shared = host.mode = SharedMode(host, lease, name=cfg.name, lease_seconds=cfg.lease, lock=cfg.lock,
                                             clock=self.clock)
        self.ha = self.shared
        server = await self._bind_clients()
        if cfg.peer_port is not None:
            self.peers = PeerManager(self, secret=self._peer_secret)
            await self.peers.start()
            self.loops.start("tandem-peers", self.peers.run())
        await server.start_serving()
        self.shared.start()
        await self._start_console()
        log.info("shared mode: %s is PASSIVE until it holds the lock (database %s, lock %s, lease %.2f s)",
                 cfg.name, redact_url(cfg.database or ""), cfg.lock, cfg.lease)

    def _load(self, rec: Recovered, *, messages: bool = True) -> None:
        recovery.load(rec, catalogue=self.catalogue, users=self.users, acls=self.acls, security=self.security,
                      drains=self.drains, moves=self.moves, remaps=self.remaps, group=self.group, messages=messages)

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
            await close_sessions(self.sessions, ShuttingDownError(f"node {self.config.name} is shutting down"))
            await self._spawned.close()  # (before the store closes: they may write)
            await self.store.close()
            await self.shared.release()
        if self.console is not None:
            await self.console.stop()
        await self.loops.stop("tandem-disk-alarm", failed_too=True)
        if self._server is not None:
            self._server.close()
        await close_sessions(self.sessions, ShuttingDownError(f"node {self.config.name} is shutting down"))
        if self._server is not None:
            await self._server.wait_closed()
        await self._spawned.close()  # the sessions' work done: before the links and the store go
        if self.replication is not None:
            # the acks still waiting for a partition's next entry: out while the links are up
            await self.replication.flush_lazy(timeout=self.config.non_response_timeout)
        await self._stop_peers()
        try:
            await self.store.close()
        except (OSError, TandemError) as exc:  # a failing disk: the node stops all the same
            log.error("closing the store failed: %s", exc)
        log.info("node stop complete name=%s", self.config.name)
        self.stopped.set()

    async def _stop_peers(self) -> None:
        await self.loops.stop("tandem-lockfile", failed_too=True)
        if self._lockfile is not None:
            await self._lockfile.stop()  # the lock released: the peer may take over at once
        await self.loops.stop("tandem-replication")
        if self.replication is not None:
            self.replication.stop()
        await self.loops.stop("tandem-discovery")
        await self.loops.stop("tandem-peers")
        if self.peers is not None:
            await self.peers.stop()

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
        session = Session(self.session_parts, reader, writer)
        self.sessions.add(session)
        try:
            await session.run()
        finally:
            self.sessions.discard(session)
            self.maps.forget(session)
            self.delivery.release(session)

    def refusal(self) -> NotActiveError | None:
        """Why this node serves no client now: a shared-mode node without the lock (or still
        loading the queues) names the active; None when it serves."""
        if self.replication is not None and self.config.name not in self.group.members:
            return NotActiveError(f"node {self.config.name} is no longer a member of its group (tandem group "
                                  f"remove): connect to another member")
        if self.shared is None or (self.store.open and self.shared.serving()):
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
        return self.store.writer

    def write(self, ops: list[WriteOp], *, sync: bool) -> asyncio.Future[None]:
        return self.store.write(ops, sync=sync)

    def write_later(self, ops: list[WriteOp], callback: Callback | None = None, *, lazy: bool = True) -> None:
        self.store.write_later(ops, callback, lazy=lazy)

    # -- what the replication driver tells the node ---------------------------------------

    def _replication_failed(self) -> None:
        """Replication's state may be inconsistent: stop, as a task this node owns (not one of
        the replication's, which its stop cancels)."""
        if not self.stopping:
            self._spawned.spawn(self.stop(), "tandem-stop")

    async def _find_group(self) -> NodeConfig:
        """A node that joins by seeds alone: ask them until one answers, then start as if the
        members it named were this node's ``peers``."""
        seeker = PeerManager(self, secret=self._peer_secret)
        found = await Discovery(self.placing, seeker).find_group()
        self.learned.update(found)
        self.config = cfg = dataclasses.replace(
            self.config, peers=tuple(f"{n}={host_port(h, p)}" for n, (h, p) in sorted(found.items())))
        founding, _policy = cfg.placement()
        self.group = GroupMembers(self, placement=self.placing, moves=self.moves, founding=tuple(founding),
                                  zones={n: z for n, z in cfg.zone_map().items() if n in founding})
        log.warning("joining the group its seeds belong to: members %s", ", ".join(sorted(found)))
        return cfg

    def ha_disabled_changed(self) -> None:
        self.placing.drained_changed()

    def map_changed(self) -> None:
        self.maps.map_changed()

    @property
    def client_address(self) -> str:
        """host:port clients reach this node at (``advertise``, else where it listens)."""
        if self.config.advertise:
            return self.config.advertise
        host, port = self.address
        return f"{host}:{port}"

    def serves(self, q: Queue, pidx: int) -> bool:
        return self.holding.serves(q, pidx)

    # -- queues -------------------------------------------------------------------------

    def queue(self, name: str) -> Queue:
        return self.catalogue.queue(name)

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
