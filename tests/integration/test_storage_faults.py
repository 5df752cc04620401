"""Storage faults a member's files take at rest, repaired from the group: a bit flipped in the
middle of a replica's replication log (storage.segments) is told from a torn tail, the segments
go aside, and the member catches up from the active; two members' logs damaged at different
records leave the group serving (each keeps the partitions its damage cannot have touched); a
damaged stored copy is rebuilt from the active.  The stores then hold every confirmed message,
byte for byte.  Real processes and files."""

from __future__ import annotations

import asyncio
import sqlite3
import struct
from pathlib import Path
from typing import Any

import msgpack
import pytest

import client
from client.errors import ConnectionClosedError, NotActiveError
from broker.tools.cluster import LocalCluster
from broker.tools.process import NodeStartError
from storage.segfiles import records as segment_records
from storage.sqlite import SqliteEngine
from tests.conftest import FAST
from tests.helpers import tandem, wait_until
from tests.integration.test_replication import produce
from tests.storage.test_applied_digest import put_back, rows_of
from tests.storage.test_recovery import flip_stored_bit

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.timeout(240)]


def records(seg: Path) -> list[tuple[int, int]]:
    """(start, length of the payload) of each record of a segment."""
    data, pos, out = seg.read_bytes(), 0, []
    while pos + 8 <= len(data):
        length, _crc = struct.unpack_from("<II", data, pos)
        out.append((pos, length))
        pos += 8 + length
    return out


async def caught_up(cl: LocalCluster, node: str, queue: str) -> bool:
    """``node`` follows the queue's active and has its commit index (a member added back on
    an empty directory refuses clients while it replays its own removal from the catalogue)."""
    active = (await cl.actives(queue))[0]
    try:
        mine = [p for p in (await cl.status(node)).partitions if p.queue == queue]
    except (NotActiveError, ConnectionClosedError):  # (said at login, or as a refusal after it)
        return False
    theirs = [p for p in (await cl.status(active)).partitions if p.queue == queue]
    return bool(mine and theirs) and mine[0].active == active and mine[0].commit >= theirs[0].commit


async def started_with_q(cl: LocalCluster) -> str:
    """Start ``cl`` at the newest feature level (as tandem cluster up does: the store's rows
    carry checksums) and declare queue ``q`` (one partition): its active."""
    await cl.start()
    await cl.wait_ready()
    await cl.finalize()
    async with await client.connect(cl.url) as conn:
        await conn.declare_queue("q", partitions=1)
    await wait_until(lambda: _one_active(cl, "q"), timeout=30, what="an active for q")
    return (await cl.actives("q"))[0]


async def _replica_of_q(cl: LocalCluster) -> tuple[str, str, Path]:
    """Start ``cl`` with queue ``q`` (:func:`started_with_q`): its active, a replica and the
    replica's store."""
    old = await started_with_q(cl)
    replica = next(n for n in cl.nodes if n != old)
    return old, replica, cl.nodes[replica].data_dir / "tandem.db"


async def stopped_replica(cl: LocalCluster) -> tuple[str, str, list[bytes]]:
    """Start ``cl``, fill queue ``q`` (one partition) with 96 confirmed messages, and stop a
    replica cleanly once it has every entry: (the active, the replica, the confirmed bodies)."""
    old, replica, _db = await _replica_of_q(cl)
    bodies = [f"message {i} ".encode() * 20 for i in range(96)]
    confirmed: list[bytes] = []
    await produce(cl.url_of(old), "q", bodies, confirmed, [])
    assert len(confirmed) == 96
    await wait_until(lambda: caught_up(cl, replica, "q"), timeout=30, what=f"{replica} to have every entry")
    await cl.nodes[replica].stop()
    return old, replica, confirmed


async def test_a_bit_flipped_mid_log_on_a_replica_is_damage_repaired_from_the_active(tmp_path: Path) -> None:
    cl = LocalCluster(tmp_path, console=False, nodes=3, base_port=0, password="test-password", extra_args=[*FAST])
    try:
        old, replica, confirmed = await stopped_replica(cl)

        log_dir = cl.nodes[replica].data_dir / "tandem.db-log"
        seg = max(log_dir.glob("*.seg"))
        recs = records(seg)
        assert len(recs) > 4, recs
        start, length = recs[len(recs) // 2]
        data = bytearray(seg.read_bytes())
        data[start + 8 + length // 2] ^= 0x01  # one bit, in the middle of a record with records after it
        seg.write_bytes(bytes(data))

        await cl.nodes[replica].start()

        async def reported() -> bool:
            return any(e.startswith("log-damaged") for e in (await cl.status(replica)).events)

        await wait_until(reported, timeout=30, what=f"{replica} to report its damaged log")
        [event] = [e for e in (await cl.status(replica)).events if e.startswith("log-damaged")]
        assert f"{seg} at byte {start} (a record failing its checksum" in event, event
        await wait_until(lambda: caught_up(cl, replica, "q"), timeout=30, what=f"{replica} caught up again")
        async with await client.connect(cl.url_of(old)) as conn:  # (a write after: the segments go aside)
            await conn.producer("q").send(b"after the repair")
        await wait_until(lambda: caught_up(cl, replica, "q"), timeout=30, what=f"{replica} has the new entry")
        assert not seg.exists() and [p.name for p in log_dir.glob("damaged-*/*.seg")] == [seg.name]
        await asyncio.gather(*(p.stop() for p in cl.nodes.values()))

        store = SqliteEngine(cl.nodes[replica].data_dir / "tandem.db")
        rec = store.open()
        assert not rec.log_damage  # (set aside: a restart does not find it again)
        [q] = [m for m in rec.queues if m.name == "q"]
        held = [m.body for m in store.read(q.id, 0, 0, 1000)]
        store.close()
        assert held == [*confirmed, b"after the repair"]
    finally:
        await cl.stop()


async def test_two_logs_damaged_at_different_records_leave_the_group_serving_and_nothing_lost(tmp_path: Path) -> None:
    """The whole group stopped, and one bit flipped in each of two members' logs, at different
    records (a record of q's, written before the catalogue's latest mark): each member keeps
    the entries of every partition the damage cannot have touched (q's store has applied all
    it wrote before the damage, and the catalogue's mark after the damage says where its log
    ended), so the three elect actives again and serve; every confirmed message is there on
    both, byte for byte."""
    cl = LocalCluster(tmp_path, console=False, nodes=3, base_port=0, password="test-password", extra_args=[*FAST])
    try:
        old = await started_with_q(cl)
        confirmed: list[bytes] = []
        await produce(cl.url_of(old), "q", [f"message {i} ".encode() * 20 for i in range(200)], confirmed, [],
                      window=2)  # (many small appends: records enough for the log's marks of quiet partitions)
        assert len(confirmed) == 200
        replicas = [n for n in cl.nodes if n != old]
        for node in replicas:
            await wait_until(lambda: caught_up(cl, node, "q"), timeout=30, what=f"{node} to have every entry")
        await asyncio.gather(*(p.stop() for p in cl.nodes.values()))
        flipped = {}
        for node, at in zip(replicas, (0.3, 0.6)):
            seg = max((cl.nodes[node].data_dir / "tandem.db-log").glob("*.seg"))
            read = [(pos, len(body), msgpack.unpackb(body)) for pos, body, _f in segment_records(seg.read_bytes(), True)]
            marked = max(n for n, (_p, _l, rec) in enumerate(read) if rec[0] == "T" and tuple(rec[1:3]) == (0, 0))
            ours = [(pos, length) for pos, length, rec in read[:marked] if rec[0] == "A" and rec[1] != 0]
            assert len(ours) > 4, read
            start, length = ours[int(len(ours) * at)]
            data = bytearray(seg.read_bytes())
            data[start + 8 + length // 2] ^= 0x04
            seg.write_bytes(bytes(data))
            flipped[node] = f"{seg} at byte {start} (a record failing its checksum"

        await asyncio.gather(*(p.start() for p in cl.nodes.values()))
        for node, where in flipped.items():
            [event] = [e for e in (await cl.status(node)).events if e.startswith("log-damaged")]
            assert where in event and "every partition keeps its entries" in event, event
        more = [f"after {i} ".encode() * 10 for i in range(20)]
        await wait_until(lambda: _one_active(cl, "q"), timeout=30, what="an active for q")
        await produce(cl.url, "q", more, confirmed, [])
        assert len(confirmed) == 200 + 20
        for node in flipped:
            await wait_until(lambda: caught_up(cl, node, "q"), timeout=30, what=f"{node} has every entry")
        await asyncio.gather(*(p.stop() for p in cl.nodes.values()))
        for node in flipped:
            db, qid = store_of(cl, node)
            store = SqliteEngine(db)
            store.open()
            held = [m.body for m in store.read(qid, 0, 0, 1000)]
            store.close()
            assert held == confirmed, node
    finally:
        await cl.stop()


async def _one_active(cl: LocalCluster, queue: str) -> bool:
    return len(await cl.actives(queue)) == 1


def store_of(cl: LocalCluster, node: str) -> tuple[Path, int]:
    """A stopped node's store, and queue ``q``'s id in it."""
    db = cl.nodes[node].data_dir / "tandem.db"
    probe = SqliteEngine(db)
    try:
        return db, next(m.id for m in probe.open().queues if m.name == "q")
    finally:
        probe.close()


def flip_producer_position(db: Path, queue_id: int) -> str:
    """One bit of a producer's stored position flipped at rest (its checksum left as written):
    how the store names the row."""
    conn = sqlite3.connect(db)
    try:
        pid, last = conn.execute("SELECT producer_id, last_seq FROM producers WHERE queue_id = ? AND partition = 0 "
                                 "LIMIT 1", (queue_id,)).fetchone()
        conn.execute("UPDATE producers SET last_seq = ? WHERE queue_id = ? AND partition = 0 AND producer_id = ?",
                     (last ^ 0x40, queue_id, pid))
        conn.commit()
    finally:
        conn.close()
    return f"a row of producers (partition {queue_id}/0, position of producer {pid}) fails its checksum"


@pytest.mark.parametrize("damage", ["body", "producer-position", "lost-chunk-row"])
async def test_a_bit_flipped_in_a_replicas_stored_copy_is_rebuilt_from_the_active(tmp_path: Path, damage: str) -> None:
    """A flipped bit in a stored body (its chunk's CRC-32), or in a producer's position (its
    row's checksum: a position too high would drop that producer's next publishes as resends),
    or a chunk row gone as a lost write to the store's file leaves it (the page kept its older
    rows, each whole: the partition's digest in its row of partitions no longer fits)."""
    cl = LocalCluster(tmp_path, console=False, nodes=3, base_port=0, password="test-password", extra_args=[*FAST])
    try:
        old, replica, confirmed = await stopped_replica(cl)
        db, qid = store_of(cl, replica)
        if damage == "body":
            named = f"the chunk of partition {qid}/0 from offset {flip_stored_bit(db, qid, 0)} ("
        elif damage == "lost-chunk-row":
            conn = sqlite3.connect(db)
            assert conn.execute("DELETE FROM chunks WHERE rowid = (SELECT max(rowid) FROM chunks WHERE queue_id = ?)",
                                (qid,)).rowcount == 1
            conn.commit()
            conn.close()
            named = f"the chunks of partition {qid}/0 and its applied position (entry "
        else:
            named = flip_producer_position(db, qid)

        await cl.nodes[replica].start()
        log_text = cl.nodes[replica].log_text()
        assert named in log_text and "starting it over from its active (repair)" in log_text
        await wait_until(lambda: caught_up(cl, replica, "q"), timeout=30, what=f"{replica} rebuilt from {old}")
        await asyncio.gather(*(p.stop() for p in cl.nodes.values()))

        store = SqliteEngine(db)
        rec = store.open()
        assert not rec.store_damage
        held = [m.body for m in store.read(qid, 0, 0, 1000)]
        store.close()
        assert held == confirmed
    finally:
        await cl.stop()


@pytest.mark.parametrize("older", ["copy", "applied"])
async def test_a_replicas_copy_a_lost_write_left_behind_its_applied_position_is_rebuilt_from_the_active(
        tmp_path: Path, older: str) -> None:
    """A lost write to a replica's store that left pages with their older rows: the partition's
    chunks and its row of partitions as they were 48 messages earlier while its applied position
    (ha_state) moved on ("copy"), or its applied position as it was while they moved on
    ("applied"). Each row passes its own checksum; the partition's digest, which covers its
    applied position too (feature level 11), does not fit. The partition is rebuilt from its
    active, and every confirmed message is back, byte for byte."""
    cl = LocalCluster(tmp_path, console=False, nodes=3, base_port=0, password="test-password", extra_args=[*FAST])
    try:
        old, replica, db = await _replica_of_q(cl)
        bodies = [f"message {i} ".encode() * 20 for i in range(144)]
        confirmed: list[bytes] = []
        tables = ("chunks", "partitions") if older == "copy" else ("ha_state",)
        earlier: dict[str, list[Any]] = {}
        for upto in (96, 144):
            await produce(cl.url_of(old), "q", bodies[len(confirmed):upto], confirmed, [])
            await wait_until(lambda: _stored_end(db) >= upto, timeout=30, what=f"{replica}'s store to hold {upto}")
            qid = _key_of_q(db)
            earlier = earlier or {t: rows_of(db, t, qid) for t in tables}
        await cl.nodes[replica].stop()
        for table in tables:
            assert rows_of(db, table, qid) != earlier[table]
            put_back(db, table, earlier[table], qid)

        await cl.nodes[replica].start()
        log_text = cl.nodes[replica].log_text()
        assert f"the chunks of partition {qid[0]}/0 and its applied position (entry " in log_text, log_text
        assert "starting it over from its active (repair)" in log_text
        await wait_until(lambda: caught_up(cl, replica, "q"), timeout=30, what=f"{replica} rebuilt from {old}")
        await asyncio.gather(*(p.stop() for p in cl.nodes.values()))

        store = SqliteEngine(db)
        rec = store.open()
        assert not rec.store_damage
        held = [m.body for m in store.read(qid[0], 0, 0, 1000)]
        store.close()
        assert held == confirmed and len(confirmed) == 144
    finally:
        await cl.stop()


async def _settle(url: str, bodies: list[bytes], *, acked: set[bytes], nacked: set[bytes]) -> None:
    """Take queue ``q``'s messages from ``url``'s node until each of ``acked`` and ``nacked`` has
    been settled so (any other is nacked back to the queue)."""
    left = acked | nacked
    async with await client.connect(url) as conn:
        async with conn.consumer("q") as c:
            while left:
                m = await c.next(10)
                assert m is not None, f"{len(left)} of the chosen messages never came"
                if m.body in acked:
                    await m.ack()
                else:
                    await m.nack()
                left.discard(m.body)


def _books(db: Path, qid: tuple[int, int]) -> tuple[list[Any], list[Any]]:
    return rows_of(db, "settled", qid), rows_of(db, "counts", qid)


async def test_a_replicas_settlements_a_lost_write_left_one_write_old_are_rebuilt_from_the_active(
        tmp_path: Path) -> None:
    """A lost write to a replica's store that left its settled and counts rows as they were
    before the last acks and nacks (each row passing its checksum): served so, a message already
    acknowledged would come back. The partition's digest covers those rows (feature level 12)
    and does not fit: the partition is rebuilt from its active, and its copy then holds exactly
    the active's unsettled messages, none acknowledged among them."""
    cl = LocalCluster(tmp_path, console=False, nodes=3, base_port=0, password="test-password", extra_args=[*FAST])
    try:
        old, replica, db = await _replica_of_q(cl)
        bodies = [f"message {i} ".encode() * 20 for i in range(96)]
        confirmed: list[bytes] = []
        await produce(cl.url_of(old), "q", bodies, confirmed, [])
        assert len(confirmed) == 96
        # (the first message never acked: the ranges after it stay in the store)
        await _settle(cl.url_of(old), bodies, acked=set(bodies[1:40:2]), nacked={bodies[0], bodies[2]})
        qid = _key_of_q(db)
        await wait_until(lambda: all(_books(db, qid)), timeout=30, what=f"{replica}'s store to hold settlements")
        earlier = _books(db, qid)
        await _settle(cl.url_of(old), bodies, acked=set(bodies[41:80:2]), nacked={bodies[0], bodies[4]})
        await wait_until(lambda: all(now != was for now, was in zip(_books(db, qid), earlier)), timeout=30,
                         what=f"{replica}'s store to apply the second acks and nacks")
        await cl.nodes[replica].stop()
        put_back(db, "settled", earlier[0], qid)
        put_back(db, "counts", earlier[1], qid)

        await cl.nodes[replica].start()
        log_text = cl.nodes[replica].log_text()
        assert (f"the chunks of partition {qid[0]}/0 and its applied position (entry " in log_text
                and "settled ranges and delivery counts are not those its row of partitions sums up" in log_text), \
            log_text
        assert "starting it over from its active (repair)" in log_text
        await wait_until(lambda: caught_up(cl, replica, "q"), timeout=30, what=f"{replica} rebuilt from {old}")
        await asyncio.gather(*(p.stop() for p in cl.nodes.values()))

        held = {}
        for node in (replica, old):
            store = SqliteEngine(cl.nodes[node].data_dir / "tandem.db")
            rec = store.open()
            assert not rec.store_damage
            held[node] = [(m.body, m.dc) for m in rec.partitions[qid].messages]
            store.close()
        acked = set(bodies[1:40:2]) | set(bodies[41:80:2])
        assert held[replica] == held[old]
        assert [b for b, _dc in held[old]] == [b for b in bodies if b not in acked]
    finally:
        await cl.stop()


def _key_of_q(db: Path) -> tuple[int, int]:
    """Queue ``q``'s partition 0 in the store at ``db``."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return (conn.execute("SELECT id FROM queues WHERE name = 'q'").fetchone()[0], 0)
    finally:
        conn.close()


def _stored_end(db: Path) -> int:
    """How many messages queue ``q``'s partition 0 holds in the store at ``db`` (its end)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        row = conn.execute("SELECT next_offset FROM partitions p JOIN queues q ON q.id = p.queue_id "
                           "WHERE q.name = 'q' AND p.partition = 0").fetchone()
        return row[0] if row else 0
    finally:
        conn.close()


@pytest.mark.parametrize("damage", ["term", "catalogue"],
                         ids=["its term and vote took a flipped bit", "a lost write took its queue row"])
async def test_a_replica_whose_hard_state_or_catalogue_is_damaged_does_not_start_and_is_replaced_empty(
        tmp_path: Path, damage: str) -> None:
    """What the group cannot give back: a hard state (a node unsure of its vote could vote twice
    in a term), or its catalogue (a lost write left the queues table without q's row while the
    catalogue's applied position moved on: each row left passes its checksum, the catalogue's
    digest does not fit). The member refuses to start, naming it; the two others go on, and the
    member taken out and added back on an empty data directory is filled by the group."""
    cl = LocalCluster(tmp_path, console=False, nodes=3, base_port=0, password="test-password", extra_args=[*FAST])
    try:
        old, replica, confirmed = await stopped_replica(cl)
        db, qid = store_of(cl, replica)
        conn = sqlite3.connect(db)
        if damage == "term":
            conn.execute("UPDATE ha_state SET term = (term | 2) - (term & 2) WHERE queue_id = ?", (qid,))
            named = f"a row of ha_state (partition {qid}/0) fails its checksum (hard_crc): damaged at rest"
        else:
            conn.execute("DELETE FROM queues WHERE id = ?", (qid,))
            named = ("the catalogue's rows (queues, users, grants) and its applied position are not those its digest "
                     "in meta (catalogue_digest) sums up: a write to the store was lost or misdirected")
        conn.commit()
        conn.close()

        with pytest.raises(NodeStartError) as err:
            await cl.nodes[replica].start(timeout=30)
        text = str(err.value)
        assert named in text, text
        assert "this node does not start" in text and "Traceback" not in text, text
        async with await client.connect(cl.url_of(old)) as c:
            await c.producer("q").send(b"served on by the two others")

        # the remedy docs/operations.md gives: the member taken out while down, its data set
        # aside, added back on an empty directory; the group fills it
        rc, out, err = await tandem("group", "remove", replica, "--wait", "--timeout", "120", "--url", cl.url_of(old))
        assert rc == 0, (out, err)
        del cl.nodes[replica]
        (cl.data_dir / replica).rename(cl.data_dir / f"{replica}.damaged")
        rc, out, err = await tandem("group", "add", cl.new_member(replica), "--url", cl.url_of(old))
        assert rc == 0, (out, err)
        await cl.nodes[replica].start(60)
        await wait_until(lambda: caught_up(cl, replica, "q"), timeout=60, what=f"{replica} filled by the group")
        await asyncio.gather(*(p.stop() for p in cl.nodes.values()))
        store = SqliteEngine(cl.data_dir / replica / "tandem.db")
        rec = store.open()
        [q] = [m for m in rec.queues if m.name == "q"]
        held = [m.body for m in store.read(q.id, 0, 0, 1000)]
        store.close()
        assert not rec.row_damage and held == [*confirmed, b"served on by the two others"]
    finally:
        await cl.stop()
