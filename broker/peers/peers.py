"""Peer links: the I/O that feeds :class:`ha.membership.Membership`.

One connection per pair of group members, on the peer port (TCP, through the node's
:mod:`broker.peers.transport`); the member whose name sorts first dials
(:mod:`broker.peers.dialing`), the other accepts.  A link opens with the same framing and
version handshake as clients (``PeerHello`` / ``PeerWelcome``, carrying the node's identity),
then carries keep-alives (``Heartbeat``) every ``keepalive_interval``; any frame counts as a
sign of life.  A peer silent for
``non_response_timeout`` is ``Down``.  A peer with our location code or store
stamp, or without a common protocol version, is refused with a clear log line.

A link to a peer gone ``Down`` is dropped on both sides (logged once per ``Down``), and
the dialer dials again: frames queued on a link whose packets were lost would wait
for TCP's backed-off retransmissions, long after the path is back.

Before anything else a link is authenticated (docs/security.md, "Peer authentication"):
the dialer must be a member this node may admit (``permitted_nodes``), and both ends
prove they hold the group secret (``PeerChallenge`` / ``PeerProof``, :mod:`ha.peerauth`),
or, with mutual TLS and no secret, the peer's certificate must name it.  What each end
checks and decides is :class:`ha.peerhandshake.PeerHandshake`, fed the link's frames by
:mod:`broker.peers.handshake`.  Until then no frame but the handshake's is
read, frames are small, and the member's state and live link are left alone.  A link
that fails is an *intruder*: logged (``intruder: ...``), counted per reason and kept
among the node's recent events.

Every task the links run (each accepted link, each dialer, each answer to a forwarded
request) belongs to the manager's :class:`broker.peers.links.LinkTasks`, and
:meth:`PeerManager.stop` ends them all.  Timeouts are the node clock's (``clock.timeout``,
never ``wait_for``: on Python 3.11 ``wait_for`` can swallow a cancellation that races with
its result, and a dialer would outlive ``stop``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Collection, Mapping

from broker.config import ConfigError
from broker.logsafe import escape
from broker.messaging.forward import ForwardRequest
from broker.peers import handshake
from broker.peers.builds import PeerBuilds
from broker.peers.dialing import Address, Dialing
from broker.peers.foreign import ForeignActives, flatten
from broker.peers.forwarding import Forwards
from broker.peers.host import PeerArbiter, PeerHost
from broker.peers.links import FAREWELL_LINGER, HANDSHAKE_TIMEOUT, PEER_MAX_FRAME, Link, LinkTasks, host_port
from broker.peers.placement import placement_mismatch
from broker.peers.transport import TCP, Listener, PeerTransport
from broker.security.intruders import IntruderEvent, IntruderLog, remote_of, resolve_permitted
from broker.security.secret import peer_mtls
from client.errors import TandemError, UnavailableError, UnsupportedProtocolError
from client.protocol import HANDSHAKE_MAX_FRAME, ProtocolConnection, Role, choose_version
from client.protocol.connection import MAX_VERSION, MIN_VERSION
from client.protocol.frames import (
    Close,
    Error,
    Forward,
    ForwardOk,
    Heartbeat,
    PeerHello,
    PeerProof,
    PeerTypes,
    PeerWelcome,
    Replicate,
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
from ha.peerauth import Refusal, new_nonce
from ha.peerhandshake import Accepted, Dropped, Hello, Intruder, PeerHandshake, Refuse, RefusedBy

log = logging.getLogger("tandem.ha")

REFUSED = {RemoteState.DUPLICATE_LOCATION, RemoteState.DUPLICATE_TIMESTAMP, RemoteState.UNSUPPORTED_PROTOCOL,
           RemoteState.MISMATCHED_SETTINGS}


class PeerManager:
    """``secret``: the group secret every link proves (:func:`broker.security.secret.group_secret`);
    None: the links are authenticated by mutual TLS, or this node is in no group.  ``transport``:
    what the links listen on and dial through (:mod:`broker.peers.transport`)."""

    def __init__(self, node: PeerHost, *, secret: bytes | None, places: bool = True,
                 transport: PeerTransport = TCP) -> None:
        cfg = node.config
        self.node = node
        self.transport = transport
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
        #: the other members' builds, and the group's feature level as applied here (ha.upgrade)
        self.builds = PeerBuilds(cfg.name)
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
        self.links: dict[str, Link] = {}
        self.client_addresses: dict[str, str] = {}  # peer -> host:port its clients use
        self.forwards = Forwards(node.clock, node.handle_forward, node.link_lost)
        #: every task the links run: accepted links, dialers, answers to forwarded requests
        self.tasks = LinkTasks()
        self._farewells: set[asyncio.TimerHandle] = set()  # links to removed members, closed in a while
        self._server: Listener | None = None
        self.address: tuple[str, int] | None = None
        self.dialing = Dialing(cfg.name, self.addresses, cfg, node.clock, self.membership.state, self.tasks,
                               self._link_out, transport, authenticated=secret is not None or self.mtls)
        self._running = False
        #: the LockFile arbiter's driver, when the group has one; ``epoch`` what frames carry
        self.arbiter: PeerArbiter | None = None
        self.epoch = 0
        #: told the member addresses a peer's PeerWelcome carried: (its name, "name=host:port"s)
        self.on_addresses: Callable[[str, list[str]], None] | None = None
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
        # (with mutual TLS a failed TLS handshake is an intruder too: _tls_refused)
        self._server = await self.transport.listen(cfg, self.node.clock, self._accept, refused=self._tls_refused,
                                                   tasks=self.tasks)
        sock = self.address = self._server.address
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
                self.dialing.dial(name)
            await self._keepalive()
        finally:
            self._running = False
            await self.dialing.stop()

    def _farewell(self, name: str, link: Link) -> None:
        if name in self.addresses:
            return  # (a member again)
        self.dialing.stop_dialing(name)
        if self.links.get(name) is link:
            log.warning("peer link to %s closed: it is no longer a member", name)
            link.abort()

    def _linger(self, name: str, link: Link) -> None:
        """Close ``link`` to ``name``, no longer a member, after FAREWELL_LINGER (unless it is one
        again by then, or the manager stops first)."""
        def farewell() -> None:
            self._farewells.discard(handle)
            self._farewell(name, link)

        handle = asyncio.get_running_loop().call_later(FAREWELL_LINGER, farewell)
        self._farewells.add(handle)

    def set_members(self, addresses: Mapping[str, tuple[str, int]], placement: str) -> None:
        """The group's members changed (``tandem group add`` / ``remove``, :mod:`broker.partitions.members`):
        ``addresses`` every other member's peer address.  A new member is dialled (or admitted
        when it dials), a removed one's link closes, and the quorum counts the new list."""
        self.placement = placement
        gone = [n for n in self.addresses if n not in addresses]
        for name, addr in addresses.items():
            addr = self.dialing.given(name, addr)
            if self.addresses.get(name) != addr:
                self.addresses[name] = addr
                self.dialing.stop_dialing(name)  # (a new address: dialled anew)
        for name in gone:
            del self.addresses[name]
            self.dialing.forget(name)
            link = self.links.get(name)
            if link is not None:
                # (kept a while, dialled or accepted: the catalogue's active tells it of its
                # removal over this link)
                self._linger(name, link)
            else:
                self.dialing.stop_dialing(name)
        self.gossip = self.node.config.arbiter == "majority" and len(self.addresses) > self.node.config.replicas
        self.report(self.membership.set_peers(tuple(self.addresses)))
        if self._running:
            for name in sorted(self.addresses):
                self.dialing.dial(name)

    async def stop(self) -> None:
        """Close the port and every link, and end every task the links run (dialers included)."""
        for handle in self._farewells:
            handle.cancel()
        self._farewells.clear()
        self.forwards.stop(self.me.name)
        if self._server is not None:
            self._server.close()
        for link in list(self.links.values()):
            link.close()
        await self.dialing.stop()
        await self.tasks.close()
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
                self.node.quorum_changed()
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
            beat = dataclasses.replace(self.arbiter.heartbeat(), level=self.builds.level) if self.arbiter is not None \
                else Heartbeat(actives=self._served() if self.gossip else [], ha_off=self.zone_disabled,
                               level=self.builds.level)
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
        return flatten(self.node.receiver.served())

    def foreign_active(self, key: tuple[int, int]) -> str | None:
        """The member serving ``key`` (a partition this node holds no copy of), if it said so and
        its link is up."""
        said = self.foreign.active(key)
        return said[0] if said is not None and said[0] in self.links else None

    def foreign_term(self, key: tuple[int, int]) -> int:
        said = self.foreign.active(key)
        return said[1] if said is not None else 0

    def _heard_actives(self, name: str, actives: list[int]) -> None:
        if self.foreign.heard(name, actives, self.node.receiver.holds):
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

    def _own_peer_port(self) -> int:
        return self.address[1] if self.address is not None else self.node.config.peer_port or 0

    def unlinked_dialers(self) -> list[tuple[str, tuple[str, int]]]:
        """The members that dial this node (names that sort before its own) with no link to it
        now, and their addresses."""
        return [(n, a) for n, a in sorted(self.addresses.items()) if n < self.me.name and n not in self.links]

    async def _link_out(self, name: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        target: Address) -> bool:
        """A link this node dialled to member ``name`` at ``target``: the handshake, then, once the
        member is admitted, its frames until it ends.  Whether it was admitted."""
        link = Link(name, reader, writer, ProtocolConnection(Role.CLIENT, max_frame_size=HANDSHAKE_MAX_FRAME))
        remote = f"{target[0]}:{target[1]}"
        admitted = False
        try:
            welcome = await self._handshake_out(link, name, remote)
            if isinstance(welcome, Intruder):
                self._intruder(link, remote, name, welcome)
            elif welcome is not None:
                if welcome.members and self.on_addresses is not None:
                    self.on_addresses(name, welcome.members)
                who = NodeIdentity(name=welcome.node, store_stamp=welcome.store_stamp, priority=welcome.priority,
                                   votes=welcome.votes)
                link.proto.max_frame_size = PEER_MAX_FRAME
                admitted = self._admit(link, who, welcome)
                if admitted:
                    self.dialing.found_at(name, target)
                    if self.arbiter is not None:
                        self.arbiter.heard(name, welcome)
                    await self._serve(link)
        except (TandemError, OSError, asyncio.TimeoutError) as exc:
            # (a timeout in the handshake is a member that does not answer, a paused one say: not an intruder)
            log.debug("peer link to %s failed: %r", name, exc)
        finally:
            self._drop(link)
        return admitted

    def _hello(self, hello: Hello, discover: bool) -> PeerHello:
        return PeerHello(min_version=MIN_VERSION, max_version=MAX_VERSION, node=hello.node,
                         store_stamp=hello.store_stamp, priority=self.me.priority, votes=self.me.votes,
                         client_address=self._client_address(), epoch=self.epoch, nonce=hello.nonce,
                         placement=self.placement, discover=discover, peer_port=self._own_peer_port(),
                         **self.builds.ours())

    async def _handshake_out(self, link: Link, name: str | None, remote: str, *,
                             discover: bool = False) -> PeerWelcome | Intruder | None:
        """The dialer's side of the handshake: the acceptor's PeerWelcome once it has proved it is
        ``name``; how it failed to prove it (Intruder); None when it refused this node or asks for
        a secret this node lacks (logged).  ``name`` None: a seed, whichever member it proves to
        be; ``discover``: for its member addresses only, no link (broker.peers.discovery)."""
        tls, cert = link.certificate()
        clock = self.node.clock
        hs = PeerHandshake.dialer(self.me, secret=self.secret, nonce=new_nonce(), peer=name, remote=remote,
                                  now=clock.monotonic(), timeout=HANDSHAKE_TIMEOUT, tls=tls, cert=cert)
        done = await handshake.run(link, hs, clock, hs.start(), hello=lambda h: self._hello(h, discover))
        outcome = done.outcome
        if isinstance(outcome, Accepted):
            return done.welcome
        if isinstance(outcome, Intruder):
            return outcome
        if isinstance(outcome, RefusedBy):
            if name is None:  # (a seed: broker.peers.discovery says why, once)
                self.seed_refusal = outcome.message
            else:
                self._refused_by(name, remote, outcome.message)
        elif isinstance(outcome, Dropped):
            log.warning("peer %s at %s %s: link dropped", name or "seed", remote, outcome.why)
        return None

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
            reader, writer = await self.transport.connect(self.node.config, self.node.clock, host, port)
        except (OSError, asyncio.TimeoutError) as exc:
            return f"no answer ({exc.strerror or type(exc).__name__})" if isinstance(exc, OSError) \
                else "no answer (timed out)"
        link = Link("", reader, writer, ProtocolConnection(Role.CLIENT, max_frame_size=HANDSHAKE_MAX_FRAME))
        self.seed_refusal = ""
        try:
            welcome = await self._handshake_out(link, None, remote, discover=True)
            if isinstance(welcome, Intruder):
                self._intruder(link, remote, "", welcome)
                return f"failed authentication ({welcome.why})"
            if welcome is None:
                return f"refused this node: {self.seed_refusal}" if self.seed_refusal else "refused this node"
            if welcome.node == self.me.name:
                return "it is this node"
            return welcome.node, welcome.members
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
        """A link to the peer port: the handshake, then the dialer's frames once it is admitted."""
        link = Link("", reader, writer, ProtocolConnection(Role.SERVER, max_frame_size=HANDSHAKE_MAX_FRAME))
        host, remote = remote_of(writer)
        try:
            hello, proof = await self._handshake_in(link, host, remote)
            if hello is None:
                return
            who = NodeIdentity(name=hello.node, store_stamp=hello.store_stamp, priority=hello.priority,
                               votes=hello.votes)
            try:
                version = choose_version(hello.min_version, hello.max_version, peer=f"peer {escape(hello.node)}",
                                         me=f"this node ({self.me.name})")
            except UnsupportedProtocolError as exc:
                log.warning("peer link from %s refused: %s", remote, exc.message)
                self.report(self.membership.handshake(who, self.node.clock.monotonic(), protocol_ok=False))
                link.refuse(exc.message)
                return
            if not hello.discover and not self._admit(link, who, hello):
                return
            self.dialing.heard_self(hello.node, host, hello.peer_port)
            if proof is not None:
                link.send(PeerProof(proof=proof))
            link.send(PeerWelcome(version=version, node=self.me.name, store_stamp=self.me.store_stamp,
                                  priority=self.me.priority, votes=self.me.votes,
                                  client_address=self._client_address(), epoch=self.epoch,
                                  placement=self.placement, members=self.book(but=hello.node),
                                  **self.builds.welcome()))
            if hello.discover:  # (a member that found this node by a seed: the addresses were all it wanted)
                log.info("peer %s asked for the members' addresses (seed)", escape(hello.node))
                link.send(Close(code=0, reason="member addresses sent"))
                await link.drain()
                return
            link.proto.max_frame_size = PEER_MAX_FRAME
            if self.arbiter is not None:
                self.arbiter.heard(hello.node, hello)
            await self._serve(link)
        except (TandemError, OSError, asyncio.TimeoutError) as exc:
            log.debug("peer link from %s failed: %r", escape(link.name) or remote, exc)
        finally:
            self._drop(link)

    async def _handshake_in(self, link: Link, host: str, remote: str) -> tuple[PeerHello | None, bytes | None]:
        """The acceptor's side of the handshake: the dialer's PeerHello once it has proved it is the
        member it names, and this node's proof to send it (None without a secret); (None, None)
        when it is refused (as an intruder, or as a misconfigured member: logged), or went
        without a word."""
        tls, cert = link.certificate()
        clock = self.node.clock
        hs = PeerHandshake.acceptor(self.me, secret=self.secret, mtls=self.mtls, nonce=new_nonce(),
                                    members=self.addresses, host=host, permitted_nodes=self.permitted_nodes,
                                    permitted_as_set=self.node.config.permitted_nodes, now=clock.monotonic(),
                                    timeout=HANDSHAKE_TIMEOUT, tls=tls, cert=cert)
        try:
            done = await handshake.run(link, hs, clock)
        except ConnectionResetError:
            return None, None  # connected and went without a word (a port probe): nothing claimed, nothing refused
        finally:
            link.name = hs.claimed
        outcome = done.outcome
        if isinstance(outcome, Intruder):
            self._intruder(link, remote, link.name, outcome)
        elif isinstance(outcome, Refuse):
            link.refuse(outcome.why)
        elif isinstance(outcome, Accepted):
            return done.hello, outcome.proof
        return None, None

    def _tls_refused(self, remote: str, why: str) -> None:
        """A link to the peer port whose TLS handshake failed: an intruder that claimed no name."""
        self.refused.record("from", remote, "", Refusal.TLS, why)

    def _intruder(self, link: Link, remote: str, claimed: str, intruder: Intruder) -> None:
        """Refuse a link that failed authentication: log it, count it, keep it among the events."""
        self.refused.record("to" if link.proto.role is Role.CLIENT else "from", remote, claimed, intruder.reason,
                            intruder.why)
        link.fail_authentication()

    def _client_address(self) -> str:
        return self.node.client_address

    def _admit(self, link: Link, who: NodeIdentity, said: PeerHello | PeerWelcome) -> bool:
        if who.name not in self.addresses:  # (removed from the group while the link was made)
            link.refuse(f"{who.name} is not a member of this group")
            return False
        too_old = self.builds.check(who.name, said, PeerBuilds.protocol_of(said))  # (logged there)
        if too_old is not None:
            self.report(self.membership.handshake(who, self.node.clock.monotonic(), unsupported="its build's "
                                                  "feature levels do not fit the group's"))
            link.refuse(too_old)
            return False
        client_address = said.client_address
        mismatch = placement_mismatch(self.placement, said.placement, self.me.name, who.name)
        self.report(self.membership.handshake(who, self.node.clock.monotonic(), mismatch=mismatch))
        state = self.membership.state(who.name)
        if state in REFUSED:
            link.refuse(f"refused as {state.value}: " + (mismatch or f"check that {who.name} has its own "
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

    async def _serve(self, link: Link) -> None:
        clock = self.node.clock
        receiver = self.node.receiver
        owed = self.builds.owed(link.name, link.proto.version or 1)
        if owed is not None:
            link.send(owed)
        while True:
            frame = await link.next_frame()
            self.report(self.membership.heard(link.name, clock.monotonic()))
            if self.arbiter is not None:
                self.arbiter.heard(link.name, frame)
            if isinstance(frame, Replicate):
                receiver.receive(link.name, frame.payload)
            elif isinstance(frame, Heartbeat):
                if self.gossip:
                    self._heard_actives(link.name, frame.actives)
                if frame.ha_off != self.ha_off.get(link.name, ""):
                    self._peer_ha_off(link.name, frame.ha_off)
                self.builds.heard_level(link.name, frame.level)
            elif isinstance(frame, Forward):
                self.tasks.spawn(self.forwards.answer(link, frame), name=f"tandem-peer-forwarded-{link.name}")
            elif isinstance(frame, ForwardOk) or (isinstance(frame, Error) and frame.rid):
                self.forwards.answered(frame)
            elif isinstance(frame, PeerTypes):
                self.builds.heard_types(link.name, frame.definitions)
            elif isinstance(frame, Close):
                return

    # -- forwarded requests (location transparency: broker.peers.forwarding) ------------------------

    async def forward(self, name: str, request: ForwardRequest) -> bytes:
        """Ask member ``name`` to do ``request``; its reply, or the error it raised."""
        link = self.links.get(name)
        if link is None:
            raise UnavailableError(f"node {name} is active for this request but not connected to {self.me.name}")
        return await self.forwards.ask(link, request)

    def _drop(self, link: Link) -> None:
        link.close()
        admitted = self.links.get(link.name) is link  # one never admitted (or replaced) changes no member's state
        if admitted:
            del self.links[link.name]
        self.forwards.link_lost(link)
        if admitted:
            self.report(self.membership.link_lost(link.name))
            self._forget_actives(link.name)
