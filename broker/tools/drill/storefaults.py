"""The storage fault families ``bit-flip``, ``stale-store`` and their ``-two`` forms: damage at rest
in a node's files, and a store a lost write left behind, found and repaired from the group
(docs/reliability.md, "Storage faults").

* ``bit-flip``: ``kill -9`` a node drawn from the run's seeded random source (among those whose
  store holds messages by then), then flip one bit
  in the payload of a log record that has records after it (in its newest segment: damage, not
  a torn tail), one in a stored chunk of messages and one in a producer's stored position (their
  checksums left as written), at seeded random offsets, and lose a write to its store: one chunk
  row gone, as a page that kept its older rows leaves it (found by the partition's digest of its
  chunks, feature level 10), never the flipped chunk's, of another partition where there is one,
  none when the store holds no other chunk; the heal starts it again.  The node must find each
  (its ``log-damaged`` status event, and its log's lines naming the chunk, the row and the
  partition), catch up from the group, and no consumer may ever get a damaged body (the checker
  compares every body byte for byte: a damaged one is *unexpected*) nor miss a message (a
  position read too high would drop its producer's next publishes as resends).  An injected
  fault the node did not find fails the run, and so does a queue whose replicas have not all
  caught up again (what was committed at the restart) within :data:`REPAIR_WAIT`: the schedule
  says ``injected N, detected M, repaired R``.
* ``bit-flip-two``: the same on two nodes at once, a majority of a group of three, in partitions
  the other node's damage spares (its log's flipped record is of another partition, and one a
  later write's cover names, and its store damage is in others too), so that each partition
  keeps a good copy on two nodes.  (A partition
  damaged on two of three waits for its data to be restored: no good majority is left.)
* ``stale-store``: read the rows of a node drawn as for ``bit-flip`` as they stand (its chunks,
  ``partitions``, ``ha_state``, ``settled`` and ``counts`` rows, in one read), wait until its
  store has applied more (within :data:`HOLDING_WAIT`), ``kill -9`` it, and put back one partition
  whose applied position moved as it was: either its chunk and ``partitions`` rows (its copy behind
  its applied position), or its ``ha_state`` row (its applied position behind its copy), or, where
  they moved on too, its ``settled`` and ``counts`` rows (acks and nacks lost), drawn from the
  seed: what a lost write leaves, each row passing its own checksum.  The restarted node must name
  the partition (its digest covers its applied position, feature level 11, and its settlements and
  delivery counts, level 12) and catch up from the group, judged as ``bit-flip``.
  ``stale-acks``: the same, always on a partition whose ``settled`` or ``counts`` rows moved on
  (the wait lasts until one did), and always those rows put back; during that wait (ended
  before the kill) a consumer of its own on each node gives back (nacks) each message it gets,
  so that delivery counts are written and acks land out of order.  ``stale-acks-two``: that on two nodes at once.  ``stale-store-two``: the same on two nodes at once, each in a partition the
  other's spares (the wait lasts until each store has moved on in a partition of its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import sqlite3
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import msgpack

import client
from broker.tools.checker import Delivery
from broker.tools.drill.groups import caught_up_past
from broker.tools.drill.nemesis import FaultContext, Nemesis, register
from client.consumer import Consumer, Message
from client.errors import TandemError, UnavailableError
from storage.segfiles import cover_of, key_of, records, seq_of

#: seconds the restarted node is given to report each damaged record (its event, its log line)
DETECT_WAIT = 30.0
#: seconds the restarted nodes' copies of the drill's queue are given to catch up again (repaired)
REPAIR_WAIT = 30.0
#: how long the fault waits for a store to hold messages (committed entries reach a store some
#: 0.2 s after they commit, unless acked first: broker.modes.replicated.apply.HOLD_APPLY)
HOLDING_WAIT = 5.0


@dataclass
class _Target:
    """One faulted node and what was done to its files."""

    node: str
    chunk: tuple[int, int, int] | None = None  # (queue id, partition, start) of the damaged chunk
    row: str = ""  # how the node names the damaged producer row
    lost: str = ""  # how the node names the partition that lost a chunk row (a pattern)
    log_damaged: bool = False
    #: the partitions whose stored copy was damaged here (another target's go elsewhere)
    parts: set[tuple[int, int]] = field(default_factory=set)

    def injected(self) -> int:
        return int(self.log_damaged) + int(self.chunk is not None) + int(bool(self.row)) + int(bool(self.lost))


@register
class BitFlip(Nemesis):
    name: ClassVar[str] = "bit-flip"
    #: how many nodes are faulted at once
    count: ClassVar[int] = 1

    def __init__(self) -> None:
        self.targets: list[_Target] = []

    async def inject(self, ctx: FaultContext) -> str:
        self.targets = [_Target(n) for n in await self._choose(ctx)]
        await asyncio.gather(*(ctx.cluster.nodes[t.node].kill() for t in self.targets))
        said = []
        for t in self.targets:
            avoid = {p for other in self.targets if other is not t for p in other.parts}
            where = await asyncio.to_thread(self._flip, t, Path(ctx.cluster.nodes[t.node].data_dir), ctx, avoid)
            said.append(f"{t.node}: kill -9, {where or 'nothing to flip (no record or chunk yet)'}")
        return f"{self.name} {'; '.join(said)}"

    async def _choose(self, ctx: FaultContext) -> list[str]:
        """:attr:`count` nodes whose store holds chunks of messages by now (a replica applies
        what it holds in its own time), drawn from the run's seeded source; any if too few do
        yet."""
        names = sorted(ctx.cluster.nodes)
        deadline = ctx.clock.monotonic() + HOLDING_WAIT
        while True:
            holding = [n for n in names if await asyncio.to_thread(_chunks, Path(ctx.cluster.nodes[n].data_dir))]
            if len(holding) >= self.count or ctx.clock.monotonic() > deadline:
                break
            await ctx.clock.sleep(0.1)  # (polling the stores with a deadline: a consumer that keeps up leaves none)
        pool = holding if len(holding) >= self.count else names
        return sorted([ctx.rng.choice(pool)] if self.count == 1 else ctx.rng.sample(pool, self.count))

    def _flip(self, t: _Target, data: Path, ctx: FaultContext, avoid: set[tuple[int, int]]) -> str:
        """Damage ``t.node``'s files; ``avoid``: partitions another target's store damage took
        (each partition keeps a good copy on a majority)."""
        said = []
        segs = sorted((data / "tandem.db-log").glob("*.seg"))
        if segs:
            seg = segs[-1]
            raw = bytearray(seg.read_bytes())
            read = [(pos, len(body), msgpack.unpackb(body)) for pos, body, fault in records(bytes(raw), last=True)
                    if fault is None]
            spared = [(pos, length, key_of(rec)) for pos, length, rec in read[:-1]]
            if self.count > 1:  # a record a later write's cover names (so the node can tell which
                # partition it lost), of a partition the other target's damage spares
                named = {n for _p, _l, rec in read if (c := cover_of(rec)) is not None for n in range(c[0], c[1] + 1)}
                spared = [(pos, length, key) for (pos, length, key), (_p, _l, rec) in zip(spared, read)
                          if seq_of(rec) in named and key not in avoid]
            if spared:
                start, length, key = ctx.rng.choice(spared)
                at = start + 8 + ctx.rng.randrange(length)
                raw[at] ^= 1 << ctx.rng.randrange(8)
                seg.write_bytes(bytes(raw))
                t.log_damaged = True
                if key[1] >= 0:
                    t.parts.add(key)
                said.append(f"one bit at byte {at} of {seg.name} (the record at byte {start})")
        conn = sqlite3.connect(data / "tandem.db")
        try:
            rows = [r for r in conn.execute("SELECT queue_id, partition, start FROM chunks WHERE crc IS NOT NULL "
                                            "ORDER BY queue_id, partition, start").fetchall() if r[:2] not in avoid]
            if rows:
                qid, p, start = ctx.rng.choice(rows)
                (payload,) = conn.execute("SELECT payload FROM chunks WHERE queue_id = ? AND partition = ? AND "
                                          "start = ?", (qid, p, start)).fetchone()
                damaged = bytearray(payload)
                damaged[ctx.rng.randrange(len(damaged))] ^= 1 << ctx.rng.randrange(8)
                conn.execute("UPDATE chunks SET payload = ? WHERE queue_id = ? AND partition = ? AND start = ?",
                             (bytes(damaged), qid, p, start))
                conn.commit()
                t.chunk = (qid, p, start)
                t.parts.add((qid, p))
                said.append(f"one bit in the stored chunk of partition {qid}/{p} from offset {start}")
            rows = [r for r in conn.execute("SELECT queue_id, partition, producer_id, last_seq FROM producers WHERE "
                                            "crc IS NOT NULL ORDER BY queue_id, partition, producer_id").fetchall()
                    if r[:2] not in avoid]
            if rows:
                qid, p, pid, last = ctx.rng.choice(rows)
                conn.execute("UPDATE producers SET last_seq = ? WHERE queue_id = ? AND partition = ? AND "
                             "producer_id = ?", (last ^ (1 << ctx.rng.randrange(16)), qid, p, pid))
                conn.commit()
                t.row = f"a row of producers (partition {qid}/{p}, position of producer {pid}) fails its checksum"
                t.parts.add((qid, p))
                said.append(f"one bit in the stored position of producer {pid} in partition {qid}/{p}")
            # a lost write: a chunk row of a partition whose row keeps a digest, never the flipped
            # chunk (its loss would hide the flip), of another partition where there is one
            rows = [r for r in conn.execute("SELECT c.queue_id, c.partition, c.start FROM chunks c JOIN partitions p "
                                            "ON p.queue_id = c.queue_id AND p.partition = c.partition "
                                            "WHERE p.digest IS NOT NULL ORDER BY 1, 2, 3").fetchall()
                    if (t.chunk is None or tuple(r) != t.chunk) and r[:2] not in avoid]
            others = [r for r in rows if t.chunk is None or r[:2] != t.chunk[:2]]
            if rows:
                qid, p, start = ctx.rng.choice(others or rows)
                conn.execute("DELETE FROM chunks WHERE queue_id = ? AND partition = ? AND start = ?", (qid, p, start))
                conn.commit()
                # (from feature level 11 the digest covers the applied position and the producer
                # positions too, and from 12 the settled ranges and delivery counts, which the line names)
                t.lost = rf"the chunks of partition {qid}/{p} (and its applied position \([^)]*\)[a-z ,]* )?are not " \
                         rf"those its row of partitions sums up"
                t.parts.add((qid, p))
                said.append(f"a lost write to the store: the chunk row of partition {qid}/{p} from offset {start} gone")
        finally:
            conn.close()
        return ", ".join(said)

    async def heal(self, ctx: FaultContext) -> None:
        await asyncio.gather(*(ctx.cluster.nodes[t.node].start() for t in self.targets))
        found = await asyncio.gather(*(self._found(ctx, t) for t in self.targets))
        # repaired: every replica of the drill's queue holds what was committed by now (a rebuilt
        # copy included), within the wait
        try:
            await caught_up_past(ctx.cluster, ctx.cfg.partitions, ctx.clock.monotonic() + REPAIR_WAIT, ctx.clock)
            repaired = True
        except UnavailableError:
            repaired = False
        for t, got in zip(self.targets, found):
            injected = t.injected()
            ctx.schedule.append(f"{self.name} {t.node}: injected {injected}, detected {len(got)}, repaired "
                                f"{len(got) if repaired else 0}" + (f" ({', '.join(got)})" if got else ""))
            if len(got) < injected:
                ctx.failures.append(f"{self.name} {t.node}: {injected} damaged record(s) injected, {len(got)} found")
        if not repaired:
            ctx.failures.append(f"{self.name}: the queue's replicas did not all catch up within {REPAIR_WAIT:.0f} s "
                                f"of the restart")

    async def _found(self, ctx: FaultContext, t: _Target) -> list[str]:
        """The damage the restarted node reported detecting, within :data:`DETECT_WAIT`."""
        proc = ctx.cluster.nodes[t.node]
        deadline = ctx.clock.monotonic() + DETECT_WAIT
        while True:
            found = []
            if t.log_damaged:
                try:
                    events = (await ctx.cluster.status(t.node)).events
                except (TandemError, OSError):
                    events = []
                if any(e.startswith("log-damaged") for e in events):
                    found.append("the log (log-damaged event)")
            if t.chunk is not None and f"partition {t.chunk[0]}/{t.chunk[1]} from offset {t.chunk[2]} (" \
                    in proc.log_text():
                found.append("the chunk (its log line)")
            if t.row and t.row in proc.log_text():
                found.append("the producer's row (its log line)")
            if t.lost and re.search(t.lost, proc.log_text()):
                found.append("the lost write to the store (its log line)")
            if len(found) == t.injected() or ctx.clock.monotonic() > deadline:
                return found
            await ctx.clock.sleep(0.2)  # (polling the node's words with a deadline)


@register
class BitFlipTwo(BitFlip):
    """``bit-flip`` on two nodes at once, a majority of three: each node's store damage in
    partitions the other's spares, its log's flipped record drawn on its own."""

    name: ClassVar[str] = "bit-flip-two"
    count: ClassVar[int] = 2


@register
class StaleStore(BitFlip):
    """A lost write to a node's store that left one partition's pages as they were some writes
    earlier while another page moved on (the module says how)."""

    name: ClassVar[str] = "stale-store"
    #: what the schedule says of a target with no partition to put back
    none_moved: ClassVar[str] = "its store applied nothing more meanwhile"

    async def inject(self, ctx: FaultContext) -> str:
        self.targets = [_Target(n) for n in await self._choose(ctx)]
        dirs = {t.node: Path(ctx.cluster.nodes[t.node].data_dir) for t in self.targets}
        earlier = {n: await asyncio.to_thread(_Rows.read, d) for n, d in dirs.items()}
        deadline = ctx.clock.monotonic() + HOLDING_WAIT
        meanwhile = self._meanwhile(ctx)
        try:
            while ctx.clock.monotonic() < deadline:
                now = {n: await asyncio.to_thread(_applied, d) for n, d in dirs.items()}
                if _distinct([await asyncio.to_thread(self._moved_in, d, earlier[n], now[n])
                              for n, d in dirs.items()]):
                    break
                await ctx.clock.sleep(0.1)  # (polling the stores with a deadline: they apply in their own time)
        finally:
            if meanwhile is not None:
                meanwhile.cancel()
                with contextlib.suppress(asyncio.CancelledError, TandemError, OSError):
                    await meanwhile
        await asyncio.gather(*(ctx.cluster.nodes[t.node].kill() for t in self.targets))
        now = {n: await asyncio.to_thread(_applied, d) for n, d in dirs.items()}
        moved = [await asyncio.to_thread(self._moved_in, dirs[t.node], earlier[t.node], now[t.node])
                 for t in self.targets]
        said = []
        for n, t in enumerate(self.targets):
            taken = {p for other in self.targets for p in other.parts}
            # (a partition of its own that leaves one for each target after it, where there is one)
            keys = [k for k in moved[n] if k not in taken and _distinct(moved[n + 1:], taken | {k})]
            if keys:
                key = ctx.rng.choice(keys)
                where = await asyncio.to_thread(self._put_back, t, dirs[t.node], earlier[t.node], key, now[t.node], ctx)
            elif moved[n]:
                where = "its store applied more meanwhile only in partitions another target's damage took"
            else:
                where = self.none_moved
            said.append(f"{t.node}: kill -9, {where}")
        return f"{self.name} {'; '.join(said)}"

    def _meanwhile(self, ctx: FaultContext) -> asyncio.Future[None] | None:
        """What runs while the fault waits for the targets' stores to move on (stopped before the
        kill), if anything."""
        return None

    def _moved_in(self, data: Path, earlier: _Rows, now: dict[Key, tuple[int, int]]) -> list[Key]:
        """The partitions of the store at ``data`` that may be put back: those whose applied
        position moved since ``earlier`` (``now``)."""
        return _moved(earlier.applied, now)

    def _choices(self, data: Path, earlier: _Rows, key: Key) -> list[tuple[str, ...]]:
        """Which rows of partition ``key`` may be put back, each choice a tuple of tables."""
        choices = [("chunks", "partitions"), ("ha_state",)]
        if _books_moved(data, earlier, key):
            choices.append(_BOOKS)  # (its settlements or delivery counts moved on too)
        return choices

    def _put_back(self, t: _Target, data: Path, earlier: _Rows, key: Key, now: dict[Key, tuple[int, int]],
                  ctx: FaultContext) -> str:
        """Put partition ``key``'s rows of ``t.node``'s store back as they were (``earlier``): its
        chunk and ``partitions`` rows, or its ``ha_state`` row, or (where they moved on) its
        ``settled`` and ``counts`` rows, drawn from the seed."""
        tables = ctx.rng.choice(self._choices(data, earlier, key))
        conn = sqlite3.connect(data / "tandem.db")
        try:
            # (the store's triggers are a build's, not a disk's: dropped, and made again when it opens)
            for (trigger,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
                conn.execute(f"DROP TRIGGER {trigger}")
            for table in tables:
                conn.execute(f"DELETE FROM {table} WHERE queue_id = ? AND partition = ?", key)
                for row in earlier.rows[table].get(key, []):
                    conn.execute(f"INSERT INTO {table} VALUES ({', '.join('?' * len(row))})", row)
            conn.commit()
        finally:
            conn.close()
        t.parts.add(key)
        qid, p = key
        t.lost = (rf"(the chunks of partition {qid}/{p} and its applied position \(entry |partition {qid}/{p} has "
                  rf"chunks, [a-z ,]*or an applied position but no row of partitions)")
        was = earlier.applied.get(key, (0, 0))[0]
        if tables == ("ha_state",):
            return (f"a lost write to the store: the ha_state row of partition {qid}/{p} put back as it was at entry "
                    f"{was} (its copy at entry {now[key][0]})")
        if tables == _BOOKS:
            return (f"a lost write to the store: the settled and counts rows of partition {qid}/{p} put back as they "
                    f"were at entry {was} (its applied position at entry {now[key][0]})")
        return (f"a lost write to the store: the chunk and partitions rows of partition {qid}/{p} put back as they "
                f"were at entry {was} (its applied position at entry {now[key][0]})")


@register
class StaleAcks(StaleStore):
    """``stale-store`` that always loses a write of settlements and delivery counts: a partition
    whose ``settled`` or ``counts`` rows moved on has them put back (acks and nacks undone)."""

    name: ClassVar[str] = "stale-acks"
    none_moved: ClassVar[str] = "its store's settlements and delivery counts moved on in no partition meanwhile"

    def _meanwhile(self, ctx: FaultContext) -> asyncio.Future[None] | None:
        return asyncio.ensure_future(_nack(ctx, [ctx.cluster.url_of(n) for n in sorted(ctx.cluster.nodes)]))

    def _moved_in(self, data: Path, earlier: _Rows, now: dict[Key, tuple[int, int]]) -> list[Key]:
        return [k for k in _moved(earlier.applied, now) if _books_moved(data, earlier, k)]

    def _choices(self, data: Path, earlier: _Rows, key: Key) -> list[tuple[str, ...]]:
        return [_BOOKS]


@register
class StaleStoreTwo(StaleStore):
    """``stale-store`` on two nodes at once, a majority of three, each in a partition the
    other's spares."""

    name: ClassVar[str] = "stale-store-two"
    count: ClassVar[int] = 2


@register
class StaleAcksTwo(StaleAcks):
    """``stale-acks`` on two nodes at once, each in a partition the other's spares."""

    name: ClassVar[str] = "stale-acks-two"
    count: ClassVar[int] = 2


Key = tuple[int, int]
#: the tables of a store whose rows of a partition stale-store may put back
_TABLES = ("chunks", "partitions", "ha_state", "settled", "counts")
#: a partition's settlements and delivery counts, put back together
_BOOKS = ("settled", "counts")


@dataclass
class _Rows:
    """A node's store as it stood: the queues' rows of its chunks, partitions and ha_state
    tables by partition, and each partition's applied position (index, term)."""

    rows: dict[str, dict[Key, list[tuple[object, ...]]]]
    applied: dict[Key, tuple[int, int]]

    @classmethod
    def read(cls, data: Path) -> _Rows:
        """In one read transaction (the node is running: read-only)."""
        rows: dict[str, dict[Key, list[tuple[object, ...]]]] = {t: {} for t in _TABLES}
        conn = sqlite3.connect(f"file:{data / 'tandem.db'}?mode=ro", uri=True, isolation_level=None)
        try:
            conn.execute("BEGIN")
            for table, mine in rows.items():
                for row in conn.execute(f"SELECT * FROM {table} WHERE queue_id != 0 ORDER BY rowid"):
                    mine.setdefault((row[0], row[1]), []).append(tuple(row))
            applied = _applied_of(conn)
            conn.execute("COMMIT")
        finally:
            conn.close()
        return cls(rows, applied)


def _rows_of(data: Path, table: str, key: Key) -> list[tuple[object, ...]]:
    """Partition ``key``'s rows of ``table`` in a node's store (read-only), as :class:`_Rows` reads them."""
    conn = sqlite3.connect(f"file:{data / 'tandem.db'}?mode=ro", uri=True)
    try:
        return [tuple(r) for r in conn.execute(f"SELECT * FROM {table} WHERE queue_id = ? AND partition = ? "
                                               f"ORDER BY rowid", key)]
    finally:
        conn.close()


async def _nack(ctx: FaultContext, urls: list[str]) -> None:
    """Consume the drill's queue where each of ``urls``' nodes is active for it (a direct route
    to each: no node relays another's deliveries, none in flight between them when it stops) and
    give back each message (nack, requeue) until cancelled: each gets a delivery count, and the
    drill's own consumers ack it later than the messages after it, so settled ranges stay in the
    store until it is acked. Every delivery is noted with the run's deliveries as it arrives (the
    checker's order is that of first deliveries, and none is held unseen to go back unflagged)."""
    async with contextlib.AsyncExitStack() as stack:
        for url in urls:
            conn = await stack.enter_async_context(await client.connect_link(url, client_name="drill-nacker"))
            c = Consumer(conn, ctx.queue, prefetch=1, local=True)
            c.sink = functools.partial(_nacked, ctx, conn)
            await c.start()
            stack.push_async_callback(_cancel, c)
        await asyncio.get_running_loop().create_future()  # (until cancelled)


async def _cancel(c: Consumer) -> None:
    """``c``'s subscription ended, even while its caller is being cancelled."""
    await asyncio.shield(c.cancel())


def _nacked(ctx: FaultContext, conn: Any, deliveries: list[Any]) -> None:
    for d in deliveries:
        m = Message(conn, d)
        if ctx.received is not None:
            ctx.received.append(Delivery(m.body, -1, m.partition, m.redelivered))
        m.nack()


def _books_moved(data: Path, earlier: _Rows, key: Key) -> bool:
    """Whether partition ``key``'s settled or counts rows in the store at ``data`` are not those
    of ``earlier``."""
    return any(_rows_of(data, t, key) != earlier.rows[t].get(key, []) for t in _BOOKS)


def _applied(data: Path) -> dict[Key, tuple[int, int]]:
    conn = sqlite3.connect(f"file:{data / 'tandem.db'}?mode=ro", uri=True)
    try:
        return _applied_of(conn)
    finally:
        conn.close()


def _applied_of(conn: sqlite3.Connection) -> dict[Key, tuple[int, int]]:
    """Each queue partition's applied position (index, term) in a store."""
    return {(q, p): (i, t) for q, p, i, t in conn.execute(
        "SELECT queue_id, partition, applied_index, applied_term FROM ha_state WHERE queue_id != 0")}


def _moved(earlier: dict[Key, tuple[int, int]], now: dict[Key, tuple[int, int]]) -> list[Key]:
    """The partitions whose applied position moved since ``earlier``."""
    return sorted(k for k, a in now.items() if a != earlier.get(k, (0, 0)))


def _distinct(moved: list[list[Key]], taken: Collection[Key] = frozenset()) -> bool:
    """Whether each list of ``moved`` can give a partition of its own, none in ``taken`` (each
    target of ``stale-store-two`` one its store moved on in, the other's spares)."""
    return not moved or any(_distinct(moved[1:], {*taken, k}) for k in moved[0] if k not in taken)


def _chunks(data: Path) -> int:
    """How many checksummed chunks a node's store holds (read-only: the node is running)."""
    try:
        conn = sqlite3.connect(f"file:{data / 'tandem.db'}?mode=ro", uri=True)
    except sqlite3.Error:
        return 0
    try:
        return int(conn.execute("SELECT count(*) FROM chunks WHERE crc IS NOT NULL").fetchone()[0])
    except sqlite3.Error:
        return 0
    finally:
        conn.close()

