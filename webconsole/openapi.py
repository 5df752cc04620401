"""The OpenAPI 3.0 document of the admin REST API (served at /api/v1/openapi.json)."""

from __future__ import annotations

from typing import Any

from broker import __version__
from storage.topology import EXCHANGE_TYPES

_ERROR = {"$ref": "#/components/schemas/Error"}
_NODE = {"$ref": "#/components/schemas/Node"}
_GROUP = {"$ref": "#/components/schemas/Group"}
_OBJ: dict[str, Any] = {"type": "object"}


def _resp(desc: str, schema: dict[str, Any] | None = None, extra: dict[int, str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"200": {"description": desc, "content": {"application/json": {"schema": schema or _OBJ}}}}
    for code, text in {401: "not logged in", 429: "too many failed logins from this address: try again later",
                       **(extra or {})}.items():
        out[str(code)] = {"description": text, "content": {"application/json": {"schema": _ERROR}}}
    return out


def _body(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": {
        "type": "object", "properties": props, **({"required": required} if required else {}),
        "additionalProperties": False}}}}


def _t(kind: str, nullable: bool = False, **kw: Any) -> dict[str, Any]:
    return {"type": kind, **({"nullable": True} if nullable else {}), **kw}


_STRINGS = {"type": "array", "items": {"type": "string"}}
#: message counts per queue
_COUNTS = {"type": "object", "additionalProperties": {"type": "integer"}}
_HA_STATE = _t("string", True, description="this member's HA state: shared mode's PASSIVE, ACTIVATING, ACTIVE, "
               "DEAD, or the LockFile arbiter's WAITING, STANDALONE, ACTIVE_SYNC, ACTIVE, PASSIVE_SYNC, PASSIVE, "
               "DEAD; null under majority elections or when the member does not answer")
_SCHEMAS: dict[str, Any] = {
    "Node": {"type": "object", "description": "a member of the group, as it reports itself", "properties": {
        "name": _t("string"), "state": _t("string", description="Up, Down, Unreachable, ... (as this node sees it)"),
        "self": _t("boolean", description="the node serving this console"),
        "priority": _t("integer", True), "votes": _t("integer", True), "quorum_state": _t("string", True),
        "version": _t("string", True), "store_stamp": _t("string"), "peer_address": _t("string", True),
        "client_address": _t("string", True), "designated_primary": _t("boolean", True),
        "console": _t("string", True, description="its console's address (null: it serves none, or does not "
                      "answer)"),
        "ha_1014_discarded": _t("integer", True), "actives": _STRINGS, "ha_state": _HA_STATE,
        "epoch": _t("integer", True, description="the activation (shared) or lock (lockfile) epoch it last "
                    "served or saw; null under majority elections"),
        "lock_holder": _t("string", True, description="the lock or lease holder it knows (null: none, unknown, "
                          "or majority elections)"),
        "drained": _t("boolean", description="drained for maintenance (tandem node drain): active for nothing "
                      "while another member can be, still a replica and a voter"),
        "zone": _t("string", True, description="its zone (the zones setting): a partition's copies are in "
                   "distinct zones; null without zones"),
        "availability_zones": {"type": "array", "description": "the availability zones it is in, with their "
                               "quorum as it counts it: Disabled in any of them turns its HA services off",
                               "items": {"type": "object", "properties": {
                                   "name": _t("string"), "state": _t("string", description="Active, Partial, "
                                                                     "Disabled"),
                                   "up_votes": _t("integer"), "total_votes": _t("integer"),
                                   "policy": _t("string"), "members": _STRINGS}}}},
        "required": ["name", "state", "self", "actives", "ha_state", "epoch", "lock_holder", "drained"]},
    "Group": {"type": "object", "description": "the group's quorum and how it decides its active", "properties": {
        "members": _STRINGS, "quorum_policy": _t("string"), "quorum_state": _t("string"),
        "quorum_override": _t("integer", True), "designated_primary": _STRINGS,
        "mode": _t("string", enum=["replicated", "shared", "single"]),
        "arbiter": _t("string", enum=["majority", "lockfile", "witness"]),
        "lock_holder": _t("string", True, description="the lock or lease holder, as the member that saw the "
                          "latest epoch reports it (null: none, or majority elections)"),
        "epoch": _t("integer", True, description="that latest epoch (null under majority elections)"),
        "moving": {"type": "array", "items": _t("string"), "description": "the partition moves under way "
                   "(tandem partition move): \"queue/partition node,node,...\", the new node list"},
        "group_change": _t("string", True, description="the change of members under way (tandem group add / "
                           "remove), partitions re-spreading; null: none")},
        "required": ["members", "quorum_state", "mode", "arbiter", "lock_holder", "epoch"]},
}

_PERMISSIONS = {"type": "array", "minItems": 1, "items": {
    "type": "string", "enum": ["produce", "consume", "browse", "configure", "admin", "all"]},
    "description": "produce (publish), consume (subscribe, get), browse (read a stream, look without "
                   "consuming), configure (declare, delete, purge), admin (users, grants, quorum override, "
                   "options; on the pattern * only), all"}
_PATTERN = {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[A-Za-z0-9_.:@*?-]+$",
            "description": "a queue name glob: * any characters, ? one (orders.*, *)"}
_USER = {"type": "object", "properties": {"name": _t("string"), "role": _t("string")}, "required": ["name", "role"]}
_ACL = {"type": "object", "properties": {"user": _t("string"), "pattern": _t("string"), "permissions": _STRINGS},
        "required": ["user", "pattern", "permissions"]}
_GRANT = _body({"user": {"type": "string", "minLength": 1}, "pattern": _PATTERN, "permissions": _PERMISSIONS},
               ["user", "pattern", "permissions"])

_MEMBERS_CHANGED = {"type": "object", "properties": {
    "node": _t("string"), "members": _STRINGS, "group_change": _t("string", True)}}
_NAME = [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}]
_RANGE = {"type": "array", "items": {"type": "integer"}, "nullable": True}
_UPGRADE = {"type": "object", "properties": {
    "node": _t("string"), "build": _t("string"), "protocol": _RANGE, "feature_levels": _RANGE,
    "feature_level": _t("integer"), "level_meaning": _t("string"),
    "members": {"type": "array", "items": {"type": "object", "properties": {
        "name": _t("string"), "build": _t("string", True), "protocol": _RANGE, "levels": _RANGE,
        "level": _t("integer", True), "linked": _t("boolean"), "this_node": _t("boolean"), "state": _t("string")},
        "required": ["name", "build", "protocol", "levels", "level", "linked", "this_node"]}},
    "type_mismatches": {"type": "array", "items": {"type": "object", "properties": {
        "member": _t("string"), "type": _t("string"), "ours": _t("integer"), "theirs": _t("integer"),
        "converts": {"type": "string", "enum": ["here", "there", "none"]}, "convertible": _t("boolean")}}},
    "type_errors": _t("integer"), "finalize_to": _t("integer"), "finalizable": _t("boolean"),
    "finalize_refusal": _t("string", True)},
    "required": ["node", "build", "feature_level", "members", "finalizable"]}
_EXCHANGE = {"type": "object", "properties": {
    "name": _t("string"), "type": {"type": "string", "enum": list(EXCHANGE_TYPES)}, "alternate": _t("string", True),
    "bindings": {"type": "array", "items": {"type": "object", "properties": {
        "destination": _t("string"), "to_exchange": _t("boolean"), "routing_key": _t("string"),
        "arguments": {"type": "object", "additionalProperties": {"type": "string"}}}}}},
    "required": ["name", "type", "alternate", "bindings"]}
_BINDING = _body({"destination": _t("string"), "to_exchange": _t("boolean"), "routing_key": _t("string"),
                  "arguments": {"type": "object", "additionalProperties": {"type": "string"}}}, ["destination"])
_CHANGE = {400: "bad input (the field is named)", 403: "a user without the admin permission, or a missing CSRF "
                                                       "token"}


def document() -> dict[str, Any]:
    paths: dict[str, Any] = {
        "/healthz": {"get": {"summary": "liveness (no login needed)", "security": [],
                             "responses": {"200": {"description": "the node answers",
                                                   "content": {"application/json": {"schema": _OBJ}}}}}},
        "/api/v1/session": {"get": {"summary": "who is logged in, their role and the CSRF token",
                                    "responses": _resp("the session")}},
        "/api/v1/overview": {"get": {"summary": "the whole group: nodes, group, partitions, queues, events",
                                     "responses": _resp("overview", {"type": "object", "properties": {
                                         "node": _t("string"), "group": _GROUP,
                                         "nodes": {"type": "array", "items": _NODE}}})}},
        "/api/v1/nodes": {"get": {"summary": "every member: state, priority, votes, quorum, addresses, actives, "
                                             "HA state, epoch, lock holder",
                                  "responses": _resp("nodes", {"type": "array", "items": _NODE})}},
        "/api/v1/nodes/{name}": {"get": {"summary": "one member", "parameters": _NAME,
                                         "responses": _resp("the node", _NODE, extra={404: "no such node"})}},
        "/api/v1/nodes/{name}/priority": {"post": {
            "summary": "set a node's election priority (0 never active .. 3 highest), at once",
            "parameters": _NAME,
            "requestBody": _body({"priority": {"type": "integer", "minimum": 0, "maximum": 3}}, ["priority"]),
            "responses": _resp("set", extra={**_CHANGE, 404: "no such node"})}},
        "/api/v1/nodes/{name}/drain": {"post": {
            "summary": "drain a member for maintenance: the group's state; each partition active on it moves to "
                       "another member once that one is caught up (it stays a replica and a voter)",
            "parameters": _NAME,
            "responses": _resp("drained", {"type": "object", "properties": {
                "node": _t("string"), "drained": _t("boolean")}},
                extra={**_CHANGE, 400: "already drained, the last member not drained, or not a replication group",
                       404: "no such node"})}},
        "/api/v1/nodes/{name}/undrain": {"post": {
            "summary": "undrain a member: failback hands back the partitions it is placed first for",
            "parameters": _NAME,
            "responses": _resp("undrained", {"type": "object", "properties": {
                "node": _t("string"), "drained": _t("boolean")}},
                extra={**_CHANGE, 400: "not drained, or not a replication group", 404: "no such node"})}},
        "/api/v1/group": {"get": {"summary": "members, quorum policy and state, overrides; mode, arbiter, lock holder",
                                  "responses": _resp("the group", _GROUP)}},
        "/api/v1/upgrade": {"get": {
            "summary": "each member's build, protocol versions and feature levels, the group's feature level, the "
                       "record types members define differently, and whether the group can be finalized (as "
                       "tandem upgrade status --json; docs/upgrades.md)",
            "responses": _resp("the upgrade status", _UPGRADE)}},
        "/api/v1/upgrade/finalize": {"post": {
            "summary": "raise the group's feature level once every member supports it (tandem upgrade finalize); "
                       "no going back to an older build after it",
            "requestBody": _body({"level": {"type": "integer", "minimum": 0}}, []),
            "responses": _resp("finalized", {"type": "object", "properties": {"feature_level": _t("integer")}},
                               extra={**_CHANGE, 400: "a member's build does not support the level, a member is not "
                                                      "linked, the group is at it already, or shared mode"})}},
        "/api/v1/group/quorum-override": {"post": {
            "summary": "operator override of the node quorum on a node (null clears it); logged loudly",
            "requestBody": _body({"nodes": {"type": "integer", "minimum": 1, "nullable": True},
                                  "node": {"type": "string"}}, ["nodes"]),
            "responses": _resp("set", extra={**_CHANGE, 404: "no such node"})}},
        "/api/v1/group/designated-primary": {"post": {
            "summary": "two-node group: let a node go on alone (or stop that)",
            "requestBody": _body({"on": {"type": "boolean"}, "node": {"type": "string"}}, ["on"]),
            "responses": _resp("set", extra={**_CHANGE, 404: "no such node"})}},
        "/api/v1/queues": {
            "get": {"summary": "every queue with its depth, counters and rates",
                    "responses": _resp("queues", {"type": "array", "items": _OBJ})},
            "post": {"summary": "declare a queue (idempotent for the same settings)",
                     "requestBody": _body({
                         "name": {"type": "string", "minLength": 1}, "partitions": {"type": "integer"},
                         "mapper": {"type": "string", "description": "jump_hash (the default for a new queue), "
                                    "consistent_hash, round_robin, or an installed custom mapper "
                                    "(entry point group tandem.mappers)"},
                         "ring_size": {"type": "integer"}, "max_deliveries": {"type": "integer"},
                         "dead_letter_queue": {"type": "string", "nullable": True,
                                               "description": "needs produce on it (403 otherwise); not tandem.*"},
                         "dead_letter_exchange": {"type": "string", "nullable": True,
                                                  "description": "instead of dead_letter_queue: dead letters are "
                                                  "published to this exchange; needs produce on it (403 "
                                                  "otherwise); in a group, needs feature level 8"},
                         "dead_letter_routing_key": {"type": "string", "nullable": True,
                                                     "description": "with dead_letter_exchange: the routing key "
                                                     "(default: the one each message was published with)"},
                         "max_length": {"type": "integer", "description": "messages held (ready, delivered and "
                                        "unsettled) past which a publish overflows; 0: no bound"},
                         "max_length_bytes": {"type": "integer", "description": "bytes of ready messages "
                                              "(bodies and headers) past which a publish overflows; 0: no bound"},
                         "overflow": {"type": "string", "enum": ["reject-publish", "drop-head"],
                                      "description": "reject-publish (refused, the default) or drop-head (the "
                                      "oldest ready messages go to the dead-letter queue, or are dropped); in a "
                                      "group, needs feature level 3 (400 otherwise)"},
                         "message_ttl": {"type": "integer", "description": "milliseconds a message may wait "
                                         "before it expires (dead-lettered or dropped, never delivered); 0: for "
                                         "ever; in a group, needs feature level 3"},
                         "expires": {"type": "integer", "description": "milliseconds the queue may go unused "
                                     "(no consumer, get or declare on any member) before it is deleted with its "
                                     "messages; 0: never; in a group, needs feature level 3"},
                         "type": {"type": "string", "enum": ["classic", "stream"],
                                  "description": "classic (consumed messages go; the default) or stream (messages "
                                  "stay, read by offset, until max_age or max_bytes drops them); a stream takes none "
                                  "of max_deliveries, dead_letter_queue, max_length, max_length_bytes, overflow, "
                                  "message_ttl; in a group, needs feature level 5"},
                         "max_age": {"type": "integer", "description": "a stream's retention: milliseconds a "
                                     "message is kept (whole chunks go); 0: for ever"},
                         "max_bytes": {"type": "integer", "description": "a stream's retention: bytes each "
                                       "partition keeps (whole chunks go); 0: no bound"},
                         "placement": {"description": "static distribution, in a replication group: one node list "
                                       "per partition in priority order, each node NAME, NAME:sync or NAME:async "
                                       "(absent: the group's dynamic policy places the partitions)",
                                       "oneOf": [{"type": "string", "example": "node1,node2,node3:async;node2,node3,"
                                                  "node1"},
                                                 {"type": "array", "items": {"type": "array",
                                                                             "items": {"type": "string"}}}]}},
                        ["name"]),
                     "responses": {**_resp("exists already with these settings", extra={
                         **_CHANGE, 409: "exists with other settings"}),
                         "201": {"description": "created", "content": {"application/json": {"schema": _OBJ}}}}}},
        "/api/v1/queues/{name}": {
            "get": {"summary": "one queue, per partition", "parameters": _NAME,
                    "responses": _resp("the queue", extra={404: "no such queue"})},
            "delete": {"summary": "delete a queue", "parameters": _NAME + [
                {"name": "if_empty", "in": "query", "required": False,
                 "schema": {"type": "string", "enum": ["true", "false"]}}],
                "responses": _resp("deleted", extra={**_CHANGE, 404: "no such queue"})}},
        "/api/v1/queues/{name}/purge": {"post": {
            "summary": "drop a queue's ready messages", "parameters": _NAME,
            "responses": _resp("purged", extra={**_CHANGE, 404: "no such queue"})}},
        "/api/v1/queues/{name}/partitions/{partition}/move": {"post": {
            "summary": "place a partition on other members, in priority order (tandem partition move): its copies "
                       "move while it runs; its state shows Replicating, then Migrating, then Active, and the group "
                       "lists it under moving until done",
            "parameters": _NAME + [{"name": "partition", "in": "path", "required": True,
                                    "schema": {"type": "integer", "minimum": 0}}],
            "requestBody": _body({"to": {"type": "array", "items": {"type": "string"}, "minItems": 1,
                                         "description": "member names in priority order; name:sync or "
                                                        "name:async sets a node's kind (default: by position)"},
                                  "force_replication": {"type": "boolean", "description": "then copy every replica "
                                                        "of the list afresh from the active, one at a time (also "
                                                        "where the partition is on that list already)"}},
                                 ["to"]),
            "responses": _resp("the move is under way", {"type": "object", "properties": {
                "queue": _t("string"), "partition": _t("integer"), "nodes": {"type": "array", "items": _t("string")},
                "moving": _t("boolean")}},
                extra={**_CHANGE, 400: "an unknown member, a node twice, a partition already moving or already "
                                       "there, or not a replication group",
                       404: "no such queue or partition"})}},
        "/api/v1/queues/{name}/partitions": {"post": {
            "summary": "give a queue more partitions (tandem partition add): clients map what they send from then on "
                       "over every partition; nothing stored moves until an update",
            "parameters": _NAME,
            "requestBody": _body({"count": {"type": "integer", "minimum": 1},
                                  "placement": {"description": "the new partitions' node lists, for a queue "
                                                "declared with lists",
                                                "oneOf": [{"type": "string"},
                                                          {"type": "array", "items": {"type": "array",
                                                                                      "items": {"type": "string"}}}]}},
                                 ["count"]),
            "responses": _resp("added", {"type": "object", "properties": {
                "queue": _t("string"), "added": _t("integer"), "partitions": _t("integer")}},
                extra={**_CHANGE, 400: "too many partitions, an update under way, a static queue without lists, "
                                       "or shared mode",
                       404: "no such queue"})}},
        "/api/v1/queues/{name}/update": {"post": {
            "summary": "re-map every message of a queue by its data mapper (tandem partition update), after an "
                       "audit that every member sees the queue alike; the group lists it under updating until "
                       "every partition is done",
            "parameters": _NAME,
            "requestBody": _body({"mapper": {"type": "string", "description": "install this data mapper first"}},
                                 []),
            "responses": _resp("under way", {"type": "object", "properties": {
                "queue": _t("string"), "mapper": _t("string"), "partitions": _t("integer"),
                "updating": _t("boolean")}},
                extra={**_CHANGE, 400: "an update under way, a mapper that does not load or places by turn, members "
                                       "that disagree, or shared mode",
                       404: "no such queue"})}},
        "/api/v1/restore": {"post": {
            "summary": "merge what HA-1014 discarded after a split brain (the queue tandem.quarantine) back into its "
                       "queues, as tandem restore does: each message is published to its queue again with the id of "
                       "where it lands (its old one in x-tandem-restored-id) and taken out of the quarantine; run "
                       "again, nothing is stored twice. A key conflict goes to the node's compensation hook, if it "
                       "was started with one. Logged, and in the node's events",
            "requestBody": {"required": False, "content": {"application/json": {"schema": {
                "type": "object", "additionalProperties": False, "properties": {
                    "from": _t("string", minLength=1, description="only what this node discarded"),
                    "queue": _t("string", minLength=1, description="only messages of this queue"),
                    "partition": _t("integer", minimum=0, description="only messages of this partition")}}}}},
            "responses": _resp("done: counts per queue", {"type": "object", "properties": {
                "restored": _COUNTS, "already": _COUNTS, "conflicts": _COUNTS, "left": _COUNTS,
                "dropped": {**_COUNTS, "description": "key conflicts the compensation hook (the node's "
                            "--compensation) dropped: not restored"},
                "merged": {**_COUNTS, "description": "key conflicts restored in the version the hook made"},
                "failed": {**_COUNTS, "description": "key conflicts the hook failed on: left in the quarantine"},
                "held": {**_COUNTS, "description": "left in the quarantine behind one the hook failed on (a "
                         "partition's messages go back in order)"},
                "resent": {**_COUNTS, "description": "not restored: their producer sent them again after the "
                           "split, unconfirmed, and the queue holds them (taken out of the quarantine)"},
                "unsure": {**_COUNTS, "description": "restored, though the queue may have delivered a resend of "
                           "theirs already (their producer went on there past them)"},
                "more": _t("boolean", description="the run stopped after 20 s, or moved: call again for the rest"),
                "moved": _t("boolean", description="the run stopped early: the quarantine's partition moved to "
                            "another member during it"),
                "text": {"type": "array", "items": _t("string")}}},
                extra={**_CHANGE, 503: "a partition of the quarantine has no active, or its member does not answer"})}},
        "/api/v1/exchanges": {
            "get": {"summary": "every exchange with the bindings from it (docs/messaging.md)",
                    "responses": _resp("exchanges", {"type": "array", "items": _EXCHANGE})},
            "post": {"summary": "declare an exchange (idempotent for the same type and alternate); in a group, "
                                "needs feature level 4",
                     "requestBody": _body({"name": _t("string"), "type": {"type": "string", "enum": list(EXCHANGE_TYPES)},
                                           "alternate": _t("string", True)}, ["name"]),
                     "responses": {**_resp("exists already with these settings", extra={
                         **_CHANGE, 409: "exists with another type or alternate"}),
                         "201": {"description": "created", "content": {"application/json": {"schema": _OBJ}}}}}},
        "/api/v1/exchanges/{name}": {"delete": {
            "summary": "delete an exchange and every binding from or to it", "parameters": _NAME + [
                {"name": "if_unused", "in": "query", "required": False,
                 "schema": {"type": "string", "enum": ["true", "false"]}}],
            "responses": _resp("deleted", extra={**_CHANGE, 404: "no such exchange"})}},
        "/api/v1/exchanges/{name}/bindings": {"post": {
            "summary": "bind a queue (or, with to_exchange, an exchange) to this exchange", "parameters": _NAME,
            "requestBody": _BINDING, "responses": _resp("bound", extra={**_CHANGE, 404: "no such exchange or queue"})}},
        "/api/v1/exchanges/{name}/unbind": {"post": {
            "summary": "remove a binding (the fields it was bound with)", "parameters": _NAME,
            "requestBody": _BINDING, "responses": _resp("unbound", extra={**_CHANGE, 404: "no such exchange"})}},
        "/api/v1/group/members": {"post": {
            "summary": "add a member to the running group (tandem group add): the group's state; the members link "
                       "to it at its peer address and the partitions re-spread over the members (group_change "
                       "says while)",
            "requestBody": _body({"name": {"type": "string", "minLength": 1}, "address": {
                "type": "string", "description": "its peer address, host:port"}, "zone": {
                "type": "string", "description": "its zone, in a group whose members have zones"}},
                ["name", "address"]),
            "responses": _resp("added", _MEMBERS_CHANGED, extra={
                **_CHANGE, 400: "a member already, an address in use, a change under way, a zone missing (or "
                                "given without zones), or not a replication group under majority elections"})}},
        "/api/v1/group/members/{name}": {"delete": {
            "summary": "remove a member (tandem group remove): its partitions move to the other members, then it "
                       "leaves the list and the others stop linking to it",
            "parameters": _NAME,
            "responses": _resp("leaving", _MEMBERS_CHANGED, extra={
                **_CHANGE, 400: "a change under way, fewer than two members left, or not a replication group",
                404: "no such member"})}},
        "/api/v1/partitions": {"get": {
            "summary": "every partition as its active reports it: state, active, replicas and lag, term, commit",
            "parameters": [{"name": "queue", "in": "query", "required": False, "schema": {"type": "string"}}],
            "responses": _resp("partitions", {"type": "array", "items": _OBJ})}},
        "/api/v1/events": {"get": {"summary": "recent HA events of the group (HA-1014, elections, overrides, intruders refused on a peer port)",
                                   "responses": _resp("events", {"type": "array", "items": _OBJ})}},
        "/api/v1/events/stream": {"get": {
            "summary": "Server-Sent Events: `ha` for each new event, `overview` every second",
            "responses": {"200": {"description": "an event stream",
                                  "content": {"text/event-stream": {"schema": {"type": "string"}}}},
                          "401": {"description": "not logged in",
                                  "content": {"application/json": {"schema": _ERROR}}}}}},
        "/api/v1/users": {
            "get": {"summary": "the group's users and their roles",
                    "responses": _resp("users", {"type": "array", "items": _USER})},
            "post": {"summary": "create a user of the group (visible on every member once committed)",
                     "requestBody": _body({"name": {"type": "string", "minLength": 1},
                                           "password": {"type": "string", "minLength": 8},
                                           "role": {"type": "string", "enum": ["admin", "monitor", "user"],
                                                    "description": "admin: everything; monitor: looks at "
                                                    "everything; user: what its grants allow (default monitor)"}},
                                          ["name", "password"]),
                     "responses": {**_resp("-", extra={**_CHANGE, 409: "exists"}),
                                   "201": {"description": "created",
                                           "content": {"application/json": {"schema": _USER}}}}}},
        "/api/v1/users/{name}": {"delete": {"summary": "delete a user and its grants (its sessions end)",
                                            "parameters": _NAME,
                                            "responses": _resp("deleted", extra={**_CHANGE, 404: "no such user"})}},
        "/api/v1/users/{name}/password": {"post": {
            "summary": "change a user's password (its role and grants stay)", "parameters": _NAME,
            "requestBody": _body({"password": {"type": "string", "minLength": 8}}, ["password"]),
            "responses": _resp("changed", extra={**_CHANGE, 404: "no such user"})}},
        "/api/v1/acls": {
            "get": {"summary": "the group's grants: permissions of a user on the queues matching a pattern",
                    "parameters": [{"name": "user", "in": "query", "required": False, "schema": {"type": "string"},
                                    "description": "only this user's grants"}],
                    "responses": _resp("grants", {"type": "array", "items": _ACL})},
            "post": {"summary": "grant permissions (added to what the user holds on the pattern)",
                     "requestBody": _GRANT,
                     "responses": _resp("granted", _ACL, extra={**_CHANGE, 404: "no such user"})}},
        "/api/v1/acls/revoke": {"post": {
            "summary": "revoke permissions (only those named; the others stay)", "requestBody": _GRANT,
            "responses": _resp("revoked", _ACL, extra={**_CHANGE, 404: "no such user"})}},
        "/metrics": {"get": {"summary": "Prometheus metrics of this node",
                             "responses": {"200": {"description": "text exposition format",
                                                   "content": {"text/plain": {"schema": {"type": "string"}}}},
                                           "401": {"description": "not logged in",
                                                   "content": {"application/json": {"schema": _ERROR}}}}}},
    }
    for path, ops in paths.items():
        for method, op in ops.items():
            op["operationId"] = method + path.replace("/api/v1", "").replace("/", "_").replace("{", "").replace(
                "}", "").replace("-", "_")
    return {
        "openapi": "3.0.3",
        "info": {"title": "Tandem admin API", "version": __version__,
                 "description": "The management API every Tandem node serves on its http port. Log in at "
                                "/login (cookie + X-CSRF-Token on changes) or use HTTP Basic."},
        "servers": [{"url": "/"}],
        "security": [{"basic": []}, {"cookie": []}],
        "components": {
            "securitySchemes": {"basic": {"type": "http", "scheme": "basic"},
                                "cookie": {"type": "apiKey", "in": "cookie", "name": "tandem_session"}},
            "schemas": {"Error": {"type": "object", "required": ["code", "error", "message"], "properties": {
                "code": {"type": "integer"}, "error": {"type": "string"}, "message": {"type": "string"}}},
                **_SCHEMAS},
        },
        "paths": paths,
    }
