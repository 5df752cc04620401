"""The operator tools for two-node setups and shared mode, with real processes:
``tandem cluster up --mode shared`` / ``--arbiter lockfile`` / ``--arbiter witness``,
``tandem drill`` on them, ``tandem bench --mode shared --compare-replicated 3``, and the
errors for flags that do not go together.

All but the flag errors need the features themselves on the node: shared mode
(``--mode shared``: ``ha_state`` ACTIVE / PASSIVE in ``tandem status``), the LockFile arbiter
(``--arbiter lockfile``) and the witness (``tandem witness start``, ``--arbiter witness``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

import client
from broker.tools.checker import classify
from broker.tools.drill import DrillConfig, drill
from broker.tools.pair import LOCK_SERVING, HaSetup
from tests.conftest import PASSWORD
from tests.helpers import free_base_port, tandem, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

PG_SERVER = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


# -- flags that do not go together: no process starts --------------------------------------


@pytest.mark.parametrize(("argv", "says"), [
    (["cluster", "up", "--nodes", "2", "--mode", "shared"], "--mode shared needs --database"),
    (["cluster", "up", "--nodes", "3", "--arbiter", "lockfile"], "--arbiter lockfile: for a pair of nodes"),
    (["cluster", "up", "--nodes", "1", "--arbiter", "witness"], "--nodes 2"),
    (["cluster", "up", "--nodes", "2", "--mode", "shared", "--database", "sqlite:///x.db", "--arbiter", "witness"],
     "shared mode is arbitrated by its lock"),
    (["cluster", "up", "--database", "sqlite:///x.db"], "--database goes with --mode shared"),
    (["cluster", "up", "--nodes", "2", "--lockfile", "/tmp/x.lock"], "--lockfile goes with --arbiter lockfile"),
    (["cluster", "up", "--nodes", "2", "--mode", "shared", "--database", "mysql://h/db"], "--database: expected"),
    (["drill", "kill-replica", "--mode", "shared", "--database", "sqlite:///x.db"],
     "the drills are kill-active and pause-active"),
    (["drill", "kill-active", "--arbiter", "lockfile", "--nodes", "3"], "for a pair of nodes"),
    (["drill", "pause-active", "--arbiter", "witness", "--url", "tandem://a:b@127.0.0.1:1", "--inject", "true",
      "--heal", "true"], "a running group (--url) is drilled with the setup it has"),
    (["drill", "kill-active", "--runs", "0"], "--runs must be >= 1"),
    (["bench", "--url", "tandem://a:b@127.0.0.1:1", "--mode", "shared", "--database", "sqlite:///x.db"],
     "add --spawn"),
    (["bench", "--spawn", "--nodes", "3", "--arbiter", "lockfile"], "for a pair of nodes"),
    (["bench", "--spawn", "--nodes", "2", "--mode", "shared", "--database", "sqlite:///x.db", "--failover"],
     "tandem drill kill-active"),
])
def test_flags_that_do_not_go_together_are_named(argv: list[str], says: str, tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "broker.cli", *argv], capture_output=True, text=True, timeout=60,
                         cwd=tmp_path)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert says in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_help_shows_the_two_node_setups() -> None:
    for argv in (["cluster", "up"], ["drill"], ["bench"]):
        out = subprocess.run([sys.executable, "-m", "broker.cli", *argv, "--help"], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0
        assert "--mode" in out.stdout and "--database URL" in out.stdout and "--arbiter" in out.stdout
        assert "examples:" in out.stdout


# -- tandem cluster up ----------------------------------------------------------------------


@dataclass
class Up:
    """A running ``tandem cluster up`` and what it printed so far."""

    proc: asyncio.subprocess.Process
    data_dir: Path
    base: int
    nodes: int
    lines: list[str] = field(default_factory=list)

    def printed(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def output(self) -> str:
        return "".join(self.lines)

    def url(self, *nodes: int) -> str:
        hosts = ",".join(f"127.0.0.1:{self.base + 10 * (i - 1)}" for i in (nodes or range(1, self.nodes + 1)))
        return f"tandem://admin:{PASSWORD}@{hosts}"

    def pid(self, name: str) -> int:
        return int((self.data_dir / f"{name}.pid").read_text())


async def _read(proc: asyncio.subprocess.Process, lines: list[str]) -> None:
    assert proc.stdout is not None
    while line := await proc.stdout.readline():
        lines.append(line.decode(errors="replace"))


@contextlib.asynccontextmanager
async def cluster_up(tmp_path: Path, *args: str, nodes: int = 2) -> AsyncIterator[Up]:
    base = free_base_port(nodes + 1)  # (+1: a witness's peer port is the third node's)
    data = tmp_path / "group"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "broker.cli", "cluster", "up", "--nodes", str(nodes), "--base-port", str(base),
        "--data-dir", str(data), *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "TANDEM_ADMIN_PASSWORD": PASSWORD})
    up = Up(proc, data, base, nodes)
    reader = asyncio.create_task(_read(proc, up.lines))
    try:
        await wait_until(lambda: up.printed("client URL") or proc.returncode is not None, timeout=90,
                         what="cluster up to print its URL")
        assert proc.returncode is None, up.output()
        yield up
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
            await wait_until(lambda: proc.returncode is not None, timeout=60, what="cluster up to stop")
        await reader


async def _status(url: str) -> dict | None:
    rc, out, _err = await tandem("status", "--url", url, "--json")
    return json.loads(out) if rc == 0 else None


async def _ha_states(up: Up) -> dict[str, str]:
    """node -> its ha_state, of the nodes that answer."""
    out = {}
    for i in range(1, up.nodes + 1):
        st = await _status(up.url(i))
        if st is not None:
            out[st["node"]] = st["ha_state"]
    return out


async def _one_active(up: Up, serving: frozenset[str] = frozenset({"ACTIVE"})) -> str:
    """The one node that serves, once exactly one does (the other answering in another state)."""
    found: list[str] = []

    async def one() -> bool:
        states = await _ha_states(up)
        found[:] = [n for n, s in states.items() if s in serving]
        return len(found) == 1 and len(states) == up.nodes

    await wait_until(one, timeout=60, what=f"exactly one node in {sorted(serving)}, the other answering")
    return found[0]


async def _drain(url: str, queue: str, want: set[bytes]) -> list[tuple[bytes, str]]:
    consumed: list[tuple[bytes, str]] = []
    async with await client.connect(url, send_timeout=60) as conn:
        async with conn.group_consumer(queue, prefetch=64) as c:
            async def drained() -> bool:
                while (m := await c.next(0.3)) is not None:
                    consumed.append((m.body, m.id))
                    await m.ack()
                return want <= {b for b, _ in consumed}

            await wait_until(drained, timeout=60, what="every confirmed message consumed")
    return consumed


@pytest.mark.asyncio
async def test_cluster_up_shared_pair_on_sqlite_fails_over_on_kill_9(tmp_path: Path) -> None:
    """Needs shared mode.  Both nodes on one SQLite file: one ACTIVE, one PASSIVE; kill -9 of
    the ACTIVE, the other takes over and the producer's sends are confirmed; the killed node
    comes back PASSIVE; every confirmed message is consumed exactly once."""
    db = tmp_path / "shared.db"
    async with cluster_up(tmp_path, "--mode", "shared", "--database", f"sqlite:///{db}") as up:
        assert up.printed("mode       : shared, 2 nodes, sqlite"), up.output()
        active = await _one_active(up)
        st = await _status(up.url(int(active.removeprefix("node"))))
        assert st is not None and st["mode"] == "shared" and st["epoch"] >= 1
        sent: list[bytes] = []
        async with await client.connect(up.url(), send_timeout=60) as conn:
            await conn.declare_queue("orders", partitions=2)
            p = conn.producer("orders")
            before = [f"before-{i}".encode() for i in range(30)]
            await asyncio.gather(*(p.send(b, key=b.decode()) for b in before))
            sent += before
            os.kill(up.pid(active), signal.SIGKILL)
            await wait_until(lambda: up.printed(f"{active} killed by SIGKILL"), timeout=30, what="the kill named")
            after = [f"after-{i}".encode() for i in range(30)]
            await asyncio.gather(*(p.send(b, key=b.decode()) for b in after))  # raises if unconfirmed
            sent += after
        await wait_until(lambda: up.printed(f"{active} is back"), timeout=60, what=f"{active} back")
        new = await _one_active(up)
        assert new != active
        assert (await _ha_states(up))[active] == "PASSIVE"
        consumed = await _drain(up.url(), "orders", set(sent))
        v = classify(sent, sent, consumed)
        assert (v.lost, v.duplicated, v.unexpected) == (0, 0, 0), v
    assert up.proc.returncode == 0, up.output()
    assert not list(up.data_dir.glob("*.pid"))


@pytest.mark.asyncio
async def test_cluster_up_lockfile_pair_has_one_lock_holder(tmp_path: Path) -> None:
    """Needs the LockFile arbiter.  The lock file is DATA_DIR/tandem.lock by default; exactly
    one node holds it and serves, the client's messages are confirmed and consumed."""
    async with cluster_up(tmp_path, "--arbiter", "lockfile") as up:
        lock = up.data_dir / "tandem.lock"
        assert up.printed(f"lock file  : {lock}"), up.output()
        holder = await _one_active(up, LOCK_SERVING)
        st = await _status(up.url(int(holder.removeprefix("node"))))
        assert st is not None and st["arbiter"] == "lockfile" and st["lock_holder"] == holder
        assert lock.exists()
        rc, _out, err = await tandem("produce", "jobs", "a", "b", "c", "--declare", "2", "--url", up.url())
        assert rc == 0, err
        consumed = await _drain(up.url(), "jobs", {b"a", b"b", b"c"})
        assert sorted(b for b, _ in consumed) == [b"a", b"b", b"c"]


@pytest.mark.asyncio
async def test_cluster_up_witness_pair_supervises_the_witness(tmp_path: Path) -> None:
    """Needs the witness.  cluster up starts w1 beside the pair (its peer port the third
    node's), names it in the banner, writes its pid, and brings it back after kill -9; the
    pair serves throughout."""
    async with cluster_up(tmp_path, "--arbiter", "witness") as up:
        assert up.printed("w1     witness, peer"), up.output()
        st = await _status(up.url(1))
        assert st is not None and st["arbiter"] == "witness"
        old = up.pid("w1")
        os.kill(old, signal.SIGKILL)
        await wait_until(lambda: up.printed("w1 killed by SIGKILL"), timeout=30, what="the witness's kill named")
        await wait_until(lambda: up.printed("w1 is back"), timeout=60, what="the witness back")
        assert up.pid("w1") != old
        rc, _out, err = await tandem("produce", "jobs", "x", "--declare", "1", "--url", up.url())
        assert rc == 0, err
        witness = up.pid("w1")
    assert up.proc.returncode == 0, up.output()
    with pytest.raises(ProcessLookupError):
        os.kill(witness, 0)


# -- tandem drill ---------------------------------------------------------------------------


def _drill_cfg(scenario: str, ha: HaSetup, tmp_path: Path) -> DrillConfig:
    return DrillConfig(scenario, nodes=2, producers=1, consumers=1, messages=400, partitions=2, seed=5,
                       data_dir=tmp_path, timeout=150, ha=ha)


def _passed(rep: dict) -> None:
    assert rep["errors"] == [], rep["errors"]
    assert rep["sent"] == rep["confirmed"] == 400  # every send confirmed across the fault
    assert (rep["lost"], rep["duplicated"], rep["unexpected"]) == (0, 0, 0)
    assert rep["takeover_ms"]["max"] is not None and rep["takeover_ms"]["max"] > 0
    assert rep["passed"]


@pytest.mark.asyncio
async def test_drill_kill_active_shared_on_sqlite(tmp_path: Path) -> None:
    """Needs shared mode.  The node whose status says ACTIVE is killed; each run on a database
    file of its own beside the one named, deleted afterwards."""
    named = tmp_path / "shared.db"
    rep = await drill(_drill_cfg("kill-active", HaSetup(mode="shared", database=f"sqlite:///{named}"), tmp_path))
    _passed(rep)
    assert rep["group"] == "spawned, shared, 2 nodes, sqlite"
    assert not list(tmp_path.glob("shared-*"))  # the run's database is gone


@pytest.mark.asyncio
async def test_drill_pause_active_shared_on_postgresql(tmp_path: Path) -> None:
    """Needs shared mode on PostgreSQL.  SIGSTOP of the ACTIVE past its lease: the passive
    takes over; after SIGCONT the old one commits nothing.  The run's database is dropped."""
    rep = await drill(_drill_cfg("pause-active", HaSetup(mode="shared", database=PG_SERVER), tmp_path))
    _passed(rep)
    with psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=postgres") as conn:
        left = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'postgres_drill1_%'").fetchall()
    assert left == []


@pytest.mark.long
@pytest.mark.asyncio
async def test_drill_pause_active_lockfile(tmp_path: Path) -> None:
    """Needs the LockFile arbiter.  SIGSTOP of the lock holder past its lease: the other node
    takes the lock and serves; the old one confirms nothing after SIGCONT.  In the long tier:
    make test drills the pair setups through kill-active, and pauses the lock holder in
    tests/integration/test_lockfile.py."""
    _passed(await drill(_drill_cfg("pause-active", HaSetup(arbiter="lockfile"), tmp_path)))


@pytest.mark.asyncio
async def test_drill_kill_active_witness(tmp_path: Path) -> None:
    """Needs the witness.  kill -9 of the node active for most partitions of a pair with a
    witness: the other is elected with the witness's vote."""
    _passed(await drill(_drill_cfg("kill-active", HaSetup(arbiter="witness"), tmp_path)))


# -- tandem bench ---------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_bench_shared_pair_against_a_replicated_group_in_one_run(tmp_path: Path) -> None:
    """Needs shared mode.  One invocation measures a shared-mode pair and a 3-node replicated
    group with the same workload; each line says its mode."""
    db = tmp_path / f"bench-{uuid.uuid4().hex[:6]}.db"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "broker.cli", "bench", "--spawn", "--nodes", "2", "--mode", "shared", "--database",
        f"sqlite:///{db}", "--compare-replicated", "3", "--messages", "1500", "--latency-messages", "150",
        "--latency-rate", "500", "--json", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 240)
    assert proc.returncode == 0, err.decode()[-3000:]
    report = json.loads(out)
    assert [r["mode"] for r in report["runs"]] == ["shared, 2 nodes, sqlite", "replicated, 3 nodes, replicas SYNC"]
    for r in report["runs"]:
        assert r["error"] is None, r
        assert (r["lost"], r["duplicated"], r["unexpected"]) == (0, 0, 0), r
        assert r["confirmed"] == r["consumed"] == 1500
    assert set(report["ratios"]) == {"tandem (replicated, 3 nodes, replicas SYNC)"}
    assert not list(tmp_path.glob("bench-*"))  # the run's database file is gone
