"""A Tandem node: its parts made and wired together, started and stopped.

Each part takes the narrow interface it needs (a typing Protocol), never the node: the store,
the catalogue and message path (:mod:`broker.messaging`), the client sessions, the group's
operations (:mod:`broker.partitions`, :mod:`broker.transactions`), the HA mode and the peer links.
What the subsystems ask of the node is answered by :class:`~broker.node.services.Services`; the
console and the operator tools are built on top, at the entry point (``broker.cli``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable

from broker.security import tls
from broker.messaging.catalogue import Catalogue
from broker.messaging.commit import ReplicatedCommitPath
from broker.config import NodeConfig, redact_url
from broker.partitions.compensation import check_compensation
from broker.messaging.delivery import Delivery
from broker.node.diskalarm import start_error
from broker.node.forwarded import ForwardHandlers
from broker.arbiters.lockfile import LockFileDriver
from broker.peers.links import host_port
from broker.peers.peers import PeerManager
from broker.peers.transport import TCP, PeerTransport
from broker.security.secret import decoy_key, group_secret
from broker.messaging.publish import Publisher
from broker.messaging.routed import Router
from broker.messaging.timing import QueueTimes
from broker.messaging.mapper import MAPPERS, mapper_names
from broker.modes.replicated import Replication
from broker.sessions.admin import Admin
from broker.sessions.messaging import Messaging
from broker.sessions.session import Session, SessionParts, requests
from broker.modes.shared.mode import SharedMode
from broker.sessions.maps import PartitionMaps
from broker.sessions.relay import Relays
from broker.sessions.relayed import Relayed
from broker.sessions.status import StatusRequests
from broker.sessions.transactions import TransactionRequests
from broker.sessions.users import UserRequests
from broker.node import recovery
from broker.node.shared import SharedNode, check_admin_password, close_sessions, node_stamp, seed_admin
from broker.node.holding import Holding
from broker.node.options import RuntimeOptions
from broker.node.placement import PLACEMENT_KEY, GroupPlacement
from broker.node.parts import Console, HaParts, PartitionOps, PeerSide, Report
from broker.node.services import Services
from broker.node.store import EngineFactory, NodeStore, sqlite_engine
from broker.node.listeners import Listeners
from broker.node.tasks import Loops, TaskOwner, to_the_end
from broker.messaging.expiry import ProducerExpiry
from broker.security.auth import ClientGuard, make_room
from broker.security.acl import AclTable
from broker.peers.discovery import Discovery
from broker.partitions.members import GroupMembers
from broker.security.security import Security
from broker.security.users import UserRegistry
from client.clock import SYSTEM_CLOCK, Clock
from client.errors import ShuttingDownError
from storage.base import Recovered
from storage.shared import SharedStore
from storage.shared_factory import open_shared

log = logging.getLogger("tandem.broker")

ConsoleFactory = Callable[["Node"], Console]


class Node:
    """A node: its parts made and wired in ``__init__``, started by :meth:`start`, ended by :meth:`stop`."""

    def __init__(self, config: NodeConfig, *, clock: Clock = SYSTEM_CLOCK,
                 engine: EngineFactory = sqlite_engine, console: ConsoleFactory | None = None,
                 transport: PeerTransport = TCP) -> None:
        self.config = config
        check_compensation(config)
        self.clock, self._transport = clock, transport  # (the peer links': broker/peers/transport.py)
        self.sessions: set[Session] = set()
        self.stopping, self.stopped = False, asyncio.Event()
        self.address: tuple[str, int] = (config.host, config.port)
        self.console: Console | None = None
        self._console_factory = console
        self._spawned = TaskOwner(f"node {config.name}")  # broker/node/tasks.py: ended by stop()
        #: the long-running loops: peers, discovery, replication, lockfile, disk alarm (broker/node/tasks.py)
        self._loops = Loops()
        #: shared mode: the group's database, opened by this node only while it holds the lock
        self._shared_store: SharedStore | None = open_shared(config.database) \
            if config.mode == "shared" and config.database else None
        self._shared_node: SharedNode | None = None
        self._listeners = Listeners()  # the client ports (broker/node/listeners.py)
        self._peer_secret: bytes | None = None  # the group secret (broker.security.secret), read at start
        self._lockfile: LockFileDriver | None = None  # arbiter = "lockfile"
        #: the engine, its writer and the commit path in use (broker/node/store.py)
        self.store = NodeStore(config, clock, self._shared_store.engine() if self._shared_store is not None
                               else engine(config), shared=self._shared_store is not None)
        self.store.on_damage = lambda _why: self._replication_failed()
        #: peer links, replication, shared mode, the arbiter: made at start (broker/node/parts.py)
        self.ha = HaParts()
        users, acls = UserRegistry([]), AclTable()
        self.guard = ClientGuard(config, clock)  # failed-login throttle, per-user connections, limits
        #: what the subsystems call on the node (broker/node/services.py)
        self.services = svc = Services(lambda: self.config, clock, store=self.store, users=users, acls=acls,
                                       ha=self.ha, group=lambda: self.ops.group, sessions=self.sessions,
                                       tasks=self._spawned, stopping=lambda: self.stopping,
                                       client_address=lambda: self.client_address)
        #: the operator settings it applies at runtime (broker/node/options.py)
        self.options = RuntimeOptions(lambda: self.config, acls=acls, group=lambda: self.ops.group,
                                      replication=lambda: self.ha.replication, peers=lambda: self.ha.peers)
        #: the node about itself, for status and console (broker/node/parts.py)
        self.report = Report(lambda: self.config, self.store, self.ha, self.options, lambda: self.console)
        #: the group's placement, members and catalogued state (broker/node/placement.py)
        self.placing = GroupPlacement(
            lambda: self.config, clock, group=lambda: self.ops.group, replication=lambda: self.ha.replication,
            peers=lambda: self.ha.peers, priority=lambda: self.options.priority, refusal=svc.refusal,
            map_changed=lambda: self.maps.map_changed(), sessions=self.sessions, learned={})
        self.catalogue = Catalogue(svc, placing=self.placing)
        svc.bind(catalogue=self.catalogue)
        #: where the queues' partitions are active, and the sessions told when that changes
        self.maps = PartitionMaps(lambda: self.config, queue=svc.queue, client_address=lambda: self.client_address,
                                  replication=lambda: self.ha.replication, peers=lambda: self.ha.peers,
                                  has_quorum=lambda: svc.has_quorum, acls=acls,
                                  changed=lambda: self.security.maybe_seed())
        #: the partitions this node serves, their deliveries, its users (broker/node/holding.py)
        self.holding = Holding(svc, clock, catalogue=self.catalogue, data_dir=lambda: self.store.data_path,
                               replication=lambda: self.ha.replication, shared=lambda: self.ha.shared,
                               has_quorum=lambda: svc.has_quorum, map_changed=self.maps.map_changed,
                               failed=self._replication_failed, spawn=svc.spawn, sessions=self.sessions,
                               users=users, acls=acls, guard=self.guard, events=self.report.node_events)
        self.delivery = Delivery(self.holding, rules=self.holding, tasks=self.holding)
        svc.bind(holding=self.holding, delivery=self.delivery)
        self.publisher = Publisher(svc)
        self.security: Security = Security(svc, accounts=self.holding, spawn=svc.spawn)
        #: the group's operations on members and partitions (broker/node/parts.py)
        self.ops = ops = PartitionOps.made(svc, config, self.placing, self.holding, self.publisher, self.delivery)
        self._router = Router(svc, self.publisher, lambda: ops.topology.table)  # publishes to exchanges
        #: consuming from any node: this node's sessions' relays, and other members' held here
        self.relays = Relays(svc, Relayed(svc, self.delivery, holders=self.holding.local_holders, ask=svc.ask,
                                          hold_acks=ops.transactions.participants.hold_acks), svc.ask)
        self._forwarded = ForwardHandlers(svc, state=svc, options=self.options, report=self.report,
                                          changes=self.placing, streams=svc, publisher=self.publisher,
                                          security=self.security, ops=ops, router=self._router, relays=self.relays,
                                          book=self.placing.member_book)
        #: what each client session is handed (broker.sessions): the parts its shell calls, the request handlers
        self._session_parts = SessionParts(svc, self.guard, self.security, self.delivery, requests(
            Messaging(svc, streams=svc, delivery=self.delivery, publisher=self.publisher, relays=self.relays,
                      router=self._router, topology=ops.topology, transactions=ops.transactions),
            Admin(self.options, report=self.report, changes=self.placing, drains=ops.drains, moves=ops.moves,
                  remaps=ops.remaps, levels=ops.levels),
            UserRequests(svc, self.security), TransactionRequests(svc, ops.transactions),
            StatusRequests(report=self.report, changes=self.placing, maps=self.maps)))
        self._peer_side = PeerSide(lambda: self.config, clock, self.store, self.ha, catalogue=self.catalogue,
                                   delivery=self.delivery, client_address=lambda: self.client_address,
                                   handle_forward=self._forwarded.handle, link_lost=self.relays.link_lost,
                                   map_changed=self.maps.map_changed,
                                   ha_disabled_changed=self.placing.drained_changed)
        #: loops over time: idle producers forgotten, delayed messages due, expired ones gone, streams trimmed
        self._timers = (ProducerExpiry(lambda: self.catalogue.queues, self.holding.serves, lambda: self.store.commit,
                                       clock, config.producer_expiry),
                        QueueTimes(lambda: self.catalogue.queues.values(), self.delivery, clock), *ops.timers())
        self.placing.bind(catalogue=self.catalogue, moves=ops.moves, drains=ops.drains, remaps=ops.remaps,
                          levels=ops.levels, security=self.security, delivery=self.delivery, store=self.store,
                          topology=ops.topology)
        self.holding.bind(delivery=self.delivery, publisher=self.publisher, remaps=ops.remaps, store=self.store,
                          topology=ops.topology)

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
            await self._loops.stop("tandem-disk-alarm", failed_too=True)
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
        total = sum(q.depth for q in self.catalogue.queues.values())
        log.info(
            "node start complete name=%s url=%s://%s:%d data_dir=%s sync=%s queues=%d messages=%d",
            cfg.name, "tandems" if cfg.tls_cert is not None else "tandem", self.address[0], self.address[1],
            self.store.data_path, cfg.sync.value, len(self.catalogue.queues), total,
        )
        if self.ha.replication is not None:
            self.ops.quarantine.drain()  # (what a stop kept from reaching the quarantine queue)
        else:
            self.ops.remaps.start()  # (every partition is served here from the start)

    async def _start(self) -> None:
        cfg = self.config
        await asyncio.to_thread(tls.check, cfg)  # a bad certificate or key stops the start, named
        if cfg.peer_port is not None:  # before anything is made: a member without a secret does not start
            self._peer_secret = await asyncio.to_thread(group_secret, cfg)
        await asyncio.to_thread(cfg.data_dir.mkdir, parents=True, exist_ok=True)
        self.store.data_path = await asyncio.to_thread(cfg.data_dir.resolve)
        self.services.users.decoy_key = await asyncio.to_thread(decoy_key, self._peer_secret, self.store.data_path)
        if self._shared_store is not None:
            await self._start_shared(self._shared_store)
            return
        await self.store.check_free()
        recovered = await self.store.open_engine()
        event = recovery.unclean_stop(cfg, self.clock.time()) if recovered.unclean_stop else None
        if event is not None:
            self.report.node_events.append(event)
        self._load(recovered, messages=cfg.peer_port is None)
        await self.store.load_stamp(recovered.meta)
        if cfg.peer_port is not None and self.placing.joining() and not cfg.peers:
            cfg = await self._find_group()
        if cfg.peer_port is not None:
            await self.placing.check_placement(recovered.meta.get(PLACEMENT_KEY))
        await seed_admin(self.services.users, self.store, cfg.data_dir)
        await self._bind_clients()
        if cfg.peer_port is not None:
            ha, ops = self.ha, self.ops
            peers = ha.peers = PeerManager(self._peer_side, secret=self._peer_secret, transport=self._transport)
            peers.builds.level = ops.levels.level  # (what its links' hellos say of the group)
            discovery = ha.discovery = Discovery(self.placing, peers)
            peers.on_addresses = discovery.heard
            if ops.group.changed():
                peers.set_members(self.placing.member_addresses(), self.placing.placement_text())
            rep = ha.replication = Replication(
                cfg, self.clock, engine=self.store.engine, writer=self.store.writer, peers=peers, queues=self.catalogue,
                moves=ops.moves, security=self.security, drains=ops.drains, remaps=ops.remaps, respread=ops.group,
                state=self.placing, placement=self.placing, quarantine=ops.quarantine, node=self.holding,
                logs=recovered.logs, meta=recovered.meta)
            self.store.commit = ReplicatedCommitPath(rep)
            if cfg.arbiter == "lockfile":  # before the logs open: they stand for nothing until it says so
                self._lockfile = ha.arbiter = LockFileDriver(cfg, self.clock, rep, peers)
            damaged = recovery.log_damaged(recovered, self.clock.time())  # (before the logs take recovered.logs)
            rep.start()
            if damaged is not None:
                recovery.set_aside_log(self.store.engine)  # (once the logs opened: a refused start leaves it)
                self.report.node_events.append(damaged)
            await peers.start()
            self._loops.start("tandem-peers", peers.run())
            self._loops.start("tandem-discovery", discovery.run())
            self._loops.start("tandem-replication", rep.run())
            if self._lockfile is not None:
                self._loops.start("tandem-lockfile", self._lockfile.run())
        await self._listeners.serve()
        if self.store.disk_alarm is not None:
            self._loops.start("tandem-disk-alarm", self.store.disk_alarm.run())
        for timer in self._timers:
            self._spawned.spawn(timer.run(), f"tandem-{type(timer).__name__}")
        await self._start_console()

    async def _bind_clients(self) -> None:
        """Bind the client ports now (peers learn the address in the handshake); serving
        starts once everything is set up."""
        self.address = await self._listeners.bind(self.config, self._on_client)

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
        self.store.stamp = await asyncio.to_thread(node_stamp, cfg.data_dir, self.clock.time())
        lease = await asyncio.to_thread(store.lease)
        svc, tasks = self.services, self._spawned
        self._shared_node = host = SharedNode(
            cfg, self.clock, store, self.store, catalogue=self.catalogue, users=svc.users, acls=svc.acls,
            delivery=self.delivery, remaps=self.ops.remaps, sessions=self.sessions, restore=self._load,
            started=lambda: [tasks.spawn(t.run(), f"tandem-{type(t).__name__}") for t in self._timers],
            stopped=tasks.cancel_all, map_changed=self.maps.map_changed, client_address=lambda: self.client_address)
        shared = self.ha.shared = self.ha.arbiter = host.mode = SharedMode(
            host, lease, name=cfg.name, lease_seconds=cfg.lease, lock=cfg.lock, clock=self.clock)
        await self._bind_clients()
        if cfg.peer_port is not None:
            peers = self.ha.peers = PeerManager(self._peer_side, secret=self._peer_secret, transport=self._transport)
            await peers.start()
            self._loops.start("tandem-peers", peers.run())
        await self._listeners.serve()
        shared.start()
        await self._start_console()
        log.info("shared mode: %s is PASSIVE until it holds the lock (database %s, lock %s, lease %.2f s)",
                 cfg.name, redact_url(cfg.database or ""), cfg.lock, cfg.lease)

    def _load(self, rec: Recovered, *, messages: bool = True) -> None:
        ops = self.ops
        recovery.load(rec, catalogue=self.catalogue, users=self.services.users, acls=self.services.acls,
                      security=self.security, drains=ops.drains, moves=ops.moves, remaps=ops.remaps, group=ops.group,
                      levels=ops.levels, topology=ops.topology, messages=messages)

    async def stop(self) -> bool:
        """Stop accepting, close sessions, commit what is pending, close the store; whether
        every step finished (one that fails is logged, and the node stops all the same)."""
        if self.stopping:
            await self.stopped.wait()
            return True
        self.stopping = True
        log.info("node stop started name=%s sessions=%d", self.config.name, len(self.sessions))
        return await to_the_end(self._stop(), self.stopped, f"node stop of {self.config.name}")

    async def _stop(self) -> None:
        if self.ha.shared is not None:
            # the lock loop first, then the sessions (their last acks commit), then the lock
            # goes: the peer takes over at once rather than after the lease
            await self.ha.shared.halt()
            await close_sessions(self.sessions, ShuttingDownError(f"node {self.config.name} is shutting down"))
            await self._spawned.close()  # (before the store closes: they may write)
            await self.store.close()
            await self.ha.shared.release()
        if self.console is not None:
            await self.console.stop()
        await self._loops.stop("tandem-disk-alarm", failed_too=True)
        self._listeners.close()
        await close_sessions(self.sessions, ShuttingDownError(f"node {self.config.name} is shutting down"))
        await self._listeners.wait_closed()
        await self._spawned.close()  # the sessions' work done: before the links and the store go
        if self.ha.replication is not None:
            # the acks still waiting for a partition's next entry: out while the links are up
            await self.ha.replication.flush_lazy(timeout=self.config.non_response_timeout)
        await self._stop_peers()
        await self.store.close()
        log.info("node stop complete name=%s", self.config.name)

    async def _stop_peers(self) -> None:
        await self._loops.stop("tandem-lockfile", failed_too=True)
        if self._lockfile is not None:
            await self._lockfile.stop()  # the lock released: the peer may take over at once
        await self._loops.stop("tandem-replication")
        if self.ha.replication is not None:
            self.ha.replication.stop()
        await self._loops.stop("tandem-discovery")
        await self._loops.stop("tandem-peers")
        if self.ha.peers is not None:
            await self.ha.peers.stop()

    async def _on_client(self, kind: type[Session], reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.stopping:
            Session.refuse(writer, ShuttingDownError("node is shutting down"))
            return
        full = make_room(self.sessions, self.config.max_connections)
        if full is not None:
            Session.refuse(writer, full)
            return
        session = kind(self._session_parts, reader, writer)
        self.sessions.add(session)
        try:
            await session.run()
        finally:
            self.sessions.discard(session)
            self.maps.forget(session)
            self.relays.release(session)
            self.delivery.release(session)
            self.ops.transactions.ended(session.txs)

    # -- what the replication driver tells the node ---------------------------------------

    def _replication_failed(self) -> None:
        """Replication's state may be inconsistent, or the store's file is damaged: stop, as a
        task this node owns (not one of the replication's, which its stop cancels)."""
        if not self.stopping:
            self._spawned.spawn(self.stop(), "tandem-stop")

    async def _find_group(self) -> NodeConfig:
        """A node that joins by seeds alone: ask them until one answers, then start as if the
        members it named were this node's ``peers``."""
        seeker = PeerManager(self._peer_side, secret=self._peer_secret, transport=self._transport)
        found = await Discovery(self.placing, seeker).find_group()
        self.placing.learned.update(found)
        self.config = cfg = dataclasses.replace(
            self.config, peers=tuple(f"{n}={host_port(h, p)}" for n, (h, p) in sorted(found.items())))
        self.ops.group = GroupMembers.founded(self.services, self.placing, self.ops.moves, cfg)
        log.warning("joining the group its seeds belong to: members %s", ", ".join(sorted(found)))
        return cfg

    @property
    def client_address(self) -> str:
        """host:port clients reach this node at (``advertise``, else where it listens)."""
        if self.config.advertise:
            return self.config.advertise
        host, port = self.address
        return f"{host}:{port}"
