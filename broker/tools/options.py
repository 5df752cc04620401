"""Options every client command shares, and the help layout of the tools with examples."""

from __future__ import annotations

import argparse
import os

DEFAULT_URL = "tandem://admin@127.0.0.1:7780"


def url_args(p: argparse.ArgumentParser) -> None:
    """``--url`` (or ``TANDEM_URL``) and ``--json``."""
    p.add_argument("--url", default=os.environ.get("TANDEM_URL", DEFAULT_URL),
                   help="broker URL, tandem://user:password@host:port, or tandems://...?ca=CA.pem for TLS "
                        "(env TANDEM_URL; the password may also come from TANDEM_PASSWORD)")
    p.add_argument("--json", action="store_true", help="machine-readable output, one JSON document")


class ExamplesFormatter(argparse.HelpFormatter):
    """Wraps the description as usual and keeps an ``examples:`` block line by line."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        head, sep, tail = text.partition("examples:\n")
        if not sep:
            return super()._fill_text(text, width, indent)
        filled = super()._fill_text(head, width, indent) + "\n\n" if head.strip() else ""
        return filled + sep + tail
