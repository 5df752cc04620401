"""Client-side CLI commands: ``tandem produce``, ``tandem consume``, ``tandem queues``."""

from __future__ import annotations

import argparse
import base64
import json
import sys
from typing import Any

import client
from client.errors import InvalidArgumentError
from client.protocol.frames import QueueInfo


def _run(coro: Any) -> int:
    from broker.cli import run_async

    return run_async(coro)


def _headers(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        k, sep, v = pair.partition("=")
        if not sep or not k:
            raise InvalidArgumentError(f"--header {pair!r}: expected KEY=VALUE")
        out[k] = v
    return out


def _body_text(body: bytes) -> str | None:
    try:
        return body.decode()
    except UnicodeDecodeError:
        return None


# -- produce ------------------------------------------------------------------------------


def produce(args: argparse.Namespace) -> int:
    headers = _headers(args.header)
    bodies = list(args.bodies) if args.bodies else [line.rstrip("\n") for line in sys.stdin]
    return _run(_produce(args, bodies, headers))


async def _produce(args: argparse.Namespace, bodies: list[str], headers: dict[str, str]) -> int:
    async with await client.connect(args.url, client_name="tandem-cli") as conn:
        if args.declare:
            await conn.declare_queue(args.queue, partitions=args.declare)
        p = conn.producer(args.queue)
        await p.send_many([(b, args.key, headers) for b in bodies])
    if args.json:
        print(json.dumps({"queue": args.queue, "confirmed": len(bodies), "producer_id": p.producer_id}))
    else:
        print(f"{len(bodies)} message(s) confirmed on queue {args.queue}")
    return 0


# -- consume ------------------------------------------------------------------------------


def consume(args: argparse.Namespace) -> int:
    if args.count < 0 or args.timeout < 0:
        raise InvalidArgumentError("--count and --timeout must be >= 0")
    return _run(_consume(args))


async def _consume(args: argparse.Namespace) -> int:
    n = 0
    async with await client.connect(args.url, client_name="tandem-cli") as conn:
        async with conn.group_consumer(args.queue, prefetch=args.prefetch) as c:
            while not args.count or n < args.count:
                m = await c.next(args.timeout or None)
                if m is None:
                    break
                n += 1
                if args.json:
                    text = _body_text(m.body)
                    print(json.dumps({
                        "id": m.id, "partition": m.partition, "offset": m.offset, "key": m.key,
                        "headers": m.headers, "redelivered": m.redelivered,
                        "delivery_count": m.delivery_count, "timestamp": m.timestamp,
                        "body": text if text is not None else None,
                        "body_base64": base64.b64encode(m.body).decode() if text is None else None,
                    }), flush=True)
                else:
                    text = _body_text(m.body)
                    shown = text if text is not None else f"<{len(m.body)} bytes>"
                    flag = " (redelivered)" if m.redelivered else ""
                    print(f"[{m.id}] key={m.key} {shown}{flag}", flush=True)
                if args.no_ack:
                    await m.nack(requeue=True)
                else:
                    await m.ack()
    if not args.json:
        print(f"{n} message(s) consumed from {args.queue}", file=sys.stderr)
    return 0


# -- queues ------------------------------------------------------------------------------


def queues(args: argparse.Namespace) -> int:
    if args.action != "list" and not args.name:
        raise InvalidArgumentError(f"tandem queues {args.action} needs a queue name")
    return _run(_queues(args))


def _info_json(q: QueueInfo) -> dict[str, Any]:
    return {f: getattr(q, f) for f in q.__dataclass_fields__}


async def _queues(args: argparse.Namespace) -> int:
    async with await client.connect(args.url, client_name="tandem-cli") as conn:
        if args.action == "declare":
            info = await conn.declare_queue(
                args.name, partitions=args.partitions, mapper=args.mapper,
                max_deliveries=args.max_deliveries, dead_letter_queue=args.dead_letter_queue,
                max_length=args.max_length)
            print(json.dumps(_info_json(info)) if args.json else f"queue {info.name} declared "
                  f"({info.partitions} partitions, {info.mapper})")
        elif args.action == "delete":
            await conn.delete_queue(args.name)
            print(json.dumps({"deleted": args.name}) if args.json else f"queue {args.name} deleted")
        elif args.action == "purge":
            n = await conn.purge_queue(args.name)
            print(json.dumps({"purged": n, "queue": args.name}) if args.json
                  else f"{n} message(s) purged from {args.name}")
        else:
            qs = await conn.list_queues()
            if args.json:
                print(json.dumps([_info_json(q) for q in qs]))
            else:
                _print_table(qs)
    return 0


def _print_table(qs: list[QueueInfo]) -> None:
    rows = [("NAME", "PARTITIONS", "READY", "UNACKED", "CONSUMERS", "PUBLISHED", "ACKED")]
    rows += [(q.name, str(q.partitions), str(q.ready), str(q.unacked), str(q.consumers), str(q.published),
              str(q.acked)) for q in qs]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    if not qs:
        print("(no queues)")


# -- status -------------------------------------------------------------------------------


def status(args: argparse.Namespace) -> int:
    return _run(_status(args))


async def _status(args: argparse.Namespace) -> int:
    async with await client.connect_link(args.url, client_name="tandem-cli") as conn:
        st = await conn.status()
    if args.json:
        print(json.dumps(status_json(st)))
        return 0
    print(f"node {st.node} (version {st.version}, priority {st.priority}, votes {st.votes}, "
          f"store {st.store_stamp})")
    override = f", override {st.quorum_override}" if st.quorum_override is not None else ""
    print(f"quorum: {st.quorum_state} (policy {st.quorum_policy}{override})")
    if st.remotes:
        rows = [("NODE", "STATE", "ADDRESS", "PRIORITY", "VOTES")]
        rows += [(r.name, r.state, r.address, str(r.priority), str(r.votes)) for r in st.remotes]
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for r in rows:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    else:
        print("(single node: no replication group configured)")
    if st.partitions:
        print(f"partitions (as {st.node} sees them):")
        prow: list[tuple[str, ...]] = [("QUEUE", "PART", "STATE", "ACTIVE", "ROLE HERE", "TERM", "COMMIT",
                                        "REPLICAS (lag)")]
        for p in st.partitions:
            reps = ", ".join(f"{r.node}:{r.kind}" + (f"({r.lag})" if p.role == "active" else "") for r in p.replicas)
            prow.append((p.queue or "(catalogue)", str(p.partition), p.state, p.active or "-", p.role, str(p.term),
                         str(p.commit), reps))
        _table(prow)
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


def status_json(st: Any) -> dict[str, Any]:
    return {
        "node": st.node, "version": st.version, "store_stamp": st.store_stamp, "priority": st.priority,
        "votes": st.votes, "quorum_state": st.quorum_state, "quorum_policy": st.quorum_policy,
        "quorum_override": st.quorum_override, "designated_primary": st.designated_primary,
        "remotes": _record(st.remotes), "partitions": _record(st.partitions), "events": list(st.events),
        "ha_1014_discarded": st.discarded,
        "ha_1014_discarded_messages": st.discarded_messages,
    }


# -- admin ----------------------------------------------------------------------------------


def admin(args: argparse.Namespace) -> int:
    if args.admin_command == "set-priority":
        if args.value not in ("0", "1", "2", "3"):
            raise InvalidArgumentError(f"priority {args.value!r}: 0 (never active), 1, 2 or 3 (highest)")
        return _run(_set_option(args, "priority", int(args.value)))
    if args.admin_command == "set-designated-primary":
        if args.value.lower() not in ("on", "off"):
            raise InvalidArgumentError(f"expected on or off, got {args.value!r}")
        return _run(_set_option(args, "designated_primary", int(args.value.lower() == "on")))
    value = None if args.value.lower() == "none" else _positive(args.value)
    return _run(_admin(args, value))


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


async def _admin(args: argparse.Namespace, value: int | None) -> int:
    async with await client.connect_link(args.url, client_name="tandem-cli") as conn:
        st = await conn.set_quorum_override(value)
    if args.json:
        print(json.dumps({"node": st.node, "quorum_state": st.quorum_state, "quorum_override": st.quorum_override}))
    else:
        shown = f"at least {st.quorum_override} node(s) up" if st.quorum_override is not None else "cleared"
        print(f"node {st.node}: quorum_override {shown}; quorum now {st.quorum_state}")
    return 0


def console(args: argparse.Namespace) -> int:
    return _run(_console(args))


async def _console(args: argparse.Namespace) -> int:
    async with await client.connect_link(args.url, client_name="tandem-cli") as conn:
        st = await conn.status()
    if not st.console:
        raise InvalidArgumentError(f"node {st.node} serves no console: start it with --http-port "
                                   "(tandem cluster up does: client port + 2)")
    if args.json:
        print(json.dumps({"node": st.node, "console": st.console}))
    else:
        print(f"node {st.node}: console {st.console} (log in with a Tandem user)")
    return 0
