"""Nothing HA-1014 discards is thrown away: the quarantine.

When a group heals after a split brain (a quorum override or a designated primary on both
sides), the side that loses discards the entries the others do not have (HA-1014,
docs/ha.md).  Their messages are kept: at the moment of the discard this node writes them to
a spool file in its data directory (``quarantine/``, fsynced), then publishes them to the
queue :data:`QUEUE` of the group, and deletes the file once they are confirmed there.  Each
quarantined message keeps its key, headers and body, with headers saying where it came from
(:data:`HEADERS`).  The operator reads them there (``tandem consume tandem.quarantine``, the
console) and merges them back with ``tandem restore`` (broker/tools/restore_cli.py), which
republishes each to its queue as it is now: the surviving side is the source and a discarded
message is an instance added to it.

A spool file's messages go out under the producer id ``quarantine.<node>.<file>`` with their
place in the file as sequence numbers, so a publish cut short by a stop is not stored twice
when it is made again.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, Protocol

import msgpack

from broker.messaging.outcome import Outcome
from broker.messaging.publish import PublishRequest, PublishResult
from broker.messaging.message import decode_headers
from client.clock import Clock
from client.errors import AccessRefusedError, TandemError
from client.protocol.frames import Declare, PublishMessage, QueueInfo
from storage.base import Append, WriteOp

log = logging.getLogger("tandem.broker")

#: the queue discarded messages are kept in
QUEUE = "tandem.quarantine"

#: headers of a quarantined message: where it was and why it is here
HEADERS = ("x-quarantine-queue", "x-quarantine-partition", "x-quarantine-offset", "x-quarantine-id",
           "x-quarantine-producer", "x-quarantine-seq", "x-quarantine-node", "x-quarantine-term",
           "x-quarantine-confirmed", "x-quarantine-reason", "x-quarantine-from", "x-quarantine-written")

#: seconds between two tries to publish what is spooled (no quorum, say)
RETRY = 2.0

#: messages per publish
BATCH = 200


def refuse_client_write(queue: str, what: str) -> None:
    """Only the group writes the quarantine: a client's publish could forge a quarantined
    message that a restore, run by an admin, would put in a queue the client may not write.
    (A client's declare, which could give it settings that drop what HA-1014 kept, and a
    dead-letter queue naming it are refused with every name of the node's namespace,
    ``broker.security.acl.RESERVED_PREFIX``.)"""
    if queue == QUEUE:
        raise AccessRefusedError(f"{what}: {QUEUE} is written by the group only (what HA-1014 discarded); "
                                 f"read, consume, purge or delete it, and tandem restore merges it back")


class QuarantineHost(Protocol):
    clock: Clock

    @property
    def data_dir(self) -> Path: ...

    @property
    def name(self) -> str: ...

    def queue_name(self, queue_id: int) -> str | None: ...

    async def declare(self, frame: Declare) -> tuple[QueueInfo, bool]: ...

    def publish(self, req: PublishRequest) -> Outcome[PublishResult]: ...

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...


class Quarantine:
    def __init__(self, node: QuarantineHost) -> None:
        self.node = node
        self._draining = False
        self.kept = 0  # messages spooled since start

    @property
    def dir(self) -> Path:
        return self.node.data_dir / "quarantine"

    def keep(self, key: tuple[int, int], term: int, first_index: int, entries: Sequence[list[WriteOp]],
             confirmed: int, written: Sequence[tuple[str, int]] = ()) -> int:
        """The ops of the entries HA-1014 discarded for partition ``key`` (from index
        ``first_index``, in term ``term``; the first ``confirmed`` of them this node had
        confirmed; ``written``: who wrote each, in which term): their messages spooled,
        fsynced, before anything else happens to them.
        How many; their acknowledgements (Settle) are not kept: the source's state wins, and
        those messages are delivered again there."""
        queue = self.node.queue_name(key[0]) or f"#{key[0]}"
        if queue == QUEUE:
            # The quarantine's own writes come from spool files, published again until they
            # are confirmed: one not confirmed is still spooled, and kept again it would be
            # there twice.  A confirmed one's file is gone: it is kept.
            entries = entries[:confirmed]
        records = []
        # where the logs part: the source stored its own messages of this partition from here
        # on (a restore looks there for a producer's resends, broker.partitions.restore)
        since = min((op.messages[0].offset for ops in entries for op in ops
                     if isinstance(op, Append) and op.messages), default=0)
        for i, ops in enumerate(entries):
            # (the same entry discarded on two nodes, its writer's followers: the same writes)
            origin, wterm = written[i] if i < len(written) else (self.node.name, term)
            for op in ops:
                if not isinstance(op, Append):
                    continue
                for m in op.messages:
                    headers = decode_headers(m.headers_blob)
                    headers.update(zip(HEADERS, (
                        queue, str(key[1]), str(m.offset), headers.get("x-tandem-id") or f"{key[1]}-{m.offset}",
                        m.producer_id or "", "" if m.seq is None else str(m.seq), self.node.name, str(term),
                        "true" if i < confirmed else "false",
                        f"HA-1014: discarded on {self.node.name} when the group healed (term {term})",
                        str(since), f"{origin}.{wterm}")))
                    records.append([m.key, headers, m.body])
        if not records:
            return 0
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"{key[0]}.{key[1]}.{term}.{first_index}.msgpack"
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(msgpack.packb(records, use_bin_type=True))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        self.kept += len(records)
        log.error("HA-1014 partition %s/%d on %s: %d discarded message(s) kept for the quarantine queue %s "
                  "(tandem restore merges them back)", queue, key[1], self.node.name, len(records), QUEUE)
        self.drain()
        return len(records)

    def drain(self) -> None:
        """Publish what is spooled, in the background, until none is left."""
        if not self._draining and self.dir.is_dir() and any(self.dir.glob("*.msgpack")):
            self._draining = True
            self.node.spawn(self._drain())

    async def _drain(self) -> None:
        try:
            while True:
                files = sorted(self.dir.glob("*.msgpack"))
                if not files:
                    return
                try:
                    for path in files:
                        await self._publish(path)
                        path.unlink()
                except (TandemError, OSError, ValueError) as exc:
                    why = exc.message if isinstance(exc, TandemError) else str(exc)
                    log.warning("quarantine: publishing %d spooled file(s) to %s failed (%s): again in %.0f s",
                                len(files), QUEUE, why, RETRY)
                    await self.node.clock.sleep(RETRY)
        finally:
            self._draining = False

    async def _publish(self, path: Path) -> None:
        records = msgpack.unpackb(path.read_bytes(), raw=False)
        await self.node.declare(Declare(rid=0, queue=QUEUE, partitions=1))
        pid = f"quarantine.{self.node.name}.{path.stem}"
        for i in range(0, len(records), BATCH):
            await self.node.publish(PublishRequest(QUEUE, pid, [
                PublishMessage(k, h, b, i + j) for j, (k, h, b) in enumerate(records[i:i + BATCH])]))
        log.warning("quarantine: %d message(s) of %s are in %s", len(records), path.stem, QUEUE)
