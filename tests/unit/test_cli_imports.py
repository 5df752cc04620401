"""The ``tandem`` command runs on what ``make run`` installs, the runtime dependencies alone: its
parser and every command module import without the optional extras (bench peers, Spark, the
FUSE drills, locust) and the dev tools, which the commands that need them import when run."""

from __future__ import annotations

import argparse
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


def test_each_command_is_added_by_the_module_the_table_names_and_by_it_alone() -> None:
    from broker.cli import TOOLS, build_parser, command_of

    def commands(parser: argparse.ArgumentParser) -> set[str]:
        [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        return set(sub.choices)

    every = commands(build_parser())
    assert every == {"broker"} | {name for _, _, names in TOOLS for name in names}
    for _, _, names in TOOLS:
        assert commands(build_parser(names[0])) == {"broker", *names}
    assert commands(build_parser("no-such-command")) == every  # (argparse lists them all)
    assert command_of(["--log-level", "DEBUG", "status"]) is None and command_of(["status", "--json"]) == "status"


def test_a_client_command_imports_no_other_command_module() -> None:
    code = ("import sys, broker.cli\n"
            "broker.cli.build_parser('status').parse_args(['status', '--url', 'tandem://a@h:1'])\n"
            "print(sorted(m for m in sys.modules if m.startswith('broker.tools.')))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "broker.tools.drill" not in out.stdout and "broker.tools.bench" not in out.stdout
    assert "'broker.tools.status'" in out.stdout
