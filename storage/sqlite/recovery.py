"""What opening the SQLite store recovers: the tables' contents (``load``) and each
partition's replication log from the segment files (``replay_log``), reconciled with
the store's compaction point and applied position (``usable``)."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterable
from typing import Any
from pathlib import Path

from sqlalchemy import Connection

from client.errors import StorageError
from storage.base import (
    LogCompact,
    LogRecord,
    LogState,
    PartitionState,
    QueueMeta,
    Recovered,
    UserRecord,
    AclRecord,
    WriteOp,
)
from storage.budget import memory_share
from storage.segments import SegmentLog, repair_key
from storage.sqlite import rowsums
from storage.sqlite.apply import OpApplier
from storage.sqlite.reads import DamagedChunk, PartitionFiller, check_chunk
from storage.sqlite.schema import READABLE, Key

log = logging.getLogger("tandem.storage")


def load(conn: Connection, path: Path, applier: OpApplier, budget: int = 0) -> Recovered:
    """Everything the tables hold; (re)loads the writer's index on the way.  With a
    ``budget`` (bytes, node-wide) each partition loads its share of messages, the rest is
    counted as a cold region (PartitionState)."""
    rec = Recovered()
    meta = conn.exec_driver_sql(rowsums.select("meta")).all()
    rec.meta = {row[0]: row[1] for row in meta}
    version = rec.meta.get("schema_version")
    if version not in READABLE:
        raise StorageError(f"store {path} has schema version {version}, this build reads {', '.join(sorted(READABLE))}: "
                           f"it was written by another build; start the node on that build (see docs/upgrades.md)")

    def fatal(table: str, row: Any) -> bool:
        """Whether a catalogue row fails its checksum (then noted: the node does not start,
        broker.node.recovery)."""
        bad = rowsums.damaged(table, row)
        for why in bad.values():
            rec.row_damage.append(f"store {path}: {why}")
            log.error("store %s: %s", path, why)
        return bool(bad)

    def repairable(key: Key, table: str, row: Any) -> bool:
        """Whether a row of a partition's copy fails its checksum (then noted: the partition is
        rebuilt from its group, or the node does not start)."""
        bad = rowsums.damaged(table, row)
        for why in bad.values():
            damage(key, why)
        return bool(bad)

    def damage(key: Key, why: str) -> None:
        """Noted: every damaged row is logged; the partition's first is what it is rebuilt for."""
        rec.store_damage.setdefault(key, f"store {path}: {why}")
        log.error("store %s: %s", path, why)

    for row in meta:
        fatal("meta", row)
    for row in conn.exec_driver_sql(rowsums.select("queues") + " ORDER BY id"):
        fatal("queues", row)
        rec.queues.append(QueueMeta(
            id=row[0], name=row[1], partitions=row[2], mapper=row[3], ring_size=row[4],
            max_deliveries=row[5], dead_letter_queue=row[6], max_length=row[7], owner=row[8],
            max_length_bytes=row[9], overflow=row[10], message_ttl=row[11], expires=row[12],
            type=row[13], max_age=row[14], max_bytes=row[15], dead_letter_exchange=row[16],
            dead_letter_routing_key=row[17],
        ))
    parts = rec.partitions

    def state(key: Key) -> PartitionState:
        st = parts.get(key)
        if st is None:
            st = parts[key] = PartitionState()
        return st

    for row in conn.exec_driver_sql(rowsums.select("partitions")):
        qid, p, nxt, delivered = row[:4]
        if not repairable((qid, p), "partitions", row):
            st = state((qid, p))
            st.next_offset, st.delivered_upto = nxt, delivered
    applier.reload(conn)
    for key, why in applier.damaged.items():
        damage(key, why)
    if applier.catalogue_misfit:  # (not rebuilt from the group, as a damaged catalogue row is not)
        rec.row_damage.append(f"store {path}: {applier.catalogue_misfit}")
        log.error("store %s: %s", path, applier.catalogue_misfit)
    counts: dict[Key, dict[int, int]] = {}
    for row in conn.exec_driver_sql(rowsums.select("counts")):
        qid, p, off, dc = row[:4]
        if not repairable((qid, p), "counts", row):
            counts.setdefault((qid, p), {})[off] = dc
    share = memory_share(budget, sum(q.partitions for q in rec.queues))
    fillers: dict[Key, PartitionFiller] = {}
    for qid, p, start, payload, crc in conn.exec_driver_sql(
        "SELECT queue_id, partition, start, payload, crc FROM chunks ORDER BY queue_id, partition, start"
    ):
        key = (qid, p)
        try:
            check_chunk(key, start, payload, crc)
        except DamagedChunk as exc:
            # none of the partition's messages are read: it is rebuilt from the group, or the node
            # does not start (broker.node.recovery); every damaged chunk is named
            damage(key, exc.message)
            fillers.pop(key, None)
            state(key).messages.clear()
            continue
        if key in rec.store_damage:
            continue
        filler = fillers.get(key)
        if filler is None:
            filler = fillers[key] = PartitionFiller(state(key), applier.index[key].settled, counts.get(key, {}),
                                                    share)
        filler.add(start, payload)
    for filler in fillers.values():
        filler.finish()
    for row in conn.exec_driver_sql(rowsums.select("producers")):
        qid, p, pid, last = row[:4]
        if not repairable((qid, p), "producers", row):
            state((qid, p)).producers[pid] = last
    for row in conn.exec_driver_sql(rowsums.select("users") + " ORDER BY name"):
        fatal("users", row)
        name, salt, hsh, role, params = row[:5]
        rec.users.append(UserRecord(name=name, salt=salt, hash=hsh, role=role, params=params))
    grants = conn.exec_driver_sql(rowsums.select("acls") + " ORDER BY username, pattern, permission").all()
    for row in grants:
        fatal("acls", row)
    rec.acls = acl_records(row[:3] for row in grants)
    # (ha_state's columns in rowsums.CHECKED's order: the hard state, the snapshot mark, the applied position)
    for row in conn.exec_driver_sql(rowsums.select("ha_state")):
        key = (row[0], row[1])
        for column, why in rowsums.damaged("ha_state", row).items():  # (the hard state stops the node)
            if column == "hard_crc":
                rec.row_damage.append(f"store {path}: {why}")
                log.error("store %s: %s", path, why)
            else:
                damage(key, why)
        rec.logs[key] = LogState(row[2], row[3], row[4], (row[5], row[6], row[7]), (row[11], row[12], row[13]),
                                 snap_weak=bool(row[8]), snap_recency=(row[9], row[10]))
    for key, where in rec.store_damage.items():
        rec.logs.setdefault(key, LogState()).store_damage = where
        if key in parts:
            parts[key].messages.clear()  # (none of a damaged copy is served)
    return rec


def acl_records(rows: Iterable[Any]) -> list[AclRecord]:
    """Rows of the ``acls`` table (one per permission), one record per (user, pattern)."""
    grouped: dict[tuple[str, str], list[str]] = {}
    for user, pattern, permission in rows:
        grouped.setdefault((user, pattern), []).append(permission)
    return [AclRecord(user=u, pattern=p, permissions=tuple(perms)) for (u, p), perms in grouped.items()]


def replay_log(segments: SegmentLog, raw: sqlite3.Connection, rec: Recovered, path: Path, *,
               clean: bool = False) -> list[WriteOp]:
    """Replay the log's segments into ``rec.logs``; first move a log kept in the
    ``ha_log`` table (a store of schema 3 written before the segment files) into them.
    ``clean``: the store and its log were closed when last open (SegmentLog.open).
    The store writes it leaves to the caller: after damage, the compaction points of the
    partitions whose entries were whole (:func:`whole`)."""
    replayed = segments.open(clean=clean)
    moved: list[WriteOp] = []
    if segments.damage:
        replayed, moved = whole(segments, rec, replayed)
    rows: dict[Key, list[LogRecord]] = {}
    for qid, p, idx, term, origin, weak, data in raw.execute(
        "SELECT queue_id, partition, idx, term, origin, weak, data FROM ha_log ORDER BY queue_id, partition, idx"
    ):
        rows.setdefault((qid, p), []).append(LogRecord(idx, term, origin, bool(weak), data))
    if rows:
        # Each partition's rows go in one record: after a crash here a partition is in
        # the segments whole or not at all, and the rows are still there either way.
        fresh = {key: recs for key, recs in rows.items() if key not in replayed}
        segments.write([["A", key[0], key[1], [[r.index, r.term, r.origin, r.weak, r.data] for r in recs]]
                        for key, recs in fresh.items()], sync=True)
        raw.execute("DELETE FROM ha_log")
        log.info("store %s: replication log of %d partition(s) moved from the ha_log table to %s",
                 path, len(fresh), segments.dir)
        replayed.update(fresh)
    for key, entries in replayed.items():
        st = rec.logs.setdefault(key, LogState())
        st.entries = usable(key, st, entries)
        # What it knew committed: the hard state's commit is written with a term or vote only
        # (and the applied position lags), the log's watermark with every append.
        st.commit = max(st.commit, min(segments.commits.get(key, 0), st.entries[-1].index if st.entries else 0))
        if st.entries and st.entries[-1].term > st.term:
            # The entries of a new term reached the log, its hard state did not (a crash
            # between the two writes of one batch; nothing was answered for it): the
            # term is the entries', and no vote was cast in it.
            st.term, st.voted_for = st.entries[-1].term, None
    for key, st in rec.logs.items():
        if key not in replayed and st.applied[0] > st.snapshot[0]:
            st.snapshot = st.applied  # (a log lost whole: the store is its own snapshot)
    if segments.damage:
        # the others go on from their store, and catch up from an active before they vote or
        # stand (broker.modes.replicated.reconcile)
        rec.log_damage = list(segments.damage)
        for key, st in rec.logs.items():
            st.damaged = key not in replayed
    for key, st in rec.logs.items():
        st.marked = rec.meta.get(repair_key(key)) == "1"
    return moved


def whole(segments: SegmentLog, rec: Recovered, replayed: dict[Key, list[LogRecord]]
          ) -> tuple[dict[Key, list[LogRecord]], list[WriteOp]]:
    """After damage: the partitions whose entries the damage cannot have touched
    (SegmentLog.intact), each with its entries above its store's applied position, written
    again to the log's new segment (the damaged ones go aside at the next write); their store
    stands as their snapshot (what the log held below it may be an older version of an entry
    whose newer one the damage took).  The writes that move their compaction points there."""
    kept: dict[Key, list[LogRecord]] = {}
    moved: list[WriteOp] = []
    for key, entries in replayed.items():
        st = rec.logs.setdefault(key, LogState())
        applied = st.applied[0]
        if not segments.intact(key, applied, entries):
            continue
        kept[key] = [e for e in entries if e.index > applied]
        if applied > st.snapshot[0]:
            st.snapshot = st.applied
            moved.append(LogCompact(key[0], key[1], *st.applied, st.snap_weak, st.snap_recency))
    segments.write([["A", key[0], key[1], [[r.index, r.term, r.origin, r.weak, r.data] for r in recs]]
                    for key, recs in kept.items() if recs], sync=True)
    segments.commits.clear()  # (a watermark read past damage may be an earlier queue's of the same id)
    log.warning("replication log %s: after its damage, %d of %d partition(s) have every entry they had; the "
                "others catch up from the group", segments.dir, len(kept), len(replayed))
    return kept, moved


def usable(key: Key, st: LogState, entries: list[LogRecord]) -> list[LogRecord]:
    """What of a replayed log a node can go on from, given its store's compaction point
    and applied position (``st.snapshot`` may move up to ``st.applied``).

    The log and the store are two files: after an OS crash the store can be on disk
    ahead of the log (its applied position past entries the log lost).  The store then
    stands as a snapshot at its applied position: the active's next append matches it
    by (index, term, origin) or, if the group went another way, sends a snapshot.  A
    hole or a term going back (stale entries after an installed snapshot whose log
    truncation did not reach the disk) ends the usable log: the active sends the rest
    again."""
    have = {e.index for e in entries}
    base, base_term = st.snapshot[0], st.snapshot[1]
    if st.applied[0] > base and any(i not in have for i in range(base + 1, st.applied[0] + 1)):
        log.warning("replication log of %d/%d ends before the store's applied position %d: the store stands "
                    "as the snapshot there", key[0], key[1], st.applied[0])
        st.snapshot = st.applied
        base, base_term = st.applied[0], st.applied[1]
    out: list[LogRecord] = []
    for e in entries:
        if e.index <= base:
            continue
        if e.index != base + 1 + len(out) or e.term < (out[-1].term if out else base_term):
            log.warning("replication log of %d/%d: entries from %d on do not follow on (a hole or an older "
                        "term); they are dropped, the active sends them again", key[0], key[1], e.index)
            break
        out.append(e)
    return out
