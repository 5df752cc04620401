"""A restore run in the group (broker.partitions.restore_run) on one member, with the real
delivery path and quarantine queue and stand-ins for the store, the group and the publish
path, on a FakeClock: what it reports when the quarantine's partition moves to another
member during the run, or before it starts."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

import pytest

from broker.config import NodeConfig
from broker.messaging.delivery import Delivery
from broker.messaging.forward import RestoreFwd
from broker.messaging.outcome import Outcome
from broker.messaging.publish import PublishRequest, PublishResult
from broker.messaging.holders import revoke_deliveries
from broker.messaging.message import MemoryBudget, Msg, encode_headers
from broker.messaging.queues import Queue, Recipient
from broker.messaging.streams import Produced
from broker.partitions import restore_run
from broker.partitions.quarantine import QUEUE
from broker.partitions.restore import COUNTERS, Filter, Report
from broker.partitions.restore_run import Restores
from client.clock import Clock
from client.protocol.frames import StreamMessage
from client.testing import FakeClock
from storage.base import QueueMeta, StoredMessage, WriteOp
from storage.writer import Callback

pytestmark = pytest.mark.asyncio

HELD = 20  # quarantined messages of q, partition 0, offsets 0..19
PER_BATCH = 5  # messages per publish (restore_run.BATCH, made small)


def quarantined(i: int) -> Msg:
    h = {"x-quarantine-queue": "q", "x-quarantine-partition": "0", "x-quarantine-offset": str(i),
         "x-quarantine-id": f"0-{i}", "x-quarantine-node": "node3", "x-quarantine-term": "2",
         "x-quarantine-written": "node3.2", "x-quarantine-confirmed": "true"}
    return Msg(0, i, f"k{i}", h, encode_headers(h), f"solo-{i}".encode(), f"quarantine.node3.{i}", i, 0.0)


class Member:
    """The member the run is on: it serves the quarantine's one partition until :meth:`lose`
    (what the node does when another member becomes its active: broker.node.holding)."""

    def __init__(self) -> None:
        self.clock: Clock = FakeClock(autojump=True)
        self.config = NodeConfig(name="node2")
        self.users: Any = None
        self.guard = self
        self.acls: Any = None
        self.has_quorum = True
        self.local_holders: set[Recipient] = set()
        self.events: list[str] = []
        self.serving = True
        self.q = Queue(QueueMeta(id=9, name=QUEUE, partitions=1, mapper="round_robin", ring_size=1,
                                 max_deliveries=0, dead_letter_queue=None, max_length=0), MemoryBudget(0))
        self.q.add_ready(self.q.partitions[0], [quarantined(i) for i in range(HELD)])

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def queues(self) -> dict[str, Queue]:
        return {QUEUE: self.q}

    def queue(self, name: str) -> Queue:
        return self.queues[name]

    def check_prefetch(self, prefetch: int) -> None:
        pass

    def serves(self, q: Queue, pidx: int) -> bool:
        return self.serving

    def write_later(self, ops: list[WriteOp], callback: Callback | None = None, *, lazy: bool = True) -> None:
        if callback is not None:
            callback(None)

    def restore_event(self, text: str) -> None:
        self.events.append(text)

    def lose(self) -> None:
        self.serving = False
        self.q.clear_partition(0)
        revoke_deliveries(self.local_holders, self.q, 0)

    # (delivery's host: what a restore's deliveries do not reach)
    commit: Any = None

    def dead_letter_remote(self, src: Queue, m: Msg, dlq: Queue, headers: dict[str, str]) -> None:
        raise AssertionError("no dead-lettering here")

    async def read_cold(self, q: Queue, pidx: int, offset: int, limit: int) -> tuple[int, list[StoredMessage]]:
        raise AssertionError("no cold region here")

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        coro.close()
        raise AssertionError("no cold region here")


class Source:
    """The group: q's partition 0 ends at 60 (each quarantined id names another message there);
    the publish path stores what it is given, and runs ``during`` while it does the
    ``at``-th publish."""

    def __init__(self, at: int = 0, during: Any = None) -> None:
        self.published: list[bytes] = []
        self.at, self.during = at, during

    async def read_stream(self, queue: str, partition: int, offset: int, max_messages: int,
                          *, hops: int = 0) -> tuple[list[StreamMessage], int, int]:
        return [], offset, 60

    async def produced(self, queue: str, partition: int, producer: str, offset: int,
                       *, hops: int = 0) -> Produced:
        raise AssertionError("no producer to look for")

    async def quarantine_actives(self) -> list[str]:
        return ["node2"]

    async def forward(self, who: str, request: RestoreFwd) -> bytes:
        raise AssertionError("the run is here")

    def publish(self, req: PublishRequest) -> Outcome[PublishResult]:
        self.published += [m.body for m in req.messages]
        if len(self.published) // PER_BATCH == self.at and self.during is not None:
            self.during()
        out: Outcome[PublishResult] = Outcome()
        out.set_result(PublishResult(len(req.messages), 0))
        return out


def counted(**counts: dict[str, int]) -> dict[str, Any]:
    """A report's JSON with these counters (the others empty)."""
    return {**{name: {} for name in COUNTERS}, **counts}


def restores(member: Member, source: Source) -> Restores:
    return Restores(member, source, Delivery(member, member, member), source)


@pytest.fixture(autouse=True)
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(restore_run, "BATCH", PER_BATCH)


async def test_a_run_left_undisturbed_restores_every_message_and_takes_each_out() -> None:
    member, source = Member(), Source()
    report = await restores(member, source).run(Filter(), "admin")
    assert report.json() == counted(restored={"q": HELD}, conflicts={"q": HELD})
    assert len(source.published) == HELD and member.q.depth == 0
    assert member.events and member.events[0].startswith(f"restore by admin: {HELD} message(s) restored to q")


async def test_a_run_whose_partition_moves_away_says_it_stopped_early() -> None:
    """The quarantine's partition moves to another member while the second batch is
    published: the deliveries the run held are revoked (that member delivers them again).
    The report counts the 10 it published and says it stopped early with more to do."""
    member = Member()
    source = Source(at=2, during=member.lose)
    report = await restores(member, source).run(Filter(origin="node3"), "admin")
    assert len(source.published) == 2 * PER_BATCH
    assert report.json() == {**counted(restored={"q": 10}, conflicts={"q": 10}), "more": True, "moved": True}
    assert report.lines(narrowed=True)[-1] == (
        f"stopped early: a partition of {QUEUE} moved to another member during the run, and {QUEUE} may hold "
        f"more; run it again (nothing is stored twice)")
    assert Report.from_json(report.json()) == report  # (what the member asked gets)


async def test_a_run_asked_of_a_member_that_no_longer_serves_the_quarantine_says_so() -> None:
    """Between the member asked looking up the quarantine's active and the run there, the
    partition moved: the run finds nothing of it, and says why instead of "nothing to restore"."""
    member, source = Member(), Source()
    member.lose()
    report = await restores(member, source).run(Filter(), "admin")
    assert not source.published
    assert report.json() == {**counted(), "more": True, "moved": True}
    assert not report.lines(narrowed=False)[-1].startswith("nothing to restore")
