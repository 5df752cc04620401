"""The storage fault family ``bit-flip``: damage at rest in a node's files, found and repaired
from the group (docs/reliability.md, "Storage faults").

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
  fault the node did not find fails the run.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import ClassVar

from broker.tools.drill.nemesis import FaultContext, Nemesis, register
from client.errors import TandemError
from storage.segments import records

#: seconds the restarted node is given to report each damaged record (its event, its log line)
DETECT_WAIT = 30.0
#: how long the fault waits for a store to hold messages (committed entries reach a store some
#: 0.2 s after they commit, unless acked first: broker.modes.replicated.apply.HOLD_APPLY)
HOLDING_WAIT = 5.0


@register
class BitFlip(Nemesis):
    name: ClassVar[str] = "bit-flip"

    def __init__(self) -> None:
        self.node = ""
        self.chunk: tuple[int, int, int] | None = None  # (queue id, partition, start) of the damaged chunk
        self.row: str = ""  # how the node names the damaged producer row
        self.lost: str = ""  # how the node names the partition that lost a chunk row
        self.log_damaged = False

    async def inject(self, ctx: FaultContext) -> str:
        # a node whose store holds chunks of messages by now (a replica applies what it holds
        # in its own time), drawn from the run's seeded source; any node if none does yet
        names = sorted(ctx.cluster.nodes)
        deadline = ctx.clock.monotonic() + HOLDING_WAIT
        while True:
            holding = [n for n in names if await asyncio.to_thread(_chunks, Path(ctx.cluster.nodes[n].data_dir))]
            if holding or ctx.clock.monotonic() > deadline:
                break
            await ctx.clock.sleep(0.1)  # (polling the stores with a deadline: a consumer that keeps up leaves none)
        self.node = ctx.rng.choice(holding or names)
        proc = ctx.cluster.nodes[self.node]
        await proc.kill()
        data = Path(proc.data_dir)
        where = await asyncio.to_thread(self._flip, data, ctx)
        return f"bit-flip {self.node}: kill -9, {where or 'nothing to flip (no record or chunk yet)'}"

    def _flip(self, data: Path, ctx: FaultContext) -> str:
        said = []
        segs = sorted((data / "tandem.db-log").glob("*.seg"))
        if segs:
            seg = segs[-1]
            raw = bytearray(seg.read_bytes())
            whole = [(pos, len(body)) for pos, body, fault in records(bytes(raw), last=True) if fault is None]
            if len(whole) > 1:
                start, length = ctx.rng.choice(whole[:-1])
                at = start + 8 + ctx.rng.randrange(length)
                raw[at] ^= 1 << ctx.rng.randrange(8)
                seg.write_bytes(bytes(raw))
                self.log_damaged = True
                said.append(f"one bit at byte {at} of {seg.name} (the record at byte {start})")
        conn = sqlite3.connect(data / "tandem.db")
        try:
            rows = conn.execute("SELECT queue_id, partition, start FROM chunks WHERE crc IS NOT NULL "
                                "ORDER BY queue_id, partition, start").fetchall()
            if rows:
                qid, p, start = ctx.rng.choice(rows)
                (payload,) = conn.execute("SELECT payload FROM chunks WHERE queue_id = ? AND partition = ? AND "
                                          "start = ?", (qid, p, start)).fetchone()
                damaged = bytearray(payload)
                damaged[ctx.rng.randrange(len(damaged))] ^= 1 << ctx.rng.randrange(8)
                conn.execute("UPDATE chunks SET payload = ? WHERE queue_id = ? AND partition = ? AND start = ?",
                             (bytes(damaged), qid, p, start))
                conn.commit()
                self.chunk = (qid, p, start)
                said.append(f"one bit in the stored chunk of partition {qid}/{p} from offset {start}")
            rows = conn.execute("SELECT queue_id, partition, producer_id, last_seq FROM producers WHERE crc IS NOT NULL "
                                "ORDER BY queue_id, partition, producer_id").fetchall()
            if rows:
                qid, p, pid, last = ctx.rng.choice(rows)
                conn.execute("UPDATE producers SET last_seq = ? WHERE queue_id = ? AND partition = ? AND "
                             "producer_id = ?", (last ^ (1 << ctx.rng.randrange(16)), qid, p, pid))
                conn.commit()
                self.row = f"a row of producers (partition {qid}/{p}, position of producer {pid}) fails its checksum"
                said.append(f"one bit in the stored position of producer {pid} in partition {qid}/{p}")
            # a lost write: a chunk row of a partition whose row keeps a digest, never the flipped
            # chunk (its loss would hide the flip), of another partition where there is one
            rows = [r for r in conn.execute("SELECT c.queue_id, c.partition, c.start FROM chunks c JOIN partitions p "
                                            "ON p.queue_id = c.queue_id AND p.partition = c.partition "
                                            "WHERE p.digest IS NOT NULL ORDER BY 1, 2, 3").fetchall()
                    if self.chunk is None or tuple(r) != self.chunk]
            others = [r for r in rows if self.chunk is None or r[:2] != self.chunk[:2]]
            if rows:
                qid, p, start = ctx.rng.choice(others or rows)
                conn.execute("DELETE FROM chunks WHERE queue_id = ? AND partition = ? AND start = ?", (qid, p, start))
                conn.commit()
                self.lost = f"the chunks of partition {qid}/{p} are not those its row of partitions sums up"
                said.append(f"a lost write to the store: the chunk row of partition {qid}/{p} from offset {start} gone")
        finally:
            conn.close()
        return ", ".join(said)

    async def heal(self, ctx: FaultContext) -> None:
        proc = ctx.cluster.nodes[self.node]
        await proc.start()
        found = await self._found(ctx)
        injected = self._injected()
        ctx.schedule.append(f"bit-flip {self.node}: injected {injected}, detected {len(found)}"
                            + (f" ({', '.join(found)})" if found else ""))
        if len(found) < injected:
            ctx.failures.append(f"bit-flip {self.node}: {injected} damaged record(s) injected, {len(found)} found")

    def _injected(self) -> int:
        return int(self.log_damaged) + int(self.chunk is not None) + int(bool(self.row)) + int(bool(self.lost))

    async def _found(self, ctx: FaultContext) -> list[str]:
        """The damage the restarted node reported detecting, within :data:`DETECT_WAIT`."""
        proc = ctx.cluster.nodes[self.node]
        deadline = ctx.clock.monotonic() + DETECT_WAIT
        while True:
            found = []
            if self.log_damaged:
                try:
                    events = (await ctx.cluster.status(self.node)).events
                except (TandemError, OSError):
                    events = []
                if any(e.startswith("log-damaged") for e in events):
                    found.append("the log (log-damaged event)")
            if self.chunk is not None and f"partition {self.chunk[0]}/{self.chunk[1]} from offset {self.chunk[2]} (" \
                    in proc.log_text():
                found.append("the chunk (its log line)")
            if self.row and self.row in proc.log_text():
                found.append("the producer's row (its log line)")
            if self.lost and self.lost in proc.log_text():
                found.append("the lost chunk row (its log line)")
            if len(found) == self._injected() or ctx.clock.monotonic() > deadline:
                return found
            await ctx.clock.sleep(0.2)  # (polling the node's words with a deadline)


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

