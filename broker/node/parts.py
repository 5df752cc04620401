"""The node's parts in groups, and the views of it that the status, the metrics and the peer
links read.

* :class:`Console`: the management console the entry point attaches;
* :class:`HaParts`: what a started node has of HA (peer links, replication, shared mode, the
  arbiter's driver, discovery);
* :class:`PartitionOps`: the group's operations on members and partitions;
* :class:`Report`: the node about itself, as ``tandem status`` and the console read it
  (:class:`~broker.sessions.status.NodeReport`);
* :class:`Meters`: what the metrics count beside the state (``webconsole.nodeview.Meters``);
* :class:`PeerSide`: what the peer links need of their node (:class:`~broker.peers.host.PeerHost`).

Each reads the part that owns a value at the time it is asked: the parts change as the node
starts, joins a group and (in shared mode) takes the lock.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from broker.config import NodeConfig
from broker.messaging.message import MemoryBudget
from broker.messaging.queues import Queue
from broker.node.store import NodeStore
from broker.partitions.drain import Drains
from broker.partitions.members import GroupMembers
from broker.partitions.moves import Moves
from broker.partitions.quarantine import Quarantine
from broker.partitions.remap import Remaps
from broker.partitions.restore_run import Restores
from broker.partitions.topology import Topology
from broker.partitions.upgrade import FeatureLevels
from broker.partitions.unused import UnusedQueues
from broker.messaging.retention import Retention
from broker.transactions.service import Transactions
from broker.peers.host import NoReceiver, Receiving
from broker.peers.links import Link
from broker.sessions.status import HaReport, HasUrl, NodeEvent
from client.clock import Clock

if TYPE_CHECKING:
    from broker.messaging.catalogue import Catalogue
    from broker.messaging.delivery import Delivery
    from broker.messaging.publish import Publisher
    from broker.modes.replicated import Replication
    from broker.modes.shared.mode import SharedMode
    from broker.node.diskalarm import DiskAlarm
    from broker.node.options import RuntimeOptions
    from broker.peers.discovery import Discovery
    from broker.peers.peers import PeerManager
    from broker.node.holding import Holding
    from broker.node.placement import GroupPlacement


class Console(Protocol):
    """The management console the entry point attaches (``webconsole``)."""

    @property
    def url(self) -> str: ...

    async def start(self, host: str, port: int) -> None: ...

    async def stop(self) -> None: ...


class HaParts:
    """The HA parts a node has once started; None where it has none."""

    def __init__(self) -> None:
        self.peers: PeerManager | None = None  # the links to the other members
        self.replication: Replication | None = None  # the replicated logs (replicated mode)
        self.shared: SharedMode | None = None  # the lock and the group's database (shared mode)
        #: the HA arbiter's driver (shared mode, LockFile), for status, console and metrics
        self.arbiter: HaReport | None = None
        self.discovery: Discovery | None = None  # seeds and the gossip of member addresses


@dataclass
class PartitionOps:
    """The group's operations on its members and partitions, each run in the group."""

    group: GroupMembers  # the members (tandem group add / remove)
    drains: Drains  # members drained for maintenance (tandem node drain)
    moves: Moves  # partitions placed off the policy (tandem partition move)
    remaps: Remaps  # partitions added, messages re-mapped (tandem partition add / update)
    quarantine: Quarantine  # what a heal discards, kept (broker.partitions.quarantine)
    restores: Restores  # the quarantine merged back (tandem restore)
    levels: FeatureLevels  # the group's feature level (tandem upgrade finalize)
    unused: UnusedQueues  # queues deleted once unused for their expires
    retention: Retention  # streams' old chunks dropped (max_age, max_bytes)
    topology: Topology  # the exchanges and bindings (tandem exchange ...)
    transactions: Transactions  # coordinator and participant partitions served here, ends of transactions

    def timers(self) -> tuple[UnusedQueues, Retention, Transactions]:
        """The operations that run over time (the node runs each ``run()``)."""
        return self.unused, self.retention, self.transactions

    @classmethod
    def made(cls, svc: Any, config: NodeConfig, placing: GroupPlacement, holding: Holding, publisher: Publisher,
             delivery: Delivery) -> PartitionOps:
        """A node's operations, each handed the parts of the node it needs (``svc``: its
        :class:`~broker.node.services.Services`, which imports this module)."""
        moves = Moves(svc, placement=placing, spawn=svc.spawn)
        levels = FeatureLevels(svc, group=placing)
        return cls(group=GroupMembers.founded(svc, placing, moves, config), drains=Drains(svc, group=placing),
                   moves=moves, remaps=Remaps(svc, queues=placing, here=holding, publisher=publisher),
                   quarantine=Quarantine(holding),
                   restores=Restores(holding, group=holding, delivery=delivery, publisher=publisher),
                   levels=levels, unused=UnusedQueues(svc),
                   retention=Retention(lambda: svc.catalogue.queues, holding.serves, svc, svc.clock),
                   topology=Topology(svc, lambda: svc.catalogue.queues.keys(), levels,
                                     shared=lambda: svc.config.mode == "shared"),
                   transactions=Transactions(svc))


class Report:
    """The node about itself (:class:`~broker.sessions.status.NodeReport`)."""

    def __init__(self, config: Callable[[], NodeConfig], store: NodeStore, ha: HaParts, options: RuntimeOptions,
                 console: Callable[[], HasUrl | None]) -> None:
        self._config, self._store, self._ha, self._options, self._console = config, store, ha, options, console
        #: what this node has to say of itself in ``tandem status`` events (an unclean stop, a restore)
        self.node_events: list[NodeEvent] = []

    @property
    def config(self) -> NodeConfig:
        return self._config()

    @property
    def disk_alarm(self) -> DiskAlarm | None:
        return self._store.disk_alarm

    @property
    def store_stamp(self) -> str:
        return self._store.stamp

    @property
    def priority(self) -> int:
        return self._options.priority

    @property
    def console(self) -> HasUrl | None:
        return self._console()

    @property
    def peers(self) -> PeerManager | None:
        return self._ha.peers

    @property
    def replication(self) -> Replication | None:
        return self._ha.replication

    @property
    def ha(self) -> HaReport | None:
        return self._ha.arbiter


class Meters:
    """What the node counts for its metrics beside its state (``webconsole.nodeview.Meters``)."""

    def __init__(self, store: NodeStore, catalogue: Catalogue, publisher: Publisher) -> None:
        self._store, self._catalogue, self._publisher = store, catalogue, publisher

    @property
    def confirms(self) -> int:
        return self._publisher.confirms

    @property
    def engine(self) -> object:
        return self._store.engine

    @property
    def memory(self) -> MemoryBudget:
        return self._catalogue.budget

    @property
    def commit_observers(self) -> list[Callable[[float, bool], None]]:
        return self._store.commit_observers


NO_RECEIVER = NoReceiver()


class PeerSide:
    """What the peer links need of their node (:class:`~broker.peers.host.PeerHost`)."""

    def __init__(self, config: Callable[[], NodeConfig], clock: Clock, store: NodeStore, ha: HaParts, *,
                 catalogue: Catalogue,
                 delivery: Delivery, client_address: Callable[[], str],
                 handle_forward: Callable[[Link, int, bytes], Coroutine[Any, Any, bytes]],
                 link_lost: Callable[[Link], None], map_changed: Callable[[], None],
                 ha_disabled_changed: Callable[[], None]) -> None:
        self._config, self.clock, self._store, self._ha = config, clock, store, ha
        self._catalogue, self.delivery, self._client_address = catalogue, delivery, client_address
        self.handle_forward, self.link_lost, self.map_changed, self.ha_disabled_changed = \
            handle_forward, link_lost, map_changed, ha_disabled_changed

    @property
    def config(self) -> NodeConfig:
        return self._config()

    @property
    def store_stamp(self) -> str:
        return self._store.stamp

    def quorum_changed(self) -> None:
        if self._ha.replication is not None:
            self._ha.replication.quorum_changed()

    @property
    def receiver(self) -> Receiving:
        return self._ha.replication or NO_RECEIVER

    @property
    def client_address(self) -> str:
        return self._client_address()

    @property
    def queues(self) -> dict[str, Queue]:
        return self._catalogue.queues
