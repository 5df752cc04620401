"""The sink writes every row exactly once (client.spark_sink): through a task that fails after
publishing half its rows and is retried by Spark, and through a streaming query that fails in
the middle of a micro-batch, after some of its tasks committed, and is started again from its
checkpoint."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from client import blocking
from client.clock import SYSTEM_CLOCK
from tests.spark.test_spark import publish

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.xdist_group("spark"),
              pytest.mark.timeout(600)]


def _consume(url: str, queue: str, expected: int) -> Counter[bytes]:
    """Everything ready in ``queue``, once at least ``expected`` messages came (or 60 s passed)."""
    got: Counter[bytes] = Counter()
    deadline = SYSTEM_CLOCK.monotonic() + 60
    with blocking.connect(url) as conn:
        while True:
            m = conn.get(queue)
            if m is None:
                if sum(got.values()) >= expected or SYSTEM_CLOCK.monotonic() > deadline:
                    return got
                SYSTEM_CLOCK.sleep_blocking(0.05)  # (polled against the deadline above)
                continue
            got[m.body] += 1
            m.ack()


def _published(url: str, queue: str) -> int:
    with blocking.connect(url) as conn:
        (info,) = [q for q in conn.list_queues() if q.name == queue]
        return info.published


def test_a_task_that_fails_after_half_its_rows_is_retried_and_writes_each_row_once(spark: Any, url: str) -> None:
    from pyspark import TaskContext
    from pyspark.sql.functions import col, udf

    n = 4000

    @udf("string")
    def fail_once(body: str) -> str | None:
        # (a null body fails the sink's task when it reaches the row: after it published the rows
        # before it, which a failure raised here would not wait for)
        ctx = TaskContext.get()
        if ctx is not None and ctx.partitionId() == 0 and ctx.attemptNumber() == 0 and body == "row1500":
            return None
        return body

    with blocking.connect(url) as conn:
        conn.declare_queue("once", partitions=3)
    df = spark.range(n).selectExpr("concat('row', cast(id as string)) as body").coalesce(2)
    df.select(fail_once(col("body")).alias("body")).write.format("tandem").option("url", url) \
        .option("queue", "once").mode("append").save()
    got = _consume(url, "once", n)
    assert got == Counter(f"row{i}".encode() for i in range(n)), (len(got), max(got.values()))
    # the failed attempt had published rows in its transaction (stored, then aborted)
    assert _published(url, "once") > n


def test_a_query_restarted_from_its_checkpoint_mid_batch_writes_each_row_once(spark: Any, url: str,
                                                                             tmp_path: Path) -> None:
    from pyspark import TaskContext
    from pyspark.sql.functions import col, udf

    publish(url, "events", 3000, 2)
    with blocking.connect(url) as conn:
        conn.declare_queue("copied", partitions=2)
    broken = tmp_path / "broken"
    broken.write_text("partition 1 fails")
    marker = str(broken)

    @udf("binary")
    def through(body: bytes) -> bytes:
        import os

        ctx = TaskContext.get()
        if ctx is not None and ctx.partitionId() == 1 and os.path.exists(marker):
            raise RuntimeError("partition 1 fails on every attempt")
        return body

    def start() -> Any:
        return (spark.readStream.format("tandem").option("url", url).option("queue", "events")
                .option("startingOffsets", "earliest").load()
                .select(col("key"), through(col("body")).alias("body"))
                .writeStream.format("tandem").option("url", url).option("queue", "copied")
                .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())

    q = start()
    with pytest.raises(Exception):
        q.awaitTermination(300)  # (the batch fails: partition 0's task committed, partition 1's did not)
    first = _published(url, "copied")
    assert 0 < first < 3000, first
    broken.unlink()
    q = start()  # the same batch again, from the checkpoint
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()
    got = _consume(url, "copied", 3000)
    assert got == Counter(f"m{j}".encode() for j in range(3000)), (len(got), max(got.values()))
