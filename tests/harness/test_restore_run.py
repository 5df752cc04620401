"""A restore run in the group (:class:`broker.partitions.restore_run.Restores`, what ``POST
/api/v1/restore`` does) on the group harness, after the split brain of test_quarantine.py: it
counts what the quarantine holds when it begins and is done once it has looked at as many,
without waiting :data:`broker.partitions.restore.WAIT` for another; a run on an empty
quarantine is done at once too.  (The run through the console's API, and ``tandem restore``,
with real processes: tests/integration/test_restore.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.partitions.restore import WAIT, Filter, Report
from tests.harness.group import Group, Member
from tests.harness.test_quarantine import _declared, _publish, _quarantined, _serving, _split

pytestmark = pytest.mark.asyncio


async def _run(g: Group, m: Member) -> tuple[Report, float]:
    """A restore of everything asked of ``m`` (forwarded to the quarantine's active if that
    is another member): its report and the virtual seconds it took."""
    assert m.node is not None
    began = g.clock.monotonic()
    task = m.life.spawn(m.node.ops.restores.run(Filter(), "test"), name="test-restore")  # type: ignore[union-attr]
    await g.until(task.done, 60.0, what=f"the restore asked of {m.name}")
    return task.result(), g.clock.monotonic() - began


async def test_a_restore_in_the_group_is_done_once_it_has_looked_at_what_the_quarantine_held(
        tmp_path: Path) -> None:
    async with Group(tmp_path, failback_after=1.0) as g:
        await g.start()
        key = await _declared(g)
        n1, n3 = g["n1"], g["n3"]
        majority = await _split(g, n1, n3, key, 10)
        solo = [f"solo-{i}".encode() for i in range(7)]
        await _publish(g, n3, solo)
        n3.run(lambda: n3.node.options.set_quorum_override(None, by="test"))  # type: ignore[union-attr]
        g.net.heal()
        await g.until(lambda: len(_quarantined(g)) >= len(solo), 60.0, what="the quarantine holding n3's writes")
        await g.run_for(5.0)  # (failback done: the quarantine's partition stays where it is during the runs)

        report, took = await _run(g, n1)
        assert report.json() == {**Report().json(), "restored": {"q": len(solo)}, "conflicts": {"q": len(solo)}}, \
            report.json()
        assert took < WAIT, took
        report, took = await _run(g, n1)
        assert report.lines(False) == ["nothing to restore: tandem.quarantine holds no message that matches"]
        assert took < WAIT, took
        await g.until(lambda: not _quarantined(g), 10.0, what="the quarantine's store empty")
        stored = [m.disk.parts[key].messages for m in g.alive() if _serving(m, key)][0]
        assert sorted(s.body for s in stored.values()) == sorted(majority + solo)
