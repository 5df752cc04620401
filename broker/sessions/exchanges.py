"""A client session's requests on exchanges and bindings: declare, delete, bind, unbind, list.

Exchanges share the queues' namespace of permissions (broker.security.acl): declaring or
deleting an exchange needs ``configure`` on its name; a binding needs ``configure`` on its
destination and ``consume`` on its source (it takes what is published there), as RabbitMQ asks
write on the queue and read on the exchange; publishing to an exchange needs ``produce`` on it.
A binding to the quarantine queue is refused as a publish to it is.  Each change also needs the
node's quorum.  The changes themselves are the group's (broker.partitions.topology).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from broker.partitions.topology import Topology
from broker.security.acl import AclTable
from broker.sessions.requests import Handler
from client.protocol.frames import (Bind, BindingInfo, DeclareExchange, DeclareExchangeOk, DeleteExchange,
                                    ExchangeInfo, Exchanges as ExchangesFrame, Frame, ListExchanges, Ok, Unbind)
from storage.base import UserRecord
from storage.topology import BindingRecord, ExchangeRecord


class Replying(Protocol):
    def send(self, frame: Frame) -> None: ...


class ExchangeHost(Protocol):
    @property
    def acls(self) -> AclTable: ...

    def require_quorum(self, what: str) -> None: ...


class Exchanges:
    """The handlers of the requests on exchanges and bindings."""

    def __init__(self, node: ExchangeHost, topology: Topology) -> None:
        self.node, self.topology = node, topology

    def handlers(self) -> Mapping[type[Frame], Handler[Any]]:
        return {DeclareExchange: self.declare, DeleteExchange: self.delete, Bind: self.bind, Unbind: self.unbind,
                ListExchanges: self.list}

    def _may(self, user: UserRecord, permission: str, name: str, what: str | None = None) -> None:
        self.node.acls.check(user, permission, name)
        if what is not None:
            self.node.require_quorum(what)

    async def declare(self, s: Replying, user: UserRecord, f: DeclareExchange) -> None:
        self._may(user, "configure", f.exchange, "declare exchanges")
        created = await self.topology.declare(ExchangeRecord(name=f.exchange, type=f.type, alternate=f.alternate))
        s.send(DeclareExchangeOk(rid=f.rid, created=created))

    async def delete(self, s: Replying, user: UserRecord, f: DeleteExchange) -> None:
        self._may(user, "configure", f.exchange, "delete exchanges")
        await self.topology.delete(f.exchange, f.if_unused)
        s.send(Ok(rid=f.rid))

    async def bind(self, s: Replying, user: UserRecord, f: Bind) -> None:
        await self._bind(s, user, f, True)

    async def unbind(self, s: Replying, user: UserRecord, f: Unbind) -> None:
        await self._bind(s, user, f, False)

    async def _bind(self, s: Replying, user: UserRecord, f: Bind | Unbind, bound: bool) -> None:
        self._may(user, "consume", f.source)
        self._may(user, "configure", f.destination, "change bindings")
        await self.topology.bind(BindingRecord(source=f.source, destination=f.destination, to_exchange=f.to_exchange,
                                               routing_key=f.routing_key,
                                               arguments=tuple(sorted(f.arguments.items()))), bound)
        s.send(Ok(rid=f.rid))

    async def list(self, s: Replying, user: UserRecord, f: ListExchanges) -> None:
        t, acls = self.topology.table, self.node.acls
        out = []
        for e in sorted(t.exchanges.values(), key=lambda e: e.name):
            if not acls.may_see(user, e.name):
                continue
            bindings = [BindingInfo(b.source, b.destination, b.to_exchange, b.routing_key, dict(b.arguments))
                        for b in sorted(t.bindings.get(e.name, ()), key=BindingRecord.ident)]
            out.append(ExchangeInfo(e.name, e.type, e.alternate, bindings))
        s.send(ExchangesFrame(rid=f.rid, exchanges=out))
