"""``tandem secret new PATH``: make a group secret file (:mod:`broker.security.secret`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from broker.security.secret import SECRET_BYTES, new_secret

DESCRIPTION = f"""\
Write a fresh random group secret ({SECRET_BYTES} random bytes as hex text) to PATH, readable by
its owner only (mode 0600).

Every member of a replication group, and its witness, reads the same secret
(--cluster-secret-file PATH, or cluster_secret_file in TOML) and proves it on each peer link
before the link is accepted; the secret itself never crosses the network. Copy the file to
each machine of the group by a channel you trust (scp, your configuration management), keep
it out of backups and repositories anyone else reads, and keep its mode 0600.

An existing file is never replaced unless --force is given: a new secret locks out every
member still holding the old one, until each is restarted with the new file.
"""


def add_parser(sub: Any) -> None:
    """``secret new`` under the ``tandem`` parser."""
    s = sub.add_parser("secret", help="make a group secret file (peer authentication)", description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    ssub = s.add_subparsers(dest="secret_command", required=True, metavar="ACTION")
    new = ssub.add_parser("new", help="write a fresh random group secret to a file (mode 0600)",
                          description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
                          epilog="examples:\n  tandem secret new /etc/tandem/cluster.secret\n"
                                 "  tandem broker start --config node1.toml --cluster-secret-file "
                                 "/etc/tandem/cluster.secret")
    new.add_argument("path", metavar="PATH", help="the file to write (its directory must exist)")
    new.add_argument("--force", action="store_true", help="replace the file if it exists")
    new.set_defaults(func=_new)


def _new(args: argparse.Namespace) -> int:
    path = Path(args.path)
    new_secret(path, force=args.force)
    print(f"wrote a new group secret to {path} (mode 0600): give every member and the witness a copy "
          f"(--cluster-secret-file {path})")
    return 0
