"""One fuzz target under atheris (libFuzzer, coverage-guided): run by ``python -m tests.fuzz``.

    python -m tests.fuzz.worker TARGET --runs N --corpus DIR --artifacts DIR --stats FILE
    python -m tests.fuzz.worker TARGET... --runs N... --each DIR --artifacts DIR

The target's modules are imported under ``atheris.instrument_imports`` so libFuzzer sees the
Python branches they take (2 s of CPU: several targets share one import, each fuzzed in a
process forked after it).  Every input is one run; an input whose target raises anything but
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
    ap.add_argument("target", nargs="+", choices=sorted(TARGETS),
                    help="the targets, one after the other (each in a process forked after the one "
                         "instrumented import: their corpora, stats and logs are named by --each)")
    ap.add_argument("--runs", type=int, nargs="+", required=True, help="inputs per target, in order")
    ap.add_argument("--corpus", type=Path, help="seed inputs (libFuzzer adds what it finds); one target")
    ap.add_argument("--artifacts", type=Path, required=True)
    ap.add_argument("--stats", type=Path, help="one target's stats file")
    ap.add_argument("--each", type=Path,
                    help="several targets: DIR/corpus/TARGET, and DIR/TARGET.json, .log and .status (its exit status)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-len", type=int, default=8192)
    ap.add_argument("--timeout", type=int, default=10, help="seconds one input may take (a hang)")
    ap.add_argument("--rss-limit-mb", type=int, default=2048)
    args = ap.parse_args()
    if len(args.runs) != len(args.target):
        ap.error("--runs: one count per target")
    if args.each is None:
        if len(args.target) != 1 or args.corpus is None or args.stats is None:
            ap.error("one target takes --corpus and --stats; several take --each")
        fuzz(args, args.target[0], args.runs[0], args.corpus, args.stats)
        return
    for name, runs in zip(args.target, args.runs):
        pid = os.fork()
        if pid == 0:  # (the child: this target's output to its own log, then libFuzzer to the end)
            fd = os.open(args.each / f"{name}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            try:
                fuzz(args, name, runs, args.each / "corpus" / name, args.each / f"{name}.json")
            finally:
                os._exit(70)  # (fuzz ends the process itself; here only if it raised)
        _, status = os.waitpid(pid, 0)
        (args.each / f"{name}.status").write_text(str(os.waitstatus_to_exitcode(status)))


def fuzz(args: argparse.Namespace, name: str, runs: int, corpus: Path, stats_path: Path) -> None:
    """Fuzz target ``name`` for ``runs`` inputs; the process ends when they are done (or on a
    crash, libFuzzer's exit status)."""
    target = TARGETS[name]
    if os.environ.get("TANDEM_FUZZ_PLANT"):  # tests/fuzz/test_fuzz.py: a planted bug the harness must report
        planted = target

        def target(data: bytes) -> None:
            if len(data) % 5 == 3:
                raise ZeroDivisionError("planted")
            planted(data)
    args.artifacts.mkdir(parents=True, exist_ok=True)
    corpus.mkdir(parents=True, exist_ok=True)
    stats = Stats(name, stats_path, args.artifacts, runs)

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
    atheris.Setup([sys.argv[0], str(corpus), f"-seed={args.seed}", f"-max_len={args.max_len}",
                   f"-timeout={args.timeout}", f"-rss_limit_mb={args.rss_limit_mb}",
                   f"-artifact_prefix={args.artifacts}/", "-print_final_stats=0", "-close_fd_mask=0"],
                  one)
    stats.write()
    atheris.Fuzz()


if __name__ == "__main__":
    main()
