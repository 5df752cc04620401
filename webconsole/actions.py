"""The operations (the admin permission: role admin, or granted): node settings (priority, quorum override,
designated primary), draining a node, moving a partition, declare, delete and purge a queue, create and delete users,
change their passwords, grant and revoke their permissions (users and grants are the
group's: :mod:`broker.security.security`).  Each is logged with the operator who asked."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from broker.messaging.declare import validate_declare
from broker.security.acl import PERMISSIONS, validate_grant
from broker.logsafe import escape
from broker.partitions.restore import Filter
from broker.security.standing import standing_of
from broker.security.users import make_user
from client.errors import InvalidArgumentError
from client.protocol.frames import Declare, placement_text
from storage.base import AclRecord
from webconsole.auth import SESSION, SESSION_COOKIE, SESSIONS, USER, principal, who
from webconsole.errors import ApiError, bad, json_body, only
from webconsole.group import GROUP
from webconsole.nodeview import NODE, NodeView

log = logging.getLogger("tandem.console")

#: the fields of a declare, and the JSON type each takes
DECLARE_FIELDS: dict[str, type] = {"partitions": int, "ring_size": int, "max_deliveries": int, "max_length": int,
                                   "mapper": str, "dead_letter_queue": str, "max_length_bytes": int, "overflow": str,
                                   "message_ttl": int, "expires": int, "type": str, "max_age": int,
                                   "max_bytes": int, "dead_letter_exchange": str, "dead_letter_routing_key": str}


def _placement(placement: object) -> str:
    """A body's ``placement`` (node lists, one per partition) as the frames carry it."""
    lists = placement.split(";") if isinstance(placement, str) else placement
    if not isinstance(lists, list) or not all(
            isinstance(x, str) or (isinstance(x, list) and all(isinstance(n, str) for n in x)) for x in lists):
        raise bad("placement", "one node list per partition: an array of arrays of node names, or the text "
                               "form \"node1,node2;node2,node1\"")
    text = placement_text(lists)
    if not text:
        raise bad("placement", "one node list per partition (leave it out for the group's dynamic policy)")
    return text


def _target(body: dict[str, Any], request: web.Request) -> str:
    """The node a group setting is for: ``node`` of the body, this one by default."""
    target = body.get("node", request.app[NODE].node.config.name)
    if not isinstance(target, str):
        raise bad("node", "a node name")
    return target


# -- node settings ----------------------------------------------------------------------------------


async def set_priority(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    body = await json_body(request)
    prio = body.get("priority")
    if not isinstance(prio, int) or isinstance(prio, bool) or not 0 <= prio <= 3:
        raise bad("priority", "an integer 0 (never active) .. 3 (highest)")
    await request.app[GROUP].apply_on(name, "priority", prio, who(request))
    return web.json_response({"node": name, "priority": prio})


async def drain_node(request: web.Request) -> web.Response:
    """Drain a member for maintenance: its actives move to other members (broker.partitions.drain)."""
    return await _drain(request, True)


async def undrain_node(request: web.Request) -> web.Response:
    return await _drain(request, False)


async def _drain(request: web.Request, drained: bool) -> web.Response:
    view = request.app[NODE]
    name = request.match_info["name"]
    members = view.drains.group.group_members()
    if members and name not in members:
        raise ApiError(404, "not_found", f"no node {name!r} in this group")
    await view.drains.set(name, drained, f"{who(request)} (console)")
    log.warning("console: %s %s node %s", who(request), "drained" if drained else "undrained", escape(name))
    return web.json_response({"node": name, "drained": drained})


async def finalize_upgrade(request: web.Request) -> web.Response:
    """Raise the group's feature level (``level``, default the highest this node's build knows)
    once every member supports it (broker.partitions.upgrade); the refusal names those that don't."""
    body = await json_body(request)
    level = body.get("level", 0)
    if not isinstance(level, int) or isinstance(level, bool) or level < 0:
        raise bad("level", "a feature level, 1 or more (0 or absent: the highest this node's build knows)")
    view = request.app[NODE]
    await view.levels.finalize(level, f"{who(request)} (console)")
    log.warning("console: %s finalized the group at feature level %d", who(request), view.levels.level)
    return web.json_response({"feature_level": view.levels.level})


async def set_quorum_override(request: web.Request) -> web.Response:
    body = await json_body(request)
    nodes = body.get("nodes")
    if nodes is not None and (not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1):
        raise bad("nodes", "an integer >= 1, or null to clear the override")
    target = _target(body, request)
    await request.app[GROUP].apply_on(target, "quorum_override", -1 if nodes is None else nodes, who(request))
    return web.json_response({"node": target, "quorum_override": nodes})


async def set_designated_primary(request: web.Request) -> web.Response:
    body = await json_body(request)
    on = body.get("on")
    if not isinstance(on, bool):
        raise bad("on", "true or false")
    target = _target(body, request)
    await request.app[GROUP].apply_on(target, "designated_primary", int(on), who(request))
    return web.json_response({"node": target, "designated_primary": on})


# -- queues -------------------------------------------------------------------------------------------


async def create_queue(request: web.Request) -> web.Response:
    body = await json_body(request)
    name = body.get("name")
    if not isinstance(name, str) or not name:
        raise bad("name", "required: the queue's name")
    kwargs: dict[str, Any] = {}
    for field, kind in DECLARE_FIELDS.items():
        if field in body and body[field] is not None:
            v = body[field]
            if not isinstance(v, kind) or isinstance(v, bool):
                raise bad(field, f"expected {kind.__name__}")
            kwargs[field] = v
    placement = body.get("placement")
    if placement is not None:
        kwargs["placement"] = _placement(placement)
    only(body, {"name", "placement", *DECLARE_FIELDS})
    frame = Declare(rid=0, queue=name, **kwargs)
    request.app[NODE].node.acls.check_declare(principal(request), name, frame.dead_letter_queue,
                                                 frame.dead_letter_exchange)
    try:
        validate_declare(frame)
    except InvalidArgumentError as exc:
        raise ApiError(400, "bad_request", exc.message) from None
    info, created = await request.app[NODE].node.catalogue.declare(frame, owner=request[USER])
    log.warning("console: %s declared queue %s", who(request), escape(name))
    return web.json_response({"name": info.name, "partitions": info.partitions, "created": created},
                             status=201 if created else 200)


async def delete_queue(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if_empty = request.query.get("if_empty", "false")
    if if_empty not in ("true", "false"):
        raise bad("if_empty", "true or false")
    await request.app[NODE].node.catalogue.delete(name, if_empty == "true")
    log.warning("console: %s deleted queue %s", who(request), escape(name))
    return web.json_response({"deleted": name})


async def purge_queue(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    purged = await request.app[NODE].node.catalogue.purge(name)
    log.warning("console: %s purged queue %s (%d messages)", who(request), escape(name), purged)
    return web.json_response({"queue": name, "purged": purged})


def _must_exist(view: NodeView, name: str) -> None:
    """404 unless queue ``name`` exists."""
    if name not in view.node.catalogue.queues:
        raise ApiError(404, "not_found", f"queue {name!r} does not exist")


async def move_partition(request: web.Request) -> web.Response:
    """Place a partition on other members (broker.partitions.moves): its copies move while it runs."""
    view = request.app[NODE]
    name = request.match_info["name"]
    try:
        partition = int(request.match_info["partition"])
    except ValueError:
        raise ApiError(404, "not_found", f"no partition {request.match_info['partition']!r}") from None
    _must_exist(view, name)
    body = await json_body(request)
    only(body, {"to", "force_replication"})
    to = body.get("to")
    if not isinstance(to, list) or not to or not all(isinstance(n, str) and n for n in to):
        raise bad("to", "the new node list: a non-empty array of member names, in priority order")
    force = body.get("force_replication", False)
    if not isinstance(force, bool):
        raise bad("force_replication", "true or false")
    await view.moves.move(name, partition, tuple(to), f"{who(request)} (console)", force=force)
    log.warning("console: %s moved partition %s/%d to %s", who(request), escape(name), partition,
                escape(",".join(to)))
    return web.json_response({"queue": name, "partition": partition, "nodes": to, "moving": True})


async def add_partitions(request: web.Request) -> web.Response:
    """Give a queue more partitions (broker.partitions.remap): nothing stored moves until an update."""
    view = request.app[NODE]
    name = request.match_info["name"]
    _must_exist(view, name)
    body = await json_body(request)
    only(body, {"count", "placement"})
    count = body.get("count")
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise bad("count", "how many partitions to add: an integer, 1 or more")
    placement = body.get("placement")
    meta = await view.remaps.add(name, count, _placement(placement) if placement is not None else "",
                                 f"{who(request)} (console)")
    log.warning("console: %s added %d partition(s) to %s", who(request), count, escape(name))
    return web.json_response({"queue": name, "added": count, "partitions": meta.partitions})


async def update_partitions(request: web.Request) -> web.Response:
    """Re-map every message of a queue by its mapper (broker.partitions.remap)."""
    view = request.app[NODE]
    name = request.match_info["name"]
    _must_exist(view, name)
    body = await json_body(request)
    only(body, {"mapper"})
    mapper = body.get("mapper", "")
    if not isinstance(mapper, str):
        raise bad("mapper", "a data mapper's name")
    meta = await view.remaps.update(name, mapper, f"{who(request)} (console)")
    log.warning("console: %s started an update of %s", who(request), escape(name))
    return web.json_response({"queue": name, "mapper": meta.mapper, "partitions": meta.partitions,
                              "updating": True})


async def restore(request: web.Request) -> web.Response:
    """Merge what HA-1014 discarded back into the queues (broker.partitions.restore: ``tandem restore``
    run in the group); the counts per queue and the lines the log has."""
    view = request.app[NODE]
    body = await json_body(request)
    only(body, {"from", "queue", "partition"})
    for name in ("from", "queue"):
        if body.get(name) is not None and (not isinstance(body[name], str) or not body[name]):
            raise bad(name, "a node name" if name == "from" else "a queue name")
    partition = body.get("partition")
    if partition is not None and (not isinstance(partition, int) or isinstance(partition, bool) or partition < 0):
        raise bad("partition", "a partition number, 0 or more")
    f = Filter(body.get("from"), body.get("queue"), partition)
    report = await view.restores.run(f, who(request))
    return web.json_response({**report.json(), "text": report.lines(f.narrowed)})


async def add_member(request: web.Request) -> web.Response:
    """Add a member to the running group (broker.partitions.members): the partitions re-spread over it."""
    view = request.app[NODE]
    body = await json_body(request)
    only(body, {"name", "address", "zone"})
    name, address, zone = body.get("name"), body.get("address"), body.get("zone", "")
    if not isinstance(name, str) or not name:
        raise bad("name", "the new member's name")
    if not isinstance(address, str) or not address:
        raise bad("address", "its peer address, host:port")
    if not isinstance(zone, str):
        raise bad("zone", "its zone (a group with zones), or leave it out")
    await view.group.add(name, address, zone, f"{who(request)} (console)")
    log.warning("console: %s added member %s at %s", who(request), escape(name), escape(address))
    return web.json_response(_group_doc(view, name))


async def remove_member(request: web.Request) -> web.Response:
    """Remove a member (broker.partitions.members): its partitions move to the others, then it leaves."""
    view = request.app[NODE]
    name = request.match_info["name"]
    if name not in view.group.members:
        raise ApiError(404, "not_found", f"no member {name!r} in this group")
    await view.group.remove(name, f"{who(request)} (console)")
    log.warning("console: %s removed member %s", who(request), escape(name))
    return web.json_response(_group_doc(view, name))


def _group_doc(view: NodeView, name: str) -> dict[str, Any]:
    members, _zones, change = view.changes.group_view()
    return {"node": name, "members": members, "group_change": change or None}


# -- users (the group's: broker.security.security) -----------------------------------------------------------


async def create_user(request: web.Request) -> web.Response:
    view = request.app[NODE]
    body = await json_body(request)
    only(body, {"name", "password", "role"})
    name, password, role = body.get("name"), body.get("password"), body.get("role", "monitor")
    if not isinstance(name, str) or not name:
        raise bad("name", "required")
    if not isinstance(password, str):
        raise bad("password", "required, at least 8 characters")
    if not isinstance(role, str):
        raise bad("role", "admin, monitor or user")
    if view.node.users.get(name) is not None:
        raise ApiError(409, "exists", f"user {name!r} exists (POST /api/v1/users/{name}/password changes it)")
    try:
        user = await asyncio.to_thread(make_user, name, password, role)  # PBKDF2: off the loop
    except InvalidArgumentError as exc:
        raise ApiError(400, "bad_request", exc.message) from None
    await view.security.put_user(user, "create")
    log.warning("console: %s created user %s (%s)", who(request), escape(name), role)
    return web.json_response({"name": name, "role": role}, status=201)


async def delete_user(request: web.Request) -> web.Response:
    view = request.app[NODE]
    name = request.match_info["name"]
    if view.node.users.get(name) is None:
        raise ApiError(404, "not_found", f"no user {name!r}")
    if name == request[USER]:
        raise ApiError(409, "conflict", "you cannot delete the user you are logged in as")
    await view.security.drop_user(name)
    request.app[SESSIONS].end_user(name)
    log.warning("console: %s deleted user %s", who(request), escape(name))
    return web.json_response({"deleted": name})


async def change_password(request: web.Request) -> web.Response:
    """A new password for a user; their other browser sessions end (the asking one stays)."""
    view = request.app[NODE]
    name = request.match_info["name"]
    old = view.node.users.get(name)
    if old is None:
        raise ApiError(404, "not_found", f"no user {name!r}")
    body = await json_body(request)
    password = body.get("password")
    if not isinstance(password, str):
        raise bad("password", "required, at least 8 characters")
    try:
        user = await asyncio.to_thread(make_user, name, password, old.role)
    except InvalidArgumentError as exc:
        raise ApiError(400, "bad_request", exc.message) from None
    await view.security.put_user(user, "password")
    request.app[SESSIONS].end_user(name, keep=request.cookies.get(SESSION_COOKIE))
    sess = request[SESSION]
    if sess is not None and sess.user == name:  # the asking session stands on the new password
        sess.standing = standing_of(view.node.users, view.node.acls, name) or sess.standing
    log.warning("console: %s changed the password of %s", who(request), escape(name))
    return web.json_response({"name": name, "changed": True})


# -- grants -------------------------------------------------------------------------------------------


def _grant_body(body: dict[str, Any]) -> AclRecord:
    only(body, {"user", "pattern", "permissions"})
    user, pattern, perms = body.get("user"), body.get("pattern"), body.get("permissions")
    if not isinstance(user, str) or not user:
        raise bad("user", "required: the user's name")
    if not isinstance(pattern, str) or not pattern:
        raise bad("pattern", "required: a queue name pattern such as orders.* or *")
    if not isinstance(perms, list) or not perms or not all(isinstance(p, str) for p in perms):
        raise bad("permissions", f"a non-empty list of {', '.join(PERMISSIONS)}")
    try:
        return validate_grant(user, pattern, perms)
    except InvalidArgumentError as exc:
        raise ApiError(400, "bad_request", exc.message) from None


async def grant(request: web.Request) -> web.Response:
    view = request.app[NODE]
    acl = _grant_body(await json_body(request))
    if view.node.users.get(acl.user) is None:
        raise ApiError(404, "not_found", f"no user {acl.user!r}")
    await view.security.grant(acl)
    log.warning("console: %s granted %s on %s to %s", who(request), ",".join(acl.permissions), escape(acl.pattern),
                escape(acl.user))
    return web.json_response(acl_json(acl))


async def revoke(request: web.Request) -> web.Response:
    view = request.app[NODE]
    acl = _grant_body(await json_body(request))
    if view.node.users.get(acl.user) is None:
        raise ApiError(404, "not_found", f"no user {acl.user!r}")
    await view.security.revoke(acl)
    log.warning("console: %s revoked %s on %s from %s", who(request), ",".join(acl.permissions),
                escape(acl.pattern), escape(acl.user))
    return web.json_response(acl_json(acl))


def acl_json(acl: AclRecord) -> dict[str, Any]:
    return {"user": acl.user, "pattern": acl.pattern, "permissions": list(acl.permissions)}
