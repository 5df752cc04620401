"""Live updates for the console page: ``GET /api/v1/events/stream`` (Server-Sent Events).

``event: ha`` for each new HA event of the group, and ``event: overview`` with
the group's nodes, partitions and queues every :data:`PERIOD` seconds.  A stream
ends when its session ends (logout, expiry, the user deleted), when the node
stops, or when the application shuts down (:func:`close_streams`, on_shutdown).
"""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from webconsole.auth import SESSION_COOKIE, SESSIONS, USER, VIA
from webconsole.group import GROUP, events_json, group_json, partitions_json
from webconsole.nodeview import NODE

PERIOD = 1.0

#: set when the application shuts down: every stream ends
CLOSING = web.AppKey("closing", asyncio.Event)


async def close_streams(app: web.Application) -> None:
    app[CLOSING].set()


async def event_stream(request: web.Request) -> web.StreamResponse:
    node, group = request.app[NODE].node, request.app[GROUP]
    sessions, closing = request.app[SESSIONS], request.app[CLOSING]
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    sent: set[str] = set()
    token = request.cookies.get(SESSION_COOKIE)
    user = request[USER]
    try:
        while not node.stopping and not closing.is_set():
            if (request[VIA] == "cookie" and token not in sessions) or node.users.get(user) is None:
                break  # logged out, expired or deleted meanwhile: the stream ends with it
            statuses = await group.statuses()
            for e in events_json(statuses):
                if e["text"] not in sent:
                    sent.add(e["text"])
                    await resp.write(f"event: ha\ndata: {json.dumps(e)}\n\n".encode())
            overview = {"nodes": group.nodes_json(statuses), "partitions": partitions_json(statuses),
                        "group": group_json(statuses), "queues": await group.queues_json()}
            await resp.write(f"event: overview\ndata: {json.dumps(overview)}\n\n".encode())
            try:  # the stream's period, cut short by the shutdown
                async with node.clock.timeout(PERIOD):
                    await closing.wait()
            except TimeoutError:
                pass
    except ConnectionResetError:
        pass  # the browser went away
    return resp
