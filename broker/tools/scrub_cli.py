"""``tandem scrub --data-dir DIR``: read every record of a node's files and check it, changing
nothing (storage.segfiles.scan, storage.sqlite.scrub)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

DESCRIPTION = """\
Read every record of a node's data directory and check it, changing nothing: each record of the
replication log's segments (tandem.db-log/*.seg: its length and CRC-32), SQLite's page structure
of the store (tandem.db: PRAGMA quick_check), each stored chunk of messages against its CRC-32, and
each row of settlements, delivery counts, producer positions, queues, users, grants and each
partition's hard state, snapshot mark and applied position against its own. The node may be
running (the store is opened read-only). A witness's data directory (witness.db): each log's
term, vote, commit index and snapshot mark, and each entry position, against its checksum.

Prints each damaged record and torn tail, one line each, and exits 1 if anything is damaged (0 if
not). A torn tail (the end of the newest segment a crash cut short, or what came after its last
fdatasync with a hole in it, which a power cut after writes the disk reordered leaves) is not
damage: the node cuts it off at its next start. A member of a group repairs damaged records from
the group at its next start (a damaged log: none of it used, each partition caught up from its
active; a damaged chunk or row of a partition's copy: that partition rebuilt from its active); a
node with no group, a partition with no other voter, a damaged queue, user or grant, or a damaged
term and vote, does not start until the data directory is restored (docs/reliability.md, "Storage
faults"). A witness with a damaged row does not start: replace it on an empty data directory
(docs/witness.md).
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("scrub", help="check every record of a node's files against its checksum (read-only)",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  tandem scrub --data-dir .tandem/node2\n"
                              "  tandem scrub --data-dir /var/lib/tandem --json")
    p.add_argument("--data-dir", dest="data_dir", required=True, metavar="DIR", help="the node's data directory")
    p.add_argument("--json", action="store_true", help="one JSON object: counts and findings")
    p.set_defaults(func=_scrub)


def _scrub(args: argparse.Namespace) -> int:
    # (imported here: the store's SQL toolkit costs every other command's start ~0.15 s)
    from storage.segfiles import scan
    from storage.sqlite.scrub import scrub_store

    d = Path(args.data_dir)
    db, log_dir = d / "tandem.db", d / "tandem.db-log"
    if not db.is_file() and (d / "witness.db").is_file():
        return _scrub_witness(d / "witness.db", args.json)
    if not db.is_file():
        print(f"tandem scrub: {db} not found: is {d} a node's data directory?")
        return 2
    records, log_damage, torn = scan(log_dir) if log_dir.is_dir() else (0, [], [])
    store = scrub_store(db)
    damage = log_damage + store.damage
    if args.json:
        print(json.dumps({"log_records": records, "torn_tails": torn, "chunks": store.chunks, "rows": store.rows,
                          "without_checksum": store.unchecked, "damage": damage}))
    else:
        for line in damage:
            print(f"DAMAGED  {line}")
        for line in torn:
            print(f"torn     {line} (cut off at the node's next start)")
        print(f"{records} log record(s), {store.chunks} chunk(s) and {store.rows} other row(s) passed their checks"
              + (f", {store.unchecked} chunk(s) or row(s) written without a checksum (not checked)"
                 if store.unchecked else "")
              + (f"; {len(damage)} damaged" if damage else "; nothing damaged"))
    return 1 if damage else 0


def _scrub_witness(path: Path, as_json: bool) -> int:
    from broker.arbiters.witness import scrub

    passed, unchecked, damage = scrub(path)
    if as_json:
        print(json.dumps({"witness_rows": passed, "without_checksum": unchecked, "damage": damage}))
    else:
        for line in damage:
            print(f"DAMAGED  {line}")
        print(f"{passed} row(s) of the witness's store passed their checks"
              + (f", {unchecked} written without a checksum (not checked)" if unchecked else "")
              + (f"; {len(damage)} damaged" if damage else "; nothing damaged"))
    return 1 if damage else 0
