"""Hunt flaky tests: run chosen tests many times, in parallel, while busy loops hold every core.

    python scripts/flaky.py [--runs N] [--jobs J] [--stress K] [--timeout S] TEST [TEST ...]

Each run is one ``pytest`` process over the given tests (node ids or files), with its own
``--basetemp``; ``--jobs`` runs go at once, and ``--stress`` busy-loop processes (default: one
per core) compete with them for the CPU the whole time, as a loaded CI machine does. At the end
it prints, per test, how many runs it failed, and the first failure's report for each; the exit
status is 1 if any test failed once.  A test that fails one time in fifty is a bug in the test
or in the product: this finds which tests do, and how often.
"""

from __future__ import annotations

import argparse
import os
import queue
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from broker.tools.cluster import port_range  # noqa: E402  (the checkout's, run as a script)
BUSY = "while True: pass"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="flaky", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("tests", nargs="+", help="pytest node ids or files")
    p.add_argument("--runs", type=int, default=20, help="how many times to run the tests (default 20)")
    p.add_argument("--jobs", type=int, default=2, help="runs at once (default 2)")
    p.add_argument("--stress", type=int, default=os.cpu_count() or 1,
                   help="busy-loop processes competing for the CPU (default: one per core; 0: none)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds one run may take (default 900)")
    args = p.parse_args(argv)
    if args.runs < 1 or args.jobs < 1 or args.stress < 0:
        p.error("--runs and --jobs must be at least 1, --stress at least 0")
    return args


def one_run(i: int, tests: list[str], work: Path, timeout: float, ports: str) -> dict[str, str]:
    """Run the tests once, their nodes on ports from ``ports`` (``LOW-HIGH``: a slice no other
    run going on at the same time uses); each test's outcome (``passed``, ``failed``,
    ``skipped``) and, for a failure, its report."""
    junit = work / f"run-{i}.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0",
           f"--basetemp={work / f'tmp-{i}'}", f"--junitxml={junit}", *tests]
    try:
        subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout,
                       check=False, env={**os.environ, "TANDEM_PORT_RANGE": ports})
    except subprocess.TimeoutExpired:
        return {"(the run)": f"failed: run {i} took more than {timeout:.0f} s"}
    if not junit.exists():
        return {"(the run)": f"failed: run {i} wrote no report (collection error?)"}
    out: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            out[name] = "failed: " + (bad.get("message") or "")[:400]
        elif case.find("skipped") is not None:
            out[name] = "skipped"
        else:
            out[name] = "passed"
    return out


def port_slices(jobs: int) -> list[str]:
    """The free-port range (broker.tools.cluster.port_range) cut into one slice per job, so
    that runs going on at the same time never pick the same port for their nodes."""
    low, high = port_range()
    span = (high - low) // jobs
    return [f"{low + j * span}-{low + (j + 1) * span}" for j in range(jobs)]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    stress = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(args.stress)]
    try:
        with tempfile.TemporaryDirectory(prefix="flaky-") as tmp, ThreadPoolExecutor(args.jobs) as pool:
            work = Path(tmp)
            slices: queue.SimpleQueue[str] = queue.SimpleQueue()
            for s in port_slices(args.jobs):
                slices.put(s)

            def run(i: int) -> dict[str, str]:
                ports = slices.get()
                try:
                    return one_run(i, args.tests, work, args.timeout, ports)
                finally:
                    slices.put(ports)

            runs = list(pool.map(run, range(args.runs)))
    finally:
        for proc in stress:
            proc.kill()
        for proc in stress:
            proc.wait()
    failed: Counter[str] = Counter()
    seen: Counter[str] = Counter()
    first: dict[str, str] = {}
    for outcome in runs:
        for name, what in outcome.items():
            seen[name] += what != "skipped"
            if what.startswith("failed"):
                failed[name] += 1
                first.setdefault(name, what)
    print(f"{args.runs} runs, {args.jobs} at once, {args.stress} busy loop(s) beside them")
    for name in sorted(seen):
        rate = f"{failed[name]}/{seen[name]}"
        print(f"  {rate:>7}  {name}")
    for name, what in sorted(first.items()):
        print(f"\n{name}: {what}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
