"""Dead-lettering is a write to another queue: against a real 3-node group.

The attack: a user with configure/produce/consume on ``sandbox.*`` only declares
``sandbox.trap`` with ``dead_letter_queue=payments``, publishes and rejects, and her message
(her headers and body) lands in ``payments``.  The declare is refused, and so is any
dead-letter queue or queue in the node's namespace ``tandem.*``; an admin's dead-letter queue
and a permitted user's work as they did.  The check is made again when a message is
dead-lettered: once the owner's ``produce`` on the target is revoked, a rejected message no
longer lands there, wherever the two queues' partitions are active.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

import client
from broker.tools.cluster import LocalCluster
from client.connection import Connection
from client.errors import AccessRefusedError, InvalidArgumentError
from tests.conftest import PASSWORD, running_group
from tests.helpers import wait_until
from tests.integration.test_acl import catalogue_active, login, logs_in, url_as

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.timeout(240)]

MALLORY_PW, ALICE_PW = "mallory-password", "alice-password"


async def _grants_everywhere(cl: LocalCluster, user: str, password: str, expected: list[tuple[str, list[str]]]) -> None:
    """Until every member lets ``user`` log in and holds her grants as ``expected``."""
    for proc in cl.nodes.values():
        await wait_until(functools.partial(logs_in, url_as(user, password, proc)), timeout=15,
                         what=f"{user} logs in on {proc.name}")

        async def applied() -> bool:
            async with await login(proc.url) as admin:
                return [(a.pattern, a.permissions) for a in await admin.list_acls(user)] == expected

        await wait_until(applied, timeout=15, what=f"{user}'s grants {expected} on {proc.name}")


async def _active(cl: LocalCluster, queue: str) -> str:
    found: dict[int, str] = {}

    async def known() -> bool:
        found.update(await cl.actives(queue, 1))
        return 0 in found

    await wait_until(known, timeout=30, what=f"an active for {queue}")
    return found[0]


async def _get(cl: LocalCluster, queue: str) -> list[bytes]:
    """What an admin gets of ``queue`` on every member (only its partition's active has any),
    acked."""
    got = []
    for proc in cl.nodes.values():
        async with await login(proc.url) as admin:
            m = await admin.get(queue, auto_ack=True)
            if m is not None:
                got.append(m.body)
    return got


async def _reject_one(conn: Connection, queue: str) -> None:
    m = await conn.get(queue)
    assert m is not None, f"nothing to get from {queue}"
    await m.reject()


async def test_the_trap_is_refused_and_revoking_produce_stops_dead_lettering(tmp_path: Path) -> None:
    async with running_group(tmp_path) as cl:
        await cl.wait_members()
        names = list(cl.nodes)
        cat = await catalogue_active(cl)
        entry, other = [n for n in names if n != cat]  # (a member that forwards declares, and a third)
        async with await client.connect(cl.url) as admin:
            await admin.declare_queue("payments")
            await admin.create_user("mallory", MALLORY_PW, "user")
            await admin.grant("mallory", "sandbox.*", ["produce", "consume", "configure"])
            await admin.create_user("alice", ALICE_PW, "user")
            await admin.grant("alice", "src", ["produce", "consume", "configure"])
            await admin.grant("alice", "dst", ["produce", "consume", "configure"])
        await _grants_everywhere(cl, "mallory", MALLORY_PW, [("sandbox.*", ["produce", "consume", "configure"])])
        await _grants_everywhere(cl, "alice", ALICE_PW, [("dst", ["produce", "consume", "configure"]),
                                                          ("src", ["produce", "consume", "configure"])])

        # -- the trap, on a member that forwards declares to the catalogue's active --------------
        async with await login(url_as("mallory", MALLORY_PW, cl.nodes[entry])) as mallory:
            with pytest.raises(AccessRefusedError) as err:
                await mallory.declare_queue("sandbox.trap", dead_letter_queue="payments")
            for word in ("'mallory'", "'produce'", "'payments'"):
                assert word in err.value.message, err.value.message
            with pytest.raises(AccessRefusedError, match="reserved for the node"):
                await mallory.declare_queue("sandbox.trap", dead_letter_queue="tandem.quarantine")
            with pytest.raises(AccessRefusedError):
                await mallory.declare_queue("tandem.x")
            assert [q.name for q in await mallory.list_queues()] == []
        async with await login(cl.nodes[entry].url) as admin_link:  # the namespace is the node's, even for an admin
            for queue, dlq in (("tandem.x", None), ("orders", "tandem.quarantine")):
                with pytest.raises(AccessRefusedError, match="reserved for the node"):
                    await admin_link.declare_queue(queue, dead_letter_queue=dlq)
            assert {q.name for q in await admin_link.list_queues()} == {"payments"}

        # -- an admin's dead-letter queue works as it did ---------------------------------------
        async with await client.connect(cl.url) as admin:
            await admin.declare_queue("orders.dead")
            await admin.declare_queue("orders", dead_letter_queue="orders.dead")
            async with admin.producer("orders") as p:
                await p.send(b"poison", key="k")
        async with await login(cl.nodes[await _active(cl, "orders")].url) as admin_link:
            await _reject_one(admin_link, "orders")
        dead: list[bytes] = []

        async def dead_lettered() -> bool:
            dead.extend(await _get(cl, "orders.dead"))
            return bool(dead)

        await wait_until(dead_lettered, timeout=15, what="the admin's rejected message in orders.dead")
        assert dead == [b"poison"]

        # -- a permitted user: dead-lettered while she may write there, not once that is revoked --
        # (src placed on ``entry``, dst on ``other``: the check runs where src is active, and the
        # message would go to dst's active over the peer link)
        async with await login(url_as("alice", ALICE_PW, cl.nodes[entry])) as alice:
            await alice.declare_queue("dst", placement=[[other, entry, cat]])
            await alice.declare_queue("src", dead_letter_queue="dst", placement=[[entry, other, cat]])
        alice_group = cl.url.replace(f"admin:{PASSWORD}@", f"alice:{ALICE_PW}@")
        src_active = await _active(cl, "src")
        async with await client.connect(alice_group) as conn:
            async with conn.producer("src") as p:
                await p.send(b"first", key="k")
        async with await login(url_as("alice", ALICE_PW, cl.nodes[src_active])) as alice:
            await _reject_one(alice, "src")
        moved: list[bytes] = []

        async def in_dst() -> bool:
            moved.extend(await _get(cl, "dst"))
            return bool(moved)

        await wait_until(in_dst, timeout=15, what="alice's rejected message in dst")
        assert moved == [b"first"]

        async with await client.connect(cl.url) as admin:
            await admin.revoke("alice", "dst", ["produce"])
        await _grants_everywhere(cl, "alice", ALICE_PW, [("dst", ["consume", "configure"]),
                                                          ("src", ["produce", "consume", "configure"])])
        async with await client.connect(alice_group) as conn:
            async with conn.producer("src") as p:
                await p.send(b"second", key="k", headers={"x-forged": "yes"})
        src_active = await _active(cl, "src")
        async with await login(url_as("alice", ALICE_PW, cl.nodes[src_active])) as alice:
            await _reject_one(alice, "src")
            assert await alice.get("src") is None  # settled: not back in src either
        warning = "not permitted: user 'alice' has no 'produce' on dst"
        await wait_until(lambda: warning in cl.nodes[src_active].log_text(), timeout=15,
                         what=f"{src_active} logs why it did not dead-letter")
        # (refused before anything was sent to dst's active: nothing is on its way there)
        assert await _get(cl, "dst") == []
        assert await _get(cl, "payments") == []


async def test_every_member_refuses_a_missing_dead_letter_queue_and_the_delete_of_one_in_use(tmp_path: Path) -> None:
    """Whichever member a declare or delete enters, the catalogue's active decides it: a
    dead_letter_queue that does not exist is refused, and so is deleting a queue another names."""
    async with running_group(tmp_path) as cl:
        for proc in cl.nodes.values():
            async with await login(proc.url) as admin:
                with pytest.raises(InvalidArgumentError, match="dead_letter_queue 'dlq': no such queue"):
                    await admin.declare_queue(f"work.{proc.name}", dead_letter_queue="dlq")
        async with await login(cl.nodes["node1"].url) as admin:
            await admin.declare_queue("dlq")
            await admin.declare_queue("work", dead_letter_queue="dlq")
        for proc in cl.nodes.values():
            async with await login(proc.url) as admin:
                await wait_until(functools.partial(_has, admin, {"dlq", "work"}), timeout=15,
                                 what=f"both queues on {proc.name}")
                with pytest.raises(InvalidArgumentError, match="queue 'dlq' is the dead_letter_queue of work"):
                    await admin.delete_queue("dlq")
        async with await login(cl.nodes["node1"].url) as admin:
            assert sorted(q.name for q in await admin.list_queues()) == ["dlq", "work"]  # (nothing deleted)


async def _has(conn: Connection, names: set[str]) -> bool:
    return names <= {q.name for q in await conn.list_queues()}
