"""Take docs/console.png: a three-node group under load, seen in the console.

    .venv/bin/python scripts/console_screenshot.py [docs/console.png]

Starts a local group (temporary directory), declares two queues, keeps a producer
and a slow consumer running, kills one node so the picture shows a failover, logs in
with headless Chromium (Debian's chromium) and saves a full-page screenshot.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
from pathlib import Path

import client
from broker.tools.cluster import LocalCluster

PASSWORD = "screenshot-password"


async def main(out: Path) -> None:
    from playwright.async_api import async_playwright, expect

    with tempfile.TemporaryDirectory(prefix="tandem-shot-") as tmp:
        cl = LocalCluster(Path(tmp), nodes=3, base_port=0, password=PASSWORD)
        await cl.start()
        try:
            await cl.wait_ready()
            async with await client.connect(cl.url) as conn:
                await conn.declare_queue("orders", partitions=6)
                await conn.declare_queue("payments", partitions=3)
            stop = asyncio.Event()

            async def load() -> None:
                async with await client.connect(cl.url) as conn:
                    p, q = conn.producer("orders"), conn.producer("payments")
                    i = 0
                    while not stop.is_set():
                        await asyncio.gather(*(p.send(f"order {i + k}", key=f"c{(i + k) % 50}") for k in range(50)),
                                             q.send(f"payment {i}"))
                        i += 50

            async def consume() -> None:
                async with await client.connect(cl.url) as conn:
                    async with conn.consumer("orders", prefetch=32) as c:
                        while not stop.is_set():
                            m = await c.next(0.5)
                            if m is not None:
                                m.ack()
                                await asyncio.sleep(0.002)  # a slow consumer: the queue grows

            tasks = [asyncio.ensure_future(load()), asyncio.ensure_future(consume())]
            async with async_playwright() as pw:
                browser = await pw.chromium.launch(executable_path=shutil.which("chromium") or "/usr/bin/chromium",
                                                   headless=True, args=["--no-sandbox"])
                page = await browser.new_page(viewport={"width": 1280, "height": 1100})
                await page.goto(cl.console_url("node1") + "login")
                await page.fill("#user", "admin")
                await page.fill("#password", PASSWORD)
                await page.click("#login")
                await expect(page.locator("#nodes [data-node]")).to_have_count(3, timeout=15000)
                await asyncio.sleep(4)  # let the rates and the queue depth build up for the picture
                await cl.nodes["node3"].kill()
                await expect(page.locator('[data-node="node3"] .state')).not_to_have_text("Up", timeout=20000)
                await asyncio.sleep(3)  # the partitions settle on their new actives
                await page.screenshot(path=str(out), full_page=True)
                await browser.close()
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            await cl.stop()
    print(f"wrote {out}")


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/console.png")))
