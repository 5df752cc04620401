"""Confirmed append throughput of the storage engines alone, through the group-commit writer.

    .venv/bin/python scripts/store_throughput.py [--seconds 3] [--engines sqlite,sqlite-shared,postgresql]
        [--size 100] [--ack] [--random] [--pg postgres@127.0.0.1:5432]

For each engine (SQLite in a temp dir, plain and as shared mode's fenced engine; PostgreSQL in a database of its own on the local
server, dropped after) and each shape, submits ``Append`` ops of B messages of 100 bytes
to ``storage.writer.GroupCommitWriter`` with ``sync=True`` (SYNC: confirmed once durable),
keeping K submissions in flight (K producers, each waiting for its confirm before the next),
over 4 partitions, for ``--seconds``; prints confirmed messages a second, commits a second and
the mean commit time.  ``--ack``: every confirmed append is settled too (lazy ``Settle``
submissions, as a consumer's acks: the engine also deletes chunks).  The PostgreSQL engine is fenced (every transaction checks the lease
row), as in shared mode; its lease is renewed every 0.3 s meanwhile, and the slowest renewal
is printed (a renewal waits for the write transaction in flight).  A diagnostic, not a test.
"""

from __future__ import annotations

import argparse
import os
import secrets
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from storage.base import Append, Engine, PutQueue, QueueMeta, Settle, StoredMessage
from storage.postgres import PostgresShared
from storage.sqlite import SqliteEngine
from storage.sqlite.shared import SqliteShared
from storage.writer import GroupCommitWriter

PARTITIONS = 4
Q = QueueMeta(id=1, name="bench", partitions=PARTITIONS, mapper="consistent_hash", ring_size=64,
              max_deliveries=3, dead_letter_queue=None, max_length=0)
#: (messages per append, appends in flight); a producer's frame of 256 over 4 partitions: ~64
SHAPES = [(1, 1), (1, 64), (64, 16), (256, 4), (1000, 4)]


@contextmanager
def postgres(server: str) -> Iterator[str]:
    user, _, hostport = server.rpartition("@")
    host, _, port = hostport.partition(":")
    name = f"tandem_bench_{secrets.token_hex(4)}"
    with psycopg.connect(host=host, port=int(port), user=user, dbname="postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://{server}/{name}"
    finally:
        with psycopg.connect(host=host, port=int(port), user=user, dbname="postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def run(engine: Engine, batch: int, inflight: int, seconds: float, size: int,
        ack: bool, random_bodies: bool) -> tuple[float, float, float]:
    """On an open engine: confirmed messages a second, commits a second, mean commit ms."""
    cv = threading.Condition()
    done = [0]
    writer = GroupCommitWriter(engine, lambda fn: fn())
    ends = [0] * PARTITIONS
    writer.submit([PutQueue(Q)], sync=True)
    stop = time.perf_counter() + seconds
    errors: list[BaseException] = []
    pool = os.urandom(size * 64) if random_bodies else b"x" * (size * 64)
    bodies = [pool[i * size:(i + 1) * size] for i in range(64)]
    to_ack: list[tuple[int, int]] = []  # confirmed appends (partition, start), to settle

    def confirmed(err: BaseException | None, p: int, start: int) -> None:
        with cv:
            if err is not None:
                errors.append(err)
            done[0] += 1
            if ack:
                to_ack.append((p, start))
            cv.notify()

    def submit(i: int) -> None:
        p = i % PARTITIONS
        start = ends[p]
        ends[p] += batch
        msgs = [StoredMessage(start + j, None, b"\x80", bodies[(start + j) % 64], None, None, 0.0)
                for j in range(batch)]
        writer.submit([Append(1, p, msgs, ends[p])], sync=True,
                      callback=lambda err: confirmed(err, p, start))
        with cv:
            acks, to_ack[:] = list(to_ack), []
        if acks:
            writer.submit([Settle(1, q, list(range(s, s + batch))) for q, s in acks], sync=False, lazy=True)

    sent = 0
    began = time.perf_counter()
    base = writer.stats.commits, writer.stats.commit_seconds_total
    while time.perf_counter() < stop:
        with cv:
            cv.wait_for(lambda: sent - done[0] < inflight)
        submit(sent)
        sent += 1
    with cv:
        cv.wait_for(lambda: done[0] == sent)
    elapsed = time.perf_counter() - began
    commits = writer.stats.commits - base[0]
    busy = writer.stats.commit_seconds_total - base[1]
    writer.close()
    if errors:
        raise errors[0]
    return sent * batch / elapsed, commits / elapsed, busy / max(1, commits) * 1000


def renewing(store: PostgresShared) -> tuple[Callable[[], float], Callable[[], None]]:
    lease = store.lease()
    epoch = lease.acquire("bench", "127.0.0.1:1", 60.0)
    assert epoch is not None
    slowest = [0.0]
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(0.3):
            t = time.perf_counter()
            lease.renew("bench", epoch, 60.0)
            slowest[0] = max(slowest[0], time.perf_counter() - t)

    t = threading.Thread(target=loop, daemon=True)
    t.start()

    def end() -> None:
        stop.set()
        t.join()
        lease.close()

    return (lambda: slowest[0]), end


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--engines", default="sqlite,sqlite-shared,postgresql")
    ap.add_argument("--pg", default="postgres@127.0.0.1:5432")
    ap.add_argument("--size", type=int, default=100, help="message body bytes")
    ap.add_argument("--ack", action="store_true", help="settle every confirmed append")
    ap.add_argument("--random", action="store_true", help="random (incompressible) bodies, not b'x' * size")
    args = ap.parse_args()
    print(f"{'engine':13} {'msgs/append':>11} {'in flight':>9} {'msg/s':>10} {'commits/s':>9} {'commit ms':>9}")
    for name in args.engines.split(","):
        for batch, inflight in SHAPES:
            extra = ""
            if name == "sqlite":
                with tempfile.TemporaryDirectory() as d:
                    engine: Engine = SqliteEngine(Path(d) / "tandem.db")
                    engine.open()
                    try:
                        rate, commits, ms = run(engine, batch, inflight, args.seconds, args.size, args.ack, args.random)
                    finally:
                        engine.close()
            elif name == "sqlite-shared":  # fenced, as nodes of one machine sharing the file
                with tempfile.TemporaryDirectory() as d:
                    shared = SqliteShared(Path(d) / "tandem.db")
                    lease = shared.lease()
                    sq = shared.engine()
                    sq.open()
                    sq.fence(lease.acquire("bench", "127.0.0.1:1", 60.0))
                    try:
                        rate, commits, ms = run(sq, batch, inflight, args.seconds, args.size, args.ack, args.random)
                    finally:
                        sq.close()
                        lease.close()
            else:
                with postgres(args.pg) as url:
                    store = PostgresShared(url)
                    pg = store.engine()
                    pg.open()
                    slowest, end = renewing(store)
                    pg.fence(1)
                    try:
                        rate, commits, ms = run(pg, batch, inflight, args.seconds, args.size, args.ack, args.random)
                    finally:
                        end()
                        pg.close()
                    extra = f"  (slowest lease renewal {slowest() * 1000:.1f} ms)"
            print(f"{name:13} {batch:>11} {inflight:>9} {rate:>10,.0f} {commits:>9,.0f} {ms:>9.2f}{extra}",
                  flush=True)


if __name__ == "__main__":
    main()
