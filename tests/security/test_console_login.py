"""The console's login as another site would abuse it: a cross-site form post must not log a
browser in (login CSRF), and under HTTPS the session cookie is Secure (never sent over
plain HTTP) as well as HttpOnly and SameSite=Strict.

One node process with a console over HTTPS and one over HTTP, for the module."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from http.cookies import Morsel, SimpleCookie

import aiohttp
import pytest
import pytest_asyncio

from broker.tools.certs import make_dev_certs
from broker.tools.cluster import free_ports
from broker.tools.process import NodeProcess
from tests.conftest import PASSWORD

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.integration, pytest.mark.timeout(120),
              pytest.mark.xdist_group("security-console-login")]


class Console:
    def __init__(self, proc: NodeProcess, base: str, ssl_ctx: ssl.SSLContext | None) -> None:
        self.proc, self.base = proc, base
        self.ssl: ssl.SSLContext | bool = ssl_ctx if ssl_ctx is not None else True


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def consoles(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, Console]]:
    tmp = tmp_path_factory.mktemp("console-login")
    certs = make_dev_certs(tmp / "certs", ["node1"])
    http_port, https_port = free_ports(2)
    plain = NodeProcess(tmp / "plain" / "node1", password=PASSWORD, extra_args=["--http-port", str(http_port)])
    tls = NodeProcess(tmp / "tls" / "node1", password=PASSWORD, ca=certs.ca,
                      extra_args=["--http-port", str(https_port), *certs.node_args("node1")])
    for p in (plain, tls):
        await p.start()
    try:
        yield {"http": Console(plain, f"http://127.0.0.1:{http_port}/", None),
               "https": Console(tls, f"https://127.0.0.1:{https_port}/",
                                ssl.create_default_context(cafile=str(certs.ca)))}
    finally:
        for p in (plain, tls):
            await p.stop()


@pytest.mark.parametrize("scheme", ["http", "https"])
@pytest.mark.parametrize("headers", [
    {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"},
    {"Origin": "https://evil.example"},  # a browser that sends no Fetch metadata
    {"Sec-Fetch-Site": "cross-site"},
    {"Sec-Fetch-Site": "same-site"},  # a sibling subdomain is another site's page too
], ids=["origin+fetch", "origin", "fetch", "same-site"])
async def test_a_cross_site_form_post_does_not_log_a_browser_in(consoles: dict[str, Console], scheme: str,
                                                                headers: dict[str, str]) -> None:
    c = consoles[scheme]
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        async with http.post(c.base + "login", data={"user": "admin", "password": PASSWORD}, headers=headers,
                             ssl=c.ssl, allow_redirects=False) as r:
            assert r.status == 403, await r.text()
            assert (await r.json())["error"] == "cross_site"
            assert "tandem_session" not in r.cookies


@pytest.mark.parametrize("scheme", ["http", "https"])
async def test_the_console_s_own_login_form_still_logs_in(consoles: dict[str, Console], scheme: str) -> None:
    c = consoles[scheme]
    origin = c.base.rstrip("/")
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        async with http.post(c.base + "login", data={"user": "admin", "password": PASSWORD}, ssl=c.ssl,
                             headers={"Origin": origin, "Sec-Fetch-Site": "same-origin"},
                             allow_redirects=False) as r:
            assert r.status == 303, await r.text()
            assert "tandem_session" in r.cookies


async def test_under_https_the_session_cookie_is_secure_httponly_and_strict(consoles: dict[str, Console]) -> None:
    cookie = await _login_cookie(consoles["https"])
    assert cookie["secure"] and cookie["httponly"] and cookie["samesite"] == "Strict"


async def test_over_plain_http_the_cookie_cannot_be_secure_but_is_httponly_and_strict(
        consoles: dict[str, Console]) -> None:
    cookie = await _login_cookie(consoles["http"])
    assert not cookie["secure"] and cookie["httponly"] and cookie["samesite"] == "Strict"


async def _login_cookie(c: Console) -> Morsel[str]:
    async with aiohttp.ClientSession() as http:
        async with http.post(c.base + "login", json={"user": "admin", "password": PASSWORD}, ssl=c.ssl) as r:
            assert r.status == 200, await r.text()
            raw = r.headers.getall("Set-Cookie")
    jar = SimpleCookie()
    for line in raw:
        jar.load(line)
    return jar["tandem_session"]
