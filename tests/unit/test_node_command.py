"""``tandem broker start`` (broker/cli.py): the lines a node prints once it is up (``banner``: one
string, written at once, whose client URL line is what broker.tools.process reads the node's
address from), and what its loop does with an error nobody retrieved (``_quiet_resets``)."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path
from typing import Any

from broker.cli import _quiet_resets, banner
from broker.config import NodeConfig
from broker.tools.process import _URL_LINE


def test_the_banner_names_the_url_the_process_tools_read(tmp_path: Path) -> None:
    (tmp_path / "admin-password").write_text("x")
    text = banner(NodeConfig(name="node7", data_dir=tmp_path), ("127.0.0.1", 22560), tmp_path,
                  "http://127.0.0.1:22562/")
    lines = text.splitlines()
    assert text.endswith("\n") and lines[0] == "Tandem node node7 is up"
    m = _URL_LINE.search(lines[1])
    assert m is not None and (m.group(1), m.group(2), int(m.group(3))) == ("tandem", "127.0.0.1", 22560)
    assert lines[2].startswith("  data       : ") and lines[3] == "  console    : http://127.0.0.1:22562/"
    assert lines[4] == f"  admin pass : {tmp_path / 'admin-password'}"
    assert lines[-1] == "  stop with Ctrl-C or SIGTERM"


def test_shared_mode_names_its_database_without_the_password(tmp_path: Path) -> None:
    cfg = NodeConfig(data_dir=tmp_path, mode="shared", database="postgresql+psycopg://u:secret@db:5432/tandem")
    text = banner(cfg, ("0.0.0.0", 7780), tmp_path, None)
    assert "  database   : " in text and "secret" not in text and "console" not in text


def test_a_reset_connection_s_error_nobody_retrieved_is_not_reported_and_a_bug_s_is() -> None:
    loop = asyncio.new_event_loop()
    reported: list[dict[str, Any]] = []
    loop.default_exception_handler = reported.append  # type: ignore[method-assign]
    loop.set_exception_handler(_quiet_resets)
    try:
        for exc in (ConnectionResetError(104, "Connection reset by peer"), BrokenPipeError(32, "Broken pipe"),
                    ValueError("a bug")):
            fut = loop.create_future()
            fut.set_exception(exc)
            del fut
            gc.collect()
    finally:
        loop.close()
    assert [type(c["exception"]) for c in reported] == [ValueError]
    assert reported[0]["message"] == "Future exception was never retrieved"
