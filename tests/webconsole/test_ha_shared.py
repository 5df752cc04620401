"""The console and the metrics of a real shared-mode pair (two node processes, one SQLite
database): the mode, each node's HA state and epoch, the lease holder, the HA metrics, and
all of it after kill -9 of the active; the passive's page in headless Chromium."""

from __future__ import annotations

import base64
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from broker.tools.cluster import LocalCluster
from tests.conftest import FAST, PASSWORD
from tests.helpers import wait_until
from tests.webconsole.test_ha_view import conforms, samples

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.timeout(180)]

AUTH = {"Authorization": "Basic " + base64.b64encode(f"admin:{PASSWORD}".encode()).decode()}
SHARED_STATES = {"PASSIVE", "ACTIVATING", "ACTIVE", "DEAD"}


async def get(http: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    try:
        async with http.get(url, headers=AUTH) as r:
            return r.status, await r.json() if r.content_type == "application/json" else await r.text()
    except aiohttp.ClientError as exc:
        return 0, str(exc)


@pytest_asyncio.fixture
async def shared_pair(tmp_path: Path) -> AsyncIterator[tuple[LocalCluster, aiohttp.ClientSession, str, str]]:
    """A started shared-mode pair on one SQLite database, settled: one node ACTIVE and holding
    the lease, the other PASSIVE, as the active's console shows them (the passive's over the
    peer link); (cluster, http session, the active, the passive)."""
    # (a 3 s lease: a holder that a browser starting beside it starves of CPU for a second keeps
    # the lease; the takeover these tests watch waits for it to run out)
    cl = LocalCluster(tmp_path / "group", nodes=2, base_port=0, password=PASSWORD,
                      extra_args=[*FAST, "--mode", "shared", "--database", f"sqlite:///{tmp_path}/db.sqlite",
                                  "--lease", "3"])
    await cl.start()
    try:
        async with aiohttp.ClientSession() as http:
            holder: list[str] = []

            async def settled() -> bool:
                for name in cl.nodes:
                    status, nodes = await get(http, f"{cl.console_url(name)}api/v1/nodes")
                    if status != 200:
                        continue  # (a passive's console knows no user until it reads the group's)
                    states = {n["name"]: (n["ha_state"], n["lock_holder"]) for n in nodes}
                    holder[:] = [n for n, (state, lock) in states.items() if state == "ACTIVE" and lock == n]
                    if holder == [name] and sorted(str(state) for state, _ in states.values()) == ["ACTIVE", "PASSIVE"]:
                        return True
                return False

            await wait_until(settled, timeout=60, what="one node ACTIVE holding the lease, the other PASSIVE")
            active = holder[0]
            passive = next(n for n in cl.nodes if n != active)
            yield cl, http, active, passive
    finally:
        await cl.stop()


async def metrics(http: aiohttp.ClientSession, cl: LocalCluster, name: str) -> str:
    status, text = await get(http, f"{cl.console_url(name)}metrics")
    return text if status == 200 else ""


async def test_the_mode_each_nodes_ha_state_and_the_holder_before_and_after_kill_9_of_the_active(
        shared_pair: tuple[LocalCluster, aiohttp.ClientSession, str, str]) -> None:
    cl, http, active, passive = shared_pair
    status, group = await get(http, f"{cl.console_url(active)}api/v1/group")
    assert status == 200
    conforms(group, "Group")
    assert (group["mode"], group["arbiter"], group["lock_holder"]) == ("shared", "majority", active)
    epoch = group["epoch"]
    assert epoch >= 1
    _, nodes = await get(http, f"{cl.console_url(active)}api/v1/nodes")
    for n in nodes:
        conforms(n, "Node")
    by_name = {n["name"]: n for n in nodes}
    assert (by_name[active]["ha_state"], by_name[active]["epoch"]) == ("ACTIVE", epoch)
    assert (by_name[passive]["ha_state"], by_name[passive]["lock_holder"]) == ("PASSIVE", active)

    text = await metrics(http, cl, active)
    states = {dict(k)["state"]: v for k, v in samples(text, "tandem_ha_state").items()}
    assert states == {s: (1.0 if s == "ACTIVE" else 0.0) for s in SHARED_STATES}
    assert samples(text, "tandem_ha_epoch") == {(("node", active),): float(epoch)}
    assert samples(text, "tandem_fencing_refusals_total") == {(("node", active),): 0.0}

    async def renewing() -> bool:
        text = await metrics(http, cl, active)
        return samples(text, "tandem_lease_renewals_total").get((("node", active),), 0) >= 2

    await wait_until(renewing, timeout=20, what=f"{active} renewing its lease")

    # kill -9 of the active: the passive takes the lease at a later epoch; its console says so
    await cl.nodes[active].kill()

    async def took_over() -> bool:  # holds the lease and has loaded the queues (ACTIVATING -> ACTIVE)
        status, g = await get(http, f"{cl.console_url(passive)}api/v1/group")
        _, nodes = await get(http, f"{cl.console_url(passive)}api/v1/nodes")
        mine = [n for n in nodes if n["name"] == passive] if status == 200 else []
        return status == 200 and g["lock_holder"] == passive and bool(mine) and mine[0]["ha_state"] == "ACTIVE"

    await wait_until(took_over, timeout=30, what=f"{passive} holding the lease")
    _, group = await get(http, f"{cl.console_url(passive)}api/v1/group")
    assert group["epoch"] > epoch
    _, nodes = await get(http, f"{cl.console_url(passive)}api/v1/nodes")
    by_name = {n["name"]: n for n in nodes}
    assert (by_name[passive]["ha_state"], by_name[passive]["epoch"]) == ("ACTIVE", group["epoch"])
    assert by_name[active]["ha_state"] is None and by_name[active]["state"] != "Up"  # (dead: no report)
    text = await metrics(http, cl, passive)
    assert samples(text, "tandem_ha_state")[(("node", passive), ("state", "ACTIVE"))] == 1.0
    assert samples(text, "tandem_ha_epoch") == {(("node", passive),): float(group["epoch"])}
    assert samples(text, "tandem_ha_state_changes_total")[(("node", passive),)] >= 2  # PASSIVE..ACTIVE


async def login(page: Any, url: str) -> None:
    await page.goto(url)
    await page.fill("#user", "admin")
    await page.fill("#password", PASSWORD)
    await page.click("#login")


@pytest.mark.browser
async def test_the_active_page_shows_the_mode_the_states_and_a_passive_gone(
        shared_pair: tuple[LocalCluster, aiohttp.ClientSession, str, str]) -> None:
    from playwright.async_api import async_playwright, expect

    cl, _http, active, passive = shared_pair
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=shutil.which("chromium") or "/usr/bin/chromium",
                                           headless=True, args=["--no-sandbox", "--disable-dev-shm-usage"])
        try:
            page = await browser.new_page()
            await login(page, cl.console_url(active))
            await expect(page.locator("#mode")).to_contain_text(f"shared · lease holder {active} (epoch",
                                                                timeout=15000)
            card_a, card_p = page.locator(f'[data-node="{active}"]'), page.locator(f'[data-node="{passive}"]')
            await expect(card_a.locator(".ha-state")).to_have_text("ACTIVE")
            await expect(card_a.locator(".actives")).to_have_text("active for every queue")
            await expect(card_p.locator(".ha-state")).to_have_text("PASSIVE")
            await expect(card_p.locator(".holder")).to_have_text(f"lock holder {active}")
            await expect(card_p.locator(".actives")).to_have_text("serves no queue")
            await expect(page.locator("#queues-hint")).to_be_hidden()
            # the passive dies: its card goes down, live, with no HA report
            await cl.nodes[passive].kill()
            await expect(card_p.locator(".state")).not_to_have_text("Up", timeout=20000)
            await expect(card_p.locator(".ha-state")).to_have_count(0)
            await expect(card_a.locator(".ha-state")).to_have_text("ACTIVE")
        finally:
            await browser.close()


@pytest.mark.browser
async def test_the_passive_page_points_to_the_lock_holder_and_follows_a_takeover(
        shared_pair: tuple[LocalCluster, aiohttp.ClientSession, str, str]) -> None:
    from playwright.async_api import async_playwright, expect

    cl, http, active, passive = shared_pair

    async def passive_console_answers() -> bool:
        return (await get(http, f"{cl.console_url(passive)}api/v1/group"))[0] == 200

    await wait_until(passive_console_answers, timeout=15, what=f"{passive}'s console knowing the group's users")
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=shutil.which("chromium") or "/usr/bin/chromium",
                                           headless=True, args=["--no-sandbox", "--disable-dev-shm-usage"])
        try:
            page = await browser.new_page()
            await login(page, cl.console_url(passive))
            await expect(page.locator(f'[data-node="{passive}"] .ha-state')).to_have_text("PASSIVE", timeout=15000)
            hint = page.locator("#queues-hint")
            await expect(hint).to_contain_text(f"{passive} is PASSIVE: the queues are served by the lock holder, "
                                               f"{active}")
            await expect(hint.locator("a")).to_have_attribute("href", cl.console_url(active))
            # the active dies: this node takes over, live, and the hint goes
            await cl.nodes[active].kill()
            await expect(page.locator(f'[data-node="{passive}"] .ha-state')).to_have_text("ACTIVE", timeout=30000)
            await expect(page.locator("#mode")).to_contain_text(f"lease holder {passive}")
            await expect(hint).to_be_hidden()
        finally:
            await browser.close()
