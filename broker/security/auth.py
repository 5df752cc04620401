"""Client authentication and the limits against abuse on the client port.

:class:`ClientHandshake` is one session's SCRAM-SHA-256 exchange on the node's
side (Hello -> AuthChallenge, AuthResponse -> Welcome's server signature); it does
no I/O.  :class:`ClientGuard` is the node's: the failed-login throttle per client
address, the count of connections per user, and the counters the metrics show.

Failed logins: after ``max_failed_logins`` failures from one address (each
within :data:`FAILURE_WINDOW` of the one before), the address must wait before
its next attempt: 1 s, then 2, 4, ... up to :data:`MAX_BACKOFF` after each
further failure.  An attempt inside the wait is refused at once with
LOGIN_THROTTLED (its password is not even looked at).  A successful login clears
the address.  The table keeps at most :data:`MAX_TRACKED` addresses (the least
recently failing go first), so many addresses cannot grow it without bound.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from broker.config import NodeConfig
from broker.logsafe import escape
from broker.security.users import UserRegistry
from client import scram
from client.clock import Clock
from client.errors import (AuthError, LoginThrottledError, PrefetchTooLargeError, TooManyConnectionsError,
                           UnavailableError)
from client.protocol.frames import AuthChallenge, AuthResponse, Hello
from storage.base import UserRecord

log = logging.getLogger("tandem.broker")

FAILURE_WINDOW = 300.0  # seconds: failures further apart than this start the count again
BASE_BACKOFF = 1.0
MAX_BACKOFF = 30.0
MAX_TRACKED = 10_000

W = TypeVar("W", bound="Waiting")


@dataclass(slots=True)
class _Failures:
    count: int
    last: float
    retry_at: float


class LoginThrottle:
    """Failed logins per client address, with exponential backoff (pure: the caller passes
    the time)."""

    def __init__(self, max_failures: int, *, window: float = FAILURE_WINDOW, base: float = BASE_BACKOFF,
                 cap: float = MAX_BACKOFF, max_tracked: int = MAX_TRACKED) -> None:
        self.max_failures, self.window, self.base, self.cap = max_failures, window, base, cap
        self.max_tracked = max_tracked
        self._by_addr: OrderedDict[str, _Failures] = OrderedDict()  # least recently failing first

    def __len__(self) -> int:
        return len(self._by_addr)

    def wait(self, addr: str, now: float) -> float:
        """Seconds ``addr`` must still wait before its next login (0: it may try now)."""
        f = self._by_addr.get(addr)
        if f is None:
            return 0.0
        if now - f.last > self.window:
            del self._by_addr[addr]
            return 0.0
        return max(0.0, f.retry_at - now)

    def failed(self, addr: str, now: float) -> float:
        """Count a failure; the wait it imposes (0 below the limit)."""
        f = self._by_addr.pop(addr, None)
        if f is None or now - f.last > self.window:
            f = _Failures(0, now, now)
        f.count += 1
        f.last = now
        over = f.count - self.max_failures
        delay = min(self.cap, self.base * 2 ** min(over, 30)) if over >= 0 else 0.0
        f.retry_at = now + delay
        self._by_addr[addr] = f
        self._trim(now)
        return delay

    def succeeded(self, addr: str) -> None:
        self._by_addr.pop(addr, None)

    def _trim(self, now: float) -> None:
        while self._by_addr:
            addr, oldest = next(iter(self._by_addr.items()))
            if len(self._by_addr) <= self.max_tracked and now - oldest.last <= self.window:
                return
            del self._by_addr[addr]


@dataclass(slots=True)
class GuardCounters:
    """What the guard refused, since the node started (Prometheus counters)."""

    auth_failures: int = 0  # logins refused: wrong password, unknown user, bad SCRAM exchange
    logins_throttled: int = 0  # logins refused unheard: too many failures from the address
    connections_refused: int = 0  # logins refused: the user holds max_connections_per_user
    prefetch_refused: int = 0  # subscriptions refused: prefetch above max_prefetch


class ClientGuard:
    """The node's limits on its client port."""

    def __init__(self, config: NodeConfig, clock: Clock) -> None:
        self.config, self.clock = config, clock
        self.throttle = LoginThrottle(config.max_failed_logins)
        self.connections: Counter[str] = Counter()  # user -> open sessions
        self.counters = GuardCounters()

    def check_throttle(self, addr: str) -> None:
        wait = self.throttle.wait(addr, self.clock.monotonic())
        if wait > 0:
            self.counters.logins_throttled += 1
            raise LoginThrottledError(
                f"too many failed logins from {addr}: try again in {wait:.1f}s")

    def login_failed(self, addr: str, user: str, reason: str) -> None:
        self.counters.auth_failures += 1
        delay = self.throttle.failed(addr, self.clock.monotonic())
        log.warning("authentication failed address=%s user=%s reason=%s%s", addr, escape(user), reason,
                    f" next_attempt_in={delay:.0f}s" if delay else "")

    def login_succeeded(self, addr: str) -> None:
        self.throttle.succeeded(addr)

    def admit(self, user: str) -> None:
        """Count a new session of ``user``; TooManyConnectionsError at the limit."""
        limit = self.config.max_connections_per_user
        if self.connections[user] >= limit:
            self.counters.connections_refused += 1
            raise TooManyConnectionsError(
                f"user {user!r} holds {limit} connections to this node already "
                f"(max_connections_per_user = {limit})")
        self.connections[user] += 1

    def release(self, user: str) -> None:
        self.connections[user] -= 1
        if self.connections[user] <= 0:
            del self.connections[user]

    def check_prefetch(self, prefetch: int) -> None:
        limit = self.config.max_prefetch
        if prefetch > limit:
            self.counters.prefetch_refused += 1
            raise PrefetchTooLargeError(
                f"prefetch {prefetch} is above this node's ceiling (max_prefetch = {limit}): ask for {limit} or less")


class Waiting(Protocol):
    """A client connection as the slot rule sees it (broker.sessions.session.Session)."""

    @property
    def logged_in(self) -> bool: ...

    @property
    def connected_at(self) -> float: ...


class Slotted(Waiting, Protocol):
    def give_up_slot(self) -> None:
        """Close: a new connection takes this one's slot."""
        ...


def make_room(connections: Collection[Slotted], limit: int) -> UnavailableError | None:
    """Room for a new connection among ``connections`` (at most ``limit``): at the limit the
    one that has waited longest without logging in gives up its slot; the error to refuse the
    new one with when every one has logged in."""
    if len(connections) < limit:
        return None
    waiting = oldest_waiting(connections)
    if waiting is None:
        return UnavailableError(f"node is at max_connections ({limit})")
    waiting.give_up_slot()
    return None


def oldest_waiting(connections: Iterable[W]) -> W | None:
    """The connection that has waited longest without logging in (None: every one has).
    At ``max_connections`` a new connection takes its slot, so connections that never log
    in hold no slot against one that does, however many an attacker opens."""
    return min((c for c in connections if not c.logged_in), key=lambda c: c.connected_at, default=None)


class ClientHandshake:
    """One session's SCRAM-SHA-256 exchange on the node's side (no I/O).

    ``hello`` -> the AuthChallenge to send; ``response`` -> the user and the
    server-final-message for Welcome.  Both raise AuthError (LoginThrottledError
    included) with a message for the client; each failure is counted against the
    client's address.
    """

    def __init__(self, guard: ClientGuard, users: UserRegistry, addr: str) -> None:
        self.guard, self.users, self.addr = guard, users, addr
        self.user_name = ""
        self._user: UserRecord | None = None
        self._server: scram.ScramServer | None = None

    def hello(self, frame: Hello) -> AuthChallenge:
        self.guard.check_throttle(self.addr)
        self.user_name = frame.user
        try:
            if frame.mechanism != scram.MECHANISM:
                shown = frame.mechanism or "none"
                raise AuthError(f"this node authenticates clients with {scram.MECHANISM} only (the Hello "
                                f"named mechanism {shown!r}): use a client of this version")
            name, _nonce = scram.parse_client_first(frame.auth)
            if name != frame.user:
                raise AuthError(f"SCRAM: the exchange names user {name!r}, the Hello {frame.user!r}")
            self._user, creds = self.users.scram_credentials(name)
            self._server = scram.ScramServer(frame.auth, creds)
        except AuthError as exc:
            self.guard.login_failed(self.addr, frame.user, exc.message)
            raise
        return AuthChallenge(data=self._server.server_first)

    def response(self, frame: AuthResponse) -> tuple[UserRecord, str]:
        if self._server is None:  # the protocol's states admit no AuthResponse before the challenge
            raise AuthError("AuthResponse before the challenge")
        try:
            server_final = self._server.final(frame.data)
            if self._user is None:  # decoy credentials: no proof can match them
                raise AuthError("wrong user name or password")
        except AuthError as exc:
            self.guard.login_failed(self.addr, self.user_name, exc.message)
            raise AuthError(f"authentication failed for user {self.user_name!r}: {exc.message}") from None
        self.guard.login_succeeded(self.addr)
        return self._user, server_final
