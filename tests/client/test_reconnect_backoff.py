"""The durable connection's reconnect on a FakeClock: the keeper re-dials with a jittered
backoff that grows and is capped, and reconnects at the exact fake time those delays
add up to, without a real wait."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from client.clock import Backoff
from client.durable import ConnectionEvent, DurableConnection
from client.errors import ConnectionClosedError, TandemError, TimeoutError_
from client.testing import FakeClock
from client.url import parse_url

pytestmark = pytest.mark.asyncio

SEED = 20


class FakeLink:
    """What the durable connection uses of a link while it only keeps the primary."""

    max_message_size = 5 * 1024 * 1024
    max_frame_size = 8 * 1024 * 1024

    def __init__(self, node: str) -> None:
        self.node = node
        self.is_closed = False
        self.closed_by_client = False
        self.on_map_changed = None
        self.on_closed = None

    def drop(self) -> None:
        """The node went away."""
        self.is_closed = True
        assert self.on_closed is not None
        self.on_closed(self, ConnectionClosedError("connection lost"))

    async def close(self, *, timeout: float = 5.0) -> None:
        self.closed_by_client = self.is_closed = True


class Dialer:
    """Stands in for the sockets: records when each dial came, refuses while ``down``."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.down = False
        self.at: list[float] = []
        self.links: list[FakeLink] = []

    async def __call__(self, host: str, port: int) -> FakeLink:
        self.at.append(self.clock.monotonic())
        if self.down:
            raise OSError("connection refused")
        link = FakeLink("node1")
        self.links.append(link)
        return link


@pytest_asyncio.fixture
async def clock() -> AsyncIterator[FakeClock]:
    c = FakeClock(autojump=True)
    yield c
    await c.aclose()


async def _connect(clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> tuple[DurableConnection, Dialer]:
    conn = DurableConnection(parse_url("tandem://admin:pw@h1:7780"), clock=clock)
    conn._rng = random.Random(SEED)
    dialer = Dialer(clock)
    monkeypatch.setattr(conn, "_open_link", dialer)
    await conn._open()
    return conn, dialer


async def test_reconnect_backs_off_growing_and_capped_and_happens_at_the_fake_time_expected(
        clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    conn, dialer = await _connect(clock, monkeypatch)
    events: list[ConnectionEvent] = []
    conn.on_event(events.append)
    assert conn.connected and dialer.at == [0.0]

    failures = 10
    clock.advance(7.0)
    dialer.down = True
    dialer.links[0].drop()
    assert not conn.connected
    while len(dialer.at) < 1 + failures:
        await clock.sleep(0.001)
    dialer.down = False
    primary = await conn.primary()
    assert primary is dialer.links[-1] and not primary.is_closed

    expected = Backoff(rng=random.Random(SEED))
    delays = [expected.next() for _ in range(len(dialer.at) - 2)]
    gaps = [b - a for a, b in zip(dialer.at[1:], dialer.at[2:])]
    assert gaps == pytest.approx(delays)
    assert dialer.at[1] == 7.0  # the first re-dial comes at once
    for k, gap in enumerate(gaps):  # full jitter over min(cap, first * 2**k)
        base = min(2.0, 0.05 * 2 ** k)
        assert base / 2 <= gap <= base
    assert max(gaps) <= 2.0 and min(gaps[-3:]) >= 1.0  # capped: the last waits are all near the cap
    assert clock.monotonic() == pytest.approx(7.0 + sum(delays))  # reconnected when they add up
    assert [e.kind for e in events] == ["disconnected"]  # the same node again: no failover
    await conn.close()


async def test_the_backoff_starts_over_after_a_reconnect(clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    conn, dialer = await _connect(clock, monkeypatch)
    for _round in range(2):
        start = len(dialer.at)
        dialer.down = True
        dialer.links[-1].drop()
        while len(dialer.at) < start + 4:
            await clock.sleep(0.001)
        dialer.down = False
        await conn.primary()
        gaps = [b - a for a, b in zip(dialer.at[start:], dialer.at[start + 1:])]
        assert gaps[0] <= 0.05  # the first wait of each outage is the shortest
    await conn.close()


async def test_waiting_for_the_primary_times_out_on_the_fake_clock(clock: FakeClock,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    conn, dialer = await _connect(clock, monkeypatch)
    dialer.down = True
    dialer.links[0].drop()
    with pytest.raises(TimeoutError_):
        await conn.primary(clock.monotonic() + 30.0)
    assert clock.monotonic() == pytest.approx(30.0)
    assert len(dialer.at) > 10  # it kept dialing meanwhile, every wait at most the cap
    with pytest.raises(TandemError):
        await conn.declare_queue("q")  # no node: the request gives up at request_timeout
    assert clock.monotonic() == pytest.approx(30.0 + conn.request_timeout)
    await conn.close()
