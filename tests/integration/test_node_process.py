"""NodeProcess, the handle the CLI's `cluster up` and the tests start nodes with."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path
from typing import Any

import pytest

from broker.tools.process import NodeProcess
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
