"""Who is asking: logins, browser sessions, HTTP Basic, roles and CSRF.

Everything needs a login but ``/healthz``, the login page and the static files.
A browser logs in with a Tandem user and gets a session cookie (HttpOnly,
SameSite=Strict, and Secure under HTTPS); every state-changing request of a session,
and the login itself, must come from the console's own origin, and every change must
carry the session's CSRF token in ``X-CSRF-Token``.  A session stands while its user
does (broker.security.standing): it ends at the first request after the user is deleted, its
password or role changes, or a grant it had is revoked, on whichever member the change
was made.  Scripts and Prometheus use HTTP Basic.  ``monitor`` users may look, not
change.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import secrets

from aiohttp import web

from broker.logsafe import escape
from broker.security.standing import Standing, recheck, standing_of
from client.clock import Clock
from client.errors import AuthError, LoginThrottledError
from storage.base import UserRecord
from webconsole.errors import ApiError, Handler, bad, json_body
from webconsole.nodeview import NODE, NodeView

log = logging.getLogger("tandem.console")

STATIC_PATH = "/static/"
SESSION_COOKIE = "tandem_session"
SESSION_TTL = 8 * 3600.0

USER = web.RequestKey("user", str)
ROLE = web.RequestKey("role", str)
VIA = web.RequestKey("via", str)  # cookie or basic


class Session:
    """A browser's login: its user and role, its CSRF token, when it expires (on the node's
    monotonic clock)."""

    __slots__ = ("user", "role", "csrf", "expires", "standing")

    def __init__(self, standing: Standing, expires: float) -> None:
        self.user, self.role, self.expires = standing.name, standing.role, expires
        self.standing = standing
        self.csrf = secrets.token_urlsafe(24)


SESSION: web.RequestKey[Session | None] = web.RequestKey("session")


class Sessions:
    """The browser sessions of one console, by their cookie's token."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._by_token: dict[str, Session] = {}

    def __contains__(self, token: object) -> bool:
        return token in self._by_token

    def open(self, standing: Standing) -> tuple[str, Session]:
        """A new session for a user (and the expired ones forgotten): its token and itself."""
        token = secrets.token_urlsafe(32)
        now = self._clock.monotonic()  # not the wall clock: a clock step must not end or stretch logins
        self._by_token = {k: s for k, s in self._by_token.items() if s.expires > now}
        sess = self._by_token[token] = Session(standing, now + SESSION_TTL)
        return token, sess

    def valid(self, token: str) -> Session | None:
        """The session of ``token`` if it has not expired (an expired one is forgotten)."""
        sess = self._by_token.get(token)
        if sess is not None and sess.expires > self._clock.monotonic():
            return sess
        self._by_token.pop(token, None)
        return None

    def close(self, token: str) -> None:
        self._by_token.pop(token, None)

    def end_user(self, name: str, *, keep: str | None = None) -> None:
        """End every session of user ``name`` but the one of token ``keep``."""
        self._by_token = {k: s for k, s in self._by_token.items() if s.user != name or k == keep}


SESSIONS = web.AppKey("sessions", Sessions)


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Authenticate (cookie or Basic), then check the role, CSRF token and origin of a change."""
    path = request.path
    if path in ("/healthz", "/login") or path.startswith(STATIC_PATH):
        return await handler(request)
    who = await _authenticate(request)
    if who is None:
        if path.startswith("/api/") or path == "/metrics" or request.method != "GET":
            raise ApiError(401, "unauthenticated", "log in (session cookie) or use HTTP Basic credentials")
        raise web.HTTPFound("/login")
    request[USER], request[ROLE], request[VIA], request[SESSION] = who
    admin = request.app[NODE].node.acls.group_admin(_Principal(request[USER], request[ROLE]))
    if not admin and request[ROLE] != "monitor" and path not in ("/logout", "/api/v1/session"):
        # a plain user sees the queues its grants name (a client's queue list), not the group's
        raise ApiError(403, "forbidden", f"user {request[USER]!r} (role {request[ROLE]}) may not use the console: "
                                         "it takes role admin or monitor, or the admin permission")
    if request.method not in ("GET", "HEAD", "OPTIONS"):
        # A browser may replay cached Basic credentials on a cross-site form post: changes
        # must come from this origin (browsers say so) and carry JSON (a form cannot
        # without a CORS preflight, which this server never grants).
        same_origin(request, "changes")
        if request.can_read_body and request.content_type != "application/json" and path != "/login":
            raise ApiError(415, "unsupported_media_type", "send the body as application/json")
        sess = request[SESSION]
        if sess is not None and not secrets.compare_digest(request.headers.get("X-CSRF-Token", ""), sess.csrf):
            raise ApiError(403, "csrf", "missing or wrong X-CSRF-Token header (GET /api/v1/session gives it)")
        if not admin and path != "/logout":
            raise ApiError(403, "forbidden", f"user {request[USER]!r} (role {request[ROLE]}) may only look")
    return await handler(request)


def same_origin(request: web.Request, what: str) -> None:
    """403 unless the browser says the request comes from the console's own origin (a
    request that names no origin, a script's, passes)."""
    site = request.headers.get("Sec-Fetch-Site")
    origin = request.headers.get("Origin")
    if site not in (None, "same-origin", "none") or (
            origin is not None and origin.split("://", 1)[-1] != request.host):
        raise ApiError(403, "cross_site", f"{what} are refused from another site")


class _Principal:
    """Who asks, as broker.security.acl checks it."""

    __slots__ = ("name", "role")

    def __init__(self, name: str, role: str) -> None:
        self.name, self.role = name, role


def principal(request: web.Request) -> _Principal:
    """The user of an authenticated request, as broker.security.acl checks it."""
    return _Principal(request[USER], request[ROLE])


async def _authenticate(request: web.Request) -> tuple[str, str, str, Session | None] | None:
    """(user, role, "cookie" or "basic", the session) of the request; None: no credentials."""
    token = request.cookies.get(SESSION_COOKIE)
    if token:
        sess = request.app[SESSIONS].valid(token)
        if sess is not None:
            keep, why = recheck(request.app[NODE].node, sess.standing)
            if keep is None:
                request.app[SESSIONS].close(token)
                log.warning("console: session of %r from %s ended: %s", sess.user, request.remote, why)
                raise ApiError(401, "session_ended", f"session ended: {why}: log in again")
            sess.standing = keep
            return sess.user, sess.role, "cookie", sess
    header = request.headers.get("Authorization", "")
    if header.startswith("Basic "):
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            raise ApiError(401, "unauthenticated", "malformed Basic credentials") from None
        rec = await verify(request.app[NODE], user, password, request.remote)
        return rec.name, rec.role, "basic", None
    return None


async def verify(view: NodeView, user: str, password: str, addr: str | None) -> UserRecord:
    """The user, if ``password`` is theirs; else 401 (429 while ``addr`` has failed too often).

    The password is checked against the user's SCRAM credentials (one PBKDF2, off the loop)
    unless it was checked recently.  Failures count against the client's address in the
    node's failed-login throttle (broker.security.auth), shared with the client port."""
    reg, guard = view.node.users, view.guard
    where = addr or "unknown"
    rec = reg.check_cached(user, password)
    if rec is None:
        try:
            guard.check_throttle(where)
        except LoginThrottledError as exc:
            raise ApiError(429, "too_many_attempts", exc.message) from None
        try:
            rec = await asyncio.to_thread(reg.verify, user, password)
        except AuthError as exc:
            guard.login_failed(where, user, "console: wrong user name or password")
            raise ApiError(401, "unauthenticated", exc.message) from None
        guard.login_succeeded(where)
    return rec


def need_admin(request: web.Request, what: str) -> None:
    """403 unless the user of ``request`` has the admin permission (a look that takes it)."""
    if not request.app[NODE].node.acls.group_admin(_Principal(request[USER], request[ROLE])):
        raise ApiError(403, "forbidden", f"user {request[USER]!r} (role {request[ROLE]}) has no 'admin' "
                                         f"permission, needed to {what}")


def who(request: web.Request) -> str:
    """The operator of a request, for the log (the user name escaped: broker.logsafe)."""
    return f"{escape(request[USER])} (console, {request.remote})"


# -- endpoints ------------------------------------------------------------------------------------


async def login(request: web.Request) -> web.Response:
    """POST /login: a form (redirect to the console) or JSON (the session's CSRF token).
    Only from the console's own pages: another site's form must not log a browser in."""
    same_origin(request, "logins")
    if request.content_type == "application/json":
        body = await json_body(request)
    else:
        body = dict(await request.post())
    user, password = body.get("user"), body.get("password")
    if not isinstance(user, str) or not user:
        raise bad("user", "required")
    if not isinstance(password, str):
        raise bad("password", "required")
    view = request.app[NODE]
    rec = await verify(view, user, password, request.remote)
    standing = standing_of(view.node.users, view.node.acls, rec.name)
    if standing is None or not view.security.current(rec):  # changed while its password was checked
        raise ApiError(401, "unauthenticated", f"user {rec.name!r} changed while it logged in: log in again")
    token, sess = request.app[SESSIONS].open(standing)
    log.info("console: %s (%s) logged in from %s", escape(rec.name), rec.role, request.remote)
    if request.content_type == "application/json":
        resp: web.Response = web.json_response({"user": rec.name, "role": rec.role, "csrf": sess.csrf})
    else:
        resp = web.HTTPSeeOther("/")
    resp.set_cookie(SESSION_COOKIE, token, httponly=True, samesite="Strict", secure=request.secure,
                    max_age=int(SESSION_TTL), path="/")
    return resp


async def logout(request: web.Request) -> web.Response:
    token = request.cookies.get(SESSION_COOKIE)
    if token:
        request.app[SESSIONS].close(token)
    resp = web.json_response({"ok": True})
    resp.del_cookie(SESSION_COOKIE, path="/")
    return resp


async def session_info(request: web.Request) -> web.Response:
    """GET /api/v1/session: who is logged in, their role, whether they may change things (the
    admin permission), the CSRF token of a browser session."""
    sess = request[SESSION]
    admin = request.app[NODE].node.acls.group_admin(_Principal(request[USER], request[ROLE]))
    return web.json_response({"user": request[USER], "role": request[ROLE], "admin": admin,
                              "csrf": sess.csrf if sess is not None else None,
                              "node": request.app[NODE].node.config.name})
