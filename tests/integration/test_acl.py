"""Users, roles and per-queue grants against real node processes: a 3-node group (every
member, after a kill -9 of the catalogue's active and of the queue's active, after a
restart of the whole group), a single node, a shared-mode pair through a takeover, and the
CLI.

The acceptance: a user with ``consume`` on ``orders.*`` consumes ``orders.eu`` and is
refused publishing there and anything on ``payments``, on every node and after a failover;
a user created on node1 logs in on node3."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable
from pathlib import Path

import pytest

import client
from broker.tools.cluster import LocalCluster
from broker.tools.process import NodeProcess, node_command
from client.connection import Connection
from client.errors import AccessRefusedError, AuthError, TandemError
from client.protocol.frames import (Declare, Delete, Frame, Get, Produced, Publish, PublishMessage, Purge, Read,
                                    SetOption, Subscribe, SubscribeOk)
from tests.conftest import PASSWORD, running_group
from tests.helpers import wait_until
from tests.integration.test_shared_mode import database, pair, the_active  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.timeout(240)]

BOB_PW = "bob-password-1"


def url_as(user: str, password: str, proc: NodeProcess) -> str:
    assert proc.address is not None
    return f"tandem://{user}:{password}@{proc.address[0]}:{proc.address[1]}"


async def login(url: str) -> Connection:
    return await client.connect_link(url, client_name="acl-test")


async def logs_in(url: str) -> bool:
    """Whether these credentials open a session (a member may apply a new user a moment
    after the member that took it)."""
    try:
        conn = await login(url)
    except AuthError:
        return False
    await conn.close()
    return True


async def refused(conn: Connection, make: Callable[[int], Frame], *words: str) -> None:
    with pytest.raises(AccessRefusedError) as err:
        await conn.request(make)
    for w in ("'bob'", *words):
        assert w in err.value.message, err.value.message


async def check_bob(url: str, *, consumed: bool = True) -> None:
    """bob (consume on orders.*) on one node: may subscribe to orders.eu, nothing else."""
    async with await login(url) as conn:
        ok = await conn.request(lambda rid: Subscribe(rid=rid, queue="orders.eu", prefetch=1))
        assert isinstance(ok, SubscribeOk)
        await refused(conn, lambda rid: Publish(rid=rid, queue="orders.eu", messages=[PublishMessage("k", {}, b"x")]),
                      "'produce'", "'orders.eu'")
        await refused(conn, lambda rid: Publish(rid=rid, queue="payments", messages=[PublishMessage("k", {}, b"x")]),
                      "'produce'", "'payments'")
        await refused(conn, lambda rid: Subscribe(rid=rid, queue="payments", prefetch=1), "'consume'", "'payments'")
        await refused(conn, lambda rid: Get(rid=rid, queue="payments"), "'consume'", "'payments'")
        await refused(conn, lambda rid: Read(rid=rid, queue="payments", partition=0), "'browse'", "'payments'")
        await refused(conn, lambda rid: Produced(rid=rid, queue="payments", partition=0, producer="p"), "'browse'",
                      "'payments'")
        await refused(conn, lambda rid: Purge(rid=rid, queue="orders.eu"), "'configure'")
        await refused(conn, lambda rid: Declare(rid=rid, queue="orders.new"), "'configure'")
        await refused(conn, lambda rid: Delete(rid=rid, queue="payments"), "'configure'")
        await refused(conn, lambda rid: SetOption(rid=rid, name="priority", value=1), "'admin'")
        with pytest.raises(AccessRefusedError):
            await conn.create_user("mallory", "mallory-password", "admin")
        assert [q.name for q in await conn.list_queues()] == ["orders.eu"]
        assert [(a.pattern, a.permissions) for a in await conn.list_acls("bob")] == [("orders.*", ["consume"])]


async def consume_all(url: str, queue: str, n: int) -> list[bytes]:
    """``n`` messages of ``queue`` from the whole group, acked."""
    out: list[bytes] = []
    async with await client.connect(url) as conn:
        async with conn.group_consumer(queue) as c:
            while len(out) < n:
                m = await c.next(20)
                assert m is not None, f"only {len(out)} of {n} messages came"
                out.append(m.body)
                await m.ack()
    return out


async def catalogue_active(cl: LocalCluster) -> str:
    found = ""

    async def known() -> bool:
        nonlocal found
        for _name, st in await cl._statuses():
            for p in st.partitions:
                if p.queue == "" and p.active:
                    found = p.active
                    return True
        return False

    await wait_until(known, timeout=30, what="an active for the queue catalogue")
    return found


async def test_grants_hold_on_every_member_through_failover_and_restart(tmp_path: Path) -> None:
    async with running_group(tmp_path) as cl:
        node3 = cl.nodes["node3"]
        async with await client.connect(cl.url) as admin:
            await admin.declare_queue("orders.eu", partitions=3)
            await admin.declare_queue("payments")
            async with admin.producer("orders.eu") as p:
                for i in range(30):
                    await p.send(f"o{i}".encode(), key=str(i))
        async with await login(cl.url_of("node1")) as admin1:
            await admin1.create_user("bob", BOB_PW, "user")
            await admin1.grant("bob", "orders.*", ["consume"])
            await admin1.create_user("watch", "watch-password", "monitor")
        # created on node1, logs in on node3 (and everywhere)
        for proc in cl.nodes.values():
            await wait_until(functools.partial(logs_in, url_as("bob", BOB_PW, proc)), timeout=15,
                             what=f"bob logs in on {proc.name}")
            await wait_until(functools.partial(_has_grant, url_as("bob", BOB_PW, proc)), timeout=15,
                             what=f"bob's grant on {proc.name}")
            await check_bob(url_as("bob", BOB_PW, proc))
        bob_group = cl.url.replace(f"admin:{PASSWORD}@", f"bob:{BOB_PW}@")
        # a monitor looks at every queue, changes nothing
        async with await login(url_as("watch", "watch-password", node3)) as watch:
            assert sorted(q.name for q in await watch.list_queues()) == ["orders.eu", "payments"]
            await watch.read("payments", 0)
            with pytest.raises(AccessRefusedError, match="'watch'.*'produce'"):
                await watch.request(lambda rid: Publish(rid=rid, queue="payments",
                                                        messages=[PublishMessage("k", {}, b"x")]))

        # failover: kill -9 the catalogue's active, then the node holding orders.eu/0
        victim = await catalogue_active(cl)
        await cl.nodes[victim].kill()
        await wait_until(lambda: _catalogue_moved(cl, victim), timeout=30,
                         what=f"a catalogue active other than {victim}")
        survivors = [n for n in cl.nodes if n != victim]
        async with await login(cl.url_of(survivors[0])) as admin2:  # a change under the new catalogue active
            await admin2.create_user("carol", "carol-password", "user")
            await admin2.grant("carol", "payments", ["produce", "consume"])
        for name in survivors:
            await check_bob(url_as("bob", BOB_PW, cl.nodes[name]))
            await wait_until(functools.partial(logs_in, url_as("carol", "carol-password", cl.nodes[name])),
                             timeout=15, what=f"carol logs in on {name}")
        await cl.nodes[victim].start()
        await cl.wait_ready()
        await cl.wait_members()
        # the member that was away catches up: carol and her grant are there too
        await wait_until(lambda: logs_in(url_as("carol", "carol-password", cl.nodes[victim])), timeout=30,
                         what=f"carol logs in on {victim} after its restart")
        await check_bob(url_as("bob", BOB_PW, cl.nodes[victim]))
        holder = (await cl.actives("orders.eu", 3))[0]
        await cl.nodes[holder].kill()
        await cl.wait_ready()
        for name in (n for n in cl.nodes if n != holder):
            await check_bob(url_as("bob", BOB_PW, cl.nodes[name]))
        await cl.nodes[holder].start()

        # the whole group restarts: users and grants come back from the stores
        await asyncio.gather(*(p.stop() for p in cl.nodes.values()))
        await cl.start()
        await cl.wait_ready()
        await cl.wait_members()
        for proc in cl.nodes.values():
            await check_bob(url_as("bob", BOB_PW, proc))
        got = await consume_all(bob_group, "orders.eu", 30)
        assert sorted(got) == sorted(f"o{i}".encode() for i in range(30))
        # users: one set across the group; deleting one ends it everywhere
        async with await login(node3.url) as admin3:
            assert [(u.name, u.role) for u in await admin3.list_users()] == [
                ("admin", "admin"), ("bob", "user"), ("carol", "user"), ("watch", "monitor")]
            await admin3.delete_user("carol")
        for proc in cl.nodes.values():
            await wait_until(functools.partial(_refused_login, url_as("carol", "carol-password", proc)), timeout=15,
                             what=f"carol gone on {proc.name}")
        # the group's first admin was seeded once, by the first catalogue active, and applied everywhere
        seeded = [p.log_text().count("the group's first admin") for p in cl.nodes.values()]
        assert all(n >= 1 for n in seeded), seeded


async def _catalogue_moved(cl: LocalCluster, old: str) -> bool:
    """Every live member knows a catalogue active, and it is not ``old``."""
    seen = {p.active for _n, st in await cl._statuses() for p in st.partitions if p.queue == ""}
    return len(seen) == 1 and "" not in seen and old not in seen


async def _has_grant(url: str) -> bool:
    async with await login(url) as conn:
        return bool(await conn.list_acls("bob"))


async def _refused_login(url: str) -> bool:
    return not await logs_in(url)


async def test_a_single_node_enforces_grants_and_keeps_them_over_a_restart(tmp_path: Path) -> None:
    proc = NodeProcess(tmp_path / "n1", password=PASSWORD)
    await proc.start()
    try:
        async with await login(proc.url) as admin:
            await admin.declare_queue("orders.eu")
            await admin.declare_queue("payments")
            await admin.create_user("bob", BOB_PW)
            await admin.grant("bob", "orders.*", ["consume"])
            with pytest.raises(TandemError, match="exists"):
                await admin.create_user("bob", BOB_PW)
            with pytest.raises(TandemError, match="group permission"):
                await admin.grant("bob", "orders.*", ["admin"])
            with pytest.raises(TandemError, match="no user 'nobody'"):
                await admin.grant("nobody", "*", ["browse"])
            async with admin.producer("orders.eu") as p:
                await p.send(b"hello", key="k")
        await check_bob(url_as("bob", BOB_PW, proc))
        await proc.stop()
        await proc.start()
        await check_bob(url_as("bob", BOB_PW, proc))
        async with await login(url_as("bob", BOB_PW, proc)) as bob:
            m = await bob.get("orders.eu", auto_ack=True)
            assert m is not None and m.body == b"hello"
        async with await login(proc.url) as admin:
            await admin.change_password("bob", "bob-password-2")
            await admin.revoke("bob", "orders.*", ["consume"])
        assert not await logs_in(url_as("bob", BOB_PW, proc))
        async with await login(url_as("bob", "bob-password-2", proc)) as bob:
            assert await bob.list_queues() == []
            with pytest.raises(AccessRefusedError, match="'bob'.*'consume'.*'orders.eu'"):
                await bob.get("orders.eu")
    finally:
        await proc.stop()


async def run_cli(*args: str, stdin: str = "") -> tuple[int, str, str]:
    command, env = node_command()
    p = await asyncio.create_subprocess_exec(*command, *args, stdin=asyncio.subprocess.PIPE,
                                             stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)
    out, err = await p.communicate(stdin.encode())
    assert p.returncode is not None
    return p.returncode, out.decode(), err.decode()


async def test_the_cli_manages_users_and_grants_on_any_member(tmp_path: Path) -> None:
    async with running_group(tmp_path) as cl:
        url1, url3 = cl.url_of("node1"), cl.url_of("node3")
        rc, out, err = await run_cli("users", "add", "bob", "--role", "user", "--password-stdin", "--url", url1,
                                     stdin=BOB_PW + "\n")
        assert (rc, out, err) == (0, "user bob created (role user); it logs in on every member\n", "")
        rc, out, err = await run_cli("acl", "grant", "bob", "orders.*", "consume,browse", "--url", url3)
        assert (rc, out, err) == (0, "granted consume,browse on 'orders.*' to bob\n", "")
        bob_url = url_as("bob", BOB_PW, cl.nodes["node3"])
        # what follows changes nothing: all at once
        (listed, users, again, eve, write, bob_users, bob_acls, _) = await asyncio.gather(
            run_cli("acl", "list", "bob", "--json", "--url", url1),
            run_cli("users", "list", "--json", "--url", url3),
            run_cli("users", "add", "bob", "--password-stdin", "--url", url1, stdin=BOB_PW + "\n"),
            run_cli("users", "add", "eve", "--url", url1),  # no terminal, no --password-stdin
            run_cli("acl", "grant", "bob", "orders.*", "write", "--url", url1),
            run_cli("users", "list", "--url", bob_url),
            run_cli("acl", "list", "bob", "--url", bob_url),  # a user sees its own grants
            wait_until(lambda: _cli_lists_grant(url1), timeout=15, what="the grant on node1"))
        assert listed[0] == 0
        rc, out, _err = users
        assert rc == 0 and {"name": "bob", "role": "user"} in json.loads(out)
        rc, _out, err = again
        assert rc == 2 and "exists" in err and "Traceback" not in err
        rc, _out, err = eve
        assert rc == 2 and "--password-stdin" in err
        rc, _out, err = write
        assert rc == 2 and "unknown permission 'write'" in err
        rc, _out, err = bob_users
        assert rc == 2 and "'admin'" in err
        rc, out, _err = bob_acls
        assert rc == 0 and "orders.*" in out and "browse,consume" not in out and "consume,browse" in out
        rc, _out, err = await run_cli("users", "passwd", "bob", "--password-stdin", "--url", url3,
                                      stdin="bob-password-2\n")
        assert (rc, err) == (0, "")
        await wait_until(lambda: logs_in(url_as("bob", "bob-password-2", cl.nodes["node1"])), timeout=15,
                         what="bob's new password on node1")
        rc, _out, err = await run_cli("users", "delete", "bob", "--url", url1)
        assert (rc, err) == (0, "")


async def _cli_lists_grant(url: str) -> bool:
    rc, out, _err = await run_cli("acl", "list", "--json", "--url", url)
    return rc == 0 and {"user": "bob", "pattern": "orders.*", "permissions": ["consume", "browse"]} in json.loads(out)



async def test_shared_mode_keeps_grants_in_the_database_through_a_takeover(pair: LocalCluster) -> None:
    """Shared mode: a change is a write to the group's database; the node that takes over
    loads the users and grants from it."""
    cl = pair
    active = await the_active(cl)
    async with await login(cl.url_of(active)) as admin:
        await admin.declare_queue("orders.eu")
        await admin.declare_queue("payments")
        await admin.create_user("bob", BOB_PW)
        await admin.grant("bob", "orders.*", ["consume"])
    await check_bob(url_as("bob", BOB_PW, cl.nodes[active]))
    await cl.nodes[active].kill()
    other = await the_active(cl, not_=active)
    await check_bob(url_as("bob", BOB_PW, cl.nodes[other]))
