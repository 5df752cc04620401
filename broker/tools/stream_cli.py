"""``tandem streams`` (declare, read, offset): streams, whose messages stay until their retention
drops them, read by offset, position or time, with named consumers' offsets kept by the group
(docs/messaging.md).  Publishing to a stream is ``tandem produce``."""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import json
from collections.abc import Coroutine
from typing import Any

import client
from broker.tools.options import url_args
from client.errors import InvalidArgumentError
from client.protocol.frames import StreamMessage

Command = Coroutine[Any, Any, int]
#: messages one read asks for (a read returns fewer when its frame is full)
READ_BATCH = 1000


def add_parsers(sub: Any) -> None:
    st = sub.add_parser(
        "streams", help="declare a stream, read one, or show and set a named consumer's offset",
        description="A stream keeps what is published to it (tandem produce) until its retention drops the oldest "
                    "chunks: --max-age and --max-bytes. It is read, not consumed: by offset, from first, last "
                    "or next, or from a time; a named consumer's offsets are the group's, there after a "
                    "failover or a restart. In a group, needs feature level 5 (tandem upgrade finalize).")
    st.add_argument("action", choices=["declare", "read", "offset"],
                    help="declare NAME; read NAME (prints one JSON object a message); offset NAME --consumer C "
                         "(prints it, or stores --set OFFSET)")
    st.add_argument("name", metavar="NAME")
    st.add_argument("--partitions", type=int, default=1, help="declare: partitions (default 1)")
    st.add_argument("--max-age", dest="max_age", type=float, default=0, metavar="SECONDS",
                    help="declare: messages older than this go, whole chunks at a time (default 0: for ever)")
    st.add_argument("--max-bytes", dest="max_bytes", type=int, default=0, metavar="BYTES",
                    help="declare: bytes each partition keeps, the oldest chunks going first (default 0: no bound)")
    st.add_argument("--partition", type=int, default=0, help="read, offset: the partition (default 0)")
    st.add_argument("--from", dest="start", default="first", metavar="WHERE",
                    help="read: an offset, first (the oldest held, the default), last or next (only what is "
                         "published from now on: reads nothing unless --follow)")
    st.add_argument("--since", default=None, metavar="TIME",
                    help="read: from the first message stored at or after TIME (seconds since the epoch, or ISO "
                         "8601 such as 2026-11-29T10:00:00+00:00) instead of --from")
    st.add_argument("--consumer", default=None, metavar="NAME",
                    help="read: start at this consumer's stored offset (else --from) and store where the read "
                         "ended; offset: whose offset")
    st.add_argument("-n", "--count", type=int, default=0, help="read: stop after N messages (default 0: to the end)")
    st.add_argument("--set", dest="set_offset", type=int, default=None, metavar="OFFSET",
                    help="offset: store OFFSET (the next one the consumer reads)")
    url_args(st)
    st.set_defaults(func=streams)


def _since(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise InvalidArgumentError(f"--since {text!r}: seconds since the epoch, or ISO 8601 "
                                   f"(2026-11-29T10:00:00+00:00)") from None
    if when.tzinfo is None:
        raise InvalidArgumentError(f"--since {text!r}: give the time zone (+00:00 for UTC)")
    return when.timestamp()


def _start(text: str) -> int | str:
    if text in ("first", "last", "next"):
        return text
    try:
        offset = int(text)
    except ValueError:
        raise InvalidArgumentError(f"--from {text!r}: an offset, first, last or next") from None
    if offset < 0:
        raise InvalidArgumentError(f"--from {offset}: an offset is >= 0")
    return offset


def streams(args: argparse.Namespace) -> Command:
    if args.count < 0 or args.partition < 0:
        raise InvalidArgumentError("--count and --partition are >= 0")
    if args.action == "offset" and not args.consumer:
        raise InvalidArgumentError("tandem streams offset needs --consumer NAME")
    since = _since(args.since) if args.since is not None else None
    return _streams(args, _start(args.start), since)


def _message_json(m: StreamMessage) -> dict[str, Any]:
    try:
        body: dict[str, str] = {"body": m.body.decode()}
    except UnicodeDecodeError:
        body = {"body_base64": base64.b64encode(m.body).decode()}
    return {"partition": m.partition, "offset": m.offset, "key": m.key, "headers": m.headers, **body,
            "timestamp": m.timestamp}


async def _streams(args: argparse.Namespace, start: int | str, since: float | None) -> int:
    async with await client.connect(args.url, client_name="tandem-cli") as conn:
        if args.action == "declare":
            info = await conn.declare_stream(args.name, partitions=args.partitions, max_age=args.max_age,
                                             max_bytes=args.max_bytes)
            print(json.dumps({"stream": info.name, "partitions": info.partitions}) if args.json else
                  f"stream {info.name} declared ({info.partitions} partition(s))")
        elif args.action == "offset":
            if args.set_offset is not None:
                await conn.store_offset(args.name, args.consumer, args.partition, args.set_offset)
            offset = await conn.fetch_offset(args.name, args.consumer, args.partition)
            print(json.dumps({"stream": args.name, "partition": args.partition, "consumer": args.consumer,
                              "offset": offset}) if args.json else
                  f"{args.consumer} at offset {offset} of {args.name}/{args.partition}" if offset is not None else
                  f"{args.consumer} has no offset stored in {args.name}/{args.partition}")
        else:
            await _read(conn, args, start, since)
    return 0


async def _read(conn: client.DurableConnection, args: argparse.Namespace, start: int | str,
                since: float | None) -> None:
    if args.consumer:
        stored = await conn.fetch_offset(args.name, args.consumer, args.partition)
        if stored is not None:
            start, since = stored, None
    left = args.count or None  # (None: to the end)
    msgs, nxt, end = await conn.read(args.name, args.partition, start, min(left or READ_BATCH, READ_BATCH),
                                     timestamp=since)
    while True:
        for m in msgs:
            print(json.dumps(_message_json(m)), flush=True)
        if left is not None:
            left -= len(msgs)
            if left <= 0:
                break
        if nxt >= end:
            break
        msgs, nxt, end = await conn.read(args.name, args.partition, nxt, min(left or READ_BATCH, READ_BATCH))
    if args.consumer:
        await conn.store_offset(args.name, args.consumer, args.partition, nxt)
