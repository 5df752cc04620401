"""A revoked user, as an attacker would use one: a session (console cookie or client
connection) opened before the user was deleted, its password or role changed, or a grant it
relied on revoked — the change made on another member — ends on every member, and what it
tries next is refused.

One 3-node group for the module (its users are named per test)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio

import client
from broker.tools.cluster import LocalCluster
from client.connection import Connection
from client.errors import AccessRefusedError
from client.protocol.frames import Ok, Subscribe, SubscribeOk, UserPut
from tests.conftest import PASSWORD, running_group
from tests.helpers import wait_until

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.integration, pytest.mark.timeout(180),
              pytest.mark.xdist_group("security-sessions")]

PW = "user-password-1"
NEW_PW = "user-password-2"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def group(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    async with running_group(tmp_path_factory.mktemp("sessions"), "--heartbeat", "1", console=True) as cl:
        yield cl


def url_as(cl: LocalCluster, node: str, user: str, password: str) -> str:
    proc = cl.nodes[node]
    assert proc.address is not None
    return f"tandem://{user}:{password}@{proc.address[0]}:{proc.address[1]}"


async def admin_on(cl: LocalCluster, node: str) -> Connection:
    return await client.connect_link(url_as(cl, node, "admin", PASSWORD), client_name="security-admin")


async def make_user(cl: LocalCluster, name: str, role: str, *grants: tuple[str, list[str]]) -> None:
    """A user made on node1, known with its grants on every member (a session opened where a
    grant has not arrived yet stands without it, and its revoke would not end that session)."""
    async with await admin_on(cl, "node1") as admin:
        await admin.create_user(name, PW, role)
        for pattern, perms in grants:
            await admin.grant(name, pattern, perms)
    want = sorted((pattern, sorted(perms)) for pattern, perms in grants)
    for node in cl.nodes:
        await wait_until(lambda n=node: _logs_in(cl, n, name, PW), timeout=15, what=f"{name} logs in on {node}")
        await wait_until(lambda n=node: _grants_on(cl, n, name, want), timeout=15, what=f"{name}'s grants on {node}")


async def _grants_on(cl: LocalCluster, node: str, user: str, want: list[tuple[str, list[str]]]) -> bool:
    async with await admin_on(cl, node) as admin:  # (a member answers from its own copy)
        return sorted((a.pattern, sorted(a.permissions)) for a in await admin.list_acls(user)) == want


async def _logs_in(cl: LocalCluster, node: str, user: str, password: str) -> bool:
    try:
        conn = await client.connect_link(url_as(cl, node, user, password))
    except AccessRefusedError:
        return False
    except Exception:  # noqa: BLE001 (an AuthError while the member catches up)
        return False
    await conn.close()
    return True


class Browser:
    """A console session on one member: the cookie and the CSRF token of a login."""

    def __init__(self, base: str, http: aiohttp.ClientSession, csrf: str) -> None:
        self.base, self.http, self.csrf = base, http, csrf

    async def session_status(self) -> int:
        async with self.http.get(self.base + "api/v1/session") as r:
            return r.status

    async def create_user(self, name: str) -> tuple[int, str]:
        async with self.http.post(self.base + "api/v1/users", json={"name": name, "password": PW, "role": "admin"},
                                  headers={"X-CSRF-Token": self.csrf}) as r:
            return r.status, await r.text()


@pytest_asyncio.fixture(loop_scope="module")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as s:
        yield s


async def console_login(cl: LocalCluster, node: str, user: str, http: aiohttp.ClientSession) -> Browser:
    base = cl.console_url(node)
    async with http.post(base + "login", json={"user": user, "password": PW}) as r:
        assert r.status == 200, await r.text()
        csrf = (await r.json())["csrf"]
    b = Browser(base, http, csrf)
    assert await b.session_status() == 200
    return b


async def ended(b: Browser) -> bool:
    return await b.session_status() == 401


async def test_a_deleted_admin_s_console_session_ends_on_another_member_and_creates_nobody(
        group: LocalCluster, http: aiohttp.ClientSession) -> None:
    await make_user(group, "dave", "admin")
    browser = await console_login(group, "node2", "dave", http)
    async with await admin_on(group, "node1") as admin:
        await admin.delete_user("dave")
    await wait_until(lambda: ended(browser), timeout=10, what="dave's console session on node2 to end")
    status, text = await browser.create_user("dave2")
    assert status == 401, text
    async with await admin_on(group, "node2") as admin:
        assert "dave2" not in [u.name for u in await admin.list_users()]


@pytest.mark.parametrize("change", ["password", "role", "grant"])
async def test_a_console_session_ends_when_its_password_role_or_grant_changes_elsewhere(
        group: LocalCluster, http: aiohttp.ClientSession, change: str) -> None:
    name = f"ops-{change}"
    # a user with the admin permission by a grant (not by role), so that a revoke can take it
    await make_user(group, name, "user", ("*", ["admin"]))
    browser = await console_login(group, "node3", name, http)
    async with await admin_on(group, "node1") as admin:
        if change == "password":
            await admin.change_password(name, NEW_PW)
        elif change == "role":
            await admin.request(lambda rid: UserPut(rid=rid, name=name, password=PW, role="monitor", mode="put"))
        else:
            await admin.revoke(name, "*", ["admin"])
    await wait_until(lambda: ended(browser), timeout=10, what=f"{name}'s console session on node3 to end")
    status, _text = await browser.create_user(f"{name}-made")
    assert status == 401


async def test_client_sessions_end_on_every_member_when_a_grant_they_use_is_revoked(group: LocalCluster) -> None:
    await make_user(group, "erin", "user", ("sandbox.*", ["consume"]))
    async with await admin_on(group, "node1") as admin:
        await admin.declare_queue("sandbox.erin", partitions=3)
    conns = [await client.connect_link(url_as(group, n, "erin", PW)) for n in group.nodes]
    for c in conns:
        ok = await c.request(lambda rid: Subscribe(rid=rid, queue="sandbox.erin", prefetch=1))
        assert isinstance(ok, SubscribeOk)
    async with await admin_on(group, "node1") as admin:
        await admin.revoke("erin", "sandbox.*", ["consume"])
    for node, c in zip(group.nodes, conns):
        await wait_until(lambda c=c: c.is_closed, timeout=10, what=f"erin's connection to {node} to close")
        why = c.close_error
        assert why is not None and "revoked (consume on sandbox.*)" in why.message, why


@pytest.mark.parametrize("change", ["delete", "password"])
async def test_client_sessions_end_on_every_member_when_the_user_is_deleted_or_its_password_changes(
        group: LocalCluster, change: str) -> None:
    name = f"frank-{change}"
    await make_user(group, name, "user", ("sandbox.*", ["produce"]))
    conns = [await client.connect_link(url_as(group, n, name, PW)) for n in group.nodes]
    async with await admin_on(group, "node1") as admin:
        if change == "delete":
            await admin.delete_user(name)
        else:
            await admin.change_password(name, NEW_PW)
    for node, c in zip(group.nodes, conns):
        await wait_until(lambda c=c: c.is_closed, timeout=10, what=f"{name}'s connection to {node} to close")


async def test_a_user_changing_its_own_password_keeps_that_session_and_loses_the_others(group: LocalCluster) -> None:
    await make_user(group, "gina", "admin")
    mine = await client.connect_link(url_as(group, "node2", "gina", PW))
    other = await client.connect_link(url_as(group, "node3", "gina", PW))
    await mine.change_password("gina", NEW_PW)
    await wait_until(lambda: other.is_closed, timeout=10, what="gina's other session to close")
    assert isinstance(await mine.request(lambda rid: UserPut(rid=rid, name="gina", password=PW, mode="password")),
                      Ok)
    assert not mine.is_closed
    await mine.close()
    await asyncio.gather(*(wait_until(lambda n=n: _logs_in(group, n, "gina", PW), timeout=15,
                                      what=f"gina's password on {n}") for n in group.nodes))
