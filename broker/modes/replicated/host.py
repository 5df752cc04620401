"""What replication needs from the node that hosts it: a few narrow Protocols.

Replication receives these views instead of the node itself, so that it imports nothing of
the node and the node can change behind it.  Each is satisfied structurally by the part of
the node that owns it (mypy checks it where the node constructs :class:`Replication`):

* the store: :class:`StoreWriter` (the group-commit writer) and ``storage.base.Engine``;
* the queues: :class:`Queues` (the catalogue) of :class:`QueueView`;
* the peer links: :class:`PeerGroup` of :class:`PeerLink`;
* the group's state that committed catalogue entries change: :class:`Placements` (the
  moves), :class:`Applier` (users and grants, drains, updates), :class:`Respread` (a
  change of the group's members), :class:`GroupState` (declares, deletes, the snapshot);
* what the node decides: :class:`GroupView` (the members, the policy, the drained);
* what replication tells the node: :class:`NodeEvents` (serving starts and stops, the
  partition map, a failure that stops the node) and :class:`Quarantine` (what HA-1014
  discards).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from broker.messaging.message import Msg
from broker.messaging.window import Window
from broker.peers.codec import Key
from client.protocol.frames import Replicate
from ha.members import Members
from ha.membership import Membership
from ha.placement import DistributionPolicy
from storage.base import PartitionState, QueueMeta, SetFeatureLevel, SetGroup, SetPlacement, WriteOp
from storage.topology import DropExchange, PutExchange, SetBinding

Callback = Callable[[BaseException | None], None]

OpT = TypeVar("OpT", contravariant=True)


class StoreWriter(Protocol):
    """The node's group-commit writer (storage.writer.GroupCommitWriter)."""

    def submit(self, ops: list[WriteOp], *, sync: bool, callback: Callback | None = None,
               lazy: bool = False) -> None: ...


class QueueView(Protocol):
    """A queue as replication sees it: its name and its catalogue record."""

    @property
    def name(self) -> str: ...

    @property
    def meta(self) -> QueueMeta: ...


class Queues(Protocol):
    """Every queue the node knows (broker.messaging.catalogue.Catalogue)."""

    @property
    def queues(self) -> Mapping[str, QueueView]:
        """By name."""

    def by_id(self, queue_id: int) -> QueueView | None: ...


class PeerLink(Protocol):
    def send(self, frame: Replicate) -> None: ...

    async def drain(self) -> None:
        """Until what is queued to send is down to the low-water mark (ConnectionError once
        the link is gone): a streamed snapshot sends its next part then."""


class PeerGroup(Protocol):
    """The node's peer links (broker.peers.peers.PeerManager): who is connected, and the
    group's quorum state."""

    @property
    def links(self) -> Mapping[str, PeerLink]: ...

    @property
    def membership(self) -> Membership: ...

    @property
    def ha_off(self) -> Mapping[str, str]:
        """The peers whose availability zones lost quorum (their HA services are off): peer -> zone."""

    @property
    def epoch(self) -> int:
        """The LockFile epoch this node's frames carry (0 without the LockFile arbiter)."""

    def foreign_active(self, key: Key) -> str | None:
        """The member serving ``key``, a partition this node holds no copy of, as its keep-alives
        say (broker.peers.foreign); None if unknown or not linked."""

    def foreign_term(self, key: Key) -> int:
        """The term that member serves ``key`` in (0: unknown)."""


class Placements(Protocol):
    """The partitions placed off the policy (broker.partitions.moves.Moves)."""

    @property
    def placed(self) -> Mapping[Key, tuple[str, ...]]:
        """The node list a move placed each such partition on (the others: the policy's)."""

    @property
    def moving(self) -> Collection[Key]:
        """The partitions whose move is under way."""

    @property
    def static(self) -> Collection[Key]:
        """The partitions of queues declared with explicit node lists (``static``)."""

    def apply(self, op: SetPlacement) -> list[WriteOp]:
        """A committed placement; the ops to store."""

    async def finished(self, key: Key, nodes: tuple[str, ...]) -> None:
        """This node, the partition's active, has its log's members on ``nodes``: end the move."""


class Applier(Protocol[OpT]):
    """A part of the group's state that committed catalogue ops of one kind change: the users
    and their grants (broker.security.security), the drained members (broker.partitions.drain),
    queues being updated (broker.partitions.remap)."""

    def apply(self, op: OpT) -> list[WriteOp]:
        """Apply a committed op here; the ops to store."""


class Respread(Protocol):
    """A change of the group's members (broker.partitions.members.GroupMembers)."""

    @property
    def respread(self) -> bool:
        """The change is under way: partitions re-spread."""

    async def step(self, settled: bool) -> None:
        """The catalogue's active: one round of the re-spread (``settled``: the catalogue's
        log has its members): more moves, or the change's end."""


class GroupState(Protocol):
    """The node's catalogue and group state as committed catalogue entries change them and
    the catalogue's snapshot carries them."""

    def catalogue_put(self, meta: QueueMeta) -> bool:
        """A committed declare: True if the queue is new here (False: its name was taken)."""

    def catalogue_drop(self, queue_id: int) -> None:
        """A committed delete."""

    def group_apply(self, op: SetGroup) -> list[WriteOp]:
        """A committed change of the group's members (broker.partitions.members); the ops to store."""

    def level_apply(self, op: SetFeatureLevel) -> list[WriteOp]:
        """A committed raise of the group's feature level (broker.partitions.upgrade); the ops to store."""

    def topology_apply(self, op: PutExchange | DropExchange | SetBinding) -> list[WriteOp]:
        """A committed change of the exchanges or bindings (broker.partitions.topology); the ops to store."""

    def security_snapshot(self) -> dict[str, Any]:
        """The users, grants, drained members, placements, updates and members, for the
        catalogue's snapshot (codec: "users", "acls", "seeded", "drained", ...)."""

    def security_install(self, data: dict[str, Any]) -> list[WriteOp]:
        """Replace all of those with a snapshot's; the ops to store."""


class GroupView(Protocol):
    """Where partitions go, as the node decides it."""

    def placement(self) -> tuple[list[str], DistributionPolicy]:
        """The members partitions are placed on (sorted) and the distribution policy."""

    @property
    def drained(self) -> frozenset[str]:
        """The group's members drained for maintenance, or leaving the group (they rank as drained)."""

    def catalogue_target(self) -> Members | None:
        """The members the catalogue's log is to have (None: as opened, the settings')."""


class Quarantine(Protocol):
    """Where HA-1014's discarded messages are kept (broker.partitions.quarantine)."""

    def keep(self, key: Key, term: int, first_index: int, entries: Sequence[list[WriteOp]],
             confirmed: int, written: Sequence[tuple[str, int]] = ()) -> int:
        """HA-1014 discarded these entries' ops (the first ``confirmed`` of them confirmed
        here; ``written``: who wrote each, in which term): keep their messages for the
        quarantine queue; how many."""


class NodeEvents(Protocol):
    """What replication tells the node: this node starts or stops serving a partition, an
    active changed, replication failed."""

    def load_budget(self, queue_id: int = 0) -> int:
        """Bytes of messages a partition of queue ``queue_id`` loads when this node becomes its
        active (0: all)."""

    def partition_loaded(self, key: Key, st: PartitionState, windows: Mapping[str, Window],
                         ready: list[Msg] | None = None) -> None:
        """This node now serves the partition: its state, loaded from the store (``ready``: its
        messages as the node holds them), and the producers' seqs it learned from the log
        (broker.messaging.sequences)."""

    def partition_unloaded(self, key: Key) -> None:
        """This node stops serving the partition: drop its in-memory state."""

    def map_changed(self) -> None:
        """A role or an active changed: clients that watch the partition map hear of it."""

    def replication_failed(self) -> None:
        """Replication's state may be inconsistent: the node stops.  The node runs that stop
        as a task of its own: the replication it stops neither owns nor cancels it."""
