"""``tandem node drain NAME`` / ``tandem node undrain NAME``: take a member out of service
for maintenance and back (:mod:`broker.partitions.drain`)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Coroutine
from typing import Any

import client
from broker.tools.options import url_args
from client.clock import SYSTEM_CLOCK
from client.errors import InvalidArgumentError
from client.protocol.frames import PartitionInfo, StatusOk

Command = Coroutine[Any, Any, int]

POLL = 0.1  # seconds between two looks at where the actives are (--wait)


def add_parser(sub: Any) -> None:
    """``node drain`` and ``node undrain`` under the ``tandem`` parser."""
    node = sub.add_parser("node", help="drain a group member for maintenance, or undrain it")
    nsub = node.add_subparsers(dest="node_command", required=True, metavar="ACTION")
    dr = nsub.add_parser("drain", help="move every active off node NAME (it stays a replica and a voter)",
                         description="Drain group member NAME for maintenance: the group's state, on every "
                                     "member and across restarts. Each partition (and the catalogue) active on "
                                     "NAME is handed to another member once that member is caught up; durable "
                                     "clients resend what was refused on the way. NAME keeps its copies and its "
                                     "vote, and is elected only where no other member with the data can be. "
                                     "Needs the admin permission.")
    dr.add_argument("name", metavar="NAME")
    dr.add_argument("--wait", action="store_true",
                    help="return once NAME is active for no partition (as the node --url points at sees them)")
    dr.add_argument("--timeout", type=float, default=120.0, metavar="S",
                    help="with --wait: give up (exit status 1) after S seconds (default 120)")
    url_args(dr)
    dr.set_defaults(func=drain)
    un = nsub.add_parser("undrain", help="let node NAME be active again",
                         description="Undrain group member NAME: it is a partition's preferred node again where "
                                     "the placement puts it first, and failback hands those partitions back "
                                     "once it is caught up (after failback_after; never if that is 0). Needs the "
                                     "admin permission.")
    un.add_argument("name", metavar="NAME")
    url_args(un)
    un.set_defaults(func=undrain)


def drain(args: argparse.Namespace) -> Command:
    if args.timeout <= 0:
        raise InvalidArgumentError(f"--timeout {args.timeout}: a number of seconds > 0")
    return _drain(args)


def undrain(args: argparse.Namespace) -> Command:
    return _undrain(args)


def actives_on(st: StatusOk, name: str) -> list[str]:
    """The partitions ``st``'s node sees active on ``name`` ("queue/partition", the
    catalogue as "(catalogue)")."""
    return [_label(p) for p in st.partitions if p.active == name]


def _label(p: PartitionInfo) -> str:
    return f"{p.queue}/{p.partition}" if p.queue else "(catalogue)"


async def _drain(args: argparse.Namespace) -> int:
    clock = SYSTEM_CLOCK
    async with await client.connect_link(args.url, client_name="tandem-cli") as conn:
        held = actives_on(await conn.status(), args.name)  # (before: the first may move within milliseconds)
        started = clock.monotonic()
        st = await conn.drain_node(args.name, True)
        if not args.wait:
            left = actives_on(st, args.name)
            _report(args, st, {"node": args.name, "drained": True, "actives": len(left)},
                    f"node {args.name} drained; it is active for {len(left)} partition(s) (as {st.node} sees "
                    f"them), which move once another member is caught up")
            return 0
        left = held
        try:
            async with clock.timeout(args.timeout):
                while True:
                    st = await conn.status()
                    left = actives_on(st, args.name)
                    if not left and not [p for p in st.partitions if not p.active and _label(p) in held]:
                        break  # (and each partition it held has a new active)
                    await clock.sleep(POLL)
        except TimeoutError:
            print(f"tandem: error: node {args.name} is drained but still active for {len(left)} partition(s) after "
                  f"{args.timeout:g} s: {', '.join(left[:10])}", file=sys.stderr)
            return 1
        took = clock.monotonic() - started
    _report(args, st, {"node": args.name, "drained": True, "actives": 0, "moved": len(held),
                       "seconds": round(took, 3)},
            f"node {args.name} drained: {len(held)} partition(s) moved off it in {took:.2f} s")
    return 0


async def _undrain(args: argparse.Namespace) -> int:
    async with await client.connect_link(args.url, client_name="tandem-cli") as conn:
        st = await conn.drain_node(args.name, False)
    _report(args, st, {"node": args.name, "drained": False},
            f"node {args.name} undrained; failback hands back the partitions it is placed first for once it is "
            f"caught up")
    return 0


def _report(args: argparse.Namespace, st: StatusOk, doc: dict[str, Any], text: str) -> None:
    print(json.dumps({**doc, "group_drained": st.drained}) if args.json else text)
