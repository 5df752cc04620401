"""NodeProcess, the handle the CLI's `cluster up` and the tests start nodes with."""

from __future__ import annotations

import asyncio
import gc
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from broker.tools.forked import run_forked
from broker.tools.process import CODE_ROOT, NodeProcess, NodeStartError
from tests.conftest import PASSWORD
from tests.helpers import wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.integration]


async def test_a_start_given_up_on_leaves_no_unretrieved_error_when_the_process_ends(tmp_path: Path) -> None:
    """`cluster up` stopped (Ctrl-C) while it starts a node again: the start is cancelled, the
    process killed; its end must not surface as "Future exception was never retrieved"."""
    errors: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: errors.append(ctx))
    p = NodeProcess(tmp_path / "node1", name="node1", port=0, sync="SYNC", password=PASSWORD, host="127.0.0.1")
    p.extra_args = ["--http-port", "0", "--peer-port", "0"]
    start = asyncio.create_task(p.start())
    await wait_until(lambda: p.proc is not None, what="the process spawned")
    start.cancel()
    with pytest.raises(asyncio.CancelledError):
        await start
    await p.kill()
    await p.wait()
    gc.collect()  # (an unretrieved exception is reported when its future is collected)
    assert [c.get("message") for c in errors] == []


@pytest.mark.parametrize("forked", [True, False], ids=["forked", "fresh-interpreter"])
async def test_a_node_process_is_its_own_process_either_way(tmp_path: Path, forked: bool) -> None:
    """Forked from the tests' fork server (broker/tools/forked.py) or started in a fresh
    interpreter: a process of its own (not this one, not the fork server), with its own
    output, frozen by SIGSTOP and thawed by SIGCONT, its exit status ``-9`` after ``kill -9``
    and ``0`` after a clean stop; a start refused for bad settings exits 2 with its one line."""
    p = NodeProcess(tmp_path / "node1", password=PASSWORD)
    p.forked = forked
    await p.start()
    parent = int(next(ln.split()[1] for ln in Path(f"/proc/{p.pid}/status").read_text().splitlines()
                      if ln.startswith("PPid:")))
    assert p.pid != os.getpid() and (parent != os.getpid()) == forked  # (a fork's parent is the fork server)
    state = Path(f"/proc/{p.pid}/stat")
    p.pause()
    await wait_until(lambda: state.read_text().split(")")[1].split()[0] == "T", what="the node stopped (SIGSTOP)")
    p.resume()
    await wait_until(lambda: state.read_text().split(")")[1].split()[0] != "T", what="the node running again")
    assert "client URL" in p.log_text()
    assert await p.stop() == 0
    await p.start()
    await p.kill()
    assert p.proc is not None and p.proc.returncode == -9
    bad = NodeProcess(tmp_path / "bad", password=PASSWORD, extra_args=["--sync", "SOMETIMES"])
    bad.forked = forked
    with pytest.raises(NodeStartError, match="exited with status 2"):
        await bad.start()
    assert "tandem: error:" in bad.log_text() or "invalid choice" in bad.log_text(), bad.log_text()



async def test_a_forked_cli_run_says_what_a_fresh_interpreter_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests' CLI runs (tests/helpers.tandem) fork from the fork server: the exit status,
    the output and the errors, each on its own stream, and the working directory are those of
    ``python -m broker.cli`` in a fresh interpreter; a run given up on is killed."""
    monkeypatch.chdir(tmp_path)
    env = {**os.environ, "TANDEM_URL": "tandem://admin:nope@127.0.0.1:1"}
    runs = [["secret", "new", "here.secret"], ["queues", "--json"], ["--help"], ["no-such-command"]]
    for argv in runs:
        fresh = await asyncio.create_subprocess_exec(
            sys.executable, "-P", "-m", "broker.cli", *argv, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env={**env, "PYTHONPATH": CODE_ROOT})
        out, err = await fresh.communicate()
        made = tmp_path / "here.secret"
        assert made.exists() == (argv[0] == "secret")
        made.unlink(missing_ok=True)
        assert await run_forked(argv, env) == (fresh.returncode, out, err), argv
        assert made.exists() == (argv[0] == "secret")
        made.unlink(missing_ok=True)
    # a node that accepts and never answers: the command waits on it until it is given up on
    connected: asyncio.Queue[asyncio.StreamReader] = asyncio.Queue()
    silent = await asyncio.start_server(lambda r, _w: connected.put_nowait(r), "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    run = asyncio.create_task(run_forked(["consume", "q", "--url", f"tandem://admin:x@127.0.0.1:{port}"], env))
    reader = await asyncio.wait_for(connected.get(), 30)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    await asyncio.wait_for(reader.read(), 30)
    assert reader.at_eof()  # (its end of the connection closed: killed)
    silent.close()
