"""What the node's subsystems ask of it, in one place that is not the node.

The catalogue, security, the partition operations, the publish path, stream reads, client
sessions and the peer links each take a narrow Protocol of the node (``CatalogueHost``,
``PublishHost``, ``StreamHost``, ``SessionHost``, ``PeerHost``...).  :class:`Services`
answers them: each member hands the call to the part that owns it (the store, the catalogue,
the holding, the peer links, the replication driver, shared mode), so no subsystem holds the
:class:`~broker.node.node.Node` and the node keeps only wiring and lifecycle.

What it owns itself: whether this node may serve now (:meth:`refusal`,
:meth:`require_quorum`, :attr:`has_quorum`), and the calls into the group (:meth:`forward`
to a member, :meth:`applied` waiting for a committed catalogue change).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Coroutine, Mapping
from typing import TYPE_CHECKING, Any

from broker.config import NodeConfig
from broker.messaging.catalogue import Catalogue
from broker.messaging.commit import CommitPath
from broker.messaging.forward import ForwardRequest
from broker.messaging.queues import Queue, Recipient
from broker.node.parts import HaParts
from broker.node.store import NodeStore
from broker.node.tasks import TaskOwner
from broker.peers.links import Link
from broker.security.acl import AclTable
from broker.security.users import UserRegistry
from client.clock import Clock
from client.errors import InvalidArgumentError, NotActiveError, TandemError, UnavailableError
from client.protocol.frames import Declare, QueueInfo
from ha.membership import QuorumState
from storage.base import Engine, WriteOp
from storage.writer import Callback

if TYPE_CHECKING:
    from broker.messaging.delivery import Delivery
    from broker.messaging.publish import Delivering
    from broker.modes.replicated import Replication
    from broker.node.holding import Holding
    from broker.partitions.members import GroupMembers
    from broker.peers.peers import PeerManager
    from broker.sessions.session import Session


class Services:
    """The node as its subsystems call it (see the module docstring)."""

    def __init__(self, config: Callable[[], NodeConfig], clock: Clock, *, store: NodeStore, users: UserRegistry,
                 acls: AclTable, ha: HaParts, group: Callable[[], GroupMembers], sessions: Collection[Session],
                 tasks: TaskOwner, stopping: Callable[[], bool], client_address: Callable[[], str]) -> None:
        self._config, self.clock, self.store, self.users, self.acls = config, clock, store, users, acls
        self._ha, self._group, self.sessions, self._tasks, self._stopping = ha, group, sessions, tasks, stopping
        self._client_address = client_address
        #: one look at a producer's messages (broker.messaging.streams.produced) at a time: each reads a
        #: partition's store, and a client asking many at once waits for each in turn
        self.scans = asyncio.Semaphore(1)
        self._catalogue: Catalogue | None = None
        self._holding: Holding | None = None
        self._delivery: Delivery | None = None

    def bind(self, *, catalogue: Catalogue | None = None, holding: Holding | None = None,
             delivery: Delivery | None = None) -> None:
        """The parts made after this one (they take it)."""
        if catalogue is not None:
            self._catalogue = catalogue
        if holding is not None:
            self._holding = holding
        if delivery is not None:
            self._delivery = delivery

    # -- the parts' own members ---------------------------------------------------------------------

    @property
    def config(self) -> NodeConfig:
        return self._config()

    @property
    def client_address(self) -> str:
        """host:port clients reach this node at (``advertise``, else where it listens)."""
        return self._client_address()

    @property
    def group(self) -> GroupMembers:
        return self._group()

    @property
    def stopping(self) -> bool:
        return self._stopping()

    @property
    def commit(self) -> CommitPath:
        return self.store.commit

    @property
    def engine(self) -> Engine:
        return self.store.engine

    def write_later(self, ops: list[WriteOp], callback: Callback | None = None, *, lazy: bool = True) -> None:
        self.store.write_later(ops, callback, lazy=lazy)

    async def commit_ops(self, key: tuple[int, int], ops: list[WriteOp]) -> None:
        await self.store.commit_ops(key, ops)

    def check_disk(self, what: str) -> None:
        self.store.check_disk(what)

    async def served(self, queue: str) -> None:
        """Until each partition of ``queue`` has an active (a queue just declared: its first
        election), for at most the election wait; a queue gone or not served by then is left
        to the requests that use it."""
        try:
            q = self.catalogue.queue(queue)
            for p in range(q.meta.partitions):
                await self.commit.wait_active((q.meta.id, p), self.election_wait)
        except TandemError:
            return

    def alarmed(self) -> str | None:
        alarm = self.store.disk_alarm
        return alarm.describe() if alarm is not None and alarm.raised else None

    @property
    def catalogue(self) -> Catalogue:
        assert self._catalogue is not None, "bound by the node"
        return self._catalogue

    @property
    def queues(self) -> dict[str, Queue]:
        return self.catalogue.queues

    def queue(self, name: str) -> Queue:
        return self.catalogue.queue(name)

    @property
    def holding(self) -> Holding:
        assert self._holding is not None, "bound by the node"
        return self._holding

    @property
    def delivery(self) -> Delivering:
        assert self._delivery is not None, "bound by the node"
        return self._delivery

    @property
    def holders(self) -> Collection[Recipient]:
        return self.holding.holders

    def serves(self, q: Queue, pidx: int) -> bool:
        return self.holding.serves(q, pidx)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` as a task the node owns (broker/node/tasks.py): failures logged, ended by stop."""
        self._tasks.spawn(coro)

    # -- whether this node serves now -------------------------------------------------------------------

    @property
    def has_quorum(self) -> bool:
        """False while this group member has no node quorum (its partitions are Unavailable);
        in shared mode, while it does not hold the lock."""
        if self._ha.shared is not None:
            return self._ha.shared.serving()
        peers = self._ha.peers
        return peers is None or peers.membership.quorum_state is not QuorumState.DISABLED

    def refusal(self) -> NotActiveError | None:
        """Why this node serves no client now: a shared-mode node without the lock (or still
        loading the queues) names the active; None when it serves."""
        name, shared = self.config.name, self._ha.shared
        if self._ha.replication is not None and name not in self._group().members:
            return NotActiveError(f"node {name} is no longer a member of its group (tandem group "
                                  f"remove): connect to another member")
        if shared is None or (self.store.open and shared.serving()):
            return None
        return shared.not_active()

    def require_quorum(self, what: str) -> None:
        """Refuse ``what`` while this node has no node quorum: its partitions are Unavailable
        (in shared mode: while it does not hold the lock)."""
        shared, peers, cfg = self._ha.shared, self._ha.peers, self.config
        if shared is not None:
            if not shared.serving():
                raise shared.not_active(f"cannot {what}")
            return
        if peers is None:
            return
        m = peers.membership
        if m.quorum_state is QuorumState.DISABLED:
            zq = next((z for z in m.zone_quorums() if z.zone.name == m.disabled_by), None)
            if zq is not None:
                raise UnavailableError(
                    f"node {cfg.name} has no quorum in availability zone {zq.zone.name} ({zq.up_votes} of "
                    f"{zq.total_votes} votes up, policy {zq.zone.policy}): its HA services are off, cannot "
                    f"{what} here")
            up = 1 + len(m.up())
            raise UnavailableError(
                f"node {cfg.name} has no quorum ({up} of {1 + len(peers.addresses)} nodes up, policy "
                f"{cfg.quorum_policy}): partitions are Unavailable here, cannot {what}")

    # -- calls into the group --------------------------------------------------------------------------

    @property
    def election_wait(self) -> float:
        """How long a request waits for a partition to get an active."""
        return max(5.0, 4 * self.config.non_response_timeout)

    def _in_group(self) -> tuple[Replication, PeerManager]:
        """This node's replication and peer links (a group member has both)."""
        rep, peers = self._ha.replication, self._ha.peers
        if rep is None or peers is None:
            raise InvalidArgumentError("this node is not in a replication group")
        return rep, peers

    async def forward(self, who: str, request: ForwardRequest) -> bytes:
        """Ask member ``who`` to do ``request``; its reply, or the error it raised."""
        _rep, peers = self._in_group()
        return await peers.forward(who, request)

    async def ask(self, link: Link, request: ForwardRequest) -> bytes:
        """Ask the member at the other end of ``link`` (this very link: a relay is bound to it)."""
        _rep, peers = self._in_group()
        return await peers.forwards.ask(link, request)

    def links(self) -> Mapping[str, Link]:
        peers = self._ha.peers
        return peers.links if peers is not None else {}

    def placed(self, q: Queue) -> Collection[str]:
        rep = self._ha.replication
        if rep is None:
            return ()
        return {n for p in range(q.meta.partitions) for n in rep.placed((q.meta.id, p), q.meta.partitions).nodes}

    def actives(self, q: Queue) -> Collection[str]:
        rep = self._ha.replication
        if rep is None:
            return ()
        return [a for p in range(q.meta.partitions) if (a := rep.active_of((q.meta.id, p)))]

    async def declare(self, frame: Declare) -> tuple[QueueInfo, bool]:
        """Declare a queue of the node's own (``tandem.transactions``)."""
        return await self.catalogue.declare(frame)

    def require_level(self, level: int, what: str) -> None:
        self.catalogue.require_level(level, what)

    def catalogue_commit(self) -> int:
        """How far the catalogue's log is committed here (asked of the catalogue's active)."""
        rep, _peers = self._in_group()
        return rep.catalogue_commit()

    def catalogue_applied(self) -> int:
        rep = self._ha.replication
        return rep.catalogue_applied() if rep is not None else 0

    async def applied(self, what: str, done: Callable[[], bool]) -> None:
        """Until ``done()`` (a committed catalogue change applied here); UnavailableError after
        the election wait."""
        rep = self._ha.replication
        if rep is None or done():
            return
        try:
            async with self.clock.timeout(self.election_wait):
                while not done():
                    await rep.changed.wait()
        except TimeoutError:
            raise UnavailableError(f"{what}: the change is committed but not yet applied on "
                                   f"{self.config.name}: retry") from None
