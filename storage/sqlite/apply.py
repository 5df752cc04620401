"""Applying a batch of write ops to the SQLite store's tables, inside the writer's
transaction, and the writer's in-memory index of chunks and settled ranges.

A batch's appends become chunk rows (one per run of consecutive offsets), its
settlements merged ranges, its producer positions one row per producer; a chunk whose
messages are all settled is deleted (``_compact``), using the index to find it without
a query.  Statements go through the driver connection (:class:`Driver`): SQLAlchemy's
statement layer costs ~6 us a statement, a tenth of a commit's own work for a small
batch.
"""

from __future__ import annotations

import sqlite3
import zlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

from sqlalchemy import Connection

from client.errors import StorageError
from storage.base import (
    Append,
    DropProducers,
    DropQueue,
    DropMeta,
    DropUser,
    GrantAcl,
    PutMeta,
    RevokeAcl,
    LogCompact,
    MarkDelivered,
    MessageRecord,
    PackedRun,
    PutApplied,
    PutHardState,
    PutProducer,
    PutQueue,
    PutUser,
    ResetPartition,
    SetDeliveryCount,
    Settle,
    Trim,
    WriteOp,
    pack_run,
)
from storage.intervals import ChunkIndex, IntervalSet, ranges_of
from storage.sqlite import booksum, catalogue_sum, rowsums
from storage.sqlite import statements as sql
from storage.sqlite.schema import Key


def _runs(messages: Sequence[MessageRecord]) -> Iterator[Sequence[MessageRecord]]:
    """Split into runs of consecutive offsets (one chunk each)."""
    begin = 0
    for i in range(1, len(messages)):
        if messages[i].offset != messages[i - 1].offset + 1:
            yield messages[begin:i]
            begin = i
    if messages:
        yield messages[begin:]


class Executor(Protocol):
    """What the applier writes through: a connection's ``exec_driver_sql``."""

    def exec_driver_sql(self, sql: str, params: list[Any] | tuple[Any, ...] = ...) -> Any: ...


class Driver:
    """The writer's statements on the driver connection, spelled like SQLAlchemy's
    ``exec_driver_sql``: a list of rows is ``executemany``, a tuple one ``execute``."""

    __slots__ = ("_raw",)

    def __init__(self, raw: sqlite3.Connection) -> None:
        self._raw = raw

    def exec_driver_sql(self, sql: str, params: list[Any] | tuple[Any, ...] = ()) -> sqlite3.Cursor:
        if type(params) is list:
            return self._raw.executemany(sql, params)
        return self._raw.execute(sql, params)


def _query(conn: Executor) -> catalogue_sum.Query:
    """``conn`` as catalogue_sum reads through it."""
    return lambda sql, params: conn.exec_driver_sql(sql, params) if params else conn.exec_driver_sql(sql)


class OpApplier:
    """Turns write ops into statements, and keeps the writer's index of the chunk and
    settled rows (``index``) and of each partition's end (``ends``) in step with them.
    Used by the writer thread only.

    The statements are portable SQL with ``?`` placeholders, but for the few below, which
    another dialect overrides (``storage.postgres``)."""

    #: rows carry checksums: partitions and meta always, the others once the store is at
    #: rowsums.LEVEL (a dialect without feature levels: never)
    ROW_SUMS = True
    UPSERT_END = sql.UPSERT_END
    UPSERT_DELIVERED = sql.UPSERT_DELIVERED
    PUT_QUEUE = ("INSERT OR REPLACE INTO queues (id, name, partitions, mapper, ring_size, max_deliveries, "
                 "dead_letter_queue, max_length, owner, max_length_bytes, overflow, message_ttl, expires, type, "
                 "max_age, max_bytes, dead_letter_exchange, dead_letter_routing_key, crc) "
                 "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
    QUEUE_ID_HWM = ("INSERT INTO meta (key, value) VALUES ('queue_id_hwm', ?) ON CONFLICT (key) DO UPDATE SET "
                    "value = CAST(max(CAST(value AS INTEGER), CAST(excluded.value AS INTEGER)) AS TEXT)")
    PUT_USER = "INSERT OR REPLACE INTO users (name, salt, hash, role, params, crc) VALUES (?, ?, ?, ?, ?, ?)"
    PUT_ACL = ("INSERT INTO acls (username, pattern, permission, crc) VALUES (?, ?, ?, ?) "
               "ON CONFLICT (username, pattern, permission) DO NOTHING")
    PUT_META = "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value"
    PUT_META_SUMMED = ("INSERT INTO meta (key, value, crc) VALUES (?, ?, ?) ON CONFLICT (key) DO UPDATE SET "
                       "value = excluded.value, crc = excluded.crc")

    def __init__(self) -> None:
        self.index: dict[Key, ChunkIndex] = {}
        self.ends: dict[Key, int] = {}
        #: each partition's row of ``partitions`` as stored: (end, delivered mark), with ROW_SUMS
        self.marks: dict[Key, tuple[int, int]] = {}
        #: each partition's digest of its chunk rows (rowsums.chunk_hash), kept in its row of
        #: ``partitions`` once the store is at rowsums.DIGEST_LEVEL (``digests_on``)
        self.digests: dict[Key, int] = {}
        self.digests_on = False
        #: each partition's applied position (index, term) as ``ha_state`` keeps it; from
        #: rowsums.APPLIED_LEVEL (``applied_on``) its digest covers it too, and a batch that moves
        #: it writes the row again (``_moved``: those of the batch in hand)
        self.applied: dict[Key, tuple[int, int]] = {}
        self.applied_on = False
        #: each partition's producer positions as stored, and the XOR of their
        #: rowsums.producer_hash, which its digest covers from rowsums.APPLIED_LEVEL too
        self.producers: dict[Key, dict[str, int]] = {}
        self.producer_sums: dict[Key, int] = {}
        #: the sum of each partition's settled and delivery count rows, kept from booksum.LEVEL
        #: (``books_on``; summed from the rows as they stand when the store reaches it), which its
        #: digest covers
        self.books = booksum.Books()
        self.books_on = False
        self._moved: set[Key] = set()
        #: chunks in the index that have no row: settled whole before they were written (never
        #: written, so never deleted either: not in the digest)
        self.phantoms: set[tuple[int, int, int]] = set()
        #: ``meta``'s highest queue id as stored, with ROW_SUMS
        self.queue_id_hwm = 0
        #: the partitions with a settled row that failed its checksum at the last reload, or whose
        #: chunks are not those their digest sums up, and why
        self.damaged: dict[Key, str] = {}
        #: rows are written with checksums (the store's group is at storage.sqlite.rowsums.LEVEL)
        self.row_sums = False
        #: the catalogue's digest (storage.sqlite.catalogue_sum), from rowsums.APPLIED_LEVEL; why
        #: the store's catalogue did not fit it at the last reload
        self.catalogue = catalogue_sum.Digest()
        self.catalogue_misfit: str | None = None

    def _crc(self, *values: Any) -> int | None:
        """A row's checksum, or None while the store's level writes none (rowsums.LEVEL)."""
        return rowsums.row_crc(*values) if self.row_sums else None

    def reload(self, conn: Connection) -> None:
        """Load the index from the tables (on open, or after a failed commit)."""
        meta = {k: v for k, v in conn.exec_driver_sql(
            f"SELECT key, value FROM meta WHERE key IN ('{rowsums.LEVEL_KEY}', 'queue_id_hwm')")}
        level = rowsums.level_of(meta.get(rowsums.LEVEL_KEY))
        applied_on = self.ROW_SUMS and level >= rowsums.APPLIED_LEVEL
        applied = {(qid, p): (idx, term) for qid, p, idx, term in conn.exec_driver_sql(
            "SELECT queue_id, partition, applied_index, applied_term FROM ha_state WHERE queue_id != 0")}
        index: dict[Key, ChunkIndex] = {}
        digests: dict[Key, int] = {}
        damaged: dict[Key, str] = {}
        for qid, p, start, count in conn.exec_driver_sql(
            "SELECT queue_id, partition, start, count FROM chunks ORDER BY queue_id, partition, start"
        ):
            if type(start) is not int or type(count) is not int:
                damaged.setdefault((qid, p), rowsums.not_numbers(qid, p))
                continue
            index.setdefault((qid, p), ChunkIndex()).add_chunk(start, count)
            digests[(qid, p)] = digests.get((qid, p), 0) ^ rowsums.chunk_hash(start, count)
        producers: dict[Key, dict[str, int]] = {}
        producer_sums: dict[Key, int] = {}
        for qid, p, pid, seq in conn.exec_driver_sql("SELECT queue_id, partition, producer_id, last_seq FROM producers"):
            producers.setdefault((qid, p), {})[pid] = seq
            producer_sums[(qid, p)] = producer_sums.get((qid, p), 0) ^ rowsums.producer_hash(pid, seq)
        summed = digests if not applied_on else {
            k: digests.get(k, 0) ^ producer_sums.get(k, 0) for k in digests.keys() | producer_sums.keys()}
        books_on = self.ROW_SUMS and level >= booksum.LEVEL
        self.books = booksum.Books()
        if books_on:
            self.books.load(conn.exec_driver_sql)
            summed = {k: summed.get(k, 0) ^ self.books.sum(k) for k in summed.keys() | self.books.sums.keys()}
        for row in conn.exec_driver_sql(rowsums.select("settled")):
            qid, p, s, e = row[:4]
            bad = rowsums.damaged("settled", row)
            if bad:
                damaged.setdefault((qid, p), bad["crc"])
                continue
            index.setdefault((qid, p), ChunkIndex()).settled.add(s, e)
        rows = conn.exec_driver_sql(
            "SELECT queue_id, partition, next_offset, delivered_upto, digest FROM partitions").fetchall()
        marks: dict[Key, tuple[int, int]] = {(qid, p): (nxt, dlv) for qid, p, nxt, dlv, _d in rows}
        for key, why in rowsums.misfits([(r[0], r[1], r[4]) for r in rows], summed,
                                        applied if applied_on else None, books=books_on).items():
            damaged.setdefault(key, why)
        ends = {key: mark[0] for key, mark in marks.items()}
        for key, idx in index.items():
            if idx.starts:
                last = idx.starts[-1]
                ends[key] = max(ends.get(key, 0), last + idx.counts[last])
        self.index = index
        self.ends = ends
        self.damaged = damaged
        self.marks = marks
        self.digests = digests
        self.phantoms = set()
        self.applied = applied
        self.applied_on = applied_on
        self.books_on = books_on
        self.producers = producers
        self.producer_sums = producer_sums
        self._moved = set()
        self.row_sums = self.ROW_SUMS and level >= rowsums.LEVEL
        self.digests_on = self.ROW_SUMS and level >= rowsums.DIGEST_LEVEL
        hwm = meta.get("queue_id_hwm")
        self.queue_id_hwm = int(hwm) if hwm is not None and hwm.isdigit() else 0
        self.catalogue_misfit = self.catalogue.load(_query(conn), applied_on)

    def _part(self, key: Key) -> ChunkIndex:
        idx = self.index.get(key)
        if idx is None:
            idx = self.index[key] = ChunkIndex()
        return idx

    def apply(self, conn: Executor, ops: list[WriteOp]) -> int:
        """Write ``ops`` in the open transaction; the message bytes written (chunk payloads)."""
        written = 0
        chunks: list[tuple[int, int, int, int, bytes]] = []
        ends: dict[Key, int] = {}
        delivered: dict[Key, int] = {}
        # Settlements and producer positions of a batch are merged before they are written:
        # a batch of held applies (the replication driver's HOLD_APPLY) carries hundreds of
        # acks, mostly consecutive, and a position per publish of each producer; a row per
        # range and one per producer say the same.
        settled: dict[Key, IntervalSet] = {}
        touched: dict[Key, list[tuple[int, int]]] = {}  # settled ranges, for _compact
        counts: list[tuple[int, int, int, int]] = []
        producers: dict[tuple[int, int, str], int] = {}
        unwritten: set[tuple[int, int, int]] = set()  # chunks of this batch never written
        wrote_counts = False

        def flush() -> None:
            nonlocal wrote_counts, written
            if chunks:
                # a chunk settled whole in this same batch is never written (compaction would
                # delete it in this transaction anyway), nor deleted
                live = []
                for c in chunks:
                    if self.index[(c[0], c[1])].settled.covers(c[2], c[2] + c[3]):
                        unwritten.add((c[0], c[1], c[2]))
                        self.phantoms.add((c[0], c[1], c[2]))
                    else:
                        live.append(c)
                        # (the same start again after a reset in this batch: this one has a row)
                        unwritten.discard((c[0], c[1], c[2]))
                        self.phantoms.discard((c[0], c[1], c[2]))
                if live:
                    written += sum(len(c[4]) for c in live)
                    conn.exec_driver_sql(sql.INSERT_CHUNK, [(*c, zlib.crc32(c[4])) for c in live])
                    for c in live:
                        self._hash((c[0], c[1]), c[2], c[3])
                chunks.clear()
            if self.ROW_SUMS and (ends or delivered):
                conn.exec_driver_sql(sql.UPSERT_MARKS, self._marks(ends, delivered))
                ends.clear()
                delivered.clear()
            if ends:
                conn.exec_driver_sql(self.UPSERT_END, [(q, p, e) for (q, p), e in ends.items()])
                ends.clear()
            if delivered:
                conn.exec_driver_sql(self.UPSERT_DELIVERED, [(q, p, e) for (q, p), e in delivered.items()])
                delivered.clear()
            if counts:
                if self.books_on:
                    self._count(conn, counts)
                conn.exec_driver_sql(sql.UPSERT_COUNT, [(*c, self._crc(*c)) for c in counts])
                counts.clear()
                wrote_counts = True
            if settled:
                conn.exec_driver_sql(sql.INSERT_SETTLED, [(q, p, s, e, self._crc(q, p, s, e))
                                                       for (q, p), ranges in settled.items() for s, e in ranges])
                for key, ranges in settled.items():
                    touched.setdefault(key, []).extend(ranges)
                    if self.books_on:
                        self.books.settled(key, ranges)
                settled.clear()
            if producers:
                conn.exec_driver_sql(sql.UPSERT_PRODUCER, [(q, p, pid, seq, self._crc(q, p, pid, seq))
                                                        for (q, p, pid), seq in producers.items()])
                for (q, p, pid), seq in producers.items():
                    self._producer((q, p), pid, seq)
                producers.clear()

        for op in ops:
            kind = type(op)
            if kind is Append:
                key = (op.queue_id, op.partition)  # type: ignore[union-attr]
                idx = self._part(key)
                msgs = op.messages  # type: ignore[union-attr]
                if type(msgs) is PackedRun:  # from a log entry: already in the chunk format
                    if msgs.length:
                        chunks.append((key[0], key[1], msgs.start, msgs.length, msgs.payload))
                        idx.add_chunk(msgs.start, msgs.length)
                else:
                    for run in _runs(msgs):
                        start = run[0].offset
                        chunks.append((key[0], key[1], start, len(run), pack_run(run)))
                        idx.add_chunk(start, len(run))
                ends[key] = max(ends.get(key, 0), op.next_offset)  # type: ignore[union-attr]
                self.ends[key] = max(self.ends.get(key, 0), op.next_offset)  # type: ignore[union-attr]
            elif kind is Settle:
                key = (op.queue_id, op.partition)  # type: ignore[union-attr]
                idx = self._part(key)
                mine = settled.get(key)
                if mine is None:
                    mine = settled[key] = IntervalSet()
                for s, e in ranges_of(op.offsets):  # type: ignore[union-attr]
                    mine.add(s, e)
                    idx.settled.add(s, e)
            elif kind is MarkDelivered:
                key = (op.queue_id, op.partition)  # type: ignore[union-attr]
                delivered[key] = max(delivered.get(key, 0), op.upto)  # type: ignore[union-attr]
            elif kind is SetDeliveryCount:
                q, p = op.queue_id, op.partition  # type: ignore[union-attr]
                counts.extend((q, p, o, dc) for o, dc in op.items)  # type: ignore[union-attr]
            elif kind is PutProducer:
                producers[(op.queue_id, op.partition, op.producer_id)] = op.last_seq  # type: ignore[union-attr]
            else:
                flush()
                self._apply_structural(conn, op)
        flush()
        if touched:
            self._compact(conn, touched, unwritten, wrote_counts)
        if self.books_on:  # (their rows' digests cover the settled and count rows they wrote or deleted)
            self._moved |= self.books.moved
        self.books.moved.clear()
        if self._moved:  # (in the same transaction as the applied positions they cover)
            conn.exec_driver_sql(sql.UPSERT_MARKS, self._marks({}, {}, self._moved))
            self._moved.clear()
        if self.catalogue.moved:  # (the same: with the rows it sums up)
            self._put_meta(conn, catalogue_sum.KEY, str(self.catalogue.value))
            self.catalogue.moved = False
        return written

    def _compact(self, conn: Executor, touched: dict[Key, list[tuple[int, int]]],
                 unwritten: set[tuple[int, int, int]], wrote_counts: bool) -> None:
        """Delete chunks whose messages are all settled, and the bookkeeping below the log's start.
        ``unwritten``: chunks this transaction did not write (no row to delete; and no delivery
        counts either, unless it wrote some: a chunk's counts come after it)."""
        drop_chunks: list[tuple[int, int, int]] = []
        drop_counts: list[tuple[int, int, int, int]] = []
        drop_settled: list[tuple[int, int, int]] = []
        for key, ranges in touched.items():
            idx = self.index.get(key)
            if idx is None:
                continue
            for s, e in ranges:
                for start in idx.settled_chunks(s, e):
                    n = idx.counts[start]
                    idx.drop_chunk(start)
                    if (key[0], key[1], start) in self.phantoms:
                        self.phantoms.discard((key[0], key[1], start))
                    else:
                        self._hash(key, start, n)
                    if (key[0], key[1], start) not in unwritten:
                        drop_chunks.append((key[0], key[1], start))
                    elif not wrote_counts:
                        continue
                    drop_counts.append((key[0], key[1], start, start + n))
            low = idx.low(self.ends.get(key, 0))
            if len(idx.settled) and next(iter(idx.settled))[0] < low:
                idx.settled.drop_below(low)
                drop_settled.append((key[0], key[1], low))
        if drop_chunks:
            conn.exec_driver_sql(sql.DELETE_CHUNK, drop_chunks)
            if self.digests_on:  # (the rows' digests: those of this batch's appends are written already)
                conn.exec_driver_sql(sql.UPSERT_MARKS, self._marks({}, {}, {(q, p) for q, p, _s in drop_chunks}))
        # rows of settled wholly below the log's start go; a row straddling it stays (harmless)
        if not self.books_on:
            if drop_counts:
                conn.exec_driver_sql(sql.DELETE_COUNTS, drop_counts)
            if drop_settled:
                conn.exec_driver_sql(sql.DELETE_SETTLED_BELOW, drop_settled)
            return
        for q, p, start, end in drop_counts:  # (one by one: what each deletes comes out of the sums)
            self.books.counts_deleted((q, p), conn.exec_driver_sql(sql.DELETE_COUNTS_RETURNING, (q, p, start, end)))
        for q, p, low in drop_settled:
            self.books.settled((q, p), conn.exec_driver_sql(sql.DELETE_SETTLED_BELOW_RETURNING, (q, p, low)),
                               deleted=True)

    def _count(self, conn: Executor, counts: list[tuple[int, int, int, int]]) -> None:
        """The delivery counts about to be written, into the sums, each with the value its row
        holds (read first; a later one of the same offset in the batch replaces an earlier)."""
        was: dict[tuple[int, int, int], Any] = {}
        for q, p, o, dc in counts:
            if (q, p, o) not in was:
                row = conn.exec_driver_sql(sql.SELECT_COUNT, (q, p, o)).fetchone()
                was[(q, p, o)] = row[0] if row is not None else None
            self.books.counted((q, p), o, dc, was[(q, p, o)])
            was[(q, p, o)] = dc

    def _hash(self, key: Key, start: int, count: int) -> None:
        """A chunk row of ``key`` written or deleted: in or out of its digest."""
        self.digests[key] = self.digests.get(key, 0) ^ rowsums.chunk_hash(start, count)

    def _producer(self, key: Key, pid: str, seq: int | None) -> None:
        """Partition ``key``'s row of producer ``pid`` says ``seq`` now (None: deleted): out of and
        into its digest."""
        mine = self.producers.setdefault(key, {})
        was = mine.pop(pid, None)
        h = self.producer_sums.get(key, 0)
        if was is not None:
            h ^= rowsums.producer_hash(pid, was)
        if seq is not None:
            mine[pid] = seq
            h ^= rowsums.producer_hash(pid, seq)
        self.producer_sums[key] = h
        if self.applied_on:
            self._moved.add(key)

    def _marks(self, ends: dict[Key, int], delivered: dict[Key, int],
               also: Iterable[Key] = ()) -> list[tuple[int | None, ...]]:
        """The rows of ``partitions`` a batch's new ends and delivered marks make (each the higher
        of the stored one and the new), and those of ``also`` (their digests changed), with their
        digests and checksums; the writer's copy moves with them."""
        rows: list[tuple[int | None, ...]] = []
        for key in ends.keys() | delivered.keys() | set(also):
            end, dlv = self.marks.get(key, (0, 0))
            mark = self.marks[key] = (max(end, ends.get(key, 0)), max(dlv, delivered.get(key, 0)))
            digest = None
            if self.digests_on:
                digest = self.digests.get(key, 0)
                if self.applied_on:
                    digest ^= rowsums.applied_hash(*self.applied.get(key, (0, 0))) ^ self.producer_sums.get(key, 0)
                if self.books_on:
                    digest ^= self.books.sum(key)
            rows.append((*key, *mark, digest, rowsums.row_crc(*key, *mark, digest)))
        return rows

    def _put_meta(self, conn: Executor, key: str, value: str) -> None:
        if self.ROW_SUMS:
            conn.exec_driver_sql(self.PUT_META_SUMMED, (key, value, rowsums.row_crc(key, value)))
        else:
            conn.exec_driver_sql(self.PUT_META, (key, value))

    def _apply_structural(self, conn: Executor, op: WriteOp) -> None:
        self.catalogue.around(_query(conn), op, lambda: self._structural(conn, op))

    def _structural(self, conn: Executor, op: WriteOp) -> None:
        if isinstance(op, DropProducers):
            conn.exec_driver_sql("DELETE FROM producers WHERE queue_id = ? AND partition = ? AND producer_id = ?",
                                 [(op.queue_id, op.partition, pid) for pid in op.producer_ids])
            for pid in op.producer_ids:
                self._producer((op.queue_id, op.partition), pid, None)
            return
        if isinstance(op, PutQueue):
            q = op.queue
            row = (q.id, q.name, q.partitions, q.mapper, q.ring_size, q.max_deliveries,
                   q.dead_letter_queue, q.max_length, q.owner, q.max_length_bytes, q.overflow, q.message_ttl,
                   q.expires, q.type, q.max_age, q.max_bytes, q.dead_letter_exchange, q.dead_letter_routing_key)
            conn.exec_driver_sql(self.PUT_QUEUE, (*row, self._crc(*row)))
            # queue ids are never reused, even after the newest queue is deleted
            if self.ROW_SUMS:
                self.queue_id_hwm = max(self.queue_id_hwm, q.id)
                self._put_meta(conn, "queue_id_hwm", str(self.queue_id_hwm))
            else:
                conn.exec_driver_sql(self.QUEUE_ID_HWM, (str(q.id),))
        elif isinstance(op, DropQueue):
            for table in ("chunks", "settled", "counts", "partitions", "producers", "ha_state"):
                conn.exec_driver_sql(f"DELETE FROM {table} WHERE queue_id = ?", (op.queue_id,))
            conn.exec_driver_sql("DELETE FROM queues WHERE id = ?", (op.queue_id,))
            for key in [k for k in self.index if k[0] == op.queue_id]:
                del self.index[key]
                self.ends.pop(key, None)
            for key in [k for k in self.marks if k[0] == op.queue_id]:
                del self.marks[key]
            for key in [k for k in self.digests if k[0] == op.queue_id]:
                del self.digests[key]
            for key in [k for k in self.producers if k[0] == op.queue_id]:
                del self.producers[key]
                self.producer_sums.pop(key, None)
            self.phantoms = {c for c in self.phantoms if c[0] != op.queue_id}
            self.books.drop_queue(op.queue_id)
            for key in [k for k in self.applied if k[0] == op.queue_id]:
                del self.applied[key]
            self._moved = {k for k in self._moved if k[0] != op.queue_id}
        elif isinstance(op, Trim):
            key = (op.queue_id, op.partition)
            idx = self.index.get(key)
            if idx is not None:
                for start in [s for s in idx.starts if s + idx.counts[s] <= op.below]:
                    if (*key, start) in self.phantoms:
                        self.phantoms.discard((*key, start))
                    else:
                        self._hash(key, start, idx.counts[start])
                    idx.drop_chunk(start)
            conn.exec_driver_sql(sql.TRIM_CHUNKS, (*key, op.below))
            if self.digests_on:
                conn.exec_driver_sql(sql.UPSERT_MARKS, self._marks({}, {}, [key]))
        elif isinstance(op, LogCompact):
            snap = (op.queue_id, op.partition, op.upto, op.term, op.origin, int(op.weak), *op.recency)
            conn.exec_driver_sql(sql.UPSERT_SNAP, (*snap, self._crc(*snap)))
        elif isinstance(op, PutHardState):
            hard = (op.queue_id, op.partition, op.term, op.voted_for, op.commit)
            conn.exec_driver_sql(sql.UPSERT_HARD, (*hard, self._crc(*hard)))
        elif isinstance(op, PutApplied):
            applied = (op.queue_id, op.partition, op.index, op.term, op.origin)
            conn.exec_driver_sql(sql.UPSERT_APPLIED, (*applied, self._crc(*applied)))
            if op.queue_id:  # (the catalogue, queue 0, keeps no row of partitions)
                self.applied[(op.queue_id, op.partition)] = (op.index, op.term)
                if self.applied_on:
                    self._moved.add((op.queue_id, op.partition))
        elif isinstance(op, ResetPartition):
            key = (op.queue_id, op.partition)
            for table in ("chunks", "settled", "counts", "partitions", "producers"):
                conn.exec_driver_sql(f"DELETE FROM {table} WHERE queue_id = ? AND partition = ?", key)
            self.index.pop(key, None)
            self.ends.pop(key, None)
            self.marks.pop(key, None)
            self.digests.pop(key, None)
            self.producers.pop(key, None)
            self.producer_sums.pop(key, None)
            self.phantoms = {c for c in self.phantoms if c[:2] != key}
            self.books.drop(key)
            self.books.moved.discard(key)
            self._moved.discard(key)
            if self.applied_on and self.applied.get(key, (0, 0))[0]:  # (its row still covers its applied position)
                self._moved.add(key)
        elif isinstance(op, PutUser):
            u = op.user
            conn.exec_driver_sql(self.PUT_USER, (u.name, u.salt, u.hash, u.role, u.params,
                                                 self._crc(u.name, u.salt, u.hash, u.role, u.params)))
        elif isinstance(op, DropUser):
            conn.exec_driver_sql("DELETE FROM users WHERE name = ?", (op.name,))
            conn.exec_driver_sql("DELETE FROM acls WHERE username = ?", (op.name,))
        elif isinstance(op, GrantAcl):
            a = op.acl
            conn.exec_driver_sql(self.PUT_ACL, [(a.user, a.pattern, p, self._crc(a.user, a.pattern, p))
                                                for p in a.permissions])
        elif isinstance(op, RevokeAcl):
            a = op.acl
            conn.exec_driver_sql("DELETE FROM acls WHERE username = ? AND pattern = ? AND permission = ?",
                                 [(a.user, a.pattern, p) for p in a.permissions])
        elif isinstance(op, PutMeta):
            self._put_meta(conn, op.key, op.value)
            if op.key == rowsums.LEVEL_KEY and self.ROW_SUMS:
                sums, self.row_sums = self.row_sums, rowsums.at_level(op.value)
                if self.row_sums and not sums:  # (the rows written before it are summed as they stand)
                    rowsums.stamp_all(conn)
                level = rowsums.level_of(op.value)
                was = (self.digests_on, self.applied_on, self.books_on)
                self.digests_on = level >= rowsums.DIGEST_LEVEL
                self.applied_on = level >= rowsums.APPLIED_LEVEL
                self.books_on = level >= booksum.LEVEL
                if self.books_on and not was[2]:  # (the rows written before it, this batch's too, as they stand)
                    self.books.load(conn.exec_driver_sql)
                if self.digests_on and was != (self.digests_on, self.applied_on, self.books_on):
                    # (each partition's chunks, applied position and other rows as they stand)
                    keys = (self.digests.keys() | self.marks.keys() | {k for k, a in self.applied.items() if a[0]}
                            | {k for k, mine in self.producers.items() if mine} | self.books.sums.keys())
                    conn.exec_driver_sql(sql.UPSERT_MARKS, self._marks({}, {}, keys))
                if self.applied_on and self.catalogue.value is None:  # (the catalogue's rows as they stand)
                    self.catalogue.start(_query(conn))
        elif isinstance(op, DropMeta):
            conn.exec_driver_sql("DELETE FROM meta WHERE key = ?", (op.key,))
        else:
            raise StorageError(f"unknown write op {type(op).__name__}")
