"""The console and the metrics show how a group decides its active: the mode and arbiter, each
member's HA state and epoch, the lock holder (REST JSON against the OpenAPI document, the
metrics text, the page in headless Chromium), and nothing of it under majority elections.

The nodes are real (in-process, on loopback, a two-node group over real peer links); their
``ha`` is a :class:`Report`, the HA arbiter's report as test data for the view."""

from __future__ import annotations

import base64
import shutil
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from broker.cli import console_of, console_view
from broker.config import NodeConfig
from broker.node.node import Node
from broker.sessions.status import HaReport
from ha.lockfile import HaState
from tests.conftest import PASSWORD
from tests.helpers import free_base_port, group_secret_file, wait_until
from webconsole.app import Console, serve_console
from webconsole.openapi import document

pytestmark = pytest.mark.asyncio

AUTH = {"Authorization": "Basic " + base64.b64encode(f"admin:{PASSWORD}".encode()).decode()}
LOCKFILE_STATES = {"WAITING", "STANDALONE", "ACTIVE_SYNC", "ACTIVE", "PASSIVE_SYNC", "PASSIVE", "DEAD"}


@dataclass
class Report:
    """What a node's HA arbiter reports (broker.sessions.status.HaReport)."""

    state: str
    epoch: int
    lock_holder: str | None
    renewals: int = 0
    fencing_refusals: int = 0
    changes: int = 0
    states: list[str] = field(default_factory=lambda: [s.value for s in HaState])  # the LockFile arbiter's


@dataclass
class Pair:
    nodes: list[Node]
    consoles: list[Console]
    http: aiohttp.ClientSession

    def base(self, i: int) -> str:
        address = self.consoles[i].address
        assert address is not None
        return f"http://127.0.0.1:{address[1]}"

    async def get(self, i: int, path: str) -> Any:
        async with self.http.get(self.base(i) + path, headers=AUTH) as r:
            assert r.status == 200, (path, r.status)
            return await r.json() if r.content_type == "application/json" else await r.text()


@pytest_asyncio.fixture
async def pair(tmp_path: Path) -> AsyncIterator[Pair]:
    """Two nodes in a group arbitrated by a LockFile, each serving its console (as the entry
    point has it serve it)."""
    base = free_base_port(2)
    nodes = [Node(NodeConfig(name=f"node{i + 1}", data_dir=tmp_path / f"node{i + 1}", port=base + 10 * i,
                             peer_port=base + 10 * i + 1, peers=(f"node{2 - i}=127.0.0.1:{base + 10 * (1 - i) + 1}",),
                             arbiter="lockfile", lockfile=str(tmp_path / "tandem.lock"), http_port=0,
                             keepalive_interval=0.1, non_response_timeout=0.5,
                             cluster_secret_file=group_secret_file(tmp_path)), console=console_of) for i in range(2)]
    try:
        for n in nodes:
            await n.start()
        await wait_until(lambda: all(n.ha.peers is not None and len(n.ha.peers.links) == 1 for n in nodes),
                         timeout=20, what="the two nodes linked")
        consoles = []
        for n in nodes:
            assert isinstance(n.console, Console)
            consoles.append(n.console)
        async with aiohttp.ClientSession() as http:
            yield Pair(nodes, consoles, http)
    finally:
        for n in reversed(nodes):
            await n.stop()  # (and its console)


async def nodes_when(pair: Pair, ready: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """node1's /api/v1/nodes by name, once ``ready`` holds of it (polled with a deadline)."""
    found: dict[str, Any] = {}

    async def check() -> bool:
        found.clear()
        found.update({n["name"]: n for n in await pair.get(0, "/api/v1/nodes")})
        return ready(found)

    await wait_until(check, timeout=20, what="node2's report over the peer link")
    return found


def set_ha(pair: Pair, *reports: HaReport | None) -> None:
    for n, r in zip(pair.nodes, reports):
        n.ha.arbiter = r


def conforms(value: Any, schema: str) -> None:
    """``value`` is what the OpenAPI document says a ``schema`` is."""
    from openapi_schema_validator import OAS30Validator, validate

    validate(value, {"$ref": f"#/components/schemas/{schema}", "components": document()["components"]},
             cls=OAS30Validator)


def samples(text: str, metric: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of ``metric`` in an exposition text: sorted labels -> value."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == metric:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


async def test_each_members_ha_state_epoch_and_the_lock_holder_in_the_rest_api(pair: Pair) -> None:
    set_ha(pair, Report("ACTIVE", 4, "node1", renewals=17, changes=3),
           Report("PASSIVE", 4, "node1", fencing_refusals=2, changes=2))
    group = await pair.get(0, "/api/v1/group")
    conforms(group, "Group")
    assert (group["mode"], group["arbiter"], group["lock_holder"], group["epoch"]) == (
        "replicated", "lockfile", "node1", 4)
    # node2's report comes over the peer link: on a busy machine the link may be being dialled again
    nodes = await nodes_when(pair, lambda ns: ns["node2"]["ha_state"] is not None)
    for n in nodes.values():
        conforms(n, "Node")
    assert (nodes["node1"]["ha_state"], nodes["node1"]["epoch"], nodes["node1"]["lock_holder"]) == (
        "ACTIVE", 4, "node1")
    # node2's own report, over its peer link
    assert (nodes["node2"]["ha_state"], nodes["node2"]["epoch"], nodes["node2"]["lock_holder"]) == (
        "PASSIVE", 4, "node1")
    one = await pair.get(0, "/api/v1/nodes/node2")
    one.pop("state"), nodes["node2"].pop("state")  # (its link state may flip between the two GETs on a busy machine)
    assert one == nodes["node2"]
    assert nodes["node2"]["console"] == pair.consoles[1].url  # (where to look at it)
    overview = await pair.get(1, "/api/v1/overview")  # any member's console shows the same
    assert overview["group"]["lock_holder"] == "node1"
    assert {n["name"]: n["ha_state"] for n in overview["nodes"]} == {"node1": "ACTIVE", "node2": "PASSIVE"}

    # the link is cut, node1 goes STANDALONE with the lock, node2 WAITING and, later, the lock
    # holder at a higher epoch: the group shows the holder as the latest epoch reports it
    set_ha(pair, Report("STANDALONE", 4, "node1"), Report("WAITING", 4, None))
    nodes = await nodes_when(pair, lambda ns: ns["node2"]["ha_state"] == "WAITING")
    assert nodes["node2"]["lock_holder"] is None and nodes["node2"]["ha_state"] == "WAITING"
    set_ha(pair, Report("WAITING", 4, "node1"), Report("STANDALONE", 5, "node2"))
    group = await pair.get(0, "/api/v1/group")
    assert (group["lock_holder"], group["epoch"]) == ("node2", 5)


async def test_ha_metrics_one_series_per_state_of_the_mode(pair: Pair) -> None:
    set_ha(pair, Report("ACTIVE_SYNC", 4, "node1", renewals=17, changes=3),
           Report("PASSIVE_SYNC", 4, "node1", fencing_refusals=2, changes=2))
    text = await pair.get(0, "/metrics")
    state = samples(text, "tandem_ha_state")
    assert {dict(k)["state"]: v for k, v in state.items()} == {
        s: (1.0 if s == "ACTIVE_SYNC" else 0.0) for s in LOCKFILE_STATES}
    assert all(dict(k)["node"] == "node1" for k in state)
    node1 = (("node", "node1"),)
    assert samples(text, "tandem_ha_epoch") == {node1: 4.0}
    assert samples(text, "tandem_lease_renewals_total") == {node1: 17.0}
    assert samples(text, "tandem_fencing_refusals_total") == {node1: 0.0}
    assert samples(text, "tandem_ha_state_changes_total") == {node1: 3.0}
    text = await pair.get(1, "/metrics")
    assert samples(text, "tandem_fencing_refusals_total") == {(("node", "node2"),): 2.0}
    assert samples(text, "tandem_ha_state")[(("node", "node2"), ("state", "PASSIVE_SYNC"))] == 1.0
    # a state the mode does not name still shows (as the only 1)
    set_ha(pair, Report("FENCED_OUT", 6, None))
    state = samples(await pair.get(0, "/metrics"), "tandem_ha_state")
    assert len(state) == len(LOCKFILE_STATES) + 1 and sum(state.values()) == 1.0
    assert state[(("node", "node1"), ("state", "FENCED_OUT"))] == 1.0


async def test_without_an_ha_arbiter_nothing_extra_and_nothing_breaks(pair: Pair) -> None:
    set_ha(pair, None, None)
    group = await pair.get(0, "/api/v1/group")
    conforms(group, "Group")
    assert (group["arbiter"], group["lock_holder"], group["epoch"]) == ("lockfile", None, None)
    for n in await pair.get(0, "/api/v1/nodes"):
        conforms(n, "Node")
        assert (n["ha_state"], n["epoch"], n["lock_holder"]) == (None, None, None)
    text = await pair.get(0, "/metrics")
    for metric in ("tandem_ha_state", "tandem_ha_epoch", "tandem_lease_renewals", "tandem_fencing_refusals",
                   "tandem_ha_state_changes"):
        assert metric not in text, metric
    # a member that does not answer: its HA fields unknown, the others as they report
    set_ha(pair, Report("STANDALONE", 2, "node1"), Report("PASSIVE", 2, "node1"))
    await pair.consoles[1].stop()
    await pair.nodes[1].stop()
    nodes = {n["name"]: n for n in await pair.get(0, "/api/v1/nodes")}
    assert nodes["node2"]["ha_state"] is None and nodes["node1"]["ha_state"] == "STANDALONE"
    conforms(nodes["node2"], "Node")


async def test_a_single_node_shows_its_mode_and_no_ha(tmp_path: Path) -> None:
    node = Node(NodeConfig(data_dir=tmp_path / "n", port=0))
    await node.start()
    console = await serve_console(console_view(node), "127.0.0.1", 0)
    try:
        assert console.address is not None
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{console.address[1]}/api/v1/overview", headers=AUTH) as r:
                overview = await r.json()
        conforms(overview["group"], "Group")
        assert (overview["group"]["mode"], overview["group"]["arbiter"], overview["group"]["lock_holder"]) == (
            "single", "majority", None)
        (n,) = overview["nodes"]
        assert n["ha_state"] is None
    finally:
        await console.stop()
        await node.stop()


@pytest.mark.integration
@pytest.mark.browser
@pytest.mark.timeout(120)
async def test_the_console_page_shows_the_mode_each_nodes_ha_state_and_the_holder(pair: Pair) -> None:
    from playwright.async_api import async_playwright, expect

    set_ha(pair, Report("ACTIVE", 4, "node1"), Report("PASSIVE", 4, "node1"))
    base = pair.base(0) + "/"
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=shutil.which("chromium") or "/usr/bin/chromium",
                                           headless=True, args=["--no-sandbox", "--disable-dev-shm-usage"])
        try:
            page = await browser.new_page()
            await page.goto(base)
            await page.fill("#user", "admin")
            await page.fill("#password", PASSWORD)
            await page.click("#login")
            await expect(page.locator("#mode")).to_have_text("replicated · LockFile · holder node1 (epoch 4)",
                                                             timeout=15000)
            card1, card2 = page.locator('[data-node="node1"]'), page.locator('[data-node="node2"]')
            await expect(card1.locator(".ha-state")).to_have_text("ACTIVE")
            await expect(card1.locator(".ha")).to_have_text("HA ACTIVE, epoch 4")
            await expect(card2.locator(".ha-state")).to_have_text("PASSIVE")
            await expect(card2.locator(".holder")).to_have_text("lock holder node1")
            await expect(page.locator("#queues-hint")).to_be_hidden()  # (shared mode's passives only)
            # live: the link cut, node2 waits, node1 goes on alone
            set_ha(pair, Report("STANDALONE", 4, "node1"), Report("WAITING", 4, None))
            await expect(card2.locator(".ha-state")).to_have_text("WAITING", timeout=10000)
            await expect(card2.locator(".holder")).to_have_text("lock holder none")
            await expect(card1.locator(".ha-state")).to_have_text("STANDALONE")
            # no arbiter report: the cards show no HA lines, the page goes on
            set_ha(pair, None, None)
            await expect(page.locator("#nodes .ha-state")).to_have_count(0, timeout=10000)
            await expect(page.locator("#mode")).to_have_text("replicated · LockFile · holder none")
            await expect(page.locator("#nodes [data-node]")).to_have_count(2)
        finally:
            await browser.close()
