"""Dead-lettering writes to another queue, so it needs the declaring user's ``produce``
there (broker.security.acl): checked when the queue is declared and again when a message is
dead-lettered; the ``tandem.*`` names are the node's own.

The attack these tests play: a user with configure/produce/consume on ``sandbox.*`` only
declares ``sandbox.trap`` with ``dead_letter_queue=payments``, publishes and rejects, and her
message (with her headers) lands in ``payments``."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import msgpack
import pytest

import client
from broker.security.acl import AclTable, validate_grant
from broker.messaging.catalogue import Catalogue
from broker.messaging.commit import LocalCommitPath
from broker.messaging.delivery import Delivery
from broker.messaging.forward import DeclareFwd, decode_request, refused_as_longer
from broker.node.node import Node
from broker.messaging.message import EMPTY_HEADERS, Msg
from broker.messaging.queues import Consumer, Queue
from broker.security.users import UserRegistry, make_user
from client.errors import AccessRefusedError, InvalidArgumentError
from storage.base import Append, DurabilityPolicy, PutUser, QueueMeta, Settle, UserRecord
from tests.conftest import url_of


def user(name: str, role: str = "user") -> UserRecord:
    return UserRecord(name=name, salt=b"", hash=b"", role=role, params="")


ALICE, ROOT = user("alice"), user("root", "admin")
SANDBOX = AclTable([validate_grant("alice", "sandbox.*", "configure,produce,consume")])


# -- at declare ---------------------------------------------------------------------------------------


def test_a_dead_letter_queue_the_user_may_not_write_is_refused_at_declare() -> None:
    with pytest.raises(AccessRefusedError) as err:
        SANDBOX.check_declare(ALICE, "sandbox.trap", "payments")
    for word in ("'alice'", "'produce'", "'payments'", "sandbox.trap"):
        assert word in err.value.message, err.value.message
    SANDBOX.check_declare(ALICE, "sandbox.trap", "sandbox.dead")  # hers: fine
    SANDBOX.check_declare(ALICE, "sandbox.trap", None)
    SANDBOX.check_declare(ROOT, "orders", "payments")  # an admin may write everywhere


@pytest.mark.parametrize(("queue", "dlq"), [("tandem.x", None), ("tandem.quarantine", None),
                                            ("sandbox.trap", "tandem.quarantine"), ("orders", "tandem.x")])
def test_the_node_namespace_is_refused_to_every_client_admin_included(queue: str, dlq: str | None) -> None:
    acls = AclTable([validate_grant("alice", "*", "configure,produce,consume")])
    for who in (ALICE, ROOT):
        with pytest.raises(AccessRefusedError, match=r"tandem\.\* are reserved for the node"):
            acls.check_declare(who, queue, dlq)
    acls.check_declare(ROOT, "tandemx", "tandem")  # (only the prefix "tandem." is the node's)


def test_at_dead_letter_time_the_owner_must_exist_and_hold_produce_on_the_target() -> None:
    users = UserRegistry([ALICE])
    assert SANDBOX.dead_letter_refusal(users, "alice", "sandbox.dead") is None
    assert SANDBOX.dead_letter_refusal(users, "alice", "payments") == \
        "not permitted: user 'alice' has no 'produce' on payments"
    assert SANDBOX.dead_letter_refusal(users, "gone", "sandbox.dead") == \
        "not permitted: user 'gone', who declared the queue, no longer exists"
    # a queue without an owner (the node's own, or stored by a build without owners): as
    # before, but never into the node's namespace
    assert SANDBOX.dead_letter_refusal(users, None, "payments") is None
    assert "reserved for the node" in (SANDBOX.dead_letter_refusal(users, None, "tandem.quarantine") or "")
    assert SANDBOX.dead_letter_refusal(UserRegistry([ROOT]), "root", "tandem.quarantine") is not None


# -- when dead-lettering (broker.messaging.delivery) -----------------------------------------------------------


def _meta(qid: int, name: str, dlq: str | None = None, owner: str | None = None) -> QueueMeta:
    return QueueMeta(id=qid, name=name, partitions=1, mapper="round_robin", ring_size=1, max_deliveries=0,
                     dead_letter_queue=dlq, max_length=0, owner=owner)


class _Host:
    """What Delivery uses of its node when it dead-letters on a single node."""

    def __init__(self, acls: AclTable, users: UserRegistry, *queues: Queue) -> None:
        self.acls, self.users = acls, users
        self.queues = {q.name: q for q in queues}
        self.commit = LocalCommitPath(None, "node1", policy=DurabilityPolicy.SYNC)  # type: ignore[arg-type]
        self.writes: list[Any] = []

    def serves(self, q: Queue, pidx: int) -> bool:
        return True

    def write_later(self, ops: list[Any], callback: Any = None, *, lazy: bool = True) -> None:
        self.writes.extend(ops)


def _reject_one(host: _Host, src: Queue) -> Msg:
    m = Msg(0, 0, "k", {"x-mine": "forged"}, EMPTY_HEADERS, b"body", None, None, 0.0, dc=1)
    c = Consumer(1, src, SimpleNamespace(), 10)  # type: ignore[arg-type]
    c.unacked = 1
    src.unacked_count = 1
    Delivery(host, host, None).dead_letter([(c, m)], "rejected")  # type: ignore[arg-type]
    return m


def test_a_message_is_dead_lettered_while_the_owner_may_write_there() -> None:
    acls = AclTable([validate_grant("alice", "src", "configure,produce,consume"),
                     validate_grant("alice", "dst", "produce")])
    src, dst = Queue(_meta(1, "src", "dst", "alice")), Queue(_meta(2, "dst"))
    host = _Host(acls, UserRegistry([ALICE]), src, dst)
    _reject_one(host, src)
    assert dst.ready_count == 1 and [type(op) for op in host.writes] == [Settle, Append]


@pytest.mark.parametrize("lost", ["grant", "user"])
def test_when_the_owner_lost_produce_on_the_target_the_message_is_dropped_with_a_warning(
        lost: str, caplog: pytest.LogCaptureFixture) -> None:
    acls = AclTable([validate_grant("alice", "src", "configure,produce,consume"),
                     validate_grant("alice", "dst", "produce")])
    users = UserRegistry([ALICE])
    if lost == "grant":
        acls.revoke(validate_grant("alice", "dst", "produce"))
    else:
        users.drop("alice")
        acls.drop_user("alice")
    src, dst = Queue(_meta(1, "src", "dst", "alice")), Queue(_meta(2, "dst"))
    host = _Host(acls, users, src, dst)
    with caplog.at_level(logging.WARNING, logger="tandem.broker"):
        m = _reject_one(host, src)
    assert dst.ready_count == 0 and dst.published == 0
    # handled as a message whose dead-letter queue is missing: settled, not appended anywhere
    assert host.writes == [Settle(1, 0, [0])]
    [rec] = [r for r in caplog.records if "dropped message" in r.getMessage()]
    why = "has no 'produce' on dst" if lost == "grant" else "no longer exists"
    for word in ("dead-letter queue dst", "not permitted", "'alice'", why, "queue=src", f"id={m.id}",
                 "reason=rejected"):
        assert word in rec.getMessage(), rec.getMessage()


def test_a_queue_without_an_owner_dead_letters_as_before_but_never_into_the_node_namespace() -> None:
    src, dst = Queue(_meta(1, "src", "dst")), Queue(_meta(2, "dst"))
    host = _Host(AclTable(), UserRegistry([]), src, dst)
    _reject_one(host, src)
    assert dst.ready_count == 1
    src, quarantine = Queue(_meta(3, "old", "tandem.quarantine")), Queue(_meta(4, "tandem.quarantine"))
    host = _Host(AclTable(), UserRegistry([]), src, quarantine)
    _reject_one(host, src)
    assert quarantine.ready_count == 0 and host.writes == [Settle(3, 0, [0])]


# -- the owner travels with a forwarded declare ---------------------------------------------------------


def test_a_forwarded_declare_carries_its_owner_and_an_older_builds_form_reads_as_none() -> None:
    new = DeclareFwd(1, b"frame", "alice")
    assert decode_request(int(new.KIND), new.pack()) == new
    old = DeclareFwd(1, b"frame")  # (what the node's own declares send: the form older builds read)
    assert old.pack() == DeclareFwd(1, b"frame", "").pack() and len(msgpack.unpackb(old.pack())) == 2
    assert decode_request(int(old.KIND), old.pack()) == DeclareFwd(1, b"frame", "")
    # an older build refuses the third field thus; the sender asks again without it
    assert refused_as_longer(InvalidArgumentError("forwarded DECLARE: expected 2 fields"), new)
    assert not refused_as_longer(InvalidArgumentError("forwarded DECLARE: expected 3 fields"), new)


class _Forwarder:
    """A catalogue on a member whose catalogue's active runs an older build."""

    def __init__(self) -> None:
        self.config = SimpleNamespace(max_memory=0)
        self.sent: list[DeclareFwd] = []

    async def forward(self, who: str, req: DeclareFwd) -> bytes:
        self.sent.append(req)
        if req.owner:
            raise InvalidArgumentError("forwarded DECLARE: expected 2 fields")
        return b"\xc3"


@pytest.mark.asyncio
async def test_a_declare_forwarded_to_an_older_active_goes_again_without_its_owner() -> None:
    host = _Forwarder()
    cat = Catalogue(host)  # type: ignore[arg-type]
    req = DeclareFwd(1, b"frame", "alice")
    assert await cat._forward("node2", req, "q") == b"\xc3"
    assert host.sent == [req, DeclareFwd(1, b"frame")]


# -- through a client session (a node in this process) ---------------------------------------------------


async def _user(node: Node, name: str, *grants: tuple[str, str]) -> str:
    u = make_user(name, f"{name}-password", "user", iterations=4096)
    await node.store.write([PutUser(u)], sync=True)
    node.services.users.put(u)
    for pattern, perms in grants:
        node.services.acls.grant(validate_grant(name, pattern, perms))
    return url_of(node, user=name, password=f"{name}-password")


@pytest.mark.asyncio
async def test_a_session_refuses_the_trap_and_the_owner_is_the_user_who_declared(node: Node) -> None:
    alice = await _user(node, "alice", ("sandbox.*", "configure,produce,consume"))
    async with await client.connect(url_of(node)) as admin:
        await admin.declare_queue("payments")
    async with await client.connect_link(alice) as conn:
        with pytest.raises(AccessRefusedError, match="'alice'.*'produce'.*'payments'"):
            await conn.declare_queue("sandbox.trap", dead_letter_queue="payments")
        with pytest.raises(AccessRefusedError, match="reserved for the node"):
            await conn.declare_queue("sandbox.trap", dead_letter_queue="tandem.quarantine")
        async with await client.connect_link(url_of(node)) as admin_link:  # (an admin: configure everywhere)
            with pytest.raises(AccessRefusedError, match="reserved for the node"):
                await admin_link.declare_queue("tandem.x")
            with pytest.raises(AccessRefusedError, match="reserved for the node"):
                await admin_link.declare_queue("orders", dead_letter_queue="tandem.quarantine")
        assert not {"sandbox.trap", "tandem.x", "orders"} & set(node.catalogue.queues)
        await conn.declare_queue("sandbox.dead")
        await conn.declare_queue("sandbox.trap", dead_letter_queue="sandbox.dead")
    assert node.catalogue.queues["sandbox.trap"].meta.owner == "alice"
    async with await client.connect(url_of(node)) as admin:  # a redeclare keeps the first owner
        await admin.declare_queue("sandbox.trap", dead_letter_queue="sandbox.dead")
    assert node.catalogue.queues["sandbox.trap"].meta.owner == "alice"


@pytest.mark.asyncio
async def test_revoking_the_owners_produce_stops_dead_lettering_into_the_target(
        node: Node, caplog: pytest.LogCaptureFixture) -> None:
    alice = await _user(node, "alice", ("src", "configure,produce,consume"), ("dst", "configure,produce,consume"))
    async with await client.connect_link(alice) as conn:
        await conn.declare_queue("dst")
        await conn.declare_queue("src", dead_letter_queue="dst")
        async with conn.producer("src") as p:
            await p.send(b"first", key="k")
        m = await conn.get("src")
        assert m is not None
        await m.reject()
        dead = await conn.get("dst", auto_ack=True)
        assert dead is not None and dead.body == b"first"
        node.services.acls.revoke(validate_grant("alice", "dst", "produce"))  # (as an admin's revoke applies it)
        async with conn.producer("src") as p:
            await p.send(b"second", key="k", headers={"x-forged": "yes"})
        m = await conn.get("src")
        assert m is not None
        with caplog.at_level(logging.WARNING, logger="tandem.broker"):
            await m.reject()
            assert await conn.get("src") is None
    assert node.catalogue.queues["dst"].depth == 0
    assert any("not permitted: user 'alice' has no 'produce' on dst" in r.getMessage() for r in caplog.records)
