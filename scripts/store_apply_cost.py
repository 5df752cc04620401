"""What a replicated batch costs the SQLite store to apply, at a feature level.

    .venv/bin/python scripts/store_apply_cost.py [--batches 4000] [--runs 5] [--level 12] [--acks [--nacks]] [--label NAME]

Each run opens a SQLite store in a temp dir at ``--level`` and applies ``--batches`` batches
unsynced, round robin over 4 partitions, each as a member applies a publish: an ``Append`` of
10 messages of 100 bytes, the producer's position and the partition's applied position; with
``--acks`` also the settlement of the partition's batch before it but one, all but its first
message, as a member applies its consumers' acks, and with ``--nacks`` a delivery count for
that first one (a nack) in every batch.
Prints the microseconds a batch took in each run, on one line (``--label`` first). Run it from
a worktree of another build (``PYTHONPATH=WORKTREE``) to compare two builds, alternating. A
diagnostic, not a test.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from storage.base import (Append, PutApplied, PutMeta, PutProducer, PutQueue, QueueMeta, SetDeliveryCount, Settle,
                          StoredMessage)
from storage.sqlite import SqliteEngine

PARTITIONS = 4
Q = QueueMeta(id=1, name="q", partitions=PARTITIONS, mapper="round_robin", ring_size=1, max_deliveries=0,
              dead_letter_queue=None, max_length=0)


def one_run(batches: int, level: int, acks: bool = False, nacks: bool = False) -> float:
    """Microseconds a batch took."""
    with tempfile.TemporaryDirectory() as d:
        e = SqliteEngine(Path(d) / "tandem.db")
        e.open()
        try:
            e.apply([PutMeta("feature_level", str(level)), PutQueue(Q)], sync=True)
            ends = [0] * PARTITIONS
            start = time.perf_counter()
            for i in range(batches):
                p = i % PARTITIONS
                msgs = [StoredMessage(ends[p] + j, None, b"\x80", b"x" * 100, "producer", ends[p] + j, 0.0)
                        for j in range(10)]
                settle: list[Settle | SetDeliveryCount] = []
                if acks and ends[p] >= 20:
                    first = ends[p] - 20
                    settle = [Settle(1, p, list(range(first + 1, first + 10)))]
                    if nacks:
                        settle.append(SetDeliveryCount(1, p, [(first, 1)]))
                e.apply([Append(1, p, msgs, ends[p] + 10), PutProducer(1, p, "producer", ends[p] + 9), *settle,
                         PutApplied(1, p, i + 1, 1, "node1")], sync=False)
                ends[p] += 10
            return (time.perf_counter() - start) / batches * 1e6
        finally:
            e.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=4000, help="batches a run (default 4000)")
    ap.add_argument("--runs", type=int, default=5, help="runs (default 5)")
    ap.add_argument("--level", type=int, default=12, help="the store's feature level (default 12)")
    ap.add_argument("--acks", action="store_true", help="each batch settles an earlier one's messages too")
    ap.add_argument("--nacks", action="store_true", help="with --acks: and writes a delivery count")
    ap.add_argument("--label", default="", help="printed first on the line")
    args = ap.parse_args()
    times = [one_run(args.batches, args.level, args.acks, args.nacks) for _ in range(args.runs)]
    print(args.label, " ".join(f"{t:.1f}" for t in times), "us/batch")


if __name__ == "__main__":
    main()
