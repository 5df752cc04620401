"""``tandem partition move QUEUE P --to NODES``: move a partition's copies to other group
members while it runs (:mod:`broker.partitions.moves`)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Coroutine
from typing import Any

import client
from broker.tools.options import ExamplesFormatter, url_args
from client.clock import SYSTEM_CLOCK
from client.errors import InvalidArgumentError, UnavailableError
from client.protocol.frames import StatusOk

Command = Coroutine[Any, Any, int]

log = logging.getLogger("tandem.cli")

POLL = 0.1  # seconds between two looks at the move (--wait)
#: seconds a command looks for the outcome of a request whose answer was lost (UNAVAILABLE: the
#: member asked lost its link to the member doing the change, which may have made it or not)
SETTLE = 10.0


def add_parser(sub: Any) -> None:
    """``partition move`` under the ``tandem`` parser."""
    part = sub.add_parser("partition", help="move a queue's partition, add partitions to a queue, re-map its "
                                            "messages")
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
                    "  tandem partition move orders 1 --to node1,node2,node4:async\n"
                    "  tandem partition move orders 0 --to node1,node2,node3 --force-replication --wait\n")
    mv.add_argument("queue", metavar="QUEUE", help="the queue")
    mv.add_argument("partition", metavar="P", type=int, help="the partition's number (0 .. partitions - 1)")
    mv.add_argument("--to", required=True, metavar="NODES",
                    help="comma-separated group members, the partition's new node list in priority order; "
                         "name:sync or name:async sets a node's kind (default: by position)")
    mv.add_argument("--force-replication", dest="force_replication", action="store_true",
                    help="then copy every replica of the list afresh from the active, one at a time: each leaves "
                         "the list, dropping its copy, and comes back to get a new one (also where the partition "
                         "is on NODES already: a replica whose store you doubt)")
    mv.add_argument("--wait", action="store_true", help="return once the move is done (every copy in place)")
    mv.add_argument("--timeout", type=float, default=300.0, metavar="S",
                    help="with --wait: give up (exit status 1) after S seconds (default 300; the move goes on)")
    url_args(mv)
    mv.set_defaults(func=move)

    add = psub.add_parser(
        "add", help="give QUEUE more partitions, while producers and consumers run",
        formatter_class=ExamplesFormatter,
        description="Give QUEUE COUNT partitions more: every member opens them (placed by the group's policy, "
                    "or on --placement's lists for a queue declared with lists), and clients map what they send "
                    "from then on over every partition. Nothing already stored moves: tandem partition update "
                    "does that. Needs the admin permission.\n\n"
                    "examples:\n"
                    "  tandem partition add orders 2\n"
                    "  tandem partition add fixed 1 --placement node3,node1\n")
    add.add_argument("queue", metavar="QUEUE", help="the queue")
    add.add_argument("count", metavar="COUNT", type=int, help="how many partitions to add (1 or more)")
    add.add_argument("--placement", default="", metavar="LISTS",
                     help="the new partitions' node lists, as a declare's (';' between lists), for a queue "
                          "declared with lists")
    url_args(add)
    add.set_defaults(func=add_partitions)

    up = psub.add_parser(
        "update", help="re-map every message of QUEUE by its data mapper (after adding partitions, or with "
                       "another mapper)",
        formatter_class=ExamplesFormatter,
        description="Re-map every message of QUEUE by calling its data mapper again (--mapper installs another "
                    "first). First every member must agree on the queue's partitions, mapper and node lists "
                    "(an audit). Then each partition's active, in state Updating, stops delivering that "
                    "partition, takes back its unacknowledged deliveries, and moves every ready message whose "
                    "key now maps elsewhere to that partition, in offset order; the message keeps its id. "
                    "Producers go on; a key whose partition changed may see messages sent before the update "
                    "delivered after ones sent during it. Needs the admin permission.\n\n"
                    "examples:\n"
                    "  tandem partition update orders --wait\n"
                    "  tandem partition update orders --mapper consistent_hash --wait --timeout 600\n")
    up.add_argument("queue", metavar="QUEUE", help="the queue")
    up.add_argument("--mapper", default="", metavar="NAME",
                    help="install this data mapper first (jump_hash, consistent_hash or an installed custom one)")
    up.add_argument("--wait", action="store_true", help="return once every partition is re-mapped")
    up.add_argument("--timeout", type=float, default=300.0, metavar="S",
                    help="with --wait: give up (exit status 1) after S seconds (default 300; the update goes on)")
    url_args(up)
    up.set_defaults(func=update_partitions)


def move(args: argparse.Namespace) -> Command:
    if args.timeout <= 0:
        raise InvalidArgumentError(f"--timeout {args.timeout}: a number of seconds > 0")
    if args.partition < 0:
        raise InvalidArgumentError(f"P {args.partition}: a partition number >= 0")
    nodes = [n.strip() for n in args.to.split(",")]
    if not all(nodes):
        raise InvalidArgumentError(f"--to {args.to!r}: comma-separated node names")
    return _move(args, nodes)


async def _until(conn: client.Connection, st: StatusOk, done: Callable[[StatusOk], bool],
                 timeout: float) -> StatusOk | None:
    """The node's status once ``done`` says so (None after ``timeout`` seconds)."""
    try:
        async with SYSTEM_CLOCK.timeout(timeout):
            while not done(st):
                await SYSTEM_CLOCK.sleep(POLL)
                st = await conn.status()
    except TimeoutError:
        return None
    return st


def under_way(st: StatusOk, label: str) -> bool:
    return any(m.split(" ", 1)[0] == label for m in st.moving)


async def _move(args: argparse.Namespace, nodes: list[str]) -> int:
    clock = SYSTEM_CLOCK
    label = f"{args.queue}/{args.partition}"
    async with await client.connect_link(args.url, client_name="tandem-cli") as conn:
        started = clock.monotonic()
        st = await conn.move_partition(args.queue, args.partition, nodes, force_replication=args.force_replication)
        if args.wait:
            got = await _until(conn, st, lambda s: not under_way(s, label), args.timeout)
            if got is None:
                print(f"tandem: error: partition {label} is still moving to {','.join(nodes)} after "
                      f"{args.timeout:g} s (the move goes on; see tandem status)", file=sys.stderr)
                return 1
            st = got
    took = clock.monotonic() - started
    done = not under_way(st, label)
    doc = {"queue": args.queue, "partition": args.partition, "nodes": nodes, "done": done}
    if done:
        doc["seconds"] = round(took, 3)
        text = f"partition {label} moved to {','.join(nodes)} in {took:.2f} s" + (
            ", every replica copied afresh" if args.force_replication else "")
    else:
        text = (f"partition {label} is moving to {','.join(nodes)} (tandem status shows it under way; "
                f"--wait waits for the end)")
    print(json.dumps(doc) if args.json else text)
    return 0


def add_partitions(args: argparse.Namespace) -> Command:
    if args.count < 1:
        raise InvalidArgumentError(f"COUNT {args.count}: add one partition at least")
    return _add(args)


async def _partitions(conn: client.Connection, queue: str) -> int | None:
    return next((q.partitions for q in await conn.list_queues() if q.name == queue), None)


async def _add(args: argparse.Namespace) -> int:
    async with await client.connect_link(args.url, client_name="tandem-cli") as conn:
        before = await _partitions(conn, args.queue)
        try:
            await conn.add_partitions(args.queue, args.count, placement=args.placement or None)
        except UnavailableError as e:
            # Not asked again: had the change been made after all, a second one would add as many
            # again.  Its outcome shows in the queue's partition count within moments, or never.
            if before is None or not await _settled(lambda: _count_is(conn, args.queue, before + args.count)):
                raise UnavailableError(f"{e.message}: the partitions may or may not have been added (tandem "
                                       f"queues shows the count; ask again if it is still {before})") from None
        total = await _partitions(conn, args.queue)
    print(json.dumps({"queue": args.queue, "added": args.count, "partitions": total}) if args.json else
          f"queue {args.queue} now has {total} partitions (tandem partition update {args.queue} re-maps what it "
          f"holds)")
    return 0


def update_partitions(args: argparse.Namespace) -> Command:
    if args.timeout <= 0:
        raise InvalidArgumentError(f"--timeout {args.timeout}: a number of seconds > 0")
    return _update(args)


def updating(st: StatusOk, queue: str) -> bool:
    return any(u.split(" ", 1)[0] == queue for u in st.updating)


async def _count_is(conn: client.Connection, queue: str, total: int) -> bool:
    return await _partitions(conn, queue) == total


async def _settled(made: Callable[[], Coroutine[Any, Any, bool]]) -> bool:
    """Whether ``made`` says so within SETTLE seconds."""
    try:
        async with SYSTEM_CLOCK.timeout(SETTLE):
            while not await made():
                await SYSTEM_CLOCK.sleep(POLL)
    except TimeoutError:
        return False
    return True


async def _start_update(conn: client.Connection, queue: str, mapper: str) -> StatusOk:
    """Start the update; asked again (it may be) while the answer is lost, for up to SETTLE
    seconds: an update under way is the outcome wanted, whoever started it."""
    deadline = SYSTEM_CLOCK.monotonic() + SETTLE
    lost: UnavailableError | None = None
    while True:
        try:
            return await conn.update_partitions(queue, mapper=mapper)
        except UnavailableError as e:
            lost = e
            log.info("partition update %s: %s: looking whether it started, else asking again", queue, e.message)
        except InvalidArgumentError as e:
            if lost is None or "is being updated" not in e.message:
                raise
        st = await conn.status()
        if updating(st, queue):
            return st  # (the lost request made it)
        if SYSTEM_CLOCK.monotonic() >= deadline:
            raise lost
        await SYSTEM_CLOCK.sleep(POLL * 5)


async def _update(args: argparse.Namespace) -> int:
    clock = SYSTEM_CLOCK
    async with await client.connect_link(args.url, client_name="tandem-cli") as conn:
        started = clock.monotonic()
        st = await _start_update(conn, args.queue, args.mapper)
        if args.wait:
            got = await _until(conn, st, lambda s: not updating(s, args.queue), args.timeout)
            if got is None:
                print(f"tandem: error: queue {args.queue} is still being updated after {args.timeout:g} s (the "
                      f"update goes on; see tandem status)", file=sys.stderr)
                return 1
            st = got
    took = clock.monotonic() - started
    done = not updating(st, args.queue)
    doc: dict[str, Any] = {"queue": args.queue, "done": done}
    if done:
        doc["seconds"] = round(took, 3)
        text = f"queue {args.queue} updated in {took:.2f} s: every message is where its mapper places it"
    else:
        text = (f"queue {args.queue} is being updated (tandem status shows it under way; --wait waits for the "
                f"end)")
    print(json.dumps(doc) if args.json else text)
    return 0
