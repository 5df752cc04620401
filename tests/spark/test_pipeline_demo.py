"""`make pipeline-demo` in short form: order events through a three-node group into a Spark
Structured Streaming job, the active of a partition killed mid-stream, and the job's totals
equal to what the producers had confirmed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# the long tier: the data source's reads, streams and sink are tests/spark/test_spark.py's
pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.xdist_group("spark"),
              pytest.mark.timeout(600), pytest.mark.long]

DEMO = Path(__file__).resolve().parents[2] / "examples" / "pipeline_demo.py"


def test_pipeline_demo_totals_survive_a_killed_active() -> None:
    out = subprocess.run([sys.executable, str(DEMO), "--orders", "900", "--rate", "300", "--timeout", "240"],
                         capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "killing node" in out.stdout and "started again" in out.stdout
    assert "equal to what was confirmed" in out.stdout and "PASSED" in out.stdout
