"""The blocking client against a node process (it must work without an event loop)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.process import NodeProcess
from client import blocking
from client.errors import AuthError, QueueNotFoundError

pytestmark = pytest.mark.integration


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    loop = asyncio.new_event_loop()
    proc = NodeProcess(tmp_path / "node1")
    loop.run_until_complete(proc.start())
    try:
        yield proc.url
    finally:
        loop.run_until_complete(proc.stop())
        loop.close()


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
        msgs, nxt, end = conn.read("q", 0)
        assert [m.body for m in msgs] == [b"five"] and nxt == end == msgs[0].offset + 1
        assert conn.get("q", auto_ack=True) is not None
        (info,) = conn.list_queues()
        assert info.name == "q" and info.ready == 0
        with pytest.raises(QueueNotFoundError):
            conn.producer("nope").send(b"x")


def test_blocking_wrong_password(url: str) -> None:
    with pytest.raises(AuthError):
        blocking.connect(url.replace("bench-password", "wrong-one"))
