"""What the soak counts and how it judges: the producers' ledger, the consumer's tally, the
series per interval, the verdict and the plot.

The ledger: one text file per locust process, a line per batch, written by the producers
(:mod:`broker.tools.soak_locustfile`) before and after each publish::

    s <producer hex> <first n> <count>                       about to send
    c <producer hex> <first n> <count> <when> <latency s>    confirmed
    f <producer hex> <first n> <count> <when> <error>        failed (outcome unknown)

A message is (producer, n) (:mod:`client.stamp`).  The verdict is a
:class:`~broker.tools.checker.Verdict` with the checker's definitions, counted in memory
that grows by a few bytes per message (an hour at 2000 msg/s is 7.2 million of them).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.tools.checker import Verdict
from client.stamp import read_stamp

SENT, CONFIRMED, FAILED = 1, 2, 3


def _mid(message_id: str) -> int:
    """'<partition>-<offset>' as one int."""
    part, _, off = message_id.partition("-")
    return (int(part) << 48) | int(off)


@dataclass
class Ledger:
    """Per producer, the state of each of its messages (a byte each); the confirms' times."""

    status: dict[bytes, bytearray] = field(default_factory=dict)
    #: (when, messages, latency s) of every confirmed batch
    confirms: list[tuple[float, int, float]] = field(default_factory=list)
    #: (when, messages) of every failed batch
    failures: list[tuple[float, int]] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)

    def _mark(self, producer: bytes, first: int, count: int, state: int) -> None:
        arr = self.status.setdefault(producer, bytearray())
        if len(arr) < first + count:
            arr.extend(bytes(first + count - len(arr)))
        arr[first:first + count] = bytes([state]) * count

    def read(self, lines: Iterable[str]) -> None:
        for line in lines:
            f = line.split()
            if len(f) < 4:
                continue  # a line cut short by a killed process
            kind, producer, first, count = f[0], bytes.fromhex(f[1]), int(f[2]), int(f[3])
            if kind == "s":
                self._mark(producer, first, count, SENT)
            elif kind == "c" and len(f) >= 6:
                self._mark(producer, first, count, CONFIRMED)
                self.confirms.append((float(f[4]), count, float(f[5])))
            elif kind == "f" and len(f) >= 6:
                self._mark(producer, first, count, FAILED)
                self.failures.append((float(f[4]), count))
                self.errors[f[5]] = self.errors.get(f[5], 0) + count

    @classmethod
    def load(cls, directory: Path) -> Ledger:
        ledger = cls()
        for path in sorted(directory.glob("ledger-*.txt")):
            with open(path) as fh:
                ledger.read(fh)
        return ledger

    def state(self, producer: bytes, n: int) -> int:
        arr = self.status.get(producer)
        return arr[n] if arr is not None and n < len(arr) else 0

    def confirmed_keys(self) -> Iterable[bytes]:
        for producer, arr in self.status.items():
            for n, st in enumerate(arr):
                if st == CONFIRMED:
                    yield producer + n.to_bytes(8, "big")


@dataclass
class Tally:
    """Every delivery the soak's consumer got."""

    first: dict[bytes, int] = field(default_factory=dict)  # message key -> first message id
    others: dict[bytes, set[int]] = field(default_factory=dict)  # further ids of a key (duplicates)
    unstamped: set[bytes] = field(default_factory=set)
    deliveries: int = 0
    times: list[float] = field(default_factory=list)  # when each delivery came

    def add(self, body: bytes, message_id: str, when: float) -> None:
        self.deliveries += 1
        self.times.append(when)
        st = read_stamp(body)
        if st is None:
            self.unstamped.add(body)
            return
        key, mid = st.key, _mid(message_id)
        had = self.first.setdefault(key, mid)
        if had != mid:
            self.others.setdefault(key, set()).add(mid)

    def seen(self, key: bytes) -> bool:
        return key in self.first

    def verdict(self, ledger: Ledger) -> Verdict:
        """The checker's classification (:func:`broker.tools.checker.classify`)."""
        sent = confirmed = 0
        for arr in ledger.status.values():
            confirmed += arr.count(CONFIRMED)
            sent += len(arr) - arr.count(0)
        ok = recovered = unexpected = duplicated = 0
        distinct = 0
        for key in self.first:
            ids = 1 + len(self.others.get(key, ()))
            distinct += ids
            st = ledger.state(key[:8], int.from_bytes(key[8:], "big"))
            if st == 0:
                unexpected += 1
                continue
            if st == CONFIRMED:
                ok += 1
            else:
                recovered += 1
            if ids > 1:
                duplicated += 1
        distinct += len(self.unstamped)
        return Verdict(sent=sent, confirmed=confirmed, ok=ok, lost=confirmed - ok, duplicated=duplicated,
                       redelivered=self.deliveries - distinct, unexpected=unexpected + len(self.unstamped),
                       recovered=recovered)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def series(t0: float, run_time: float, interval: float, ledger: Ledger, tally: Tally,
           rss: list[tuple[float, str, int]]) -> dict[str, Any]:
    """Per interval from ``t0``: published (confirmed) and consumed msg/s, failed publishes,
    confirm p50/p99 (ms, of batches), each node's mean RSS (MiB)."""
    n = max(1, math.ceil(run_time / interval))
    pub, failed, con = [0] * n, [0] * n, [0] * n
    lat: list[list[float]] = [[] for _ in range(n)]

    def bucket(t: float) -> int | None:
        b = int((t - t0) // interval)
        return b if 0 <= b < n else None

    for when, count, latency in ledger.confirms:
        b = bucket(when)
        if b is not None:
            pub[b] += count
            lat[b].append(latency * 1000)
    for when, count in ledger.failures:
        b = bucket(when)
        if b is not None:
            failed[b] += count
    for when in tally.times:
        b = bucket(when)
        if b is not None:
            con[b] += 1
    nodes = sorted({name for _t, name, _r in rss})
    mem: dict[str, list[list[int]]] = {name: [[] for _ in range(n)] for name in nodes}
    for when, name, value in rss:
        b = bucket(when)
        if b is not None:
            mem[name][b].append(value)
    return {
        "t_s": [round(i * interval, 3) for i in range(n)],
        "interval_s": interval,
        "published_per_s": [round(c / interval, 1) for c in pub],
        "consumed_per_s": [round(c / interval, 1) for c in con],
        "failed": failed,
        "confirm_p50_ms": [_round(percentile(v, 0.50)) for v in lat],
        "confirm_p99_ms": [_round(percentile(v, 0.99)) for v in lat],
        "rss_mib": {name: [_round(sum(v) / len(v) / 2**20) if v else None for v in mem[name]] for name in nodes},
    }


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 2)


def judge(t0: float, run_time: float, ledger: Ledger, tally: Tally, rss: list[tuple[float, str, int]],
          verdict: Verdict, tolerance: float = 0.10, restarts: dict[str, list[float]] | None = None,
          settle: float = 0.0) -> dict[str, Any]:
    """Flat and exact: the means of the last window against the first after a warm-up (the
    warm-up a twelfth of the run, each window a sixth: 5 and 10 minutes of an hour).
    Throughput (published and consumed) within ``tolerance`` either way; each node's RSS grown
    by no more than ``tolerance`` (less is no leak: a node killed and started again comes back
    small), leaving out a node's samples for ``settle`` seconds after each of its ``restarts``
    (it rebuilds its working set); nothing lost, duplicated or unexpected."""
    restarts = restarts or {}
    warm, win = run_time / 12, run_time / 6
    first = (t0 + warm, t0 + warm + win)
    last = (t0 + run_time - win, t0 + run_time)

    def rate(events: Iterable[tuple[float, int]], w: tuple[float, float]) -> float:
        return sum(c for t, c in events if w[0] <= t < w[1]) / (w[1] - w[0])

    checks: dict[str, Any] = {}
    for name, events in (("published_per_s", [(t, c) for t, c, _l in ledger.confirms]),
                         ("consumed_per_s", [(t, 1) for t in tally.times])):
        a, b = rate(events, first), rate(events, last)
        checks[name] = {"first": round(a, 1), "last": round(b, 1),
                        "change": round(b / a - 1, 3) if a else None,
                        "flat": bool(a) and abs(b / a - 1) <= tolerance}
    for node in sorted({name for _t, name, _r in rss}):
        def mean(w: tuple[float, float]) -> float | None:
            v = [r for t, name, r in rss if name == node and w[0] <= t < w[1]
                 and not any(0 <= t - at < settle for at in restarts.get(node, ()))]
            return sum(v) / len(v) / 2**20 if v else None

        a_, b_ = mean(first), mean(last)
        checks[f"rss_mib_{node}"] = {"first": _round(a_), "last": _round(b_),
                                     "change": round(b_ / a_ - 1, 3) if a_ and b_ else None,
                                     "flat": a_ is not None and b_ is not None and b_ <= a_ * (1 + tolerance)}
    exact = verdict.lost == 0 and verdict.duplicated == 0 and verdict.unexpected == 0
    return {"rss_settle_s": round(settle, 1), "windows_s": {"warm_up": round(warm, 1), "first": [round(warm, 1), round(warm + win, 1)],
                          "last": [round(run_time - win, 1), round(run_time, 1)]},
            "tolerance": tolerance, "checks": checks, "exact": exact,
            "passed": exact and all(c["flat"] for c in checks.values())}


def plot(path: Path, data: dict[str, Any]) -> None:
    """Throughput, confirm p50/p99 and each node's RSS over time, a line at every kill."""
    import matplotlib  # the optional "load" extra; imported when a soak ends

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = data["series"]
    t = [(x + s["interval_s"] / 2) / 60 for x in s["t_s"]]  # each interval at its middle
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(11, 9), sharex=True)
    ax1.plot(t, s["published_per_s"], label="published (confirmed)")
    ax1.plot(t, s["consumed_per_s"], label="consumed")
    ax1.set_ylabel("msg/s")
    ax2.plot(t, [v if v is not None else math.nan for v in s["confirm_p50_ms"]], label="confirm p50")
    ax2.plot(t, [v if v is not None else math.nan for v in s["confirm_p99_ms"]], label="confirm p99")
    ax2.set_ylabel("ms (per batch)")
    ax2.set_yscale("log")
    for node, values in s["rss_mib"].items():
        ax3.plot(t, [v if v is not None else math.nan for v in values], label=node)
    ax3.set_ylabel("RSS MiB")
    ax3.set_xlabel("minutes")
    w = data["judgement"]["windows_s"]
    for ax in (ax1, ax2, ax3):
        for k in data["kills"]:
            ax.axvline(k["at_s"] / 60, color="red", linestyle="--", linewidth=0.8)
        for lo, hi in (w["first"], w["last"]):
            ax.axvspan(lo / 60, hi / 60, color="grey", alpha=0.1)
        ax.legend(loc="upper right", fontsize=8)
        ax.grid(alpha=0.3)
    v = data["verdict"]
    rt = data["config"]["run_time_s"]
    fig.suptitle(f"tandem soak: {data['config']['rate']:g} msg/s for "
                 f"{f'{rt / 60:.0f} min' if rt >= 120 else f'{rt:.0f} s'}, "
                 f"{len(data['kills'])} kill(s) (red); lost {v['lost']}, duplicated {v['duplicated']}; "
                 f"{'PASSED' if data['judgement']['passed'] else 'FAILED'}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
