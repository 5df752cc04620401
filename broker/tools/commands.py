"""The client commands ``tandem produce``, ``consume``, ``queues`` and ``console``.

Each command function takes the parsed arguments and returns the coroutine the entry point
(:mod:`broker.cli`) runs; bad input raises :class:`~client.errors.InvalidArgumentError`
before anything connects.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
from collections.abc import Coroutine
from typing import Any

import client
from broker.tools.options import url_args
from broker.tools.totals import QueueTotals, queue_totals
from client.errors import InvalidArgumentError
from client.mapper import MAPPERS
from client.protocol.frames import QueueInfo
from client.timing import timed_headers

Command = Coroutine[Any, Any, int]


def add_parsers(sub: Any) -> None:
    """``produce``, ``consume``, ``queues`` and ``console`` under the ``tandem`` parser."""
    produce_p = sub.add_parser("produce", help="publish messages with confirms",
                               description="Publish each BODY argument (or each line of stdin when no BODY is "
                                           "given) to QUEUE and wait for the broker's confirms. With --exchange "
                                           "there is no QUEUE: every argument is a BODY, published to the "
                                           "exchange, which routes it to the queues bound to it.")
    produce_p.add_argument("queue", nargs="?", metavar="QUEUE")
    produce_p.add_argument("bodies", nargs="*", metavar="BODY")
    produce_p.add_argument("--exchange", metavar="NAME", help="publish to this exchange instead of a queue")
    produce_p.add_argument("--routing-key", dest="routing_key", default="", metavar="KEY",
                           help="with --exchange: the routing key (default: empty)")
    produce_p.add_argument("--mandatory", action="store_true",
                           help="with --exchange: a message routed to no queue fails the publish (without it, "
                                "such a message is dropped and counted)")
    produce_p.add_argument("--key", help="message key (selects the partition)")
    produce_p.add_argument("--header", action="append", default=[], metavar="K=V", help="header, repeatable")
    produce_p.add_argument("--delay", type=float, metavar="SECONDS",
                           help="deliver each message no earlier than this long after it is stored (header x-delay)")
    produce_p.add_argument("--ttl", type=float, metavar="SECONDS",
                           help="each message expires this long after it is stored, never delivered after "
                                "(header expiration: dead-lettered where the queue has a dead-letter queue)")
    produce_p.add_argument("--declare", type=int, metavar="PARTITIONS",
                           help="declare the queue first with this many partitions")
    url_args(produce_p)
    produce_p.set_defaults(func=produce)

    consume_p = sub.add_parser("consume", help="consume and ack messages",
                               description="Consume from QUEUE on every member of the group, print each "
                                           "message, ack it.")
    consume_p.add_argument("queue")
    consume_p.add_argument("-n", "--count", type=int, default=0,
                           help="stop after N messages (0 = run until Ctrl-C)")
    consume_p.add_argument("--timeout", type=float, default=0.0,
                           help="stop when no message came for this many seconds (0 = wait forever)")
    consume_p.add_argument("--prefetch", type=int, default=256)
    consume_p.add_argument("--no-ack", action="store_true", help="nack with requeue instead of ack")
    url_args(consume_p)
    consume_p.set_defaults(func=consume)

    queues_p = sub.add_parser(
        "queues", help="list (default), declare, delete or purge queues",
        description="list: every queue with figures for the whole queue, gathered from every member of "
                    "the group (READY and UNACKED over all partitions, PUBLISHED, DELIVERED and ACKED as "
                    "counted by the members since they started, CONSUMERS on the member that has the "
                    "most). A member that does not answer is named on stderr, its figures left out.")
    queues_p.add_argument("action", nargs="?", default="list", choices=["list", "declare", "delete", "purge"])
    queues_p.add_argument("name", nargs="?")
    queues_p.add_argument("--partitions", type=int, default=1)
    queues_p.add_argument("--mapper", default=None, metavar="NAME",
                          help=f"data mapper of a new queue: {', '.join(MAPPERS)} or an installed custom one "
                               "(default jump_hash; an existing queue keeps its own)")
    queues_p.add_argument("--max-deliveries", dest="max_deliveries", type=int, default=0)
    queues_p.add_argument("--dead-letter-queue", dest="dead_letter_queue", metavar="QUEUE",
                          help="where messages rejected, expired, shed or past --max-deliveries go")
    queues_p.add_argument("--dead-letter-exchange", dest="dead_letter_exchange", metavar="EXCHANGE",
                          help="instead of --dead-letter-queue: dead letters are published to this exchange; in a "
                               "group, needs feature level 8")
    queues_p.add_argument("--dead-letter-routing-key", dest="dead_letter_routing_key", metavar="KEY",
                          help="with --dead-letter-exchange: the routing key (default: each message's own)")
    queues_p.add_argument("--max-length", dest="max_length", type=int, default=0,
                          help="messages the queue holds (ready, delivered and unsettled) past which a publish "
                               "overflows (default 0: no bound)")
    queues_p.add_argument("--max-length-bytes", dest="max_length_bytes", type=int, default=0,
                          help="bytes of ready messages (bodies and headers) past which a publish overflows "
                               "(default 0: no bound)")
    queues_p.add_argument("--overflow", default="reject-publish", choices=["reject-publish", "drop-head"],
                          help="what a publish past a bound does: reject-publish (refused: queue full, the "
                               "default) or drop-head (the oldest ready messages go to the dead-letter queue, "
                               "or are dropped without one); in a group, needs feature level 3")
    queues_p.add_argument("--message-ttl", dest="message_ttl", type=int, default=0, metavar="MS",
                          help="milliseconds a message may wait before it expires: dead-lettered (with a "
                               "dead-letter queue) or dropped, never delivered (default 0: for ever); in a group, "
                               "needs feature level 3")
    queues_p.add_argument("--expires", type=int, default=0, metavar="MS",
                          help="milliseconds the queue may go unused (no consumer, get or declare on any member) "
                               "before it is deleted with its messages (default 0: never); in a group, needs "
                               "feature level 3")
    queues_p.add_argument("--placement", default=None, metavar="LISTS",
                          help="static distribution of a new queue, in a replication group: one node list per "
                               "partition, in priority order (the first node is the preferred active), lists "
                               "separated by ';', nodes by ',', each NAME, NAME:sync or NAME:async "
                               "(\"node1,node2,node3:async;node2,node3,node1\"); a re-spread of the group "
                               "leaves these partitions where they are (default: the group's dynamic policy "
                               "places them)")
    url_args(queues_p)
    queues_p.set_defaults(func=queues)

    console_p = sub.add_parser("console", help="print the management console's address of a running node",
                               description="Ask the node at --url for its management console (served on its "
                                           "--http-port; every node of a group shows the whole group) and "
                                           "print the address. Log in there with a Tandem user.")
    url_args(console_p)
    console_p.set_defaults(func=console)


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


def produce(args: argparse.Namespace) -> Command:
    headers = dict(timed_headers(_headers(args.header), delay=args.delay, ttl=args.ttl) or {})
    given = ([args.queue] if args.queue is not None else []) + list(args.bodies)
    if args.exchange is None:
        if args.queue is None:
            raise InvalidArgumentError("tandem produce needs a QUEUE (or --exchange NAME)")
        if args.routing_key or args.mandatory:
            raise InvalidArgumentError("--routing-key and --mandatory go with --exchange")
        given = given[1:]
    elif args.declare:
        raise InvalidArgumentError("--declare declares a queue: not with --exchange")
    bodies = given if given else [line.rstrip("\n") for line in sys.stdin]
    return _produce(args, bodies, headers)


async def _produce(args: argparse.Namespace, bodies: list[str], headers: dict[str, str]) -> int:
    async with await client.connect(args.url, client_name="tandem-cli") as conn:
        if args.exchange is not None:
            return await _produce_to_exchange(args, conn, bodies, headers)
        if args.declare:
            await conn.declare_queue(args.queue, partitions=args.declare)
        p = conn.producer(args.queue)
        await p.send_many([(b, args.key, headers) for b in bodies])
    if args.json:
        print(json.dumps({"queue": args.queue, "confirmed": len(bodies), "producer_id": p.producer_id}))
    else:
        print(f"{len(bodies)} message(s) confirmed on queue {args.queue}")
    return 0


async def _produce_to_exchange(args: argparse.Namespace, conn: client.DurableConnection, bodies: list[str],
                               headers: dict[str, str]) -> int:
    p = conn.exchange_producer(args.exchange, args.routing_key, mandatory=args.mandatory)
    await asyncio.gather(*(p.send(b, key=args.key, headers=headers) for b in bodies))
    if args.json:
        print(json.dumps({"exchange": args.exchange, "routing_key": args.routing_key, "confirmed": len(bodies),
                          "unroutable": p.unroutable, "producer_id": p.producer_id}))
    else:
        dropped = f" ({p.unroutable} routed to no queue: dropped)" if p.unroutable else ""
        print(f"{len(bodies)} message(s) confirmed on exchange {args.exchange}{dropped}")
    return 0


# -- consume ------------------------------------------------------------------------------


def consume(args: argparse.Namespace) -> Command:
    if args.count < 0 or args.timeout < 0:
        raise InvalidArgumentError("--count and --timeout must be >= 0")
    return _consume(args)


async def _consume(args: argparse.Namespace) -> int:
    n = 0
    async with await client.connect(args.url, client_name="tandem-cli") as conn:
        async with conn.group_consumer(args.queue, prefetch=args.prefetch) as c:
            while not args.count or n < args.count:
                m = await c.next(args.timeout or None)
                if m is None:
                    break
                n += 1
                text = _body_text(m.body)
                if args.json:
                    print(json.dumps({
                        "id": m.id, "partition": m.partition, "offset": m.offset, "key": m.key,
                        "headers": m.headers, "redelivered": m.redelivered,
                        "delivery_count": m.delivery_count, "timestamp": m.timestamp,
                        "body": text if text is not None else None,
                        "body_base64": base64.b64encode(m.body).decode() if text is None else None,
                    }), flush=True)
                else:
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


def queues(args: argparse.Namespace) -> Command:
    if args.action != "list" and not args.name:
        raise InvalidArgumentError(f"tandem queues {args.action} needs a queue name")
    return _list(args) if args.action == "list" else _change(args)


def _info_json(q: QueueInfo) -> dict[str, Any]:
    return {f: getattr(q, f) for f in q.__dataclass_fields__}


async def _change(args: argparse.Namespace) -> int:
    async with await client.connect(args.url, client_name="tandem-cli") as conn:
        if args.action == "declare":
            info = await conn.declare_queue(
                args.name, partitions=args.partitions, mapper=args.mapper,
                max_deliveries=args.max_deliveries, dead_letter_queue=args.dead_letter_queue,
                max_length=args.max_length, placement=args.placement, max_length_bytes=args.max_length_bytes,
                overflow=args.overflow, message_ttl=args.message_ttl, expires=args.expires,
                dead_letter_exchange=args.dead_letter_exchange, dead_letter_routing_key=args.dead_letter_routing_key)
            print(json.dumps(_info_json(info)) if args.json else f"queue {info.name} declared "
                  f"({info.partitions} partitions, {info.mapper}{', static placement' if args.placement else ''})")
        elif args.action == "delete":
            await conn.delete_queue(args.name)
            print(json.dumps({"deleted": args.name}) if args.json else f"queue {args.name} deleted")
        else:
            n = await conn.purge_queue(args.name)
            print(json.dumps({"purged": n, "queue": args.name}) if args.json
                  else f"{n} message(s) purged from {args.name}")
    return 0


async def _list(args: argparse.Namespace) -> int:
    totals = await queue_totals(args.url, client_name="tandem-cli")
    for name, why in sorted(totals.missing.items()):
        print(f"tandem: {name} did not answer ({why}): its figures are left out", file=sys.stderr)
    if args.json:
        print(json.dumps([{**_info_json(q), "complete": not totals.missing} for q in totals.queues]))
    else:
        _print_table(totals)
    return 0


def _print_table(totals: QueueTotals) -> None:
    qs = totals.queues
    rows = [("NAME", "PARTITIONS", "READY", "UNACKED", "CONSUMERS", "PUBLISHED", "ACKED")]
    rows += [(q.name, str(q.partitions), str(q.ready), str(q.unacked), str(q.consumers), str(q.published),
              str(q.acked)) for q in qs]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    if not qs:
        print("(no queues)")


# -- console ------------------------------------------------------------------------------


def console(args: argparse.Namespace) -> Command:
    return _console(args)


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
