"""A low-privilege user asks for the group's status: it learns the queues its grants name,
not the others (their names are not shown, on any member); admin and monitor see them all."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

import client
from client.protocol.frames import StatusOk
from tests.conftest import PASSWORD, running_group
from tests.helpers import wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.timeout(180)]

PW = "mallory-password"


def named(st: StatusOk) -> set[str]:
    return {p.queue for p in [*st.partitions, *st.foreign] if p.queue} | \
        {m.partition("/")[0] for m in st.moving} | {u.partition(" ")[0] for u in st.updating}


async def test_status_names_only_the_queues_a_user_may_see(tmp_path: Path) -> None:
    async with running_group(tmp_path) as cl:
        async with await client.connect_link(cl.url) as admin:
            for q in ("payments", "payroll.secret", "sandbox.a"):
                await admin.declare_queue(q, partitions=2)
            await admin.create_user("mallory", PW, "user")
            await admin.grant("mallory", "sandbox.*", ["configure", "produce", "consume"])
            await admin.create_user("watch", PW, "monitor")
        for name, proc in cl.nodes.items():
            assert proc.address is not None
            host, port = proc.address

            async def sees(user: str) -> set[str]:
                async with await client.connect_link(f"tandem://{user}:{PW if user != 'admin' else PASSWORD}"
                                                     f"@{host}:{port}") as conn:
                    return named(await conn.status())

            await wait_until(lambda: _all_known(sees), timeout=20, what=f"every queue in {name}'s status")
            assert await sees("mallory") == {"sandbox.a"}, name
            assert await sees("watch") == {"payments", "payroll.secret", "sandbox.a"}, name


async def _all_known(sees: Callable[[str], Awaitable[set[str]]]) -> bool:
    try:
        return await sees("admin") == {"payments", "payroll.secret", "sandbox.a"} and \
            await sees("mallory") is not None
    except client.errors.AuthError:
        return False  # the member has not applied the users yet
