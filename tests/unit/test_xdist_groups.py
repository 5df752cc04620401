"""The suite's grouped tests run on one worker (``xdist_group`` under ``--dist loadgroup``, as
``make test`` runs them): the security modules share one group of nodes per module, the Spark
tests one SparkSession, and the packet-filter test stays off the network-namespace drills.
Some pytest and pytest-xdist versions together drop the grouping without a word."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

GROUPED = '''
import os
import pytest

@pytest.mark.xdist_group("g")
@pytest.mark.parametrize("i", range(6))
def test_grouped(i):
    with open(os.environ["WORKERS_SEEN"], "a") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")

@pytest.mark.parametrize("i", range(6))
def test_free(i):
    pass
'''


def test_tests_of_one_group_run_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    seen = tmp_path / "workers"
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p",
                          "no:cacheprovider", str(tmp_path / "test_grouped.py")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "WORKERS_SEEN": str(seen)})
    assert out.returncode == 0, out.stdout + out.stderr
    workers = seen.read_text().split()
    assert len(workers) == 6 and len(set(workers)) == 1, workers
