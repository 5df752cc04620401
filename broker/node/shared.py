"""A shared-mode node: started passive, activated when it takes the group's lock (the store
opened under the lock's epoch, every queue loaded), deactivated when it loses it.

:class:`SharedNode` is what :class:`broker.modes.shared.mode.SharedMode` drives
(``SharedHost``); it changes the node's store and state in place, never replaces them, so
every part holding the catalogue, the users or the grants keeps seeing the node's own.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path
from typing import Protocol

from broker.config import NodeConfig
from broker.messaging.catalogue import Catalogue
from broker.messaging.delivery import Delivery
from broker.modes.shared.mode import SharedCommitPath, SharedMode
from broker.node.store import NodeStore
from broker.partitions.remap import Remaps
from broker.security.acl import AclTable
from broker.security.users import UserRegistry, bootstrap_admin
from client.clock import Clock
from client.errors import InvalidArgumentError, NotActiveError, ShuttingDownError, TandemError
from storage.base import AclRecord, Recovered, UserRecord
from storage.shared import SharedStore

log = logging.getLogger("tandem.broker")


class Closable(Protocol):
    """A client session, as activation sees it."""
    finished: asyncio.Event

    def shutdown(self, error: TandemError) -> None: ...


async def close_sessions(sessions: Collection[Closable], error: TandemError) -> None:
    """Close every session with ``error`` and wait until each has finished."""
    for s in list(sessions):
        s.shutdown(error)
    if sessions:
        await asyncio.gather(*(s.finished.wait() for s in list(sessions)))


def check_admin_password() -> None:
    """A bad TANDEM_ADMIN_PASSWORD stops the start now, not at the first activation (maybe
    much later)."""
    password = os.environ.get("TANDEM_ADMIN_PASSWORD")
    if password and len(password) < 8:
        raise InvalidArgumentError("TANDEM_ADMIN_PASSWORD: the password must be at least 8 characters")


async def seed_admin(users: UserRegistry, store: NodeStore, data_dir: Path) -> None:
    """The first admin of a store without users (its password from the environment or a file)."""
    if len(users):
        return
    op, how = await asyncio.to_thread(bootstrap_admin, data_dir)
    await store.write([op], sync=True)
    users.put(op.user)
    log.warning("created user admin: password %s", how)


class SharedNode:
    """The node's side of shared mode (``broker.modes.shared.mode.SharedHost``)."""

    def __init__(self, config: NodeConfig, clock: Clock, database: SharedStore, store: NodeStore, *,
                 catalogue: Catalogue, users: UserRegistry, acls: AclTable, delivery: Delivery, remaps: Remaps,
                 sessions: Collection[Closable], restore: Callable[[Recovered], None],
                 started: Callable[[], object], stopped: Callable[[], Awaitable[None]],
                 map_changed: Callable[[], None], client_address: Callable[[], str]) -> None:
        self.config, self.clock, self.database, self.store = config, clock, database, store
        self.catalogue, self.users, self.acls = catalogue, users, acls
        self.delivery, self.remaps, self.sessions = delivery, remaps, sessions
        self._restore, self._started, self._stopped = restore, started, stopped
        self.map_changed, self._client_address = map_changed, client_address
        self.mode: SharedMode | None = None

    @property
    def client_address(self) -> str:
        return self._client_address()

    async def activate_shared(self, epoch: int) -> None:
        """ACTIVATING: open the group's store fenced by ``epoch`` and load every queue.
        Messages delivered but not settled under the previous active are ready again, their
        delivery counts kept (counted once more if they may have been out with a consumer)."""
        if self.mode is None:
            raise ShuttingDownError(f"node {self.config.name} is not a started shared-mode node: nothing to activate")
        started = self.clock.monotonic()
        engine = self.database.engine()
        engine.fence(epoch)
        recovered = await self.store.open_engine(engine)
        self.store.commit = SharedCommitPath(self.store.writer, self.mode, policy=self.config.sync)
        self.catalogue.reset()
        self.users.replace([])
        self.acls.replace([])
        self._restore(recovered)
        await seed_admin(self.users, self.store, self.config.data_dir)
        total = sum(q.depth for q in self.catalogue.queues.values())
        log.warning("shared mode: %s activated under epoch %d in %.2f s: %d queue(s), %d message(s) loaded",
                    self.config.name, epoch, self.clock.monotonic() - started, len(self.catalogue.queues), total)
        for q in self.catalogue.queues.values():
            self.delivery.schedule(q)
        self._started()
        self.map_changed()

    def shared_active(self) -> None:
        self.remaps.start()  # (an update the previous lock holder had under way goes on here)

    def passive_users(self, users: list[UserRecord], acls: list[AclRecord] | None = None) -> None:
        """A passive: the group's users and grants as the database holds them."""
        if not self.store.open:
            self.users.replace(users)
            if acls is not None:
                self.acls.replace(acls)

    async def deactivate_shared(self, error: NotActiveError) -> None:
        """Stop serving (the lock is lost or this node stops): close every session with
        ``error``, forget the queues (the store has them) and close the store."""
        if not self.store.open:
            return
        self.store.open = False
        log.warning("shared mode: %s stops serving: %s", self.config.name, error.message)
        await close_sessions(self.sessions, error)
        self.catalogue.reset()  # (the users stay: a passive answers status requests)
        await self._stopped()  # the active's work: before the store closes
        await self.store.close()
        self.map_changed()


def node_stamp(data_dir: Path, now: float) -> str:
    """Shared mode: this node's own stamp (the store is the group's), kept in its data dir."""
    path = data_dir / "node-stamp"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        stamp = f"{int(now * 1000):x}-{secrets.token_hex(4)}"
        path.write_text(stamp + "\n")
        return stamp
