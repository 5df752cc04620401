"""What the peer links need from the node that runs them (:class:`PeerHost`: a data node or a
witness) and from the LockFile arbiter (:class:`PeerArbiter`)."""

from __future__ import annotations

import logging
from typing import Protocol

from broker.config import NodeConfig
from broker.messaging.queues import Queue
from broker.peers.links import Link
from client.clock import Clock
from client.protocol.frames import Frame, Heartbeat

log = logging.getLogger("tandem.ha")


class Receiving(Protocol):
    def receive(self, src: str, payload: bytes) -> None: ...

    def served(self) -> list[tuple[tuple[int, int], int]]:
        """(key, term) of every queue partition this node serves (broker.peers.foreign)."""

    def holds(self, key: tuple[int, int]) -> bool:
        """Whether this node has a copy (a log) of partition ``key``."""


class NoReceiver:
    """The receiver of a member that keeps no replicated logs (shared mode): it serves and
    holds no partition, and a replication frame sent to it is dropped."""

    def receive(self, src: str, payload: bytes) -> None:
        log.debug("replication frame from %s dropped: this node keeps no replicated logs", src)

    def served(self) -> list[tuple[tuple[int, int], int]]:
        return []

    def holds(self, key: tuple[int, int]) -> bool:
        return False


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
    @property
    def config(self) -> NodeConfig: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def store_stamp(self) -> str: ...

    @property
    def receiver(self) -> Receiving:
        """What takes the replication frames peers send (the replication driver, a witness;
        :class:`NoReceiver` on a member without replicated logs)."""

    @property
    def client_address(self) -> str: ...

    @property
    def queues(self) -> dict[str, Queue]: ...

    @property
    def delivery(self) -> Dispatching: ...

    async def handle_forward(self, link: Link, kind: int, payload: bytes) -> bytes:
        """Do a request the member at the other end of ``link`` forwarded; the reply's payload."""

    def link_lost(self, link: Link) -> None:
        """``link`` ended: what was bound to it (the relays of broker.sessions.relay) ends too."""

    def map_changed(self) -> None:
        """A partition got or lost an active, as far as this node knows: tell the sessions."""

    def quorum_changed(self) -> None:
        """The node quorum changed: a node without it knows no active, so what waits for one
        (a publish forwarded to a partition's active) looks again."""

    def ha_disabled_changed(self) -> None:
        """An availability zone's quorum took this node's HA services off, or gave them back
        (``PeerManager.zone_disabled``): every log takes it at once."""
