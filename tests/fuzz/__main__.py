"""Hostile input at scale: the nightly fuzz run.

    python -m tests.fuzz --frames 1000000          # (make fuzz) decoders, then a live group
    python -m tests.fuzz --frames 30000 --live-connections 60   # what `make test` runs

Phase 1 (in process, coverage-guided): atheris/libFuzzer mutates well-formed inputs
(tests/fuzz/corpus.py) and feeds them to each target of tests/fuzz/targets.py: the frame
decoder and protocol state machine as a node reads a client (and as a client reads a node),
the peer port's frames with the payloads they carry (``Forward`` requests by kind,
``Replicate`` messages, log entries, snapshots).  One input is one frame run; the budget is
split evenly over the targets, ``--jobs`` of them at a time (a worker process each, which
imports the instrumented code once and forks a process per target).  A target may refuse an input
with the project's own error; any other exception, a hang or a runaway allocation is a
finding.

Phase 2 (live): a two-node group (real processes) gets mutated frames on its client and peer
ports over many real connections, logged in and not; then a real client must still publish
and consume, no node may have died, and no node's log may hold a traceback, an ERROR or a
CRITICAL line.

Prints frames run, exceptions found and time per phase; exits 1 on any finding.  Findings'
inputs are kept under ``--out`` (default: a temporary directory, named in the output).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.fuzz.corpus import streams
from tests.fuzz.targets import TARGETS


def _seed_corpus(root: Path) -> None:
    """Each target's seed inputs in ``root/corpus/TARGET`` (where its worker reads them)."""
    for target, seeds in streams().items():
        d = root / "corpus" / target
        d.mkdir(parents=True, exist_ok=True)
        for s in seeds:
            (d / hashlib.sha1(s).hexdigest()).write_bytes(s)


def _run_targets(names: list[str], budget: dict[str, int], out: Path, seed: int, quiet: bool) -> list[dict[str, Any]]:
    """One worker process for ``names``, one after the other (each forked after one
    instrumented import); each target's totals and findings."""
    started = time.monotonic()
    with open(out / f"worker-{names[0]}.log", "wb") as f:
        proc = subprocess.run(
            [sys.executable, "-m", "tests.fuzz.worker", *names, "--runs", *[str(budget[n]) for n in names],
             "--each", str(out), "--artifacts", str(out / "findings"), "--seed", str(seed)],
            stdout=f, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parents[2])
    results = []
    for target in names:
        stats, log, status = out / f"{target}.json", out / f"{target}.log", out / f"{target}.status"
        result: dict[str, Any] = json.loads(stats.read_text()) if stats.exists() else \
            {"target": target, "runs": 0, "refused": 0, "findings": []}
        code = int(status.read_text()) if status.exists() else proc.returncode or 1
        result["seconds"] = round(result.get("seconds", time.monotonic() - started), 1)
        result["crashed"] = code != 0
        if code != 0:
            tail = (log.read_text(errors="replace") if log.exists() else "")[-3000:]
            tail += (out / f"worker-{names[0]}.log").read_text(errors="replace")[-1000:]
            result["findings"].append({"type": "crash", "where": f"worker exit status {code}",
                                       "message": tail, "count": 1})
        if not quiet:
            print(f"  {target:<14} {result['runs']:>9,} frames  {result['refused']:>9,} refused  "
                  f"{len(result['findings'])} findings  {result['seconds']:>7.1f} s", flush=True)
        results.append(result)
    return results


def run_decoders(frames: int, out: Path, *, jobs: int = 2, seed: int = 1, targets: list[str] | None = None,
                 quiet: bool = False) -> dict[str, Any]:
    """Phase 1: ``frames`` inputs split over ``targets``, ``jobs`` worker processes taking
    turns at them; totals and every finding."""
    names = targets or list(TARGETS)
    _seed_corpus(out)
    share, extra = divmod(frames, len(names))
    budget = {n: share + (1 if i < extra else 0) for i, n in enumerate(names)}
    started = time.monotonic()
    shares = [names[i::jobs] for i in range(min(jobs, len(names)))]
    with ThreadPoolExecutor(max_workers=len(shares)) as pool:
        results = [r for part in pool.map(lambda part: _run_targets(part, budget, out, seed, quiet), shares)
                   for r in part]
    return {"frames": sum(r["runs"] for r in results), "refused": sum(r["refused"] for r in results),
            "findings": [dict(f, target=r["target"]) for r in results for f in r["findings"]],
            "crashes": sum(1 for r in results if r["crashed"]), "seconds": round(time.monotonic() - started, 1),
            "targets": results}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=1_000_000, help="inputs for the decoder phase (default 1000000)")
    ap.add_argument("--jobs", type=int, default=2, help="targets fuzzed at once (default 2)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--target", action="append", choices=sorted(TARGETS), help="only these targets (repeatable)")
    ap.add_argument("--live-connections", type=int, default=1000,
                    help="connections the live phase opens (default 1000; 0: no live phase)")
    ap.add_argument("--live-frames", type=int, default=100,
                    help="mutated frames per live connection (default 100)")
    ap.add_argument("--out", type=Path, help="where corpora, logs and findings go (default: a temporary directory)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON at the end")
    args = ap.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="tandem-fuzz-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"fuzz: decoder phase, {args.frames:,} frames over {len(args.target or TARGETS)} targets "
          f"(atheris, coverage-guided); output in {out}", flush=True)
    dec = run_decoders(args.frames, out, jobs=args.jobs, seed=args.seed, targets=args.target)
    for f in dec["findings"]:
        print(f"FINDING {f['target']}: {f['type']} at {f['where']}: {f['message'][:300]}"
              + (f" (input {f['input']})" if "input" in f else ""), flush=True)
    print(f"decoders: {dec['frames']:,} frames, {len(dec['findings'])} unexpected exceptions, "
          f"{dec['crashes']} crashes, {dec['seconds']:.1f} s", flush=True)
    summary: dict[str, Any] = {"decoders": {k: v for k, v in dec.items() if k != "targets"}}
    failed = bool(dec["findings"])
    if args.live_connections > 0:
        from tests.fuzz.live import run_live

        print(f"fuzz: live phase, {args.live_connections} connections to a two-node group", flush=True)
        live = asyncio.run(run_live(out / "live", connections=args.live_connections,
                                    frames_per_connection=args.live_frames, seed=args.seed))
        for line in live["error_events"][:20]:
            print(f"live: the node reported (not an exception): {line}", flush=True)
        for problem in live["problems"]:
            print(f"LIVE {problem}", flush=True)
        print(f"live: {live['frames']:,} frames over {live['connections']} connections, "
              f"{live['crashes']} node crashes, {live['log_errors']} exceptions in the logs (tracebacks, "
              f"unhandled, CRITICAL, internal error), "
              f"still serving: {'yes' if live['serving'] else 'NO'}, {live['seconds']:.1f} s", flush=True)
        summary["live"] = live
        failed = failed or bool(live["problems"])
    total = dec["frames"] + summary.get("live", {}).get("frames", 0)
    print(f"total: {total:,} frames, {'FAILED' if failed else 'no findings'}", flush=True)
    if args.json:
        print(json.dumps(summary))
    sys.stdout.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
