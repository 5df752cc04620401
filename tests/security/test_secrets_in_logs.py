"""A node started without TANDEM_ADMIN_PASSWORD makes the first admin's password and keeps
it in ``<data_dir>/admin-password`` (mode 0600): its output (stdout and stderr, the log) says
where, never what, even at DEBUG and through logins that use it."""

from __future__ import annotations

import asyncio
import base64
import re
import signal
import stat
from pathlib import Path

import aiohttp
import pytest

import client
from broker.tools.cluster import free_ports
from broker.tools.process import node_command
from client.clock import SYSTEM_CLOCK

pytestmark = [pytest.mark.asyncio, pytest.mark.integration]

_URL = re.compile(r"client URL\s*:\s*tandem://[^@]*@([^:\s]+):(\d+)")


async def _collect(stream: asyncio.StreamReader, into: list[str], up: asyncio.Event) -> None:
    while line := await stream.readline():
        into.append(line.decode(errors="replace"))
        if _URL.search(into[-1]):
            up.set()


async def test_the_generated_admin_password_reaches_no_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TANDEM_ADMIN_PASSWORD")
    command, env = node_command()
    env.pop("TANDEM_ADMIN_PASSWORD", None)
    data_dir, http_port = tmp_path / "node1", free_ports(1)[0]
    proc = await asyncio.create_subprocess_exec(
        *command, "--log-level", "DEBUG", "broker", "start", "--name", "node1", "--data-dir", str(data_dir),
        "--port", "0", "--http-port", str(http_port), env={**env, "PYTHONUNBUFFERED": "1"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    out: list[str] = []
    err: list[str] = []
    up = asyncio.Event()
    readers = [asyncio.create_task(_collect(proc.stdout, out, up)), asyncio.create_task(_collect(proc.stderr, err, up))]
    try:
        started, exited = asyncio.ensure_future(up.wait()), asyncio.ensure_future(proc.wait())
        async with SYSTEM_CLOCK.timeout(60):
            await asyncio.wait([started, exited], return_when=asyncio.FIRST_COMPLETED)
        started.cancel()
        exited.cancel()
        assert up.is_set(), f"the node did not start: {''.join(out + err)}"
        m = next(m for line in out if (m := _URL.search(line)))
        pw_file = data_dir / "admin-password"
        password = pw_file.read_text().strip()
        assert len(password) >= 16
        assert stat.S_IMODE(pw_file.stat().st_mode) == 0o600
        # the password at work: a client login (SCRAM), the console's form and HTTP Basic
        async with await client.connect_link(f"tandem://admin:{password}@{m.group(1)}:{m.group(2)}") as link:
            assert await link.list_queues() == []
        http = f"http://127.0.0.1:{http_port}"
        basic = {"Authorization": "Basic " + base64.b64encode(f"admin:{password}".encode()).decode()}
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{http}/login", data={"user": "admin", "password": password}) as r:
                assert r.status == 200
            async with s.get(f"{http}/api/v1/session", headers=basic) as r:
                assert r.status == 200
            async with s.post(f"{http}/login", json={"user": "admin", "password": password + "-wrong"}) as r:
                assert r.status == 401
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        async with SYSTEM_CLOCK.timeout(60):
            await proc.wait()
            await asyncio.gather(*readers)
    stdout, stderr = "".join(out), "".join(err)
    assert "created user admin" in stderr and str(pw_file) in stderr  # the log says where it is
    assert "admin pass" in stdout and str(pw_file) in stdout
    for name, text in (("stdout", stdout), ("stderr", stderr)):
        assert password not in text, f"the admin password is in the node's {name}:\n{text}"
