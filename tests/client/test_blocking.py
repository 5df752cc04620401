"""The blocking client against a node process (it must work without an event loop)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.tools.process import NodeProcess
from client import blocking
from client.mapper import make_mapper
from client.protocol.frames import PublishMessage
from client.errors import AccessRefusedError, AuthError, InvalidArgumentError, QueueNotFoundError, StaleDeliveryError

pytestmark = pytest.mark.integration


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[NodeProcess, asyncio.AbstractEventLoop]]:
    loop = asyncio.new_event_loop()
    proc = NodeProcess(tmp_path / "node1")
    loop.run_until_complete(proc.start())
    try:
        yield proc, loop
    finally:
        loop.run_until_complete(proc.stop())
        loop.close()


@pytest.fixture
def url(node: tuple[NodeProcess, asyncio.AbstractEventLoop]) -> str:
    return node[0].url


def test_blocking_round_trip(url: str) -> None:
    with blocking.connect(url) as conn:
        conn.declare_queue("q", partitions=2)
        p = conn.producer("q")
        p.send(b"one", key="k", headers={"h": "v"})
        assert p.send_many([b"two", b"three"]) == 2
        c = conn.consumer("q", prefetch=10)
        got = []
        for m in c:
            got.append(m.body)
            m.ack()
            if len(got) == 3:
                break
        assert sorted(got) == [b"one", b"three", b"two"]
        c.cancel()
        p.send(b"four")
        m = conn.get("q")
        assert m is not None and m.body == b"four"
        m.nack(requeue=True)
        m = conn.get("q", auto_ack=True)
        assert m is not None and m.redelivered and m.delivery_count == 2
        conn.producer("q").send(b"five", key="k")
        msgs, nxt, end = conn.read("q", make_mapper("jump_hash", 2, 1024).partition("k"))
        assert [m.body for m in msgs] == [b"five"] and nxt == end == msgs[0].offset + 1
        assert conn.get("q", auto_ack=True) is not None
        (info,) = conn.list_queues()
        assert info.name == "q" and info.ready == 0
        with pytest.raises(QueueNotFoundError):
            conn.producer("nope").send(b"x")


def test_blocking_wrong_password(url: str) -> None:
    with pytest.raises(AuthError):
        blocking.connect(url.replace("bench-password", "wrong-one"))


def test_blocking_connection_rides_through_a_node_restart(node: tuple[NodeProcess, asyncio.AbstractEventLoop]) -> None:
    proc, loop = node
    with blocking.connect(proc.url, send_timeout=60) as conn:
        conn.declare_queue("q", partitions=2)
        p = conn.producer("q")
        for i in range(20):
            p.send(f"m{i}", key=f"k{i}")
        c = conn.consumer("q", prefetch=5)
        held = [c.next(), c.next()]
        loop.run_until_complete(proc.kill())  # kill -9: the next calls find the link dead
        restart = threading.Thread(target=loop.run_until_complete, args=(proc.start(),))
        restart.start()  # the node comes back while the sends below are retrying
        try:
            for i in range(20, 40):
                p.send(f"m{i}", key=f"k{i}")
        finally:
            restart.join()
        for m in held:
            with pytest.raises(StaleDeliveryError):
                m.ack()
        got = []
        while len(got) < 40:
            m = c.next()  # resubscribed on the new link: what was held comes again
            got.append(m.body.decode())
            m.ack()
        assert sorted(got) == sorted(f"m{i}" for i in range(40))  # each once
        (info,) = conn.list_queues()
        assert info.ready == 0 and info.unacked == 0


def test_a_producer_id_used_again_is_not_taken_for_resends(url: str) -> None:
    """A restarted process with the same producer id: its new messages are stored, not
    dropped as duplicates of the first process's."""
    with blocking.connect(url) as conn:
        conn.declare_queue("q")
        conn.producer("q", producer_id="app-1").send_many([b"a", b"b"])
    with blocking.connect(url) as conn:
        conn.producer("q", producer_id="app-1").send_many([b"c", b"d"])
        (info,) = conn.list_queues()
        assert info.ready == 4


def test_a_keyless_batch_sent_again_lands_where_it_did_and_is_stored_once(url: str) -> None:
    """A resend after a failover meets a node whose round-robin turn differs from the first
    node's: the node places a producer's keyless messages by (producer id, seq), so each
    repeat lands in the partition that has it and is taken as a repeat."""
    batch = [PublishMessage(None, {}, f"m{i}".encode(), i) for i in range(3)]
    with blocking.connect(url) as conn:
        conn.declare_queue("q", partitions=3)
        assert conn.publish("q", batch, producer_id="p").duplicates == 0
        conn.producer("q").send(b"other")  # moves the queue's round-robin turn on
        conn.publish("q", [PublishMessage(None, {}, b"x", None)], producer_id=None)
        again = conn.publish("q", batch, producer_id="p")
        assert again.duplicates == 3
        (info,) = conn.list_queues()
        assert info.ready == 5
        parts: dict[bytes, int] = {}
        c = conn.consumer("q", prefetch=10)
        for _ in range(5):
            m = c.next()
            parts[m.body] = m.partition
            m.ack()
        assert sorted(parts[f"m{i}".encode()] for i in range(3)) == [0, 1, 2]


def test_blocking_sends_buffer_while_no_node_answers_and_drain_in_order(
        node: tuple[NodeProcess, asyncio.AbstractEventLoop], tmp_path: Path) -> None:
    proc, loop = node
    url = proc.url
    with blocking.connect(url) as conn:
        conn.declare_queue("q")
    loop.run_until_complete(proc.stop())
    buffer = str(tmp_path / "sends.db")
    with blocking.connect(url, buffer_path=buffer) as conn:  # no node: it connects all the same
        p = conn.producer("q", producer_id="app-1")
        assert all(p.send(f"m{i}") == -1 for i in range(30))  # buffered
        assert p.buffered_count == 30
    loop.run_until_complete(proc.start())
    with blocking.connect(url, buffer_path=buffer) as conn:  # a new process, the same id and file
        p = conn.producer("q", producer_id="app-1")
        assert p.send("after") >= 0  # the buffer drains first, then this one
        assert p.buffered_count == 0
        got = []
        c = conn.consumer("q", prefetch=50)
        while len(got) < 31:
            m = c.next()
            got.append(m.body.decode())
            m.ack()
        assert got == [f"m{i}" for i in range(30)] + ["after"]  # once each, in order
        (info,) = conn.list_queues()
        assert info.ready == 0 and info.unacked == 0


def test_blocking_users_and_grants(url: str) -> None:
    """The blocking client manages users and grants as the async one does; the grant holds."""
    with blocking.connect(url) as admin:
        admin.declare_queue("orders.eu")
        admin.declare_queue("payments")
        admin.create_user("bob", "bob-password-1")
        admin.grant("bob", "orders.*", ["produce", "consume"])
        assert ("bob", "user") in [(u.name, u.role) for u in admin.list_users()]
        assert [(a.pattern, sorted(a.permissions)) for a in admin.list_acls("bob")] == \
            [("orders.*", ["consume", "produce"])]
        with pytest.raises(InvalidArgumentError, match="'bob' exists"):
            admin.create_user("bob", "another-password")
    bob_url = "tandem://bob:bob-password-1@" + url.split("@", 1)[1]
    with blocking.connect(bob_url, durable=False) as bob:
        bob.producer("orders.eu").send(b"order")
        with pytest.raises(AccessRefusedError, match="'produce'.*'payments'"):
            bob.producer("payments").send(b"payment")
    with blocking.connect(url) as admin:
        admin.revoke("bob", "orders.*", ["produce"])
        admin.change_password("bob", "bob-password-2")
        assert [sorted(a.permissions) for a in admin.list_acls("bob")] == [["consume"]]
        admin.delete_user("bob")
        assert "bob" not in [u.name for u in admin.list_users()]
