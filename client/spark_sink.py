"""The PySpark sink (``df.write.format("tandem")``, ``writeStream.format("tandem")``): every row
in the queue exactly once, through a retried task, a speculative copy of one and a streaming
query restarted from its checkpoint (docs/spark.md, "The sink").

Each task writes its rows in one transaction (docs/transactions.md) of a producer named after
the write and the task's partition:

* a batch write: ``spark-<the write's id>-<partition>``, batch 0;
* a streaming query: ``spark-<digest of the query's id and the queue>-<partition>``, and the
  micro-batch's id as the transaction's batch.

A task attempt first starts its producer again (``TxInit``): its epoch goes up, so an earlier
attempt of the same partition (failed, or a speculative copy still running) can no longer
commit.  If the producer committed this batch already (an earlier attempt committed and then
failed to report, or the query restarted from its checkpoint after this task's commit), the
attempt writes nothing.  Otherwise it publishes its rows in the transaction and commits it with
the batch: the rows appear together, once; an attempt that fails aborts what it published.

A micro-batch run again must give each partition the same rows (a deterministic query), as for
any idempotent sink (Delta's ``txnAppId``/``txnVersion`` asks the same).
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from client import blocking
from client.errors import InvalidArgumentError
from client.protocol.frames import PublishMessage
from client.spark_options import Conf

log = logging.getLogger("tandem.spark")

#: rows per publish: a task's transaction is published in batches of at most this many rows and bytes
WRITE_BATCH = 500
WRITE_BATCH_BYTES = 4 * 1024 * 1024  # well under a node's default max_frame_size (8 MiB)


@dataclass
class SinkCommit(WriterCommitMessage):
    partition: int
    written: int  # rows this attempt committed
    skipped: bool  # the producer had committed this batch already: nothing written again


class TandemWriter(DataSourceWriter):
    def __init__(self, conf: Conf, schema: StructType) -> None:
        self.conf = conf
        from pyspark.sql.types import BinaryType, MapType, StringType

        types = {f.name: f.dataType for f in schema.fields}
        if not isinstance(types.get("body"), (BinaryType, StringType)):
            raise InvalidArgumentError("the rows to write need a body column of type binary or string "
                                       f"(got {types.get('body')}); key (string) and headers (map<string,string>) "
                                       "are optional")
        if "key" in types and not isinstance(types["key"], StringType):
            raise InvalidArgumentError(f"column key must be a string (got {types['key']}): cast it")
        if "headers" in types and not (isinstance(types["headers"], MapType)
                                       and isinstance(types["headers"].keyType, StringType)
                                       and isinstance(types["headers"].valueType, StringType)):
            raise InvalidArgumentError(f"column headers must be map<string,string> (got {types['headers']})")
        self.has_key, self.has_headers = "key" in types, "headers" in types
        # one id per write (made here, on the driver, and pickled to every task): with the task's
        # partition it names the task's producer, the same for each attempt
        self.run_id = uuid.uuid4().hex[:16]

    def producer_and_batch(self, ctx: Any) -> tuple[str, int]:
        """The task's transactional producer, and the batch it writes."""
        return f"spark-{self.run_id}-{ctx.partitionId() if ctx is not None else 0}", 0

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        part = ctx.partitionId() if ctx is not None else 0
        tid, batch = self.producer_and_batch(ctx)
        with blocking.connect(self.conf.url, client_name="tandem-spark-sink", timeout=60) as conn:
            producer = conn.init_producer(tid, again=True)  # (an earlier attempt can no longer commit)
            if producer.batch >= batch:
                log.info("tandem sink: %s wrote batch %d already: nothing to write again", tid, batch)
                return SinkCommit(part, 0, True)
            tx = conn.begin(tid)
            written = 0
            try:
                pending: list[PublishMessage] = []
                size = 0
                for row in iterator:
                    m = self._message(row)
                    msize = len(m.body) + 64 + len(m.key or "") + sum(len(k) + len(v) + 10
                                                                      for k, v in m.headers.items())
                    if pending and (len(pending) >= WRITE_BATCH or size + msize > WRITE_BATCH_BYTES):
                        written += tx.publish_messages(self.conf.queue, pending)
                        pending, size = [], 0
                    pending.append(m)
                    size += msize
                if pending:
                    written += tx.publish_messages(self.conf.queue, pending)
                if not tx.commit(batch=batch):
                    return SinkCommit(part, 0, True)  # (another attempt committed it first)
            except BaseException:
                try:
                    tx.abort()
                except Exception as exc:  # (the task's own error is the one to raise; the group aborts it anyway)
                    log.warning("tandem sink: aborting %s failed (%s): the group aborts it", tx.id, exc)
                raise
        return SinkCommit(part, written, False)

    def _message(self, row: Any) -> PublishMessage:
        body = row["body"]
        if body is None:
            raise InvalidArgumentError("a row's body is null")
        data = body.encode() if isinstance(body, str) else bytes(body)
        key = row["key"] if self.has_key else None
        headers = dict(row["headers"] or {}) if self.has_headers else {}
        return PublishMessage(None if key is None else str(key), headers, data, None)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        done = [m for m in messages if isinstance(m, SinkCommit)]
        log.info("tandem sink: %d rows committed to %s by %d tasks (%d had committed already)",
                 sum(m.written for m in done), self.conf.queue, len(done), sum(m.skipped for m in done))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        done = [m for m in messages if isinstance(m, SinkCommit)]
        log.warning("tandem sink aborted: %d tasks had committed %d rows to %s (they stay; a retried write "
                    "writes under a new id)", len(done), sum(m.written for m in done), self.conf.queue)


class TandemStreamWriter(TandemWriter, DataSourceStreamWriter):
    def producer_and_batch(self, ctx: Any) -> tuple[str, int]:
        query = ctx.getLocalProperty("sql.streaming.queryId") if ctx is not None else None
        batch = ctx.getLocalProperty("streaming.sql.batchId") if ctx is not None else None
        if not query or batch is None:
            raise InvalidArgumentError("tandem sink: the task does not say its streaming query and micro-batch "
                                       "(sql.streaming.queryId, streaming.sql.batchId)")
        digest = hashlib.blake2b(f"{query}\0{self.conf.queue}".encode(), digest_size=8).hexdigest()
        return f"spark-{digest}-{ctx.partitionId()}", int(batch)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # type: ignore[override]
        done = [m for m in messages if isinstance(m, SinkCommit)]
        log.info("tandem sink, batch %d: %d rows committed to %s (%d tasks had committed already)", batchId,
                 sum(m.written for m in done), self.conf.queue, sum(m.skipped for m in done))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # type: ignore[override]
        log.warning("tandem sink, batch %d aborted: the tasks that committed stay committed, and the batch "
                    "run again writes only the others", batchId)
