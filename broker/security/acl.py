"""Roles and per-queue permissions: who may do what to which queue.  Pure: no I/O.

A user has one role:

* ``admin``: everything, on every queue, and the group operations;
* ``monitor``: looks at everything (``browse`` on every queue, status), changes nothing;
* ``user``: nothing but what its grants allow.

A *grant* gives a user permissions on the queues whose names match a pattern (a glob:
``*`` any run of characters, ``?`` one character; ``orders.*``, ``*``).  Grants add to
the role's own rights (a monitor granted ``consume`` on ``audit`` may consume it).

Permissions:

* ``produce``: publish;
* ``consume``: subscribe and get (and settle what was delivered);
* ``browse``: read a stream by offset, look at a queue without consuming;
* ``configure``: declare, delete and purge;
* ``admin``: the group operations (users, grants, quorum override, options).  It is not
  about a queue, so it is granted on the pattern ``*`` only.

Any permission on a queue lets the user see it (in a queue list, its partition map).

Dead-lettering writes to another queue, so it is ``produce`` on that queue by the user who
declared the source (its owner, ``QueueMeta.owner``): checked when the queue is declared
(:meth:`AclTable.check_declare`) and again whenever a message is dead-lettered
(:meth:`AclTable.dead_letter_refusal`: grants and users change).  The queue names
``tandem.*`` (:data:`RESERVED_PREFIX`) are the node's own (``tandem.quarantine``): no client,
admin included, declares one or names one as a dead-letter queue.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from functools import lru_cache
from typing import Protocol

from client.errors import AccessRefusedError, InvalidArgumentError
from storage.base import AclRecord

PERMISSIONS = ("produce", "consume", "browse", "configure", "admin")
#: the pattern of every queue; the only one ``admin`` is granted on
EVERY_QUEUE = "*"
ROLE_RIGHTS: dict[str, frozenset[str]] = {
    "admin": frozenset(PERMISSIONS),
    "monitor": frozenset({"browse"}),
    "user": frozenset(),
}
MAX_PATTERN = 255
#: the names of the node's own queues (broker.partitions.quarantine's ``tandem.quarantine``)
RESERVED_PREFIX = "tandem."
_PATTERN_CHARS = re.compile(r"[A-Za-z0-9_.:@\-*?]+")  # a queue name's characters and the wildcards


class Principal(Protocol):
    """What the checks need of a user (``storage.base.UserRecord`` has it)."""

    @property
    def name(self) -> str: ...

    @property
    def role(self) -> str: ...


class Users(Protocol):
    """The group's users by name (``broker.security.users.UserRegistry``)."""

    def get(self, name: str) -> Principal | None: ...


def refuse_reserved(queue: str, what: str) -> None:
    """AccessRefusedError if ``queue`` is in the node's namespace (:data:`RESERVED_PREFIX`)."""
    if queue.startswith(RESERVED_PREFIX):
        raise AccessRefusedError(f"{what} {queue!r}: the queue names {RESERVED_PREFIX}* are reserved for the node "
                                 "(its own queues, such as tandem.quarantine)")


def validate_pattern(pattern: str) -> str:
    """``pattern`` if it is a queue name pattern (queue-name characters, ``*`` and ``?``)."""
    if not pattern or len(pattern) > MAX_PATTERN:
        raise InvalidArgumentError(f"queue pattern must be 1..{MAX_PATTERN} characters")
    if not _PATTERN_CHARS.fullmatch(pattern):
        raise InvalidArgumentError(f"queue pattern {pattern!r}: use a queue name's characters (A-Z a-z 0-9 "
                                   "_ . : - @) and the wildcards '*' and '?'")
    return pattern


def parse_permissions(items: str | Iterable[str]) -> tuple[str, ...]:
    """Permissions from ``"produce,consume"`` or a list, in :data:`PERMISSIONS` order;
    ``all`` stands for every one.  InvalidArgumentError names one that is unknown."""
    words = items.split(",") if isinstance(items, str) else list(items)
    chosen: set[str] = set()
    for w in words:
        w = w.strip().lower()
        if w == "all":
            chosen.update(PERMISSIONS)
        elif w in PERMISSIONS:
            chosen.add(w)
        elif w:
            raise InvalidArgumentError(f"unknown permission {w!r} (choose from {', '.join(PERMISSIONS)}, or all)")
    if not chosen:
        raise InvalidArgumentError(f"no permission given (choose from {', '.join(PERMISSIONS)}, or all)")
    return tuple(p for p in PERMISSIONS if p in chosen)


def validate_grant(user: str, pattern: str, permissions: str | Iterable[str]) -> AclRecord:
    """The grant as stored, checked: ``admin`` only on :data:`EVERY_QUEUE`."""
    if not user:
        raise InvalidArgumentError("a grant needs a user name")
    perms = parse_permissions(permissions)
    validate_pattern(pattern)
    if "admin" in perms and pattern != EVERY_QUEUE:
        raise InvalidArgumentError(f"'admin' is a group permission, not a queue's: grant it on '{EVERY_QUEUE}', "
                                   f"not {pattern!r}")
    return AclRecord(user=user, pattern=pattern, permissions=perms)


@lru_cache(maxsize=4096)
def matches(pattern: str, queue: str) -> bool:
    """Whether ``queue`` matches the glob ``pattern`` (case-sensitive, as queue names are)."""
    return fnmatch.fnmatchcase(queue, pattern)


class AclTable:
    """Every grant the group holds: user -> pattern -> permissions."""

    def __init__(self, records: Iterable[AclRecord] = ()) -> None:
        self._grants: dict[str, dict[str, frozenset[str]]] = {}
        for r in records:
            self.grant(r)

    def replace(self, records: Iterable[AclRecord]) -> None:
        """Hold exactly the grants of ``records`` from now on (a store opened or re-read)."""
        self._grants = {}
        for r in records:
            self.grant(r)

    def grant(self, acl: AclRecord) -> None:
        mine = self._grants.setdefault(acl.user, {})
        mine[acl.pattern] = mine.get(acl.pattern, frozenset()) | frozenset(acl.permissions)

    def revoke(self, acl: AclRecord) -> None:
        mine = self._grants.get(acl.user, {})
        left = mine.get(acl.pattern, frozenset()) - frozenset(acl.permissions)
        if left:
            mine[acl.pattern] = left
        else:
            mine.pop(acl.pattern, None)
            if not mine:
                self._grants.pop(acl.user, None)

    def drop_user(self, user: str) -> None:
        self._grants.pop(user, None)

    def records(self, user: str | None = None) -> list[AclRecord]:
        """The grants (of ``user``, or all), sorted by user and pattern."""
        users = [user] if user is not None else sorted(self._grants)
        return [AclRecord(user=u, pattern=p, permissions=tuple(x for x in PERMISSIONS if x in perms))
                for u in users for p, perms in sorted(self._grants.get(u, {}).items())]

    def permissions(self, who: Principal, queue: str) -> frozenset[str]:
        """What ``who`` may do to ``queue``: its role's rights and its matching grants."""
        rights = ROLE_RIGHTS.get(who.role, frozenset())
        for pattern, perms in self._grants.get(who.name, {}).items():
            if matches(pattern, queue):
                rights = rights | perms
        return rights

    def allows(self, who: Principal, permission: str, queue: str) -> bool:
        return permission in self.permissions(who, queue)

    def may_see(self, who: Principal, queue: str) -> bool:
        """Any permission on ``queue`` (it shows in the user's queue list)."""
        return bool(self.permissions(who, queue))

    def check(self, who: Principal, permission: str, queue: str) -> None:
        """AccessRefusedError unless ``who`` has ``permission`` on ``queue``."""
        if not self.allows(who, permission, queue):
            raise AccessRefusedError(f"access refused: user {who.name!r} (role {who.role}) has no {permission!r} "
                                     f"permission on queue {queue!r}")

    def check_declare(self, who: Principal, queue: str, dead_letter_queue: str | None,
                      dead_letter_exchange: str | None = None) -> None:
        """What a declare by ``who`` needs besides ``configure`` on ``queue``, on every front
        end (client sessions, the console): no queue of the node's namespace, and ``produce``
        on the dead-letter queue or exchange (its messages would go there in ``who``'s name)."""
        refuse_reserved(queue, "declare: queue")
        for field, kind, target in (("dead_letter_queue", "queue", dead_letter_queue),
                                    ("dead_letter_exchange", "exchange", dead_letter_exchange)):
            if target is None:
                continue
            refuse_reserved(target, f"declare: {field}")
            if not self.allows(who, "produce", target):
                raise AccessRefusedError(
                    f"access refused: user {who.name!r} (role {who.role}) has no 'produce' permission on {kind} "
                    f"{target!r}, needed to name it as the {field} of {queue!r}")

    def dead_letter_refusal(self, users: Users, owner: str | None, target: str) -> str | None:
        """Why a message of a queue declared by ``owner`` may not be dead-lettered into
        ``target`` now; None if it may.  A queue without an owner (the node's own, or one
        stored by a build that kept none) is held to the reserved names only."""
        if target.startswith(RESERVED_PREFIX):
            return f"not permitted: the queue names {RESERVED_PREFIX}* are reserved for the node"
        if owner is None:
            return None
        user = users.get(owner)
        if user is None:
            return f"not permitted: user {owner!r}, who declared the queue, no longer exists"
        if not self.allows(user, "produce", target):
            return f"not permitted: user {owner!r} has no 'produce' on {target}"
        return None

    def group_admin(self, who: Principal) -> bool:
        """Whether ``who`` may do the group operations (role admin, or ``admin`` granted)."""
        return "admin" in ROLE_RIGHTS.get(who.role, frozenset()) or \
            "admin" in self._grants.get(who.name, {}).get(EVERY_QUEUE, frozenset())

    def check_group(self, who: Principal, what: str) -> None:
        """AccessRefusedError unless ``who`` may do group operation ``what`` (``admin``)."""
        if not self.group_admin(who):
            raise AccessRefusedError(f"access refused: user {who.name!r} (role {who.role}) has no 'admin' "
                                     f"permission, needed to {what}")
