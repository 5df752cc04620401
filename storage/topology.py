"""The records of the group's routing topology: exchanges and the bindings between them and
queues, and the catalogue ops that change them.

The ops travel on the catalogue's replicated log (or, on a single node and in shared mode,
straight from the catalogue's change to the store); each node turns a committed op into
``PutMeta`` / ``DropMeta`` rows (``Recovered.meta``, keys ``exchange.<name>`` and
``binding.<id>``: broker.messaging.topology), so stores never see these ops.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

#: the exchange types, as AMQP 0-9-1 has them
EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers")


@dataclass(frozen=True, slots=True, kw_only=True)
class ExchangeRecord:
    """An exchange: where publishes to it go is its bindings' business (``type``); what
    none of them takes goes to ``alternate`` (an exchange), if set."""

    name: str
    type: str
    alternate: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class BindingRecord:
    """Messages published to exchange ``source`` that match go to ``destination``: a queue,
    or an exchange (``to_exchange``) that routes them again.  ``routing_key``: the key (a
    ``direct`` exchange) or pattern (``topic``) to match; ``arguments``: a ``headers``
    exchange's headers to match and its ``x-match`` (``all`` or ``any``)."""

    source: str
    destination: str
    to_exchange: bool = False
    routing_key: str = ""
    arguments: tuple[tuple[str, str], ...] = ()

    def fields(self) -> list[object]:
        """As a log op and a snapshot carry it: ``[source, destination, to_exchange, routing_key,
        arguments as [[key, value], ...]]``."""
        return [self.source, self.destination, self.to_exchange, self.routing_key, [list(a) for a in self.arguments]]

    def ident(self) -> str:
        """A name for the binding, the same on every node (its store key)."""
        raw = json.dumps([self.source, self.destination, self.to_exchange, self.routing_key,
                          [list(a) for a in self.arguments]], separators=(",", ":"))
        return hashlib.sha1(raw.encode()).hexdigest()[:20]


@dataclass(frozen=True, slots=True)
class PutExchange:
    """Catalogue only: declare ``exchange``."""

    exchange: ExchangeRecord


@dataclass(frozen=True, slots=True)
class DropExchange:
    """Catalogue only: delete exchange ``name``, and every binding from or to it."""

    name: str


@dataclass(frozen=True, slots=True)
class SetBinding:
    """Catalogue only: add ``binding`` (``bound``) or remove it."""

    binding: BindingRecord
    bound: bool
