"""Shared mode: the driver of :class:`ha.shared.SharedArbiter`, and its commit path.

Every node of a shared-mode group uses one database (``database = URL``); the holder of the
group's lock is ``ACTIVE`` for every partition and the others are ``PASSIVE``.  The lock is a
lease row in the database (``lock = "database"``: taken and renewed on the database's clock)
or a file lock (``lock = "file:PATH"``: held while the process lives, its epoch kept beside
the file and claimed in the database).  Either way the activation epoch lives in the
database and every write transaction checks it there (:mod:`storage.shared`): a node that
lost the lock cannot commit a single row.

:class:`SharedMode` runs one loop every ``lease / 4`` seconds:

* ``PASSIVE``: try the lock.  Refused: remember who holds it (clients are told where the
  active is).  Taken: ``ACTIVATING``: the node opens the store fenced by the new epoch and
  loads every queue; messages delivered but unsettled under the old active are ready again,
  their delivery counts kept; then ``ACTIVE``.
* ``ACTIVE``: renew the lock; a renewal refused, one not confirmed within the lease (the
  arbiter's local deadline, counted from when the renewal was *sent*), or a write the
  database fenced: back to ``PASSIVE`` at once.  The node closes every client session
  (``NotActive``, naming the new holder when known), drops what it had in memory and closes
  the store.

The driver is the node's :class:`broker.sessions.status.HaReport` (``tandem status``, console, metrics).
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from collections.abc import Collection
from typing import Protocol

import filelock

from broker.messaging.commit import Key
from client.clock import Clock
from client.errors import NotActiveError, StorageError
from ha.shared import SharedArbiter, SharedChanged, SharedState
from storage.base import AclRecord, DurabilityPolicy, UserRecord, WriteOp
from storage.shared import FencedError, Lease, LeaseHolder
from storage.writer import Callback, GroupCommitWriter

log = logging.getLogger("tandem.ha")

#: how often a passive node reads the group's users (seconds)
USERS_EVERY = 5.0


class SharedHost(Protocol):
    """What the driver needs of its node."""

    @property
    def client_address(self) -> str: ...

    async def activate_shared(self, epoch: int) -> None:
        """Open the store fenced by ``epoch`` and load every queue (ACTIVATING)."""
        ...

    async def deactivate_shared(self, error: NotActiveError) -> None:
        """Stop serving: close the sessions with ``error``, drop the queues, close the store."""
        ...

    def shared_active(self) -> None:
        """ACTIVE now: what waits for this node to serve (an update's sweeps) starts."""
        ...

    def map_changed(self) -> None: ...

    def passive_users(self, users: list[UserRecord], acls: list[AclRecord] | None = None) -> None:
        """The group's users and grants, read by a passive node (it answers status requests)."""
        ...


class _FileLock:
    """``lock = "file:PATH"``: the activation is the holder of a file lock (``filelock``);
    the epoch is kept in ``PATH.epoch`` and claimed in the database, so fencing stays there."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.epoch_path = self.path.with_name(self.path.name + ".epoch")
        self._lock = filelock.FileLock(str(self.path), timeout=0)

    def try_take(self) -> int | None:
        """Take the lock without waiting; the new epoch, or None if another process holds it."""
        try:
            self._lock.acquire(timeout=0)
        except filelock.Timeout:
            return None
        try:
            epoch = self._read_epoch() + 1
            tmp = self.epoch_path.with_name(self.epoch_path.name + ".tmp")
            with open(tmp, "w") as f:
                f.write(f"{epoch}\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.epoch_path)
            return epoch
        except BaseException:
            self._lock.release(force=True)
            raise

    def _read_epoch(self) -> int:
        try:
            return int(self.epoch_path.read_text().strip() or "0")
        except FileNotFoundError:
            return 0
        except ValueError:
            raise StorageError(f"lock epoch file {self.epoch_path} is damaged: remove it only when no node "
                               "of the group runs") from None

    @property
    def held(self) -> bool:
        return self._lock.is_locked and self.path.exists()

    def release(self) -> None:
        if self._lock.is_locked:
            self._lock.release(force=True)


class SharedMode:
    """One node's side of a shared-mode group; also its HaReport."""

    def __init__(self, node: SharedHost, lease: Lease, *, name: str, lease_seconds: float, lock: str,
                 clock: Clock) -> None:
        self.node = node
        self.name = name
        self.lease_store = lease
        self.clock = clock
        self.arbiter = SharedArbiter(name, lease=lease_seconds)
        self.interval = max(0.05, lease_seconds / 4)
        self.file_lock = _FileLock(lock.removeprefix("file:")) if lock.startswith("file:") else None
        self.holder = LeaseHolder(None, 0, "", 0.0)
        self._holder_read_at = 0.0
        self.renewals = 0
        self.fencing_refusals = 0
        self.changes = 0
        self.changed = asyncio.Event()  # set (and replaced) on every state change
        self._renewing: asyncio.Task[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._transition = asyncio.Lock()  # activation and deactivation never overlap
        self._users_read_at = -USERS_EVERY

    # -- HaReport ---------------------------------------------------------------------------

    @property
    def state(self) -> str:
        return self.arbiter.state.value

    @property
    def states(self) -> list[str]:
        return [s.value for s in SharedState]

    @property
    def epoch(self) -> int:
        return max(self.arbiter.epoch, self.holder.epoch)

    @property
    def lock_holder(self) -> str | None:
        if self.arbiter.state in (SharedState.ACTIVE, SharedState.ACTIVATING):
            return self.name
        # the lease as last read, counted down since (an expired holder is no hint)
        left = self.holder.remaining - (self.clock.monotonic() - self._holder_read_at)
        return self.holder.node if left > 0 else None

    # -- what the node asks -------------------------------------------------------------------

    def serving(self) -> bool:
        return self.arbiter.serving(self.clock.monotonic())

    def not_active(self, what: str = "") -> NotActiveError:
        """The refusal a client gets here: names the active (and its address) when known."""
        holder = self.lock_holder
        if holder == self.name and not self.serving():
            holder = None  # this node's own lease, lost
        where = f"{holder} ({self.holder.address})" if holder and holder != self.name and self.holder.address \
            else holder or "not known yet (a lease is running out or being taken)"
        state = self.arbiter.state.value
        hint = self.holder.address if holder and holder != self.name and self.holder.address else None
        return NotActiveError(f"node {self.name} is {state} in a shared-mode group{': ' + what if what else ''}; "
                              f"the active is {where}", active_hint=hint)

    def on_commit_error(self, err: BaseException | None) -> None:
        """Every commit's outcome passes here: a fenced write steps this node down."""
        if isinstance(err, FencedError):
            self.fencing_refusals += 1
            self._report(self.arbiter.fenced(err.epoch))

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="tandem-shared-mode")

    async def halt(self) -> None:
        """Stop taking and renewing the lock (the node is stopping); :meth:`release` follows."""
        for task in (self._task, self._renewing):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._task = self._renewing = None

    async def release(self) -> None:
        """After :meth:`halt` and once the node has closed the store: give the lock up, so
        the peer takes over at once instead of after the lease."""
        held = self.arbiter.state in (SharedState.ACTIVE, SharedState.ACTIVATING)
        epoch = self.arbiter.epoch
        self._report(self.arbiter.stop())
        if held:
            try:
                await asyncio.to_thread(self.lease_store.release, self.name, epoch)
                log.info("shared mode: %s released the lock (epoch %d)", self.name, epoch)
            except (StorageError, OSError) as exc:
                log.warning("shared mode: releasing the lock failed (%s): it runs out within %.1f s",
                            exc, self.arbiter.lease)
        if self.file_lock is not None:
            self.file_lock.release()
        await asyncio.to_thread(self.lease_store.close)

    async def _run(self) -> None:
        while True:
            try:
                await self._step()
            except asyncio.CancelledError:
                raise
            except Exception:  # the loop that keeps the lock must outlive any one failure
                log.exception("shared mode: step failed; trying again in %.2f s", self.interval)
            await self.clock.sleep(self.interval)

    async def _step(self) -> None:
        self._report(self.arbiter.tick(self.clock.monotonic()))
        if self.file_lock is not None and self.arbiter.state is SharedState.ACTIVE and not self.file_lock.held:
            self._report(self.arbiter.renewal_refused(f"lock file {self.file_lock.path} is gone"))
        if self.arbiter.state is SharedState.PASSIVE:
            await self._stand_down_if_serving()
            await self._try_lock()

    async def _try_lock(self) -> None:
        sent = self.clock.monotonic()
        try:
            if self.file_lock is not None:
                epoch = await asyncio.to_thread(self.file_lock.try_take)
                if epoch is not None and not await asyncio.to_thread(
                        self.lease_store.claim, self.name, self.node.client_address, epoch):
                    log.error("shared mode: lock file %s gave epoch %d, but the database holds a later one: "
                              "is another group using this database?", self.file_lock.path, epoch)
                    self.file_lock.release()
                    epoch = None
            else:
                epoch = await asyncio.to_thread(self.lease_store.acquire, self.name, self.node.client_address,
                                                self.arbiter.lease)
            if epoch is None:
                await self._refresh_holder()
                now = self.clock.monotonic()
                if now >= self._users_read_at + USERS_EVERY:
                    users = await asyncio.to_thread(self.lease_store.users)
                    acls = await asyncio.to_thread(self.lease_store.acls)
                    if users:  # none yet: the first active is still creating them; look again next time
                        self._users_read_at = now
                    self.node.passive_users(users, acls)
                return
        except (StorageError, OSError) as exc:
            log.warning("shared mode: trying the lock failed: %s", exc)
            return
        self._report(self.arbiter.lease_acquired(epoch, sent))
        self.holder = LeaseHolder(self.name, epoch, self.node.client_address, self.arbiter.lease)
        self._holder_read_at = sent
        self._renewing = asyncio.create_task(self._keep(), name="tandem-shared-renew")
        async with self._transition:
            try:
                await self.node.activate_shared(epoch)
            except Exception as exc:
                log.error("shared mode: activation under epoch %d failed: %s", epoch, exc)
                self._report(self.arbiter.renewal_refused(f"activation failed: {exc}"))
                await self.node.deactivate_shared(self.not_active())
                return
        if self.arbiter.state is SharedState.ACTIVATING:
            self._report(self.arbiter.activated())
            self.node.shared_active()
        else:
            await self._stand_down_if_serving()

    async def _refresh_holder(self) -> None:
        before = self.holder
        read_at = self.clock.monotonic()
        self.holder = await asyncio.to_thread(self.lease_store.holder)
        self._holder_read_at = read_at
        if (before.node, before.epoch) != (self.holder.node, self.holder.epoch):
            log.info("shared mode: the lock is held by %s (epoch %d, at %s)", self.holder.node or "nobody",
                     self.holder.epoch, self.holder.address or "-")
            self.node.map_changed()

    async def _keep(self) -> None:
        """Renew the lock every ``interval`` while this node holds it (also while it activates)."""
        try:
            while self.arbiter.state in (SharedState.ACTIVATING, SharedState.ACTIVE):
                await self.clock.sleep(self.interval)
                await self._renew()
        finally:
            self._renewing = None

    async def _renew(self) -> None:
        try:
            self.arbiter.renewal_sent(self.clock.monotonic())
            epoch = self.arbiter.epoch
            if self.file_lock is not None:
                h = await asyncio.to_thread(self.lease_store.holder)
                ok = self.file_lock.held and h.epoch == epoch
            else:
                ok = await asyncio.to_thread(self.lease_store.renew, self.name, epoch, self.arbiter.lease)
            if ok:
                self.arbiter.renewal_granted()
                self.renewals += 1
            else:
                self._report(self.arbiter.renewal_refused(f"the database says epoch {epoch} is no longer "
                                                          f"{self.name}'s"))
        except (StorageError, OSError) as exc:
            log.warning("shared mode: renewing the lock failed: %s (the lease runs out in %.2f s)", exc,
                        max(0.0, self.arbiter.deadline - self.clock.monotonic()))

    async def _stand_down_if_serving(self) -> None:
        """After the arbiter went PASSIVE: the node stops serving (once)."""
        async with self._transition:
            await self.node.deactivate_shared(self.not_active())
        if self.file_lock is not None:
            self.file_lock.release()

    def _report(self, changes: list[SharedChanged]) -> None:
        for c in changes:
            self.changes += 1
            level = logging.WARNING if c.previous is SharedState.ACTIVE or c.present is SharedState.ACTIVE \
                else logging.INFO
            log.log(level, "HA state %s -> %s (%s) node=%s epoch=%d", c.previous.value, c.present.value,
                    c.reason, c.node, c.epoch)
            self.changed.set()
            self.changed = asyncio.Event()
            self.node.map_changed()


class SharedCommitPath:
    """Shared mode's commit path: the lock holder serves every partition and writes through
    its store writer; every transaction is fenced by the activation epoch in the database."""

    catalogue_log = False

    def __init__(self, writer: GroupCommitWriter, mode: SharedMode, *, policy: DurabilityPolicy) -> None:
        self.writer, self.mode = writer, mode
        self.confirm_policy, self.sync = policy, policy is DurabilityPolicy.SYNC

    def serving(self, key: Key) -> bool:
        return self.mode.serving()

    def serves_together(self, keys: Collection[Key]) -> bool:
        return True

    def moved(self, err: BaseException) -> bool:
        return False

    def active_of(self, key: Key) -> str | None:
        return self.mode.lock_holder

    async def wait_active(self, key: Key, timeout: float) -> str:
        if self.mode.serving():
            return self.mode.name
        raise self.mode.not_active()

    async def wait_change(self, timeout: float) -> None:
        try:
            async with self.mode.clock.timeout(timeout):
                await self.mode.changed.wait()
        except TimeoutError:
            pass

    def _wrap(self, callback: Callback | None) -> Callback:
        def done(err: BaseException | None) -> None:
            self.mode.on_commit_error(err)
            if callback is not None:
                callback(err)
        return done

    def propose(self, ops: list[WriteOp], callback: Callback | None, *, durable: bool = False,
                lazy: bool = False) -> None:
        if not self.mode.serving():
            if callback is not None:
                callback(self.mode.not_active())
            return
        if durable:
            self.writer.submit(ops, sync=self.sync, callback=self._wrap(callback))
        else:
            self.writer.submit(ops, sync=False, callback=self._wrap(callback), retry=True, lazy=lazy)

    def propose_catalogue(self, ops: list[WriteOp], callback: Callback) -> None:
        if not self.mode.serving():
            callback(self.mode.not_active())
            return
        self.writer.submit(ops, sync=True, callback=self._wrap(callback))

