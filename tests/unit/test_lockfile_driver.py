"""broker.arbiters.lockfile: two drivers on one temp lock path in one process, on a fake clock; the
replication and the peer link are stand-ins that record what the driver tells them, the
lock file is real.  Takes, renewals, sync, a holder that stops renewing, epochs on frames,
file-system errors."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from broker.config import NodeConfig
from broker.arbiters.lockfile import LockFileDriver
from client.protocol.frames import Frame, Heartbeat, Replicate
from client.testing import FakeClock
from ha.membership import RemoteState

pytestmark = pytest.mark.asyncio

LEASE = 1.0


@dataclass
class FakeReplication:
    confirm_gate: Any = None
    lock_role: tuple[bool, bool] | None = None
    gate_refusals: int = 0
    synced: bool = True
    said: list[tuple[bool, bool]] = field(default_factory=list)

    def arbitrate(self, holder: bool, alone: bool, reason: str) -> None:
        self.lock_role = (holder, alone)
        self.said.append((holder, alone))

    def caught_up(self, peer: str) -> bool:
        return self.synced


class FakeMembership:
    def __init__(self) -> None:
        self.up = False
        self.designated = False

    def state(self, name: str) -> RemoteState:
        return RemoteState.UP if self.up else RemoteState.DOWN

    def set_designated_primary(self, on: bool) -> list[Any]:
        self.designated = on
        return []


class Link:
    """The peer link: a frame sent is heard by the other driver at once (when the link is up)."""

    def __init__(self, src: str) -> None:
        self.src = src
        self.to: LockFileDriver | None = None
        self.up = True

    def send(self, frame: Frame) -> None:
        if self.up and self.to is not None:
            self.to.heard(self.src, frame)


class FakePeers:
    def __init__(self, me: str) -> None:
        self.arbiter: Any = None
        self.epoch = 0
        self.membership = FakeMembership()
        self.link = Link(me)
        self.links: dict[str, Link] = {}

    def report(self, changes: list[Any]) -> None:
        pass


def config(tmp_path: Path, name: str, peer: str) -> NodeConfig:
    return NodeConfig(name=name, data_dir=tmp_path / name, port=0, peer_port=0,
                      peers=(f"{peer}=127.0.0.1:1",), arbiter="lockfile", lockfile=str(tmp_path / "gw" / "tandem.lock"),
                      lease=LEASE)


class Pair:
    def __init__(self, tmp_path: Path) -> None:
        self.clock = FakeClock()
        self.rep = {"a": FakeReplication(), "b": FakeReplication()}
        self.peers = {"a": FakePeers("a"), "b": FakePeers("b")}
        self.d = {n: LockFileDriver(config(tmp_path, n, o), self.clock, self.rep[n], self.peers[n])
                  for n, o in (("a", "b"), ("b", "a"))}
        self.peers["a"].link.to, self.peers["b"].link.to = self.d["b"], self.d["a"]

    def connect(self, up: bool = True) -> None:
        for n, o in (("a", "b"), ("b", "a")):
            p = self.peers[n]
            p.membership.up = up
            p.link.up = up
            if up:
                p.links[o] = p.link
            else:
                p.links.pop(o, None)

    async def step(self, name: str) -> None:
        """One round of the driver, its file calls (each on its own thread) finished: the
        step that handles a call's result may start another (a renewal right after taking
        the lock, say), which would otherwise land in the middle of the other node's round."""
        d = self.d[name]
        d._next_file_at = 0.0
        d.step()
        for _ in range(5):
            if d._op is None:
                return
            while d._op is not None:
                await asyncio.wait([d._op])  # (a failed call is the driver's to handle, not raised here)
                await asyncio.sleep(0)  # its done-callback runs
            d.step()  # what the result changed (a sync, say)
        raise AssertionError(f"{name} keeps starting file calls in one round")

    def states(self) -> tuple[str, str]:
        return self.d["a"].state, self.d["b"].state


def record_age(d: LockFileDriver, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(d.file.record_path, (t, t))


async def test_the_first_node_takes_the_lock_the_other_follows_and_both_get_in_step(tmp_path: Path) -> None:
    p = Pair(tmp_path)
    await p.step("a")
    assert p.states() == ("STANDALONE", "WAITING")
    assert p.rep["a"].lock_role == (True, True) and p.peers["a"].membership.designated
    assert p.d["a"].may_confirm() and not p.d["b"].may_confirm()
    await p.step("b")
    assert p.d["b"].state == "WAITING" and p.d["b"].lock_holder == "a"
    p.connect()
    await p.step("a")  # peer up: ACTIVE_SYNC, heartbeat sent -> b follows; caught up -> ACTIVE
    await p.step("b")
    await p.step("a")
    assert p.states() == ("ACTIVE", "PASSIVE")
    assert p.rep["a"].lock_role == (True, False) and p.rep["b"].lock_role == (False, False)
    assert p.d["a"].renewals >= 1 and p.d["a"].epoch == p.d["b"].epoch == 1
    assert p.d["b"].lock_holder == "a" and p.d["a"].changes == 3


async def test_a_holder_that_stops_renewing_is_taken_over_and_then_fenced_by_the_epoch(tmp_path: Path) -> None:
    p = Pair(tmp_path)
    p.connect()
    await p.step("a")
    await p.step("b")
    await p.step("a")
    assert p.states() == ("ACTIVE", "PASSIVE")
    await p.step("a")  # a renewal in step: the record no longer says a confirms alone
    assert not p.d["a"].file.read_unlocked().alone
    # a stops (SIGSTOP): no renewals; the link goes quiet, b waits and watches the record
    p.connect(False)
    await p.step("b")
    assert p.d["b"].state == "WAITING"
    p.clock.advance(LEASE / 2)
    await p.step("b")
    assert p.d["b"].state == "WAITING"  # seen unchanged for half a lease only
    p.clock.advance(LEASE)
    record_age(p.d["a"], LEASE + 0.5)  # the gateway's clock agrees: last written 1.5 s ago
    assert not p.d["a"].arbiter.serving(p.clock.monotonic())  # a's own lease ran out before b takes it
    await p.step("b")
    assert p.d["b"].state == "STANDALONE" and p.d["b"].epoch == 2
    # a wakes up (it has not run since): its first frame from b carries epoch 2
    assert p.d["a"].arbiter.state.value == "ACTIVE"
    p.d["a"].heard("b", Replicate(payload=b"", epoch=2))
    assert p.d["a"].state == "WAITING" and p.rep["a"].lock_role == (False, False)
    await p.step("a")  # its lock is b's: it stays out
    assert p.d["a"].state == "WAITING" and not p.d["a"].may_confirm()
    p.connect()
    await p.step("b")
    await p.step("a")
    await p.step("b")
    assert p.states() == ("PASSIVE", "ACTIVE")


async def test_a_stale_holders_frames_are_counted_as_fencing_refusals(tmp_path: Path) -> None:
    p = Pair(tmp_path)
    await p.step("a")
    p.d["a"].arbiter.observe_epoch(0)
    p.d["a"].heard("b", Replicate(payload=b"", epoch=0))  # (b never held it: epoch 0 is not stale)
    # a holder of epoch 1 hears one that still claims an older epoch
    p.d["a"].arbiter.epoch = p.d["a"].arbiter.seen_epoch = 3
    p.d["a"].heard("b", Replicate(payload=b"", epoch=2))
    assert p.d["a"].fencing_refusals == 1 and p.d["a"].state == "STANDALONE"


async def test_a_lost_renewal_stops_the_holder_at_once(tmp_path: Path) -> None:
    p = Pair(tmp_path)
    await p.step("a")
    assert p.d["a"].state == "STANDALONE"
    p.d["a"].file.record_path.write_text("garbage")  # the gateway's file is not ours any more
    await p.step("a")
    assert p.d["a"].state == "WAITING" and not p.d["a"].may_confirm()
    assert p.rep["a"].said[-1] == (False, False)


async def test_a_passive_whose_holder_says_it_serves_nothing_waits_for_the_lock(tmp_path: Path) -> None:
    p = Pair(tmp_path)
    p.connect()
    await p.step("a")
    await p.step("b")
    await p.step("a")
    assert p.states() == ("ACTIVE", "PASSIVE")
    p.d["b"].heard("a", Heartbeat(epoch=1, ha_state="WAITING", ha_previous="ACTIVE"))
    assert p.d["b"].state == "WAITING"


async def test_an_unreachable_lock_file_is_logged_never_a_crash(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "gw").write_text("the gateway's mount is gone")
    p = Pair(tmp_path)
    await p.step("a")
    await p.step("a")
    assert p.d["a"].state == "WAITING" and not p.d["a"].may_confirm()
    assert sum("cannot try the lock" in r.message for r in caplog.records) == 1  # said once, not per round


async def test_a_clean_stop_releases_the_lock_for_the_peer(tmp_path: Path) -> None:
    p = Pair(tmp_path)
    await p.step("a")
    await p.d["a"].stop()
    assert p.d["a"].state == "DEAD"
    await p.step("b")
    assert p.d["b"].state == "STANDALONE" and p.d["b"].epoch == 2


async def test_a_holder_learns_a_later_epoch_from_the_peer_links_handshake(tmp_path: Path) -> None:
    from client.protocol.frames import PeerHello
    p = Pair(tmp_path)
    await p.step("a")
    assert p.d["a"].state == "STANDALONE"
    p.d["a"].heard("b", PeerHello(min_version=1, max_version=1, node="b", store_stamp="s", priority=1, votes=1,
                                  epoch=5))
    assert p.d["a"].state == "WAITING" and p.d["a"].epoch == 5


async def test_stop_ends_the_file_call_in_flight(tmp_path: Path) -> None:
    p = Pair(tmp_path)
    before = asyncio.all_tasks()
    d = p.d["a"]
    d._next_file_at = 0.0
    d.step()  # a file call launched (the lock tried, on the driver's thread)
    assert d._op is not None and not d._op.done()
    await d.stop()
    assert [t for t in asyncio.all_tasks() if t not in before and not t.done()] == []
