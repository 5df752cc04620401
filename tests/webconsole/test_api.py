"""The admin REST API of one in-process node: authentication, roles, CSRF, every endpoint
with good and bad input, the OpenAPI document, metrics."""

from __future__ import annotations

import base64
import re
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

import client
import msgpack
from broker.partitions.compensation import DROP, KEEP, Conflict, Version
from broker.cli import console_view
from broker.config import NodeConfig
from broker.node.node import Node
from broker.messaging.publish import PublishRequest
from broker.partitions.quarantine import QUEUE as QUARANTINE
from client.errors import AccessRefusedError
from ha.upgrade import LEVEL_MAX
from client.protocol.frames import PublishMessage
from storage.base import Append, StoredMessage
from tests.conftest import PASSWORD, url_of
from tests.helpers import wait_until
from webconsole.app import Console, serve_console


@pytest_asyncio.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    n = Node(NodeConfig(data_dir=tmp_path / "n", port=0))
    await n.start()
    try:
        yield n
    finally:
        await n.stop()


@pytest_asyncio.fixture
async def console(node: Node) -> AsyncIterator[Console]:
    """The node's console, served as the entry point serves it."""
    c = await serve_console(console_view(node), "127.0.0.1", 0)
    try:
        yield c
    finally:
        await c.stop()


@pytest_asyncio.fixture
async def http(console: Console) -> AsyncIterator[tuple[aiohttp.ClientSession, str]]:
    assert console.address is not None
    base = f"http://127.0.0.1:{console.address[1]}"
    async with aiohttp.ClientSession() as s:
        yield s, base


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


ADMIN = basic("admin", PASSWORD)


async def call(s: aiohttp.ClientSession, method: str, url: str, *, auth: dict[str, str] | None = ADMIN,
               headers: dict[str, str] | None = None, **kw: Any) -> tuple[int, Any]:
    async with s.request(method, url, headers={**(auth or {}), **(headers or {})}, **kw) as r:
        body = await r.json() if r.content_type == "application/json" else await r.text()
        return r.status, body


@pytest.mark.asyncio
async def test_nothing_without_a_login_but_health_and_the_login_page(http: tuple[aiohttp.ClientSession, str]) -> None:
    from webconsole.openapi import document

    s, base = http
    assert (await call(s, "GET", f"{base}/healthz", auth=None))[0] == 200
    assert (await call(s, "GET", f"{base}/login", auth=None))[0] == 200
    for path, ops in document()["paths"].items():
        if path == "/healthz":
            continue
        for method in ops:
            status, body = await call(s, method.upper(), base + path.replace("{name}", "x"), auth=None,
                                      json={})
            assert status == 401, (method, path, status)
            assert body["error"] == "unauthenticated"
    async with s.get(f"{base}/", allow_redirects=False) as r:  # the console page sends a browser to log in
        assert r.status == 302 and r.headers["Location"] == "/login"
    status, _ = await call(s, "GET", f"{base}/api/v1/overview", auth=basic("admin", "wrong-password"))
    assert status == 401


@pytest.mark.asyncio
async def test_read_endpoints(http: tuple[aiohttp.ClientSession, str], node: Node) -> None:
    s, base = http
    async with await client.connect(url_of(node)) as conn:
        await conn.declare_queue("orders", partitions=3)
        await conn.producer("orders").send_many([b"a", b"b", b"c"])
    status, ov = await call(s, "GET", f"{base}/api/v1/overview")
    assert status == 200 and ov["node"] == "node1"
    assert [n["name"] for n in ov["nodes"]] == ["node1"] and ov["nodes"][0]["state"] == "Up"
    (q,) = ov["queues"]
    assert (q["name"], q["partitions"], q["ready"], q["published"]) == ("orders", 3, 3, 3)
    status, detail = await call(s, "GET", f"{base}/api/v1/queues/orders")
    assert status == 200 and sum(p["ready"] for p in detail["partition_stats"]) == 3
    assert (await call(s, "GET", f"{base}/api/v1/queues/nope"))[0] == 404
    for path in ("nodes", "nodes/node1", "group", "queues", "partitions", "events", "users", "session"):
        status, _ = await call(s, "GET", f"{base}/api/v1/{path}")
        assert status == 200, path
    assert (await call(s, "GET", f"{base}/api/v1/nodes/nobody"))[0] == 404
    status, text = await call(s, "GET", f"{base}/metrics")
    assert status == 200
    for metric in ("tandem_connections", "tandem_messages_published_total", "tandem_partition_depth",
                   "tandem_store_commit_seconds_bucket", "tandem_publish_confirms_total",
                   "tandem_auth_failures_total", "tandem_logins_throttled_total", "tandem_limit_refusals_total",
                   "tandem_login_throttle_addresses", "tandem_disk_alarm", "tandem_disk_free_bytes",
                   "tandem_disk_free_limit_bytes", "tandem_disk_alarm_refusals_total", "tandem_memory_limit_bytes",
                   "tandem_messages_cold", "tandem_cold_bytes"):
        assert metric in text, metric
    # the three messages are held in memory, each counted with its object's estimate
    (held,) = [line for line in text.splitlines() if line.startswith("tandem_memory_held_bytes{")]
    assert float(held.rsplit(" ", 1)[1]) == 3 * (1 + 1 + 200)


@pytest.mark.asyncio
async def test_the_openapi_document_validates(http: tuple[aiohttp.ClientSession, str]) -> None:
    from openapi_spec_validator import validate

    s, base = http
    status, doc = await call(s, "GET", f"{base}/api/v1/openapi.json")
    assert status == 200
    validate(doc)


@pytest.mark.asyncio
async def test_queue_operations_and_bad_input(http: tuple[aiohttp.ClientSession, str]) -> None:
    s, base = http
    q = f"{base}/api/v1/queues"
    assert (await call(s, "POST", q, json={"name": "jobs", "partitions": 2}))[0] == 201
    assert (await call(s, "POST", q, json={"name": "jobs", "partitions": 2}))[0] == 200  # idempotent
    assert (await call(s, "POST", q, json={"name": "jobs", "partitions": 5}))[0] == 409
    for body, field in (({}, "name"), ({"name": "x", "partitions": "two"}, "partitions"),
                        ({"name": "x", "partitions": 0}, "partitions"), ({"name": "x", "colour": 1}, "colour"),
                        ({"name": "x", "mapper": "random"}, "mapper"), ({"name": "x", "overflow": "drop"}, "overflow"),
                        ({"name": "x", "max_length_bytes": -1}, "max_length_bytes")):
        status, err = await call(s, "POST", q, json=body)
        assert status == 400 and field in err["message"], (body, err)
    bounded = {"name": "recent", "max_length": 100, "max_length_bytes": 4096, "overflow": "drop-head"}
    assert (await call(s, "POST", q, json=bounded))[0] == 201
    status, got = await call(s, "GET", f"{q}/recent")
    assert status == 200 and (got["max_length"], got["max_length_bytes"], got["overflow"]) == (100, 4096, "drop-head")
    status, err = await call(s, "POST", q, data=b"{not json", headers={"Content-Type": "application/json"})
    assert status == 400 and "JSON" in err["message"]
    status, out = await call(s, "POST", f"{q}/jobs/purge")
    assert status == 200 and out["purged"] == 0
    assert (await call(s, "DELETE", f"{q}/jobs?if_empty=maybe"))[0] == 400
    assert (await call(s, "DELETE", f"{q}/jobs"))[0] == 200
    assert (await call(s, "DELETE", f"{q}/jobs"))[0] == 404
    assert (await call(s, "POST", f"{q}/jobs/purge"))[0] == 404


@pytest.mark.asyncio
async def test_operator_settings(http: tuple[aiohttp.ClientSession, str], node: Node) -> None:
    s, base = http
    status, _ = await call(s, "POST", f"{base}/api/v1/nodes/node1/priority", json={"priority": 7})
    assert status == 400
    status, _ = await call(s, "POST", f"{base}/api/v1/nodes/node9/priority", json={"priority": 2})
    assert status == 404
    status, err = await call(s, "POST", f"{base}/api/v1/group/quorum-override", json={"nodes": 1})
    assert status == 400 and "group" in err["message"]  # a single node has no group to override
    assert (await call(s, "POST", f"{base}/api/v1/group/designated-primary", json={"on": "yes"}))[0] == 400
    status, err = await call(s, "POST", f"{base}/api/v1/nodes/node1/drain")
    assert status == 400 and "replication group" in err["message"]  # a single node has none to drain


@pytest.mark.asyncio
async def test_the_upgrade_status_and_a_finalize(http: tuple[aiohttp.ClientSession, str], node: Node) -> None:
    s, base = http
    status, up = await call(s, "GET", f"{base}/api/v1/upgrade")
    assert status == 200 and (up["feature_level"], up["feature_levels"], up["finalizable"]) == (1, [1, LEVEL_MAX], True)
    assert [m["name"] for m in up["members"]] == ["node1"] and up["type_mismatches"] == []
    assert (await call(s, "GET", f"{base}/api/v1/overview"))[1]["upgrade"] == up
    for body in ({"level": "two"}, {"level": -1}, {"level": True}):
        status, err = await call(s, "POST", f"{base}/api/v1/upgrade/finalize", json=body)
        assert status == 400 and "level" in err["message"], (body, err)
    status, err = await call(s, "POST", f"{base}/api/v1/upgrade/finalize", json={"level": LEVEL_MAX + 1})
    assert status == 400 and err["message"] == f"no feature level {LEVEL_MAX + 1}: this build knows levels 1..{LEVEL_MAX}"
    status, out = await call(s, "POST", f"{base}/api/v1/upgrade/finalize", json={})
    assert status == 200 and out == {"feature_level": LEVEL_MAX}
    status, up = await call(s, "GET", f"{base}/api/v1/upgrade")
    assert up["feature_level"] == LEVEL_MAX and not up["finalizable"]
    status, err = await call(s, "POST", f"{base}/api/v1/upgrade/finalize", json={})
    assert status == 400 and err["message"] == f"the group is at feature level {LEVEL_MAX} already"
    db = sqlite3.connect(node.store.data_path / node.config.db_path.name)  # (a single node's finalize: its store)
    try:
        meta = dict(db.execute("SELECT key, value FROM meta WHERE key IN ('feature_level', 'schema_version')"))
    finally:
        db.close()
    assert meta == {"feature_level": str(LEVEL_MAX), "schema_version": "4"}


@pytest.mark.asyncio
async def test_restore_merges_the_quarantine_through_the_node_itself(http: tuple[aiohttp.ClientSession, str],
                                                                      node: Node) -> None:
    """``POST /api/v1/restore`` on one node (the procedure is the group's: tests/integration/
    test_restore.py): nothing to do without a quarantine; a quarantined message goes back to
    its queue with its old id apart, one that is not a quarantined message stays, and a
    second run finds nothing."""
    s, base = http
    url = f"{base}/api/v1/restore"
    status, out = await call(s, "POST", url)
    assert status == 200 and out["restored"] == {} and out["text"] == [
        "nothing to restore: tandem.quarantine holds no message that matches"], out
    for body, field in (({"partition": "1"}, "partition"), ({"from": ""}, "from"), ({"colour": 1}, "colour")):
        status, err = await call(s, "POST", url, json=body)
        assert status == 400 and err["message"].startswith(f"{field}: "), (body, err)
    async with await client.connect(url_of(node)) as conn:
        await conn.declare_queue("orders")
        # only the group writes the quarantine: a client could forge what an admin restores
        with pytest.raises(AccessRefusedError, match="reserved for the node"):
            await conn.declare_queue(QUARANTINE)
        status, err = await call(s, "POST", f"{base}/api/v1/queues", json={"name": QUARANTINE})
        assert status == 403 and "reserved for the node" in err["message"], err
        # nor through a dead-letter queue, nor in any other name of the node's
        status, err = await call(s, "POST", f"{base}/api/v1/queues",
                                 json={"name": "trap", "dead_letter_queue": QUARANTINE})
        assert status == 403 and "reserved for the node" in err["message"] and "trap" not in node.catalogue.queues, err
        status, err = await call(s, "POST", f"{base}/api/v1/queues", json={"name": "tandem.x"})
        assert status == 403 and "reserved for the node" in err["message"], err
        # what HA-1014 discarded of orders/0 (offset 3, confirmed), kept as the node keeps it
        orders = node.catalogue.queues["orders"].meta.id
        kept = StoredMessage(3, "k1", msgpack.packb({"app": "kept"}), b"lost", "p1", 4, 0.0)
        assert node.ops.quarantine.keep((orders, 0), 4, 10, [[Append(orders, 0, [kept], 4)]], 1) == 1

        async def quarantined() -> bool:
            return QUARANTINE in node.catalogue.queues and node.catalogue.queues[QUARANTINE].depth == 1

        await wait_until(quarantined, timeout=30, what="the quarantine filled")
        await node.publisher.publish(PublishRequest(QUARANTINE, None, [PublishMessage("k2", {}, b"stray", None)]))
        with pytest.raises(AccessRefusedError, match="written by the group only"):
            await conn.producer(QUARANTINE).send(b"forged", key="k1")
        status, out = await call(s, "POST", url, json={"from": node.config.name})
        assert status == 200, out
        assert {k: v for k, v in out.items() if k != "text"} == {
            "restored": {"orders": 1}, "already": {}, "conflicts": {}, "left": {"": 1}, "dropped": {}, "merged": {},
            "failed": {}, "held": {}, "resent": {}, "unsure": {}}, out
        assert out["text"] == ["1 message(s) restored to orders",
                               "1 message(s) without quarantine headers left in tandem.quarantine"], out
        msgs, _next, _end = await conn.read("orders", 0, 0, 10)
        assert [(m.body, m.key, m.headers) for m in msgs] == [(b"lost", "k1", {"app": "kept",
                                                                               "x-tandem-restored-id": "0-3"})]
        status, out = await call(s, "POST", url, json={"queue": "orders"})
        assert status == 200 and out["restored"] == {} and out["left"] == {"": 1}, out
        assert [m.body for m in (await conn.read(QUARANTINE, 0, 0, 10))[0]][-1] == b"stray"  # (still there)
    assert any("restore by admin" in e.text for e in node.report.node_events), node.report.node_events


@pytest.mark.asyncio
async def test_restore_asks_the_nodes_compensation_hook_and_a_failure_holds_back_its_partition(
        http: tuple[aiohttp.ClientSession, str], node: Node) -> None:
    """Three quarantined messages of inv/0 whose ids name messages of the queue now (key
    conflicts): the node's hook merges the first, fails on the second, and the third waits
    behind it (back in order or not at all); the next run, with a mended hook, drops the second
    and keeps the third.  Nothing is lost, nothing dropped comes back."""
    s, base = http
    url = f"{base}/api/v1/restore"
    async with await client.connect(url_of(node)) as conn:
        await conn.declare_queue("inv")
        await conn.producer("inv").send_many([(f"now-{i}".encode(), "k") for i in range(6)])
        inv = node.catalogue.queues["inv"].meta.id
        lost = [StoredMessage(o, "k", msgpack.packb({"n": str(o)}), f"lost-{o}".encode(), "p1", o, 0.0)
                for o in (2, 3, 4)]
        assert node.ops.quarantine.keep((inv, 0), 4, 10, [[Append(inv, 0, lost, 5)]], 1) == 3

        async def quarantined() -> bool:
            return QUARANTINE in node.catalogue.queues and node.catalogue.queues[QUARANTINE].depth == 3

        await wait_until(quarantined, timeout=30, what="the quarantine filled")
        seen: list[Conflict] = []

        def hook(c: Conflict) -> Version | str:
            seen.append(c)
            assert c.kept is not None
            if c.offset == 2:
                return Version(c.discarded.key, {"merged": "yes"}, c.discarded.body + b"+" + c.kept.body)
            if c.offset == 3:
                raise LookupError("no rule")
            return KEEP

        node.ops.restores.hook = hook
        status, out = await call(s, "POST", url)
        assert status == 200, out
        assert {k: v for k, v in out.items() if v and k != "text"} == {
            "restored": {"inv": 1}, "conflicts": {"inv": 1}, "merged": {"inv": 1}, "failed": {"inv": 1},
            "held": {"inv": 1}}, out
        assert [(c.offset, c.discarded.body, c.kept.body if c.kept else None) for c in seen] == [
            (2, b"lost-2", b"now-2"), (3, b"lost-3", b"now-3")]  # (the third waited: the hook never saw it)

        node.ops.restores.hook = lambda c: DROP if c.offset == 3 else None
        status, out = await call(s, "POST", url)
        assert status == 200, out
        assert {k: v for k, v in out.items() if v and k != "text"} == {
            "restored": {"inv": 1}, "conflicts": {"inv": 1}, "dropped": {"inv": 1}}, out
        msgs, _next, _end = await conn.read("inv", 0, 0, 20)
        assert [(m.body, m.headers.get("x-tandem-restored-id")) for m in msgs] == [
            *((f"now-{i}".encode(), None) for i in range(6)), (b"lost-2+now-2", "0-2"), (b"lost-4", "0-4")]
        assert msgs[6].headers == {"merged": "yes", "x-tandem-restored-id": "0-2"}
        assert node.catalogue.queues[QUARANTINE].depth == 0


@pytest.mark.asyncio
async def test_users_roles_and_csrf(http: tuple[aiohttp.ClientSession, str]) -> None:
    s, base = http
    u = f"{base}/api/v1/users"
    assert (await call(s, "POST", u, json={"name": "watcher", "password": "short"}))[0] == 400
    assert (await call(s, "POST", u, json={"name": "watcher", "password": "watch-pass", "role": "root"}))[0] == 400
    assert (await call(s, "POST", u, json={"name": "watcher", "password": "watch-pass", "role": "monitor"}))[0] == 201
    assert (await call(s, "POST", u, json={"name": "watcher", "password": "watch-pass"}))[0] == 409
    mon = basic("watcher", "watch-pass")
    assert (await call(s, "GET", f"{base}/api/v1/overview", auth=mon))[0] == 200
    status, err = await call(s, "POST", f"{base}/api/v1/queues", auth=mon, json={"name": "q"})
    assert status == 403 and err["error"] == "forbidden"
    assert (await call(s, "POST", f"{u}/watcher/password", json={"password": "new-watch-pass"}))[0] == 200
    assert (await call(s, "GET", f"{base}/api/v1/overview", auth=mon))[0] == 401
    # a browser session: cookie, and the CSRF token on every change
    jar = aiohttp.CookieJar(unsafe=True)
    async with aiohttp.ClientSession(cookie_jar=jar) as browser:
        status, who = await call(browser, "POST", f"{base}/login", auth=None,
                                 json={"user": "admin", "password": PASSWORD})
        assert status == 200 and who["role"] == "admin"
        cookie = next(c for c in jar if c.key == "tandem_session")
        assert cookie["httponly"] and cookie["samesite"] == "Strict"
        status, err = await call(browser, "POST", f"{base}/api/v1/queues", auth=None, json={"name": "q"})
        assert status == 403 and err["error"] == "csrf"
        status, _ = await call(browser, "POST", f"{base}/api/v1/queues", auth=None, json={"name": "q"},
                               headers={"X-CSRF-Token": who["csrf"]})
        assert status == 201
        assert (await call(browser, "POST", f"{base}/logout", auth=None,
                           headers={"X-CSRF-Token": who["csrf"]}))[0] == 200
        assert (await call(browser, "GET", f"{base}/api/v1/overview", auth=None))[0] == 401
    assert (await call(s, "DELETE", f"{u}/watcher"))[0] == 200
    assert (await call(s, "DELETE", f"{u}/watcher"))[0] == 404
    assert (await call(s, "DELETE", f"{u}/admin"))[0] == 409  # not the user you are


@pytest.mark.asyncio
async def test_grants_list_grant_revoke_and_who_may_use_the_console(http: tuple[aiohttp.ClientSession, str],
                                                                   node: Node) -> None:
    s, base = http
    a = f"{base}/api/v1/acls"
    assert (await call(s, "POST", f"{base}/api/v1/users", json={"name": "bob", "password": "bob-password",
                                                                "role": "user"}))[0] == 201
    status, body = await call(s, "POST", a, json={"user": "bob", "pattern": "orders.*", "permissions": ["consume"]})
    assert status == 200 and body == {"user": "bob", "pattern": "orders.*", "permissions": ["consume"]}
    assert (await call(s, "POST", a, json={"user": "bob", "pattern": "*", "permissions": ["browse", "produce"]}))[0] \
        == 200
    status, rows = await call(s, "GET", f"{a}?user=bob")
    assert status == 200 and rows == [{"user": "bob", "pattern": "*", "permissions": ["produce", "browse"]},
                                      {"user": "bob", "pattern": "orders.*", "permissions": ["consume"]}]
    assert node.services.acls.allows(node.services.users.get("bob"), "consume", "orders.eu")  # type: ignore[arg-type]
    assert (await call(s, "POST", f"{a}/revoke", json={"user": "bob", "pattern": "*", "permissions": ["produce"]}))[0] \
        == 200
    assert (await call(s, "GET", a))[1] == [{"user": "bob", "pattern": "*", "permissions": ["browse"]},
                                           {"user": "bob", "pattern": "orders.*", "permissions": ["consume"]}]
    for bad_body, field in (({"user": "bob", "pattern": "*", "permissions": ["write"]}, "write"),
                            ({"user": "bob", "pattern": "orders eu", "permissions": ["consume"]}, "pattern"),
                            ({"user": "bob", "pattern": "orders.*", "permissions": ["admin"]}, "group permission"),
                            ({"user": "bob", "pattern": "*", "permissions": []}, "permissions"),
                            ({"user": "bob", "pattern": "*", "permissions": ["browse"], "x": 1}, "x")):
        status, err = await call(s, "POST", a, json=bad_body)
        assert status == 400 and field in err["message"], (bad_body, err)
    assert (await call(s, "POST", a, json={"user": "nobody", "pattern": "*", "permissions": ["browse"]}))[0] == 404
    # a plain user does not use the console (it would show the whole group); the admin permission opens it
    bob = basic("bob", "bob-password")
    status, err = await call(s, "GET", f"{base}/api/v1/queues", auth=bob)
    assert status == 403 and "'bob'" in err["message"]
    assert (await call(s, "GET", f"{base}/api/v1/session", auth=bob))[0] == 200
    assert (await call(s, "POST", a, json={"user": "bob", "pattern": "*", "permissions": ["admin"]}))[0] == 200
    assert (await call(s, "POST", f"{base}/api/v1/queues", auth=bob, json={"name": "made-by-bob"}))[0] == 201
    assert node.catalogue.queues["made-by-bob"].meta.owner == "bob"
    # the admin permission is not produce: bob may not dead-letter into a queue he may not write
    status, err = await call(s, "POST", f"{base}/api/v1/queues", auth=bob,
                             json={"name": "bobs-trap", "dead_letter_queue": "made-by-bob"})
    assert status == 403 and "'bob'" in err["message"] and "'produce'" in err["message"] \
        and "'made-by-bob'" in err["message"] and "bobs-trap" not in node.catalogue.queues, err
    # deleting the user deletes its grants
    assert (await call(s, "DELETE", f"{base}/api/v1/users/bob"))[0] == 200
    assert (await call(s, "GET", a))[1] == []


@pytest.mark.integration
@pytest.mark.long
def test_fuzzing_the_api_finds_no_server_error(tmp_path: Path) -> None:
    """schemathesis generates requests from the OpenAPI document (good and bad input)
    against a node process; no answer may be a 500.  The long tier's: make test runs
    tests/webconsole/test_api_schemathesis.py, whose logged-in run checks the same and more."""
    import asyncio
    import subprocess
    import sys

    from broker.tools.cluster import free_ports
    from broker.tools.process import NodeProcess

    port = free_ports(1)[0]
    loop = asyncio.new_event_loop()
    proc = NodeProcess(tmp_path / "n", password=PASSWORD, extra_args=["--http-port", str(port)])
    loop.run_until_complete(proc.start())
    try:
        out = subprocess.run(
            [sys.executable, "-m", "schemathesis.cli", "run", f"http://127.0.0.1:{port}/api/v1/openapi.json",
             "--checks", "not_a_server_error", "--auth", f"admin:{PASSWORD}", "--max-examples", "15",
             "--seed", "1", "--workers", "1", "--request-timeout", "10", "--exclude-path-regex", "stream"],
            capture_output=True, text=True, timeout=240)
        assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
        m = re.search(r"(\d+) generated, (\d+) passed", out.stdout)
        assert m is not None and int(m.group(1)) >= 100 and m.group(1) == m.group(2), out.stdout[-3000:]
    finally:
        loop.run_until_complete(proc.stop())
        loop.close()


@pytest.mark.asyncio
async def test_changes_from_another_site_or_not_json_are_refused(http: tuple[aiohttp.ClientSession, str]) -> None:
    """A browser holding Basic credentials must not be made to change anything by another
    site's form (CSRF without a cookie)."""
    s, base = http
    q = f"{base}/api/v1/queues"
    status, err = await call(s, "POST", q, json={"name": "x"}, headers={"Sec-Fetch-Site": "cross-site"})
    assert status == 403 and err["error"] == "cross_site"
    status, _ = await call(s, "POST", q, json={"name": "x"}, headers={"Origin": "http://evil.example"})
    assert status == 403
    status, err = await call(s, "POST", q, data='{"name": "x"}', headers={"Content-Type": "text/plain"})
    assert status == 415
    status, err = await call(s, "POST", f"{base}/api/v1/users", json={"name": "x", "password": "12345678",
                                                                     "role": "admin", "p": "="})
    assert status == 400 and "p" in err["message"]
    assert (await call(s, "POST", q, json={"name": "x"}, headers={"Sec-Fetch-Site": "same-origin"}))[0] == 201


@pytest.mark.asyncio
async def test_the_event_stream_sends_the_overview_and_ends_when_the_console_stops(
        http: tuple[aiohttp.ClientSession, str], console: Console, node: Node) -> None:
    s, base = http
    async with s.get(f"{base}/api/v1/events/stream", headers=ADMIN) as r:
        assert r.status == 200 and r.content_type == "text/event-stream"
        while (line := await r.content.readline()) != b"event: overview\n":
            assert line, "the stream ended before its first overview"
        assert b'"nodes"' in await r.content.readline()
        async with node.clock.timeout(10):  # the stream must not hold the shutdown up
            await console.stop()
            assert await r.content.read() is not None


@pytest.mark.asyncio
async def test_a_stopped_console_leaves_no_observer_on_the_store(node: Node) -> None:
    assert node.store.writer.commit_observers is node.store.commit_observers  # (every writer the node opens)
    before = len(node.store.commit_observers)
    c = await serve_console(console_view(node), "127.0.0.1", 0)
    assert len(node.store.commit_observers) == before + 1
    await c.stop()
    assert len(node.store.commit_observers) == before
