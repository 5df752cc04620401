"""NodeProcess, the handle the CLI's `cluster up` and the tests start nodes with."""

from __future__ import annotations

import asyncio
import gc
import os
from pathlib import Path
from typing import Any

import pytest

from broker.tools.process import NodeProcess, NodeStartError
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

