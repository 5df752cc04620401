"""The exchanges and bindings in the admin REST API: list them (a *look*), declare and delete an
exchange, bind and unbind (a *change*: the admin permission).  The changes are the group's
(broker.partitions.topology); each is logged with the operator who asked."""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from broker.logsafe import escape
from storage.topology import EXCHANGE_TYPES, BindingRecord, ExchangeRecord
from webconsole.auth import who
from webconsole.errors import bad, json_body, only
from webconsole.nodeview import NODE


def exchange_json(e: ExchangeRecord, bindings: list[BindingRecord]) -> dict[str, Any]:
    return {"name": e.name, "type": e.type, "alternate": e.alternate,
            "bindings": [{"destination": b.destination, "to_exchange": b.to_exchange, "routing_key": b.routing_key,
                          "arguments": dict(b.arguments)} for b in sorted(bindings, key=BindingRecord.ident)]}


log = logging.getLogger("tandem.console")


async def list_exchanges(request: web.Request) -> web.Response:
    t = request.app[NODE].topology.table
    return web.json_response([exchange_json(e, list(t.bindings.get(e.name, ())))
                              for e in sorted(t.exchanges.values(), key=lambda e: e.name)])


async def create_exchange(request: web.Request) -> web.Response:
    body = await json_body(request)
    only(body, {"name", "type", "alternate"})
    name, kind, alternate = body.get("name"), body.get("type", "direct"), body.get("alternate")
    if not isinstance(name, str) or not name:
        raise bad("name", "required: the exchange's name")
    if kind not in EXCHANGE_TYPES:
        raise bad("type", f"one of {', '.join(EXCHANGE_TYPES)}")
    if alternate is not None and not isinstance(alternate, str):
        raise bad("alternate", "an exchange's name, or null")
    created = await request.app[NODE].topology.declare(ExchangeRecord(name=name, type=kind, alternate=alternate))
    log.warning("console: %s declared exchange %s (%s)", who(request), escape(name), kind)
    return web.json_response({"name": name, "type": kind, "alternate": alternate, "created": created},
                             status=201 if created else 200)


async def delete_exchange(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if_unused = request.query.get("if_unused", "false")
    if if_unused not in ("true", "false"):
        raise bad("if_unused", "true or false")
    await request.app[NODE].topology.delete(name, if_unused == "true")
    log.warning("console: %s deleted exchange %s", who(request), escape(name))
    return web.json_response({"deleted": name})


async def bind(request: web.Request) -> web.Response:
    return await _bind(request, True)


async def unbind(request: web.Request) -> web.Response:
    return await _bind(request, False)


async def _bind(request: web.Request, bound: bool) -> web.Response:
    source = request.match_info["name"]
    body = await json_body(request)
    only(body, {"destination", "to_exchange", "routing_key", "arguments"})
    dest, to_exchange = body.get("destination"), body.get("to_exchange", False)
    key, args = body.get("routing_key", ""), body.get("arguments") or {}
    if not isinstance(dest, str) or not dest:
        raise bad("destination", "required: the queue's (or, with to_exchange, the exchange's) name")
    if not isinstance(to_exchange, bool):
        raise bad("to_exchange", "true or false")
    if not isinstance(key, str):
        raise bad("routing_key", "a string")
    if not isinstance(args, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in args.items()):
        raise bad("arguments", "an object of string values (a headers exchange's headers, and x-match)")
    b = BindingRecord(source=source, destination=dest, to_exchange=to_exchange, routing_key=key,
                      arguments=tuple(sorted(args.items())))
    await request.app[NODE].topology.bind(b, bound)
    log.warning("console: %s %s %s %s exchange %s (key %r)", who(request), "bound" if bound else "unbound",
                escape(dest), "to" if bound else "from", escape(source), escape(key))
    return web.json_response({"source": source, "destination": dest, "to_exchange": to_exchange, "routing_key": key,
                              "arguments": args, "bound": bound})
