"""A window of sequence numbers: which of one producer's seqs a partition has taken, one bit each."""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping

from storage.base import DropProducers, PutProducer, WriteOp

#: seqs a window tracks at most, from the lowest it has a bit for: a batch that comes this many
#: seqs of its producer late is taken for a resend (the SDK's producer has at most 64 x 256
#: messages in flight)
WINDOW = 1 << 16


class Window:
    """Every seq at or below ``floor`` counts as taken; above it, a seq is taken if its bit is
    set.  The bits start at the first seq taken (``lo``) and grow with the seqs, up to
    :data:`WINDOW` of them; then the lowest go, half a window at a time, and the floor moves
    up past them."""

    __slots__ = ("floor", "lo", "bits")

    def __init__(self, floor: int) -> None:
        self.floor = floor
        self.lo = floor + 1  # the seq of bit 0
        self.bits = bytearray()

    @classmethod
    def learned(cls, seqs: Iterable[int]) -> Window:
        """A window a replica starts with the first seqs it learns of a producer: half a window
        below them counts as not taken (a batch still to come), the rest as taken."""
        seqs = list(seqs)
        w = cls(min(seqs) - 1 - WINDOW // 2)
        w.update(seqs)
        return w

    def copy(self) -> Window:
        w = Window(self.floor)
        w.lo, w.bits = self.lo, bytearray(self.bits)
        return w

    def has(self, seq: int) -> bool:
        if seq <= self.floor:
            return True
        i = seq - self.lo
        if i < 0:
            return False
        j = i >> 3
        return j < len(self.bits) and bool(self.bits[j] >> (i & 7) & 1)

    def add(self, seq: int) -> None:
        if seq <= self.floor:
            return
        bits = self.bits
        if not bits:
            self.lo = seq
        elif seq < self.lo:  # below the first: room at the front, whole bytes
            k = (self.lo - seq + 7) >> 3
            bits[0:0] = bytes(k)
            self.lo -= 8 * k
        i = seq - self.lo
        if i >= WINDOW:
            drop = max(((i - WINDOW) >> 3) + 1, WINDOW // 16)
            del bits[:drop]
            self.lo += 8 * drop
            self.floor = max(self.floor, self.lo - 1)
            i = seq - self.lo
        j = i >> 3
        if j >= len(bits):
            bits.extend(bytes(max(j + 1, min(2 * len(bits), WINDOW // 8)) - len(bits)))
        bits[j] |= 1 << (i & 7)

    def update(self, seqs: Iterable[int]) -> None:
        for seq in seqs:
            self.add(seq)

    def discard(self, seq: int) -> None:
        i = seq - self.lo
        if seq > self.floor and i >= 0 and (j := i >> 3) < len(self.bits):
            self.bits[j] &= ~(1 << (i & 7)) & 0xFF


def learn(windows: MutableMapping[str, Window], ops: Iterable[WriteOp]) -> None:
    """The seqs the producers' batches took in a partition's committed ``ops``
    (``PutProducer.seqs``), into its ``windows``; a producer forgotten, its window with it."""
    for op in ops:
        if type(op) is PutProducer and op.seqs:
            w = windows.get(op.producer_id)
            if w is None:
                windows[op.producer_id] = Window.learned(op.seqs)
            else:
                w.update(op.seqs)
        elif type(op) is DropProducers:
            for pid in op.producer_ids:
                windows.pop(pid, None)
