"""What a local 3-node group's nodes spend, in CPU, per message at a paced rate.

    .venv/bin/python scripts/paced_cpu.py [--rates 100,500,2000] [--base-port 7900]

For each rate: a fresh group (``tandem cluster up --nodes 3``, in a temp dir), then
``tandem bench --url ... --messages 500 --latency-rate R --latency-messages 8R`` against it;
the three node processes' user + system time (``/proc/<pid>/stat``) from before the bench to
after it, divided by the messages sent.  Prints one line a rate: the nodes' CPU, per message,
and the bench's confirm p50 / p99.  A diagnostic, Linux only;
``tandem bench`` is the benchmark.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import tempfile
from pathlib import Path

from broker.tools.process import node_command
from client.clock import SYSTEM_CLOCK

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICK


def node_pids(parent: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(parent)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


def one_rate(rate: int, base_port: int) -> str:
    tandem, env = node_command()  # the group and the bench run this checkout's code, whatever the cwd
    with tempfile.TemporaryDirectory(prefix="tandem-paced-") as tmp:
        data = Path(tmp) / "group"
        logf = open(Path(tmp) / "cluster.log", "w+")
        cluster = subprocess.Popen([*tandem, "cluster", "up", "--nodes", "3", "--base-port", str(base_port),
                                    "--data-dir", str(data)], stdout=logf, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = SYSTEM_CLOCK.monotonic() + 60
            while "client URL" not in Path(logf.name).read_text():
                if cluster.poll() is not None or SYSTEM_CLOCK.monotonic() > deadline:
                    raise SystemExit(f"the group did not start:\n{Path(logf.name).read_text()}")
                SYSTEM_CLOCK.sleep_blocking(0.2)
            password = (data / "admin-password").read_text().strip()
            hosts = ",".join(f"127.0.0.1:{base_port + 10 * i}" for i in range(3))
            pids = node_pids(cluster.pid)
            before = cpu_seconds(pids)
            messages = 500 + 8 * rate
            out = subprocess.run([*tandem, "bench", "--url", f"tandem://admin:{password}@{hosts}", "--messages", "500",
                                  "--latency-rate", str(rate), "--latency-messages", str(8 * rate), "--json"],
                                 capture_output=True, text=True, check=True, env=env).stdout
            used = cpu_seconds(pids) - before
        finally:
            cluster.send_signal(signal.SIGINT)
            cluster.wait(60)
            logf.close()
    run = json.loads(out)["runs"][0]
    c = run["confirm_ms"]
    return (f"{rate:6d} msg/s  nodes' CPU {used:6.2f} s  {used / messages * 1e6:6.0f} us a message  "
            f"confirm p50 {c['p50']:.2f} ms p99 {c['p99']:.2f} ms  lost {run['lost']} duplicated {run['duplicated']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="100,500,1000,2000", help="comma-separated msg/s (default %(default)s)")
    ap.add_argument("--base-port", type=int, default=7900, help="the group's first port (default %(default)s)")
    args = ap.parse_args()
    for rate in (int(r) for r in args.rates.split(",")):
        print(one_rate(rate, args.base_port), flush=True)


if __name__ == "__main__":
    main()
