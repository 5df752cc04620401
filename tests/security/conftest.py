"""The security suite's group: one real three-process replication group per test module.

The group holds the queue ``payments`` (three partitions, each preferring another member as
its active, and active on more than one: every member forwards the requests for some of them)
with messages in each partition, and three users:

* ``admin`` (role admin, :data:`tests.conftest.PASSWORD`);
* ``mallory`` (role user): ``configure``, ``produce`` and ``consume`` on ``sandbox.*``, nothing
  else;
* ``watch`` (role monitor): looks at everything, changes nothing.

A module that uses the fixture :func:`target` (the group under attack) marks its tests ``pytest.mark.asyncio(loop_scope="module")``
(the group's processes belong to the module's event loop) and one
``pytest.mark.xdist_group`` (``make test`` runs ``pytest -n 2 --dist loadgroup``: the module's
tests then share one worker, and the group starts once).
"""

from __future__ import annotations

import base64
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import pytest
import pytest_asyncio

import client
from broker.tools.cluster import LocalCluster
from client.connection import Connection
from client.errors import AuthError, TandemError
from client.protocol.frames import Publish, PublishMessage, PublishOk, UserPut, expect
from tests.conftest import PASSWORD, running_group
from tests.helpers import wait_until

PAYMENTS = "payments"
PARTITIONS = 3
#: messages stored in each partition of payments
PER_PARTITION = 10
#: partition p prefers member p+1 as its active, then the others in turn
PLACEMENT = "node1,node2,node3;node2,node3,node1;node3,node1,node2"

MALLORY, MALLORY_PASSWORD, SANDBOX = "mallory", "mallory-password-1", "sandbox.*"
MALLORY_PERMISSIONS = ["configure", "produce", "consume"]
WATCH, WATCH_PASSWORD = "watch", "watch-password-1"
PASSWORDS = {"admin": PASSWORD, MALLORY: MALLORY_PASSWORD, WATCH: WATCH_PASSWORD}
#: failure detection for a group no test fails over: a busy machine (make test runs two workers
#: beside each other) must not move the actives mid-test
STEADY = ("--keepalive-interval", "0.2", "--non-response-timeout", "2")
#: seconds a change may keep meeting a retriable refusal (an election) before the test fails
RETRY_FOR = 30.0

T = TypeVar("T")


async def retrying(op: Callable[[], Awaitable[T]], what: str) -> T:
    """``op()``, made again while it fails with a retriable error (the catalogue's or a
    partition's active changing), for :data:`RETRY_FOR` seconds at most."""
    result: list[T] = []
    last: list[TandemError] = []

    async def once() -> bool:
        try:
            result.append(await op())
        except TandemError as exc:
            if not exc.retriable:
                raise
            last[:] = [exc]
            return False
        return True

    try:
        await wait_until(once, timeout=RETRY_FOR, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {last[0].message if last else ''}") from None
    return result[0]


def basic(user: str, password: str | None = None) -> dict[str, str]:
    """The HTTP Basic header of ``user`` (its own password unless ``password``)."""
    token = base64.b64encode(f"{user}:{password or PASSWORDS[user]}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


@dataclass(frozen=True)
class GroupState:
    """What an attacker's request could change, as the members report it."""

    depth: int  # ready and unsettled messages of payments, over the group
    users: list[tuple[str, str]]
    grants: list[tuple[str, str, list[str]]]
    #: per member: priority, quorum override, designated primary, drained members, moves,
    #: members, group change, updates, payments' partition count
    members: dict[str, tuple[object, ...]]


@dataclass
class SecurityGroup:
    cluster: LocalCluster
    #: the group's state once set up, before any test ran
    baseline: GroupState | None = None

    @property
    def members(self) -> list[str]:
        return list(self.cluster.nodes)

    def url(self, member: str, user: str = "admin", password: str | None = None) -> str:
        """The client URL of ``member`` alone, logged in as ``user``."""
        address = self.cluster.nodes[member].address
        assert address is not None, f"{member} is not running"
        return f"tandem://{user}:{password or PASSWORDS[user]}@{address[0]}:{address[1]}"

    async def login(self, member: str, user: str = "admin") -> Connection:
        """A plain link to ``member`` (no failover, no forwarding by the SDK) as ``user``."""
        return await client.connect_link(self.url(member, user), client_name=f"security-{user}")

    def client_port(self, member: str) -> tuple[str, int]:
        address = self.cluster.nodes[member].address
        assert address is not None, f"{member} is not running"
        return address

    def peer_port(self, member: str) -> int:
        return self.cluster.peer_ports[member]

    def console(self, member: str) -> str:
        """``member``'s console, without the trailing slash: ``http://127.0.0.1:PORT``."""
        return self.cluster.console_url(member).rstrip("/")

    async def depth(self) -> int:
        """Ready and unsettled messages of payments: each member counts the partitions it is
        active for."""
        total = 0
        for m in self.members:
            async with await self.login(m) as conn:
                total += sum(q.ready + q.unacked for q in await conn.list_queues() if q.name == PAYMENTS)
        return total

    async def state(self) -> GroupState:
        members: dict[str, tuple[object, ...]] = {}
        for m in self.members:
            async with await self.login(m) as conn:
                st = await conn.status()
                parts = [q.partitions for q in await conn.list_queues() if q.name == PAYMENTS]
            members[m] = (st.priority, st.quorum_override, st.designated_primary, sorted(st.drained),
                          sorted(st.moving), sorted(st.members), st.group_change, sorted(st.updating), parts)
        async with await self.login(self.members[0]) as conn:
            users = sorted((u.name, u.role) for u in await conn.list_users())
            grants = sorted((a.user, a.pattern, sorted(a.permissions)) for a in await conn.list_acls())
        return GroupState(await self.depth(), users, grants, members)


async def _logs_in_with_grant(target: SecurityGroup, member: str) -> bool:
    """mallory logs in on ``member`` and it knows her grant (a member applies the group's
    users and grants a moment after the one that took them)."""
    try:
        async with await target.login(member, MALLORY) as conn:
            return [(a.pattern, sorted(a.permissions)) for a in await conn.list_acls(MALLORY)] == \
                [(SANDBOX, sorted(MALLORY_PERMISSIONS))]
    except AuthError:
        return False


async def _knows_payments(target: SecurityGroup, member: str) -> bool:
    async with await target.login(member) as conn:
        return any(q.name == PAYMENTS for q in await conn.list_queues())


async def _actives_spread(target: SecurityGroup) -> bool:
    """Every partition of payments has an active, and no member is active for all of them
    (each member forwards some)."""
    actives = await target.cluster.actives(PAYMENTS, PARTITIONS)
    return len(actives) == PARTITIONS and len(set(actives.values())) > 1


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def target(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[SecurityGroup]:
    """One three-process group for the module's tests (stopped after its last one).  Does
    not depend on TANDEM_ADMIN_PASSWORD: the cluster is given the password."""
    async with running_group(tmp_path_factory.mktemp("security-group"), *STEADY, console=True) as cl:
        await cl.wait_members()
        g = SecurityGroup(cl)
        async with await g.login("node1") as admin:
            # each step may be made twice (a retry after an election): each is idempotent
            await retrying(lambda: admin.declare_queue(PAYMENTS, partitions=PARTITIONS, placement=PLACEMENT),
                           f"declare {PAYMENTS}")
            for user, role in ((MALLORY, "user"), (WATCH, "monitor")):
                await retrying(functools.partial(admin.request, functools.partial(_put_user, user, role)),
                               f"store user {user}")
            await retrying(lambda: admin.grant(MALLORY, SANDBOX, MALLORY_PERMISSIONS), f"grant {MALLORY}")
        for m in g.members:
            await wait_until(functools.partial(_knows_payments, g, m), timeout=30, what=f"{m} knows {PAYMENTS}")
            await wait_until(functools.partial(_logs_in_with_grant, g, m), timeout=30,
                             what=f"{MALLORY} and her grant on {m}")
        await wait_until(functools.partial(_actives_spread, g), timeout=30,
                         what=f"an active for each partition of {PAYMENTS}, on more than one member")
        async with await g.login("node1") as admin:  # node1 forwards to each partition's active
            for p in range(PARTITIONS):  # (a resend is confirmed as a duplicate, not stored twice)
                ok = expect(await retrying(functools.partial(admin.request, functools.partial(_seed_batch, p)),
                                           f"publish to {PAYMENTS}/{p}"), PublishOk)
                assert ok.stored + ok.duplicates == PER_PARTITION
        await wait_until(lambda: _depth_is(g, PARTITIONS * PER_PARTITION), timeout=30,
                         what=f"{PARTITIONS * PER_PARTITION} messages in {PAYMENTS}")
        g.baseline = await g.state()
        yield g


def _put_user(name: str, role: str, rid: int) -> UserPut:
    return UserPut(rid=rid, name=name, password=PASSWORDS[name], role=role, mode="put")


def _seed_batch(partition: int, rid: int) -> Publish:
    """The messages of one partition of payments, under a producer id of their own."""
    return Publish(rid=rid, queue=PAYMENTS, producer_id=f"seed-{partition}", partition=partition,
                   messages=[PublishMessage(f"k{partition}-{i}", {}, f"payment {partition}-{i}".encode(), i)
                             for i in range(PER_PARTITION)])


async def _depth_is(target: SecurityGroup, n: int) -> bool:
    return await target.depth() == n
