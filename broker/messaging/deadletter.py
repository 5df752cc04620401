"""Where a dead-lettered message goes (broker.messaging.delivery moves it there).

* A queue with a ``dead_letter_queue``: into that queue.
* A queue with a ``dead_letter_exchange``: into every queue that exchange routes it to, with
  the queue's ``dead_letter_routing_key``, else the routing key the message was published with
  (its ``amqp-routing-key`` header, else its queue's name: the default exchange's key), as
  RabbitMQ's dead-letter exchanges do.  The copy names that exchange and routing key as where
  it was published (what an AMQP ``basic.deliver`` of it says).  Every dead letter carries
  ``x-death-reason``, ``-queue``, ``-id``, ``-exchange`` and ``-routing-key`` (where it was
  published first) and ``x-death-original-expiration`` if it had one: an AMQP consumer gets them
  as RabbitMQ's ``x-death`` table (broker.amqp.properties).  A message rejected by a client
  may be routed back into its own queue; one that expired or was shed is not (it would come
  back for ever), as RabbitMQ drops such a cycle.

The queue's owner (the user who declared it) must hold ``produce`` on the dead-letter queue or
the exchange (broker.security.acl).  A message with nowhere to go (no such queue or exchange,
no binding takes it, the owner may not) is dropped, and the caller logs why.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from broker.messaging.message import EXCHANGE_HEADER, EXPIRATION_HEADER, ROUTING_KEY_HEADER, TIMING_HEADERS, Msg
from broker.messaging.queues import Queue


class Routing(Protocol):
    """The node's queues and exchanges, as dead-lettering reads them."""

    @property
    def queues(self) -> dict[str, Queue]: ...

    def route(self, exchange: str, routing_key: str, headers: Mapping[str, str]) -> tuple[str, ...]:
        """The queues a message published to ``exchange`` goes to (() if none or no such exchange)."""
        ...

    def has_exchange(self, name: str) -> bool: ...


@dataclass(frozen=True, slots=True)
class Destination:
    """The queues a dead letter goes to (none: dropped, ``why`` says why where that is news),
    and its headers there."""

    queues: list[Queue]
    headers: dict[str, str]
    why: str | None = None


def destination(src: Queue, m: Msg, reason: str, host: Routing,
                refusal: Callable[[str], str | None]) -> Destination:
    """Where ``m``, dead-lettered from ``src`` for ``reason``, goes; ``refusal(target)``: why the
    queue's owner may not write to ``target`` (a queue or exchange name), None if it may."""
    # (its timing headers stay behind: it is ready at once where it goes, and does not expire
    # there again, as RabbitMQ drops a dead-lettered message's expiration)
    headers = {**{k: v for k, v in m.headers.items() if k not in TIMING_HEADERS},
               "x-death-reason": reason, "x-death-queue": src.name, "x-death-id": m.id,
               "x-death-exchange": m.headers.get(EXCHANGE_HEADER, ""),
               "x-death-routing-key": m.headers.get(ROUTING_KEY_HEADER, src.name)}
    if EXPIRATION_HEADER in m.headers:
        headers["x-death-original-expiration"] = m.headers[EXPIRATION_HEADER]
    meta = src.meta
    if meta.dead_letter_exchange is not None:
        exchange = meta.dead_letter_exchange
        key = meta.dead_letter_routing_key
        if key is None:
            key = m.headers.get(ROUTING_KEY_HEADER, src.name)
        headers[EXCHANGE_HEADER], headers[ROUTING_KEY_HEADER] = exchange, key
        refused = refusal(exchange)
        if refused is not None:
            return Destination([], headers, f"exchange {exchange} {refused}")
        if not host.has_exchange(exchange):
            return Destination([], headers, f"exchange {exchange} missing")
        names = [n for n in host.route(exchange, key, headers) if n != src.name or reason == "rejected"]
        queues = [host.queues[n] for n in names if n in host.queues]
        return Destination(queues, headers, None if queues else f"exchange {exchange} routes it to no queue "
                                                                f"(routing key {key!r})")
    if not meta.dead_letter_queue:
        return Destination([], headers)
    dlq = host.queues.get(meta.dead_letter_queue)
    if dlq is None:
        return Destination([], headers, f"dead-letter queue {meta.dead_letter_queue} missing")
    refused = refusal(dlq.name)
    if refused is not None:
        return Destination([], headers, f"dead-letter queue {dlq.name} {refused}")
    return Destination([dlq], headers)
