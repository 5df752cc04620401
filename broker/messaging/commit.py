"""The commit path: the one interface between the node's request handling and its HA mode.

Sessions, the publish path, delivery and the catalogue never ask which HA mode the node runs
in.  They propose a partition's write ops and learn, through a callback, when those ops are
committed (``None``) or refused (a :class:`~client.errors.TandemError` the client can act
on: ``NotActiveError`` when this node no longer serves the partition, ``UnavailableError``
without quorum); they ask which partitions this node serves and who serves the others.
docs/architecture.md ("The commit path") states the contract; three implementations exist:

* :class:`LocalCommitPath`: a node on its own.  It serves every partition; ops go to the
  store's group-commit writer, fsynced per the node's durability policy.
* ``broker.modes.replicated.Replication``: a replication group.  Per-partition logs with terms;
  ops commit once a quorum of the partition's voters has them; partitions are served by
  their elected active.

* ``broker.modes.shared.mode.SharedCommitPath``: a shared-mode group (one database).  The lease holder
  serves every partition and commits to the database through its store writer, each
  transaction fenced by its activation epoch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Protocol

from client.errors import NotActiveError
from storage.base import DurabilityPolicy, WriteOp
from storage.writer import Callback, GroupCommitWriter

#: A partition: (queue id, partition index).  The queue catalogue is the key ``(0, 0)``.
Key = tuple[int, int]
CATALOGUE: Key = (0, 0)


class CommitPath(Protocol):
    #: True when a change of the group's state (queues, users and grants, placements, members)
    #: is an entry of the catalogue's log: proposed by the catalogue's active
    #: (``wait_active(CATALOGUE)``) and applied by every member, each to a store of its own,
    #: once committed (a member may lag the log's active); each partition then has its own
    #: active, elected among its replicas, and its own node list.  False when one member serves
    #: every partition (a single node, shared mode's lock holder): ``propose_catalogue`` commits
    #: to the one store there is, whoever proposed it applies it, and a queue's depth is known here.
    catalogue_log: bool
    #: The durability a publish's confirm waits for.
    confirm_policy: DurabilityPolicy

    def serves_together(self, keys: Collection[Key]) -> bool:
        """Whether one commit here may change all of these partitions at once."""
        ...

    def moved(self, err: BaseException) -> bool:
        """Whether a commit refused with ``err`` may still commit at the partition's new
        active (the active changed under it): a resend with a producer id is safe there."""
        ...

    def serving(self, key: Key) -> bool:
        """Whether this node holds and may change the partition's messages now."""
        ...

    def active_of(self, key: Key) -> str | None:
        """The node serving the partition as this node knows it (None: nobody, e.g. electing)."""
        ...

    async def wait_active(self, key: Key, timeout: float) -> str:
        """The partition's active once there is one; UnavailableError after ``timeout``."""
        ...

    async def wait_change(self, timeout: float) -> None:
        """Until the set of served partitions or actives may have changed, or ``timeout``."""
        ...

    def propose(self, ops: list[WriteOp], callback: Callback | None, *, durable: bool = False,
                lazy: bool = False) -> None:
        """Commit partition ops; ``callback(err)`` once every one is committed, or the first error.

        ``durable``: a client waits for this commit (a publish): it is fsynced per policy and
        fails rather than being retried.  Otherwise the ops are bookkeeping (settlements,
        marks) retried until committed.  ``lazy``: no hurry, they may wait for the partition's
        next write (at most ``ack_linger``)."""
        ...

    def propose_catalogue(self, ops: list[WriteOp], callback: Callback) -> None:
        """Commit a change of the queue catalogue (declare, delete): ``ops`` as one entry."""
        ...


class LocalCommitPath:
    """A single node: every partition is served here, every commit is the store writer's."""

    catalogue_log = False

    def __init__(self, writer: GroupCommitWriter, node: str, *, policy: DurabilityPolicy) -> None:
        self.writer, self.node = writer, node
        self.confirm_policy, self.sync = policy, policy is DurabilityPolicy.SYNC

    def serving(self, key: Key) -> bool:
        return True

    def serves_together(self, keys: Collection[Key]) -> bool:
        return True

    def moved(self, err: BaseException) -> bool:
        return False

    def active_of(self, key: Key) -> str | None:
        return self.node

    async def wait_active(self, key: Key, timeout: float) -> str:
        return self.node

    async def wait_change(self, timeout: float) -> None:
        await asyncio.sleep(0)  # a single node's partitions never move

    def propose(self, ops: list[WriteOp], callback: Callback | None, *, durable: bool = False,
                lazy: bool = False) -> None:
        if durable:
            self.writer.submit(ops, sync=self.sync, callback=callback)
        else:
            self.writer.submit(ops, sync=False, callback=callback, retry=True, lazy=lazy)

    def propose_catalogue(self, ops: list[WriteOp], callback: Callback) -> None:
        self.writer.submit(ops, sync=True, callback=callback)


class ReplicatedLog(Protocol):
    """What :class:`ReplicatedCommitPath` uses of ``broker.modes.replicated.Replication``."""

    def serving(self, key: Key) -> bool: ...

    def active_of(self, key: Key) -> str | None: ...

    async def wait_active(self, key: Key, timeout: float) -> str: ...

    async def wait_change(self, timeout: float) -> None: ...

    def propose(self, ops: list[WriteOp], callback: Callback | None, *, lazy: bool = False) -> None: ...

    def propose_catalogue(self, ops: list[WriteOp], callback: Callback) -> None: ...


class ReplicatedCommitPath:
    """A replication group: partitions are served by their elected active, and every commit
    waits for a quorum of the partition's voters (so ``durable`` changes nothing, and a confirm
    waits for the quorum whatever the local policy)."""

    catalogue_log = True
    confirm_policy = DurabilityPolicy.SYNC

    def __init__(self, log: ReplicatedLog) -> None:
        self.log = log
        self.serving = log.serving
        self.active_of = log.active_of
        self.wait_active = log.wait_active
        self.wait_change = log.wait_change
        self.propose_catalogue = log.propose_catalogue

    def propose(self, ops: list[WriteOp], callback: Callback | None, *, durable: bool = False,
                lazy: bool = False) -> None:
        self.log.propose(ops, callback, lazy=lazy)

    def serves_together(self, keys: Collection[Key]) -> bool:
        """One partition at a time: each has its own log (and maybe its own active)."""
        return len(keys) <= 1 and all(self.serving(k) for k in keys)

    def moved(self, err: BaseException) -> bool:
        return isinstance(err, NotActiveError)
