"""Log lines that text from outside cannot forge.

A user name, a client's name, a console form field or a name a peer claims is text an
attacker chooses; written into a log line as it is, a newline in it starts a line of the
attacker's making ("x\\n2026-01-01 00:00:00,000 WARNING tandem.broker ..."), and an escape
sequence can rewrite what a terminal shows.  Two defences:

* :func:`escape`, at the source: every such string goes into a log call through it.
  Control and other non-printable characters (C0, DEL, C1, the line and paragraph
  separators, bidirectional overrides, ...) become ``\\n``, ``\\x1b``, ``\\u2028``, as
  ``repr`` writes them; a backslash is doubled, so an escaped name cannot pass for another;
  printable text (any script) is kept.
* :class:`EscapingFormatter`, the backstop of a ``tandem`` process's log handler
  (``broker.cli.setup_logging``): whatever reaches a log line without :func:`escape` has its
  control characters escaped there (not its backslashes: a line may hold escaped text
  already).  A traceback is appended as it is, on lines of its own: it is the one thing
  logged on several lines on purpose, and Python writes it, not the client.
"""

from __future__ import annotations

import logging


def _escaped(c: str) -> str:
    return "\\\\" if c == "\\" else c.encode("unicode_escape").decode("ascii")


def escape(value: object) -> str:
    """``value`` as text fit for a log line: non-printable characters and the backslash
    escaped, as ``repr`` writes them (no quotes added)."""
    s = value if isinstance(value, str) else str(value)
    if s.isprintable() and "\\" not in s:
        return s
    return "".join(c if c.isprintable() and c != "\\" else _escaped(c) for c in s)


def escape_controls(s: str) -> str:
    """``s`` with its non-printable characters escaped (backslashes kept as they are)."""
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else _escaped(c) for c in s)


class EscapingFormatter(logging.Formatter):
    """A formatter whose lines are one line each: the formatted message (time, level, logger
    and message) has its control characters escaped; an exception's traceback and a stack are
    added after it unchanged (:meth:`logging.Formatter.format` appends them)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return escape_controls(super().formatMessage(record))
