"""The ``tandem`` command runs on what ``make run`` installs, the runtime dependencies alone: its
parser and every command module import without the optional extras (bench peers, Spark, the
FUSE drills, locust) and the dev tools, which the commands that need them import when run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: top-level modules of the optional extras and dev dependencies (pyproject.toml)
NOT_INSTALLED = ["aio_pika", "aiormq", "nats", "psutil", "pyspark", "mfusepy", "locust", "matplotlib",
                 "pytest", "hypothesis", "schemathesis", "playwright", "atheris", "importlinter"]


def test_the_command_line_needs_no_optional_package() -> None:
    code = ("import sys\n"
            f"for name in {NOT_INSTALLED!r}:\n"
            "    sys.modules[name] = None  # (an import of it raises ImportError)\n"
            "import broker.cli\n"
            "broker.cli.build_parser()\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
