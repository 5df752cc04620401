"""``tandem drill jepsen``: faults of several families on a seeded schedule under steady load,
a results JSON and a verdict line (broker/tools/drill/jepsen.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from broker.tools.drill.jepsen import make_schedule
from broker.tools.process import CODE_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

_VERDICT = re.compile(r"^lost (\d+) of (\d+) confirmed, unexpected (\d+), duplicated (\d+)")


def _drill(args: list[str], tmp: Path, timeout: float = 280) -> subprocess.CompletedProcess[str]:
    # the code under test from any directory; the run's group directory (kept if it fails) under tmp
    env = {**os.environ, "PYTHONPATH": CODE_ROOT, "TMPDIR": str(tmp)}
    return subprocess.run([sys.executable, "-m", "broker.cli", "drill", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=tmp)


@pytest.mark.skipif(os.geteuid() != 0, reason="the clock family needs root (a time namespace per node)")
@pytest.mark.long  # (each of its fault families alone: test_drills.py, test_clock_drill.py)
def test_a_short_jepsen_run_passes_and_follows_its_seed(tmp_path: Path) -> None:
    names, seed, duration = ["kill", "pause", "clock"], 55, 30.0
    out = tmp_path / "results.json"
    run = _drill(["jepsen", "--faults", ",".join(names), "--time", str(duration), "--rate", "200",
                  "--seed", str(seed), "--partitions", "4", "--out", str(out)], tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr[-4000:]
    m = _VERDICT.match(run.stdout.strip().splitlines()[-1])
    assert m is not None, run.stdout
    lost, confirmed, unexpected, duplicated = map(int, m.groups())
    assert (lost, unexpected, duplicated) == (0, 0, 0) and confirmed > 0
    assert f"seed {seed}" in run.stderr

    rep = json.loads(out.read_text())
    assert rep["passed"] and rep["seed"] == seed and rep["faults"] == names
    h, c = rep["history"], rep["checker"]
    assert h["sent"] >= h["confirmed"] == confirmed > 0 and h["consumed_unique"] >= confirmed
    assert {"ok", "lost", "unexpected", "duplicated", "recovered", "redelivered", "reordered"} <= set(c)
    assert c["reordered"] == 0
    # the same seed, the same schedule: what was planned, and what ran is its beginning
    planned = [dataclasses.asdict(f) for f in make_schedule(names, seed, duration)]
    assert rep["planned"] == planned
    ran = rep["timeline"]
    assert ran, "no fault ran"
    assert [{k: e[k] for k in planned[0]} for e in ran] == planned[:len(ran)]
    for e in ran:
        assert e["what"] and "error" not in e and e["recovery_ms"] >= 0
        assert e["injected_s"] < e["healed_s"] <= e["served_s"]
    assert not list(tmp_path.glob("tandem-jepsen-*"))  # a passed run leaves no directory


def test_an_unknown_family_is_one_line_naming_the_known_ones(tmp_path: Path) -> None:
    run = _drill(["jepsen", "--faults", "kill,nosuch", "--time", "5"], tmp_path, timeout=60)
    assert run.returncode != 0
    assert "Traceback" not in run.stderr
    (line,) = [x for x in run.stderr.splitlines() if x.strip()]
    assert "unknown fault family 'nosuch'" in line and "kill" in line and "clock" in line
