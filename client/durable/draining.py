"""The durable producer's local buffer side: sends made while no node is reachable go
to a SQLite file (:mod:`client.buffer`), and drain from it, in order, ahead of later
sends.

A buffered message's (partition, seq) is written to its row before it first goes out
(:meth:`PartitionPipeline.next_step` says ``RECORD``), so a process that dies
mid-drain leaves rows a new one (same path, same producer id) resends under the same
sequence, stored once; those rows are settled by a probe first
(:meth:`PartitionPipeline.resume`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

from client.buffer import Buffered, SendBuffer
from client.durable.events import ConnectionEvent, SendResult
from client.durable.links import DurableLinks
from client.durable.pipeline import Item, PartitionPipeline
from client.mapper import DataMapper
from client.protocol.frames import PublishMessage
from client.errors import TandemError

log = logging.getLogger("tandem.client")


class BufferDrain:
    """The buffer half of :class:`~client.durable.producer.DurableProducer` (a mixin: the
    attributes below are the producer's)."""

    conn: DurableLinks
    queue: str
    producer_id: str
    buffer: SendBuffer | None
    buffered: int
    _parts: list[PartitionPipeline]
    _mapper: DataMapper | None
    _draining: bool
    _drained: asyncio.Event
    _wake: asyncio.Event
    _loaded_upto: int
    _appending: int
    _stopped: TandemError | None

    def _spawn(self, coro: Awaitable[Any]) -> None:
        raise NotImplementedError

    def _maybe_idle(self) -> None:
        raise NotImplementedError

    async def wait_drained(self, timeout: float | None = None) -> None:
        """Until the local buffer is empty: every buffered message sent and confirmed."""
        clock = self.conn.clock
        async with clock.timeout(timeout):
            while self._draining and self._stopped is None:
                self._drained.clear()
                try:
                    async with clock.timeout(0.5):
                        await self._drained.wait()
                except TimeoutError:
                    pass

    @property
    def buffered_count(self) -> int:
        """Messages waiting in the local buffer."""
        return self.buffer.count if self.buffer is not None else 0

    async def _to_buffer(self, item: Item) -> SendResult:
        assert self.buffer is not None
        m = item.msg
        try:
            await asyncio.to_thread(self.buffer.append, m.key, m.headers, m.body)
        finally:
            self._appending -= 1
            self._wake.set()
        self.buffered += 1
        return SendResult(-1, -1, buffered=True)

    def _forget_buffered(self, items: list[Item]) -> None:
        """Confirmed: their rows go."""
        ids = [it.buf_id for it in items if it.buf_id is not None]
        if ids and self.buffer is not None:
            self._spawn(self._remove_rows(ids))

    async def _remove_rows(self, ids: list[int]) -> None:
        assert self.buffer is not None
        await asyncio.to_thread(self.buffer.remove, ids)
        self._check_drained()

    def _check_drained(self) -> None:
        """The buffer is empty and nothing of it is in flight: say so, once."""
        assert self.buffer is not None
        if self.buffer.count == 0 and self._draining and not self._appending and \
                not any(it.buf_id is not None for p in self._parts for it in p.items()):
            self._draining = False
            self.conn._emit(ConnectionEvent("drained", "", f"{self.queue}: the local buffer is empty"))
            self._maybe_idle()

    async def _drain(self) -> None:
        """Load the local buffer into the partitions' pipelines, ahead of later sends."""
        assert self.buffer is not None and self._mapper is not None
        rows: list[Buffered] = await asyncio.to_thread(self.buffer.load, self._loaded_upto)
        if rows:
            self._loaded_upto = rows[-1].id
        if not rows:
            self._check_drained()
            return
        log.info("producer %s: draining %d buffered messages of %s", self.producer_id, len(rows), self.queue)
        for r in rows:
            it = Item(PublishMessage(r.key, r.headers, r.body, r.seq), None, float("inf"), buf_id=r.id)
            if r.partition is not None and r.seq is not None:
                # numbered (and maybe sent) by an earlier run: a probe settles it first
                it.buf_at = (r.partition, r.seq)
                self._parts[r.partition].resume(it)
            else:
                self._parts[self._mapper.partition(r.key)].assign_buffered(it)
