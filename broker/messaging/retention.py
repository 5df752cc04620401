"""A stream's retention: the partitions served here drop their oldest chunks, whole, once they
are older than the stream's ``max_age`` or past its ``max_bytes``.

Every ``RETENTION_INTERVAL`` the active of each stream partition with a bound looks at the
chunks its store holds (start, count, bytes: ``Engine.chunks``) and proposes ``Trim`` below
the end of the last chunk that may go: a replicated op, so every copy drops the same
messages, and a new active continues from what the log holds.

* ``max_bytes``: the newest chunks are kept while their bytes add up to at most
  ``max_bytes``; every older chunk goes (the newest chunk always stays).
* ``max_age``: a chunk goes once the first message of the chunk *after* it was stored more
  than ``max_age`` ago, so every message in it is older.  Times are the active's clock when
  it stored each message; the check reads one message per chunk (a binary search).

A read from an offset that was dropped starts at the oldest message held; Spark's source
reports the gap (``failOnDataLoss``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Protocol

from broker.messaging.commit import CommitPath
from broker.messaging.queues import Queue
from client.clock import Clock
from storage.base import Engine, Trim

log = logging.getLogger("tandem.broker")

#: seconds between two looks at the streams' chunks
RETENTION_INTERVAL = 5.0


class RetentionHost(Protocol):
    @property
    def commit(self) -> CommitPath: ...

    @property
    def engine(self) -> Engine: ...


def cut(engine: Engine, queue_id: int, partition: int, max_age_ms: int, max_bytes: int, now: float) -> int:
    """The offset below which a partition's chunks may go (0: none may); reader thread."""
    chunks = engine.chunks(queue_id, partition)
    if len(chunks) < 2:
        return 0
    keep = len(chunks) - 1  # index of the oldest chunk kept
    if max_bytes:
        held = chunks[-1][2]
        while keep > 0 and held + chunks[keep - 1][2] <= max_bytes:
            keep -= 1
            held += chunks[keep][2]
    if max_age_ms:
        cutoff = now - max_age_ms / 1000
        lo, hi = 1, len(chunks)  # the first chunk, after the oldest, whose first message is not older
        while lo < hi:
            mid = (lo + hi) // 2
            first = engine.read(queue_id, partition, chunks[mid][0], 1)
            if first and first[0].ts < cutoff:
                lo = mid + 1
            else:
                hi = mid
        keep = min(keep, lo - 1)  # chunk lo - 1 has a message that may not be old enough
    if keep == 0:
        return 0
    start, count, _ = chunks[keep - 1]
    return start + count


class Retention:
    def __init__(self, queues: Callable[[], Mapping[str, Queue]], serves: Callable[[Queue, int], bool],
                 host: RetentionHost, clock: Clock, interval: float = RETENTION_INTERVAL) -> None:
        self._queues, self._serves, self._host = queues, serves, host
        self.clock, self.interval = clock, interval
        self._trimming: set[tuple[int, int]] = set()  # partitions whose Trim is under way

    async def run(self) -> None:
        """Every ``interval``, until cancelled (the node's task owner ends it)."""
        while True:
            await self.clock.sleep(self.interval)
            await self.sweep()

    async def sweep(self) -> None:
        for q in list(self._queues().values()):
            meta = q.meta
            if not q.stream or not (meta.max_age or meta.max_bytes):
                continue
            for pidx in range(len(q.partitions)):
                key = (meta.id, pidx)
                if key in self._trimming or not self._serves(q, pidx):
                    continue
                below = await asyncio.to_thread(cut, self._host.engine, meta.id, pidx, meta.max_age,
                                                meta.max_bytes, self.clock.time())
                if below and not q.deleted and self._serves(q, pidx):
                    self._trim(q, pidx, below)

    def _trim(self, q: Queue, pidx: int, below: int) -> None:
        key = (q.meta.id, pidx)
        self._trimming.add(key)

        def done(err: BaseException | None) -> None:
            self._trimming.discard(key)
            if err is not None:
                log.warning("retention of %s/%d below offset %d failed: %s", q.name, pidx, below, err)
            else:
                log.info("retention: %s/%d dropped its chunks below offset %d", q.name, pidx, below)

        self._host.commit.propose([Trim(q.meta.id, pidx, below)], done)
