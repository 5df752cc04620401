"""Shared mode's side of the store: one database for a group, and a lease on it.

In shared mode every node of a group uses one database (``database = URL``).  Only the
holder of the group's *lease* may write; each takeover increments an *activation epoch*
kept in the database, and an engine that has been :meth:`fenced <FencedEngine.fence>`
checks that epoch inside every write transaction: a node that lost the lease cannot commit
a single row, whatever it believes (``FencedError``).

:class:`Lease` is the lease row: taken, renewed and released on the database's own clock
(``now()``), never the nodes'.  With ``lock = "file:PATH"`` a file lock decides instead and
the winner :meth:`claims <Lease.claim>` the epoch it took beside the file, so fencing still
happens in the database.

This module is the contract the engines implement (:class:`SharedStore`: an engine and a
lease) and imports none of them; :func:`storage.shared_factory.open_shared` gives both for a
URL: ``postgresql+psycopg://USER@HOST:PORT/DB`` or ``sqlite:///PATH`` (nodes on one
machine).  Methods block; the broker calls them off the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from client.errors import StorageError
from storage.base import AclRecord, Engine, UserRecord


class FencedError(StorageError):
    """A write was refused: the database's activation epoch is not this node's."""

    permanent = True  # never retried (storage.writer): no later attempt under this epoch can succeed

    def __init__(self, message: str, *, epoch: int) -> None:
        super().__init__(message)
        self.epoch = epoch  # the epoch the database holds


@dataclass(frozen=True, slots=True)
class LeaseHolder:
    node: str | None  # None: released (or never taken)
    epoch: int
    address: str  # the holder's client address (host:port), for refusals that name it
    remaining: float  # seconds until the lease runs out, by the database's clock (<= 0: expired)


class Lease(Protocol):
    def acquire(self, node: str, address: str, lease: float) -> int | None:
        """Take the lease if it is released or expired (database clock): the new epoch
        (one above the last), or None while another node holds it."""
        ...

    def renew(self, node: str, epoch: int, lease: float) -> bool:
        """Extend the lease to ``now() + lease`` if ``node`` still holds it under ``epoch``."""
        ...

    def release(self, node: str, epoch: int) -> None:
        """Give the lease up at once (a clean stop), if still held under ``epoch``."""
        ...

    def claim(self, node: str, address: str, epoch: int) -> bool:
        """``lock = "file:..."``: the file lock was taken with ``epoch``; record it as the
        database's activation epoch unless a later one is there already."""
        ...

    def holder(self) -> LeaseHolder:
        ...

    def users(self) -> list[UserRecord]:
        """The group's users as the database holds them (a passive node checks the
        credentials of status requests with them); [] before the store is created."""
        ...

    def acls(self) -> list[AclRecord]:
        """The group's grants as the database holds them; [] before the store is created."""
        ...

    def close(self) -> None:
        ...


class FencedEngine(Engine, Protocol):
    def fence(self, epoch: int | None) -> None:
        """From now on every write transaction checks, inside the database, that the
        activation epoch is ``epoch`` and raises :class:`FencedError` if it is not
        (None: no check)."""
        ...


class SharedStore(Protocol):
    """One shared-mode database: the engine a node writes through while it holds the
    lease, and the lease itself."""

    def engine(self) -> FencedEngine: ...

    def lease(self) -> Lease: ...

