"""``tandem upgrade status`` / ``tandem upgrade finalize``: the builds of a group's members and
its feature level, and the raise of that level once every member supports it (ha.upgrade,
broker.partitions.upgrade; docs/upgrades.md)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Coroutine
from typing import Any

import client
from broker.sessions.upgrade import report
from broker.tools.options import url_args
from client.errors import InvalidArgumentError, UnsupportedProtocolError

Command = Coroutine[Any, Any, int]


def add_parser(sub: Any) -> None:
    """``upgrade status`` and ``upgrade finalize`` under the ``tandem`` parser."""
    up = sub.add_parser("upgrade", help="a rolling upgrade: the members' builds, the group's feature level",
                        description="A group is upgraded one member at a time, each stopped and started on the "
                                    "new build with its data dir; it serves throughout. The group's feature level "
                                    "names what it may write: it stays where it is until `tandem upgrade finalize`, "
                                    "so until then any member can go back to the previous build. See "
                                    "docs/upgrades.md.")
    usub = up.add_subparsers(dest="upgrade_command", required=True, metavar="ACTION")
    st = usub.add_parser("status", help="each member's build, the protocol versions and feature levels it "
                                        "supports, and the group's level",
                         description="Each member's build as it said on its latest link to the node --url points "
                                     "at: its version, the protocol versions and feature levels it supports, the "
                                     "group's level as it applied it, and whether it is linked now; and whether "
                                     "the group can be finalized at the highest level that node's build knows. "
                                     "A first-release build (0.1.x) says nothing of itself: it shows as protocol "
                                     "1, level 1.")
    url_args(st)
    st.set_defaults(func=status)
    fin = usub.add_parser("finalize", help="raise the group's feature level once every member supports it",
                          description="Raise the group's feature level (default: the highest the build of the "
                                      "node --url points at supports). Refused, naming them, while a member's "
                                      "build does not support it or a member is not linked. After it a member "
                                      "cannot go back to a build older than the level: finalize once every "
                                      "member runs the new build and you do not mean to roll back. Needs the "
                                      "admin permission.")
    fin.add_argument("--level", type=int, default=0, metavar="N",
                     help="the feature level to raise the group to (default: the highest the node's build knows)")
    url_args(fin)
    fin.set_defaults(func=finalize)


def status(args: argparse.Namespace) -> Command:
    return _status(args)


def finalize(args: argparse.Namespace) -> Command:
    if args.level < 0:
        raise InvalidArgumentError(f"--level {args.level}: a feature level, 1 or more")
    return _finalize(args)


def _text(doc: dict[str, Any]) -> str:
    lines = [f"group feature level {doc['feature_level']} (as {doc['node']} applied it): {doc['level_meaning']}",
             f"{'member':<12} {'build':<8} {'protocol':<9} {'levels':<7} {'level':<6} linked"]
    for m in doc["members"]:
        def rng(v: list[int] | None) -> str:
            return f"{v[0]}..{v[1]}" if v else "?"
        linked = "(answering)" if m["this_node"] else ("yes" if m["linked"] else f"no ({m.get('state', '')})")
        lines.append(f"{m['name']:<12} {m['build'] or '?':<8} {rng(m['protocol']):<9} {rng(m['levels']):<7} "
                     f"{m['level'] if m['level'] is not None else '?'!s:<6} {linked}")
    if doc["type_mismatches"]:
        lines.append(f"record types defined differently ({doc['type_errors']} records or definitions could not be "
                     f"read or converted):")
        for t in doc["type_mismatches"]:
            lines.append(f"  {t['member']:<12} {t['type']:<28} here v{t['ours']}, there v{t['theirs']}: converts "
                         f"{t['converts']}{'' if t['convertible'] or t['converts'] == 'none' else ' (no converter)'}")
    else:
        lines.append("record types: every linked member of this build or later defines them alike"
                     + (f" ({doc['type_errors']} records could not be read)" if doc["type_errors"] else ""))
    if doc["finalizable"]:
        lines.append(f"finalize: every member supports level {doc['finalize_to']}: `tandem upgrade finalize` "
                     f"raises the group to it (no going back to an older build after it)")
    else:
        lines.append(f"finalize: not now: {doc['finalize_refusal']}")
    return "\n".join(lines)


async def _status(args: argparse.Namespace) -> int:
    async with await client.connect_link(args.url, client_name="tandem-cli") as conn:
        st = await conn.status()
    doc = report(st)
    print(json.dumps(doc) if args.json else _text(doc))
    return 0


async def _finalize(args: argparse.Namespace) -> int:
    async with await client.connect_link(args.url, client_name="tandem-cli") as conn:
        try:
            st = await conn.finalize_upgrade(args.level)
        except UnsupportedProtocolError:
            raise UnsupportedProtocolError(
                "the node --url points at runs a build without feature levels (0.1.x, protocol 1): start every "
                "member on the new build, then finalize (see docs/upgrades.md)") from None
    doc = report(st)
    print(json.dumps(doc) if args.json else f"group finalized at feature level {doc['feature_level']} "
                                            f"(as {st.node} applied it): {doc['level_meaning']}")
    return 0
