"""The receiving side of a streamed snapshot (broker.modes.replicated.transport): parts are written
as they arrive, in order, from one active and term; the end is passed to the core only after
all of its parts; a stream a replica has no need of is ignored whole."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

from broker.peers.codec import encode_chunk, encode_message, encode_replicate, encode_streamed
from broker.modes.replicated.transport import Transport
from ha.messages import InstallSnapshot, SnapshotChunk
from storage.base import Append, PartitionState, StoredMessage

KEY = (1, 0)


@dataclass
class Core:
    term: int = 3
    leader: str | None = "node1"
    commit: int = 0


@dataclass
class Log:
    key: tuple[int, int]
    replica: Core
    name: str = "q/0"


@dataclass
class Writer:
    submitted: list[list[Any]] = field(default_factory=list)

    def submit(self, ops: list[Any], *, sync: bool, callback: Any = None, lazy: bool = False) -> None:
        self.submitted.append(ops)


@dataclass
class Config:
    name: str = "node4"


@dataclass
class Host:
    writer: Writer = field(default_factory=Writer)
    config: Config = field(default_factory=Config)


def transport(commit: int = 0) -> tuple[Transport, dict[Any, Log], Host, list[str]]:
    host = Host()
    logs: dict[Any, Log] = {KEY: Log(KEY, Core(commit=commit))}
    restarts: list[str] = []

    def restart(plog: Any, why: str) -> Any:
        restarts.append(why)
        logs[KEY] = Log(KEY, Core(term=plog.replica.term, leader=None))
        return logs[KEY]

    t = Transport(host.config, None, logs, engine=None, queues=None,  # type: ignore[arg-type]
                  writer=host.writer, peers=None, group_state=dict, release_held=lambda _p: None,
                  spawn=lambda _c: None, restart=restart)
    return t, logs, host, restarts


def frame(*msgs: Any) -> bytes:
    return encode_replicate([[KEY[0], KEY[1], encode_message(m)] for m in msgs])


def part(seq: int, offsets: list[int], term: int = 3, index: int = 50) -> SnapshotChunk:
    return SnapshotChunk(term, "node1", index, seq, encode_chunk(
        [StoredMessage(o, None, b"", b"m%d" % o, None, None, 1.0) for o in offsets]))


def end(parts: int, term: int = 3, index: int = 50) -> InstallSnapshot:
    return InstallSnapshot(term, "node1", index, 3, "node1", encode_streamed(PartitionState(next_offset=9), parts))


def test_parts_are_written_in_order_and_the_end_reaches_the_core() -> None:
    t, _logs, host, restarts = transport()
    assert list(t.receive("node1", frame(part(0, [0, 1]), part(1, [4])))) == []
    assert len(restarts) == 1  # the first part starts the partition over
    assert [type(op) for ops in host.writer.submitted for op in ops] == [Append, Append]
    ((_plog, msg),) = list(t.receive("node1", frame(end(2))))
    assert isinstance(msg, InstallSnapshot) and msg.index == 50


def test_a_part_out_of_order_drops_the_stream_and_its_end() -> None:
    t, _logs, host, _restarts = transport()
    list(t.receive("node1", frame(part(0, [0]), part(2, [5]), part(1, [3]))))
    assert len(host.writer.submitted) == 1
    assert list(t.receive("node1", frame(end(3)))) == []


def test_parts_of_another_active_or_an_older_term_are_not_taken() -> None:
    t, _logs, host, restarts = transport()
    assert list(t.receive("node1", frame(part(0, [0], term=2)))) == []  # a deposed active's
    assert restarts == [] and host.writer.submitted == []
    list(t.receive("node1", frame(part(0, [0]))))
    list(t.receive("node2", frame(part(1, [1]))))  # not the stream's sender
    assert list(t.receive("node1", frame(end(2)))) == []


def test_a_stream_the_replica_has_committed_is_ignored_whole() -> None:
    t, _logs, host, restarts = transport(commit=60)
    assert list(t.receive("node1", frame(part(0, [0]), part(1, [1]), end(2)))) == []
    assert restarts == [] and host.writer.submitted == []


def test_a_whole_snapshot_still_goes_to_the_core() -> None:
    t, _logs, _host, _restarts = transport()
    whole = InstallSnapshot(3, "node1", 50, 3, "node1", msgpack.packb([9, 0, {}, []]))
    ((_plog, msg),) = list(t.receive("node1", frame(whole)))
    assert msg == whole
