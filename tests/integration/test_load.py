"""`tandem load` end to end: a short headless locust run against a spawned node (requests and
failures read from locust's CSV), a short soak with a kill, and the soak's counting."""

from __future__ import annotations

import asyncio
import csv
import importlib.util
import json
import os
import random
import sys
from pathlib import Path

import pytest

from broker.tools.checker import classify
from broker.tools.soak_report import Ledger, Tally
from client.stamp import stamp

# find_spec, not importorskip: importing locust here would monkey-patch the test process
pytestmark = pytest.mark.skipif(importlib.util.find_spec("locust") is None,
                                reason="the load extra: pip install 'tandem-broker[load]'")


async def _tandem(*args: str, timeout: float, cwd: Path | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "broker.cli", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=dict(os.environ), cwd=cwd)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.asyncio
@pytest.mark.integration
async def test_load_smoke_on_a_spawned_node(tmp_path: Path) -> None:
    out = tmp_path / "report"  # given relative, as `make load` does
    code, stdout, err = await _tandem("load", "--spawn", "--users", "4", "--run-time", "4s", "--out", "report",
                                      timeout=180, cwd=tmp_path)
    with open(out / "locust_stats.csv", newline="") as f:
        rows = {(r["Type"], r["Name"]): r for r in csv.DictReader(f)}
    total = rows[("", "Aggregated")]
    assert int(total["Request Count"]) > 0 and int(total["Failure Count"]) == 0, (stdout, err[-2000:])
    assert int(rows[("publish", "locust")]["Request Count"]) > 0
    assert int(rows[("deliver", "locust")]["Request Count"]) > 0
    assert (out / "report.html").exists()
    assert code == 0, err[-2000:]
    assert "publish" in stdout and "Traceback" not in err


@pytest.mark.asyncio
@pytest.mark.integration
@pytest.mark.long  # (the kill itself: tests/integration/test_replication.py, test_drills.py)
async def test_short_soak_with_a_kill_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    out = tmp_path / "soak"
    _code, stdout, err = await _tandem("load", "--profile", "soak", "--run-time", "40s", "--kill-every", "15s",
                                       "--rate", "300", "--users", "3", "--out", str(out), timeout=280)
    data = json.loads((out / "soak.json").read_text())
    v = data["verdict"]
    assert v["confirmed"] > 0 and v["ok"] == v["confirmed"], (stdout, err[-3000:])
    assert (v["lost"], v["duplicated"], v["unexpected"]) == (0, 0, 0), v
    assert data["drained"]
    assert len(data["kills"]) >= 1 and all(k["restarted_at_s"] is not None for k in data["kills"])
    assert set(data["series"]["rss_mib"]) == {"node1", "node2", "node3"}
    assert (out / "soak.png").stat().st_size > 0 and (out / "report.html").exists()
    assert "Traceback" not in err


@pytest.mark.asyncio
async def test_load_needs_one_target() -> None:
    code, _out, err = await _tandem("load", "--users", "1", timeout=60)
    assert code == 2 and "--url" in err and "Traceback" not in err
    code, _out, err = await _tandem("load", "--spawn", "--run-time", "soon", timeout=60)
    assert code == 2 and "--run-time" in err and "Traceback" not in err


def test_soak_tally_counts_as_the_checker_does() -> None:
    """The soak's compact count (a byte per message) against broker.tools.checker.classify."""
    rng = random.Random(7)
    producers = [bytes([i]) * 8 for i in range(3)]
    lines: list[str] = []
    sent, confirmed, consumed = [], [], []
    tally = Tally()
    offset = 0
    for p in producers:
        for first in range(0, 200, 10):
            lines.append(f"s {p.hex()} {first} 10")
            outcome = rng.choice("ccccf-")  # confirmed, failed, or no outcome (in flight at the end)
            if outcome == "c":
                lines.append(f"c {p.hex()} {first} 10 1.0 0.002")
            elif outcome == "f":
                lines.append(f"f {p.hex()} {first} 10 1.0 TimeoutError_")
            for n in range(first, first + 10):
                body = stamp(0.0, p, n, 40)
                key = body[12:28]
                sent.append(key)
                if outcome == "c":
                    confirmed.append(key)
                if outcome == "c" and rng.random() < 0.02:
                    continue  # lost
                if outcome != "c" and rng.random() < 0.5:
                    continue  # never stored
                mid = f"0-{offset}"
                offset += 1
                deliveries = [mid] * (2 if rng.random() < 0.05 else 1)  # redelivered
                if rng.random() < 0.02:
                    deliveries.append(f"1-{offset}")  # stored twice
                    offset += 1
                for m in deliveries:
                    tally.add(body, m, 0.0)
                    consumed.append((key, m))
    stranger = b"not a stamped body"
    tally.add(stranger, "2-0", 0.0)
    consumed.append((stranger, "2-0"))
    ledger = Ledger()
    ledger.read(lines)
    assert tally.verdict(ledger) == classify(sent, confirmed, consumed)
