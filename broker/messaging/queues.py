"""In-memory queue state: partitions of ready messages, consumers, counters.

A :class:`Queue` is split into :class:`Partition` objects by its data mapper.
Each partition keeps its *ready* messages in offset order; a message handed to
a consumer leaves ``ready`` and is held by the consumer's session until it is
settled (ack / reject -> gone; nack(requeue) or a dead session -> back into
``ready`` at its offset position).  Nothing here does I/O: :mod:`broker.node.node`
turns these changes into store write ops and frames.

Memory is bounded (``max_memory``, :class:`MemoryBudget`): a partition keeps its ready
messages in memory up to its share of the budget (the *hot head*); the ones after
them are a *cold region* of offsets [cold_start, cold_end) that are in the store only,
counted but not held.  Every ready offset in memory is below ``cold_start``, and while a
cold region exists newly committed messages extend it, so offset order is kept.  The
delivery path reads a cold region back in batches (:meth:`Queue.begin_refill`,
:meth:`Queue.end_refill`) as the hot head runs low (docs/architecture.md, "Backlogs
larger than memory").
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from broker.messaging import prepared
from broker.messaging.mapper import DataMapper, queue_mapper
from broker.messaging.message import (MESSAGE_OVERHEAD, MemoryBudget, Msg, Partition, decode_headers, held_cost,
                                      msg_from_store, split_registers)
from broker.messaging.window import Window
from client.protocol.frames import QueueInfo
from storage.base import PartitionState, QueueMeta, StoredMessage
from storage.budget import MSG_MEMORY


class Recipient(Protocol):
    """A client session as consumers and delivery see it."""
    client_name: str
    consumers: dict[int, Consumer]
    deliveries: dict[int, tuple[Consumer, Msg]]

    @property
    def writable(self) -> bool: ...

    def deliver(self, c: Consumer, msgs: list[Msg]) -> None: ...

    def cancelled_by_broker(self, c: Consumer, reason: str) -> None: ...

class Consumer:
    __slots__ = ("id", "queue", "session", "prefetch", "unacked", "relayed", "exclusive")

    def __init__(self, id: int, queue: Queue, session: Recipient, prefetch: int, exclusive: bool = False) -> None:
        self.id = id
        self.queue = queue
        self.session = session
        self.prefetch = prefetch
        self.unacked = 0
        #: the queue's only consumer: no other is taken on this member while it lasts
        self.exclusive = exclusive
        #: held here for a client of another member (broker.sessions.relayed): not counted as a consumer
        self.relayed = False

    @property
    def credit(self) -> int:
        return self.prefetch - self.unacked


#: a refill starts when a partition's hot head holds fewer bytes than this (or its share / 4)
REFILL_LOW = 4 * 1024 * 1024
#: a refill reads about this many bytes (at most the partition's share / 2)
REFILL_BYTES = 8 * 1024 * 1024
MAX_REFILL_MESSAGES = 65536


class Queue:
    def __init__(self, meta: QueueMeta, budget: MemoryBudget | None = None) -> None:
        self.meta = meta
        self.budget = budget if budget is not None else MemoryBudget()
        self.budget.partitions += meta.partitions
        self.cold_count = 0  # ready messages in the partitions' cold regions
        self.partitions = [Partition(i) for i in range(meta.partitions)]
        self.mapper: DataMapper = queue_mapper(meta.name, meta.mapper, meta.partitions, meta.ring_size)
        self.consumers: list[Consumer] = []
        self.ready_count = 0
        self.unacked_count = 0
        self.pending_count = 0  # appended, not yet committed (SYNC / WRITE_NO_SYNC)
        self.published = 0
        self.delivered = 0
        self.acked = 0
        self.delayed_count = 0  # messages not due yet (Partition.delayed)
        self.expired = 0  # messages that expired here, never delivered (counted since this node started)
        #: a message with its own expiration was held here: the expiry sweep looks at this queue
        self.expiring = False
        #: the time messages are due and expire by (the node's clock; broker.messaging.timing)
        self.now: Callable[[], float] = time.time
        #: and the time it was last used here (broker.partitions.unused): a consumer came or went,
        #: a get, a declare
        self.monotonic: Callable[[], float] = time.monotonic
        self.last_used = self.monotonic()
        self._next_partition = 0
        self._next_consumer = 0
        self.deleted = False
        #: declared auto-delete on this node (broker.amqp): deleted once its last consumer here goes
        self.auto_delete = False
        #: partitions whose messages are being re-mapped (broker.partitions.remap): they deliver nothing
        self.paused: frozenset[int] = frozenset()

    @property
    def name(self) -> str:
        return self.meta.name

    @property
    def stream(self) -> bool:
        """Its messages stay, read by offset, until its retention drops them (broker.messaging.retention)."""
        return self.meta.type == "stream"

    def alter(self, meta: QueueMeta) -> None:
        """The queue got more partitions or another data mapper (broker.partitions.remap): the new
        partitions start empty, and the mapper places what is published from now on."""
        added = meta.partitions - len(self.partitions)
        self.partitions.extend(Partition(i) for i in range(len(self.partitions), meta.partitions))
        self.budget.partitions += max(0, added)
        self.meta = meta
        self.mapper = queue_mapper(meta.name, meta.mapper, meta.partitions, meta.ring_size)

    def load_partition(self, pidx: int, st: PartitionState, *, messages: bool = True,
                       windows: Mapping[str, Window] | None = None, ready: list[Msg] | None = None) -> None:
        """The partition as the store has it (at start, or when this node becomes its active):
        offsets, producer sequences (and the seqs ``windows`` has of each:
        broker.messaging.sequences) and, with ``messages``, its ready messages (those past the
        memory budget as a cold region; ``ready``: ``st.messages`` made into messages already,
        off the loop)."""
        part = self.partitions[pidx]
        self.clear_partition(pidx)
        part.next_offset = part.committed_end = st.next_offset
        part.marked_upto = part.cold_mark = st.delivered_upto
        producers, part.offsets, registers = split_registers(st.producers)
        # the registers are the active's (a member loading its store at start holds none until it
        # serves the partition): what transactions in doubt hold counts on the active alone
        part.registers = registers if messages else {}
        if prepared.index(part, self.monotonic()):  # (transactions in doubt: their messages stay aside)
            self.pending_count += prepared.held(part)
            self.unacked_count += prepared.held_acks(part)
        part.producers = dict(producers)
        part.committed_producers = producers
        if windows:
            part.seen = {pid: w.copy() for pid, w in windows.items()}
        if messages and not self.stream:  # (a stream's messages are read from the store, never held)
            self.add_ready(part, ready if ready is not None else [msg_from_store(pidx, m) for m in st.messages])
            st.messages = []
            if st.cold_count:
                self._extend_cold(part, st.cold_start, st.cold_end, st.cold_count, st.cold_bytes)

    def clear_partition(self, pidx: int) -> None:
        """Forget the partition's ready messages and producers (another node serves it now)."""
        part = self.partitions[pidx]
        part.generation += 1
        self.ready_count -= len(part.ready)
        part.ready.clear()
        self.delayed_count -= len(part.delayed)
        part.delayed = []
        self.budget.held -= part.held
        part.held = 0
        self._drop_cold(part)
        part.producers = {}
        part.committed_producers = {}
        part.gaps = {}
        part.filling = {}
        part.seen = {}
        part.producer_used = {}
        part.offsets = {}
        # (what transactions in doubt hold is counted while their registers are: broker.messaging.prepared)
        self.pending_count -= prepared.held(part)
        self.unacked_count -= prepared.held_acks(part)
        part.txs = {}
        part.tx_offsets = {}
        part.registers = {}

    def release(self) -> None:
        """The queue is deleted: give its memory back to the budget."""
        for p in self.partitions:
            self.budget.held -= p.held
            p.held = 0
            self._drop_cold(p)
            p.ready.clear()
            p.delayed = []
        self.ready_count = self.delayed_count = 0
        self.budget.partitions -= self.meta.partitions

    # -- the cold region ------------------------------------------------------------------------

    def _extend_cold(self, part: Partition, start: int, end: int, count: int, nbytes: int) -> None:
        if not part.cold_count:
            part.cold_start, part.cold_end = start, end
        else:
            part.cold_start = min(part.cold_start, start)
            part.cold_end = max(part.cold_end, end)
        part.cold_count += count
        part.cold_bytes += nbytes
        self.cold_count += count
        self.ready_count += count
        self.budget.cold += count
        self.budget.cold_bytes += nbytes

    def _drop_cold(self, part: Partition) -> tuple[int, int, int, int]:
        """Forget the cold region (its messages stay in the store); what it was."""
        was = (part.cold_start, part.cold_end, part.cold_count, part.cold_bytes)
        self.cold_count -= part.cold_count
        self.ready_count -= part.cold_count
        self.budget.cold -= part.cold_count
        self.budget.cold_bytes -= part.cold_bytes
        part.cold_start = part.cold_end = part.cold_count = part.cold_bytes = 0
        part.epoch += 1
        part.reading = False
        return was

    def restore_cold(self, part: Partition, was: tuple[int, int, int, int]) -> None:
        """Put back a cold region :meth:`take_cold` took (its purge failed)."""
        if not was[2]:
            return
        start, end, count, nbytes = was
        ready = part.ready
        while ready and ready[-1].offset >= start:  # arrived since: after the region, so cold too
            m = ready.pop()
            cost = held_cost(m)
            part.held -= cost
            self.budget.held -= cost
            self.ready_count -= 1
            end = max(end, m.offset + 1)
            count += 1
            nbytes += cost - MSG_MEMORY
        self._extend_cold(part, start, end, count, nbytes)

    def take_cold(self, part: Partition) -> tuple[int, int, int, int]:
        """Drop the cold region (a purge settles it): (start, end, count, bytes)."""
        return self._drop_cold(part)

    def forget_cold(self, part: Partition, msgs: list[Msg]) -> None:
        """``msgs`` of the cold region are settled (re-mapped elsewhere, broker.partitions.remap)."""
        n = min(len(msgs), part.cold_count)
        nbytes = sum(len(m.body) + len(m.headers_blob) for m in msgs)
        part.cold_count -= n
        part.cold_bytes = max(0, part.cold_bytes - nbytes)
        self.cold_count -= n
        self.ready_count -= n
        self.budget.cold -= n
        self.budget.cold_bytes -= min(nbytes, self.budget.cold_bytes)
        if not part.cold_count:
            part.cold_start = part.cold_end = part.cold_bytes = 0

    def wants_refill(self, part: Partition) -> bool:
        if not part.cold_count or part.reading:
            return False
        share = self.budget.share()
        low = min(REFILL_LOW, share // 4) if share else REFILL_LOW
        return part.held < low

    def begin_refill(self, part: Partition) -> tuple[int, int, int]:
        """A read of the cold region starts: (epoch, from offset, how many messages)."""
        part.reading = True
        share = self.budget.share()
        room = min(REFILL_BYTES, share // 2) if share else REFILL_BYTES
        avg = part.cold_bytes // max(1, part.cold_count) + MSG_MEMORY
        limit = max(1, min(MAX_REFILL_MESSAGES, room // max(1, avg)))
        return part.epoch, part.cold_start, limit

    def end_refill(self, part: Partition, epoch: int, stored: list[StoredMessage], limit: int,
                   stored_end: int) -> bool:
        """The read of :meth:`begin_refill` returned ``stored`` (up to ``limit`` messages from
        its offset on; the store held offsets below ``stored_end``): they join the hot head.
        False if it brought nothing (the store has not caught up yet) or is stale."""
        if epoch != part.epoch:
            return False
        part.reading = False
        bound = min(stored_end, part.cold_end)
        kept = [m for m in stored if m.offset < bound]
        if kept and len(kept) == len(stored) and len(stored) >= limit:
            new_start = kept[-1].offset + 1
        else:
            new_start = max(bound, part.cold_start)
        pidx, mark = part.index, part.cold_mark
        msgs = [Msg(pidx, m.offset, m.key, decode_headers(m.headers_blob), m.headers_blob, m.body,
                    m.producer_id, m.seq, m.ts, m.dc + (1 if m.offset < mark else 0)) for m in kept]
        nbytes = sum(len(m.body) + len(m.headers_blob) for m in msgs)
        n = min(len(msgs), part.cold_count)
        part.cold_count -= n
        part.cold_bytes = max(0, part.cold_bytes - nbytes)
        self.cold_count -= n
        self.budget.cold -= n
        self.budget.cold_bytes -= min(nbytes, self.budget.cold_bytes)
        ready = self._divert(part, msgs)  # (one not due yet was counted ready while cold)
        self.ready_count -= len(msgs) - len(ready)
        part.ready.extend(ready)
        cost = sum(len(m.body) + len(m.headers_blob) for m in ready) + MSG_MEMORY * len(ready)
        part.held += cost
        self.budget.held += cost
        moved = new_start > part.cold_start
        part.cold_start = new_start
        if part.cold_start >= part.cold_end and part.cold_count:
            # counted messages the store does not have (a write that failed): gone
            self._drop_cold(part)
        elif not part.cold_count:
            part.cold_start = part.cold_end = part.cold_bytes = 0
        return bool(msgs) or moved

    def mark_committed(self, by_part: dict[int, list[Msg]]) -> None:
        """These messages are in the store: stream reads may see them."""
        for pidx, msgs in by_part.items():
            part = self.partitions[pidx]
            end = msgs[-1].offset + 1
            if end > part.committed_end:
                part.committed_end = end

    @property
    def depth(self) -> int:
        return self.ready_count + self.unacked_count + self.pending_count + self.delayed_count

    def info(self) -> QueueInfo:
        m = self.meta
        return QueueInfo(
            m.name, m.partitions, m.mapper, m.ring_size, m.max_deliveries, m.dead_letter_queue,
            m.max_length, self.ready_count, self.unacked_count + self.pending_count,
            sum(not c.relayed for c in self.consumers), self.published, self.delivered, self.acked,
        )

    # -- ready messages -------------------------------------------------------------------

    def add_ready(self, partition: Partition, msgs: list[Msg]) -> None:
        """Messages in offset order, after every ready one: into memory while the
        partition's share of the budget lasts, else into the cold region.  Of those that stay
        in memory, the ones not due yet wait aside (``Partition.delayed``); a delayed message
        that goes cold is held aside when it is read back (every offset aside is below the cold
        region's)."""
        if not msgs or self.stream:  # (a stream's messages are read by offset, never delivered)
            return
        if partition.cold_count:
            self._extend_cold(partition, msgs[0].offset, msgs[-1].offset + 1, len(msgs),
                              sum(len(m.body) + len(m.headers_blob) for m in msgs))
            return
        share = self.budget.share()
        if share and partition.held + sum(held_cost(m) for m in msgs) > share:
            held, i = partition.held, 0
            for m in msgs:
                c = held_cost(m)
                if held + c > share and (held or i):
                    break
                held += c
                i += 1
            cold = msgs[i:]
            if cold:
                self._extend_cold(partition, cold[0].offset, cold[-1].offset + 1, len(cold),
                                  sum(len(m.body) + len(m.headers_blob) for m in cold))
            msgs = msgs[:i]
        msgs = self._divert(partition, msgs)
        cost = sum(len(m.body) + len(m.headers_blob) for m in msgs) + MSG_MEMORY * len(msgs)
        partition.ready.extend(msgs)
        partition.held += cost
        self.budget.held += cost
        self.ready_count += len(msgs)

    def take(self, n: int, max_bytes: int) -> list[Msg]:
        """Up to ``n`` ready messages whose bodies total at most ``max_bytes`` (but at
        least one message), taken round-robin over partitions in batches."""
        out: list[Msg] = []
        parts = self.partitions
        count = len(parts)
        empty_seen = 0
        i = self._next_partition
        share = max(1, n // count) if count > 1 else n
        size = 0
        freed = 0
        paused = self.paused
        while len(out) < n and empty_seen < count:
            part = parts[i]
            ready = part.ready
            if ready and i not in paused:
                empty_seen = 0
                took = 0
                for _ in range(min(share, n - len(out), len(ready))):
                    m = ready[0]
                    data = len(m.body) + len(m.headers_blob)
                    cost = data + len(m.key or "") + MESSAGE_OVERHEAD
                    if out and size + cost > max_bytes:
                        n = len(out)  # full: stop here
                        break
                    size += cost
                    took += data + MSG_MEMORY
                    out.append(ready.popleft())
                part.held -= took
                freed += took
            else:
                empty_seen += 1
            i = (i + 1) % count
        self._next_partition = i
        self.ready_count -= len(out)
        self.budget.held -= freed
        return out

    def take_oldest(self, count: int, nbytes: int) -> list[Msg]:
        """The oldest ready messages in memory (by publish time, over every partition not
        paused), until ``count`` messages and ``nbytes`` bytes of bodies and headers are taken,
        or none is left."""
        out: list[Msg] = []
        taken = 0
        heads = [p for p in self.partitions if p.ready and p.index not in self.paused]
        while heads and (len(out) < count or taken < nbytes):
            part = min(heads, key=lambda p: (p.ready[0].ts, p.index))
            m = part.ready.popleft()
            data = len(m.body) + len(m.headers_blob)
            part.held -= data + MSG_MEMORY
            self.budget.held -= data + MSG_MEMORY
            taken += data
            out.append(m)
            if not part.ready:
                heads.remove(part)
        self.ready_count -= len(out)
        return out

    @property
    def ready_bytes(self) -> int:
        """Bytes (bodies and headers) of the ready messages, in memory and cold."""
        return sum(p.held - MSG_MEMORY * len(p.ready) + p.cold_bytes for p in self.partitions)

    def requeue(self, msgs: list[Msg]) -> None:
        """Back among the ready messages at their offsets (one not due yet: aside again)."""
        by_part: dict[int, list[Msg]] = {}
        for m in msgs:
            by_part.setdefault(m.partition, []).append(m)
        for p, lst in by_part.items():
            part = self.partitions[p]
            lst = self._divert(part, lst)
            if not lst:
                continue
            before = part.held
            part.requeue(lst)
            self.budget.held += part.held - before
            self.ready_count += len(lst)

    def purge_ready(self) -> dict[int, list[Msg]]:
        """Drop every ready message in memory and every cold region; returns the ones in
        memory per partition."""
        removed: dict[int, list[Msg]] = {}
        for p in self.partitions:
            if p.ready:
                removed[p.index] = self.take_hot(p)
            self._drop_cold(p)
        return removed

    def take_hot(self, part: Partition) -> list[Msg]:
        """Drop the partition's ready messages in memory, and its delayed ones; returns them."""
        msgs = list(part.ready)
        part.ready.clear()
        self.ready_count -= len(msgs)
        self.budget.held -= part.held
        part.held = 0
        if part.delayed:
            msgs += sorted((m for _due, _offset, m in part.delayed), key=lambda m: m.offset)
            self.delayed_count -= len(part.delayed)
            part.delayed = []
        return msgs

    # -- time: delayed and expiring messages (broker.messaging.timing) ----------------------------

    def _divert(self, part: Partition, msgs: list[Msg]) -> list[Msg]:
        """Put aside the messages a transaction in doubt holds (``part.txs``: broker.messaging.prepared)
        and those not due yet (``part.delayed``); the others."""
        if part.tx_offsets:
            msgs = prepared.divert(part, msgs)
        if not any(m.due or m.expires for m in msgs):
            return msgs
        now, out = self.now(), []
        for m in msgs:
            self.expiring = self.expiring or bool(m.expires)
            if m.due > now:
                heapq.heappush(part.delayed, (m.due, m.offset, m))
                self.delayed_count += 1
            else:
                out.append(m)
        return out

    def promote(self, now: float) -> bool:
        """The delayed messages due by ``now`` become ready; whether any did."""
        moved = False
        for part in self.partitions:
            due = []
            while part.delayed and part.delayed[0][0] <= now:
                due.append(heapq.heappop(part.delayed)[2])
            if due:
                self.delayed_count -= len(due)
                self.requeue(due)
                moved = True
        return moved

    def expires_at(self, m: Msg) -> float:
        """When ``m`` expires in this queue (its own expiration or the queue's message_ttl); 0.0: never."""
        ttl = self.meta.message_ttl
        if not ttl:
            return m.expires
        by_queue = m.ts + ttl / 1000
        return min(m.expires, by_queue) if m.expires else by_queue

    def take_expired(self, now: float) -> list[Msg]:
        """The expired messages at the head of each partition's ready ones in memory (an expired
        message behind one that is not waits until it reaches the head, or a consumer's turn)."""
        out: list[Msg] = []
        for part in self.partitions:
            ready = part.ready
            while ready and 0 < self.expires_at(ready[0]) <= now:
                m = ready.popleft()
                cost = held_cost(m)
                part.held -= cost
                self.budget.held -= cost
                out.append(m)
        self.ready_count -= len(out)
        return out

    # -- consumers ------------------------------------------------------------------------

    def touch(self) -> None:
        """The queue is used now (broker.partitions.unused)."""
        self.last_used = self.monotonic()

    def usage(self) -> tuple[int, int]:
        """Its consumers here, and the milliseconds since it was last used here (0 while it has one)."""
        if self.consumers:
            return len(self.consumers), 0
        return 0, int((self.monotonic() - self.last_used) * 1000)

    def consumers_in_turn(self) -> list[Consumer]:
        cs = self.consumers
        if len(cs) <= 1:
            return list(cs)
        k = self._next_consumer % len(cs)
        self._next_consumer = k + 1
        return cs[k:] + cs[:k]
