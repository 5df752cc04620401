"""The console over HTTPS in real headless Chromium, against a three-node group with TLS on
every link (``LocalCluster(tls=True)``, as ``tandem cluster up --tls``): the page comes over
TLS with the node's certificate from the group's CA, the login works, the group's nodes show
Up (their view comes over the TLS peer links), and an operation made in the page reaches the
group."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

import client
from broker.tools.cluster import LocalCluster
from tests.conftest import PASSWORD, running_group

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.browser, pytest.mark.timeout(240)]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest_asyncio.fixture
async def tls_trio(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    async with running_group(tmp_path, tls=True, console=True) as cl:
        yield cl


async def test_console_over_https_in_a_browser(tls_trio: LocalCluster) -> None:
    from playwright.async_api import async_playwright, expect

    cl = tls_trio
    base = cl.console_url("node1")
    assert base.startswith("https://")
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                           args=["--no-sandbox", "--disable-dev-shm-usage"])
        try:
            # the group's CA is a throwaway one the browser does not know: the certificate is
            # checked below (issuer, subject) instead of by the browser's trust store
            context = await browser.new_context(ignore_https_errors=True)
            page = await context.new_page()
            response = await page.goto(base)
            assert response is not None
            await expect(page).to_have_url(f"{base}login")
            details = await response.security_details()
            assert details is not None, "the page did not come over TLS"
            assert details.get("protocol", "").startswith("TLS"), details
            assert details.get("subjectName") == "node1", details
            assert details.get("issuer") == "Tandem dev CA (throwaway)", details

            await page.fill("#user", "admin")
            await page.fill("#password", PASSWORD)
            await page.click("#login")
            cards = page.locator("#nodes [data-node]")
            await expect(cards).to_have_count(3, timeout=15000)
            for name in ("node1", "node2", "node3"):
                await expect(page.locator(f'[data-node="{name}"] .state')).to_have_text("Up", timeout=15000)

            page.on("dialog", lambda d: d.accept())
            await page.fill("#new-queue-name", "made-over-https")
            await page.fill("#new-queue-partitions", "1")
            await page.click("#create-queue-button")
            await expect(page.locator("#result")).to_have_text("created made-over-https", timeout=10000)
            async with await client.connect(cl.url) as conn:
                assert "made-over-https" in {q.name for q in await conn.list_queues()}
        finally:
            await browser.close()
