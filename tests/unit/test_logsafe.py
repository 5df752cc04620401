"""broker.logsafe: text from outside cannot start a log line of its own."""

from __future__ import annotations

import io
import logging
import sys

import pytest

from broker.logsafe import EscapingFormatter, escape, escape_controls

FORGED = "x\n2026-01-01 00:00:00,000 WARNING tandem.broker forged"


@pytest.mark.parametrize(("raw", "shown"), [
    ("alice", "alice"),
    ("élodie 山田 ✓", "élodie 山田 ✓"),  # printable text of any script stays as it is
    ("a b", "a b"),
    (FORGED, "x\\n2026-01-01 00:00:00,000 WARNING tandem.broker forged"),
    ("a\rb\tc", "a\\rb\\tc"),
    ("\x1b[2J\x1b[31mred", "\\x1b[2J\\x1b[31mred"),  # terminal escape sequences
    ("\x00\x7f\x85\x9b", "\\x00\\x7f\\x85\\x9b"),  # NUL, DEL, C1 (NEL, CSI)
    ("a\u2028b\u2029c", "a\\u2028b\\u2029c"),  # line and paragraph separators
    ("\u202egnp.exe", "\\u202egnp.exe"),  # a bidirectional override
    ("a\\nb", "a\\\\nb"),  # a backslash is doubled: "\\n" typed is not a newline shown
    ("\udc80", "\\udc80"),  # a lone surrogate (surrogateescape'd bytes)
])
def test_escape(raw: str, shown: str) -> None:
    assert escape(raw) == shown
    assert shown.isprintable()


def test_escape_takes_any_value_and_matches_repr_inside_the_quotes() -> None:
    assert escape(42) == "42" and escape(None) == "None"
    for raw in (FORGED, "\x1b\x00\u2028", "tab\there"):
        assert escape(raw) == repr(raw)[1:-1]


def test_escape_controls_keeps_backslashes() -> None:
    assert escape_controls("user=a\\nb") == "user=a\\nb"  # escaped once already: left alone
    assert escape_controls("a\nb\x1b") == "a\\nb\\x1b"


def _logger(stream: io.StringIO) -> logging.Logger:
    handler = logging.StreamHandler(stream)
    handler.setFormatter(EscapingFormatter("%(levelname)s %(name)s %(message)s"))
    logger = logging.getLogger("tandem.test.logsafe")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    return logger


def test_the_formatter_keeps_every_record_on_one_line() -> None:
    out = io.StringIO()
    log = _logger(out)
    log.warning("authentication failed user=%s reason=%s", FORGED, "wrong\r\npassword")
    log.info("plain %s", "line")
    lines = out.getvalue().splitlines()
    assert lines == [
        "WARNING tandem.test.logsafe authentication failed user=x\\n2026-01-01 00:00:00,000 WARNING "
        "tandem.broker forged reason=wrong\\r\\npassword",
        "INFO tandem.test.logsafe plain line",
    ]


def test_the_formatter_leaves_a_traceback_on_its_own_lines() -> None:
    out = io.StringIO()
    log = _logger(out)
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("handling %s failed", "a\nb")
    lines = out.getvalue().splitlines()
    assert lines[0] == "ERROR tandem.test.logsafe handling a\\nb failed"
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[-1] == "ValueError: boom"
    assert any(line.startswith("  File ") for line in lines)


def test_a_tandem_process_logs_through_the_escaping_formatter(monkeypatch: pytest.MonkeyPatch) -> None:
    from broker import cli

    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", root.level)
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    cli.setup_logging("INFO")
    assert len(root.handlers) == 1
    assert isinstance(root.handlers[0].formatter, EscapingFormatter)
    logging.getLogger("tandem.broker").warning("user=%s", FORGED)
    text = stderr.getvalue()
    assert len(text.splitlines()) == 1 and "user=x\\n2026-01-01" in text
