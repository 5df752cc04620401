"""schemathesis against the admin REST API of a node process, with and without credentials.

With an admin login: no 500, and every response (status, content type, body) is what the
OpenAPI document says.  Without one: no 500, and every operation that is not public answers
401 or 403, whatever the request (tests/webconsole/schemathesis_checks.py).
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.tools.cluster import free_ports
from broker.tools.process import NodeProcess

PASSWORD = "schemathesis-password"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def console(tmp_path: Path) -> Iterator[str]:
    port = free_ports(1)[0]
    loop = asyncio.new_event_loop()
    proc = NodeProcess(tmp_path / "n", password=PASSWORD, extra_args=["--http-port", str(port)])
    loop.run_until_complete(proc.start())
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.run_until_complete(proc.stop())
        loop.close()


def _schemathesis(location: str, *args: str, env: dict[str, str] | None = None) -> tuple[int, int, str]:
    out = subprocess.run(
        [sys.executable, "-m", "schemathesis.cli", "run", location, "--seed", "1",
         "--workers", "1", "--request-timeout", "10", "--exclude-path-regex", "stream", *args],
        capture_output=True, text=True, timeout=240, cwd=ROOT, env={**os.environ, **(env or {})})
    m = re.search(r"(\d+) generated, (\d+) passed", out.stdout)
    generated, passed = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    assert out.returncode == 0 and generated == passed, out.stdout[-5000:] + out.stderr[-2000:]
    return generated, passed, out.stdout


@pytest.mark.integration
def test_logged_in_requests_get_no_server_error_and_match_the_schema(console: str) -> None:
    generated, _, _ = _schemathesis(
        f"{console}/api/v1/openapi.json", "--auth", f"admin:{PASSWORD}", "--max-examples", "12",
        "--checks", "not_a_server_error,response_schema_conformance,content_type_conformance")
    assert generated >= 100


@pytest.mark.integration
def test_requests_without_a_login_are_refused_everywhere_but_health(console: str, tmp_path: Path) -> None:
    # the document itself needs a login: fetched with one, then every request goes without
    req = urllib.request.Request(f"{console}/api/v1/openapi.json", headers={
        "Authorization": "Basic " + base64.b64encode(f"admin:{PASSWORD}".encode()).decode()})
    with urllib.request.urlopen(req, timeout=10) as r:
        (tmp_path / "openapi.json").write_bytes(r.read())
    generated, _, _ = _schemathesis(
        str(tmp_path / "openapi.json"), "--url", console, "--max-examples", "8", "--checks", "not_a_server_error,refused_without_login",
        env={"SCHEMATHESIS_HOOKS": "tests.webconsole.schemathesis_checks"})
    assert generated >= 50
