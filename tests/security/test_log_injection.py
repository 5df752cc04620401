"""A name with a newline in it cannot forge a line in a node's log: not as the user of a
failed login on the client port, not in the console's login form, not as the client name of
a session (broker.logsafe)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

import client
from broker.tools.cluster import free_ports
from broker.tools.process import NodeProcess
from client.errors import ErrorCode
from tests.conftest import PASSWORD
from tests.helpers import wait_until
from tests.security.wire import RawLogin

pytestmark = [pytest.mark.asyncio, pytest.mark.integration]

FORGED_LINE = "2026-01-01 00:00:00,000 WARNING tandem.broker forged"
FORGED_USER = "x\n" + FORGED_LINE
FORGED_CLIENT = "app\r\n" + FORGED_LINE + "\x1b[2K"


@pytest_asyncio.fixture
async def node(tmp_path: Path) -> AsyncIterator[tuple[NodeProcess, str]]:
    """A node process with its console; its log is the process's stdout and stderr."""
    http_port = free_ports(1)[0]
    proc = NodeProcess(tmp_path / "node1", password=PASSWORD, extra_args=["--http-port", str(http_port)])
    await proc.start()
    try:
        yield proc, f"http://127.0.0.1:{http_port}"
    finally:
        await proc.stop()


async def test_a_user_or_client_name_with_a_newline_forges_no_log_line(node: tuple[NodeProcess, str]) -> None:
    proc, http = node
    assert proc.address is not None
    host, port = proc.address
    async with RawLogin(host, port, FORGED_USER) as login:  # the client port
        await login.challenge()
        refusal = await login.fail()
    assert refusal.code == ErrorCode.AUTHENTICATION_FAILED
    async with aiohttp.ClientSession() as s, \
            s.post(f"{http}/login", data={"user": FORGED_USER, "password": "wrong-password"}) as r:
        assert r.status == 401  # the console's login form
    url = f"tandem://admin:{PASSWORD}@{host}:{port}"
    async with await client.connect_link(url, client_name=FORGED_CLIENT) as link:  # a session's client name
        assert await link.list_queues() == []

    def lines() -> list[str]:
        return proc.log_text().splitlines()

    await wait_until(lambda: sum("authentication failed" in ln for ln in lines()) == 2
                     and any(" open user=admin" in ln for ln in lines()), timeout=15,
                     what="the two failed logins and the session in the node's log")
    forged = [ln for ln in lines() if ln.startswith(FORGED_LINE) or ln.startswith("\x1b")]
    assert forged == [], f"the node's log holds lines a client wrote:\n{proc.log_text()}"
    failures = [ln for ln in lines() if "authentication failed" in ln]
    escaped = "user=x\\n" + FORGED_LINE + " reason="
    assert all(escaped in ln for ln in failures), failures
    assert any("console: wrong user name or password" in ln for ln in failures)
    assert any(f"session app\\r\\n{FORGED_LINE}\\x1b[2K@127.0.0.1:" in ln for ln in lines())
