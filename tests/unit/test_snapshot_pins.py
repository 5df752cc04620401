"""The sending side of a streamed snapshot (broker.modes.replicated.transport): after a
stream, the active sends the replica no other until its answer may no longer come.  A stream
that ended (its end sent) waits for that answer; one that stopped before its end, on a link
that has gone since, can never be answered, so the next may start as soon as a new link is up
(the replica restarted, say), not PIN_TIMEOUTS non-response timeouts later."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from broker.modes.replicated.transport import PIN_TIMEOUTS, Transport
from client.testing import FakeClock
from ha.messages import InstallSnapshot
from ha.replica import Role
from storage.base import PartitionState, StoredMessage

pytestmark = pytest.mark.asyncio

KEY = (1, 0)
TIMEOUT = 0.5


@dataclass
class Core:
    role: Role = Role.LEADER
    term: int = 3
    snap_index: int = 0

    def progress(self) -> dict[str, int]:
        return {}

    def members_at(self, index: int) -> Any:
        return None


@dataclass
class Log:
    replica: Core = field(default_factory=Core)


@dataclass
class Config:
    non_response_timeout: float = TIMEOUT
    objects_locked_per_transaction: int = 2


class Writer:
    def submit(self, ops: list[Any], *, sync: bool, callback: Any = None, lazy: bool = False) -> None:
        if callback is not None:
            callback(None)


class Engine:
    """A partition of six messages at index 50."""

    def load_partition(self, queue: int, partition: int, budget: int) -> PartitionState:
        return PartitionState(next_offset=6, applied=(50, 3, "node1"))

    def read(self, queue: int, partition: int, offset: int, limit: int) -> list[StoredMessage]:
        return [StoredMessage(o, None, b"", b"m", None, None, 1.0) for o in range(offset, min(6, offset + limit))]


class Link:
    """A link that takes every part; ``cut``: the next part finds it gone."""

    def __init__(self, cut: bool = False) -> None:
        self.cut, self.sent = cut, 0

    def send(self, frame: Any) -> None:
        self.sent += 1

    async def drain(self) -> None:
        if self.cut:
            raise ConnectionResetError("gone")


@dataclass
class Peers:
    links: dict[str, Link] = field(default_factory=dict)
    epoch: int = 1


def transport(peers: Peers, clock: FakeClock) -> Transport:
    t = Transport(Config(), clock, {KEY: Log()}, engine=Engine(), writer=Writer(),  # type: ignore[arg-type,dict-item]
                  peers=peers, queues=None, group_state=dict,  # type: ignore[arg-type]
                  release_held=lambda _p: None, spawn=lambda _c: None, restart=lambda p, _w: p)
    t._acks[(KEY, "node4")] = (50, 10)  # (the replica has written every part)
    return t


def ask() -> InstallSnapshot:
    return InstallSnapshot(3, "node1", 50, 3, "node1", None)


async def test_a_stream_cut_with_its_link_lets_the_next_start_once_a_new_link_is_up() -> None:
    clock, peers = FakeClock(), Peers({"node4": Link(cut=True)})
    t = transport(peers, clock)
    await t._send_snapshot(KEY, "node4", ask())  # stops after its first part: the link went
    assert t.streamed_at(KEY, {}) == 50  # the entries after 50 kept: the same link may still carry an answer
    del peers.links["node4"]
    peers.links["node4"] = new = Link()  # the replica back, on a new link
    assert t.streamed_at(KEY, {}) is None  # no answer to the cut stream can come
    await t._send_snapshot(KEY, "node4", ask())
    assert new.sent == 4  # three parts of two messages and the end: a new stream, at once


async def test_a_stream_that_ended_waits_for_its_answer_even_over_a_new_link() -> None:
    clock, peers = FakeClock(), Peers({"node4": Link()})
    t = transport(peers, clock)
    await t._send_snapshot(KEY, "node4", ask())
    peers.links["node4"] = new = Link()
    await t._send_snapshot(KEY, "node4", ask())
    assert new.sent == 0 and t.streamed_at(KEY, {}) == 50  # the replica may still answer the first
    assert t.streamed_at(KEY, {"node4": 50}) is None  # its answer: done
    t._pins[(KEY, "node4")] = (50, clock.monotonic(), 0)
    clock.advance(PIN_TIMEOUTS * TIMEOUT + 0.1)
    assert t.streamed_at(KEY, {}) is None  # or no answer for PIN_TIMEOUTS non-response timeouts


async def test_a_cut_stream_over_the_same_link_waits_as_one_that_ended() -> None:
    clock, peers = FakeClock(), Peers({"node4": Link(cut=True)})
    t = transport(peers, clock)
    await t._send_snapshot(KEY, "node4", ask())
    await t._send_snapshot(KEY, "node4", ask())
    assert peers.links["node4"].sent == 1  # not again over the link the first was on
    clock.advance(PIN_TIMEOUTS * TIMEOUT + 0.1)
    assert t.streamed_at(KEY, {}) is None
