"""An AMQP message's properties as a Tandem message's headers, and back.

Tandem headers are text.  An AMQP publish keeps every property it set:

* ``content_type``, ``content_encoding``, ``delivery_mode``, ``priority``, ``correlation_id``,
  ``reply_to``, ``message_id``, ``timestamp``, ``type``, ``user_id`` and ``app_id`` become
  headers ``amqp-<name>`` (``amqp-content-type``, ...), as text;
* ``expiration`` (milliseconds, as text) becomes Tandem's own ``expiration`` header: the message
  expires as a Tandem message with a TTL does;
* the application ``headers`` table is kept whole, typed, in ``x-amqp-headers`` (the table as
  AMQP encodes it, base64), and each entry whose value is text, a number or a boolean is also a
  header of its own, as text (what a headers exchange matches and a Tandem consumer reads).

A message a Tandem client published reaches an AMQP consumer with its headers as the
``headers`` table (text values) and no other property.
"""

from __future__ import annotations

import base64
import binascii
import datetime
from typing import Any

from pamqp import decode, encode
from pamqp.commands import Basic

from broker.messaging.message import EXCHANGE_HEADER, EXPIRATION_HEADER, ROUTING_KEY_HEADER

#: the application headers table, whole and typed
TABLE = "x-amqp-headers"
PREFIX = "amqp-"
#: the properties kept as ``amqp-<name>`` headers (``expiration`` is Tandem's own header)
TEXT = ("content_type", "content_encoding", "correlation_id", "reply_to", "message_id", "message_type", "user_id",
        "app_id")
NUMBERS = ("delivery_mode", "priority")


def _name(prop: str) -> str:
    """A property's header: ``amqp-content-type``; pamqp's ``message_type`` is AMQP's ``type``."""
    return PREFIX + ("type" if prop == "message_type" else prop.replace("_", "-"))


def _text(value: Any) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return None
    return None


def to_headers(props: Basic.Properties) -> dict[str, str]:
    """The Tandem headers of a message published with ``props``."""
    out: dict[str, str] = {}
    table = props.headers or {}
    if table:
        out.update((str(k), t) for k, v in table.items() if (t := _text(v)) is not None and not str(k).startswith(PREFIX))
        out[TABLE] = base64.b64encode(encode.field_table(table)).decode()
    for prop in (*TEXT, *NUMBERS):
        value = getattr(props, prop, None)
        if value is not None:
            out[_name(prop)] = str(value)
    if props.timestamp is not None:
        out[_name("timestamp")] = str(int(props.timestamp.replace(tzinfo=datetime.timezone.utc).timestamp()))
    if props.expiration is not None:
        out[EXPIRATION_HEADER] = props.expiration
    return out



def route_headers(exchange: str, routing_key: str) -> dict[str, str]:
    """The headers that keep a publish's exchange and routing key (none for the default
    exchange: its routing key is the queue's name)."""
    return {EXCHANGE_HEADER: exchange, ROUTING_KEY_HEADER: routing_key} if exchange else {}


def route_of(headers: dict[str, str], queue: str) -> tuple[str, str]:
    """The exchange and routing key a delivery of ``queue`` names: where it was published."""
    return headers.get(EXCHANGE_HEADER, ""), headers.get(ROUTING_KEY_HEADER, queue)


def from_headers(headers: dict[str, str]) -> Basic.Properties:
    """The AMQP properties of a message with Tandem ``headers``."""
    kw: dict[str, Any] = {}
    for prop in TEXT:
        if (v := headers.get(_name(prop))) is not None:
            kw[prop] = v
    for prop in NUMBERS:
        v = headers.get(_name(prop))
        if v is not None and v.isdigit() and int(v) < 256:
            kw[prop] = int(v)
    ts = headers.get(_name("timestamp"))
    if ts is not None and ts.isdigit():
        kw["timestamp"] = datetime.datetime.fromtimestamp(int(ts), datetime.timezone.utc).replace(tzinfo=None)
    if (exp := headers.get(EXPIRATION_HEADER)) is not None:
        kw["expiration"] = exp
    table = _table(headers.get(TABLE))
    if table is None:
        table = {k: v for k, v in headers.items() if not k.startswith(PREFIX) and k not in (TABLE, EXPIRATION_HEADER)}
    if "x-death-reason" in headers:
        table = {**table, **_death(headers)}
    if table:
        kw["headers"] = table
    return Basic.Properties(**kw)


def _death(headers: dict[str, str]) -> dict[str, Any]:
    """A dead letter's ``x-death`` table (one death: Tandem keeps the latest) and RabbitMQ's
    ``x-first-death-*`` entries, from the headers dead-lettering set (broker.messaging.deadletter)."""
    death: dict[str, Any] = {
        "count": 1, "reason": headers["x-death-reason"], "queue": headers.get("x-death-queue", ""),
        "exchange": headers.get("x-death-exchange", ""),
        "routing-keys": [headers.get("x-death-routing-key", headers.get("x-death-queue", ""))]}
    if "x-death-original-expiration" in headers:
        death["original-expiration"] = headers["x-death-original-expiration"]
    return {"x-death": [death], "x-first-death-reason": death["reason"], "x-first-death-queue": death["queue"],
            "x-first-death-exchange": death["exchange"]}


def _table(encoded: str | None) -> dict[str, Any] | None:
    if encoded is None:
        return None
    try:
        _size, table = decode.field_table(base64.b64decode(encoded, validate=True))
    except (binascii.Error, ValueError, TypeError, KeyError, IndexError, UnicodeDecodeError):
        return None  # (not ours: a Tandem client set the header)
    return table if isinstance(table, dict) else None
