"""How this machine's disk answers fdatasync: PROCS processes, each appending 1.5 KB and
fdatasyncing RATE times a second (what a group's actives do at 2,000 msg/s), on files that
grow (as the replication log's segments do) or on files written over in place (recycled).

    .venv/bin/python scripts/fsync_tail.py [DIR] [--procs 3] [--rate 400] [--count 2000]

Prints p50 / p90 / p99 / max of one fdatasync for each mode, and how many took over 30 ms
(a disk that stops: docs/replication.md).
Writes and removes a 64 MiB file per process in DIR (default: the current one).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
from pathlib import Path

from client.clock import SYSTEM_CLOCK


def _worker(path: Path, recycled: bool, count: int, rate: float, out: mp.Queue) -> None:
    clock = SYSTEM_CLOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if recycled:  # the blocks exist already: an fdatasync writes no metadata
            os.write(fd, b"\0" * (64 << 20))
            os.fsync(fd)
            os.lseek(fd, 0, os.SEEK_SET)
        record = b"x" * 1500
        times: list[float] = []
        due = clock.monotonic()
        for _ in range(count):
            os.write(fd, record)
            t = clock.monotonic()
            os.fdatasync(fd)
            times.append(clock.monotonic() - t)
            due += 1 / rate
            if due > clock.monotonic():
                clock.sleep_blocking(due - clock.monotonic())  # paced, as the load is
        out.put(times)
    finally:
        os.close(fd)
        path.unlink()


def measure(directory: Path, recycled: bool, procs: int, rate: float, count: int) -> list[float]:
    out: mp.Queue = mp.Queue()
    ps = [mp.Process(target=_worker, args=(directory / f"fsync-tail-{i}.seg", recycled, count, rate, out))
          for i in range(procs)]
    for p in ps:
        p.start()
    got: list[float] = []
    for _ in ps:
        while True:
            try:
                got.extend(out.get(timeout=1))
                break
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in ps):
                    raise SystemExit("a worker failed (its error is above)")
    times = sorted(got)
    for p in ps:
        p.join()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", nargs="?", default=".", type=Path, help="where to write (the data dir's disk)")
    ap.add_argument("--procs", type=int, default=3)
    ap.add_argument("--rate", type=float, default=400.0, help="appends + fdatasyncs a second, per process")
    ap.add_argument("--count", type=int, default=2000, help="per process")
    args = ap.parse_args()
    if not args.dir.is_dir():  # a worker that cannot open its file would leave the parent waiting for ever
        ap.error(f"{args.dir} is not a directory")
    for recycled in (False, True):
        t = measure(args.dir, recycled, args.procs, args.rate, args.count)
        q = lambda f: t[min(len(t) - 1, int(len(t) * f))] * 1000  # noqa: E731
        print(f"{'recycled' if recycled else 'growing '} fdatasync ms: p50 {q(0.5):.2f}  p90 {q(0.9):.2f}  "
              f"p99 {q(0.99):.2f}  max {t[-1] * 1000:.2f}  over 30 ms: {sum(x > 0.03 for x in t)} of {len(t)}")


if __name__ == "__main__":
    main()
