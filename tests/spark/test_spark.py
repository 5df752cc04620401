"""The PySpark data source against a real node process, with one local SparkSession for all
of these tests (they run on one xdist worker: group "spark")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from client import blocking

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.xdist_group("spark"),
              pytest.mark.timeout(600)]


def publish(url: str, queue: str, n: int, partitions: int, first: int = 0) -> None:
    with blocking.connect(url) as conn:
        conn.declare_queue(queue, partitions=partitions)
        p = conn.producer(queue)
        for i in range(first, first + n, 100):
            p.send_many([f"m{j}".encode() for j in range(i, min(first + n, i + 100))])


def test_batch_read_returns_every_message_with_its_offset(spark: Any, url: str) -> None:
    publish(url, "batch", 500, 4)
    df = spark.read.format("tandem").option("url", url).option("queue", "batch").load()
    rows = df.collect()
    assert len(rows) == 500
    assert sorted(r.body for r in rows) == sorted(f"m{j}".encode() for j in range(500))
    by_part: dict[int, list[int]] = {}
    for r in rows:
        assert r.queue == "batch" and r.timestamp is not None
        by_part.setdefault(r.partition, []).append(r.offset)
    assert set(by_part) == {0, 1, 2, 3}
    assert all(sorted(offs) == list(range(len(offs))) for offs in by_part.values())  # 0.. per partition
    # a range, a subset of partitions, more Spark partitions than queue partitions
    some = (spark.read.format("tandem").option("url", url).option("queue", "batch").option("partitions", "1,3")
            .option("startingOffsets", json.dumps({"1": 10})).option("minPartitions", "6").load())
    assert some.rdd.getNumPartitions() >= 6
    got = some.collect()
    assert {r.partition for r in got} == {1, 3}
    assert len(got) == len(by_part[1]) - 10 + len(by_part[3])
    assert min(r.offset for r in got if r.partition == 1) == 10


def test_bad_options_fail_at_load(spark: Any, url: str) -> None:
    from pyspark.errors import PySparkException

    with pytest.raises((PySparkException, Exception), match="queue is required"):
        spark.read.format("tandem").option("url", url).load().collect()
    with pytest.raises((PySparkException, Exception), match="startingOffsets"):
        (spark.read.format("tandem").option("url", url).option("queue", "batch")
         .option("startingOffsets", "yesterday").load().collect())


def test_streaming_available_now_twice_reads_each_message_once(spark: Any, url: str, tmp_path: Path) -> None:
    publish(url, "stream", 300, 3)
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"

    def run() -> None:
        q = (spark.readStream.format("tandem").option("url", url).option("queue", "stream")
             .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "120").load()
             .selectExpr("partition", "offset", "cast(body as string) as body")
             .writeStream.format("parquet").option("checkpointLocation", str(ckpt))
             .trigger(availableNow=True).start(str(out)))
        q.awaitTermination(300)
        assert q.exception() is None, q.exception()

    run()
    publish(url, "stream", 200, 3, first=300)  # the queue grows between the two runs
    run()
    rows = spark.read.parquet(str(out)).collect()
    bodies = [r.body for r in rows]
    assert len(bodies) == 500 and set(bodies) == {f"m{j}" for j in range(500)}  # each once


def test_sink_publishes_every_row(spark: Any, url: str) -> None:
    df = spark.createDataFrame([(f"k{i % 5}", f"row{i}") for i in range(400)], "key string, body string")
    with blocking.connect(url) as conn:
        conn.declare_queue("sink", partitions=2)
    df.repartition(3).write.format("tandem").option("url", url).option("queue", "sink").mode("append").save()
    with blocking.connect(url) as conn:
        got = set()
        c = conn.consumer("sink", prefetch=100)
        while len(got) < 400:
            m = c.next()
            got.add(m.body.decode())
            m.ack()
        assert got == {f"row{i}" for i in range(400)}
        (info,) = [q for q in conn.list_queues() if q.name == "sink"]
        assert info.ready == 0 and info.unacked == 0  # nothing stored twice
    with pytest.raises(Exception, match="append"):
        df.write.format("tandem").option("url", url).option("queue", "sink").mode("overwrite").save()


def test_fail_on_data_loss_after_a_purge(spark: Any, url: str) -> None:
    publish(url, "lossy", 50, 1)
    reader = (spark.read.format("tandem").option("url", url).option("queue", "lossy")
              .option("startingOffsets", json.dumps({"0": 0})).option("endingOffsets", json.dumps({"0": 80})))
    with blocking.connect(url) as conn:
        conn.purge_queue("lossy")  # offsets 0..49 are gone
    publish(url, "lossy", 30, 1, first=50)  # 50..79 are there
    with pytest.raises(Exception, match="are gone"):
        reader.load().collect()
    rows = reader.option("failOnDataLoss", "false").load().collect()
    assert sorted(r.offset for r in rows) == list(range(50, 80))  # the gap skipped, the rest read


def test_stream_to_stream_through_the_sink(spark: Any, url: str, tmp_path: Path) -> None:
    """A streaming query from one queue into another with writeStream.format("tandem")."""
    publish(url, "src", 250, 2)
    with blocking.connect(url) as conn:
        conn.declare_queue("dst", partitions=3)
    q = (spark.readStream.format("tandem").option("url", url).option("queue", "src")
         .option("startingOffsets", "earliest").load().selectExpr("key", "body")
         .writeStream.format("tandem").option("url", url).option("queue", "dst")
         .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()
    with blocking.connect(url) as conn:
        got = []
        c = conn.consumer("dst", prefetch=100)
        while len(got) < 250:
            m = c.next()
            got.append(m.body)
            m.ack()
        assert sorted(got) == sorted(f"m{j}".encode() for j in range(250))


def test_a_hole_in_the_middle_is_data_loss_too(spark: Any, url: str) -> None:
    publish(url, "holes", 40, 1)
    with blocking.connect(url) as conn:  # offsets 10..14 acked (gone), the rest back to the queue
        held = [conn.get("holes") for _ in range(20)]
        for m in held:
            assert m is not None
            m.ack() if 10 <= m.offset < 15 else m.nack(requeue=True)
    reader = (spark.read.format("tandem").option("url", url).option("queue", "holes")
              .option("startingOffsets", json.dumps({"0": 0})))
    with pytest.raises(Exception, match="offsets 10..14 of holes/0 are gone"):
        reader.load().collect()
    rows = reader.option("failOnDataLoss", "false").load().collect()
    assert sorted(r.offset for r in rows) == [o for o in range(40) if not 10 <= o < 15]


def test_a_stream_replays_the_same_rows_from_an_offset_or_a_time(spark: Any, url: str) -> None:
    """A stream's messages stay after a read: the same range read twice (by offsets, then by the
    times of its first and end messages) gives the same rows."""
    with blocking.connect(url) as conn:
        conn.declare_stream("replay", partitions=2)
        p = conn.producer("replay")
        for i in range(0, 400, 100):
            p.send_many([f"r{j}".encode() for j in range(i, i + 100)])
        first = {q: conn.read("replay", q, 50, 1)[0][0] for q in (0, 1)}  # the range: offsets 50 .. 150
        end = {q: conn.read("replay", q, 150, 1)[0][0] for q in (0, 1)}

    def rows(**options: str) -> list[tuple[int, int, bytes, int]]:
        """(partition, offset, body, the millisecond it was stored) of each row."""
        reader = spark.read.format("tandem").option("url", url).option("queue", "replay")
        for k, v in options.items():
            reader = reader.option(k, v)
        return sorted((r.partition, r.offset, r.body, int(r.timestamp.timestamp() * 1000))
                      for r in reader.load().collect())

    by_offset = {"startingOffsets": json.dumps({"0": 50, "1": 50}), "endingOffsets": json.dumps({"0": 150, "1": 150})}
    once, again = rows(**by_offset), rows(**by_offset)
    assert once == again and len(once) == 200 and {r[1] for r in once} == set(range(50, 150))
    # by time: the same range's rows, and others only where they were stored in its first or last
    # millisecond (a read by time starts at the first message of that millisecond)
    since = min(int(m.timestamp * 1000) for m in first.values())
    until = max(int(m.timestamp * 1000) for m in end.values()) + 1
    by_time = rows(startingTimestamp=str(since), endingTimestamp=str(until))
    assert set(once) <= set(by_time) and by_time == rows(startingTimestamp=str(since), endingTimestamp=str(until))
    assert all(since <= ms < until for *_, ms in by_time)
