"""A single node (no group to repair from) whose store took damage at rest, or whose disk cannot
read part of it: it finds the damaged chunk or row, or the page it cannot read, says where in one
line, and does not start; it never serves what failed its check."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

import client
from broker.config import NodeConfig
from broker.node.node import Node
from broker.tools.powerfs import PowerFS
from broker.tools.powerfs_mount import fuse_missing
from client.errors import StorageError, TandemError
from tests.conftest import url_of
from tests.helpers import tandem
from tests.storage.test_recovery import break_index_page, flip_stored_bit

pytestmark = pytest.mark.asyncio


async def refused_start(cfg: NodeConfig) -> str:
    """What a node on ``cfg`` says as it refuses to start (StorageError)."""
    again = Node(cfg)
    with pytest.raises(StorageError) as err:
        await again.start()
    await again.stop()
    return err.value.message


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
    text = await refused_start(NodeConfig(data_dir=tmp_path / "node1", port=0))
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
    text = await refused_start(NodeConfig(data_dir=tmp_path / "node1", port=0))
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
    text = await refused_start(NodeConfig(data_dir=tmp_path / "node1", port=0))
    assert f"tandem.db: {named.format(qid=qid)}" in text and "fails its checksum (crc)" in text, text
    assert "this node does not start" in text, text


@pytest.mark.skipif(fuse_missing() is not None, reason=f"powerfs cannot run here: {fuse_missing()}")
async def test_a_single_node_whose_disk_cannot_read_a_page_of_its_store_does_not_start(tmp_path: Path) -> None:
    """A latent sector error (powerfs's bad-sector) in the store, found at start: one line naming
    the store, what to do, and no start; ``tandem scrub`` names the page it cannot read."""
    async with PowerFS(tmp_path / "backing", tmp_path / "disk") as fs:
        data = tmp_path / "disk" / "node1"
        n = Node(NodeConfig(data_dir=data, port=0))
        await n.start()
        try:
            async with await client.connect(url_of(n)) as conn:
                await conn.declare_queue("q")
                p = conn.producer("q")
                for i in range(100):
                    await p.send(f"message {i}".encode() * 30)
        finally:
            await n.stop()
        bad = fs.bad_sector("tandem.db", 3)
        assert bad["offset"] >= 4096, bad  # (past the header page, among the rows: what the seed gives here)
        text = await refused_start(NodeConfig(data_dir=data, port=0))
        assert "\n" not in text and f"cannot open store {data / 'tandem.db'}: DatabaseError: " in text, text
        assert "the disk gave back damaged or unreadable pages" in text and "this node does not start" in text, text
        code, out, err = await tandem("scrub", "--data-dir", str(data))
        assert code == 1 and "unable to get the page" in out, (code, out, err)
        assert fs.stats()["failed_reads"] > 0


async def test_a_chunk_damaged_while_the_node_runs_is_never_delivered_and_stops_it(tmp_path: Path) -> None:
    """A bit flipped in a chunk of the cold part of a backlog (read back from the store as the
    consumers reach it) while the node runs: the read fails its checksum, the node stops (in a
    group its replicas elect another active, which serves its own good copy) and says why in one
    line; no consumer gets the damaged body, and the restart names the chunk."""
    cfg = NodeConfig(data_dir=tmp_path / "node1", port=0, max_memory=1024 * 1024)
    n = Node(cfg)
    await n.start()
    sent = [f"{i:05d} ".encode() * 170 for i in range(3000)]  # (about 3 MiB: most of it cold)
    got: list[bytes] = []
    try:
        async with await client.connect(url_of(n)) as conn:
            await conn.declare_queue("q")
            p = conn.producer("q")
            for i in range(0, len(sent), 100):
                await asyncio.gather(*(p.send(b) for b in sent[i:i + 100]))
        qid = n.catalogue.queues["q"].meta.id
        assert n.catalogue.queues["q"].cold_count > 0
        start = flip_stored_bit(tmp_path / "node1" / "tandem.db", qid, 0, last=True)  # (the newest chunk: cold)

        async def consume() -> None:
            async with await client.connect_link(url_of(n)) as conn:  # (one link: the stop ends it)
                async for m in conn.consumer("q", prefetch=200):
                    got.append(m.body)
                    await m.ack()

        with pytest.raises(TandemError):  # (the node stopping under it; a node that went on would time out)
            await asyncio.wait_for(consume(), 60)
        await asyncio.wait_for(n.stopped.wait(), 30)
    finally:
        await n.stop()
    assert got and set(got) <= set(sent) and len(got) < len(sent), len(got)
    message = await refused_start(NodeConfig(data_dir=tmp_path / "node1", port=0, max_memory=1024 * 1024))
    assert f"the chunk of partition {qid}/0 from offset {start} (" in message, message


async def test_a_write_the_damaged_store_refuses_stops_the_node(tmp_path: Path) -> None:
    """A page of the store that SQLite finds malformed on a write (here the index of the producers'
    positions, which opening does not read): the write is not retried, the node stops and says so
    in one line; the publish it was for is not confirmed."""
    n = Node(NodeConfig(data_dir=tmp_path / "node1", port=0))
    await n.start()
    try:
        async with await client.connect(url_of(n)) as conn:
            await conn.declare_queue("q")
            await conn.producer("q", producer_id="p1").send(b"one")
    finally:
        await n.stop()
    break_index_page(tmp_path / "node1" / "tandem.db", "sqlite_autoindex_producers_1")
    again = Node(NodeConfig(data_dir=tmp_path / "node1", port=0))
    await again.start()
    try:
        async with await client.connect_link(url_of(again)) as conn:
            send = asyncio.ensure_future(conn.producer("q", producer_id="p1").send(b"two"))
            await asyncio.wait_for(again.stopped.wait(), 30)
            with pytest.raises(TandemError):  # (refused, or its link closed by the stop: never confirmed)
                await asyncio.wait_for(send, 30)
    finally:
        await again.stop()
    # started again, it checks every page first and refuses in one line (no start to stop again)
    message = await refused_start(NodeConfig(data_dir=tmp_path / "node1", port=0))
    assert message.startswith(f"the store {tmp_path / 'node1' / 'tandem.db'} was found damaged when this node "
                              f"stopped (a write to the store failed ("), message
    assert "quick_check finds it damaged still (" in message and "this node does not start" in message, message
    assert (tmp_path / "node1" / "tandem.db-damaged").exists()  # (until a start finds the store whole)


async def test_a_store_whole_again_after_a_failed_write_starts_and_forgets_the_note(tmp_path: Path) -> None:
    """A node stopped on a write its disk failed (noted beside the store) whose store reads whole
    at the next start: it starts, says so, and the note goes."""
    n = Node(NodeConfig(data_dir=tmp_path / "node1", port=0))
    await n.start()
    try:
        async with await client.connect(url_of(n)) as conn:
            await conn.declare_queue("q")
            await conn.producer("q").send(b"one")
        n.store.damaged("a write to the store failed (write failed: OperationalError: disk I/O error)")
        await asyncio.wait_for(n.stopped.wait(), 30)
    finally:
        await n.stop()
    assert (tmp_path / "node1" / "tandem.db-damaged").exists()
    again = Node(NodeConfig(data_dir=tmp_path / "node1", port=0))
    await again.start()
    try:
        assert not (tmp_path / "node1" / "tandem.db-damaged").exists()
        async with await client.connect(url_of(again)) as conn:
            async with conn.consumer("q") as cons:
                m = await cons.next(10)
                assert m is not None and m.body == b"one"
    finally:
        await again.stop()
