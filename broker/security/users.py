"""Users: SCRAM-SHA-256 credentials, roles, and the first admin.

Roles (:mod:`broker.security.acl`): ``admin`` may do everything; ``monitor`` may only look (list
queues, stream reads) and is refused anything that changes state; ``user`` may do what its
grants allow.

A user's record keeps what SCRAM needs and nothing that lets anyone log in
(:mod:`client.scram`): ``salt``, ``hash`` = StoredKey (32 bytes) + ServerKey (32
bytes), ``params`` = ``scram-sha-256:i=<iterations>``.  Records in the scrypt
format (``params`` ``scrypt:...``) hold a hash SCRAM cannot use: those users may
log in to the console (the password is checked there), and are refused on the
client port with a message saying how to set the password again.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
from pathlib import Path

from client import scram
from client.errors import AuthError, InvalidArgumentError
from storage.base import PutUser, UserRecord

log = logging.getLogger("tandem.broker")

ROLES = ("admin", "monitor", "user")
_SCRAM_PREFIX = "scram-sha-256:i="
_SCRYPT = {"n": 2**14, "r": 8, "p": 1}


def _scrypt(password: str, salt: bytes) -> bytes:
    return hashlib.scrypt(password.encode(), salt=salt, dklen=32, maxmem=64 * 1024 * 1024, **_SCRYPT)


def make_user(name: str, password: str, role: str, *, iterations: int = scram.DEFAULT_ITERATIONS) -> UserRecord:
    """A user record with fresh SCRAM credentials (one PBKDF2: run it off the event loop)."""
    if not name or len(name) > 128:
        raise InvalidArgumentError("user name must be 1..128 characters")
    if not name.isprintable():  # a newline or an escape sequence would end up in logs and terminals
        raise InvalidArgumentError(f"user name {name!r}: control characters, line or paragraph separators and other "
                                   f"non-printable characters are not allowed")
    if role not in ROLES:
        raise InvalidArgumentError(f"unknown role {role!r} (choose {', '.join(ROLES)})")
    if len(password) < 8:
        raise InvalidArgumentError("password must be at least 8 characters")
    try:
        creds = scram.make_credentials(password, iterations=iterations)
    except AuthError as exc:  # SASLprep refused a character
        raise InvalidArgumentError(exc.message) from None
    return UserRecord(name=name, salt=creds.salt, hash=creds.stored_key + creds.server_key, role=role,
                      params=f"{_SCRAM_PREFIX}{creds.iterations}")


def credentials(user: UserRecord) -> scram.Credentials | None:
    """The user's SCRAM credentials; None for a record in another format (scrypt)."""
    if not user.params.startswith(_SCRAM_PREFIX) or len(user.hash) != 64:
        return None
    try:
        iterations = int(user.params[len(_SCRAM_PREFIX):])
    except ValueError:
        return None
    return scram.Credentials(user.salt, iterations, user.hash[:32], user.hash[32:])


def legacy_refusal(name: str) -> AuthError:
    return AuthError(
        f"user {name!r} has a password stored in the scrypt format, which SCRAM-SHA-256 cannot check: "
        f"an admin sets it again (`tandem users passwd {name}`, or the console's admin API: "
        f"POST /api/v1/users/{name}/password), "
        f"then this user can log in; the console's own login still takes the old password")


class UserRegistry:
    """The users a node knows, and the SCRAM credentials of each.

    The console checks passwords (one PBKDF2, ~20 ms); a successful check is
    remembered as an HMAC of the password under a per-process key, so a console
    using Basic auth does not pay it per request (that HMAC cannot log anyone in).
    Changing or dropping a user forgets its entry.

    ``decoy_key`` (:func:`broker.security.secret.decoy_key`, which the node sets at start and hands to
    each registry it makes after) is what a name nobody has gets its SCRAM challenge from; a
    random one until then (a registry of a test or a tool).
    """

    def __init__(self, users: list[UserRecord], *, decoy_key: bytes | None = None) -> None:
        self._users = {u.name: u for u in users}
        self._verified: dict[str, bytes] = {}
        self._cache_key = secrets.token_bytes(32)
        self.decoy_key = decoy_key if decoy_key is not None else secrets.token_bytes(32)

    def replace(self, users: list[UserRecord]) -> None:
        """Hold exactly ``users`` from now on (a store opened or re-read); the decoy key stays."""
        self._users = {u.name: u for u in users}
        self._verified = {}

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

    def scram_credentials(self, name: str) -> tuple[UserRecord | None, scram.Credentials]:
        """The user and their credentials.  For a name nobody has, decoy credentials: salt
        and keys derived from the name under :attr:`decoy_key` (the group's: every member
        answers a name alike, across restarts), 16 bytes of salt and the default iteration
        count as a user made by :func:`make_user` has; the exchange runs and fails at the
        proof, as a wrong password does, so names cannot be probed.  AuthError for a user in
        the scrypt format."""
        user = self._users.get(name)
        if user is not None:
            creds = credentials(user)
            if creds is None:
                raise legacy_refusal(name)
            return user, creds
        mac = hmac.new(self.decoy_key, name.encode("utf-8", "surrogatepass"), "sha256").digest()
        keys = hmac.new(self.decoy_key, b"keys" + mac, "sha512").digest()
        return None, scram.Credentials(mac[:16], scram.DEFAULT_ITERATIONS, keys[:32], keys[32:])

    def _mac(self, password: str) -> bytes:
        return hmac.new(self._cache_key, password.encode("utf-8", "surrogatepass"), "sha256").digest()

    def check_cached(self, name: str, password: str) -> UserRecord | None:
        """The user if these credentials were verified before (cheap; on the loop)."""
        mac = self._verified.get(name)
        if mac is not None and hmac.compare_digest(mac, self._mac(password)):
            return self._users.get(name)
        return None

    def verify(self, name: str, password: str) -> UserRecord:
        """Check a password (the console; slow: run it off the event loop).  AuthError if wrong."""
        user = self._users.get(name)
        if user is None:
            # Work as for a real user, so timing does not reveal which names exist.
            _none, decoy = self.scram_credentials(name)
            scram.check_password(password, decoy)
            ok = False
        elif (creds := credentials(user)) is not None:
            ok = scram.check_password(password, creds)
        else:  # the scrypt format
            ok = hmac.compare_digest(_scrypt(password, user.salt), user.hash)
        if user is None or not ok:
            raise AuthError(f"authentication failed for user {name!r}: wrong user name or password")
        self._verified[name] = self._mac(password)
        return user


def bootstrap_admin(data_dir: Path) -> tuple[PutUser, str]:
    """The first start's admin user: password from TANDEM_ADMIN_PASSWORD, else random.

    A random password is written to ``<data_dir>/admin-password`` (mode 0600).
    Returns the op to store and a line for the log saying where the password is (never
    the password: a log is read by more people, and kept longer, than that file).
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
    return PutUser(make_user("admin", password, "admin")), f"random, written to {path} (mode 0600)"
