"""Peer links: the I/O that feeds :class:`ha.membership.Membership`.

One TCP connection per pair of group members, on the peer port; the member
whose name sorts first dials, the other accepts.  A link opens with the same
framing and version handshake as clients (``PeerHello`` / ``PeerWelcome``,
carrying the node's identity), then carries keep-alives (``Heartbeat``) every
``keepalive_interval``; any frame counts as a sign of life.  A peer silent for
``non_response_timeout`` is ``Down``.  A peer with our location code or store
stamp, or without a common protocol version, is refused with a clear log line.

A link to a peer gone ``Down`` is dropped on both sides (logged once per ``Down``), and
the dialer dials again: frames queued on a link whose packets were lost would wait
for TCP's backed-off retransmissions, long after the path is back.  A dial gives up
after :func:`connect_timeout` (a packet filter that drops packets leaves a connect
hanging in SYN retransmissions) and is retried every ``keepalive_interval`` while the
peer is a member gone ``Down``, so a healed node sees its peers ``Up`` within about a
second, however long the cut.

Before anything else a link is authenticated (docs/security.md, "Peer authentication"):
the dialer must be a member this node may admit (``permitted_nodes``), and both ends
prove they hold the group secret (``PeerChallenge`` / ``PeerProof``, :mod:`ha.peerauth`),
or, with mutual TLS and no secret, the peer's certificate must name it
(:meth:`PeerManager.certificate_refusal`).  Until then no frame but the handshake's is
read, frames are small, and the member's state and live link are left alone.  A link
that fails is an *intruder*: logged (``intruder: ...``), counted per reason and kept
among the node's recent events.

Timeouts are the node clock's (``clock.timeout``, never ``wait_for``: on Python 3.11
``wait_for`` can swallow a cancellation that races with its result, and a dialer would
outlive ``stop``).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import ssl
from collections.abc import Callable, Collection, Mapping
from typing import Protocol

from client.errors import ErrorCode, TandemError, UnavailableError, UnsupportedProtocolError, for_code
from client.protocol import HANDSHAKE_MAX_FRAME, NEED_DATA, ConnectionEnded, ProtocolConnection, Role, choose_version
from client.protocol.connection import MAX_VERSION, MIN_VERSION
from broker.peers.foreign import ForeignActives, flatten
from broker.config import ConfigError, NodeConfig
from broker.security.intruders import IntruderEvent, IntruderLog, remote_of, resolve_permitted
from broker.logsafe import escape
from broker.security.secret import peer_mtls
from broker.messaging.queues import Queue
from broker.security.tls import peer_dial_tls, peer_server_context, TlsServer
from client.clock import Clock
from broker.messaging.forward import ForwardRequest
from client.protocol.frames import (
    Close,
    Error,
    Forward,
    ForwardOk,
    Frame,
    Heartbeat,
    PeerChallenge,
    PeerHello,
    PeerProof,
    PeerWelcome,
    Replicate,
    expect,
)
from ha.membership import (
    Change,
    Membership,
    NodeIdentity,
    QuorumPolicy,
    QuorumState,
    QuorumStateChanged,
    RemoteState,
    RemoteStateChanged,
)
from ha.peerauth import Refusal, Side, certificate_names, new_nonce, nonce_ok, permitted, proof, verify


class Receiving(Protocol):
    def receive(self, src: str, payload: bytes) -> None: ...

    def served(self) -> list[tuple[tuple[int, int], int]]:
        """(key, term) of every queue partition this node serves (broker.peers.foreign)."""

    def holds(self, key: tuple[int, int]) -> bool:
        """Whether this node has a copy (a log) of partition ``key``."""


class PeerArbiter(Protocol):
    """The LockFile arbiter's driver (broker.arbiters.lockfile), as the peer links feed it."""

    def heartbeat(self) -> Heartbeat:
        """The keep-alive to send now (it carries the epoch and the HA state)."""

    def heard(self, src: str, frame: Frame) -> None:
        """Any frame from peer ``src``, before it is handled (its epoch may fence this node)."""


class Dispatching(Protocol):
    def schedule(self, q: Queue) -> None: ...


class PeerHost(Protocol):
    """What the peer links need from their node."""
    config: NodeConfig
    clock: Clock
    store_stamp: str

    @property
    def replication(self) -> Receiving | None: ...

    @property
    def client_address(self) -> str: ...

    @property
    def queues(self) -> dict[str, Queue]: ...

    @property
    def delivery(self) -> Dispatching: ...

    async def handle_forward(self, kind: int, payload: bytes) -> bytes: ...

    def map_changed(self) -> None:
        """A partition got or lost an active, as far as this node knows: tell the sessions."""

    def ha_disabled_changed(self) -> None:
        """An availability zone's quorum took this node's HA services off, or gave them back
        (``PeerManager.zone_disabled``): every log takes it at once."""

log = logging.getLogger("tandem.ha")

REFUSED = {RemoteState.DUPLICATE_LOCATION, RemoteState.DUPLICATE_TIMESTAMP, RemoteState.UNSUPPORTED_PROTOCOL,
           RemoteState.MISMATCHED_SETTINGS}


def placement_diff(mine: str, theirs: str, mine_is: str, theirs_is: str) -> str:
    """Where two placement settings (``NodeConfig.placement_settings``) differ, a clause a
    setting: "replicas 1 on node3, 2 on node1; ..." (``mine_is`` "on node3", ``theirs_is`` "on node1")."""
    here = dict(kv.partition("=")[::2] for kv in mine.split(" "))
    there = dict(kv.partition("=")[::2] for kv in theirs.split(" "))
    return "; ".join(f"{k} {here.get(k) or '(none)'} {mine_is}, {there.get(k) or '(none)'} {theirs_is}"
                     for k in sorted(set(here) | set(there)) if here.get(k) != there.get(k))


def placement_mismatch(mine: str, theirs: str, me: str, peer: str) -> str:
    """How ``peer``'s placement settings differ from this node's ("" when they agree, or when
    either side places nothing: a witness)."""
    if not mine or not theirs or theirs == mine:
        return ""
    if "group=" in mine or "group=" in theirs:
        # the members changed while the group ran (broker.partitions.members): members and zones are the
        # group's state, which a member behind learns over this very link; the rest must agree
        here = dict(kv.partition("=")[::2] for kv in mine.split(" "))
        there = dict(kv.partition("=")[::2] for kv in theirs.split(" "))
        keep = ("replicas", "sync_replicas")
        mine = " ".join(f"{k}={here.get(k, '')}" for k in keep)
        theirs = " ".join(f"{k}={there.get(k, '')}" for k in keep)
        if mine == theirs:
            return ""
    return ("placement settings differ, so the two would place partitions on different nodes: "
            + placement_diff(mine, theirs, f"on {me}", f"on {peer}")
            + " (give every member the same peers, replicas, sync_replicas and zones)")
HANDSHAKE_TIMEOUT = 5.0
#: seconds a link to a removed member stays open (tandem group remove): long enough for the
#: catalogue's active to tell it that it is no longer a member (broker.modes.replicated.reconcile)
FAREWELL_LINGER = 12.0
REDIAL_MAX = 2.0  # the longest wait between dials of a peer not known to be Down (never seen yet, refusing)
#: dials in a row that nothing answers before a member is also dialled where it said it is
MOVED_AFTER = 2


def connect_timeout(keepalive_interval: float) -> float:
    """How long a dial waits for the TCP connection (the TLS handshake has HANDSHAKE_TIMEOUT
    of its own): two keep-alive intervals, at least half a second."""
    return min(HANDSHAKE_TIMEOUT, max(0.5, 2 * keepalive_interval))
PEER_MAX_FRAME = 512 * 1024 * 1024  # snapshots of large partitions travel in one frame (once admitted)
FORWARD_TIMEOUT = 30.0


class _Intruder(Exception):
    """The handshake failed: who the peer claimed to be does not hold."""

    def __init__(self, reason: Refusal, why: str) -> None:
        super().__init__(why)
        self.reason, self.why = reason, why


class _Link:
    def __init__(self, name: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 proto: ProtocolConnection) -> None:
        self.name, self.reader, self.writer, self.proto = name, reader, writer, proto
        self.challenged = False  # the acceptor sent its PeerChallenge: a proof is due

    def send(self, frame: Frame) -> None:
        if not self.writer.is_closing():
            self.writer.write(self.proto.send(frame))

    def close(self) -> None:
        self.writer.close()

    async def drain(self) -> None:
        """Until what is queued to send is down to the transport's low-water mark
        (ConnectionError once the link is gone)."""
        await self.writer.drain()

    def abort(self) -> None:
        """Close at once, dropping what is still queued (a dead link would never take it)."""
        self.writer.transport.abort()


class PeerManager:
    """``secret``: the group secret every link proves (:func:`broker.security.secret.group_secret`);
    None: the links are authenticated by mutual TLS, or this node is in no group."""

    def __init__(self, node: PeerHost, *, secret: bytes | None, places: bool = True) -> None:
        cfg = node.config
        self.node = node
        self.secret = secret
        self.mtls = peer_mtls(cfg)
        #: permitted_nodes, each NAME@HOST also as NAME@ADDRESS for each address HOST resolves to (start)
        self.permitted_nodes: tuple[str, ...] = cfg.permitted_nodes
        #: refused links: the recent ones (``events``) and how many per reason since start
        self.refused = IntruderLog(node.clock, cfg.name)
        self.addresses = cfg.peer_addresses()
        witness = cfg.witness_address()
        if witness is not None:
            self.addresses[witness[0]] = witness[1]  # a member: its vote counts in the node quorum
        self.me = NodeIdentity(name=cfg.name, store_stamp=node.store_stamp, priority=cfg.priority, votes=cfg.votes)
        #: what this node tells its peers it places partitions by ("": a witness, which holds none)
        self.placement = cfg.placement_settings() if places else ""
        #: who is active for the partitions this node holds no copy of (more members than copies)
        self.foreign = ForeignActives()
        self.gossip = cfg.arbiter == "majority" and len(cfg.peer_addresses()) > cfg.replicas
        self.membership = Membership(me=self.me, peers=tuple(self.addresses),
                                     non_response_timeout=cfg.non_response_timeout,
                                     policy=QuorumPolicy.parse(cfg.quorum_policy),
                                     designated_primary=cfg.designated_primary, zones=cfg.zone_list())
        #: the availability zone whose lost quorum keeps this node's HA services off ("" none)
        self.zone_disabled = self.membership.disabled_by
        #: the peers whose HA services are off, as their keep-alives say: peer -> the zone
        self.ha_off: dict[str, str] = {}
        self.links: dict[str, _Link] = {}
        self.client_addresses: dict[str, str] = {}  # peer -> host:port its clients use
        self._next_rid = 1
        self._forwards: dict[int, tuple[_Link, asyncio.Future[bytes]]] = {}
        self._handlers: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | TlsServer | None = None
        self.address: tuple[str, int] | None = None
        self._up = asyncio.Event()
        self._dialers: dict[str, asyncio.Task[None]] = {}  # peer -> the task that keeps a link to it
        self._running = False
        #: the LockFile arbiter's driver, when the group has one; ``epoch`` what frames carry
        self.arbiter: PeerArbiter | None = None
        self.epoch = 0
        #: told the member addresses a peer's PeerWelcome carried: (its name, "name=host:port"s)
        self.on_addresses: Callable[[str, list[str]], None] | None = None
        #: member -> where it says it takes peer links (its own word, on a link it proved), when
        #: that is not the address this node has: dialled there once nothing answers at this one
        self.said: dict[str, tuple[str, int]] = {}
        #: member -> (the address the settings or the group's state give, the one it moved to and
        #: a link was made at): kept when the members are set again
        self.moved: dict[str, tuple[tuple[str, int], tuple[str, int]]] = {}
        self.seed_refusal = ""  # what the last seed asked said when it refused this node

    @property
    def intruders(self) -> Collection[IntruderEvent]:
        """The recent refused links, oldest first (``tandem status``, the console)."""
        return self.refused.events

    @property
    def intruder_counts(self) -> Mapping[str, int]:
        """Refused links per reason since start (``tandem_intruders_total``)."""
        return self.refused.counts

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        cfg = self.node.config
        if cfg.peer_port is None:
            raise ConfigError("a replication group member needs a peer_port")
        self.permitted_nodes = await resolve_permitted(cfg.permitted_nodes)
        strangers = sorted({spec.partition("@")[0] for spec in cfg.permitted_nodes} - set(self.addresses))
        if strangers:
            log.warning("permitted_nodes: %s not among this node's peers (%s): never admitted",
                        ", ".join(strangers), ", ".join(sorted(self.addresses)) or "none")
        ctx = peer_server_context(cfg)
        if ctx is None:
            self._server = await asyncio.start_server(self._accept, cfg.host, cfg.peer_port)
        else:  # mutual TLS; a failed TLS handshake is an intruder too
            self._server = await TlsServer(self._accept, self._tls_refused, ctx, handshake_timeout=HANDSHAKE_TIMEOUT,
                                           tasks=self._handlers, clock=self.node.clock).start(cfg.host, cfg.peer_port)
        sock = self._server.sockets[0].getsockname()
        self.address = (sock[0], sock[1])
        auth = "group secret" if self.secret is not None else "mutual TLS" if self.mtls else "none"
        zones = " ".join(str(z) for z in self.membership.zones if cfg.name in z.members)
        log.info("peer links started node=%s peer_address=%s:%d peers=%s quorum_policy=%s authentication=%s "
                 "permitted_nodes=%s%s", cfg.name, sock[0], sock[1], ",".join(self.addresses) or "-",
                 cfg.quorum_policy, auth, ",".join(cfg.permitted_nodes) or "(the peers)",
                 f" availability_zones={zones}" if zones else "")

    async def run(self) -> None:
        """Dial the peers this node dials, and keep every link alive; runs until cancelled."""
        self._running = True
        try:
            for name in sorted(self.addresses):
                self._dial(name)
            await self._keepalive()
        finally:
            self._running = False
            for t in self._dialers.values():
                t.cancel()
            await asyncio.gather(*self._dialers.values(), return_exceptions=True)
            self._dialers.clear()

    def _farewell(self, name: str, link: _Link) -> None:
        if name in self.addresses:
            return  # (a member again)
        self._stop_dialing(name)
        if self.links.get(name) is link:
            log.warning("peer link to %s closed: it is no longer a member", name)
            link.abort()

    def _stop_dialing(self, name: str) -> None:
        dialer = self._dialers.pop(name, None)
        if dialer is not None:
            dialer.cancel()

    def _dial(self, name: str) -> None:
        """Keep a link to ``name`` if this node is the one that dials it (the lower name dials)."""
        if self.me.name < name and name not in self._dialers:
            self._dialers[name] = asyncio.create_task(self._dial_forever(name), name=f"tandem-peer-dial-{name}")

    def set_members(self, addresses: Mapping[str, tuple[str, int]], placement: str) -> None:
        """The group's members changed (``tandem group add`` / ``remove``, :mod:`broker.partitions.members`):
        ``addresses`` every other member's peer address.  A new member is dialled (or admitted
        when it dials), a removed one's link closes, and the quorum counts the new list."""
        self.placement = placement
        gone = [n for n in self.addresses if n not in addresses]
        for name, addr in addresses.items():
            moved = self.moved.get(name)
            if moved is not None:
                if moved[0] == addr:
                    addr = moved[1]  # (it moved from the address given: it is where it was found)
                else:
                    del self.moved[name]  # (the group's state gives another: that one)
            if self.addresses.get(name) != addr:
                self.addresses[name] = addr
                dialer = self._dialers.pop(name, None)
                if dialer is not None:
                    dialer.cancel()  # (a new address: dialled anew)
        for name in gone:
            del self.addresses[name]
            self.said.pop(name, None)
            self.moved.pop(name, None)
            link = self.links.get(name)
            if link is not None:
                # (kept a while, dialled or accepted: the catalogue's active tells it of its
                # removal over this link)
                asyncio.get_running_loop().call_later(FAREWELL_LINGER, self._farewell, name, link)
            else:
                self._stop_dialing(name)
        self.gossip = self.node.config.arbiter == "majority" and len(self.addresses) > self.node.config.replicas
        self.report(self.membership.set_peers(tuple(self.addresses)))
        if self._running:
            for name in sorted(self.addresses):
                self._dial(name)

    async def stop(self) -> None:
        for t in list(self._handlers):
            t.cancel()
        for _name, fut in self._forwards.values():
            if not fut.done():
                fut.set_exception(UnavailableError(f"node {self.me.name} is shutting down"))
        if self._server is not None:
            self._server.close()
        for link in list(self.links.values()):
            link.close()
        if self._server is not None:
            await self._server.wait_closed()

    # -- membership ------------------------------------------------------------------------------

    def report(self, changes: list[Change]) -> None:
        for c in changes:
            if isinstance(c, RemoteStateChanged):
                level = logging.INFO if c.new in (RemoteState.UP, RemoteState.DISCOVERED) else logging.WARNING
                log.log(level, "remote node %s: %s -> %s (%s)", c.node, c.old.value, c.new.value, c.reason)
            elif isinstance(c, QuorumStateChanged):
                level = logging.INFO if c.new is QuorumState.ACTIVE else logging.WARNING
                where = f"availability zone {c.zone}: " if c.zone else ""
                log.log(level, "node quorum %s -> %s (%svotes up %d of %d)%s", c.old.value, c.new.value, where,
                        c.up_votes, c.total_votes,
                        ": HA services off here, partitions handed to other nodes, clients refused" if c.zone else
                        ": partitions Unavailable, clients refused" if c.new is QuorumState.DISABLED else "")
                if self.zone_disabled != self.membership.disabled_by:
                    self.zone_disabled = self.membership.disabled_by
                    self.node.ha_disabled_changed()
                if c.old is QuorumState.DISABLED:
                    for q in self.node.queues.values():
                        self.node.delivery.schedule(q)  # consumers waited while there was no quorum

    def _peer_ha_off(self, name: str, zone: str) -> None:
        """Peer ``name`` says an availability zone of its lost quorum ("" it has it again): this
        node ranks it as drained meanwhile, so failback hands it nothing and gives it back its
        partitions once it is back (an undrain)."""
        if zone:
            self.ha_off[name] = zone
            log.warning("remote node %s: no quorum in its availability zone %s: its HA services are off", name, zone)
        else:
            self.ha_off.pop(name, None)
            log.info("remote node %s: its availability zones have quorum again", name)
        self.node.ha_disabled_changed()

    async def _keepalive(self) -> None:
        clock = self.node.clock
        interval = self.node.config.keepalive_interval
        while True:
            beat = self.arbiter.heartbeat() if self.arbiter is not None else \
                Heartbeat(actives=self._served() if self.gossip else [], ha_off=self.zone_disabled)
            for link in list(self.links.values()):
                link.send(beat)
            changes = self.membership.tick(clock.monotonic())
            self.report(changes)
            for c in changes:
                if isinstance(c, RemoteStateChanged) and c.new is RemoteState.DOWN:
                    self._drop_silent(c.node, c.reason)
            await clock.sleep(interval)

    def _served(self) -> list[int]:
        """The partitions this node serves, for its keep-alives (broker.peers.foreign)."""
        rep = self.node.replication
        return flatten(rep.served()) if rep is not None else []

    def foreign_active(self, key: tuple[int, int]) -> str | None:
        """The member serving ``key`` (a partition this node holds no copy of), if it said so and
        its link is up."""
        said = self.foreign.active(key)
        return said[0] if said is not None and said[0] in self.links else None

    def foreign_term(self, key: tuple[int, int]) -> int:
        said = self.foreign.active(key)
        return said[1] if said is not None else 0

    def _heard_actives(self, name: str, actives: list[int]) -> None:
        rep = self.node.replication
        if rep is not None and self.foreign.heard(name, actives, rep.holds):
            self.node.map_changed()

    def _forget_actives(self, name: str) -> None:
        if self.foreign.forget(name):
            self.node.map_changed()

    def _drop_silent(self, name: str, reason: str) -> None:
        """Peer ``name`` went Down without its link closing: drop the link, so that the dialer
        dials again (a fresh connection, not one whose queued frames wait for TCP's backed-off
        retransmissions once the path is back)."""
        link = self.links.get(name)
        if link is None:
            return
        log.info("peer link to %s dropped: %s; %s", name, reason,
                 "dialling it again" if self.me.name < name else "it dials again")
        link.abort()  # its task sees the end and drops it (_drop)

    # -- links --------------------------------------------------------------------------------------

    def _redial_max(self, name: str) -> float:
        """The longest wait between dials of ``name``: a keep-alive interval while it is a member
        gone Down (it is expected back, and a healed link must come back at once), else REDIAL_MAX."""
        if self.membership.state(name) is RemoteState.DOWN:
            return self.node.config.keepalive_interval
        return REDIAL_MAX

    async def _connect(self, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to a peer's port, TLS on it if peer links use TLS; the TCP connect gives up
        after connect_timeout, the TLS handshake after HANDSHAKE_TIMEOUT."""
        clock = self.node.clock
        tls = peer_dial_tls(self.node.config, host)
        async with clock.timeout(connect_timeout(self.node.config.keepalive_interval)):
            reader, writer = await asyncio.open_connection(host, port)
        if tls:
            try:
                async with clock.timeout(HANDSHAKE_TIMEOUT):
                    await writer.start_tls(tls["ssl"], server_hostname=tls["server_hostname"])
            except BaseException:
                writer.transport.abort()
                raise
        return reader, writer

    def _target(self, name: str, silent: int) -> tuple[str, int]:
        """Where to dial ``name`` next: its address here, or, once nothing has answered there
        MOVED_AFTER times in a row, every other time where it said it is (``said``)."""
        addr = self.addresses[name]
        said = self.said.get(name)
        if said is not None and said != addr and silent >= MOVED_AFTER and silent % 2 == 0:
            return said
        return addr

    def _found_at(self, name: str, addr: tuple[str, int]) -> None:
        """A link to member ``name`` was made at ``addr``, where it said it is: dialled there
        from now on (logged)."""
        old = self.addresses.get(name)
        if old is None or old == addr:
            return
        given = self.moved.get(name, (old, old))[0]
        if addr == given:
            self.moved.pop(name, None)
        else:
            self.moved[name] = (given, addr)
        self.addresses[name] = addr
        self.said.pop(name, None)
        log.warning("peer %s moved: nothing answered at %s, and it said it is at %s, where the link is made; "
                    "dialled there from now on (give it that address in the settings too)", name,
                    host_port(*old), host_port(*addr))

    def _heard_self(self, name: str, host: str, peer_port: int) -> None:
        """Member ``name`` proved itself on a link from ``host``, saying it takes peer links on
        ``peer_port``: kept in ``said`` where that is not the address this node has for it."""
        if not peer_port or name not in self.addresses or (self.secret is None and not self.mtls):
            return  # (without peer authentication a name proves nothing)
        have = self.addresses[name][0]
        try:
            ipaddress.ip_address(have)
        except ValueError:
            host = have  # (a DNS name: it follows a move of host itself; only a new port is news)
        addr = (host, peer_port)
        if addr == self.addresses[name]:
            self.said.pop(name, None)
        elif self.said.get(name) != addr:
            self.said[name] = addr
            log.info("peer %s says it takes peer links at %s (this node has %s): dialled there if nothing "
                     "answers at that", name, host_port(*addr), host_port(*self.addresses[name]))

    def _own_peer_port(self) -> int:
        return self.address[1] if self.address is not None else self.node.config.peer_port or 0

    def unlinked_dialers(self) -> list[tuple[str, tuple[str, int]]]:
        """The members that dial this node (names that sort before its own) with no link to it
        now, and their addresses."""
        return [(n, a) for n, a in sorted(self.addresses.items()) if n < self.me.name and n not in self.links]

    async def _dial_forever(self, name: str) -> None:
        clock = self.node.clock
        backoff = self.node.config.keepalive_interval
        tls_failure = ""
        silent = 0  # dials in a row that nothing answered (no listener, no route, no answer in time)
        while name in self.addresses:  # (no longer a member: tandem group remove)
            host, port = target = self._target(name, silent)
            try:
                reader, writer = await self._connect(host, port)
            except (OSError, asyncio.TimeoutError) as exc:
                if isinstance(exc, ssl.SSLError):
                    silent = 0  # (something answers there)
                    if str(exc) != tls_failure:
                        tls_failure = str(exc)  # logged once until it changes: the dialer retries every 2 s
                        log.warning("peer link to %s at %s:%d: TLS handshake failed: %s", name, host, port,
                                    exc.reason or exc)
                else:
                    silent += 1
                await clock.sleep(backoff)
                backoff = min(backoff * 2, self._redial_max(name))
                continue
            silent = 0
            proto = ProtocolConnection(Role.CLIENT, max_frame_size=HANDSHAKE_MAX_FRAME)
            link = _Link(name, reader, writer, proto)
            remote = f"{host}:{port}"
            try:
                try:
                    async with self.node.clock.timeout(HANDSHAKE_TIMEOUT):
                        welcome = await self._handshake_out(link, name, remote)
                except TandemError as exc:  # a frame out of turn, or bytes that are no frame
                    raise _Intruder(Refusal.GARBAGE, exc.message) from None
                # (a timeout here is a member that does not answer, a paused one say: not an intruder)
                if welcome is not None:
                    if welcome.members and self.on_addresses is not None:
                        self.on_addresses(name, welcome.members)
                    who = NodeIdentity(name=welcome.node, store_stamp=welcome.store_stamp,
                                       priority=welcome.priority, votes=welcome.votes)
                    proto.max_frame_size = PEER_MAX_FRAME
                    if self._admit(link, who, welcome.client_address, welcome.placement):
                        backoff = self.node.config.keepalive_interval  # a link made: quick to redial
                        self._found_at(name, target)
                        if self.arbiter is not None:
                            self.arbiter.heard(name, welcome)
                        await self._serve(link)
            except _Intruder as exc:
                self._intruder(link, remote, name, exc)
            except (TandemError, OSError, asyncio.TimeoutError) as exc:
                log.debug("peer link to %s failed: %r", name, exc)
            finally:
                self._drop(link)
            if name not in self.addresses:
                return  # no longer a member (tandem group remove): not dialled again
            await clock.sleep(backoff)
            backoff = min(backoff * 2, self._redial_max(name))  # refused, or the link ended: less and less often

    async def _handshake_out(self, link: _Link, name: str | None, remote: str, *,
                             discover: bool = False) -> PeerWelcome | None:
        """The dialer's side of the handshake: the acceptor's PeerWelcome once it has proved it is
        ``name`` (None: it refused this node, logged); _Intruder when it did not prove it.
        ``name`` None: a seed, whichever member it proves to be; ``discover``: for its member
        addresses only, no link (broker.peers.discovery)."""
        secret = self.secret
        mine = new_nonce() if secret is not None else b""
        link.send(PeerHello(min_version=MIN_VERSION, max_version=MAX_VERSION, node=self.me.name,
                            store_stamp=self.me.store_stamp, priority=self.me.priority, votes=self.me.votes,
                            client_address=self._client_address(), epoch=self.epoch, nonce=mine,
                            placement=self.placement, discover=discover, peer_port=self._own_peer_port()))
        frame = await self._next_frame(link)
        if isinstance(frame, Error):
            if name is None:  # (a seed: broker.peers.discovery says why, once)
                self.seed_refusal = frame.message
                return None
            self._refused_by(name, remote, frame.message)
            return None
        if secret is None:
            if isinstance(frame, PeerChallenge):
                log.warning("peer %s at %s asks for the group secret and this node has none (cluster_secret_file): "
                            "link dropped", name or "seed", remote)
                return None
            welcome = expect(frame, PeerWelcome)
            name = name or welcome.node
            if welcome.node != name:
                raise _Intruder(Refusal.WRONG_NAME, f"the node at {remote} says it is {welcome.node}, not {name}")
            why = self.certificate_refusal(link, name)
            if why is not None:
                raise _Intruder(Refusal.BAD_PROOF, why)
            return welcome
        if not isinstance(frame, PeerChallenge):
            raise _Intruder(Refusal.NO_PROOF, f"answered {type(frame).__name__} without a challenge: it does not "
                                              f"prove the group secret")
        name = name or frame.node  # (a seed: it proves below that it is the member it names)
        if frame.node != name:
            raise _Intruder(Refusal.WRONG_NAME, f"the node at {remote} says it is {frame.node}, not {name}")
        if not nonce_ok(frame.nonce):
            raise _Intruder(Refusal.GARBAGE, f"a challenge nonce of {len(frame.nonce)} bytes")
        theirs = frame.nonce
        link.send(PeerProof(proof=proof(secret, Side.DIALER, dialer_nonce=mine, acceptor_nonce=theirs,
                                        prover=self.me.name, prover_stamp=self.me.store_stamp, verifier=name)))
        frame = await self._next_frame(link)
        if isinstance(frame, Error):
            if discover:
                self.seed_refusal = frame.message
                return None
            self._refused_by(name, remote, frame.message)
            return None
        if not isinstance(frame, PeerProof):
            raise _Intruder(Refusal.NO_PROOF, f"sent {type(frame).__name__} instead of its proof")
        their_proof = frame.proof
        welcome = expect(await self._next_frame(link), PeerWelcome)
        if welcome.node != name:
            raise _Intruder(Refusal.WRONG_NAME, f"the node at {remote} says it is {welcome.node}, not {name}")
        if not verify(secret, Side.ACCEPTOR, their_proof, dialer_nonce=mine, acceptor_nonce=theirs, prover=name,
                      prover_stamp=welcome.store_stamp, verifier=self.me.name):
            raise _Intruder(Refusal.BAD_PROOF, "its proof does not match: it holds another group secret, or none")
        return welcome

    def book(self, but: str = "") -> list[str]:
        """"name=host:port" of every other member whose peer address this node knows (the witness
        too), but ``but``'s."""
        return [f"{n}={host_port(h, p)}" for n, (h, p) in sorted(self.addresses.items()) if n != but]

    async def discover_at(self, host: str, port: int) -> tuple[str, list[str]] | str:
        """Ask the member at a seed, ``host:port``, for the members' addresses: (its name, its
        PeerWelcome's "name=host:port"s), once it has proved the group secret (or its
        certificate); else why not, in words."""
        remote = host_port(host, port)
        try:
            reader, writer = await self._connect(host, port)
        except (OSError, asyncio.TimeoutError) as exc:
            return f"no answer ({exc.strerror or type(exc).__name__})" if isinstance(exc, OSError) \
                else "no answer (timed out)"
        link = _Link("", reader, writer, ProtocolConnection(Role.CLIENT, max_frame_size=HANDSHAKE_MAX_FRAME))
        self.seed_refusal = ""
        try:
            try:
                async with self.node.clock.timeout(HANDSHAKE_TIMEOUT):
                    welcome = await self._handshake_out(link, None, remote, discover=True)
            except TandemError as exc:
                raise _Intruder(Refusal.GARBAGE, exc.message) from None
            if welcome is None:
                return f"refused this node: {self.seed_refusal}" if self.seed_refusal else "refused this node"
            if welcome.node == self.me.name:
                return "it is this node"
            return welcome.node, welcome.members
        except _Intruder as exc:
            self._intruder(link, remote, "", exc)
            return f"failed authentication ({exc.why})"
        except (TandemError, OSError, asyncio.TimeoutError) as exc:
            return f"the link failed ({exc!r})"
        finally:
            link.abort()

    def _refused_by(self, name: str, remote: str, why: str) -> None:
        """Member ``name`` refused this node's link; for settings that differ it is refused here too."""
        log.warning("peer %s at %s refused this node: %s", name, remote, escape(why))  # (its words)
        if why.startswith(f"refused as {RemoteState.MISMATCHED_SETTINGS.value}: "):
            who = NodeIdentity(name=name, store_stamp="")
            self.report(self.membership.handshake(who, self.node.clock.monotonic(), mismatch=why.split(": ", 1)[1]))

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        proto = ProtocolConnection(Role.SERVER, max_frame_size=HANDSHAKE_MAX_FRAME)
        link = _Link("", reader, writer, proto)
        host, remote = remote_of(writer)
        try:
            try:
                async with self.node.clock.timeout(HANDSHAKE_TIMEOUT):
                    hello, mine = await self._handshake_in(link, host)
            except TimeoutError:
                raise _Intruder(Refusal.TIMEOUT, f"no complete handshake within {HANDSHAKE_TIMEOUT:g} s") from None
            except ConnectionResetError:
                if not link.name:
                    return  # connected and went without a word (a port probe): nothing claimed, nothing refused
                raise _Intruder(Refusal.NO_PROOF, "the connection closed before the handshake completed") from None
            except TandemError as exc:  # a frame out of turn, or bytes that are no frame
                if link.challenged:
                    raise _Intruder(Refusal.NO_PROOF, f"{exc.message}: no proof of the group secret") from None
                raise _Intruder(Refusal.GARBAGE, exc.message) from None
            if hello is None:
                return
            who = NodeIdentity(name=hello.node, store_stamp=hello.store_stamp, priority=hello.priority,
                               votes=hello.votes)
            try:
                version = choose_version(hello.min_version, hello.max_version)
            except UnsupportedProtocolError as exc:
                self.report(self.membership.handshake(who, self.node.clock.monotonic(), protocol_ok=False))
                self._refuse(link, exc.message)
                return
            if not hello.discover and not self._admit(link, who, hello.client_address, hello.placement):
                return
            self._heard_self(hello.node, host, hello.peer_port)
            if self.secret is not None:
                link.send(PeerProof(proof=proof(self.secret, Side.ACCEPTOR, dialer_nonce=hello.nonce,
                                                acceptor_nonce=mine, prover=self.me.name,
                                                prover_stamp=self.me.store_stamp, verifier=hello.node)))
            link.send(PeerWelcome(version=version, node=self.me.name, store_stamp=self.me.store_stamp,
                                  priority=self.me.priority, votes=self.me.votes,
                                  client_address=self._client_address(), epoch=self.epoch,
                                  placement=self.placement, members=self.book(but=hello.node)))
            if hello.discover:  # (a member that found this node by a seed: the addresses were all it wanted)
                log.info("peer %s asked for the members' addresses (seed)", escape(hello.node))
                link.send(Close(code=0, reason="member addresses sent"))
                await link.drain()
                return
            proto.max_frame_size = PEER_MAX_FRAME
            if self.arbiter is not None:
                self.arbiter.heard(hello.node, hello)
            await self._serve(link)
        except _Intruder as exc:
            if link.name and link.name not in self.addresses and exc.reason is not Refusal.NOT_MEMBER:
                # a name that is no member's, and no proof: counted as such (it learns only that it failed)
                exc = _Intruder(Refusal.NOT_MEMBER, f"not a member of this group ({exc.why})")
            self._intruder(link, remote, link.name, exc)
        except (TandemError, OSError, asyncio.TimeoutError) as exc:
            log.debug("peer link from %s failed: %r", escape(link.name) or remote, exc)
        finally:
            self._drop(link)

    def _tls_refused(self, remote: str, why: str) -> None:
        """A link to the peer port whose TLS handshake failed: an intruder that claimed no name."""
        self.refused.record("from", remote, "", Refusal.TLS, why)

    async def _handshake_in(self, link: _Link, host: str) -> tuple[PeerHello | None, bytes]:
        """The acceptor's side of the handshake: the dialer's PeerHello once it has proved it is the
        member it names, and this node's nonce (None: refused as a misconfigured member, logged);
        _Intruder when it is not a member this node admits or did not prove it."""
        frame = await self._next_frame(link)
        if not isinstance(frame, PeerHello):
            raise _Intruder(Refusal.GARBAGE, f"expected PeerHello, got {type(frame).__name__}")
        hello = frame
        link.name = hello.node
        if hello.node == self.me.name:
            self._refuse(link, f"duplicate location: a node named {hello.node!r} (location code "
                               f"{self.me.location_code:#x}) is this node")
            return None, b""
        member = hello.node in self.addresses
        if member and not permitted(hello.node, host, self.permitted_nodes, tuple(self.addresses)):
            raise _Intruder(Refusal.NOT_PERMITTED, f"not permitted from {host} (permitted_nodes: "
                                                   f"{', '.join(self.node.config.permitted_nodes)})")
        secret = self.secret
        if secret is None and not self.mtls:
            self._refuse(link, f"{self.me.name} has no group secret and no mutual TLS: it admits no peer")
            return None, b""
        mine = await self._proof(link, hello, secret)  # (first: a stranger learns nothing of the members)
        return self._member(link, hello), mine

    async def _proof(self, link: _Link, hello: PeerHello, secret: bytes | None) -> bytes:
        """The dialer proves it is the node it names: the group secret's challenge (this node's
        nonce returned), or, without a secret, its certificate.  _Intruder if it does not."""
        if secret is None:
            why = self.certificate_refusal(link, hello.node)
            if why is not None:
                raise _Intruder(Refusal.BAD_PROOF, why)
            return b""
        if not nonce_ok(hello.nonce):
            raise _Intruder(Refusal.NO_PROOF, "its PeerHello has no nonce: it does not prove the group secret")
        mine = new_nonce()
        link.send(PeerChallenge(node=self.me.name, nonce=mine))
        link.challenged = True
        frame = await self._next_frame(link)
        if not isinstance(frame, PeerProof):
            raise _Intruder(Refusal.NO_PROOF, f"sent {type(frame).__name__} instead of its proof")
        if not verify(secret, Side.DIALER, frame.proof, dialer_nonce=hello.nonce, acceptor_nonce=mine,
                      prover=hello.node, prover_stamp=hello.store_stamp, verifier=self.me.name):
            raise _Intruder(Refusal.BAD_PROOF, "its proof does not match: it holds another group secret, or none")
        return mine

    def _member(self, link: _Link, hello: PeerHello) -> PeerHello | None:
        """``hello`` if its node, which proved itself, is a member; else it is told why, in
        plain words (it holds the group's secret or certificate: a member removed from the
        group, most likely, that was down when it was told), and None."""
        if hello.node in self.addresses:
            return hello
        self._refuse(link, f"{hello.node} is not a member of this group (removed with tandem group remove, or never "
                           f"added): it links to no member; stop it, or add it again with tandem group add")
        return None

    def certificate_refusal(self, link: _Link, name: str) -> str | None:
        """Mutual TLS without a group secret: why the peer's certificate does not authenticate it
        as node ``name`` (None: it does).  The TLS layer (broker/security/tls.py) verifies the chain to
        ``tls_ca``; this checks the certificate is the named node's (its subjectAltName DNS
        names, else its commonName, hold ``name``).  A link without TLS is refused."""
        ssl_object = link.writer.get_extra_info("ssl_object")
        if ssl_object is None:
            return "the link is not TLS, and this node authenticates peers by their certificates"
        cert = ssl_object.getpeercert()
        if not cert:
            return "it presented no certificate"
        names = certificate_names(cert)
        if name not in names:
            return f"its certificate names {', '.join(sorted(names)) or 'nothing'}, not {name}"
        return None

    def _intruder(self, link: _Link, remote: str, claimed: str, exc: _Intruder) -> None:
        """Refuse a link that failed authentication: log it, count it, keep it among the events."""
        self.refused.record("to" if link.proto.role is Role.CLIENT else "from", remote, claimed, exc.reason,
                            exc.why)
        for frame in (Error(rid=0, code=int(ErrorCode.PROTOCOL_ERROR), message="peer authentication failed"),
                      Close(code=int(ErrorCode.PROTOCOL_ERROR), reason="peer authentication failed")):
            try:
                link.send(frame)
            except TandemError:
                pass  # the protocol forbids this frame on this side now (a dialer sends no Error)
        link.close()

    def _client_address(self) -> str:
        return self.node.client_address

    def _admit(self, link: _Link, who: NodeIdentity, client_address: str = "", placement: str = "") -> bool:
        if who.name not in self.addresses:  # (removed from the group while the link was made)
            self._refuse(link, f"{who.name} is not a member of this group")
            return False
        mismatch = placement_mismatch(self.placement, placement, self.me.name, who.name)
        self.report(self.membership.handshake(who, self.node.clock.monotonic(), mismatch=mismatch))
        state = self.membership.state(who.name)
        if state in REFUSED:
            self._refuse(link, f"refused as {state.value}: " + (mismatch or f"check that {who.name} has its own "
                                                                            f"name and data dir"))
            return False
        old = self.links.get(who.name)
        if old is not None and old is not link:
            old.abort()  # the peer dialled again: the old link is dead to it
        link.proto.max_frame_size = PEER_MAX_FRAME  # a member's: snapshots travel in one frame
        self.links[who.name] = link
        if client_address:
            self.client_addresses[who.name] = client_address
        return True

    def _refuse(self, link: _Link, why: str) -> None:
        log.warning("peer link %s refused: %s", escape(link.name), escape(why))
        try:
            link.send(Error(rid=0, code=int(UnsupportedProtocolError.code), message=why))
            link.send(Close(code=int(UnsupportedProtocolError.code), reason=why))
        except TandemError:
            pass  # the protocol already forbids more output on this link; closing it is all that is left
        link.close()

    async def _serve(self, link: _Link) -> None:
        clock = self.node.clock
        rep = self.node.replication
        while True:
            frame = await self._next_frame(link)
            self.report(self.membership.heard(link.name, clock.monotonic()))
            if self.arbiter is not None:
                self.arbiter.heard(link.name, frame)
            if isinstance(frame, Replicate):
                if rep is not None:
                    rep.receive(link.name, frame.payload)
            elif isinstance(frame, Heartbeat):
                if self.gossip:
                    self._heard_actives(link.name, frame.actives)
                if frame.ha_off != self.ha_off.get(link.name, ""):
                    self._peer_ha_off(link.name, frame.ha_off)
            elif isinstance(frame, Forward):
                task = asyncio.get_running_loop().create_task(self._answer(link, frame))
                self._handlers.add(task)
                task.add_done_callback(self._handlers.discard)
            elif isinstance(frame, ForwardOk):
                self._resolve(frame.rid, frame.payload, None)
            elif isinstance(frame, Error) and frame.rid:
                self._resolve(frame.rid, b"", for_code(frame.code, frame.message, active_hint=frame.active_hint,
                                   next_seq=frame.next_seq))
            elif isinstance(frame, Close):
                return

    # -- forwarded requests (location transparency) ----------------------------------------------

    async def forward(self, name: str, request: ForwardRequest) -> bytes:
        """Ask member ``name`` to do ``request``; its reply, or the error it raised."""
        kind = request.KIND.name
        link = self.links.get(name)
        if link is None:
            raise UnavailableError(f"node {name} is active for this request but not connected to {self.me.name}")
        rid = self._next_rid
        self._next_rid += 1
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._forwards[rid] = (link, fut)
        try:
            link.send(Forward(rid=rid, kind=int(request.KIND), payload=request.pack()))
            async with self.node.clock.timeout(FORWARD_TIMEOUT):
                return await fut
        except TimeoutError:
            raise UnavailableError(f"node {name} did not answer a forwarded {kind} in {FORWARD_TIMEOUT:.0f} s") \
                from None
        finally:
            self._forwards.pop(rid, None)

    def _resolve(self, rid: int, payload: bytes, err: BaseException | None) -> None:
        entry = self._forwards.get(rid)
        if entry is not None and not entry[1].done():
            entry[1].set_exception(err) if err is not None else entry[1].set_result(payload)

    async def _answer(self, link: _Link, f: Forward) -> None:
        try:
            out = await self.node.handle_forward(f.kind, f.payload)
            link.send(ForwardOk(rid=f.rid, payload=out))
        except TandemError as exc:
            link.send(Error(rid=f.rid, code=int(exc.code), message=exc.message,
                            active_hint=getattr(exc, "active_hint", None),
                            next_seq=getattr(exc, "next_seq", None)))
        except Exception as exc:  # a bug must not kill the link: answer, and log it
            log.exception("forwarded %s from %s failed", f.kind, link.name)
            link.send(Error(rid=f.rid, code=int(ErrorCode.INTERNAL_ERROR), message=repr(exc)))

    async def _next_frame(self, link: _Link) -> Frame:
        while True:
            event = link.proto.next_event()
            if event is NEED_DATA:
                data = await link.reader.read(65536)
                link.proto.receive_data(data)
                continue
            if isinstance(event, ConnectionEnded):
                raise ConnectionResetError("peer link closed")
            return expect(event, Frame)

    def _drop(self, link: _Link) -> None:
        link.close()
        admitted = self.links.get(link.name) is link  # one never admitted (or replaced) changes no member's state
        if admitted:
            del self.links[link.name]
        for _rid, (via, fut) in list(self._forwards.items()):
            if via is link and not fut.done():
                fut.set_exception(UnavailableError(f"link to node {link.name} lost during a forwarded request"))
        if admitted:
            self.report(self.membership.link_lost(link.name))
            self._forget_actives(link.name)


def host_port(host: str, port: int) -> str:
    """"host:port", an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
