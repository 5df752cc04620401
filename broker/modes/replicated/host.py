"""What replication needs from the node that hosts it: :class:`ReplicationHost`.

Replication receives this narrow view instead of the node itself, so that it imports
nothing of the node and the node can change behind it.  ``broker.node.node.Node`` satisfies
it structurally (mypy checks it where the node constructs :class:`Replication`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any, Protocol

from broker.config import NodeConfig
from client.clock import Clock
from client.protocol.frames import Replicate
from ha.members import Members
from ha.membership import Membership
from ha.placement import DistributionPolicy
from storage.base import Engine, PartitionState, QueueMeta, SetDrained, SetGroup, SetPlacement, SetUpdating, WriteOp

Callback = Callable[[BaseException | None], None]


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

    def foreign_active(self, key: tuple[int, int]) -> str | None:
        """The member serving ``key``, a partition this node holds no copy of, as its keep-alives
        say (broker.peers.foreign); None if unknown or not linked."""

    def foreign_term(self, key: tuple[int, int]) -> int:
        """The term that member serves ``key`` in (0: unknown)."""


class ReplicationHost(Protocol):
    """The node, as far as replication uses it."""

    @property
    def config(self) -> NodeConfig: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def engine(self) -> Engine:
        """The store: partitions are loaded from it (in a thread); ``log_pins``, where the
        engine has it, names the partitions that keep the log's oldest segment."""

    @property
    def writer(self) -> StoreWriter: ...

    @property
    def peers(self) -> PeerGroup | None: ...

    @property
    def queues(self) -> Mapping[str, QueueView]:
        """Every queue the node knows, by name."""

    def queue_by_id(self, queue_id: int) -> QueueView | None: ...

    def catalogue_put(self, meta: QueueMeta) -> bool:
        """A committed declare: True if the queue is new here (False: its name was taken)."""

    def catalogue_drop(self, queue_id: int) -> None:
        """A committed delete."""

    def security_apply(self, op: WriteOp) -> list[WriteOp]:
        """A committed change of the users or their grants; the ops to store."""

    def security_snapshot(self) -> dict[str, Any]:
        """The users, grants and drained members, for the catalogue's snapshot (codec: "users",
        "acls", "seeded", "drained")."""

    def security_install(self, data: dict[str, Any]) -> list[WriteOp]:
        """Replace the users, grants and drained members with a snapshot's; the ops to store."""

    def drain_apply(self, op: SetDrained) -> list[WriteOp]:
        """A committed drain or undrain (broker.partitions.drain); the ops to store."""

    @property
    def drained(self) -> frozenset[str]:
        """The group's members drained for maintenance (broker.partitions.drain)."""

    def move_apply(self, op: SetPlacement) -> list[WriteOp]:
        """A committed placement (broker.partitions.moves); the ops to store."""

    def placed(self, key: tuple[int, int]) -> tuple[str, ...] | None:
        """The node list a move placed partition ``key`` on (None: the policy's)."""

    @property
    def moving(self) -> Collection[tuple[int, int]]:
        """The partitions whose move is under way."""

    @property
    def static(self) -> Collection[tuple[int, int]]:
        """The partitions of queues declared with explicit node lists (``static``)."""

    async def move_finished(self, key: tuple[int, int], nodes: tuple[str, ...]) -> None:
        """This node, the partition's active, has its log's members on ``nodes``: end the move."""

    def placement(self) -> tuple[list[str], DistributionPolicy]:
        """The members partitions are placed on (sorted) and the distribution policy."""
        ...

    def quarantine_keep(self, key: tuple[int, int], term: int, first_index: int, entries: list[list[WriteOp]],
                        confirmed: int, written: Sequence[tuple[str, int]] = ()) -> int:
        """HA-1014 discarded these entries' ops (the first ``confirmed`` of them confirmed
        here; ``written``: who wrote each, in which term): keep their messages for the
        quarantine queue (broker.partitions.quarantine); how many."""
        ...

    def update_apply(self, op: SetUpdating) -> list[WriteOp]:
        """A committed start, step or end of a queue's update (broker.partitions.remap); the ops to store."""
        ...

    def group_apply(self, op: SetGroup) -> list[WriteOp]:
        """A committed change of the group's members (broker.partitions.members); the ops to store."""
        ...

    def catalogue_target(self) -> Members | None:
        """The members the catalogue's log is to have (None: as opened, the settings')."""

    @property
    def respreading(self) -> bool:
        """A change of the group's members is under way: partitions re-spread."""
        ...

    async def respread_step(self, settled: bool) -> None:
        """The catalogue's active: one round of the re-spread (``settled``: the catalogue's
        log has its members): more moves, or the change's end."""

    def load_budget(self) -> int:
        """Bytes of messages a partition loads when this node becomes its active (0: all)."""
        ...

    def partition_loaded(self, key: tuple[int, int], st: PartitionState) -> None:
        """This node now serves the partition: its state, loaded from the store."""

    def partition_unloaded(self, key: tuple[int, int]) -> None:
        """This node stops serving the partition: drop its in-memory state."""

    def map_changed(self) -> None:
        """A role or an active changed: clients that watch the partition map hear of it."""

    def write(self, ops: list[WriteOp], *, sync: bool) -> Awaitable[None]:
        """Commit ``ops`` (after everything submitted before them)."""

    async def stop(self) -> None:
        """Stop the node (replication calls it when its state may be inconsistent)."""
