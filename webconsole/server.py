"""The management console and admin REST API of a node (aiohttp), on its ``http_port``.

Everything needs a login but ``/healthz`` and the login page: a browser logs in
with a Tandem user and gets a session cookie (HttpOnly, SameSite=Strict; every
state-changing request must carry the session's CSRF token in ``X-CSRF-Token``);
scripts and Prometheus use HTTP Basic.  ``monitor`` users may look, not change.

The view is the whole group's: a node asks each member over the peer links for
its status and for the stats of the partitions it is active for (forwarded
requests ``status`` and ``pstats``), so any node's console shows every node.
Errors are JSON ``{"code": <http status>, "error": <name>, "message": ...}``; bad
input is 400 with the field named.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgpack
from aiohttp import web

from client.errors import (
    AccessRefusedError,
    AuthError,
    InvalidArgumentError,
    MessageTooLargeError,
    NotActiveError,
    PartitionNotFoundError,
    QueueExistsError,
    QueueNotFoundError,
    ShuttingDownError,
    TandemError,
    TimeoutError_,
    UnavailableError,
)
from client.protocol.frames import Declare, PartitionInfo, QueueInfo, StatusOk
from storage.base import UserRecord
from broker.forward import OptionFwd, PartitionStatsFwd, QueueStatsFwd, StatusFwd

if TYPE_CHECKING:
    from broker.node import Node

log = logging.getLogger("tandem.console")

STATIC = Path(__file__).parent / "static"
SESSION_COOKIE = "tandem_session"
SESSION_TTL = 8 * 3600.0
PEER_TIMEOUT = 1.5
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
USER = web.RequestKey("user", str)
ROLE = web.RequestKey("role", str)
VIA = web.RequestKey("via", str)  # cookie or basic
SESSION = web.RequestKey("session", object)


class ApiError(Exception):
    def __init__(self, status: int, error: str, message: str) -> None:
        super().__init__(message)
        self.status, self.error, self.message = status, error, message


def _bad(field: str, why: str) -> ApiError:
    return ApiError(400, "bad_request", f"{field}: {why}")


#: HTTP status of a broker error (first match; a subclass before its base)
_STATUS_OF: tuple[tuple[type[TandemError], int], ...] = (
    (AccessRefusedError, 403), (AuthError, 401), (QueueNotFoundError, 404), (PartitionNotFoundError, 404),
    (QueueExistsError, 409), (InvalidArgumentError, 400), (MessageTooLargeError, 400),
    (UnavailableError, 503), (NotActiveError, 503), (ShuttingDownError, 503), (TimeoutError_, 503),
)


class Session:
    __slots__ = ("user", "role", "csrf", "expires")

    def __init__(self, user: str, role: str, expires: float) -> None:
        self.user, self.role, self.expires = user, role, expires
        self.csrf = secrets.token_urlsafe(24)


class Console:
    def __init__(self, node: Node) -> None:
        self.node = node
        self.sessions: dict[str, Session] = {}
        self._runner: web.AppRunner | None = None
        self.address: tuple[str, int] | None = None
        self._rates: dict[tuple[str, str], tuple[float, int, float]] = {}  # (queue, counter) -> (t, n, rate)
        self.app = self._make_app()

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self, host: str, port: int) -> None:
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        bound = self._runner.addresses
        self.address = (bound[0][0], bound[0][1]) if bound else (host, port)
        log.info("console listening on http://%s:%d/", *self.address)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def url(self) -> str:
        host, port = self.address or (self.node.config.host, self.node.config.http_port or 0)
        return f"http://{host}:{port}/"

    def _make_app(self) -> web.Application:
        app = web.Application(middlewares=[self._errors, self._auth], client_max_size=1024 * 1024)
        r = app.router
        r.add_get("/healthz", self.healthz)
        r.add_get("/login", self.login_page)
        r.add_post("/login", self.login)
        r.add_post("/logout", self.logout)
        r.add_get("/", self.index)
        r.add_static("/static/", STATIC)
        r.add_get("/metrics", self.metrics)
        api = "/api/v1"
        r.add_get(f"{api}/openapi.json", self.openapi)
        r.add_get(f"{api}/session", self.session_info)
        r.add_get(f"{api}/overview", self.overview)
        r.add_get(f"{api}/nodes", self.nodes)
        r.add_get(f"{api}/nodes/{{name}}", self.node_detail)
        r.add_post(f"{api}/nodes/{{name}}/priority", self.set_priority)
        r.add_get(f"{api}/group", self.group)
        r.add_post(f"{api}/group/quorum-override", self.set_quorum_override)
        r.add_post(f"{api}/group/designated-primary", self.set_designated_primary)
        r.add_get(f"{api}/queues", self.queues)
        r.add_post(f"{api}/queues", self.create_queue)
        r.add_get(f"{api}/queues/{{name}}", self.queue_detail)
        r.add_delete(f"{api}/queues/{{name}}", self.delete_queue)
        r.add_post(f"{api}/queues/{{name}}/purge", self.purge_queue)
        r.add_get(f"{api}/partitions", self.partitions)
        r.add_get(f"{api}/events", self.events)
        r.add_get(f"{api}/events/stream", self.event_stream)
        r.add_get(f"{api}/users", self.users)
        r.add_post(f"{api}/users", self.create_user)
        r.add_delete(f"{api}/users/{{name}}", self.delete_user)
        r.add_post(f"{api}/users/{{name}}/password", self.change_password)
        return app

    # -- middlewares ---------------------------------------------------------------------------

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        # A browser's own fetches (the console's pages say X-Tandem-Console) must not get a
        # Basic challenge: the browser would pop up its login dialog.
        challenge = "X-Tandem-Console" not in request.headers and request.path != "/login"
        try:
            return await handler(request)
        except ApiError as exc:
            return _json_error(exc.status, exc.error, exc.message, unauth=exc.status == 401 and challenge)
        except TandemError as exc:
            status = next((s for cls, s in _STATUS_OF if isinstance(exc, cls)), 503 if exc.retriable else 500)
            return _json_error(status, exc.code.name.lower(), exc.message, unauth=status == 401 and challenge)
        except web.HTTPException:
            raise
        except Exception as exc:  # a bug must cost one request, never the node
            log.exception("console: %s %s failed", request.method, request.path)
            return _json_error(500, "internal_error", f"internal error: {exc!r}")

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if path in ("/healthz", "/login") or path.startswith("/static/"):
            return await handler(request)
        who = await self._authenticate(request)
        if who is None:
            if path.startswith("/api/") or path == "/metrics" or request.method != "GET":
                raise ApiError(401, "unauthenticated", "log in (session cookie) or use HTTP Basic credentials")
            raise web.HTTPFound("/login")
        request[USER], request[ROLE], request[VIA], request[SESSION] = who
        if request.method not in ("GET", "HEAD", "OPTIONS"):
            # A browser may replay cached Basic credentials on a cross-site form post: changes
            # must come from this origin (browsers say so) and carry JSON (a form cannot
            # without a CORS preflight, which this server never grants).
            site = request.headers.get("Sec-Fetch-Site")
            origin = request.headers.get("Origin")
            if site not in (None, "same-origin", "none") or (
                    origin is not None and origin.split("://", 1)[-1] != request.host):
                raise ApiError(403, "cross_site", "changes are refused from another site")
            if request.can_read_body and request.content_type != "application/json" and path != "/login":
                raise ApiError(415, "unsupported_media_type", "send the body as application/json")
            if request[VIA] == "cookie":
                sess = request[SESSION]
                assert isinstance(sess, Session)
                if not secrets.compare_digest(request.headers.get("X-CSRF-Token", ""), sess.csrf):
                    raise ApiError(403, "csrf", "missing or wrong X-CSRF-Token header (GET /api/v1/session gives it)")
            if request[ROLE] != "admin" and path != "/logout":
                raise ApiError(403, "forbidden", f"user {request[USER]!r} (role {request[ROLE]}) may only look")
        return await handler(request)

    async def _authenticate(self, request: web.Request) -> tuple[str, str, str, Session | None] | None:
        token = request.cookies.get(SESSION_COOKIE)
        if token:
            sess = self.sessions.get(token)
            if sess is not None and sess.expires > self.node.clock.time():
                return sess.user, sess.role, "cookie", sess
            self.sessions.pop(token, None)
        header = request.headers.get("Authorization", "")
        if header.startswith("Basic "):
            try:
                user, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                raise ApiError(401, "unauthenticated", "malformed Basic credentials") from None
            rec = await self._verify(user, password)
            return rec.name, rec.role, "basic", None
        return None

    async def _verify(self, user: str, password: str) -> UserRecord:
        reg = self.node.users
        rec = reg.check_cached(user, password)
        if rec is None:
            try:
                rec = await asyncio.to_thread(reg.verify, user, password)
            except AuthError as exc:
                raise ApiError(401, "unauthenticated", exc.message) from None
        return rec

    # -- pages and login -----------------------------------------------------------------------

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": not self.node.stopping, "node": self.node.config.name})

    async def login_page(self, request: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / "login.html")

    async def index(self, request: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / "index.html")

    async def login(self, request: web.Request) -> web.Response:
        if request.content_type == "application/json":
            body = await _json_body(request)
        else:
            body = dict(await request.post())
        user, password = body.get("user"), body.get("password")
        if not isinstance(user, str) or not user:
            raise _bad("user", "required")
        if not isinstance(password, str):
            raise _bad("password", "required")
        rec = await self._verify(user, password)
        token = secrets.token_urlsafe(32)
        now = self.node.clock.time()
        self.sessions = {k: s for k, s in self.sessions.items() if s.expires > now}
        sess = self.sessions[token] = Session(rec.name, rec.role, now + SESSION_TTL)
        log.info("console: %s (%s) logged in from %s", rec.name, rec.role, request.remote)
        if request.content_type == "application/json":
            resp: web.Response = web.json_response({"user": rec.name, "role": rec.role, "csrf": sess.csrf})
        else:
            resp = web.HTTPSeeOther("/")
        resp.set_cookie(SESSION_COOKIE, token, httponly=True, samesite="Strict", max_age=int(SESSION_TTL),
                        path="/")
        return resp

    async def logout(self, request: web.Request) -> web.Response:
        token = request.cookies.get(SESSION_COOKIE)
        if token:
            self.sessions.pop(token, None)
        resp = web.json_response({"ok": True})
        resp.del_cookie(SESSION_COOKIE, path="/")
        return resp

    async def session_info(self, request: web.Request) -> web.Response:
        sess = request[SESSION]
        return web.json_response({"user": request[USER], "role": request[ROLE],
                                  "csrf": sess.csrf if isinstance(sess, Session) else None,
                                  "node": self.node.config.name})

    async def openapi(self, request: web.Request) -> web.Response:
        from webconsole.openapi import document

        return web.json_response(document())

    async def metrics(self, request: web.Request) -> web.Response:
        from webconsole.metrics import render

        body, content_type = render(self.node)
        resp = web.Response(body=body)
        resp.headers["Content-Type"] = content_type
        return resp

    # -- the group's state ----------------------------------------------------------------------

    async def _statuses(self) -> list[tuple[str, StatusOk | None]]:
        """Every member's status, this node's first (None: it did not answer)."""
        from broker.status import status_of
        from client.protocol.codec import decode_payload

        node = self.node
        mine = status_of(node, 0)
        out: list[tuple[str, StatusOk | None]] = [(mine.node, mine)]
        if node.peers is None:
            return out
        peers = node.peers

        async def ask(name: str) -> StatusOk | None:
            if name not in peers.links:
                return None
            try:
                async with asyncio.timeout(PEER_TIMEOUT):
                    frame = decode_payload(await peers.forward(name, StatusFwd()))
                return frame if isinstance(frame, StatusOk) else None
            except (TandemError, TimeoutError):
                return None

        names = [r.name for r in mine.remotes]
        answers = await asyncio.gather(*(ask(n) for n in names))
        out.extend(zip(names, answers))
        return out

    async def overview(self, request: web.Request) -> web.Response:
        statuses = await self._statuses()
        return web.json_response({
            "node": self.node.config.name,
            "group": self._group_json(statuses),
            "nodes": self._nodes_json(statuses),
            "partitions": self._partitions_json(statuses),
            "queues": [q for q in await self._queues_json()],
            "events": self._events_json(statuses)[-50:],
        })

    def _nodes_json(self, statuses: list[tuple[str, StatusOk | None]]) -> list[dict[str, Any]]:
        mine = statuses[0][1]
        assert mine is not None
        remote_of = {r.name: r for r in mine.remotes}
        actives: dict[str, list[str]] = {}
        for p in self._partitions_json(statuses):
            if p["active"]:
                actives.setdefault(p["active"], []).append(f"{p['queue'] or '(catalogue)'}/{p['partition']}")
        out = []
        for name, st in statuses:
            r = remote_of.get(name)
            state = "Up" if st is not None and (name == mine.node or (r is not None and r.state == "Up")) else \
                (r.state if r is not None else "Down")
            if st is None and state == "Up":
                state = "Unreachable"
            out.append({
                "name": name, "state": state, "self": name == mine.node,
                "priority": st.priority if st else (r.priority if r else None),
                "votes": st.votes if st else (r.votes if r else None),
                "quorum_state": st.quorum_state if st else None,
                "version": st.version if st else None,
                "store_stamp": st.store_stamp if st else (r.store_stamp if r else ""),
                "peer_address": r.address if r else None,
                "client_address": r.client_address if r else self.node.client_address,
                "designated_primary": st.designated_primary if st else None,
                "ha_1014_discarded": st.discarded if st else None,
                "actives": sorted(actives.get(name, [])),
            })
        return out

    @staticmethod
    def _group_json(statuses: list[tuple[str, StatusOk | None]]) -> dict[str, Any]:
        mine = statuses[0][1]
        assert mine is not None
        return {"members": [n for n, _ in statuses], "quorum_policy": mine.quorum_policy,
                "quorum_state": mine.quorum_state, "quorum_override": mine.quorum_override,
                "designated_primary": [n for n, st in statuses if st is not None and st.designated_primary]}

    @staticmethod
    def _partitions_json(statuses: list[tuple[str, StatusOk | None]]) -> list[dict[str, Any]]:
        """One row per partition: as its active reports it, else as the first node that knows it."""
        best: dict[tuple[str, int], tuple[str, PartitionInfo]] = {}
        for name, st in statuses:
            if st is None:
                continue
            for p in st.partitions:
                key = (p.queue, p.partition)
                if key not in best or (p.role == "active" and best[key][1].role != "active"):
                    best[key] = (name, p)
        out = []
        for (_q, _i), (seen_by, p) in sorted(best.items()):
            out.append({"queue": p.queue, "partition": p.partition, "state": p.state, "active": p.active,
                        "term": p.term, "commit": p.commit, "last_index": p.last_index, "seen_by": seen_by,
                        "replicas": [{"node": r.node, "kind": r.kind, "match": r.match, "lag": r.lag,
                                      "lag_seconds": r.lag_seconds} for r in p.replicas]})
        return out

    @staticmethod
    def _events_json(statuses: list[tuple[str, StatusOk | None]]) -> list[dict[str, str]]:
        seen: set[str] = set()
        out = []
        for name, st in statuses:
            if st is None:
                continue
            for e in st.events:
                if e not in seen:
                    seen.add(e)
                    out.append({"node": name, "text": e, "kind": e.split(" ", 1)[0]})
        return out

    async def _partition_stats(self, q: Any, pidx: int) -> dict[str, Any]:
        """ready, unacked, depth of one partition, from the node active for it."""
        node = self.node
        if node.serves(q, pidx):
            return _local_pstats(node, q, pidx)
        rep = node.replication
        who = rep.active_of((q.meta.id, pidx)) if rep is not None else None
        if who is None or node.peers is None:
            return {"ready": None, "unacked": None, "depth": None, "active": None}
        try:
            async with asyncio.timeout(PEER_TIMEOUT):
                out = await node.peers.forward(who, PartitionStatsFwd(q.name, pidx))
            stats: dict[str, Any] = msgpack.unpackb(out)
            return stats
        except (TandemError, TimeoutError):
            return {"ready": None, "unacked": None, "depth": None, "active": who}

    async def _counters(self) -> tuple[dict[str, list[int]], bool]:
        """queue -> [published, delivered, acked] summed over the members (each counts what
        it did as an active), and whether every member answered."""
        node = self.node
        total = {name: list(v) for name, v in queue_counters(node).items()}
        if node.peers is None:
            return total, True
        peers = node.peers

        async def ask(name: str) -> dict[str, list[int]]:
            try:
                async with asyncio.timeout(PEER_TIMEOUT):
                    out: dict[str, list[int]] = msgpack.unpackb(await peers.forward(name, QueueStatsFwd()))
                    return out
            except (TandemError, TimeoutError):
                return {}

        answers = await asyncio.gather(*(ask(n) for n in list(peers.links)))
        complete = all(answers) or not self.node.queues
        for counts in answers:
            for qname, v in counts.items():
                acc = total.setdefault(qname, [0, 0, 0])
                for i in range(3):
                    acc[i] += v[i]
        return total, complete

    async def _queue_json(self, q: Any, with_partitions: bool,
                          counted: tuple[dict[str, list[int]], bool] | None = None) -> dict[str, Any]:
        info: QueueInfo = q.info()
        counters, complete = counted if counted is not None else await self._counters()
        parts = await asyncio.gather(*(self._partition_stats(q, i) for i in range(q.meta.partitions)))
        known = [p for p in parts if p["ready"] is not None]
        published, delivered, acked = counters.get(info.name, [0, 0, 0])
        out: dict[str, Any] = {
            "name": info.name, "partitions": info.partitions, "mapper": info.mapper,
            "max_deliveries": info.max_deliveries, "dead_letter_queue": info.dead_letter_queue,
            "max_length": info.max_length,
            "ready": sum(p["ready"] for p in known), "unacked": sum(p["unacked"] for p in known),
            "depth": sum(p["depth"] for p in known), "complete": len(known) == len(parts),
            "published": published, "delivered": delivered, "acked": acked,
        }
        for counter in ("published", "delivered", "acked"):
            out[f"{counter}_rate"] = self._rate(info.name, counter, out[counter], update=complete)
        if with_partitions:
            out["partition_stats"] = [{"partition": i, **p} for i, p in enumerate(parts)]
        return out

    def _rate(self, queue: str, counter: str, value: int, *, update: bool = True) -> float:
        """Per second, from the previous sample (at least a second old) of the same counter;
        a sum some member did not answer for (``update`` false) leaves the samples alone."""
        now = self.node.clock.monotonic()
        prev = self._rates.get((queue, counter))
        if not update:
            return prev[2] if prev is not None else 0.0
        if prev is None:
            self._rates[(queue, counter)] = (now, value, 0.0)
            return 0.0
        t, n, rate = prev
        if now - t >= 1.0:
            rate = max(0.0, (value - n) / (now - t))
            self._rates[(queue, counter)] = (now, value, rate)
        return round(rate, 1)

    async def _queues_json(self) -> list[dict[str, Any]]:
        qs = sorted(self.node.queues.values(), key=lambda q: q.meta.name)
        counted = await self._counters()
        return list(await asyncio.gather(*(self._queue_json(q, False, counted) for q in qs)))

    # -- read endpoints ---------------------------------------------------------------------------

    async def nodes(self, request: web.Request) -> web.Response:
        return web.json_response(self._nodes_json(await self._statuses()))

    async def node_detail(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        for n in self._nodes_json(await self._statuses()):
            if n["name"] == name:
                return web.json_response(n)
        raise ApiError(404, "not_found", f"no node {name!r} in this group")

    async def group(self, request: web.Request) -> web.Response:
        return web.json_response(self._group_json(await self._statuses()))

    async def queues(self, request: web.Request) -> web.Response:
        return web.json_response(await self._queues_json())

    async def queue_detail(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in self.node.queues:
            await self.node.catch_up_catalogue()  # declared through another member a moment ago?
        q = self.node.queue(name)
        return web.json_response(await self._queue_json(q, True))

    async def partitions(self, request: web.Request) -> web.Response:
        rows = self._partitions_json(await self._statuses())
        queue = request.query.get("queue")
        if queue is not None:
            rows = [r for r in rows if r["queue"] == queue]
        return web.json_response(rows)

    async def events(self, request: web.Request) -> web.Response:
        return web.json_response(self._events_json(await self._statuses()))

    async def event_stream(self, request: web.Request) -> web.StreamResponse:
        """Server-Sent Events: ``event: ha`` for each new HA event of the group, and
        ``event: overview`` with the whole overview every second."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        sent: set[str] = set()
        token = request.cookies.get(SESSION_COOKIE)
        user = request[USER]
        try:
            while not self.node.stopping:
                if (request[VIA] == "cookie" and token not in self.sessions) or self.node.users.get(user) is None:
                    break  # logged out, expired or deleted meanwhile: the stream ends with it
                statuses = await self._statuses()
                for e in self._events_json(statuses):
                    if e["text"] not in sent:
                        sent.add(e["text"])
                        await resp.write(f"event: ha\ndata: {json.dumps(e)}\n\n".encode())
                overview = {"nodes": self._nodes_json(statuses), "partitions": self._partitions_json(statuses),
                            "group": self._group_json(statuses), "queues": await self._queues_json()}
                await resp.write(f"event: overview\ndata: {json.dumps(overview)}\n\n".encode())
                await self.node.clock.sleep(1.0)  # the stream's period, not a wait for a state
        except (ConnectionResetError, asyncio.CancelledError):
            pass  # the browser went away
        return resp

    async def users(self, request: web.Request) -> web.Response:
        reg = self.node.users
        return web.json_response([{"name": n, "role": u.role} for n in reg.names()
                                  if (u := reg.get(n)) is not None])

    # -- operations -------------------------------------------------------------------------------

    def _who(self, request: web.Request) -> str:
        return f"{request[USER]} (console, {request.remote})"

    async def set_priority(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        body = await _json_body(request)
        prio = body.get("priority")
        if not isinstance(prio, int) or isinstance(prio, bool) or not 0 <= prio <= 3:
            raise _bad("priority", "an integer 0 (never active) .. 3 (highest)")
        await self._on_node(name, "priority", prio, request)
        return web.json_response({"node": name, "priority": prio})

    async def set_quorum_override(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        nodes = body.get("nodes")
        if nodes is not None and (not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1):
            raise _bad("nodes", "an integer >= 1, or null to clear the override")
        target = body.get("node", self.node.config.name)
        if not isinstance(target, str):
            raise _bad("node", "a node name")
        await self._on_node(target, "quorum_override", -1 if nodes is None else nodes, request)
        return web.json_response({"node": target, "quorum_override": nodes})

    async def set_designated_primary(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        on = body.get("on")
        if not isinstance(on, bool):
            raise _bad("on", "true or false")
        target = body.get("node", self.node.config.name)
        if not isinstance(target, str):
            raise _bad("node", "a node name")
        await self._on_node(target, "designated_primary", int(on), request)
        return web.json_response({"node": target, "designated_primary": on})

    async def _on_node(self, name: str, option: str, value: int, request: web.Request) -> None:
        """Apply an operator setting on node ``name`` (this one, or a member over its peer link)."""
        node = self.node
        by = self._who(request)
        if name == node.config.name:
            apply_option(node, option, value, by)
            return
        if node.peers is None or name not in node.peers.addresses:
            raise ApiError(404, "not_found", f"no node {name!r} in this group")
        await node.peers.forward(name, OptionFwd(option, value, by))

    async def create_queue(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        name = body.get("name")
        if not isinstance(name, str) or not name:
            raise _bad("name", "required: the queue's name")
        kwargs: dict[str, Any] = {}
        for field, kind in (("partitions", int), ("ring_size", int), ("max_deliveries", int), ("max_length", int),
                            ("mapper", str), ("dead_letter_queue", str)):
            if field in body and body[field] is not None:
                v = body[field]
                if not isinstance(v, kind) or isinstance(v, bool):
                    raise _bad(field, f"expected {kind.__name__}")
                kwargs[field] = v
        unknown = set(body) - {"name", "partitions", "ring_size", "max_deliveries", "max_length", "mapper",
                               "dead_letter_queue"}
        if unknown:
            raise _bad(sorted(unknown)[0], "unknown field")
        frame = Declare(rid=0, queue=name, **kwargs)
        try:
            from broker.queues import validate_declare

            validate_declare(frame)
        except InvalidArgumentError as exc:
            raise ApiError(400, "bad_request", exc.message) from None
        info, created = await self.node.declare(frame)
        log.warning("console: %s declared queue %s", self._who(request), name)
        return web.json_response({"name": info.name, "partitions": info.partitions, "created": created},
                                 status=201 if created else 200)

    async def delete_queue(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if_empty = request.query.get("if_empty", "false")
        if if_empty not in ("true", "false"):
            raise _bad("if_empty", "true or false")
        await self.node.delete(name, if_empty == "true")
        log.warning("console: %s deleted queue %s", self._who(request), name)
        return web.json_response({"deleted": name})

    async def purge_queue(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        purged = await self.node.purge(name)
        log.warning("console: %s purged queue %s (%d messages)", self._who(request), name, purged)
        return web.json_response({"queue": name, "purged": purged})

    async def create_user(self, request: web.Request) -> web.Response:
        from broker.users import make_user
        from storage.base import PutUser

        body = await _json_body(request)
        unknown = set(body) - {"name", "password", "role"}
        if unknown:
            raise _bad(sorted(unknown)[0], "unknown field")
        name, password, role = body.get("name"), body.get("password"), body.get("role", "monitor")
        if not isinstance(name, str) or not name:
            raise _bad("name", "required")
        if not isinstance(password, str):
            raise _bad("password", "required, at least 8 characters")
        if not isinstance(role, str):
            raise _bad("role", "admin or monitor")
        if self.node.users.get(name) is not None:
            raise ApiError(409, "exists", f"user {name!r} exists (POST /api/v1/users/{name}/password changes it)")
        try:
            user = await asyncio.to_thread(make_user, name, password, role)  # scrypt: off the loop
        except InvalidArgumentError as exc:
            raise ApiError(400, "bad_request", exc.message) from None
        await self.node.write([PutUser(user)], sync=True)
        self.node.users.put(user)
        log.warning("console: %s created user %s (%s)", self._who(request), name, role)
        return web.json_response({"name": name, "role": role}, status=201)

    async def delete_user(self, request: web.Request) -> web.Response:
        from storage.base import DropUser

        name = request.match_info["name"]
        if self.node.users.get(name) is None:
            raise ApiError(404, "not_found", f"no user {name!r}")
        if name == request[USER]:
            raise ApiError(409, "conflict", "you cannot delete the user you are logged in as")
        await self.node.write([DropUser(name)], sync=True)
        self.node.users.drop(name)
        self.sessions = {k: s for k, s in self.sessions.items() if s.user != name}
        log.warning("console: %s deleted user %s", self._who(request), name)
        return web.json_response({"deleted": name})

    async def change_password(self, request: web.Request) -> web.Response:
        from broker.users import make_user
        from storage.base import PutUser

        name = request.match_info["name"]
        old = self.node.users.get(name)
        if old is None:
            raise ApiError(404, "not_found", f"no user {name!r}")
        body = await _json_body(request)
        password = body.get("password")
        if not isinstance(password, str):
            raise _bad("password", "required, at least 8 characters")
        try:
            user = await asyncio.to_thread(make_user, name, password, old.role)
        except InvalidArgumentError as exc:
            raise ApiError(400, "bad_request", exc.message) from None
        await self.node.write([PutUser(user)], sync=True)
        self.node.users.put(user)
        self.sessions = {k: s for k, s in self.sessions.items() if s.user != name or k == request.cookies.get(
            SESSION_COOKIE)}
        log.warning("console: %s changed the password of %s", self._who(request), name)
        return web.json_response({"name": name, "changed": True})


def apply_option(node: Node, option: str, value: int, by: str) -> None:
    """An operator setting on this node (from the console here or forwarded by a member)."""
    if option == "quorum_override":
        node.set_quorum_override(None if value < 0 else value, by=by)
    elif option in ("priority", "designated_primary"):
        node.set_option(option, value, by=by)
    else:
        raise InvalidArgumentError(f"unknown option {option!r}")


def _local_pstats(node: Node, q: Any, pidx: int) -> dict[str, Any]:
    part = q.partitions[pidx]
    depth = node.catalogue.partition_depth(q, pidx)
    ready = len(part.ready)
    return {"ready": ready, "unacked": depth - ready, "depth": depth, "active": node.config.name,
            "next_offset": part.next_offset}


def queue_counters(node: Node) -> dict[str, list[int]]:
    """What this node counted, per queue: [published, delivered, acked]."""
    return {name: [q.published, q.delivered, q.acked] for name, q in node.queues.items()}


def pstats_payload(node: Node, qname: str, pidx: int) -> bytes:
    """The forwarded ``pstats`` request: a partition this node is active for."""
    from client.errors import UnavailableError

    q = node.queue(qname)
    if not 0 <= pidx < q.meta.partitions:
        raise InvalidArgumentError(f"queue {qname!r} has no partition {pidx}")
    if not node.serves(q, pidx):
        raise UnavailableError(f"partition {qname}/{pidx} is not active on {node.config.name}")
    return msgpack.packb(_local_pstats(node, q, pidx))


async def _json_body(request: web.Request) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError, LookupError):  # (LookupError: an unknown charset)
        raise ApiError(400, "bad_request", "body: not JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "bad_request", "body: expected a JSON object")
    return body


def _json_error(status: int, error: str, message: str, *, unauth: bool = False) -> web.Response:
    resp = web.json_response({"code": status, "error": error, "message": message}, status=status)
    if unauth:
        resp.headers["WWW-Authenticate"] = 'Basic realm="tandem"'
    return resp

