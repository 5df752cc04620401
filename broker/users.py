"""Users: salted scrypt password hashes, roles, and the first admin.

Roles (:mod:`broker.acl`): ``admin`` may do everything; ``monitor`` may only look (list
queues, stream reads) and is refused anything that changes state; ``user`` may do what its
grants allow.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
from pathlib import Path

from client.errors import AuthError, InvalidArgumentError
from storage.base import PutUser, UserRecord

log = logging.getLogger("tandem.broker")

ROLES = ("admin", "monitor", "user")
_SCRYPT = {"n": 2**14, "r": 8, "p": 1}
_PARAMS = "scrypt:n=16384,r=8,p=1"


def hash_password(password: str, salt: bytes) -> bytes:
    return hashlib.scrypt(password.encode(), salt=salt, dklen=32, maxmem=64 * 1024 * 1024, **_SCRYPT)


def make_user(name: str, password: str, role: str) -> UserRecord:
    if not name or len(name) > 128:
        raise InvalidArgumentError("user name must be 1..128 characters")
    if role not in ROLES:
        raise InvalidArgumentError(f"unknown role {role!r} (choose {', '.join(ROLES)})")
    if len(password) < 8:
        raise InvalidArgumentError("password must be at least 8 characters")
    salt = secrets.token_bytes(16)
    return UserRecord(name=name, salt=salt, hash=hash_password(password, salt), role=role, params=_PARAMS)


class UserRegistry:
    """The users a node knows, with a cache of verified credentials.

    scrypt is deliberately slow (~50 ms); a successful check is remembered as
    an HMAC of the password under a per-process key, so reconnecting clients
    do not pay it again.  Changing or dropping a user forgets its entry.
    """

    def __init__(self, users: list[UserRecord]) -> None:
        self._users = {u.name: u for u in users}
        self._verified: dict[str, bytes] = {}
        self._cache_key = secrets.token_bytes(32)

    def __len__(self) -> int:
        return len(self._users)

    def names(self) -> list[str]:
        return sorted(self._users)

    def get(self, name: str) -> UserRecord | None:
        return self._users.get(name)

    def put(self, user: UserRecord) -> None:
        self._users[user.name] = user
        self._verified.pop(user.name, None)

    def drop(self, name: str) -> None:
        self._users.pop(name, None)
        self._verified.pop(name, None)

    def _mac(self, password: str) -> bytes:
        return hmac.new(self._cache_key, password.encode(), "sha256").digest()

    def check_cached(self, name: str, password: str) -> UserRecord | None:
        """The user if these credentials were verified before (cheap; on the loop)."""
        mac = self._verified.get(name)
        if mac is not None and hmac.compare_digest(mac, self._mac(password)):
            return self._users.get(name)
        return None

    def verify(self, name: str, password: str) -> UserRecord:
        """Check credentials (slow: run it off the event loop).  AuthError if wrong."""
        user = self._users.get(name)
        # Hash even for an unknown user, so timing does not reveal which names exist.
        salt = user.salt if user else b"\0" * 16
        digest = hash_password(password, salt)
        if user is None or not hmac.compare_digest(digest, user.hash):
            raise AuthError(f"authentication failed for user {name!r}: wrong user name or password")
        self._verified[name] = self._mac(password)
        return user


def bootstrap_admin(data_dir: Path) -> tuple[PutUser, str]:
    """The first start's admin user: password from TANDEM_ADMIN_PASSWORD, else random.

    A random password is written to ``<data_dir>/admin-password`` (mode 0600).
    Returns the op to store and a line saying where the password came from.
    """
    password = os.environ.get("TANDEM_ADMIN_PASSWORD")
    if password:
        return PutUser(make_user("admin", password, "admin")), "from TANDEM_ADMIN_PASSWORD"
    password = secrets.token_urlsafe(18)
    path = data_dir / "admin-password"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(password + "\n")
    os.chmod(path, 0o600)
    return PutUser(make_user("admin", password, "admin")), f"random, written to {path} (password: {password})"
