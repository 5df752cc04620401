"""The short fuzz run of `make test`: the nightly command (python -m tests.fuzz) with a small budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from client.errors import TandemError
from tests.fuzz.live import mutate_frame
from tests.fuzz.targets import TARGETS

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
def test_a_short_fuzz_run_finds_nothing(tmp_path: Path) -> None:
    """30,000 coverage-guided inputs over every decoder target, then 60 hostile connections to a
    live two-node group: no unexpected exception, no crash, the group still serves."""
    out = subprocess.run([sys.executable, "-m", "tests.fuzz", "--frames", "30000", "--live-connections", "60",
                          "--out", str(tmp_path), "--json"], cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    dec, live = summary["decoders"], summary["live"]
    assert dec["frames"] == 30000 and dec["findings"] == [] and dec["crashes"] == 0, dec
    assert live["frames"] >= 60 and live["crashes"] == 0 and live["log_errors"] == 0 and live["serving"], live


def test_an_unexpected_exception_is_a_finding(tmp_path: Path) -> None:
    """The harness itself: a target that raises something other than a TandemError is
    reported, with the input that did it (so the run above can fail)."""
    out = subprocess.run([sys.executable, "-m", "tests.fuzz.worker", "log-entry", "--runs", "200",
                          "--corpus", str(tmp_path / "c"), "--artifacts", str(tmp_path / "a"),
                          "--stats", str(tmp_path / "s.json")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TANDEM_FUZZ_PLANT": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    stats = json.loads((tmp_path / "s.json").read_text())
    assert stats["runs"] == 200
    (finding,) = stats["findings"]
    assert finding["type"] == "ZeroDivisionError" and Path(finding["input"]).exists()


def test_every_target_takes_its_seeds() -> None:
    """The seed corpus is well-formed: every seed goes through its target without an error,
    so the fuzzer starts from inputs that go deep (a stream's frames decode, a payload's items
    decode)."""
    from tests.fuzz.corpus import streams

    seeds = streams()
    assert set(seeds) == set(TARGETS)
    for name, target in TARGETS.items():
        for seed in seeds[name]:
            try:
                target(seed)
            except TandemError as exc:
                raise AssertionError(f"{name}: a seed is refused: {exc!r}") from exc


def test_mutants_keep_their_length_prefix_mostly() -> None:
    import random

    from client.protocol import encode
    from tests.fuzz.corpus import client_requests

    rng = random.Random(5)
    seeds = [encode(f) for f in client_requests()]
    mutants = [mutate_frame(rng.choice(seeds), rng) for _ in range(500)]
    framed = sum(1 for m in mutants if int.from_bytes(m[:4], "big") == len(m) - 4)
    assert framed >= 450 and len(set(mutants)) > 400


def test_targets_forked_from_one_worker_each_report_their_own_findings(tmp_path: Path) -> None:
    """Several targets in one worker (one instrumented import, a process forked per target):
    each target's own runs, finding, log and exit status."""
    corpus = tmp_path / "corpus"
    out = subprocess.run([sys.executable, "-m", "tests.fuzz.worker", "log-entry", "snapshot", "--runs", "150", "250",
                          "--each", str(tmp_path), "--artifacts", str(tmp_path / "a")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TANDEM_FUZZ_PLANT": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    for target, runs in (("log-entry", 150), ("snapshot", 250)):
        stats = json.loads((tmp_path / f"{target}.json").read_text())
        assert (stats["target"], stats["runs"]) == (target, runs)
        (finding,) = stats["findings"]
        assert finding["type"] == "ZeroDivisionError" and Path(finding["input"]).exists()
        assert (tmp_path / f"{target}.status").read_text() == "0" and (corpus / target).is_dir()
        assert (tmp_path / f"{target}.log").exists()
