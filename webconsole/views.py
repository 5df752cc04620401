"""The read-only endpoints: the pages, health, metrics, and the group's state as JSON
(overview, nodes, group, queues, partitions, events, users)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiohttp import web

from broker.sessions.upgrade import report
from webconsole.auth import USER, need_admin
from webconsole.errors import ApiError
from webconsole.group import GROUP, Statuses, events_json, group_json, partitions_json
from webconsole.metrics import METRICS
from webconsole.nodeview import NODE
from webconsole.openapi import document

STATIC = Path(__file__).parent / "static"


async def healthz(request: web.Request) -> web.Response:
    node = request.app[NODE].node
    return web.json_response({"ok": not node.stopping, "node": node.config.name})


async def login_page(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC / "login.html")


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC / "index.html")


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(document())


async def metrics(request: web.Request) -> web.Response:
    body, content_type = request.app[METRICS].render()
    resp = web.Response(body=body)
    resp.headers["Content-Type"] = content_type
    return resp


async def overview(request: web.Request) -> web.Response:
    group = request.app[GROUP]
    statuses = await group.statuses()
    return web.json_response({
        "node": request.app[NODE].node.config.name,
        "group": group_json(statuses),
        "nodes": group.nodes_json(statuses),
        "partitions": partitions_json(statuses),
        "queues": await group.queues_json(),
        "events": events_json(statuses)[-50:],
        "upgrade": upgrade_json(statuses),
    })


async def nodes(request: web.Request) -> web.Response:
    group = request.app[GROUP]
    return web.json_response(group.nodes_json(await group.statuses()))


async def node_detail(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    group = request.app[GROUP]
    for n in group.nodes_json(await group.statuses()):
        if n["name"] == name:
            return web.json_response(n)
    raise ApiError(404, "not_found", f"no node {name!r} in this group")


def upgrade_json(statuses: Statuses) -> dict[str, Any]:
    """The group's builds and feature level as this node sees them (``tandem upgrade status --json``)."""
    mine = statuses[0][1]
    assert mine is not None  # this node's own status is always there
    return report(mine)


async def upgrade(request: web.Request) -> web.Response:
    return web.json_response(upgrade_json(await request.app[GROUP].statuses()))


async def group_state(request: web.Request) -> web.Response:
    return web.json_response(group_json(await request.app[GROUP].statuses()))


async def queues(request: web.Request) -> web.Response:
    return web.json_response(await request.app[GROUP].queues_json())


async def queue_detail(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    node = request.app[NODE].node
    if name not in node.catalogue.queues:
        await node.catalogue.catch_up()  # declared through another member a moment ago?
    q = node.catalogue.queue(name)
    return web.json_response(await request.app[GROUP].queue_json(q, True))


async def partitions(request: web.Request) -> web.Response:
    rows = partitions_json(await request.app[GROUP].statuses())
    queue = request.query.get("queue")
    if queue is not None:
        rows = [r for r in rows if r["queue"] == queue]
    return web.json_response(rows)


async def events(request: web.Request) -> web.Response:
    return web.json_response(events_json(await request.app[GROUP].statuses()))


async def users(request: web.Request) -> web.Response:
    """Every user and its role: the admin permission, as ``UserList`` on the client port."""
    need_admin(request, "list users")
    reg = request.app[NODE].node.users
    return web.json_response([{"name": n, "role": u.role} for n in reg.names() if (u := reg.get(n)) is not None])


async def acls(request: web.Request) -> web.Response:
    """The group's grants (``?user=`` one user's): the admin permission, but for the asking
    user's own, as ``AclList`` on the client port."""
    user = request.query.get("user") or None
    if user != request[USER]:
        need_admin(request, "list the grants of other users")
    return web.json_response([{"user": a.user, "pattern": a.pattern, "permissions": list(a.permissions)}
                              for a in request.app[NODE].node.acls.records(user)])
