"""The console in real headless Chromium (Debian's chromium, driven by Playwright) against
a running three-node group: log in, see the nodes, watch a killed node go down and its
partitions move without reloading, create and purge a queue, create a user and grant and
revoke its permissions, and a monitor user who sees no operations."""

from __future__ import annotations

import base64
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

import client
from broker import __version__
from ha.upgrade import LEVEL_MAX
from broker.tools.cluster import LocalCluster
from tests.conftest import PASSWORD, running_group
from tests.helpers import wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.browser, pytest.mark.timeout(240)]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest_asyncio.fixture
async def consoles(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    """Three node processes, each serving its console."""
    async with running_group(tmp_path, console=True) as cl:
        yield cl


async def test_console_in_a_browser(consoles: LocalCluster) -> None:
    from playwright.async_api import async_playwright, expect

    cl = consoles
    async with await client.connect(cl.url) as conn:
        await conn.declare_queue("orders", partitions=3)
        await conn.producer("orders").send_many([(f"o{i}", f"k{i}") for i in range(30)])

    async def all_active() -> bool:
        return len(await cl.actives("orders")) == 3

    await wait_until(all_active, timeout=30, what="an active for each partition")
    base = cl.console_url("node1")
    auth = {"Authorization": "Basic " + base64.b64encode(f"admin:{PASSWORD}".encode()).decode()}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{base}api/v1/users", headers=auth,
                             json={"name": "watcher", "password": "watch-pass", "role": "monitor"}) as r:
            assert r.status == 201
        async with http.post(f"{base}api/v1/queues", json={"name": "x"}) as r:
            assert r.status == 401  # nothing without a login
        metrics = ""
        for name in cl.nodes:
            async with http.get(f"{cl.console_url(name)}metrics", headers=auth) as r:
                assert r.status == 200
                metrics += await r.text()
        for metric in ("tandem_replication_lag_entries{", "tandem_replication_lag_seconds{",
                       "tandem_partition_commit_index{", "tandem_elections_won_total{", "tandem_log_segments{",
                       "tandem_log_bytes{", "tandem_log_segments_deleted_total{"):
            assert metric in metrics, metric  # an active reports its replicas
        log_bytes = [float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                     if line.startswith("tandem_log_bytes{")]
        assert len(log_bytes) == 3 and all(b > 0 for b in log_bytes), log_bytes  # (the catalogue, at least)

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                           args=["--no-sandbox", "--disable-dev-shm-usage"])
        try:
            page = await browser.new_page()
            page.on("dialog", lambda d: d.accept())  # every operation asks for confirmation: yes
            await page.goto(base)
            await expect(page).to_have_url(f"{base}login")
            await page.fill("#user", "admin")
            await page.fill("#password", "not-the-password")
            await page.click("#login")
            await expect(page.locator("#login-error")).to_be_visible()
            await page.fill("#password", PASSWORD)
            await page.click("#login")
            cards = page.locator("#nodes [data-node]")
            await expect(cards).to_have_count(3, timeout=15000)
            for name in ("node1", "node2", "node3"):
                await expect(page.locator(f'[data-node="{name}"] .state')).to_have_text("Up", timeout=15000)
            # majority elections: said once in the header, no HA lines on the cards
            await expect(page.locator("#mode")).to_have_text("replicated · majority elections")
            await expect(page.locator("#nodes .ha-state")).to_have_count(0)
            # one build everywhere, the first feature level, a finalize possible (admin)
            await expect(page.locator("#level")).to_have_text("feature level 1")
            await expect(page.locator('[data-node="node2"] .build')).to_have_text(f"build {__version__}")
            await expect(page.locator("#upgrade-note")).to_be_hidden()
            await expect(page.locator("#finalize-state")).to_have_text(f"every member supports level {LEVEL_MAX}")
            await page.click("#finalize button")  # (the exchanges made below need the highest level)
            await expect(page.locator("#level")).to_have_text(f"feature level {LEVEL_MAX}", timeout=10000)

            # kill a node the console is not served by: it turns Down, its partitions move
            held = set((await cl.actives("orders")).values())
            victim = next(n for n in ("node3", "node2") if n in held)
            await cl.nodes[victim].kill()
            await expect(page.locator(f'[data-node="{victim}"] .state')).not_to_have_text("Up", timeout=20000)
            orders_rows = page.locator("#partitions tbody tr", has_text="orders")
            await expect(orders_rows).to_have_count(3)
            await expect(page.locator("#partitions tbody tr td.active", has_text=victim)).to_have_count(
                0, timeout=20000)

            # create a queue from the UI, fill it, purge it from the UI
            await page.fill("#new-queue-name", "ui-made")
            await page.fill("#new-queue-partitions", "2")
            await page.click("#create-queue-button")
            await expect(page.locator("#result")).to_have_text("created ui-made", timeout=10000)
            row = page.locator('#queues tr[data-queue="ui-made"]')
            await expect(row).to_be_visible(timeout=10000)
            async with await client.connect(cl.url) as conn:
                await conn.producer("ui-made").send_many([b"a", b"b", b"c", b"d"])
            await expect(row.locator("td.ready")).to_have_text("4", timeout=10000)
            await row.locator("button.purge").click()
            await expect(page.locator("#result")).to_have_text("purged 4 message(s) from ui-made", timeout=10000)
            await expect(row.locator("td.ready")).to_have_text("0", timeout=10000)
            # a stream made from the page: its settings say what it keeps
            await page.fill("#new-queue-name", "ui-stream")
            await page.fill("#new-queue-partitions", "1")
            await page.select_option("#new-queue-type", "stream")
            await page.fill("#new-queue-max-age", "3600")
            await page.click("#create-queue-button")
            await expect(page.locator("#result")).to_have_text("created ui-stream", timeout=10000)
            await page.locator('#queues tr[data-queue="ui-stream"] td.name').click()
            await expect(page.locator("#queue-settings")).to_contain_text("a stream, kept 3600 s", timeout=10000)
            await page.select_option("#new-queue-type", "classic")
            # an exchange made from the page, the queue bound to it, a publish routed there, then unbound
            await page.fill("#new-exchange-name", "ui-fan")
            await page.select_option("#new-exchange-type", "fanout")
            await page.click("#create-exchange button")
            await expect(page.locator("#result")).to_have_text("declared exchange ui-fan", timeout=10000)
            await page.fill("#bind-exchange", "ui-fan")
            await page.fill("#bind-queue-name", "ui-made")
            await page.click("#bind-queue button")
            ex_row = page.locator('#exchanges tr[data-exchange="ui-fan"]')
            await expect(ex_row).to_contain_text("queue ui-made", timeout=10000)
            async with await client.connect(cl.url) as conn:
                await conn.exchange_producer("ui-fan").send("routed")
            await expect(row.locator("td.ready")).to_have_text("1", timeout=10000)
            await ex_row.locator("button", has_text="unbind").click()
            await expect(ex_row).not_to_contain_text("queue ui-made", timeout=10000)
            # its page: per-partition stats and a chart that grows as the stream samples it
            await row.locator("td.name").click()
            await expect(page.locator("#queue-partitions tbody tr")).to_have_count(2, timeout=10000)
            chart = page.locator("#queue-chart")
            points = int(await chart.get_attribute("data-points") or 0)
            await expect(chart).not_to_have_attribute("data-points", str(points), timeout=10000)

            # move a partition off the dead node from the page: the move ends without it
            survivor = next(n for n in cl.nodes if n not in ("node1", victim))
            await page.fill("#move-queue", "orders")
            await page.fill("#move-partition-no", "1")
            await page.fill("#move-to", f"node1,{survivor}")
            await page.click("#move-partition button")
            await expect(page.locator("#result")).to_have_text(
                f"orders/1: moving to node1, {survivor} (state Replicating, then Migrating, then Active)", timeout=10000)

            async def moved() -> bool:
                async with aiohttp.ClientSession() as http:
                    async with http.get(f"{base}api/v1/group", headers=auth) as r:
                        return (await r.json())["moving"] == []

            await wait_until(moved, timeout=30, what="orders/1 moved off the dead node")
            assert (await cl.actives("orders")).get(1) == "node1"

            # the partitions form: a partition added; an update refused while a member is down (the audit)
            await page.fill("#repart-queue", "ui-made")
            await page.fill("#repart-count", "1")
            await page.click("#repartition button[value=add]")
            await expect(page.locator("#result")).to_have_text(
                "ui-made now has 3 partitions (Update re-maps what it holds)", timeout=10000)
            await page.click("#repartition button[value=update]")
            await expect(page.locator("#result")).to_contain_text(
                f"partition update: {victim} did not answer the audit", timeout=20000)

            # the member form: its requests reach the API and a refusal comes back in one line
            await page.fill("#member-name", "node2")
            await page.fill("#member-address", "127.0.0.1:1")
            await page.click("#group-member button[value=add]")
            await expect(page.locator("#result")).to_have_text("group add: node2 is a member already",
                                                               timeout=10000)
            await page.fill("#member-name", "node9")
            await page.click("#group-member button[value=remove]")
            await expect(page.locator("#result")).to_have_text("no member 'node9' in this group", timeout=10000)
            await expect(page.locator("#group-change")).to_be_hidden()

            # users and grants: a user and its grant made in the page, for the whole group
            await page.fill("#new-user-name", "bob")
            await page.fill("#new-user-password", "bob-password")
            await page.select_option("#new-user-role", "user")
            await page.click("#create-user button")
            await expect(page.locator("#result")).to_have_text("created user bob (user)", timeout=10000)
            await expect(page.locator('#users tr[data-user="bob"]')).to_be_visible()
            await page.select_option("#grant-user", "bob")
            await page.fill("#grant-pattern", "orders.*")
            await page.check('#grant-permissions input[value="consume"]')
            await page.click("#grant button")
            grant_row = page.locator('#acls tr[data-user="bob"][data-pattern="orders.*"]')
            await expect(grant_row.locator("td.permissions")).to_have_text("consume", timeout=10000)
            other = next(n for n in cl.nodes if n not in ("node1", victim))

            async def other_has_it() -> bool:  # (a follower applies a commit on the active's next message)
                async with aiohttp.ClientSession() as http:
                    async with http.get(f"{cl.console_url(other)}api/v1/acls?user=bob", headers=auth) as r:
                        return await r.json() == [{"user": "bob", "pattern": "orders.*", "permissions": ["consume"]}]

            await wait_until(other_has_it, timeout=15, what=f"bob's grant on {other}")
            await grant_row.locator("button").click()
            await expect(grant_row).to_have_count(0, timeout=10000)

            # a monitor user sees no operations, and the API refuses it changes
            mon = await browser.new_page()
            await mon.goto(f"{base}login")
            await mon.fill("#user", "watcher")
            await mon.fill("#password", "watch-pass")
            await mon.click("#login")
            await expect(mon.locator("#nodes [data-node]")).to_have_count(3, timeout=15000)
            await expect(mon.locator("#create-queue")).to_be_hidden()
            await expect(mon.locator("#access")).to_be_hidden()
            await expect(mon.locator("button.purge")).to_have_count(2)  # in the page...
            assert await mon.locator("button.purge").first.is_hidden()  # ...never shown
            status = await mon.evaluate("""async () => (await fetch('/api/v1/queues/ui-made/purge',
                {method: 'POST'})).status""")
            assert status == 403
        finally:
            await browser.close()
