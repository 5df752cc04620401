"""Options every client command shares."""

from __future__ import annotations

import argparse
import os

DEFAULT_URL = "tandem://admin@127.0.0.1:7780"


def url_args(p: argparse.ArgumentParser) -> None:
    """``--url`` (or ``TANDEM_URL``) and ``--json``."""
    p.add_argument("--url", default=os.environ.get("TANDEM_URL", DEFAULT_URL),
                   help="broker URL, tandem://user:password@host:port (env TANDEM_URL; "
                        "the password may also come from TANDEM_PASSWORD)")
    p.add_argument("--json", action="store_true", help="machine-readable output, one JSON document")
