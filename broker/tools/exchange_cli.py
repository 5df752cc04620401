"""``tandem exchanges`` (list, declare, delete), ``tandem bind`` and ``tandem unbind``: the group's
exchanges and bindings (docs/messaging.md).  Publishing to an exchange is ``tandem produce
--exchange``."""

from __future__ import annotations

import argparse
import json
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import client
from broker.tools.options import url_args
from client.errors import InvalidArgumentError
from client.protocol.frames import ExchangeInfo

Command = Coroutine[Any, Any, int]
TYPES = ("direct", "fanout", "topic", "headers")


def add_parsers(sub: Any) -> None:
    ex = sub.add_parser(
        "exchanges", help="list (default), declare or delete exchanges",
        description="Exchanges route what is published to them to the queues (and exchanges) bound to them: "
                    "direct (the binding's key equals the routing key), fanout (every binding), topic (the "
                    "binding's pattern matches the routing key word by word: * one word, # zero or more) or "
                    "headers (the binding's headers match the message's: --match all or any). The group's "
                    "state, on every member; in a group, needs feature level 4 (tandem upgrade finalize).")
    ex.add_argument("action", nargs="?", default="list", choices=["list", "declare", "delete"])
    ex.add_argument("name", nargs="?")
    ex.add_argument("--type", default="direct", choices=TYPES, help="a new exchange's type (default direct)")
    ex.add_argument("--alternate", metavar="EXCHANGE",
                    help="an exchange (declared first) that gets what none of this one's bindings take")
    ex.add_argument("--if-unused", dest="if_unused", action="store_true",
                    help="delete: refused while the exchange has bindings")
    url_args(ex)
    ex.set_defaults(func=exchanges)
    for verb in ("bind", "unbind"):
        b = sub.add_parser(
            verb, help=f"{verb} a queue (or an exchange) {'to' if verb == 'bind' else 'from'} an exchange",
            description=("Bind DESTINATION (a queue, or an exchange with --to-exchange) to exchange SOURCE: "
                         "messages published to SOURCE that match go there too. Binding what is bound changes "
                         "nothing." if verb == "bind" else
                         "Remove the binding with these fields (as it was bound). Unbinding what is not bound "
                         "changes nothing."))
        b.add_argument("source", metavar="SOURCE", help="the exchange")
        b.add_argument("destination", metavar="DESTINATION", help="the queue (or exchange)")
        b.add_argument("--routing-key", dest="routing_key", default="", metavar="KEY",
                       help="a direct exchange's key, a topic exchange's pattern (default: empty)")
        b.add_argument("--header", action="append", default=[], metavar="K=V",
                       help="a headers exchange's header to match, repeatable")
        b.add_argument("--match", choices=["all", "any"], default=None,
                       help="a headers exchange: every --header must match (all, the default) or one (any)")
        b.add_argument("--to-exchange", dest="to_exchange", action="store_true",
                       help="DESTINATION is an exchange, which routes the message in turn")
        url_args(b)
        b.set_defaults(func=bind, bound=verb == "bind")


def exchanges(args: argparse.Namespace) -> Command:
    if args.action != "list" and not args.name:
        raise InvalidArgumentError(f"tandem exchanges {args.action} needs an exchange name")
    return _exchanges(args)


def _info_json(e: ExchangeInfo) -> dict[str, Any]:
    return {"name": e.name, "type": e.type, "alternate": e.alternate,
            "bindings": [{"destination": b.destination, "to_exchange": b.to_exchange, "routing_key": b.routing_key,
                          "arguments": b.arguments} for b in e.bindings]}


async def _exchanges(args: argparse.Namespace) -> int:
    async with await client.connect(args.url, client_name="tandem-cli") as conn:
        if args.action == "declare":
            created = await conn.declare_exchange(args.name, args.type, alternate=args.alternate)
            print(json.dumps({"exchange": args.name, "created": created}) if args.json else
                  f"exchange {args.name} {'declared' if created else 'exists'} ({args.type})")
        elif args.action == "delete":
            await conn.delete_exchange(args.name, if_unused=args.if_unused)
            print(json.dumps({"deleted": args.name}) if args.json else f"exchange {args.name} deleted")
        else:
            found = await conn.list_exchanges()
            if args.json:
                print(json.dumps([_info_json(e) for e in found]))
            elif not found:
                print("(no exchanges)")
            for e in [] if args.json else found:
                alt = f", alternate {e.alternate}" if e.alternate else ""
                print(f"{e.name} ({e.type}{alt})")
                for b in e.bindings:
                    what = "exchange" if b.to_exchange else "queue"
                    args_text = " ".join(f"{k}={v}" for k, v in sorted(b.arguments.items()))
                    print(f"  -> {what} {b.destination}  key={b.routing_key!r}{'  ' + args_text if args_text else ''}")
    return 0


def bind(args: argparse.Namespace) -> Command:
    headers: dict[str, str] = {}
    for pair in args.header:
        k, sep, v = pair.partition("=")
        if not sep or not k:
            raise InvalidArgumentError(f"--header {pair!r}: expected KEY=VALUE")
        headers[k] = v
    if args.match is not None:
        headers["x-match"] = args.match
    return _bind(args, headers)


async def _bind(args: argparse.Namespace, arguments: dict[str, str]) -> int:
    async with await client.connect(args.url, client_name="tandem-cli") as conn:
        change: Callable[..., Awaitable[None]]
        if args.to_exchange:
            change = conn.bind_exchange if args.bound else conn.unbind_exchange
        else:
            change = conn.bind_queue if args.bound else conn.unbind_queue
        await change(args.destination, args.source, args.routing_key, arguments=arguments)
    verb = "bound to" if args.bound else "unbound from"
    if args.json:
        print(json.dumps({"source": args.source, "destination": args.destination, "routing_key": args.routing_key,
                          "arguments": arguments, "bound": args.bound}))
    else:
        print(f"{'exchange' if args.to_exchange else 'queue'} {args.destination} {verb} exchange {args.source} "
              f"(key {args.routing_key!r})")
    return 0
