"""One partition's send pipeline, sans-IO: the messages in sequence order and a state
machine that says what may go out next.

A durable producer numbers each partition's messages 0, 1, 2, ... and the node refuses
a batch that would leave a gap.  So once a batch fails, nothing more may go out until
every batch in flight is back and the partition has said where the sequence stands (a
*probe*: an empty publish); then everything unconfirmed goes again, renumbered from
there.  A probe, and the write of buffered messages' numbering to the local buffer,
each hold sends back while they run.  :data:`TRANSITIONS` is the whole of that, in one
table; an event the table does not allow raises :class:`~client.errors.LocalProtocolError`.

:class:`PartitionPipeline` does no I/O and reads no clock: the producer
(:mod:`client.durable.producer`) asks it what is due (:meth:`~PartitionPipeline.next_step`),
does the sending, probing and writing, and tells it what came of them.
"""

from __future__ import annotations

import itertools
import random
from collections import deque
from collections.abc import Iterator
from enum import Enum
from typing import TYPE_CHECKING

from client.clock import Backoff
from client.errors import LocalProtocolError
from client.protocol.frames import PublishMessage

if TYPE_CHECKING:
    import asyncio

    from client.durable.events import SendResult

FRAME_OVERHEAD = 64  # per-message msgpack overhead in a Publish frame, estimated generously


class SendState(Enum):
    #: batches go out (up to ``max_in_flight``)
    READY = "ready"
    #: buffered messages' (partition, seq) are being written to the local buffer: no sends
    RECORDING = "recording"
    #: that, and a batch failed meanwhile: once written, the partition settles
    RECORDING_FAILED = "recording_failed"
    #: a batch failed: nothing goes out until every batch in flight is back
    FAILED = "failed"
    #: ask the partition where the sequence stands before anything goes out
    PROBE_DUE = "probe_due"
    #: that probe is out
    PROBING = "probing"


class SendEvent(Enum):
    SEND = "send"  # a batch went out
    CONFIRMED = "confirmed"  # a batch came back confirmed
    FAILED = "failed"  # a batch failed, could not be sent, or went to a node that lost the partition
    ALL_BACK = "all_back"  # nothing is in flight any more (fired by the pipeline itself)
    RECORD = "record"  # a write of buffered messages' numbering starts
    RECORDED = "recorded"  # it ended (written or not)
    PROBE = "probe"  # the probe goes out
    PROBED = "probed"  # the partition said where the sequence stands
    PROBE_FAILED = "probe_failed"  # the probe got no answer it can use
    RESUME = "resume"  # buffered messages an earlier run numbered (and may have sent) are loaded


S, E = SendState, SendEvent

#: (state, event) -> next state; nothing else is allowed.
TRANSITIONS: dict[tuple[SendState, SendEvent], SendState] = {
    (S.READY, E.SEND): S.READY,
    (S.READY, E.CONFIRMED): S.READY,
    (S.READY, E.FAILED): S.FAILED,
    (S.READY, E.RECORD): S.RECORDING,
    (S.READY, E.RESUME): S.FAILED,
    (S.RECORDING, E.CONFIRMED): S.RECORDING,
    (S.RECORDING, E.FAILED): S.RECORDING_FAILED,
    (S.RECORDING, E.RECORDED): S.READY,
    (S.RECORDING_FAILED, E.CONFIRMED): S.RECORDING_FAILED,
    (S.RECORDING_FAILED, E.FAILED): S.RECORDING_FAILED,
    (S.RECORDING_FAILED, E.RECORDED): S.FAILED,
    (S.FAILED, E.CONFIRMED): S.FAILED,
    (S.FAILED, E.FAILED): S.FAILED,
    (S.FAILED, E.RESUME): S.FAILED,
    (S.FAILED, E.ALL_BACK): S.PROBE_DUE,
    (S.PROBE_DUE, E.RESUME): S.PROBE_DUE,
    (S.PROBE_DUE, E.PROBE): S.PROBING,
    (S.PROBING, E.PROBED): S.READY,
    (S.PROBING, E.PROBE_FAILED): S.PROBE_DUE,
}

#: a probe or a buffer write runs: the partition waits for it
BUSY = frozenset({S.RECORDING, S.RECORDING_FAILED, S.PROBING})
#: a failure is not settled yet (the probe numbers what comes after it)
UNSETTLED = frozenset({S.RECORDING_FAILED, S.FAILED, S.PROBE_DUE, S.PROBING})


class Step(Enum):
    """What :meth:`PartitionPipeline.next_step` says is due."""

    WAIT = "wait"
    PROBE = "probe"
    RECORD = "record"
    SEND = "send"


class Item:
    """One message in a pipeline, with who waits for it."""

    __slots__ = ("msg", "fut", "deadline", "sent", "buf_id", "buf_at", "partition", "size")

    def __init__(self, msg: PublishMessage, fut: asyncio.Future[SendResult] | None, deadline: float,
                 buf_id: int | None = None) -> None:
        self.msg = msg
        self.fut = fut  # None: nobody waits (a buffered message, or its sender timed out)
        self.deadline = deadline
        self.sent = False  # may have reached a node
        self.buf_id = buf_id  # its row in the local buffer
        self.buf_at: tuple[int, int] | None = None  # (partition, seq) as written in that row
        self.partition = -1
        size = len(msg.body) + FRAME_OVERHEAD  # what it adds to a Publish frame
        if msg.key:
            size += len(msg.key.encode())
        if msg.headers:
            size += sum(len(k.encode()) + len(v.encode()) + 10 for k, v in msg.headers.items())
        self.size = size

    def unrecorded(self, partition: int) -> bool:
        """A buffered message whose numbering is not yet in its row: it may not go out."""
        return self.buf_id is not None and self.buf_at != (partition, self.msg.seq)


class PartitionPipeline:
    """One partition's messages: ``unsent`` in sequence order, the batches in flight
    (``flying``), and the messages of failed batches (``back``) waiting for the probe."""

    __slots__ = ("index", "state", "next_seq", "confirmed", "unsent", "flying", "back", "retry_at", "backoff",
                 "seen_active")

    def __init__(self, index: int, rng: random.Random, *, probe_first: bool = False) -> None:
        self.index = index
        #: a producer that continues an earlier producer id may hold sequences already
        self.state = S.PROBE_DUE if probe_first else S.READY
        self.next_seq = 0
        self.confirmed = -1  # highest sequence confirmed to this producer
        self.unsent: deque[Item] = deque()
        #: batch id -> (node it went to, its items, when it went)
        self.flying: dict[int, tuple[str, list[Item], float]] = {}
        self.back: list[Item] = []
        self.retry_at = 0.0  # nothing goes out before (monotonic seconds)
        self.backoff = Backoff(0.02, 1.0, rng)
        self.seen_active = ""  # the partition's active in the last map loaded

    def __repr__(self) -> str:
        return (f"<PartitionPipeline {self.index} {self.state.name} next_seq={self.next_seq} "
                f"unsent={len(self.unsent)} flying={len(self.flying)} back={len(self.back)}>")

    def _step(self, event: SendEvent) -> None:
        try:
            self.state = TRANSITIONS[self.state, event]
        except KeyError:
            raise LocalProtocolError(f"partition {self.index}: {event.name} is not allowed in state "
                                     f"{self.state.name}") from None
        if self.state is S.FAILED and not self.flying:
            self.state = TRANSITIONS[self.state, E.ALL_BACK]

    @property
    def inflight(self) -> int:
        return len(self.flying)

    @property
    def busy(self) -> bool:
        """A probe or a buffer write runs for this partition."""
        return self.state in BUSY

    # -- numbering -------------------------------------------------------------------------

    def assign(self, it: Item) -> None:
        """Number a new message and queue it."""
        it.partition = self.index
        it.msg.seq = self.next_seq
        self.next_seq += 1
        self.unsent.append(it)

    def assign_buffered(self, it: Item) -> None:
        """Queue a message from the local buffer; while a failure is unsettled, the probe numbers it."""
        it.partition = self.index
        if self.state in UNSETTLED:
            it.msg.seq = None
        else:
            it.msg.seq = self.next_seq
            self.next_seq += 1
        self.unsent.append(it)

    def resume(self, it: Item) -> None:
        """A buffered message an earlier run numbered, and may have sent: the probe settles it."""
        it.partition = self.index
        it.sent = True
        self.back.append(it)
        self._step(E.RESUME)

    # -- what is due ---------------------------------------------------------------------

    def next_step(self, now: float, window: int) -> Step:
        """What the producer should do for this partition now; ``window`` is how many
        messages may go out before the next answer (``max_batch * max_in_flight``)."""
        if self.state in BUSY or self.state is S.FAILED or now < self.retry_at:
            return Step.WAIT
        if self.state is S.PROBE_DUE:
            return Step.PROBE
        if not self.unsent:
            return Step.WAIT
        if any(it.unrecorded(self.index) for it in itertools.islice(self.unsent, window)):
            return Step.RECORD
        return Step.SEND

    # -- recording buffered messages' numbering ------------------------------------------

    def start_record(self, window: int) -> list[Item]:
        """The messages whose (partition, seq) go to their buffer rows before they go out."""
        self._step(E.RECORD)
        return list(itertools.islice(self.unsent, window))

    def recorded(self, items: list[Item] | None) -> None:
        """The write ended: ``items`` were written (None: it failed, the next turn tries again)."""
        for it in items or ():
            if it.buf_id is not None and it.msg.seq is not None:
                it.buf_at = (self.index, it.msg.seq)
        self._step(E.RECORDED)

    # -- sending ---------------------------------------------------------------------------

    def take_batch(self, max_batch: int, max_bytes: int) -> list[Item]:
        """The next batch to send, in sequence order (empty: nothing may go now)."""
        if self.state is not S.READY:
            raise LocalProtocolError(f"partition {self.index}: no batch may go out in state {self.state.name}")
        items: list[Item] = []
        size = 0
        while self.unsent and len(items) < max_batch:
            it = self.unsent[0]
            if items and size + it.size > max_bytes:
                break
            if it.unrecorded(self.index):
                break  # not yet on disk: the next turn records it
            items.append(self.unsent.popleft())
            size += it.size
        return items

    def sent(self, bid: int, node: str, items: list[Item], now: float) -> int:
        """Batch ``bid`` went to ``node``; returns how many of its messages went before."""
        self._step(E.SEND)
        self.flying[bid] = (node, items, now)
        resent = sum(1 for it in items if it.sent)
        for it in items:
            it.sent = True
        return resent

    def requeue(self, items: list[Item]) -> None:
        """A batch that could not go out waits its turn again, first in line."""
        self.unsent.extendleft(reversed(items))

    def reply(self, bid: int) -> list[Item] | None:
        """The items of batch ``bid``, answered now; None if it was abandoned (being resent)."""
        entry = self.flying.pop(bid, None)
        return None if entry is None else entry[1]

    def confirm(self, items: list[Item]) -> None:
        for it in items:
            seq = it.msg.seq or 0
            if seq > self.confirmed:
                self.confirmed = seq
        self.backoff.reset()
        self._step(E.CONFIRMED)

    def fail(self, now: float, back: list[Item]) -> None:
        """A batch failed: ``back`` waits for the probe; nothing goes out for a backoff."""
        self.retry_at = now + self.backoff.next()
        self.back.extend(back)
        self._step(E.FAILED)

    def map_loaded(self, active: str) -> int:
        """The partition map names ``active`` now.  A new active is tried at once (the
        backoff grew while the group elected it).  Batches in flight to another node are
        abandoned: that node cannot commit them, and what a majority had of them is on
        the new active, which the probe asks.  Returns how many were abandoned."""
        if active and active != self.seen_active and self.state in UNSETTLED:
            self.retry_at = 0.0
            self.backoff.reset()
        self.seen_active = active
        if not active or not self.flying:
            return 0
        gone = [bid for bid, (node, _items, _t) in self.flying.items() if node and node != active]
        if not gone:
            return 0
        for bid in gone:
            _node, items, _t = self.flying.pop(bid)
            self.back.extend(items)
        self.retry_at = 0.0
        self._step(E.FAILED)
        return len(gone)

    def stalled(self, now: float, after: float) -> bool:
        """A batch has been in flight for ``after`` seconds or more."""
        return any(now - t >= after for _n, _i, t in self.flying.values())

    # -- probing ---------------------------------------------------------------------------

    def start_probe(self) -> None:
        self._step(E.PROBE)

    def probe_failed(self, now: float) -> None:
        self.retry_at = now + self.backoff.next()
        self._step(E.PROBE_FAILED)

    def probed(self, next_seq: int) -> int:
        """The partition holds this producer's sequences below ``next_seq``.  What went out
        under a seq below it is held (its resend is confirmed as a duplicate); everything
        else follows on from it, in the order it was sent.  Returns how many confirmed
        messages the partition no longer holds."""
        n = next_seq
        lost = 0
        if self.confirmed >= n:
            lost = self.confirmed - n + 1
            self.confirmed = n - 1
        items = sorted(self.back, key=lambda it: it.msg.seq if it.msg.seq is not None else 1 << 62)
        items += list(self.unsent)
        self.back = []
        nxt = n
        for it in items:
            if not it.sent or it.msg.seq is None or it.msg.seq >= n:
                it.msg.seq = nxt
                nxt += 1
        self.next_seq = nxt
        self.unsent = deque(items)
        self._step(E.PROBED)
        return lost

    # -- timeouts and shutdown -----------------------------------------------------------

    def overdue(self, now: float) -> list[Item]:
        """Waiting messages (not in flight) whose send_timeout has passed."""
        return [it for it in itertools.chain(self.unsent, self.back) if it.fut is not None and it.deadline <= now]

    def drop_unsent(self) -> None:
        """Drop messages nobody waits for that never went out, closing the gap they leave
        (they are a tail of ``unsent``: messages go out in order).  Not while a probe or a
        buffer write runs: those renumber ``unsent`` themselves."""
        if self.busy:
            return
        keep: list[Item] = []
        nxt: int | None = None
        for it in self.unsent:
            if not it.sent and it.fut is None and it.buf_id is None:
                if nxt is None:
                    nxt = it.msg.seq
                continue
            if nxt is not None and not it.sent:
                it.msg.seq = nxt
                nxt += 1
            keep.append(it)
        if nxt is not None:
            self.unsent = deque(keep)
            self.next_seq = nxt

    def items(self) -> Iterator[Item]:
        """Every message the pipeline holds: unsent, failed and in flight."""
        yield from self.unsent
        yield from self.back
        for _node, flying, _t in self.flying.values():
            yield from flying
