"""Finding the group's members by seeds, and passing their addresses on (gossip).

Who is a member is the group's state, agreed through the catalogue's log (broker.partitions.members):
discovery never adds or removes one.  What it finds is *where* members are:

* **seeds** (``seeds``, ``--seed HOST:PORT``): members' peer ports, no names needed, a
  DNS name in front of several will do.  A node asks a seed for the members' addresses on a
  *discovery* link: the usual handshake, both ends proving the group secret (or their
  certificates) before anything is said, then the seed's ``PeerWelcome`` with the
  addresses it knows and a close; the seed admits no link and changes no member's state.
  It answers only a member (a node it does not count as one is refused in plain words, as
  on any link).  A node that ``join``s with seeds and no ``peers`` finds the group this
  way; any member asks the seeds for a member it has no address for.
* **gossip**: every ``PeerWelcome`` carries the acceptor's addresses, and a member that
  lacks the address of another asks the members it is linked to (``MembersFwd``) every
  :data:`ROUND` seconds until it has one.  A member added while the group runs is in the
  group's state with its address; a founding member's address is in the founders'
  settings only, so a member that joined later and names one founder learns the others'
  this way.

* **a member that moved** (a new host or peer port, the same name): the members whose names
  sort before its own dial it, at the address they have, where nothing answers now, and it
  dials none of them.  So a member with no link from one of those for :data:`ANNOUNCE`
  seconds makes a discovery link to it: its ``PeerHello`` says the port it takes peer links
  on, and the other, once the member proved its name (group secret or certificate), keeps
  that port with the link's source address.  It dials the member there, every other time,
  once nothing has answered at its own address twice in a row
  (:data:`broker.peers.links.MOVED_AFTER`), and keeps that address once a link is made there
  (logged).  An address where something answers, a proxy or a load balancer, is never
  replaced this way.

An address learned from a seed or by gossip never replaces one the settings or the group's
state give: it fills a gap.  One heard from a seed about itself is what it proved to be at the address
dialled; one heard from a member about a third is that member's word, and every member
proved the group secret.  A reply's entries are checked (``name=host:port``) and bounded
(:data:`MAX_ENTRIES`); a malformed one is ignored.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Protocol

from broker.config import ConfigError, NodeConfig, parse_peer, parse_seed
from broker.messaging.forward import MembersFwd, decode_reply
from client.clock import Clock
from client.errors import TandemError

log = logging.getLogger("tandem.ha")

#: seconds between two rounds of asking, while a member's address is missing
ROUND = 2.0
#: entries of one reply taken at most
MAX_ENTRIES = 256
#: seconds a member that dials this node may go without a link to it before this node says
#: where it is (a discovery link to it)
ANNOUNCE = 10.0

Address = tuple[str, int]


class Seeking(Protocol):
    """What discovery needs of the node's peer links (broker.peers.peers.PeerManager)."""

    @property
    def links(self) -> Mapping[str, object]: ...

    async def discover_at(self, host: str, port: int) -> tuple[str, list[str]] | str: ...

    def unlinked_dialers(self) -> list[tuple[str, Address]]: ...

    async def forward(self, name: str, request: MembersFwd) -> bytes: ...


class DiscoveryHost(Protocol):
    @property
    def config(self) -> NodeConfig: ...

    @property
    def clock(self) -> Clock: ...

    def missing_addresses(self) -> list[str]:
        """The members this node has no peer address for ("*": it knows none, a node that joins)."""
        ...

    def learn_addresses(self, found: dict[str, Address]) -> None:
        """Addresses found for members that had none here."""
        ...


def parse_book(entries: Iterable[object], me: str) -> dict[str, Address]:
    """The well-formed "name=host:port" entries (at most MAX_ENTRIES), this node's own left out."""
    out: dict[str, Address] = {}
    bad = 0
    for i, entry in enumerate(entries):
        if i >= MAX_ENTRIES:
            log.warning("member addresses: more than %d entries in one reply: the rest ignored", MAX_ENTRIES)
            break
        try:
            if not isinstance(entry, str):
                raise ConfigError("not a string")
            name, addr = parse_peer(entry)
        except ConfigError:
            bad += 1
            continue
        if name != me:
            out[name] = addr
    if bad:
        log.warning("member addresses: %d malformed entr%s ignored", bad, "y" if bad == 1 else "ies")
    return out


class Discovery:
    """Seeds and gossip for one node (a member of a replication group)."""

    def __init__(self, node: DiscoveryHost, peers: Seeking) -> None:
        self.node = node
        self.peers = peers
        self.seeds: list[Address] = [parse_seed(s) for s in node.config.seeds]
        self._said: dict[Address, str] = {}  # why each seed gave nothing, as last logged
        self._unlinked: dict[str, float] = {}  # member that dials this node -> when it was last told

    def heard(self, source: str, entries: list[str]) -> None:
        """A peer's PeerWelcome named these member addresses (``source``: its name)."""
        found = parse_book(entries, self.node.config.name)
        if found:
            self.node.learn_addresses(found)

    async def find_group(self) -> dict[str, Address]:
        """The members' addresses from the first seed that gives them (the seed's own
        included), asking every seed again each ROUND seconds until one does."""
        me = self.node.config.name
        while True:
            for host, port in self.seeds:
                got = await self.peers.discover_at(host, port)
                if isinstance(got, str):
                    self._nothing(host, port, got, "this node knows no member yet")
                    continue
                self._said.pop((host, port), None)
                seed, entries = got
                found = parse_book(entries, me)
                found.setdefault(seed, (host, port))
                log.info("seed %s:%d is %s: %d member address(es)", host, port, seed, len(found))
                return found
            await self.node.clock.sleep(ROUND)

    def _nothing(self, host: str, port: int, why: str, wanted: str) -> None:
        """Seed ``host:port`` gave nothing, for ``why``: said once, and again when it changes."""
        if self._said.get((host, port)) != why:
            self._said[(host, port)] = why
            log.warning("seed %s:%d gave no member addresses: %s; asking again every %.0f s while %s", host, port,
                        why, ROUND, wanted)

    async def run(self) -> None:
        """Ask, every ROUND seconds while an address is missing; runs until cancelled."""
        clock = self.node.clock
        while True:
            missing = self.node.missing_addresses()
            if missing:
                await self.round(missing)
            await self.announce()
            await clock.sleep(ROUND)

    async def announce(self) -> None:
        """A discovery link to each member that dials this node and has had no link to it for
        ANNOUNCE s: its PeerHello says where this node is, for a member that dials an address
        this node left."""
        now = self.node.clock.monotonic()
        unlinked = dict(self.peers.unlinked_dialers())
        for name in [n for n in self._unlinked if n not in unlinked]:
            del self._unlinked[name]  # (linked again: the wait starts afresh next time)
        for name, (host, port) in unlinked.items():
            since = self._unlinked.setdefault(name, now)
            if now - since >= ANNOUNCE:
                self._unlinked[name] = now
                got = await self.peers.discover_at(host, port)
                if isinstance(got, str):
                    log.debug("telling %s at %s:%d where this node is: %s", name, host, port, got)

    async def round(self, missing: list[str]) -> None:
        """Ask the linked members first (gossip), then the seeds, for what is missing."""
        me = self.node.config.name
        for name in list(self.peers.links):
            try:
                reply = decode_reply(await self.peers.forward(name, MembersFwd()))
            except TandemError as exc:
                log.debug("member addresses: %s did not answer: %s", name, exc.message)
                continue
            found = parse_book(reply if isinstance(reply, list) else [], me)
            if found:
                self.node.learn_addresses(found)
            missing = self.node.missing_addresses()
            if not missing:
                return
        for host, port in self.seeds:
            got = await self.peers.discover_at(host, port)
            if isinstance(got, str):
                self._nothing(host, port, got, f"the address of {', '.join(missing)} is missing")
                continue
            self._said.pop((host, port), None)
            seed, entries = got
            found = parse_book(entries, me)
            found.setdefault(seed, (host, port))  # (it proved to be ``seed`` at the address dialled)
            log.info("seed %s:%d is %s: %d member address(es)", host, port, seed, len(found))
            self.node.learn_addresses(found)
            missing = self.node.missing_addresses()
            if not missing:
                return
