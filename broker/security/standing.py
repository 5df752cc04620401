"""What a login rests on, and whether it still holds.  Pure: no I/O.

A session (a client connection or a console cookie) is opened for a user as the group knew
it at login: its password (the stored credentials), its role and its grants.  The session
stands while the group's state still gives the user at least that.  It ends when the user
is deleted, its password or role changes, or a grant it had is revoked (RabbitMQ closes a
user's connections on the same changes).  A grant added while the session is open is taken
into its standing, so revoking that grant later ends it too.

Every member applies the group's user changes (:mod:`broker.security.security`), so each member
checks its own sessions against its own copy: the client sessions when a change is applied
(and at each heartbeat), the console's at every request.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Protocol

from broker.security.acl import AclTable
from broker.security.users import UserRegistry


@dataclass(frozen=True, slots=True)
class Standing:
    """A user's standing in the group at one moment."""

    name: str
    role: str
    credentials: bytes  # a digest of the stored salt, keys and parameters: a new password changes it
    grants: frozenset[tuple[str, str]]  # (pattern, permission)


def standing_of(users: UserRegistry, acls: AclTable, name: str) -> Standing | None:
    """The user's standing as this member knows it; None for a user it does not have."""
    user = users.get(name)
    if user is None:
        return None
    digest = hashlib.sha256(b"%d:%b%b%b" % (len(user.salt), user.salt, user.hash, user.params.encode())).digest()
    grants = frozenset((a.pattern, p) for a in acls.records(name) for p in a.permissions)
    return Standing(name, user.role, digest, grants)


def lapsed(login: Standing, now: Standing | None) -> str | None:
    """Why a session opened with ``login`` no longer stands (None: it does)."""
    if now is None:
        return f"user {login.name!r} was deleted"
    if now.credentials != login.credentials:
        return f"the password of user {login.name!r} was changed"
    if now.role != login.role:
        return f"the role of user {login.name!r} was changed ({login.role} -> {now.role})"
    lost = login.grants - now.grants
    if lost:
        shown = ", ".join(f"{perm} on {pattern}" for pattern, perm in sorted(lost))
        return f"a grant of user {login.name!r} was revoked ({shown})"
    return None


class Standings(Protocol):
    """Where a session finds the group's users and grants (a node)."""

    @property
    def users(self) -> UserRegistry: ...

    @property
    def acls(self) -> AclTable: ...


def recheck(state: Standings, login: Standing) -> tuple[Standing | None, str | None]:
    """(the standing to keep, why the session ends): the session goes on with the first when
    the second is None."""
    now = standing_of(state.users, state.acls, login.name)
    why = lapsed(login, now)
    return (None, why) if why is not None else (now, None)
