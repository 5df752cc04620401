"""The durable connection's local send buffer (SQLite), by itself and in a producer."""

from __future__ import annotations

from pathlib import Path

import pytest

import client
from broker.config import NodeConfig
from broker.node.node import Node
from client.buffer import SendBuffer
from client.errors import BufferFull
from tests.conftest import url_of


def test_rows_keep_order_numbering_and_survive_reopening(tmp_path: Path) -> None:
    path = tmp_path / "buf.db"
    b = SendBuffer(path, "p1", "q", 1 << 20)
    ids = [b.append(f"k{i}", {"h": str(i)}, f"m{i}".encode()) for i in range(5)]
    other = SendBuffer(path, "p2", "q", 1 << 20)  # another producer's rows are its own
    other.append(None, {}, b"theirs")
    b.assign([(ids[0], 3, 7), (ids[1], 3, 8)])
    b.remove([ids[0]])
    b.close()
    other.close()
    again = SendBuffer(path, "p1", "q", 1 << 20)
    rows = again.load()
    assert [r.body for r in rows] == [b"m1", b"m2", b"m3", b"m4"]
    assert (rows[0].partition, rows[0].seq) == (3, 8)
    assert rows[1].partition is None and rows[1].seq is None
    assert rows[3].headers == {"h": "4"} and rows[3].key == "k4"
    assert again.count == 4
    again.close()


def test_the_buffer_is_bounded(tmp_path: Path) -> None:
    b = SendBuffer(tmp_path / "buf.db", "p", "q", 1000)
    b.append(None, {}, b"x" * 800)
    with pytest.raises(BufferFull, match="buffer_max_bytes=1000"):
        b.append(None, {}, b"x" * 300)
    b.remove([1])
    b.append(None, {}, b"x" * 300)  # room again
    b.close()


@pytest.mark.asyncio
async def test_sends_while_no_node_answers_are_buffered_then_drained_in_order(tmp_path: Path) -> None:
    node = Node(NodeConfig(data_dir=tmp_path / "n", port=0))
    await node.start()
    port = node.address[1]
    url = url_of(node)
    async with await client.connect(url) as admin:
        await admin.declare_queue("q", partitions=2)
    await node.stop()
    kinds: list[str] = []
    conn = await client.connect(url, buffer_path=str(tmp_path / "buffer.db"), buffer_max_bytes=1 << 20)
    conn.on_event(lambda e: kinds.append(e.kind))
    try:
        p = conn.producer("q", producer_id="app-1")
        results = [await p.send(f"m{i}", key=f"k{i % 3}") for i in range(50)]
        assert all(r.buffered for r in results) and p.buffered_count == 50
        with pytest.raises(BufferFull):
            await p.send(b"x" * (1 << 20))
        node = Node(NodeConfig(data_dir=tmp_path / "n", port=port))
        await node.start()
        await p.wait_drained(timeout=30)
        assert p.buffered_count == 0
        assert "buffering" in kinds and "drained" in kinds
        q = node.catalogue.queues["q"]
        for part in q.partitions:  # in send order within each partition
            got = [int(m.body[1:]) for m in part.ready]
            assert got == sorted(got)
        assert sorted(int(m.body[1:]) for part in q.partitions for m in part.ready) == list(range(50))
    finally:
        await conn.close()
        await node.stop()
