"""The attacker's view with a low-privilege login: ``mallory`` (role user, ``configure``,
``produce`` and ``consume`` on ``sandbox.*`` only) tries every operation she holds no
permission for, on every member of a real three-process group: the queue requests on
``payments`` (whose partitions are active on other members, so a request that got past the
entering member would be forwarded), every group operation, the peer frames, other
connections' deliveries, and every route of each member's console.  Each is refused, and at
the end the group is as it was.

tests/integration/test_acl.py proves that grants are enforced through failovers and restarts
and that the CLI manages them; this module proves that nothing on any front end is open to a
user whose grants do not name it (docs/security.md, "Authorization map").
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from broker.messaging.forward import ForwardKind
from broker.partitions.quarantine import QUEUE as QUARANTINE
from client.consumer import Message
from client.errors import (AccessRefusedError, ConsumerNotFoundError, InvalidArgumentError, TandemError,
                           UnknownDeliveryTagError)
from client.protocol.frames import (Ack, AclGrant, AclList, AclRevoke, Bind, Cancel, ChangeGroup, ChangePartitions,
                                    Declare, DeclareExchange, Delete, DeleteExchange, Unbind, DrainNode, FinalizeUpgrade, Forward, Frame, Get, Metadata, MovePartition, Nack,
                                    FetchOffset, Produced, Publish, PublishMessage, Purge, Read, Reject, StoreOffset,
                                    SetOption, SetQuorumOverride, Subscribe, UserDelete, UserList, UserPut)
from tests.helpers import wait_until
from tests.security.conftest import (MALLORY, MALLORY_PASSWORD, PARTITIONS, PAYMENTS, PER_PARTITION, WATCH,
                                     SecurityGroup, basic, retrying)
from tests.security.surface import PUBLIC, console_routes, example_path, forward_example

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.integration, pytest.mark.timeout(300),
              pytest.mark.xdist_group("security-low-privilege")]

MEMBERS = ["node1", "node2", "node3"]


@dataclass(frozen=True)
class Refused:
    """A request mallory may not make, and the permission its refusal names."""

    id: str
    permission: str
    make: Callable[[int], Frame]


def _msg() -> list[PublishMessage]:
    return [PublishMessage("k", {}, b"forged")]


def _publish_to(partition: int, rid: int) -> Frame:
    return Publish(rid=rid, queue=PAYMENTS, messages=_msg(), producer_id="mallory", partition=partition)


def _read(partition: int, rid: int) -> Frame:
    return Read(rid=rid, queue=PAYMENTS, partition=partition)


def _produced(partition: int, rid: int) -> Frame:
    return Produced(rid=rid, queue=PAYMENTS, partition=partition, producer="seed-0")


#: every queue request, on payments (and the quarantine a restore reads); a partition each:
#: on every member two of them are active elsewhere
QUEUE_REQUESTS = [
    Refused("Publish", "produce", lambda rid: Publish(rid=rid, queue=PAYMENTS, messages=_msg())),
    *(Refused(f"Publish-p{p}", "produce", functools.partial(_publish_to, p)) for p in range(PARTITIONS)),
    Refused("Subscribe", "consume", lambda rid: Subscribe(rid=rid, queue=PAYMENTS, prefetch=10)),
    Refused("Get", "consume", lambda rid: Get(rid=rid, queue=PAYMENTS, auto_ack=True)),
    *(Refused(f"Read-p{p}", "browse", functools.partial(_read, p)) for p in range(PARTITIONS)),
    *(Refused(f"Produced-p{p}", "browse", functools.partial(_produced, p)) for p in range(PARTITIONS)),
    Refused("StoreOffset", "consume",
            lambda rid: StoreOffset(rid=rid, queue=PAYMENTS, partition=0, consumer="mallory", offset=0)),
    Refused("FetchOffset", "browse", lambda rid: FetchOffset(rid=rid, queue=PAYMENTS, partition=0, consumer="billing")),
    Refused("Metadata", "permission", lambda rid: Metadata(rid=rid, queue=PAYMENTS)),
    Refused("Purge", "configure", lambda rid: Purge(rid=rid, queue=PAYMENTS)),
    Refused("Delete", "configure", lambda rid: Delete(rid=rid, queue=PAYMENTS)),
    Refused("Delete-if-empty", "configure", lambda rid: Delete(rid=rid, queue=PAYMENTS, if_empty=True)),
    Refused("Declare-existing", "configure", lambda rid: Declare(rid=rid, queue=PAYMENTS, partitions=PARTITIONS)),
    Refused("Declare-new", "configure", lambda rid: Declare(rid=rid, queue="payments.eu")),
    Refused("Subscribe-quarantine", "consume", lambda rid: Subscribe(rid=rid, queue=QUARANTINE, prefetch=10)),
    Refused("Read-quarantine", "browse", lambda rid: Read(rid=rid, queue=QUARANTINE, partition=0)),
    Refused("Publish-quarantine", "produce", lambda rid: Publish(rid=rid, queue=QUARANTINE, messages=_msg())),
    Refused("Publish-exchange", "produce", lambda rid: Publish(rid=rid, queue="", messages=_msg(), exchange=PAYMENTS)),
    Refused("Publish-default-exchange", "produce",
            lambda rid: Publish(rid=rid, queue="", messages=_msg(), exchange="", routing_key=PAYMENTS)),
    Refused("Publish-default-exchange-keys", "produce",
            lambda rid: Publish(rid=rid, queue="", messages=_msg() * 2, exchange="",
                                routing_keys=["sandbox.node1", PAYMENTS])),
    Refused("DeclareExchange", "configure", lambda rid: DeclareExchange(rid=rid, exchange=PAYMENTS, type="fanout")),
    Refused("DeleteExchange", "configure", lambda rid: DeleteExchange(rid=rid, exchange=PAYMENTS)),
    Refused("Bind-from-payments", "consume", lambda rid: Bind(rid=rid, source=PAYMENTS, destination="sandbox.q")),
    Refused("Bind-to-payments", "configure", lambda rid: Bind(rid=rid, source="sandbox.x", destination=PAYMENTS)),
    Refused("Unbind-to-payments", "configure", lambda rid: Unbind(rid=rid, source="sandbox.x", destination=PAYMENTS)),
]

#: every group operation (the admin permission), with the arguments that would do the most harm
GROUP_OPERATIONS = [
    Refused("SetOption-priority", "admin", lambda rid: SetOption(rid=rid, name="priority", value=0)),
    Refused("SetOption-designated_primary", "admin",
            lambda rid: SetOption(rid=rid, name="designated_primary", value=1)),
    Refused("SetQuorumOverride", "admin", lambda rid: SetQuorumOverride(rid=rid, nodes=1)),
    Refused("SetQuorumOverride-clear", "admin", lambda rid: SetQuorumOverride(rid=rid, nodes=None)),
    Refused("DrainNode", "admin", lambda rid: DrainNode(rid=rid, node="node2", drained=True)),
    Refused("DrainNode-undrain", "admin", lambda rid: DrainNode(rid=rid, node="node1", drained=False)),
    Refused("FinalizeUpgrade", "admin", lambda rid: FinalizeUpgrade(rid=rid)),
    Refused("MovePartition", "admin",
            lambda rid: MovePartition(rid=rid, queue=PAYMENTS, partition=0, nodes=["node3", "node2", "node1"])),
    Refused("MovePartition-force", "admin",
            lambda rid: MovePartition(rid=rid, queue=PAYMENTS, partition=1, nodes=["node2", "node3", "node1"],
                                      force_replication=True)),
    Refused("ChangeGroup-add", "admin",
            lambda rid: ChangeGroup(rid=rid, action="add", node="node9", address="127.0.0.1:1")),
    Refused("ChangeGroup-remove", "admin", lambda rid: ChangeGroup(rid=rid, action="remove", node="node3")),
    Refused("ChangePartitions-add", "admin",
            lambda rid: ChangePartitions(rid=rid, queue=PAYMENTS, action="add", count=1)),
    Refused("ChangePartitions-update", "admin",
            lambda rid: ChangePartitions(rid=rid, queue=PAYMENTS, action="update", mapper="jump_hash")),
    Refused("UserPut-create-admin", "admin",
            lambda rid: UserPut(rid=rid, name="eve", password="eve-password-1", role="admin", mode="create")),
    Refused("UserPut-password-of-admin", "admin",
            lambda rid: UserPut(rid=rid, name="admin", password="mallory-owns-it", mode="password")),
    Refused("UserPut-put-self-admin", "admin",
            lambda rid: UserPut(rid=rid, name=MALLORY, password=MALLORY_PASSWORD, role="admin", mode="put")),
    Refused("UserPut-password-of-self", "admin",
            lambda rid: UserPut(rid=rid, name=MALLORY, password="mallory-password-2", mode="password")),
    Refused("UserDelete", "admin", lambda rid: UserDelete(rid=rid, name="admin")),
    Refused("UserList", "admin", lambda rid: UserList(rid=rid)),
    Refused("AclGrant-self-admin", "admin",
            lambda rid: AclGrant(rid=rid, user=MALLORY, pattern="*", permissions=["admin"])),
    Refused("AclGrant-self-payments", "admin",
            lambda rid: AclGrant(rid=rid, user=MALLORY, pattern=PAYMENTS, permissions=["produce", "consume"])),
    Refused("AclRevoke", "admin",
            lambda rid: AclRevoke(rid=rid, user=WATCH, pattern="*", permissions=["browse"])),
    Refused("AclList-other", "admin", lambda rid: AclList(rid=rid, user="admin")),
    Refused("AclList-everyone", "admin", lambda rid: AclList(rid=rid, user=None)),
]


async def _refused(target: SecurityGroup, member: str, case: Refused) -> None:
    async with await target.login(member, MALLORY) as conn:
        with pytest.raises(AccessRefusedError) as err:
            await conn.request(case.make)
        assert f"'{MALLORY}'" in err.value.message, err.value.message
        if case.permission != "permission":
            assert f"'{case.permission}'" in err.value.message, err.value.message
        else:
            assert "no permission on queue" in err.value.message, err.value.message
        # a refusal costs the request, not the connection; her queue list names her queues only
        assert all(q.name.startswith("sandbox.") for q in await conn.list_queues())


async def test_mallory_may_use_what_her_grants_name(target: SecurityGroup) -> None:
    """The control: her login works on every member, and the refusals below are about
    permissions, not a broken session."""
    for member in MEMBERS:
        queue = f"sandbox.{member}"
        async with await target.login(member, MALLORY) as conn:
            # (a Get takes from the partitions active on the member asked: this one's, here)
            placement = [[member, *(m for m in MEMBERS if m != member)]]
            await retrying(lambda: conn.declare_queue(queue, placement=placement), f"declare {queue}")
            await retrying(lambda: conn.request(lambda rid: Publish(
                rid=rid, queue=queue, producer_id="mallory", messages=[PublishMessage("k", {}, b"mine", 0)])),
                f"publish to {queue}")
            got: list[bytes] = []

            async def get() -> bool:
                m = await conn.get(queue, auto_ack=True)
                if m is not None:
                    got.append(m.body)
                return bool(got)

            await wait_until(get, timeout=30, what=f"mallory gets her message on {member}")
            assert got == [b"mine"]


@pytest.mark.parametrize("member", MEMBERS)
@pytest.mark.parametrize("case", QUEUE_REQUESTS, ids=lambda c: c.id)
async def test_mallory_is_refused_every_queue_request(target: SecurityGroup, case: Refused, member: str) -> None:
    await _refused(target, member, case)


@pytest.mark.parametrize("member", MEMBERS)
@pytest.mark.parametrize("case", GROUP_OPERATIONS, ids=lambda c: c.id)
async def test_mallory_is_refused_every_group_operation(target: SecurityGroup, case: Refused, member: str) -> None:
    await _refused(target, member, case)


@pytest.mark.parametrize("member", MEMBERS)
async def test_mallory_lists_her_own_grants_only(target: SecurityGroup, member: str) -> None:
    async with await target.login(member, MALLORY) as conn:
        assert {a.user for a in await conn.list_acls(MALLORY)} == {MALLORY}


@pytest.mark.parametrize("member", MEMBERS)
@pytest.mark.parametrize("kind", list(ForwardKind), ids=lambda k: k.name)
async def test_peer_frames_on_the_client_port_are_refused(target: SecurityGroup, kind: ForwardKind,
                                                          member: str) -> None:
    """A logged-in client cannot speak for a member: a ``Forward`` (which carries no user, the
    entering member having checked it) sent on the client port is no request a client may send."""
    req = forward_example(kind, PAYMENTS)
    async with await target.login(member, MALLORY) as conn:
        with pytest.raises(InvalidArgumentError, match="Forward is not a request a client may send"):
            await conn.request(lambda rid: Forward(rid=rid, kind=int(kind), payload=req.pack()))


async def _active_for_some(target: SecurityGroup, member: str) -> bool:
    return member in (await target.cluster.actives(PAYMENTS, PARTITIONS)).values()


@pytest.mark.parametrize("member", MEMBERS)
async def test_settling_and_cancelling_reach_only_the_connections_own_deliveries(target: SecurityGroup,
                                                                                 member: str) -> None:
    """``Ack``, ``Nack``, ``Reject`` and ``Cancel`` check no permission: they name delivery tags
    and consumers of their own connection, so mallory guessing the tags of admin's deliveries
    on the same member settles nothing and dead-letters nothing."""
    await wait_until(lambda: _active_for_some(target, member), timeout=30,
                     what=f"{member} active for a partition of {PAYMENTS}")
    async with await target.login(member) as admin, await target.login(member, MALLORY) as mallory:
        async with admin.consumer(PAYMENTS, prefetch=3) as c:
            held: list[Message] = []
            for _ in range(3):
                m = await c.next(10)
                assert m is not None, f"admin got only {len(held)} deliveries on {member}"
                held.append(m)
            tags = [m.tag for m in held]
            assert c.consumer_id is not None
            cid = c.consumer_id
            attempts: list[tuple[Callable[[int], Frame], type[TandemError]]] = [
                (lambda rid: Ack(rid=rid, tags=tags), UnknownDeliveryTagError),
                (lambda rid: Ack(rid=rid, tags=[max(tags)], multiple=True), UnknownDeliveryTagError),
                (lambda rid: Nack(rid=rid, tags=tags, requeue=False), UnknownDeliveryTagError),
                (lambda rid: Reject(rid=rid, tags=tags), UnknownDeliveryTagError),
                (lambda rid: Cancel(rid=rid, consumer=cid), ConsumerNotFoundError),
            ]
            for make, error in attempts:
                with pytest.raises(error):
                    await mallory.request(make)
            # admin's deliveries are still admin's, and its consumer still runs
            for m in held:
                await m.nack(requeue=True)
            again = await c.next(10)
            assert again is not None
            await again.nack(requeue=True)
    assert await target.depth() == PARTITIONS * PER_PARTITION


ROUTES = [r for r in console_routes() if r not in PUBLIC]
#: what any logged-in user may do: see who it is, log out
ANY_LOGIN = {("GET", "/api/v1/session"), ("POST", "/logout")}
#: the routes that change something (the admin permission)
CHANGES = [r for r in ROUTES if r[0] != "GET" and r not in ANY_LOGIN]


@pytest.mark.parametrize("member", MEMBERS)
@pytest.mark.parametrize("route", ROUTES, ids=lambda r: f"{r[0]} {r[1]}")
async def test_mallory_is_refused_every_console_route(target: SecurityGroup, route: tuple[str, str],
                                                      member: str) -> None:
    """A user without role admin or monitor, or the admin permission, may use no part of the
    console on any member (403), but see who she is and log out."""
    method, path = route
    async with aiohttp.ClientSession() as s:
        async with s.request(method, target.console(member) + example_path(path),
                             headers=basic(MALLORY), json={}, allow_redirects=False) as r:
            body: Any = await r.json() if r.content_type == "application/json" else await r.text()
            if route in ANY_LOGIN:
                assert r.status == 200, (route, r.status, body)
                if path == "/api/v1/session":
                    assert body["user"] == MALLORY and body["admin"] is False and body["csrf"] is None
            else:
                assert r.status == 403 and body["error"] == "forbidden", (route, r.status, body)
                assert f"'{MALLORY}'" in body["message"]


@pytest.mark.parametrize("member", MEMBERS)
@pytest.mark.parametrize("route", CHANGES, ids=lambda r: f"{r[0]} {r[1]}")
async def test_a_monitor_may_change_nothing_through_the_console(target: SecurityGroup, route: tuple[str, str],
                                                                member: str) -> None:
    method, path = route
    async with aiohttp.ClientSession() as s:
        async with s.request(method, target.console(member) + example_path(path),
                             headers=basic(WATCH), json={}, allow_redirects=False) as r:
            body = await r.json()
            assert r.status == 403 and body["error"] == "forbidden" and "may only look" in body["message"], \
                (route, r.status, body)


@pytest.mark.parametrize("member", MEMBERS)
async def test_a_monitor_lists_no_users_and_no_grants_but_its_own(target: SecurityGroup, member: str) -> None:
    """Who the users are and what they may do takes the admin permission, on the console as
    on the client port (UserList, AclList of another user)."""
    base = target.console(member)
    async with aiohttp.ClientSession() as s:
        for path in ("/api/v1/users", "/api/v1/acls", f"/api/v1/acls?user={MALLORY}"):
            async with s.get(base + path, headers=basic(WATCH)) as r:
                body = await r.json()
                assert r.status == 403 and body["error"] == "forbidden" and "'admin'" in body["message"], (path, body)
        async with s.get(f"{base}/api/v1/acls?user={WATCH}", headers=basic(WATCH)) as r:
            assert r.status == 200 and await r.json() == []


@pytest.mark.parametrize("member", MEMBERS)
async def test_mallory_logged_in_to_the_console_by_cookie_gets_nothing_either(target: SecurityGroup,
                                                                              member: str) -> None:
    base = target.console(member)
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
        async with browser.post(f"{base}/login", json={"user": MALLORY, "password": MALLORY_PASSWORD}) as r:
            assert r.status == 200
            csrf = (await r.json())["csrf"]
        async with browser.get(f"{base}/api/v1/overview") as r:
            assert r.status == 403
        async with browser.post(f"{base}/api/v1/acls", headers={"X-CSRF-Token": csrf},
                                json={"user": MALLORY, "pattern": "*", "permissions": ["admin"]}) as r:
            assert r.status == 403
        async with browser.get(f"{base}/api/v1/session") as r:
            assert r.status == 200 and (await r.json())["admin"] is False


async def test_after_every_refusal_the_group_is_as_it_was(target: SecurityGroup) -> None:
    """Runs last: the queue, its messages, the users, the grants and every member's settings
    are those the group started with."""
    state = await target.state()
    assert state == target.baseline
    assert state.depth == PARTITIONS * PER_PARTITION
    assert state.users == [("admin", "admin"), (MALLORY, "user"), (WATCH, "monitor")]
    assert state.grants == [(MALLORY, "sandbox.*", ["configure", "consume", "produce"])]
