"""A member whose replication log is found damaged at start (storage.segments; the memory
engine's disk takes the same damage, as damage that may have touched every partition), on the
in-process harness: it uses none of the log, goes on from its store, neither votes nor stands
until an active has brought it up to date (a restart midway too), and the group loses nothing
when the active dies next.  A partition with no other voter to catch up from does not start,
saying so."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from broker.modes.replicated.events import REPAIR_WAIT, HaEvent
from client.errors import StorageError
from client.protocol.frames import PublishMessage
from ha.messages import Ready
from storage.segments import repair_key
from tests.harness.group import Group
from tests.harness.replication import active, declared_with_active
from tests.harness.sessions import Reader
from tests.harness.test_relay import check, publish_all

pytestmark = pytest.mark.asyncio

DAMAGE = "/data/tandem.db-log/0000000000000001.seg at byte 4096 (a record failing its checksum)"


def replica_of(g: Group, name: str, key: tuple[int, int]):  # type: ignore[no-untyped-def]
    node = g[name].node
    assert node is not None and node.ha.replication is not None
    return node.ha.replication.logs[key].replica


async def test_a_replica_with_a_damaged_log_catches_up_before_it_votes_and_nothing_is_lost(tmp_path: Path) -> None:
    async with Group(tmp_path) as g:
        await g.start()
        key, first = await declared_with_active(g, "q")
        bodies = [f"m{i}".encode() for i in range(100)]
        await publish_all(g, first, "q", bodies)
        damaged = next(m.name for m in g.alive() if m is not first)
        commit = replica_of(g, first.name, key).commit
        await g.until(lambda: replica_of(g, damaged, key).commit >= commit, 10.0, what=f"{damaged} has everything")
        await g.stop(damaged)
        g[damaged].disk.log_damage = [DAMAGE]
        await g.restart(damaged)
        node = g[damaged].node
        assert node is not None
        [said] = [e for e in node.report.node_events if e.kind == "log-damaged"]
        assert DAMAGE in said.text
        assert g[damaged].disk.log_damage == []  # (set aside: a restart does not find it again)
        assert replica_of(g, damaged, key).recovering
        await g.until(lambda: not replica_of(g, damaged, key).recovering, 10.0, what=f"{damaged} caught up")
        assert replica_of(g, damaged, key).commit >= commit
        await g.kill(first.name)
        await g.until(lambda: active(g, key) is not None, 10.0, what="a new active")
        reader = Reader(g, g[damaged], "q")
        await reader.subscribe()
        await reader.until(100)
        await g.run_for(1.0)
        await reader.step()
        assert check(bodies, reader.got) == (0, 0, 0)


async def test_a_repair_a_restart_cut_short_goes_on_after_it(tmp_path: Path) -> None:
    """The damaged segments go aside at start: a member stopped before an active caught it up
    still neither votes nor stands when it comes back (the store's mark of the repair), and
    the mark goes once it has caught up."""
    async with Group(tmp_path) as g:
        await g.start()
        key, first = await declared_with_active(g, "q")
        await publish_all(g, first, "q", [f"m{i}".encode() for i in range(20)])
        names = [m.name for m in g.alive()]
        damaged = next(n for n in names if n != first.name)
        for name in names:
            await g.stop(name)
        g[damaged].disk.log_damage = [DAMAGE]
        mark = repair_key(key)
        await g.start(damaged, wait=False)
        assert g[damaged].disk.log_damage == [] and g[damaged].disk.meta[mark] == "1"
        assert replica_of(g, damaged, key).recovering
        await g.stop(damaged)  # (no active came: nothing was repaired)
        await g.start(damaged, wait=False)
        assert replica_of(g, damaged, key).recovering  # (no damage found now: the mark says it)
        await g.start(*(n for n in names if n != damaged), wait=False)
        await g.until(lambda: not replica_of(g, damaged, key).recovering, 30.0, what=f"{damaged} caught up")
        await g.until(lambda: g[damaged].disk.meta[mark] == "0", 10.0, what="the mark gone")
        await g.stop(damaged)
        await g.start(damaged, wait=False)
        assert not replica_of(g, damaged, key).recovering


async def test_a_group_of_one_with_a_damaged_log_does_not_start(tmp_path: Path) -> None:
    async with Group(tmp_path, names=("n1",)) as g:
        await g.start()
        await g.declare("q")
        out = g.publish(g["n1"], "q", "p", [PublishMessage("k", {}, b"kept", 0)])
        await g.until(out.done, 10.0, what="confirmed")
        await g.stop("n1")
        g["n1"].disk.log_damage = [DAMAGE]
        with pytest.raises(Exception, match="has no other voter to repair it from: this node does not start"):
            await g.restart("n1")
        assert g["n1"].disk.log_damage == [DAMAGE]  # (left for the operator)
        g["n1"].disk.log_damage = []  # (the operator moved the damaged segments aside)
        await g.restart("n1")
        reader = Reader(g, g["n1"], "q")
        await reader.subscribe()
        await reader.until(1)
        assert reader.got == Counter([b"kept"])  # (its store held it)


async def test_a_majority_of_damaged_logs_leaves_no_active_and_the_damaged_say_why(tmp_path: Path) -> None:
    async with Group(tmp_path) as g:
        await g.start()
        key, first = await declared_with_active(g, "q")
        await publish_all(g, first, "q", [f"m{i}".encode() for i in range(20)])
        names = [m.name for m in g.alive()]
        for name in names:
            await g.stop(name)
        damaged = [n for n in names if n != first.name]
        for name in damaged:
            g[name].disk.log_damage = [DAMAGE]
        await g.start(*names, wait=False)
        node = g[damaged[0]].node
        assert node is not None and node.ha.replication is not None
        events = node.ha.replication.events

        def waits() -> list[HaEvent]:
            return [e for e in events if e.kind == "waiting-for-repair"]

        timeout = replica_of(g, damaged[0], key).cfg.election_timeout
        await g.until(lambda: any(e.partition == f"{key[0]}/{key[1]}" for e in waits()), (REPAIR_WAIT + 5) * timeout,
                      what=f"{damaged[0]} says why q has no active")
        assert active(g, key) is None  # (the healthy one cannot win alone: nothing is served)
        [said] = [e for e in waits() if e.partition == f"{key[0]}/{key[1]}"]
        assert "cannot help elect one" in said.text and first.name in said.text
        await g.run_for(REPAIR_WAIT * timeout)
        assert len(waits()) == len({e.partition for e in waits()})  # (said once each)


async def test_a_stopping_node_takes_no_more_replication_steps(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Once a node's replication is stopping (its store closes next), a late step (a store
    write's callback, the quorum falling as its links close) is not taken: no write to a
    closed store, no "replication failed", the node not failed for it."""
    async with Group(tmp_path) as g:
        await g.start()
        key, first = await declared_with_active(g, "q")
        node = first.node
        assert node is not None and node.ha.replication is not None
        rep = node.ha.replication
        rep.stop()
        stepped: list[bool] = []

        def late() -> Ready:
            stepped.append(True)
            raise StorageError("store writer is closed")

        rep._guarded(rep.logs[key], late)
        assert stepped == [] and not rep._broken
        assert not [r for r in caplog.records if "replication failed" in r.getMessage()]
