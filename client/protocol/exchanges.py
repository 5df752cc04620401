"""Frames of exchanges and bindings (protocol version 4): declare, delete, bind, unbind, list.

A publish to an exchange is a ``Publish`` with ``exchange`` set (client.protocol.messaging).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from client.protocol.base import Frame, Op, Record


@dataclass(slots=True)
class BindingInfo(Record):
    """Messages published to ``source`` that match go to ``destination`` (an exchange when
    ``to_exchange``); ``routing_key``: the key or topic pattern; ``arguments``: a headers
    exchange's headers to match, with ``x-match`` (``all`` / ``any``)."""

    source: str
    destination: str
    to_exchange: bool
    routing_key: str
    arguments: dict[str, str]


@dataclass(slots=True)
class ExchangeInfo(Record):
    name: str
    type: str
    alternate: str | None
    bindings: list[BindingInfo]


@dataclass(frozen=True, slots=True, kw_only=True)
class DeclareExchange(Frame):
    """Declare an exchange: ``type`` direct, fanout, topic or headers; ``alternate``: the
    exchange that gets what none of its bindings take (it must exist)."""

    OP: ClassVar[Op] = Op.DECLARE_EXCHANGE
    rid: int
    exchange: str
    type: str = "direct"
    alternate: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class DeclareExchangeOk(Frame):
    OP: ClassVar[Op] = Op.DECLARE_EXCHANGE_OK
    rid: int
    created: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteExchange(Frame):
    """Delete an exchange and every binding from or to it; ``if_unused``: refused while it
    has bindings of its own."""

    OP: ClassVar[Op] = Op.DELETE_EXCHANGE
    rid: int
    exchange: str
    if_unused: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Bind(Frame):
    """Bind ``destination`` (a queue, or an exchange with ``to_exchange``) to exchange
    ``source``; answered by ``Ok``.  Binding what is bound already changes nothing."""

    OP: ClassVar[Op] = Op.BIND
    rid: int
    source: str
    destination: str
    to_exchange: bool = False
    routing_key: str = ""
    arguments: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class Unbind(Bind):
    """Remove a binding (the same fields as its ``Bind``); answered by ``Ok``."""

    OP: ClassVar[Op] = Op.UNBIND


@dataclass(frozen=True, slots=True, kw_only=True)
class ListExchanges(Frame):
    OP: ClassVar[Op] = Op.LIST_EXCHANGES
    rid: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Exchanges(Frame):
    OP: ClassVar[Op] = Op.EXCHANGES
    rid: int
    exchanges: list[ExchangeInfo] = field(default_factory=list)
