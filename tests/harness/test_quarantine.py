"""A split brain healed on the group harness: n3, cut off, takes writes alone under
``quorum_override 1`` while n1 and n2 go on; on the heal n3 discards its writes (HA-1014) and
the quarantine holds each of them, however much n3 wrote: its log compacts what a majority
holds, never what it wrote alone (broker.modes.replicated.compaction.weak_cap).  n3 compacts
here at every apply, keeping 2 entries, rather than past 4,000 entries or 24 MiB, so that a
few messages take its log past the mark.  (The same split brain with real processes, the
restore CLI and the console's API: tests/integration/test_restore.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

import broker.modes.replicated.compaction as compaction
import broker.modes.replicated.group as replicated_group
from broker.messaging.message import decode_headers
from broker.modes.replicated.partlog import PartLog
from broker.partitions.quarantine import QUEUE as QUARANTINE
from client.errors import UnavailableError
from client.protocol.frames import PublishMessage
from ha.membership import QuorumState
from storage.base import WriteOp
from tests.harness.group import Group, Member

pytestmark = pytest.mark.asyncio


@pytest.fixture
def n3_compacts(monkeypatch: pytest.MonkeyPatch) -> None:
    """n3 compacts its logs at every apply, keeping the last 2 entries (1 KiB at most) and
    what weak_cap keeps: what it does past 4,000 entries or 24 MiB.  (The others compact as
    they do, not in this test: a log of the majority compacted past where the sides parted
    is a heal by snapshot, another path.)"""
    compact = replicated_group.Replication._compact

    def _compact(self: replicated_group.Replication, plog: PartLog) -> list[WriteOp]:
        if self.me == "n3":
            plog.compact_at = 0
        return compact(self, plog)

    monkeypatch.setattr(replicated_group.Replication, "_compact", _compact)
    monkeypatch.setattr(compaction, "KEEP_ENTRIES", 2)
    monkeypatch.setattr(compaction, "KEEP_BYTES", 1024)


def _key(m: Member, queue: str) -> tuple[int, int] | None:
    q = m.node.catalogue.queues.get(queue) if m.node is not None else None
    return None if q is None else (q.meta.id, 0)


def _serving(m: Member, key: tuple[int, int]) -> bool:
    rep = m.node.ha.replication if m.node is not None else None
    return rep is not None and rep.serving(key)


async def _publish(g: Group, m: Member, bodies: list[bytes]) -> None:
    """Each body published at ``m`` (key "one"), one at a time, confirmed."""
    for b in bodies:
        out = g.publish(m, "q", None, [PublishMessage("one", {}, b)])
        await g.until(out.done, 5.0, what=f"the confirm of {b!r} at {m.name}")
        assert out.result().stored == 1


def _quarantined(g: Group) -> list[tuple[bytes, dict[str, str]]]:
    """What the quarantine's active holds: (body, headers) in offset order."""
    for m in g.alive():
        key = _key(m, QUARANTINE)
        if key is not None and _serving(m, key) and key in m.disk.parts:
            msgs = m.disk.parts[key].messages
            return [(msgs[o].body, decode_headers(msgs[o].headers_blob)) for o in sorted(msgs)]
    return []


async def _declared(g: Group) -> tuple[int, int]:
    """Declare ``q`` with one partition; its key, once every member has it and one serves it."""
    await g.declare("q", partitions=1)
    key = _key(g["n1"], "q")
    assert key is not None
    await g.until(lambda: all(_key(m, "q") == key for m in g.alive())
                  and any(_serving(m, key) for m in g.alive()), 10.0, what="an active for q")
    return key


async def _split(g: Group, n1: Member, n3: Member, key: tuple[int, int], count: int) -> list[bytes]:
    """n3 cut off (its links reset) until it goes Disabled; ``count`` messages published on the
    majority's n1; then n3 under ``quorum_override`` 1, active alone.  The majority's bodies."""
    g.net.isolate("n3", ["n1", "n2"])
    for o in ("n1", "n2"):
        g.net.drop("n3", o)
    await g.until(lambda: n3.quorum is QuorumState.DISABLED, 10.0, what="n3 Disabled")
    majority = [f"maj-{i}".encode() for i in range(count)]
    await _publish(g, n1, majority)
    n3.run(lambda: n3.node.options.set_quorum_override(1, by="test"))  # type: ignore[union-attr]
    await g.until(lambda: _serving(n3, key), 10.0, what="n3 active alone under the override")
    return majority


async def test_what_a_weak_active_wrote_past_the_compaction_mark_all_reaches_the_quarantine(
        tmp_path: Path, n3_compacts: None) -> None:
    async with Group(tmp_path) as g:
        await g.start()
        await g.declare("q", partitions=1)
        n1, n3 = g["n1"], g["n3"]
        key = _key(n1, "q")
        assert key is not None
        await g.until(lambda: any(_serving(m, key) for m in g.alive()), 10.0, what="an active for q")
        await _publish(g, n1, [f"both-{i}".encode() for i in range(10)])  # (strong entries, compacted)
        await g.until(lambda: n3.node is not None and n3.node.ha.replication is not None
                      and n3.node.ha.replication.logs[key].replica.applied >= 11, 10.0, what="n3 caught up")

        majority = await _split(g, n1, n3, key, 30)
        solo = [f"solo-{i}".encode() for i in range(40)]
        await _publish(g, n3, solo)
        rep = n3.node.ha.replication  # type: ignore[union-attr]
        assert rep is not None
        r = rep.logs[key].replica
        # n3 compacted its log (past the strong entries) and kept every one it wrote alone
        assert 0 < r.snap_index < r.applied - len(solo), (r.snap_index, r.applied)
        n3.run(lambda: n3.node.options.set_quorum_override(None, by="test"))  # type: ignore[union-attr]

        g.net.heal()
        await g.until(lambda: len(_quarantined(g)) >= len(solo), 60.0, what="the quarantine holding n3's writes")
        await g.run_for(2.0)  # (nothing more comes: counted again below)
        held = _quarantined(g)
        assert sorted(b for b, _h in held) == sorted(solo), [b for b, _h in held]
        assert {h["x-quarantine-node"] for _b, h in held} == {"n3"}
        assert {h["x-quarantine-queue"] for _b, h in held} == {"q"}
        assert all(h["x-quarantine-confirmed"] == "true" for _b, h in held)
        assert all(_key(m, "q") == key and m.disk.parts[key].next_offset == 10 + len(majority)
                   for m in g.alive() if _serving(m, key))


async def test_a_weak_active_refuses_publishes_past_its_hold_and_what_it_confirmed_is_quarantined(
        tmp_path: Path) -> None:
    """n3, cut off and forced alone, may keep 1 MiB of such writes in its log
    (``weak_hold_bytes``): it confirms three messages of 256 KiB and refuses the fourth
    (retry, naming weak_hold_bytes) instead of taking it and compacting what it wrote alone.
    On the heal the quarantine holds exactly the three.  (The same after n3 is restarted, with
    real processes, and their restore: tests/integration/test_restore.py.)"""
    async with Group(tmp_path, weak_hold_bytes=1 << 20) as g:
        await g.start()
        key = await _declared(g)
        n1, n3 = g["n1"], g["n3"]
        majority = await _split(g, n1, n3, key, 40)
        solo = [f"solo-{i}-".encode() + b"." * (256 << 10) for i in range(4)]
        await _publish(g, n3, solo[:3])
        refused = g.publish(n3, "q", None, [PublishMessage("one", {}, solo[3])])
        await g.until(refused.done, 5.0, what="n3's answer to the fourth")
        assert isinstance(refused.exception(), UnavailableError), refused.exception()
        assert "past weak_hold_bytes (1048576 bytes)" in str(refused.exception())
        n3.run(lambda: n3.node.options.set_quorum_override(None, by="test"))  # type: ignore[union-attr]

        g.net.heal()
        await g.until(lambda: len(_quarantined(g)) >= 3, 60.0, what="the quarantine holding n3's writes")
        await g.run_for(2.0)  # (nothing more comes: counted again below)
        held = _quarantined(g)
        assert sorted(b for b, _h in held) == sorted(solo[:3]), [b[:10] for b, _h in held]
        assert all(h["x-quarantine-confirmed"] == "true" for _b, h in held)
