"""Dialing: one task per member this node dials (the member whose name sorts first dials),
which connects, hands the connection to the peer manager, and dials again when the link ends;
and where each member is dialled.

A dial gives up after :func:`broker.peers.links.connect_timeout` (a packet filter that drops
packets leaves a connect hanging in SYN retransmissions) and is retried every
``keepalive_interval`` while the peer is a member gone ``Down``, so a healed node sees its
peers ``Up`` within about a second, however long the cut; else with a backoff up to
REDIAL_MAX.  A member is dialled at the address the settings (or the group's state) give;
once nothing answers there MOVED_AFTER times in a row, also where it said it is (``said``,
from a link it proved), and there from then on once a link is made there (``moved``).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import ssl
from collections.abc import Awaitable, Callable

from broker.config import NodeConfig
from broker.peers.links import MOVED_AFTER, REDIAL_MAX, LinkTasks, host_port
from broker.peers.transport import PeerTransport
from client.clock import Clock
from ha.membership import RemoteState

log = logging.getLogger("tandem.ha")

Address = tuple[str, int]
#: the peer manager's side of a dial: (member, reader, writer, the address dialled) -> whether
#: the link was admitted (it returns once the link has ended)
LinkOut = Callable[[str, asyncio.StreamReader, asyncio.StreamWriter, Address], Awaitable[bool]]


class Dialing:
    """The dialers of one node.  ``addresses``: every other member's peer address, the peer
    manager's (read here, and changed where a member is found to have moved); ``state``: a
    member's state (``Membership.state``); ``tasks``: the owner of the dialers' tasks (the peer
    manager's, which ends them at its stop); ``transport``: what a dial goes through
    (:mod:`broker.peers.transport`); ``authenticated``: links prove names (a group
    secret or mutual TLS), so what a peer says of itself may be believed."""

    def __init__(self, me: str, addresses: dict[str, Address], config: NodeConfig, clock: Clock,
                 state: Callable[[str], RemoteState], tasks: LinkTasks, link_out: LinkOut,
                 transport: PeerTransport, *, authenticated: bool) -> None:
        self.me, self.addresses, self.config, self.clock = me, addresses, config, clock
        self.state, self.tasks, self.link_out, self.transport = state, tasks, link_out, transport
        self.authenticated = authenticated
        self._dialers: dict[str, asyncio.Task[None]] = {}  # member -> the task that keeps a link to it
        #: member -> where it says it takes peer links (its own word, on a link it proved), when
        #: that is not the address this node has: dialled there once nothing answers at this one
        self.said: dict[str, Address] = {}
        #: member -> (the address the settings or the group's state give, the one it moved to and
        #: a link was made at): kept when the members are set again
        self.moved: dict[str, tuple[Address, Address]] = {}

    # -- the tasks --------------------------------------------------------------------------------

    def dial(self, name: str) -> None:
        """Keep a link to ``name`` if this node is the one that dials it (the lower name dials)."""
        if self.me < name and name not in self._dialers:
            self._dialers[name] = self.tasks.spawn(self._dial_forever(name), name=f"tandem-peer-dial-{name}")

    def stop_dialing(self, name: str) -> None:
        """No more dials of ``name`` (its task is cancelled; the task owner sees it end)."""
        dialer = self._dialers.pop(name, None)
        if dialer is not None:
            dialer.cancel()

    async def stop(self) -> None:
        """Every dialer cancelled, and ended."""
        dialers = list(self._dialers.values())
        self._dialers.clear()
        for t in dialers:
            t.cancel()
        await asyncio.gather(*dialers, return_exceptions=True)

    # -- where a member is --------------------------------------------------------------------------

    def given(self, name: str, addr: Address) -> Address:
        """The address to dial ``name`` at when the members are set with ``addr`` for it: where it
        was found instead, if it moved from ``addr``."""
        moved = self.moved.get(name)
        if moved is None:
            return addr
        if moved[0] == addr:
            return moved[1]  # (it moved from the address given: it is where it was found)
        del self.moved[name]  # (the group's state gives another: that one)
        return addr

    def forget(self, name: str) -> None:
        """``name`` is no longer a member."""
        self.said.pop(name, None)
        self.moved.pop(name, None)

    def target(self, name: str, silent: int) -> Address:
        """Where to dial ``name`` next: its address here, or, once nothing has answered there
        MOVED_AFTER times in a row, every other time where it said it is (``said``)."""
        addr = self.addresses[name]
        said = self.said.get(name)
        if said is not None and said != addr and silent >= MOVED_AFTER and silent % 2 == 0:
            return said
        return addr

    def found_at(self, name: str, addr: Address) -> None:
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

    def heard_self(self, name: str, host: str, peer_port: int) -> None:
        """Member ``name`` proved itself on a link from ``host``, saying it takes peer links on
        ``peer_port``: kept in ``said`` where that is not the address this node has for it."""
        if not peer_port or name not in self.addresses or not self.authenticated:
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

    # -- the dial loop ------------------------------------------------------------------------------

    def _redial_max(self, name: str) -> float:
        """The longest wait between dials of ``name``: a keep-alive interval while it is a member
        gone Down (it is expected back, and a healed link must come back at once), else REDIAL_MAX."""
        if self.state(name) is RemoteState.DOWN:
            return self.config.keepalive_interval
        return REDIAL_MAX

    async def _dial_forever(self, name: str) -> None:
        backoff = self.config.keepalive_interval
        tls_failure = ""
        silent = 0  # dials in a row that nothing answered (no listener, no route, no answer in time)
        while name in self.addresses:  # (no longer a member: tandem group remove)
            host, port = target = self.target(name, silent)
            try:
                reader, writer = await self.transport.connect(self.config, self.clock, host, port)
            except (OSError, asyncio.TimeoutError) as exc:
                if isinstance(exc, ssl.SSLError):
                    silent = 0  # (something answers there)
                    if str(exc) != tls_failure:
                        tls_failure = str(exc)  # logged once until it changes: the dialer retries every 2 s
                        log.warning("peer link to %s at %s:%d: TLS handshake failed: %s", name, host, port,
                                    exc.reason or exc)
                else:
                    silent += 1
                await self.clock.sleep(backoff)
                backoff = min(backoff * 2, self._redial_max(name))
                continue
            silent = 0
            if await self.link_out(name, reader, writer, target):
                backoff = self.config.keepalive_interval  # a link made: quick to redial
            if name not in self.addresses:
                return  # no longer a member (tandem group remove): not dialled again
            await self.clock.sleep(backoff)
            backoff = min(backoff * 2, self._redial_max(name))  # refused, or the link ended: less and less often
