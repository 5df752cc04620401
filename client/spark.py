"""A PySpark data source for Tandem queues: batch read, Structured Streaming, and a sink.

    from client.spark import register
    register(spark)
    df = (spark.read.format("tandem").option("url", "tandem://admin:PW@h1:7780,h2:7790")
          .option("queue", "orders").load())
    q = (spark.readStream.format("tandem").option("url", url).option("queue", "orders")
         .option("startingOffsets", "earliest").load()
         .writeStream.format("parquet").option("checkpointLocation", "/ckpt").start("/out"))
    df.select("key", "body").write.format("tandem").option("url", url).option("queue", "out").mode("append").save()

Reads are stream reads by offset (non-destructive), one Spark input partition per queue
partition (more with ``minPartitions``), each from the node active for its partition:
executors read in parallel from whichever nodes are active, and a reader whose node fails
over asks the map again and goes on from the same offset.  Offsets are ``{"<partition>":
<next offset>}`` with the partitions in numeric order (Spark compares offsets as JSON text).

A read may start (end) at a time instead: ``startingTimestamp`` (``endingTimestamp``), in
milliseconds since the epoch, is each partition's first message stored at or after it.  A
stream keeps what it was sent until its retention drops it, so the same range reads the same
rows again (replay); a classic queue's read shows what is not yet settled.

Messages a queue no longer holds (acked, purged, or dropped by a stream's retention) are *gone*: a read that finds a range
missing fails the query when ``failOnDataLoss`` is true (the default), and otherwise logs
and skips it.

The sink publishes with confirms, at least once: each task attempt is a producer of its own,
so a retried task (or a replayed micro-batch) sends its rows again, as Kafka's sink does.

Workers need this package importable (``pip install tandem-broker[spark]`` on every
executor) and run ``$PYSPARK_PYTHON``.  Readers and writers are pickled: they hold plain
options and open their connections inside ``read()`` / ``write()``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from client import blocking
from client.clock import SYSTEM_CLOCK, Backoff
from client.errors import InvalidArgumentError, TandemError, UnavailableError
from client.spark_options import Conf, group_url
from client.spark_sink import TandemStreamWriter, TandemWriter
from client.url import parse_url

log = logging.getLogger("tandem.spark")

SCHEMA = ("queue string, partition int, offset long, key string, headers map<string,string>, body binary, "
          "timestamp timestamp")
READ_BATCH = 1000
READ_PATIENCE = 120.0  # seconds a read waits for a partition's active (an election, a failover)


def register(spark: Any) -> None:
    """Make ``format("tandem")`` known to this SparkSession."""
    spark.dataSource.register(TandemDataSource)


# -- talking to the group -----------------------------------------------------------------------


class _Group:
    """Blocking links to the group: one to ask for the map, one per node read from."""

    def __init__(self, conf: Conf) -> None:
        self.conf = conf
        self.params = parse_url(conf.url)
        self.main = blocking.connect(conf.url, client_name="tandem-spark", timeout=60)
        self.links: dict[str, blocking.BlockingConnection] = {}

    def close(self) -> None:
        for c in [self.main, *self.links.values()]:
            try:
                c.close()
            except (OSError, TandemError):
                pass  # closing anyway

    def partition_count(self) -> int:
        return self.main.partition_map(self.conf.queue).queue.partitions

    def partitions(self) -> list[int]:
        n = self.partition_count()
        if self.conf.partitions is None:
            return list(range(n))
        bad = [p for p in self.conf.partitions if not 0 <= p < n]
        if bad:
            raise InvalidArgumentError(f"option partitions: queue {self.conf.queue!r} has {n} partitions, "
                                       f"not {bad}")
        return list(self.conf.partitions)

    def link_for(self, partition: int, deadline: float) -> blocking.BlockingConnection:
        """A plain link (no failover of its own: the caller asks the map again) to the node
        active for ``partition``, waiting (until ``deadline``) while it has none: only the
        active knows where the partition ends."""
        backoff = Backoff(cap=1.0)
        while True:
            m = self.main.partition_map(self.conf.queue)
            active = m.actives[partition] if partition < len(m.actives) else ""
            addr = m.addresses.get(active, "")
            if active and addr:
                link = self.links.get(active)
                if link is not None and not link._closed:
                    return link
                host, _, port = addr.rpartition(":")
                try:
                    link = blocking.connect(group_url([(host.strip("[]"), int(port))], self.params.user,
                                                 self.params.password, self.params),
                                            client_name="tandem-spark", timeout=60, durable=False)
                    self.links[active] = link
                    return link
                except TandemError as exc:
                    if not exc.retriable:
                        raise
            if SYSTEM_CLOCK.monotonic() >= deadline:
                raise UnavailableError(f"partition {partition} of {self.conf.queue!r} has no reachable active")
            SYSTEM_CLOCK.sleep_blocking(backoff.next())  # an election under way: the map is asked again

    def drop(self, link: blocking.BlockingConnection) -> None:
        for name, c in list(self.links.items()):
            if c is link:
                del self.links[name]
                try:
                    c.close()
                except (OSError, TandemError):
                    pass

    def bounds(self, partition: int, at_ms: int = 0) -> tuple[int, int]:
        """(earliest offset still held, end offset) of a partition, from its active; with
        ``at_ms``, the offset of the first message stored at or after that time instead of the
        earliest."""
        deadline = SYSTEM_CLOCK.monotonic() + READ_PATIENCE
        while True:
            link = self.link_for(partition, deadline)
            try:
                msgs, nxt, end = link.read(self.conf.queue, partition, 0, 1, timestamp=at_ms / 1000 if at_ms else None)
                return (msgs[0].offset if msgs else max(nxt, end) if at_ms else end), end
            except TandemError as exc:
                self.drop(link)
                if not exc.retriable or SYSTEM_CLOCK.monotonic() >= deadline:
                    raise
                log.info("reading the bounds of %s/%d: %s; asking again", self.conf.queue, partition, exc)


def _resolve(spec: str | dict[str, int], bounds: dict[int, tuple[int, int]], which: str) -> dict[int, int]:
    if spec == "earliest":
        return {p: b[0] for p, b in bounds.items()}
    if spec == "latest":
        return {p: b[1] for p, b in bounds.items()}
    assert isinstance(spec, dict)
    out = {}
    for p, (lo, hi) in bounds.items():
        o = spec.get(str(p))
        out[p] = (lo if which == "start" else hi) if o is None else o
    return out


def _plan(conf: Conf) -> tuple[dict[int, tuple[int, int]], dict[int, int], dict[int, int]]:
    """Each partition's bounds, and where a read starts and ends: by the offsets options, or by
    time (``startingTimestamp``, ``endingTimestamp``)."""
    group = _Group(conf)
    try:
        parts = group.partitions()
        bounds = {p: group.bounds(p) for p in parts}
        start = ({p: group.bounds(p, conf.starting_timestamp)[0] for p in parts} if conf.starting_timestamp
                 else _resolve(conf.starting, bounds, "start"))
        end = ({p: group.bounds(p, conf.ending_timestamp)[0] for p in parts} if conf.ending_timestamp
               else _resolve(conf.ending, bounds, "end"))
    finally:
        group.close()
    return bounds, start, end


def _offsets_json(offsets: dict[int, int]) -> dict[str, int]:
    return {str(p): offsets[p] for p in sorted(offsets)}


@dataclass
class TandemPartition(InputPartition):
    """Everything ``read()`` needs: it runs on an executor, in another process."""

    url: str
    queue: str
    partition: int
    start: int
    end: int
    fail_on_data_loss: bool

    def __init__(self, url: str, queue: str, partition: int, start: int, end: int, fail_on_data_loss: bool) -> None:
        super().__init__(partition)
        self.url, self.queue, self.partition = url, queue, partition
        self.start, self.end, self.fail_on_data_loss = start, end, fail_on_data_loss


def _read_range(part: TandemPartition) -> Iterator[tuple[Any, ...]]:
    """The rows of offsets [start, end) of one partition, from its active (again after a failover)."""
    conf = Conf(url=part.url, queue=part.queue)
    group = _Group(conf)
    offset = part.start  # the next offset this range expects
    deadline = SYSTEM_CLOCK.monotonic() + READ_PATIENCE
    try:
        while offset < part.end:
            link = group.link_for(part.partition, deadline)
            try:
                msgs, nxt, end = link.read(part.queue, part.partition, offset, READ_BATCH)
                deadline = SYSTEM_CLOCK.monotonic() + READ_PATIENCE  # progress: patience again
            except TandemError as exc:
                group.drop(link)
                if not exc.retriable or SYSTEM_CLOCK.monotonic() >= deadline:
                    raise
                log.warning("reading %s/%d at %d: %s; asking for its active again", part.queue, part.partition,
                            offset, exc)
                continue
            if end < part.end and not msgs and nxt <= offset:
                # this node ends the partition before the range does: it is not (or no longer)
                # the active, whose end the range was planned with; ask again who is
                group.drop(link)
                if SYSTEM_CLOCK.monotonic() >= deadline:
                    raise UnavailableError(f"{part.queue}/{part.partition} ends at {end} on {link.node}, "
                                           f"before the planned {part.end}")
                SYSTEM_CLOCK.sleep_blocking(0.2)  # a moment for the map to change, bounded by the deadline
                continue
            for m in msgs:
                if m.offset >= part.end:
                    break
                if m.offset > offset:  # a hole: acked or purged before it was read
                    _data_lost(part, offset, m.offset)
                yield (part.queue, part.partition, m.offset, m.key, m.headers, m.body,
                       dt.datetime.fromtimestamp(m.timestamp, tz=dt.timezone.utc))
                offset = m.offset + 1
            else:
                if not msgs:
                    # nothing held from here up to what the node returns next: gone
                    upto = min(max(nxt, offset), part.end)
                    if upto > offset:
                        _data_lost(part, offset, upto)
                    offset = upto
                continue
            break  # passed the range's end
    finally:
        group.close()


def _data_lost(part: TandemPartition, start: int, upto: int) -> None:
    text = (f"offsets {start}..{upto - 1} of {part.queue}/{part.partition} are gone (acked or purged) "
            "before they were read")
    if part.fail_on_data_loss:
        raise InvalidArgumentError(text + ": failing (set failOnDataLoss=false to skip them)")
    log.warning("%s: skipped (failOnDataLoss=false)", text)


# -- the data source -------------------------------------------------------------------------------


class TandemDataSource(DataSource):
    """``format("tandem")``: read a queue's partitions by offset, stream them, or publish rows."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.conf = Conf.parse(dict(options))

    @classmethod
    def name(cls) -> str:
        return "tandem"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return TandemBatchReader(self.conf)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return TandemStreamReader(Conf.parse(dict(self.options), streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise InvalidArgumentError("a Tandem queue can only be appended to: use mode('append')")
        return TandemWriter(self.conf, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return TandemStreamWriter(self.conf, schema)


class TandemBatchReader(DataSourceReader):
    def __init__(self, conf: Conf) -> None:
        self.conf = conf

    def partitions(self) -> Sequence[InputPartition]:
        bounds, start, end = _plan(self.conf)
        out: list[InputPartition] = []
        ranges = [(p, start[p], end[p]) for p in sorted(bounds) if end[p] > start[p]]
        slices = max(1, -(-self.conf.min_partitions // max(1, len(ranges)))) if self.conf.min_partitions else 1
        for p, s, e in ranges:
            step = max(1, -(-(e - s) // slices))
            for lo in range(s, e, step):
                out.append(TandemPartition(self.conf.url, self.conf.queue, p, lo, min(e, lo + step),
                                           self.conf.fail_on_data_loss))
        if not out:  # Spark wants at least one
            out.append(TandemPartition(self.conf.url, self.conf.queue, 0, 0, 0, self.conf.fail_on_data_loss))
        return out

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, TandemPartition)
        return _read_range(partition)


class TandemStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets ``{"<partition>": next offset}``; ``maxOffsetsPerTrigger`` caps a micro-batch."""

    def __init__(self, conf: Conf) -> None:
        self.conf = conf
        self._target: dict[str, int] | None = None  # Trigger.AvailableNow: read up to here

    def _latest(self) -> tuple[dict[int, tuple[int, int]], dict[str, int]]:
        group = _Group(self.conf)
        try:
            bounds = {p: group.bounds(p) for p in group.partitions()}
        finally:
            group.close()
        return bounds, _offsets_json({p: b[1] for p, b in bounds.items()})

    def initialOffset(self) -> dict:
        """Resolved once per ``queryId`` and kept (in ``initialOffsetsDir``), so a replay of
        batch 0 reads the same range even after ``earliest`` has moved."""
        path = None
        if self.conf.query_id:
            path = Path(self.conf.offsets_dir) / f"{self.conf.query_id}.json"
            if path.exists():
                stored = json.loads(path.read_text())
                if stored.get("queue") != self.conf.queue:
                    raise InvalidArgumentError(f"queryId {self.conf.query_id!r} was used for queue "
                                               f"{stored.get('queue')!r}: give this query its own (or remove {path})")
                offsets: dict = stored["offsets"]
                return offsets
        offsets = _offsets_json(_plan(self.conf)[1])
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"queue": self.conf.queue, "offsets": offsets}))
            os.replace(tmp, path)
        return offsets

    def prepareForTriggerAvailableNow(self) -> None:
        _, self._target = self._latest()

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.conf.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        latest = self._target if self._target is not None else self._latest()[1]
        end = {k: max(int(start.get(k, 0)), v) for k, v in latest.items()}
        if isinstance(limit, ReadMaxRows):
            budget = limit.max_rows
            capped = {k: int(start.get(k, 0)) for k in end}
            while budget > 0:  # a fair share per partition, round after round
                open_ = [k for k in end if capped[k] < end[k]]
                if not open_:
                    break
                share = max(1, budget // len(open_))
                for k in open_:
                    take = min(share, end[k] - capped[k], budget)
                    capped[k] += take
                    budget -= take
                    if budget <= 0:
                        break
            end = capped
        return {k: end[k] for k in sorted(end, key=int)}

    def reportLatestOffset(self) -> dict | None:
        return self._latest()[1]

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return [TandemPartition(self.conf.url, self.conf.queue, int(k), int(start.get(k, 0)), int(v),
                                self.conf.fail_on_data_loss)
                for k, v in sorted(end.items(), key=lambda kv: int(kv[0])) if int(v) > int(start.get(k, 0))]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, TandemPartition)
        return _read_range(partition)

    def commit(self, end: dict) -> None:
        log.debug("tandem source committed %s", end)
