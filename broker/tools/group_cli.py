"""``tandem group add NAME=HOST:PEER_PORT`` / ``tandem group remove NAME``: change a running
group's members (:mod:`broker.partitions.members`)."""

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
from client.protocol.frames import StatusOk

Command = Coroutine[Any, Any, int]

POLL = 0.2  # seconds between two looks at the change (--wait)


def add_parser(sub: Any) -> None:
    """``group add`` and ``group remove`` under the ``tandem`` parser."""
    group = sub.add_parser("group", help="add a member to a running group, or remove one")
    gsub = group.add_subparsers(dest="group_command", required=True, metavar="ACTION")
    add = gsub.add_parser(
        "add", help="add member NAME, whose peer port is at HOST:PEER_PORT",
        description="Add NAME to the group: the group's state, on every member and across restarts. The "
                    "members link to NAME at HOST:PEER_PORT (start it with `tandem broker start --join` and --peer "
                    "options naming members of the group, before or after this command). The partitions then "
                    "re-spread: each one the distribution policy now places elsewhere moves there while it runs, "
                    "two at a time (new copies first, the active handed over once its successor has caught up). "
                    "Needs the admin permission.")
    add.add_argument("member", metavar="NAME=HOST:PEER_PORT")
    add.add_argument("--zone", default="", metavar="ZONE",
                     help="NAME's zone, in a group whose members have zones (needed there)")
    _wait_args(add, "every partition is where the policy places it over the new members")
    url_args(add)
    add.set_defaults(func=add_member)
    rm = gsub.add_parser(
        "remove", help="move every partition off member NAME, then take it out of the group",
        description="Remove NAME from the group: its actives move off it first (as for a drained node), every "
                    "partition it holds a copy of moves to the other members, and then it leaves the member list "
                    "and the others stop linking to it. Stop NAME once the change is done. Needs the admin "
                    "permission.")
    rm.add_argument("name", metavar="NAME")
    _wait_args(rm, "NAME holds nothing and has left the group")
    url_args(rm)
    rm.set_defaults(func=remove_member)


def _wait_args(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--wait", action="store_true", help=f"return once {what} (as the node --url points at sees it)")
    p.add_argument("--timeout", type=float, default=600.0, metavar="S",
                   help="with --wait: give up (exit status 1) after S seconds (default 600)")


def add_member(args: argparse.Namespace) -> Command:
    name, sep, address = args.member.partition("=")
    if not sep or not name or not address:
        raise InvalidArgumentError(f"group add: {args.member!r} is not NAME=HOST:PEER_PORT")
    _check_timeout(args)
    return _change(args, "add", name, address)


def remove_member(args: argparse.Namespace) -> Command:
    _check_timeout(args)
    return _change(args, "remove", args.name, "")


def _check_timeout(args: argparse.Namespace) -> None:
    if args.timeout <= 0:
        raise InvalidArgumentError(f"--timeout {args.timeout}: a number of seconds > 0")


async def _change(args: argparse.Namespace, action: str, name: str, address: str) -> int:
    clock = SYSTEM_CLOCK
    async with await client.connect_link(args.url, client_name="tandem-cli") as conn:
        started = clock.monotonic()
        if action == "add":
            st = await conn.add_member(name, address, args.zone)
        else:
            st = await conn.remove_member(name)
        if args.wait:
            try:
                async with clock.timeout(args.timeout):
                    while not _done(st, action, name):
                        await clock.sleep(POLL)
                        st = await conn.status()
            except TimeoutError:
                print(f"tandem: error: the group change ({action} {name}) is not done after {args.timeout:g} s: "
                      f"{st.group_change or 'waiting for the members to agree'}", file=sys.stderr)
                return 1
        took = clock.monotonic() - started
    verb = "added" if action == "add" else "removed"
    doc: dict[str, Any] = {"node": name, "action": action, "members": st.members,
                           "group_change": st.group_change or None}
    if args.wait:
        doc["seconds"] = round(took, 3)
        text = f"{name} {verb}: members {', '.join(st.members)} ({took:.2f} s, partitions re-spread)"
    else:
        text = (f"{name} {'added' if action == 'add' else 'leaving'}; {st.group_change or 'done'} "
                f"(tandem status shows the change until it is done)")
    print(json.dumps(doc) if args.json else text)
    return 0


def _done(st: StatusOk, action: str, name: str) -> bool:
    there = name in st.members
    return not st.group_change and not st.moving and (there if action == "add" else not there)
