"""One fuzz target under atheris (libFuzzer, coverage-guided): run by ``python -m tests.fuzz``.

    python -m tests.fuzz.worker TARGET --runs N --corpus DIR --artifacts DIR --stats FILE

The target's modules are imported under ``atheris.instrument_imports`` so libFuzzer sees the
Python branches they take.  Every input is one run; an input whose target raises anything but
the project's own errors is a *finding*: its type, message, traceback and input (saved under
``--artifacts``) go to the stats file, once per distinct place it was raised, and the run goes
on.  A hang (``--timeout`` seconds on one input) or a process over ``--rss-limit-mb`` ends the
worker (libFuzzer's own report and a ``timeout-``/``oom-`` file under ``--artifacts``): the
parent counts it as a crash.  The stats file (JSON) is written every 10,000 runs and at the
end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import atheris

with atheris.instrument_imports(include=["client", "broker", "storage", "ha"]):
    from tests.fuzz.targets import EXPECTED, TARGETS


class Stats:
    def __init__(self, target: str, path: Path, artifacts: Path, runs: int) -> None:
        self.target, self.path, self.artifacts, self.goal = target, path, artifacts, runs
        self.runs = 0
        self.refused = 0  # inputs the decoders refused with the project's own error
        self.findings: dict[str, dict[str, Any]] = {}
        self.started = time.monotonic()

    def finding(self, exc: BaseException, data: bytes) -> None:
        tb = traceback.extract_tb(exc.__traceback__)
        ours = [f for f in tb if "/tests/fuzz/" not in f.filename] or list(tb)
        where = f"{ours[-1].filename}:{ours[-1].lineno}" if ours else "?"
        key = f"{type(exc).__name__}@{where}"
        entry = self.findings.get(key)
        if entry is not None:
            entry["count"] += 1
            return
        name = f"finding-{self.target}-{hashlib.sha1(data).hexdigest()[:12]}"
        (self.artifacts / name).write_bytes(data)
        self.findings[key] = {"type": type(exc).__name__, "message": str(exc)[:500], "where": where,
                              "input": str(self.artifacts / name), "count": 1,
                              "traceback": "".join(traceback.format_exception(exc))[-3000:]}

    def write(self) -> None:
        out = {"target": self.target, "runs": self.runs, "refused": self.refused,
               "seconds": round(time.monotonic() - self.started, 2), "findings": list(self.findings.values())}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(out, indent=1))
        os.replace(tmp, self.path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target", choices=sorted(TARGETS))
    ap.add_argument("--runs", type=int, required=True)
    ap.add_argument("--corpus", type=Path, required=True, help="seed inputs (libFuzzer adds what it finds)")
    ap.add_argument("--artifacts", type=Path, required=True)
    ap.add_argument("--stats", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-len", type=int, default=8192)
    ap.add_argument("--timeout", type=int, default=10, help="seconds one input may take (a hang)")
    ap.add_argument("--rss-limit-mb", type=int, default=2048)
    args = ap.parse_args()
    target = TARGETS[args.target]
    if os.environ.get("TANDEM_FUZZ_PLANT"):  # tests/fuzz/test_fuzz.py: a planted bug the harness must report
        planted = target

        def target(data: bytes) -> None:
            if len(data) % 5 == 3:
                raise ZeroDivisionError("planted")
            planted(data)
    args.artifacts.mkdir(parents=True, exist_ok=True)
    args.corpus.mkdir(parents=True, exist_ok=True)
    stats = Stats(args.target, args.stats, args.artifacts, args.runs)

    def one(data: bytes) -> None:
        stats.runs += 1
        try:
            target(data)
        except EXPECTED:
            stats.refused += 1
        except Exception as exc:  # the finding: anything but the project's own errors
            stats.finding(exc, data)
        if stats.runs % 10_000 == 0:
            stats.write()
        if stats.runs >= stats.goal:
            stats.write()
            sys.stdout.flush()
            os._exit(0)  # libFuzzer would go on with its own count; the budget is in frames

    sys.setrecursionlimit(10_000)
    atheris.Setup([sys.argv[0], str(args.corpus), f"-seed={args.seed}", f"-max_len={args.max_len}",
                   f"-timeout={args.timeout}", f"-rss_limit_mb={args.rss_limit_mb}",
                   f"-artifact_prefix={args.artifacts}/", "-print_final_stats=0", "-close_fd_mask=0"],
                  one)
    stats.write()
    atheris.Fuzz()


if __name__ == "__main__":
    main()
