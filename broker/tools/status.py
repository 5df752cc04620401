"""``tandem status`` and ``tandem admin``: one node's view of its group, and operator overrides."""

from __future__ import annotations

import argparse
import json
from collections.abc import Coroutine
from typing import Any

import client
from broker.tools.options import url_args
from client.errors import InvalidArgumentError
from client.protocol.frames import StatusOk

Command = Coroutine[Any, Any, int]


def add_parsers(sub: Any) -> None:
    """``status`` and ``admin ...`` under the ``tandem`` parser."""
    st = sub.add_parser("status", help="the node, its replication group and quorum",
                        description="Show the node's identity, the state of every other member of its "
                                    "replication group (Up, Down, ...), its node quorum state and, for every "
                                    "partition, its active as this node sees it.")
    url_args(st)
    st.set_defaults(func=status)

    adm = sub.add_parser("admin", help="operator overrides (logged loudly)")
    asub = adm.add_subparsers(dest="admin_command", required=True, metavar="ACTION")
    qo = asub.add_parser("set-quorum-override",
                         help="keep node quorum with at least N members up (or 'none' to clear)",
                         description="Temporary operator override of the node quorum policy, e.g. to restore "
                                     "service from one surviving node of three. Takes effect at once and is "
                                     "logged loudly; clear it with 'none' when the group is whole again.")
    qo.add_argument("value", metavar="N|none")
    url_args(qo)
    qo.set_defaults(func=admin)
    sp = asub.add_parser("set-priority", help="this node's election priority, at once",
                         description="Change the election priority of the node --url points at: 0 never active, "
                                     "1 normal, 2 high, 3 highest. Used by the next elections; logged loudly.")
    sp.add_argument("value", metavar="0|1|2|3")
    url_args(sp)
    sp.set_defaults(func=admin)
    dp = asub.add_parser("set-designated-primary", help="two-node group: let this node go on alone (on|off)",
                         description="In a two-node group neither node has a majority alone. Turning this on for "
                                     "the node --url points at lets it keep (or take) every partition when its "
                                     "peer is gone. Only one of the two may have it; logged loudly.")
    dp.add_argument("value", metavar="on|off")
    url_args(dp)
    dp.set_defaults(func=admin)


# -- status -------------------------------------------------------------------------------


def status(args: argparse.Namespace) -> Command:
    return _status(args)


async def _status(args: argparse.Namespace) -> int:
    async with await client.connect_link(args.url, client_name="tandem-cli", observe=True) as conn:
        st = await conn.status()
    if args.json:
        print(json.dumps(status_json(st)))
        return 0
    drained = ", drained" if st.node in st.drained else ""
    zone_of = dict(z.partition("=")[::2] for z in st.zones)
    zone = f", zone {zone_of[st.node]}" if st.node in zone_of else ""
    print(f"node {st.node} (version {st.version}, priority {st.priority}, votes {st.votes}{zone}, "
          f"store {st.store_stamp}{drained})")
    override = f", override {st.quorum_override}" if st.quorum_override is not None else ""
    print(f"quorum: {st.quorum_state} (policy {st.quorum_policy}{override})")
    for z in st.availability_zones:
        off = ": HA services off here" if z.state == "Disabled" else ""
        print(f"  availability zone {z.name}: {z.state} ({z.up_votes} of {z.total_votes} votes up, policy "
              f"{z.policy}; {', '.join(z.members)}){off}")
    if st.ha_state:
        holder = f", lock held by {st.lock_holder}" if st.lock_holder else ", lock free"
        print(f"ha: {st.mode} mode, arbiter {st.arbiter}: {st.ha_state} (epoch {st.epoch}{holder})")
    elif st.arbiter != "majority":
        print(f"ha: {st.mode} mode, arbiter {st.arbiter}")
    if st.remotes:
        rows = [("NODE", "STATE", "ADDRESS", "PRIORITY", "VOTES", *(("ZONE",) if zone_of else ()))]
        rows += [(r.name + (" (witness)" if r.store_stamp.startswith("witness-") else ""),
                  r.state + (", drained" if r.name in st.drained else ""), r.address,
                  str(r.priority), str(r.votes), *((zone_of.get(r.name, "-"),) if zone_of else ()))
                 for r in st.remotes]
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for r in rows:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    else:
        print("(single node: no replication group configured)")
    if st.partitions:
        print(f"partitions (as {st.node} sees them):")
        static = any(p.static for p in st.partitions)  # (the column only where a queue has explicit lists)
        prow: list[tuple[str, ...]] = [("QUEUE", "PART", "STATE", "ACTIVE", "ROLE HERE", "TERM", "COMMIT",
                                        "REPLICAS (lag)", *(("PLACEMENT",) if static else ()))]
        for p in st.partitions:
            reps = ", ".join(f"{r.node}:{r.kind}" + (f"({r.lag})" if p.role == "active" else "") for r in p.replicas)
            prow.append((p.queue or "(catalogue)", str(p.partition), p.state, p.active or "-", p.role, str(p.term),
                         str(p.commit), reps, *((("static" if p.static else "dynamic" if p.queue else "-"),)
                                                if static else ())))
        _table(prow)
    if st.foreign:
        print(f"partitions held elsewhere (as {st.node} knows them):")
        frow: list[tuple[str, ...]] = [("QUEUE", "PART", "STATUS", "ACTIVE", "TERM", "HELD BY")]
        frow += [(p.queue, str(p.partition), p.status, p.active or "-", str(p.term) if p.term else "-",
                  ", ".join(r.node for r in p.replicas)) for p in st.foreign]
        _table(frow)
    if st.group_change:
        print(f"group change under way: {st.group_change}")
    if st.moving:
        print("partitions moving (tandem partition move): " + "; ".join(
            f"{m.split(' ', 1)[0]} to {m.split(' ', 1)[1]}" for m in st.moving))
    if st.updating:
        print("queues being updated (tandem partition update): " + "; ".join(
            f"{u.split(' ', 1)[0]}, partitions {u.split(' ', 1)[1]} left" for u in st.updating))
    if st.designated_primary:
        print("designated primary: this node goes on alone when its peer is gone")
    print(f"HA-1014 discarded entries: {st.discarded} ({st.discarded_messages} messages)")
    if st.events:
        print("recent HA events:")
        for e in st.events[-20:]:
            print(f"  {e}")
    return 0


def _table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def _record(r: Any) -> Any:
    if hasattr(r, "__dataclass_fields__"):
        return {f: _record(getattr(r, f)) for f in r.__dataclass_fields__}
    if isinstance(r, list):
        return [_record(x) for x in r]
    return r


def status_json(st: StatusOk) -> dict[str, Any]:
    return {
        "node": st.node, "version": st.version, "store_stamp": st.store_stamp, "priority": st.priority,
        "votes": st.votes, "quorum_state": st.quorum_state, "quorum_policy": st.quorum_policy,
        "quorum_override": st.quorum_override, "designated_primary": st.designated_primary,
        "remotes": _record(st.remotes), "partitions": _record(st.partitions), "events": list(st.events),
        "ha_1014_discarded": st.discarded,
        "ha_1014_discarded_messages": st.discarded_messages,
        "mode": st.mode, "arbiter": st.arbiter, "ha_state": st.ha_state or None, "epoch": st.epoch,
        "lock_holder": st.lock_holder or None, "drained": list(st.drained),
        "zones": dict(z.partition("=")[::2] for z in st.zones), "foreign": _record(st.foreign),
        "availability_zones": _record(st.availability_zones),
        "moving": {m.split(" ", 2)[0]: m.split(" ", 2)[1].split(",") for m in st.moving},
        "forced_replication": {m.split(" ", 2)[0]: m.split(" ", 2)[2][len("(forced replication: "):-1]
                               for m in st.moving if " (forced replication: " in m},
        "members": list(st.members), "group_change": st.group_change or None,
        "updating": {u.split(" ", 1)[0]: [int(p) for p in u.split(" ", 1)[1].split(",")] for u in st.updating},
    }


# -- admin ----------------------------------------------------------------------------------


def admin(args: argparse.Namespace) -> Command:
    if args.admin_command == "set-priority":
        if args.value not in ("0", "1", "2", "3"):
            raise InvalidArgumentError(f"priority {args.value!r}: 0 (never active), 1, 2 or 3 (highest)")
        return _set_option(args, "priority", int(args.value))
    if args.admin_command == "set-designated-primary":
        if args.value.lower() not in ("on", "off"):
            raise InvalidArgumentError(f"expected on or off, got {args.value!r}")
        return _set_option(args, "designated_primary", int(args.value.lower() == "on"))
    value = None if args.value.lower() == "none" else _positive(args.value)
    return _set_quorum_override(args, value)


async def _set_option(args: argparse.Namespace, name: str, value: int) -> int:
    async with await client.connect_link(args.url, client_name="tandem-cli") as conn:
        if name == "priority":
            st = await conn.set_priority(value)
        else:
            st = await conn.set_designated_primary(bool(value))
    if args.json:
        print(json.dumps({"node": st.node, "priority": st.priority, "designated_primary": st.designated_primary,
                          "quorum_state": st.quorum_state}))
    else:
        print(f"node {st.node}: priority {st.priority}, designated primary "
              f"{'on' if st.designated_primary else 'off'}; quorum now {st.quorum_state}")
    return 0


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise InvalidArgumentError(f"expected a number of nodes >= 1 or 'none', got {text!r}")
    return int(text)


async def _set_quorum_override(args: argparse.Namespace, value: int | None) -> int:
    async with await client.connect_link(args.url, client_name="tandem-cli") as conn:
        st = await conn.set_quorum_override(value)
    if args.json:
        print(json.dumps({"node": st.node, "quorum_state": st.quorum_state, "quorum_override": st.quorum_override}))
    else:
        shown = f"at least {st.quorum_override} node(s) up" if st.quorum_override is not None else "cleared"
        print(f"node {st.node}: quorum_override {shown}; quorum now {st.quorum_state}")
    return 0
