"""Producer expiry: producers idle longer than ``producer_expiry`` are forgotten in the
partitions served here (a replicated op: every copy forgets them), so short-lived producer
ids (a Spark task, a process that restarts) do not pile up for ever."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from broker.messaging import sequences
from broker.messaging.commit import CommitPath
from broker.messaging.queues import Queue
from client.clock import Clock
from storage.base import DropProducers

log = logging.getLogger("tandem.broker")

#: at most this many producers of a partition are forgotten in one op
BATCH = 1000


class ProducerExpiry:
    def __init__(self, queues: Callable[[], Mapping[str, Queue]], serves: Callable[[Queue, int], bool],
                 commit: Callable[[], CommitPath], clock: Clock, expiry: float) -> None:
        self._queues, self._serves, self._commit = queues, serves, commit
        self.clock, self.expiry = clock, expiry

    async def run(self) -> None:
        """Every ``min(60 s, expiry / 4)``, until cancelled (the node's task owner ends it)."""
        while True:
            await self.clock.sleep(min(60.0, self.expiry / 4))
            self.sweep(self.clock.monotonic())

    def sweep(self, now: float) -> None:
        for q in list(self._queues().values()):
            for pidx, part in enumerate(q.partitions):
                if self._serves(q, pidx):
                    idle = sequences.idle_producers(part, now, self.expiry)
                    if idle:
                        self._drop(q, pidx, idle[:BATCH], now)

    def _drop(self, q: Queue, pidx: int, pids: list[str], decided: float) -> None:
        part, expiry = q.partitions[pidx], self.expiry

        def done(err: BaseException | None) -> None:
            if err is not None:
                log.warning("expiring %d producers of %s/%d failed: %s", len(pids), q.name, pidx, err)
                return
            sequences.forget(part, pids, decided - expiry)
            log.info("forgot %d producer(s) of %s/%d idle for over %.0f s", len(pids), q.name, pidx, expiry)

        self._commit().propose([DropProducers(q.meta.id, pidx, pids)], done)
