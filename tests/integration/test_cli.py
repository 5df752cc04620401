"""The tandem command against a real node process: produce, consume, queues, errors."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from broker.tools.process import NodeProcess

pytestmark = [pytest.mark.asyncio, pytest.mark.integration]


@pytest_asyncio.fixture
async def proc(tmp_path: Path) -> AsyncIterator[NodeProcess]:
    p = NodeProcess(tmp_path / "node1")
    await p.start()
    try:
        yield p
    finally:
        await p.stop()


async def tandem(*args: str, stdin: bytes | None = None, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "broker.cli", *args, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env={**os.environ, **(env or {})})
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), 60)
    finally:
        if proc.returncode is None:  # (timed out, or the test was cancelled: the command must not outlive it)
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_produce_consume_and_list(proc: NodeProcess) -> None:
    rc, out, err = await tandem("produce", "jobs", "one", "two", "--declare", "2", "--key", "k",
                                "--header", "a=b", "--url", proc.url, "--json")
    assert rc == 0, err
    assert json.loads(out)["confirmed"] == 2
    rc, out, err = await tandem("produce", "jobs", "--url", proc.url, stdin=b"three\nfour\n")
    assert rc == 0 and "2 message(s) confirmed" in out
    rc, out, err = await tandem("queues", "--url", proc.url, "--json")
    (q,) = json.loads(out)
    assert (q["name"], q["ready"], q["partitions"]) == ("jobs", 4, 2)
    rc, out, err = await tandem("consume", "jobs", "-n", "4", "--url", proc.url, "--json")
    assert rc == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert sorted(r["body"] for r in rows) == ["four", "one", "three", "two"]
    assert {r["headers"].get("a") for r in rows if r["body"] in ("one", "two")} == {"b"}
    rc, out, _ = await tandem("queues", "--url", proc.url)
    assert "jobs" in out and "READY" in out


async def test_queue_admin_commands(proc: NodeProcess) -> None:
    assert (await tandem("queues", "declare", "q", "--partitions", "3", "--url", proc.url))[0] == 0
    await tandem("produce", "q", "a", "b", "--url", proc.url)
    rc, out, _ = await tandem("queues", "purge", "q", "--url", proc.url, "--json")
    assert rc == 0 and json.loads(out)["purged"] == 2
    rc, out, _ = await tandem("queues", "delete", "q", "--url", proc.url)
    assert rc == 0 and "deleted" in out


@pytest.mark.parametrize("args, needle", [
    (["consume", "nope", "-n", "1"], "queue 'nope' does not exist"),
    (["queues", "declare", "bad name"], "queue name"),
    (["queues", "purge"], "needs a queue name"),
    (["produce", "q", "x", "--header", "novalue"], "KEY=VALUE"),
])
async def test_client_errors_are_one_line_no_traceback(proc: NodeProcess, args: list[str], needle: str) -> None:
    rc, out, err = await tandem(*args, "--url", proc.url)
    assert rc == 2 and needle in err and "Traceback" not in err


async def test_wrong_password_and_unreachable_node(proc: NodeProcess) -> None:
    bad = proc.url.replace(proc.password, "nope-nope")
    rc, _, err = await tandem("queues", "--url", bad)
    assert rc == 2 and "authentication failed" in err and "Traceback" not in err
    rc, _, err = await tandem("queues", "--url", "tandem://admin:x@127.0.0.1:1")
    assert rc == 2 and "cannot connect" in err


async def test_broker_start_rejects_bad_settings(tmp_path: Path) -> None:
    cfg = tmp_path / "t.toml"
    cfg.write_text('name = "n"\nprot = 7780\n')
    rc, _, err = await tandem("broker", "start", "--config", str(cfg), "--data-dir", str(tmp_path / "d"))
    assert rc == 2 and "unknown setting(s): prot" in err and "Traceback" not in err
    rc, _, err = await tandem("broker", "start", "--sync", "SOMETIMES", "--data-dir", str(tmp_path / "d"))
    assert rc == 2 and "unknown durability policy" in err
    rc, _, err = await tandem("broker", "start", "--port", "99999", "--data-dir", str(tmp_path / "d"))
    assert rc == 2 and "port" in err


async def test_first_start_writes_a_random_admin_password(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TANDEM_ADMIN_PASSWORD"}
    node = NodeProcess(tmp_path / "n")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "broker.cli", "broker", "start", "--data-dir", str(node.data_dir), "--port", "0",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env)
    assert proc.stdout is not None
    try:
        lines = []
        while True:
            line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
            lines.append(line)
            if "client URL" in line:
                port = int(line.rsplit(":", 1)[1])
                break
        pw_file = node.data_dir / "admin-password"
        assert oct(pw_file.stat().st_mode & 0o777) == "0o600"
        password = pw_file.read_text().strip()
        assert len(password) >= 16
        rc, out, err = await tandem("queues", "--url", f"tandem://admin:{password}@127.0.0.1:{port}")
        assert rc == 0, err
    finally:
        proc.terminate()
        await proc.wait()


async def test_help_explains(tmp_path: Path) -> None:
    rc, out, _ = await tandem("--help")
    assert rc == 0 and "bench" in out and "produce" in out
    rc, out, _ = await tandem("broker", "start", "--help")
    assert rc == 0 and "--sync" in out and "admin-password" in out


async def test_consume_into_a_closed_pipe_stops_quietly(proc: NodeProcess) -> None:
    await tandem("produce", "q", *[str(i) for i in range(2000)], "--declare", "1", "--url", proc.url)
    p = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "broker.cli", "consume", "q", "--url", proc.url, "--timeout", "5",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    first = await asyncio.wait_for(p.stdout.readline(), 30)
    assert first.startswith(b"[")
    p.stdout.feed_eof()
    p._transport.get_pipe_transport(1).close()  # type: ignore[attr-defined]  # like `| head -1` exiting
    err = await asyncio.wait_for(p.stderr.read(), 60)
    await p.wait()
    assert p.returncode == 141, err
    assert b"Traceback" not in err and b"never retrieved" not in err
    rc, out, _ = await tandem("queues", "--url", proc.url, "--json")
    (q,) = json.loads(out)
    assert q["unacked"] == 0 and 0 < q["ready"] < 2000  # what was not printed was not acked


async def test_a_spawned_node_runs_the_code_that_spawned_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``python -m`` puts the working directory first on ``sys.path``: started from a
    directory holding another ``broker`` package (another checkout, an unrelated project), a
    node would run that.  NodeProcess (tandem bench --spawn, cluster up, drills) starts the
    code of the process that starts it."""
    other = tmp_path / "elsewhere" / "broker"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("")
    (other / "cli.py").write_text("raise SystemExit('the wrong broker package ran')\n")
    monkeypatch.chdir(other.parent)
    p = NodeProcess(tmp_path / "node1")
    p.forked = False  # (a fresh interpreter, as the tools start one: the tests' fork server imported the code)
    await p.start()  # (NodeStartError, with the line above in its output, if the wrong one ran)
    await p.stop()


async def test_client_commands_log_warnings_only_unless_asked(proc: NodeProcess) -> None:
    rc, _, err = await tandem("produce", "q", "a", "--declare", "1", "--url", proc.url)
    assert rc == 0 and err == ""
    rc, _, err = await tandem("produce", "q", "b", "-v", "--url", proc.url)
    assert rc == 0 and "INFO" in err and "durable connection: connected" in err
    rc, _, err = await tandem("--log-level", "DEBUG", "status", "--url", proc.url)
    assert rc == 0 and "DEBUG" in err
