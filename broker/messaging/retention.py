"""A stream's retention: the partitions served here drop their oldest chunks, whole, once they
are older than the stream's ``max_age`` or past its ``max_bytes``.

Every ``RETENTION_INTERVAL`` the active of each stream partition with a bound looks at the
chunks its store holds (start, count, bytes: ``Engine.chunks``) and proposes ``Trim`` below
the end of the last chunk that may go: a replicated op, so every copy drops the same
messages, and a new active continues from what the log holds.

* ``max_bytes``: the newest chunks are kept while their bytes add up to at most
  ``max_bytes`` (from the store's chunk list: starts and sizes, no payload read); every older
  chunk goes (the newest chunk always stays).
* ``max_age``: every chunk that ends before the first message younger than ``max_age``
  goes (found by a binary search over the offsets: ``streams.offset_at``; a chunk holding
  both older and younger messages stays whole).  Times are the active's clock when it stored
  each message.

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
from broker.messaging.streams import offset_at
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


def cut(engine: Engine, queue_id: int, partition: int, end: int, max_age_ms: int, max_bytes: int,
        now: float) -> int:
    """The offset below which a partition's chunks may go (0: none may); reader thread."""
    below = 0
    if max_bytes:
        chunks = engine.chunks(queue_id, partition)
        keep, held = len(chunks) - 1, chunks[-1][2] if chunks else 0  # (the newest chunk stays)
        while keep > 0 and held + chunks[keep - 1][2] <= max_bytes:
            keep -= 1
            held += chunks[keep][2]
        if keep > 0:
            below = chunks[keep][0]
    if max_age_ms:
        below = max(below, offset_at(engine, queue_id, partition, end, now - max_age_ms / 1000))
    return min(below, max(0, end - 1))  # (the newest message stays)


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
                end = q.partitions[pidx].committed_end
                below = await asyncio.to_thread(cut, self._host.engine, meta.id, pidx, end, meta.max_age,
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
