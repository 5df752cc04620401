"""Spark figures for docs/benchmarks.md: batch read throughput from a three-node group, and
streaming end-to-end latency at a fixed publish rate.

    .venv/bin/python scripts/spark_bench.py [--messages 50000] [--rate 200] [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import client  # noqa: E402
from broker.tools.cluster import LocalCluster  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=50000)
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--seconds", type=float, default=20.0)
    args = ap.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    def run(coro):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    with tempfile.TemporaryDirectory(prefix="tandem-spark-bench-") as tmp:
        cl = LocalCluster(Path(tmp), nodes=3, base_port=0, password="spark-bench")
        run(cl.start())
        try:
            run(cl.wait_ready())

            async def fill() -> None:
                async with await client.connect(cl.url) as conn:
                    await conn.declare_queue("bulk", partitions=6)
                    await conn.declare_queue("live", partitions=6)
                    p = conn.producer("bulk")
                    body = b"x" * 1024
                    for i in range(0, args.messages, 1000):
                        await p.send_many([body] * min(1000, args.messages - i))

            run(fill())
            from pyspark.sql import SparkSession

            from client.spark import register

            spark = (SparkSession.builder.master("local[2]").appName("tandem-spark-bench")
                     .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
                     .getOrCreate())
            spark.sparkContext.setLogLevel("ERROR")
            register(spark)
            reader = spark.read.format("tandem").option("url", cl.url).option("queue", "bulk")
            rates = []
            for _ in range(3):
                t = time.monotonic()
                n = reader.load().count()
                rates.append(n / (time.monotonic() - t))
                assert n == args.messages, n
            print(json.dumps({"batch_read_rows_per_s": [round(r) for r in rates], "rows": args.messages,
                              "partitions": 6, "body_bytes": 1024}))
            latencies: list[float] = []

            def batch(df, _id: int) -> None:  # type: ignore[no-untyped-def]
                now = time.time()
                for r in df.select("headers").collect():
                    latencies.append(now - float(r.headers["sent"]))

            q = (spark.readStream.format("tandem").option("url", cl.url).option("queue", "live")
                 .option("startingOffsets", "latest").load().writeStream.foreachBatch(batch)
                 .trigger(processingTime="500 milliseconds").start())
            time.sleep(5)  # the query's first micro-batches (its start-up is not measured)

            async def live() -> int:
                async with await client.connect(cl.url) as conn:
                    p = conn.producer("live")
                    start, i = time.monotonic(), 0
                    while time.monotonic() - start < args.seconds:
                        await p.send(b"e", headers={"sent": repr(time.time())})
                        i += 1
                        wait = start + i / args.rate - time.monotonic()
                        if wait > 0:
                            await asyncio.sleep(wait)
                    return i

            sent = run(live())
            deadline = time.monotonic() + 60
            while len(latencies) < sent and time.monotonic() < deadline:
                time.sleep(0.5)  # the job catching up
            q.stop()
            lat = sorted(latencies)
            print(json.dumps({"stream_rate_per_s": args.rate, "sent": sent, "received": len(lat),
                              "end_to_end_ms": {"p50": round(statistics.median(lat) * 1000),
                                                "p99": round(lat[int(len(lat) * 0.99) - 1] * 1000),
                                                "max": round(lat[-1] * 1000)},
                              "trigger": "500 ms"}))
            spark.stop()
        finally:
            run(cl.stop())


if __name__ == "__main__":
    main()
