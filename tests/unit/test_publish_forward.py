"""broker.messaging.publish: a batch for a partition another member serves, forwarded there, on a host
whose group view the test scripts (who is active, what a forward answers) and a fake clock."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from types import SimpleNamespace
from typing import Any

import pytest

from broker.messaging.forward import MAX_HOPS, ForwardRequest, PublishFwd, pack_reply
from broker.messaging.publish import Publisher, PublishRequest, PublishResult
from broker.messaging.queues import Queue
from client.errors import UnavailableError
from client.protocol.frames import PublishMessage
from client.testing import FakeClock
from storage.base import QueueMeta


class _Commit:
    catalogue_log = True

    def __init__(self, clock: FakeClock, actives: list[str]) -> None:
        self.clock = clock
        self.actives = actives  # who each wait_active names, the last one from then on

    def serving(self, key: tuple[int, int]) -> bool:
        return False

    def serves_together(self, keys: object) -> bool:
        return False

    async def wait_active(self, key: tuple[int, int], timeout: float) -> str:
        return self.actives.pop(0) if len(self.actives) > 1 else self.actives[0]

    async def wait_change(self, timeout: float) -> None:
        await self.clock.sleep(timeout)


class _Host:
    def __init__(self, name: str, actives: list[str], answers: dict[str, BaseException | bytes]) -> None:
        self.clock = FakeClock(autojump=True)
        self.stopping = False
        self.config = SimpleNamespace(name=name)
        self.commit = _Commit(self.clock, actives)
        self.election_wait = 5.0
        self.answers = answers
        self.forwarded: list[tuple[str, int]] = []  # (to whom, hops)
        self.q = Queue(QueueMeta(id=1, name="q", partitions=1, mapper="jump_hash", ring_size=1024,
                                     max_deliveries=0, dead_letter_queue=None, max_length=0))
        self.tasks: set[asyncio.Task[Any]] = set()

    def queue(self, name: str) -> Queue:
        return self.q

    async def forward(self, who: str, request: ForwardRequest) -> bytes:
        assert isinstance(request, PublishFwd)
        self.forwarded.append((who, request.hops))
        answer = self.answers[who]
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


def _request(hops: int) -> PublishRequest:
    return PublishRequest("q", "P", [PublishMessage(None, {}, b"m", 0)], partition=0, hops=hops)


@pytest.mark.asyncio
async def test_a_publish_whose_hops_are_spent_is_refused_at_once_not_after_the_election_wait() -> None:
    """It reached a member that does not serve its partition after MAX_HOPS forwards: that
    member answers "retry" at once (forwarding it on would pass the limit, and waiting
    changes nothing for it), so the members it passed, which retry until their own election
    wait, still have the time to reach the active."""
    host = _Host("b", ["c"], {"c": pack_reply([1, 0, -1])})
    with pytest.raises(UnavailableError, match="forwarded too many times"):
        await Publisher(host).publish(_request(MAX_HOPS))  # type: ignore[arg-type]
    assert host.forwarded == [] and host.clock.monotonic() == 0.0
    await host.clock.aclose()


@pytest.mark.asyncio
async def test_the_member_it_passed_retries_and_reaches_the_active() -> None:
    """The first forward bounced (the member it reached had its hops spent: the group was
    moving the partition); a moment later the view names the active and the batch is
    stored there, with this member's hop count, not the bounced one's."""
    host = _Host("a", ["b", "c"], {"b": UnavailableError("publish forwarded too many times while the group "
                                                           "elects: retry"), "c": pack_reply([1, 0, -1])})
    result = await Publisher(host).publish(_request(0))  # type: ignore[arg-type]
    assert result == PublishResult(1, 0, -1)
    assert host.forwarded == [("b", 1), ("c", 1)]
    await host.clock.aclose()
