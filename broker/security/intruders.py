"""Refused peer links ("intruders"): the log lines, the counts and the recent events a node
keeps of them (:mod:`broker.peers.peers` refuses; ``tandem status``, the console and the metrics
show), and where a link comes from."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import socket
from collections import deque
from dataclasses import dataclass

from broker.logsafe import escape
from client.clock import Clock
from ha.peerauth import Refusal

log = logging.getLogger("tandem.ha")

#: intruder events a node keeps (the oldest go first)
MAX_EVENTS = 100
#: seconds between two log lines about refusals alike (same source host, name and reason);
#: each is still counted and kept among the events
LOG_EVERY = 10.0
#: refusals alike remembered for the rate limit (bounded, whatever names intruders make up)
MAX_REMEMBERED = 1000
_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


@dataclass(frozen=True, slots=True)
class IntruderEvent:
    """A refused peer link, as ``tandem status`` and the console show it (like an HA event)."""

    at: float  # clock.time()
    kind: str  # "intruder"
    partition: str  # where it came from: "host:port" (the field name HA events share)
    text: str


class IntruderLog:
    """What a node keeps of the links it refused."""

    def __init__(self, clock: Clock, me: str) -> None:
        self.clock, self.me = clock, me
        self.events: deque[IntruderEvent] = deque(maxlen=MAX_EVENTS)
        self.counts: dict[str, int] = {r.value: 0 for r in Refusal}
        #: (source host, claimed name, reason) -> (when last logged, refusals since, not logged)
        self._logged: dict[tuple[str, str, Refusal], tuple[float, int]] = {}

    def record(self, direction: str, remote: str, claimed: str, reason: Refusal, why: str) -> None:
        """A link ``direction`` ("from" or "to") ``remote`` claiming to be ``claimed`` was refused."""
        who = shown(claimed)
        now = self.clock.monotonic()
        if len(self._logged) > MAX_REMEMBERED:
            self._logged.clear()
        key = (remote.rpartition(":")[0], who, reason)
        last, quiet = self._logged.get(key, (-LOG_EVERY, 0))
        if now - last >= LOG_EVERY:
            more = f" ({quiet} more like it in the last {now - last:.0f} s, not logged)" if quiet else ""
            log.warning("intruder: peer link %s %s claiming to be %s refused (%s): %s%s", direction, remote, who,
                        reason.value, escape(why), more)
            self._logged[key] = (now, 0)
        else:
            self._logged[key] = (last, quiet + 1)
        self.counts[reason.value] += 1
        self.events.append(IntruderEvent(self.clock.time(), "intruder", remote,
                                         f"{self.me}: link claiming to be {who} refused ({reason.value}): {why}"))


def shown(claimed: str) -> str:
    """A name an intruder claimed, fit for a log line: as it is when it could be a node's name,
    else quoted and cut short (no control characters, no 60 KiB names)."""
    if not claimed:
        return "?"
    return claimed if _NODE_NAME.match(claimed) else repr(claimed[:40])


def remote_of(writer: asyncio.StreamWriter) -> tuple[str, str]:
    """(host, "host:port") of the other end of an accepted connection (an IPv4-mapped IPv6
    address as its IPv4 form)."""
    peer = writer.get_extra_info("peername")
    if not isinstance(peer, tuple) or len(peer) < 2:
        return "?", "?"
    host = str(peer[0])
    if host.startswith("::ffff:"):
        host = host[7:]
    return host, f"{host}:{peer[1]}"


async def resolve_permitted(specs: tuple[str, ...]) -> tuple[str, ...]:
    """``specs`` (permitted_nodes) and, for each NAME@HOST whose HOST is a host name,
    NAME@ADDRESS for each of its addresses (links are matched by their source address)."""
    out = list(specs)
    loop = asyncio.get_running_loop()
    for spec in specs:
        name, at, host = spec.partition("@")
        if not at:
            continue
        try:
            ipaddress.ip_address(host)
            continue
        except ValueError:
            pass
        try:
            infos = await loop.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except OSError as exc:
            log.warning("permitted_nodes: %s: cannot resolve %s (%s); only links from that literal address match",
                        spec, host, exc)
            continue
        out += sorted({f"{name}@{info[4][0]}" for info in infos})
    return tuple(out)
