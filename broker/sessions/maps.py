"""Where each queue's partitions are active, and the sessions told MapChanged when that may change.

A durable connection sends straight to each partition's active: it asks the node for a queue's
partition map (:class:`client.protocol.frames.PartitionMap`) and is told
:class:`~client.protocol.frames.MapChanged` from then on, at most once per loop turn, whenever a
partition got or lost an active.  :class:`PartitionMaps` answers the map and keeps the watching
sessions; it is what :class:`broker.sessions.status.StatusRequests` reads as its ``maps``.

The node's settings, its replication and its peer links are made during the start: the maps read
them through the callables they are given, never a copy.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Protocol

from broker.config import NodeConfig
from broker.messaging.queues import Queue
from broker.security.acl import AclTable
from client.protocol.frames import Frame, MapChanged, PartitionMap

Key = tuple[int, int]


class Watcher(Protocol):
    """A session that asked for a map (broker.sessions.session.Session)."""

    def send(self, frame: Frame) -> None: ...


class Actives(Protocol):
    """The replication driver: who is each partition's active (None: a single node)."""

    def active_of(self, key: Key) -> str | None: ...


class ClientAddresses(Protocol):
    """The peer links: the address each other member's clients reach it at."""

    @property
    def client_addresses(self) -> Mapping[str, str]: ...


class PartitionMaps:
    """The partition maps this node answers, and the sessions it tells when they change.

    ``changed`` is called at each change before the sessions are told (the security seed,
    which waits for the catalogue's partition to get an active)."""

    def __init__(self, config: Callable[[], NodeConfig], *, queue: Callable[[str], Queue],
                 client_address: Callable[[], str], replication: Callable[[], Actives | None],
                 peers: Callable[[], ClientAddresses | None], has_quorum: Callable[[], bool], acls: AclTable,
                 changed: Callable[[], None]) -> None:
        self._config, self._queue, self._client_address = config, queue, client_address
        self._replication, self._peers, self._has_quorum = replication, peers, has_quorum
        self.acls = acls  # (who may see a queue's map)
        self._changed = changed
        self.watchers: set[Watcher] = set()  # sessions told MapChanged (they asked for a map)
        self._push_scheduled = False

    @property
    def has_quorum(self) -> bool:
        return self._has_quorum()

    def partition_map(self, name: str, session: Watcher | None = None) -> PartitionMap:
        """Where ``name``'s partitions are active, as this node knows it; ``session`` is
        told MapChanged from now on whenever that may have changed."""
        q = self._queue(name)
        me = self._config().name
        addresses = {me: self._client_address()}
        rep, peers = self._replication(), self._peers()
        if rep is None:
            actives = [me] * q.meta.partitions
        else:
            actives = [rep.active_of((q.meta.id, p)) or "" for p in range(q.meta.partitions)]
            if peers is not None:
                addresses.update((n, a) for n, a in peers.client_addresses.items() if a)
        if session is not None:
            self.watchers.add(session)
        return PartitionMap(q.info(), actives, addresses)

    def forget(self, session: Watcher) -> None:
        """``session`` ended: it is told nothing more."""
        self.watchers.discard(session)

    def map_changed(self) -> None:
        """A partition got or lost an active: tell the watching sessions, once per loop turn."""
        self._changed()
        if self._push_scheduled or not self.watchers:
            return
        self._push_scheduled = True
        asyncio.get_running_loop().call_soon(self._push)

    def _push(self) -> None:
        self._push_scheduled = False
        frame = MapChanged(node=self._config().name)
        for s in list(self.watchers):
            s.send(frame)
