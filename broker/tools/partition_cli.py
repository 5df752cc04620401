"""``tandem partition move QUEUE P --to NODES``: move a partition's copies to other group
members while it runs (:mod:`broker.moves`)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Coroutine
from typing import Any

import client
from broker.tools.options import ExamplesFormatter, url_args
from client.clock import SYSTEM_CLOCK
from client.errors import InvalidArgumentError
from client.protocol.frames import StatusOk

Command = Coroutine[Any, Any, int]

POLL = 0.1  # seconds between two looks at the move (--wait)


def add_parser(sub: Any) -> None:
    """``partition move`` under the ``tandem`` parser."""
    part = sub.add_parser("partition", help="move a queue's partition to other group members")
    psub = part.add_subparsers(dest="partition_command", required=True, metavar="ACTION")
    mv = psub.add_parser(
        "move", help="place partition P of QUEUE on other nodes, while producers and consumers run",
        formatter_class=ExamplesFormatter,
        description="Place partition P of QUEUE on the members NODES, in priority order (the first is its "
                    "active, the next sync_replicas are sync replicas, the rest async; name:sync or name:async "
                    "says it for a node): the group's state, on "
                    "every member and across restarts. The partition's active copies the log to each new node, "
                    "makes it a voter once it has caught up, hands the partition to the first node if that is "
                    "not itself, then removes the nodes the list leaves out, one at a time; those drop their "
                    "copy. Producers and consumers run on; its status shows Replicating while a new copy is "
                    "behind, then Migrating, then Active. Needs the admin permission.\n\n"
                    "examples:\n"
                    "  tandem partition move orders 0 --to node3,node1,node2\n"
                    "  tandem partition move orders 2 --to node2,node3 --wait --timeout 300\n"
                    "  tandem partition move orders 1 --to node1,node2,node4:async\n")
    mv.add_argument("queue", metavar="QUEUE", help="the queue")
    mv.add_argument("partition", metavar="P", type=int, help="the partition's number (0 .. partitions - 1)")
    mv.add_argument("--to", required=True, metavar="NODES",
                    help="comma-separated group members, the partition's new node list in priority order; "
                         "name:sync or name:async sets a node's kind (default: by position)")
    mv.add_argument("--wait", action="store_true", help="return once the move is done (every copy in place)")
    mv.add_argument("--timeout", type=float, default=300.0, metavar="S",
                    help="with --wait: give up (exit status 1) after S seconds (default 300; the move goes on)")
    url_args(mv)
    mv.set_defaults(func=move)


def move(args: argparse.Namespace) -> Command:
    if args.timeout <= 0:
        raise InvalidArgumentError(f"--timeout {args.timeout}: a number of seconds > 0")
    if args.partition < 0:
        raise InvalidArgumentError(f"P {args.partition}: a partition number >= 0")
    nodes = [n.strip() for n in args.to.split(",")]
    if not all(nodes):
        raise InvalidArgumentError(f"--to {args.to!r}: comma-separated node names")
    return _move(args, nodes)


def under_way(st: StatusOk, label: str) -> bool:
    return any(m.split(" ", 1)[0] == label for m in st.moving)


async def _move(args: argparse.Namespace, nodes: list[str]) -> int:
    clock = SYSTEM_CLOCK
    label = f"{args.queue}/{args.partition}"
    async with await client.connect_link(args.url, client_name="tandem-cli") as conn:
        started = clock.monotonic()
        st = await conn.move_partition(args.queue, args.partition, nodes)
        if args.wait:
            try:
                async with clock.timeout(args.timeout):
                    while under_way(st, label):
                        await clock.sleep(POLL)
                        st = await conn.status()
            except TimeoutError:
                print(f"tandem: error: partition {label} is still moving to {','.join(nodes)} after "
                      f"{args.timeout:g} s (the move goes on; see tandem status)", file=sys.stderr)
                return 1
    took = clock.monotonic() - started
    done = not under_way(st, label)
    doc = {"queue": args.queue, "partition": args.partition, "nodes": nodes, "done": done}
    if done:
        doc["seconds"] = round(took, 3)
        text = f"partition {label} moved to {','.join(nodes)} in {took:.2f} s"
    else:
        text = (f"partition {label} is moving to {','.join(nodes)} (tandem status shows it under way; "
                f"--wait waits for the end)")
    print(json.dumps(doc) if args.json else text)
    return 0
