"""The log files' oldest segment, and logs of partitions this node holds no replica of.

The oldest segment of the log's files goes once every entry in it is compacted
(storage/segments.py).  A partition that keeps it (a quiet one: it compacts only every
COMPACT_EVERY entries) is compacted past it here, once applied that far.  The log of a
partition this node holds no replica of is dropped: of a queue placed elsewhere now,
with its store rows; of a deleted queue (its deletion record did not reach the disk
before a crash), once the catalogue here is caught up.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from broker.config import NodeConfig
from broker.peers.codec import CATALOGUE, Key
from broker.modes.replicated.compaction import HOLD_BYTES, entry_bytes, still_needed, weak_cap
from broker.modes.replicated.host import Queues, StoreWriter
from broker.modes.replicated.partlog import PartLog, compacted
from storage.base import Engine, LogCompact, LogTruncate, PutApplied, ResetPartition, WriteOp

log = logging.getLogger("tandem.ha")

UNPIN_EVERY = 1.0  # how often (seconds)


def unpin_segments(logs: Mapping[Key, PartLog], hold: Callable[[PartLog, list[WriteOp], int], None],
                   streamed: Callable[[Key, Mapping[str, int]], int | None] = lambda _k, _p: None, *,
                   engine: Engine, writer: StoreWriter, queues: Queues, config: NodeConfig) -> None:
    """Compact the partitions that keep the oldest segment past it; drop the logs of
    partitions not held here.  ``hold`` queues a compaction behind the store writes it
    depends on, in order (apply.HeldWrites); ``streamed(key, progress)``: the index of a
    snapshot streamed to a replica that does not have it yet (its entries after are kept)."""
    pins = getattr(engine, "log_pins", None)
    if pins is None:
        return
    for key, top in pins().items():
        plog = logs.get(key)
        if plog is None:
            _drop_foreign_log(writer, queues, config.name, logs, key)
            continue
        r = plog.replica
        if r.snap_index >= top or r.applied < top or weak_cap(r, config.weak_hold_bytes)[0] < top:
            continue  # compacted already (not yet durably), not applied that far yet, or a weak active's
        need = still_needed(r, streamed(key, r.progress()))
        if need is not None and need < top and entry_bytes(r, need + 1, r.applied) <= HOLD_BYTES:
            continue  # a replica that answers still lacks them: it catches up first (as compact_upto)
        r.compact(top)
        plog.applied_bytes = entry_bytes(r, r.snap_index + 1, r.applied)
        hold(plog, [compacted(key, r)], 0)


def _drop_foreign_log(writer: StoreWriter, queues: Queues, me: str, logs: Mapping[Key, PartLog],
                      key: Key) -> None:
    if key == CATALOGUE:
        return
    qid, p = key
    if queues.by_id(qid) is not None:
        log.info("partition %d/%d: dropping its log and store rows on %s, which no longer holds a replica",
                 qid, p, me)
        writer.submit([ResetPartition(qid, p), LogCompact(qid, p, 0, 0, ""), PutApplied(qid, p, 0, 0, ""),
                       LogTruncate(qid, p, 0)], sync=False)
        return
    cat = logs[CATALOGUE].replica
    if cat.leader is not None and not cat.recovering and cat.applied >= cat.commit:
        log.info("partition %d/%d: dropping the log of a deleted queue on %s", qid, p, me)
        writer.submit([LogTruncate(qid, p, 0)], sync=False)
