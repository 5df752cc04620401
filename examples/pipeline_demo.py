"""The data pipeline demo: order events through a replicated Tandem group into Spark.

    make pipeline-demo            # or: .venv/bin/python examples/pipeline_demo.py [--orders 3000]

1. Starts a local group of three nodes (temporary directory) and declares ``orders`` (6 partitions).
2. Producers publish order events ``{"customer": ..., "amount": ...}`` at a steady rate with
   confirms, on a durable connection, and add up what was confirmed per customer.
3. A Structured Streaming job reads ``orders`` with ``format("tandem")``, sums the amounts per
   customer every two seconds and appends each micro-batch's sums to Parquet files.
4. Mid-stream the node active for partition 0 is killed (``kill -9``), later started again.
5. When the producers are done and the job has caught up, the Parquet totals per customer must
   equal what was confirmed: the exit status says whether they do.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import client  # noqa: E402
from broker.tools.cluster import LocalCluster  # noqa: E402

PASSWORD = "pipeline-demo"


class Group(threading.Thread):
    """The group and the producers, on an event loop of their own."""

    def __init__(self, data: Path, orders: int, rate: float) -> None:
        super().__init__(daemon=True)
        self.data, self.orders, self.rate = data, orders, rate
        self.ready = threading.Event()
        self.produced = threading.Event()
        self.finish = threading.Event()
        self.url = ""
        self.totals: dict[str, int] = {}
        self.confirmed = 0
        self.killed = ""
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported by the main thread
            self.error = exc
            self.ready.set()
            self.produced.set()

    async def _main(self) -> None:
        cl = LocalCluster(self.data, nodes=3, base_port=0, password=PASSWORD)
        await cl.start()
        try:
            await cl.wait_ready()
            self.url = cl.url
            async with await client.connect(cl.url) as conn:
                await conn.declare_queue("orders", partitions=6)
            self.ready.set()
            await self._produce(cl)
            self.produced.set()
            while not self.finish.is_set():
                await asyncio.sleep(0.2)  # the main thread checks the job's totals meanwhile
        finally:
            await cl.stop()

    async def _produce(self, cl: LocalCluster) -> None:
        rng = random.Random(7)
        async with await client.connect(cl.url, send_timeout=120) as conn:
            p = conn.producer("orders")
            start = time.monotonic()
            pending = set()
            for i in range(self.orders):
                customer = f"customer-{rng.randrange(20):02d}"
                amount = rng.randrange(1, 500)
                fut = p.send_nowait(json.dumps({"customer": customer, "amount": amount}), key=customer)

                def done(f: asyncio.Future, c: str = customer, a: int = amount) -> None:
                    pending.discard(f)
                    if not f.cancelled() and f.exception() is None:
                        self.totals[c] = self.totals.get(c, 0) + a
                        self.confirmed += 1

                fut.add_done_callback(done)
                pending.add(fut)
                if i == self.orders // 3:
                    deadline = time.monotonic() + 30
                    while not self.killed and time.monotonic() < deadline:
                        self.killed = (await cl.actives("orders")).get(0, "")
                        if not self.killed:
                            await asyncio.sleep(0.1)  # asking the nodes again, bounded by the deadline
                    if self.killed:
                        print(f"killing {self.killed} (active for partition 0) mid-stream", flush=True)
                        await cl.nodes[self.killed].kill()
                if i == 2 * self.orders // 3 and self.killed:
                    await cl.nodes[self.killed].start()
                    print(f"{self.killed} started again", flush=True)
                wait = start + (i + 1) / self.rate - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)  # the publish rate
            if pending:
                await asyncio.wait(pending)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--orders", type=int, default=3000)
    ap.add_argument("--rate", type=float, default=300.0, help="orders per second (default 300)")
    ap.add_argument("--timeout", type=float, default=300.0)
    args = ap.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    with tempfile.TemporaryDirectory(prefix="tandem-pipeline-") as tmp:
        g = Group(Path(tmp) / "group", args.orders, args.rate)
        g.start()
        g.ready.wait(120)
        if g.error is not None:
            raise g.error
        from pyspark.sql import SparkSession
        from pyspark.sql import functions as F

        from client.spark import register

        spark = (SparkSession.builder.master("local[2]").appName("tandem-pipeline-demo")
                 .config("spark.sql.shuffle.partitions", "2").config("spark.ui.enabled", "false")
                 .config("spark.sql.session.timeZone", "UTC").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        out, ckpt = Path(tmp) / "totals", Path(tmp) / "checkpoint"
        schema = "customer string, amount long"

        def write_batch(df, batch_id: int) -> None:  # type: ignore[no-untyped-def]
            df.withColumn("batch", F.lit(batch_id)).write.mode("append").parquet(str(out))

        query = (spark.readStream.format("tandem").option("url", g.url).option("queue", "orders")
                 .option("startingOffsets", "earliest").load()
                 .select(F.from_json(F.col("body").cast("string"), schema).alias("o"))
                 .groupBy("o.customer").agg(F.sum("o.amount").alias("amount"), F.count("*").alias("orders"))
                 .writeStream.outputMode("update").foreachBatch(write_batch)
                 .option("checkpointLocation", str(ckpt)).trigger(processingTime="2 seconds").start())
        deadline = time.monotonic() + args.timeout
        ok = False
        try:
            g.produced.wait(args.timeout)
            if g.error is not None:
                raise g.error
            print(f"published and confirmed {g.confirmed} of {args.orders} orders", flush=True)
            while time.monotonic() < deadline and query.exception() is None:
                if out.exists():
                    # each micro-batch wrote the running sums of the customers it saw: the last
                    # one per customer is the total
                    rows = spark.read.schema("customer string, amount long, orders long, batch int").parquet(
                        str(out)).groupBy("customer").agg(
                        F.max_by("amount", "batch").alias("amount"), F.max_by("orders", "batch").alias("orders"))
                    seen = {r.customer: (r.amount, r.orders) for r in rows.collect()}
                    if sum(n for _a, n in seen.values()) >= g.confirmed:
                        got = {c: a for c, (a, _n) in seen.items()}
                        ok = got == g.totals
                        print(f"Spark totals for {len(got)} customers, {sum(n for _a, n in seen.values())} "
                              f"orders: {'equal to' if ok else 'DIFFERENT FROM'} what was confirmed", flush=True)
                        if not ok:
                            for c in sorted(set(got) | set(g.totals)):
                                if got.get(c) != g.totals.get(c):
                                    print(f"  {c}: spark {got.get(c)} confirmed {g.totals.get(c)}")
                        break
                time.sleep(1.0)  # the job's own pace: one micro-batch every two seconds
            if query.exception() is not None:
                print(f"the streaming query failed: {query.exception()}", file=sys.stderr)
        finally:
            query.stop()
            spark.stop()
            g.finish.set()
            g.join(60)
        print("PASSED" if ok else "FAILED", flush=True)
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
