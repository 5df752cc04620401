"""The attack surface, read from the code: the frames a client may send, the kinds of request
one member forwards to another, the console's routes.  The security tests parametrise over
these, and the authorization map's completeness test (test_authorization_map.py) holds
docs/security.md to them, so a new operation is covered by being added."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any, get_type_hints

import msgpack
from aiohttp import web

from broker.cli import console_view
from broker.config import NodeConfig
from broker.messaging.forward import REQUESTS, ForwardKind, ForwardRequest
from broker.node.node import Node
from client.protocol.codec import encode
from client.protocol.frames import AuthResponse, Close, Declare, Frame, Heartbeat, Hello, Publish, PublishMessage
from webconsole.app import make_app

#: the frames the session handles itself, before and beside the requests of its handler table
HANDSHAKE_FRAMES: tuple[type[Frame], ...] = (Hello, AuthResponse, Heartbeat, Close)

#: the console routes that need no login (docs/security.md): health, the login page, the static files
PUBLIC = {("GET", "/healthz"), ("GET", "/login"), ("POST", "/login"), ("GET", "/static/{filename}")}


def _node() -> Node:
    """A node as it is built, never started (its tables and router are all this is for)."""
    return Node(NodeConfig(data_dir=Path(tempfile.gettempdir()) / "tandem-console-routes", port=0))  # (not created)


def request_frames() -> list[type[Frame]]:
    """Every request a logged-in client may send (a node's handler table: broker.sessions.session.requests)."""
    return list(_node()._session_parts.requests)


def client_frames() -> list[type[Frame]]:
    """Every frame a client may send: the requests and the handshake's own frames."""
    return [*HANDSHAKE_FRAMES, *request_frames()]


def forward_kinds() -> dict[ForwardKind, type[ForwardRequest]]:
    return dict(REQUESTS)


def console_app() -> web.Application:
    """The console's application as the node serves it (its router is all this is for: the
    node is never started)."""
    return make_app(console_view(_node()))


def console_routes() -> list[tuple[str, str]]:
    """(method, path) of every route of the console's router, in its order; HEAD, which
    aiohttp adds beside each GET, is the GET's own."""
    out: list[tuple[str, str]] = []
    for route in console_app().router.routes():
        if route.method == "HEAD":
            continue
        resource = route.resource
        assert resource is not None
        path = resource.canonical
        if isinstance(resource, web.StaticResource):
            path = path.rstrip("/") + "/{filename}"
        if (route.method, path) not in out:
            out.append((route.method, path))
    return out


#: what a route's placeholders stand for in a request: what an attacker would aim at
_PLACEHOLDERS = {
    "/api/v1/queues/{name}": "payments", "/api/v1/nodes/{name}": "node2", "/api/v1/users/{name}": "admin",
    "/api/v1/group/members/{name}": "node3",
}


def example_path(path: str) -> str:
    """``path`` with its placeholders filled in."""
    for prefix, value in _PLACEHOLDERS.items():
        if path.startswith(prefix):
            path = path.replace("{name}", value, 1)
    return path.replace("{partition}", "0").replace("{filename}", "app.js")


_STRINGS = {"queue": "payments", "name": "admin", "user": "mallory", "pattern": "*", "permissions": "admin",
            "node": "node3", "option": "priority", "action": "remove", "mode": "put", "by": "mallory",
            "nodes": "node3", "producer": "seed-0"}


def forward_example(kind: ForwardKind, queue: str) -> ForwardRequest:
    """A request of ``kind`` as an attacker would make it: aimed at ``queue``, the user admin,
    a member; it decodes as its kind (broker.messaging.forward.decode_request)."""
    cls = REQUESTS[kind]
    hints = get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if f.name == "frame":
            inner: Frame = Publish(rid=0, queue=queue, messages=[PublishMessage("k", {}, b"forged")]) \
                if kind in (ForwardKind.PUBLISH, ForwardKind.PUBLISH_ROUTED) else Declare(rid=0, queue=queue)
            values[f.name] = encode(inner)[4:]
        elif tp is bytes:
            values[f.name] = msgpack.packb({"name": "mallory", "role": "admin"})
        elif tp is str:
            values[f.name] = queue if f.name == "queue" else _STRINGS.get(f.name, "")
        elif tp is bool:
            values[f.name] = False
        else:
            values[f.name] = 1 if f.name in ("count", "max_messages", "queue_id", "value", "drained") else 0
    return cls(**values)
