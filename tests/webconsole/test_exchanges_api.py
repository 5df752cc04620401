"""Exchanges and bindings through the admin REST API of one in-process node: declare, bind (a
queue, an exchange, a headers binding), list, unbind, delete, the refusals with their status
codes, and what a publish then routes."""

from __future__ import annotations

import pytest

import client
from broker.node.node import Node
from tests.conftest import url_of
from tests.webconsole.test_api import call, console, http, node  # noqa: F401  (the fixtures)

pytestmark = pytest.mark.asyncio


async def test_exchanges_and_bindings_through_the_api(http, node: Node) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    s, base = http
    api = f"{base}/api/v1"
    async with await client.connect(url_of(node)) as conn:
        for q in ("eu", "all", "pdf"):
            await conn.declare_queue(q)
    status, body = await call(s, "POST", f"{api}/exchanges", json={"name": "orders", "type": "topic"})
    assert (status, body["created"]) == (201, True), body
    assert (await call(s, "POST", f"{api}/exchanges", json={"name": "orders", "type": "topic"}))[0] == 200
    status, body = await call(s, "POST", f"{api}/exchanges", json={"name": "orders", "type": "fanout"})
    assert status == 409 and "exists as type topic" in body["message"]
    assert (await call(s, "POST", f"{api}/exchanges", json={"name": "docs", "type": "headers"}))[0] == 201
    assert (await call(s, "POST", f"{api}/exchanges", json={"name": "front", "type": "fanout"}))[0] == 201
    for source, body in [("orders", {"destination": "eu", "routing_key": "*.eu"}),
                         ("orders", {"destination": "all", "routing_key": "#"}),
                         ("docs", {"destination": "pdf", "arguments": {"format": "pdf"}}),
                         ("front", {"destination": "orders", "to_exchange": True})]:
        status, out = await call(s, "POST", f"{api}/exchanges/{source}/bindings", json=body)
        assert status == 200 and out["bound"], out
    status, listed = await call(s, "GET", f"{api}/exchanges")
    assert status == 200 and [e["name"] for e in listed] == ["docs", "front", "orders"]
    assert sorted(listed[2]["bindings"], key=lambda b: b["destination"]) == [
        {"destination": "all", "to_exchange": False, "routing_key": "#", "arguments": {}},
        {"destination": "eu", "to_exchange": False, "routing_key": "*.eu", "arguments": {}}]
    async with await client.connect(url_of(node)) as conn:
        p = conn.exchange_producer("front")
        await p.send("x", routing_key="sales.eu")
        await p.send("y", routing_key="sales.us")
        await conn.exchange_producer("docs").send("doc", headers={"format": "pdf"})
        depth = {q.name: q.ready for q in await conn.list_queues()}
    assert depth == {"eu": 1, "all": 2, "pdf": 1}

    for body, status_want, words in [
        ({"destination": "nowhere"}, 404, "no queue 'nowhere'"),
        ({"destination": "tandem.quarantine"}, 403, "group only"),
        ({"destination": "eu", "arguments": {"a": 1}}, 400, "arguments"),
        ({"destination": "eu", "bogus": 1}, 400, "bogus"),
    ]:
        status, out = await call(s, "POST", f"{api}/exchanges/orders/bindings", json=body)
        assert status == status_want and words in out["message"], (body, status, out)
    assert (await call(s, "POST", f"{api}/exchanges/ghost/bindings", json={"destination": "eu"}))[0] == 404
    assert (await call(s, "POST", f"{api}/exchanges", json={"name": "x", "type": "nope"}))[0] == 400
    status, out = await call(s, "DELETE", f"{api}/exchanges/orders?if_unused=true")
    assert status == 400 and "in use" in out["message"]
    assert (await call(s, "POST", f"{api}/exchanges/orders/unbind", json={"destination": "eu",
                                                                          "routing_key": "*.eu"}))[0] == 200
    assert (await call(s, "DELETE", f"{api}/exchanges/orders"))[0] == 200
    status, listed = await call(s, "GET", f"{api}/exchanges")
    assert [e["name"] for e in listed] == ["docs", "front"] and listed[1]["bindings"] == []
    assert (await call(s, "DELETE", f"{api}/exchanges/orders"))[0] == 404
