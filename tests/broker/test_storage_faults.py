"""A single node (no group to repair from) whose store took damage at rest: it finds the damaged
chunk or row, says where in one line, and does not start; it never serves what failed its check."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import client
from broker.config import NodeConfig
from broker.node.node import Node
from client.errors import StorageError
from tests.conftest import url_of
from tests.storage.test_recovery import flip_stored_bit

pytestmark = pytest.mark.asyncio


async def test_a_single_node_with_a_flipped_bit_in_a_stored_body_does_not_start(tmp_path: Path) -> None:
    n = Node(NodeConfig(data_dir=tmp_path / "node1", port=0))
    await n.start()
    try:
        async with await client.connect(url_of(n)) as conn:
            await conn.declare_queue("q")
            p = conn.producer("q")
            for i in range(3):  # (three batches: three chunks)
                await p.send(f"message {i}".encode() * 50)
        qid = n.catalogue.queues["q"].meta.id
    finally:
        await n.stop()
    start = flip_stored_bit(tmp_path / "node1" / "tandem.db", qid, 0)
    again = Node(NodeConfig(data_dir=tmp_path / "node1", port=0))
    with pytest.raises(StorageError) as err:
        await again.start()
    await again.stop()
    text = err.value.message
    assert f"tandem.db: the chunk of partition {qid}/0 from offset {start} (" in text, text
    assert "fails its checksum: damaged at rest" in text and "this node does not start" in text, text


async def test_a_single_node_with_a_flipped_bit_in_a_queues_row_does_not_start(tmp_path: Path) -> None:
    n = Node(NodeConfig(data_dir=tmp_path / "node1", port=0))
    await n.start()
    try:
        async with await client.connect_link(url_of(n)) as conn:
            await conn.finalize_upgrade()  # (to the build's level: rows carry checksums)
            await conn.declare_queue("q", max_length=100)
    finally:
        await n.stop()
    db = sqlite3.connect(tmp_path / "node1" / "tandem.db")
    db.execute("UPDATE queues SET max_length = 36 WHERE name = 'q'")  # (100 with bit 6 flipped)
    db.commit()
    db.close()
    again = Node(NodeConfig(data_dir=tmp_path / "node1", port=0))
    with pytest.raises(StorageError) as err:
        await again.start()
    await again.stop()
    text = err.value.message
    assert "tandem.db: a row of queues (queue 'q' (id " in text and "fails its checksum (crc)" in text, text
    assert "this node does not start (the group cannot repair a catalogue row" in text, text


@pytest.mark.parametrize(("flip", "named"), [
    # (bit 2 of a partition's end flipped; bit 3 of the highest queue id)
    ("UPDATE partitions SET next_offset = (next_offset | 4) - (next_offset & 4)",
     "a row of partitions (partition {qid}/0)"),
    ("UPDATE meta SET value = CAST((CAST(value AS INTEGER) | 8) - (CAST(value AS INTEGER) & 8) AS TEXT) "
     "WHERE key = 'queue_id_hwm'", "a row of meta (key 'queue_id_hwm')"),
])
async def test_a_single_node_with_a_flipped_bit_in_a_partitions_or_meta_row_does_not_start(
        tmp_path: Path, flip: str, named: str) -> None:
    """Those rows carry checksums at any feature level (no finalize here)."""
    n = Node(NodeConfig(data_dir=tmp_path / "node1", port=0))
    await n.start()
    try:
        async with await client.connect(url_of(n)) as conn:
            await conn.declare_queue("q")
            await conn.producer("q").send(b"one")
        qid = n.catalogue.queues["q"].meta.id
    finally:
        await n.stop()
    db = sqlite3.connect(tmp_path / "node1" / "tandem.db")
    for table in ("partitions", "meta"):  # (at rest, not as an older build's update: storage.sqlite.schema.TRIGGERS)
        db.execute(f"DROP TRIGGER {table}_unsummed")
    assert db.execute(flip).rowcount >= 1
    db.commit()
    db.close()
    again = Node(NodeConfig(data_dir=tmp_path / "node1", port=0))
    with pytest.raises(StorageError) as err:
        await again.start()
    await again.stop()
    text = err.value.message
    assert f"tandem.db: {named.format(qid=qid)}" in text and "fails its checksum (crc)" in text, text
    assert "this node does not start" in text, text

