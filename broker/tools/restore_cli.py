"""``tandem restore``: merge what HA-1014 discarded after a split brain back into the queues,
as a client of the group (the procedure, and its run in the group itself for the admin API
and the console: :mod:`broker.partitions.restore`)."""

from __future__ import annotations

import argparse
import functools
import json
import logging
from collections.abc import Coroutine
from typing import Any

import client
from broker.partitions.compensation import Hook, load
from broker.partitions.quarantine import QUEUE
from broker.partitions.restore import WAIT, Filter, Report, Seen, compensated, republished, resent, taken
from broker.messaging.streams import Produced
from broker.tools.options import ExamplesFormatter, url_args
from client.durable.consumer import DurableMessage as Message
from client.errors import InvalidArgumentError, QueueNotFoundError, TandemError
from client.protocol.frames import Publish, PublishMessage, PublishOk, StreamMessage, expect

Command = Coroutine[Any, Any, int]

log = logging.getLogger("tandem.restore")


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "restore", help="merge the messages a split brain's heal discarded (HA-1014) back into their queues",
        formatter_class=ExamplesFormatter,
        description="After a split brain (quorum overrides or designated primaries on both sides), the side "
                    "that loses discards the writes the other side does not have (HA-1014). Their messages "
                    "are kept in the queue tandem.quarantine, with headers naming their queue, partition, "
                    "offset, producer, the node that discarded them and why. This publishes them again to their "
                    "queues, as they are now (the surviving side is the source: each is an instance added to "
                    "it; acknowledgements made on the losing side are not kept, so those messages are "
                    "delivered again), and takes them out of the quarantine. Messages whose queue is gone stay "
                    "there. A restored message gets the id of where it lands (its old one, which may name another "
                    "message of the queue now, in the header x-tandem-restored-id). Run it again to finish one "
                    "that was cut short: nothing is stored twice. A message its producer sent again to the "
                    "other side (unconfirmed, under the same producer id and sequence number) is not restored "
                    "where the queue holds that resend (counted as resent). Needs the produce and browse "
                    "permissions on "
                    "the queues and consume on tandem.quarantine. The console (Operations, restore) and the "
                    "admin API (POST /api/v1/restore) run the same merge in the group.\n\n"
                    "A compensation hook (--compensation NAME: an installed entry point of tandem.compensation) "
                    "sees both versions of each key conflict, the quarantined message and the queue's own, and "
                    "decides: restore it (the default), drop it, or restore a version it makes of both "
                    "(docs/operations.md). Each conflict and what became of it is logged (-v shows them).\n\n"
                    "examples:\n"
                    "  tandem consume tandem.quarantine --no-ack        (look first)\n"
                    "  tandem restore\n"
                    "  tandem restore --from node3 --queue orders --partition 2\n"
                    "  tandem restore --compensation orders -v\n")
    p.add_argument("--from", dest="origin", default=None, metavar="NODE",
                   help="only what NODE discarded (the losing side's node)")
    p.add_argument("--queue", default=None, metavar="QUEUE", help="only messages of QUEUE")
    p.add_argument("--partition", type=int, default=None, metavar="P", help="only messages of partition P")
    p.add_argument("--compensation", default=None, metavar="NAME",
                   help="ask this hook (an entry point of tandem.compensation) about each key conflict")
    url_args(p)
    p.set_defaults(func=restore)


def restore(args: argparse.Namespace) -> Command:
    if args.partition is not None and args.partition < 0:
        raise InvalidArgumentError(f"--partition {args.partition}: a partition number >= 0")
    hook = load(args.compensation) if args.compensation else None
    return _restore(args, Filter(args.origin, args.queue, args.partition), hook)


async def _restore(args: argparse.Namespace, f: Filter, hook: Hook | None) -> int:
    report = Report()
    ends: dict[tuple[str, int], int] = {}  # (queue, partition) -> the source's end offset there
    looked: Seen = {}  # what the source holds of each producer since the logs parted
    async with await client.connect(args.url, client_name="tandem-restore") as conn, \
            await client.connect_link(args.url, client_name="tandem-restore") as link:
        if QUEUE in {q.name for q in await conn.list_queues()}:
            skipped: list[Message] = []
            seen: set[str] = set()
            held = await _held(link)
            if held is None:
                log.info("restore: %s's count is not to be had: done after %.0f s without a message", QUEUE, WAIT)
            else:
                log.info("restore: %s holds %d message(s): done once each is looked at", QUEUE, held)
            async with conn.group_consumer(QUEUE, prefetch=10000) as consumer:
                while (held is None or len(seen) < held) and (m := await consumer.next(WAIT)) is not None:
                    if m.id in seen:  # (one skipped before, back again: every message has been looked at)
                        m.nack()
                        break
                    seen.add(m.id)
                    queue = m.headers.get("x-quarantine-queue", "")
                    if not f.wants(m.headers):
                        skipped.append(m)
                        continue
                    try:
                        queue, pid, msg = republished(m.headers, m.key, m.body)
                        if report.holds(queue, pid):
                            skipped.append(m)
                            continue
                        there = await resent(m.headers, looked, functools.partial(_produced, link))
                        if there is not None:
                            if there:  # (the queue holds its producer's resend)
                                report.resent[queue] += 1
                                m.ack()
                                continue
                            report.unsure[queue] += 1
                        conflict = await taken(m.headers, ends, functools.partial(_end, link))
                        if conflict:
                            res, put = await compensated(hook, m.headers, msg, functools.partial(_read, link))
                            report.resolved(queue, pid, msg, res, log)
                            if put is None:
                                if res.outcome == "dropped":
                                    m.ack()
                                else:
                                    skipped.append(m)
                                continue
                            msg = put
                        dup = await _republish(link, queue, pid, msg)
                    except (QueueNotFoundError, KeyError, ValueError):  # (its queue is gone, or bad headers)
                        report.left[queue] += 1
                        skipped.append(m)
                        continue
                    (report.already if dup else report.restored)[queue] += 1
                    report.conflicts[queue] += conflict
                    m.ack()
                for s in skipped:
                    if not f.wants(s.headers):
                        report.left[s.headers.get("x-quarantine-queue", "")] += 1
                    s.nack()  # (back in the quarantine)
        elif not args.json:
            print("nothing to restore: the quarantine is empty (no HA-1014 discarded a message)")
            return 0
    if args.json:
        print(json.dumps(report.json()))
    else:
        print("\n".join(report.lines(f.narrowed)))
    return 0


async def _held(link: client.Connection) -> int | None:
    """How many messages the quarantine holds now, as its partitions' actives count them (ready,
    delivered and not yet settled, not yet committed): the restore is done once it has looked at
    as many (:data:`~broker.partitions.restore.WAIT`).  None while a partition has no active."""
    try:
        md = (await link.metadata(QUEUE)).map
        if "" in md.actives or not set(md.actives) <= md.addresses.keys():
            return None
        held = 0
        for name in sorted(set(md.actives)):
            there = link if name == link.node else await link.sibling(name, md.addresses[name])
            info = (await there.metadata(QUEUE)).map.queue
            held += info.ready + info.unacked
        return held
    except TandemError as exc:  # (the count is a shortcut: without it, the wait ends the run)
        log.debug("restore: the quarantine's count not to be had: %s", exc)
        return None


async def _end(link: client.Connection, queue: str, partition: int) -> int:
    """The source's end offset of the partition."""
    return (await link.read(queue, partition, 0, 1))[2]


async def _produced(link: client.Connection, queue: str, partition: int, producer: str, offset: int) -> Produced:
    return Produced.of(await link.produced(queue, partition, producer, offset))


async def _read(link: client.Connection, queue: str, partition: int, offset: int) -> list[StreamMessage]:
    return (await link.read(queue, partition, offset, 1))[0]


async def _republish(link: client.Connection, queue: str, pid: str, msg: PublishMessage) -> bool:
    """Publish ``msg`` to ``queue`` under producer ``pid``; True if the queue had it already."""
    reply = expect(await link.request(lambda rid: Publish(rid=rid, queue=queue, producer_id=pid, messages=[msg])),
                   PublishOk)
    return reply.duplicates > 0
