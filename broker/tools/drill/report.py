"""The verdict of drill runs: totals over the runs, and the lines that show them."""

from __future__ import annotations

import json
import statistics
from typing import Any

from broker.tools.drill.model import DrillConfig, RunResult


def summarize(cfg: DrillConfig, results: list[RunResult], net: str | None = None) -> dict[str, Any]:
    """The totals over the runs (``net``: the spawned group's network, proxy or netns)."""
    waits = [r.failover_ms for r in results if not r.error]
    out: dict[str, Any] = {
        "scenario": cfg.scenario, "runs": len(results), "seed": cfg.seed,
        "group": "existing" if cfg.url else f"spawned, {cfg.ha.label(cfg.nodes)}{', TLS' if cfg.tls else ''}"
                                              f"{', each node in a network namespace' if net == 'netns' else ''}",
        "mode": None if cfg.url else cfg.ha.mode, "arbiter": None if cfg.url else cfg.ha.arbiter,
        "policies": {"local_sync": cfg.local_sync, "remote_sync": cfg.remote_sync} if cfg.url is None
        else {"local_sync": "the group's own", "remote_sync": "the group's own"},
    }
    for k in ("sent", "confirmed", "ok", "lost", "duplicated", "redelivered", "unexpected",
              "unconfirmed_delivered", "reordered", "failed_sends", "reported_lost", "unreported_lost"):
        out[k] = sum(getattr(r, k) for r in results)
    out["workload"] = cfg.workload
    if cfg.workload == "transactional":
        out["atomicity"] = {k: sum(getattr(r, k) for r in results)
                            for k in ("transactions", "tx_committed", "tx_aborted", "partial", "acked_twice",
                                      "tx_unknown")}
    out["failover_ms"] = {"p50": round(statistics.median(waits), 1) if waits else None,
                          "max": max(waits) if waits else None}
    took = [r.takeover_ms for r in results if not r.error and r.takeover_ms is not None]
    out["takeover_ms"] = {"p50": round(statistics.median(took), 1) if took else None,
                          "max": max(took) if took else None}
    healed = [r.heal_up_ms for r in results if r.heal_up_ms is not None]  # (a deposition's error: still measured)
    out["heal_up_ms"] = {"p50": round(statistics.median(healed), 1) if healed else None,
                         "max": max(healed) if healed else None}
    out["deposed"] = sum(r.deposed for r in results)
    out["net"] = None if cfg.url else net
    out["moved"] = sum(1 for r in results if r.after and r.target and r.after != r.target)
    out["ha_events"] = sorted({e for r in results for e in r.ha_events})
    out["schedule"] = [f"run {r.run}: {line}" for r in results for line in r.schedule]
    out["lost_ranges"] = [f"run {r.run}: {line}" for r in results for line in r.lost_ranges]
    out["errors"] = [f"run {r.run}: {r.error}" for r in results if r.error]
    out["kept"] = [f"run {r.run}: {r.kept}" for r in results if r.kept]
    if cfg.scenario == "rolling-upgrade":  # (each step and the upgrade status after it)
        out["steps"] = [{"run": r.run, **step} for r in results for step in r.steps]
    out["passed"] = bool(results) and all(r.passed for r in results)
    return out


def report_text(rep: dict[str, Any]) -> str:
    lines = [f"drill {rep['scenario']}: {rep['runs']} run(s){' on ' + rep['group'] if rep.get('group') else ''}, policies local_sync={rep['policies']['local_sync']} "
             f"remote_sync={rep['policies']['remote_sync']}, seed {rep['seed']}",
             f"  sent {rep['sent']}, confirmed {rep['confirmed']}, ok {rep['ok']}, lost {rep['lost']} "
             f"(reported by Tandem: {rep['reported_lost']}), duplicated {rep['duplicated']}, "
             f"unexpected {rep['unexpected']}, reordered {rep['reordered']}",
             f"  redelivered {rep['redelivered']}, unconfirmed but delivered {rep['unconfirmed_delivered']}, "
             f"sends that raised {rep['failed_sends']}",
             f"  longest wait for a confirm: p50 {rep['failover_ms']['p50']} ms, max {rep['failover_ms']['max']} ms",
             f"  fault to the first confirm on the new active: p50 {rep['takeover_ms']['p50']} ms, "
             f"max {rep['takeover_ms']['max']} ms",
             f"  another node served once the fault was over in {rep['moved']} of {rep['runs']} run(s)"]
    if (a := rep.get("atomicity")) is not None:
        lines.insert(1, f"  transactions {a['transactions']}: committed {a['tx_committed']}, aborted {a['tx_aborted']}, "
                        f"partial {a['partial']}, inputs acked twice {a['acked_twice']}, "
                        f"outcome unknown {a['tx_unknown']}")
    if rep.get("heal_up_ms", {}).get("max") is not None or rep.get("deposed"):
        lines.append(f"  heal to every peer Up: p50 {rep['heal_up_ms']['p50']} ms, max {rep['heal_up_ms']['max']} ms; "
                     f"healthy actives deposed after the heal: {rep['deposed']}")
    if rep["ha_events"]:
        lines.append("  HA events: " + "; ".join(rep["ha_events"][:10]))
    for line in rep.get("schedule", []):
        lines.append("  fault: " + line)
    for step in rep.get("steps", []):
        st = step.get("status") or {}
        lines.append(f"  run {step['run']}: {step['step']}: builds {', '.join(f'{n} {b}' for n, b in step['builds'].items())}"
                     f"; confirmed {step['confirmed']} of {step['sent']} sent"
                     f"; in the step: lost {step.get('lost')}, duplicated {step.get('duplicated')}, "
                     f"longest confirm wait {step.get('longest_confirm_wait_ms')} ms"
                     + (f"; group feature level {st['feature_level']}" if st else ""))
    for e in rep["errors"]:
        lines.append("  error: " + e)
    for k in rep.get("kept", []):
        lines.append("  node logs kept: " + k)
    lines.append("  PASSED" if rep["passed"] else "  FAILED")
    return "\n".join(lines)


def progress_line(r: RunResult) -> str:
    return json.dumps({"run": r.run, "target": r.target, "lost": r.lost, "duplicated": r.duplicated,
                       "unexpected": r.unexpected, "reported_lost": r.reported_lost, "failover_ms": r.failover_ms, "takeover_ms": r.takeover_ms, "after": r.after,
                       **({"fault": r.fault, "heal_up_ms": r.heal_up_ms, "deposed": r.deposed} if r.fault else {}),
                       **({"transactions": r.transactions, "partial": r.partial, "acked_twice": r.acked_twice}
                          if r.transactions else {}),
                       "unreported_lost": r.unreported_lost, "passed": r.passed, **({"error": r.error} if r.error else {})})
