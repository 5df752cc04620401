"""The group's exchanges and bindings: the routing table every member keeps, and the changes
asked on this member.

Like the drained set (:mod:`broker.partitions.drain`), the topology is the group's state: a
change is checked and proposed by the catalogue's active (a member forwards it there,
``TopologyFwd``), committed as an entry of the catalogue's replicated log
(:class:`~storage.topology.PutExchange`, :class:`~storage.topology.DropExchange`,
:class:`~storage.topology.SetBinding`) and applied by every member, which stores it
(``Recovered.meta``: ``exchange.<name>`` and ``binding.<id>``).  A queue's delete carries the
removal of the bindings to it in the same entry.  On a single node and in shared mode a change
is one store commit.  Routing itself is :mod:`broker.messaging.exchanges` (the table) and
:mod:`broker.messaging.routed` (a publish to an exchange).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection, Mapping
from typing import Any, Protocol

import msgpack

from broker.messaging.exchanges import ExchangeTable, check_binding, check_exchange, check_name
from broker.messaging.commit import CATALOGUE
from broker.messaging.forward import MAX_HOPS, TopologyFwd, decode_reply, pack_reply
from broker.partitions.quarantine import refuse_client_write
from broker.security.security import CatalogueHost, commit_catalogue
from client.errors import (ExchangeExistsError, ExchangeNotFoundError, InvalidArgumentError, QueueNotFoundError,
                           TandemError, UnavailableError)
from storage.base import DropMeta, PutMeta, SetFeatureLevel, WriteOp
from storage.topology import BindingRecord, DropExchange, ExchangeRecord, PutExchange, SetBinding

log = logging.getLogger("tandem.broker")

EXCHANGE_KEY = "exchange."
BINDING_KEY = "binding."
#: the feature level exchanges and bindings need in a group (ha.upgrade.LEVELS)
TOPOLOGY_LEVEL = 4

TopologyOp = PutExchange | DropExchange | SetBinding


class TopologyHost(CatalogueHost, Protocol):
    def require_level(self, level: int, what: str) -> None: ...


class Levels(Protocol):
    """The group's feature level (broker.partitions.upgrade.FeatureLevels)."""

    @property
    def level(self) -> int: ...

    def apply(self, op: SetFeatureLevel) -> list[WriteOp]: ...


class Topology:
    """The exchanges and bindings as this member applied them (``table``), and the changes
    asked here."""

    def __init__(self, catalogue: TopologyHost, queues: Callable[[], Collection[str]], levels: Levels,
                 shared: Callable[[], bool]) -> None:
        self.catalogue = catalogue  # where a change is decided and committed
        self.queues = queues  # the names of the queues declared
        self.levels = levels
        self.shared = shared  # shared mode: no feature level to raise
        self.table = ExchangeTable()

    def load(self, meta: Mapping[str, str]) -> None:
        """The topology as the store recovered it (a binding to a queue or exchange gone is left out)."""
        self.table.clear()
        for k, v in sorted(meta.items()):
            if k.startswith(EXCHANGE_KEY):
                self.table.put_exchange(_exchange_in(k[len(EXCHANGE_KEY):], json.loads(v)))
        queues = set(self.queues())
        for k, v in sorted(meta.items()):
            if k.startswith(BINDING_KEY):
                b = _binding_in(json.loads(v))
                to = self.table.exchanges if b.to_exchange else queues
                if b.source in self.table.exchanges and b.destination in to:
                    self.table.bind(b)

    # -- committed changes (every member applies them) ------------------------------------------

    def apply(self, op: TopologyOp) -> list[WriteOp]:
        """Apply a committed change here; the ops to store."""
        out = self.stored(op)
        t = self.table
        if isinstance(op, PutExchange):
            t.put_exchange(op.exchange)
            log.info("exchange declared name=%s type=%s (catalogue)", op.exchange.name, op.exchange.type)
        elif isinstance(op, DropExchange):
            t.drop_exchange(op.name)
            log.info("exchange deleted name=%s (catalogue)", op.name)
        elif op.bound:
            t.bind(op.binding)
        else:
            t.unbind(op.binding)
        return out

    def stored(self, op: TopologyOp) -> list[WriteOp]:
        """The store's ops for ``op`` (before it is applied)."""
        if isinstance(op, PutExchange):
            return [PutMeta(EXCHANGE_KEY + op.exchange.name, json.dumps(_exchange_out(op.exchange)))]
        if isinstance(op, DropExchange):
            gone = [b for b in self.table.all_bindings() if b.source == op.name
                    or (b.to_exchange and b.destination == op.name)]
            return [DropMeta(EXCHANGE_KEY + op.name), *(DropMeta(BINDING_KEY + b.ident()) for b in gone)]
        if op.bound:
            return [PutMeta(BINDING_KEY + op.binding.ident(), json.dumps(_binding_out(op.binding)))]
        return [DropMeta(BINDING_KEY + op.binding.ident())]

    def unbinding(self, queue: str) -> list[WriteOp]:
        """What deleting ``queue`` removes with it: its bindings, as catalogue ops (in a group:
        they go in the delete's entry) or, on a single node, as the store's ops, applied here."""
        ops = [SetBinding(b, False) for b in self.table.bindings_to_queue(queue)]
        if self.catalogue.commit.catalogue_log:
            return list(ops)
        return [s for op in ops for s in self.apply(op)]

    def snapshot(self) -> dict[str, Any]:
        """The exchanges and bindings, for the catalogue's snapshot (left out while there are none)."""
        t = self.table
        if not t.exchanges:
            return {}
        return {"exchanges": [[e.name, e.type, e.alternate] for e in sorted(t.exchanges.values(), key=_name)],
                "bindings": [b.fields() for b in sorted(t.all_bindings(), key=BindingRecord.ident)]}

    def install(self, data: Mapping[str, Any]) -> list[WriteOp]:
        """Replace the topology with a snapshot's (decoded: "exchanges" and "bindings" records,
        none if absent); the ops to store."""
        ops: list[WriteOp] = [DropMeta(EXCHANGE_KEY + n) for n in self.table.exchanges]
        ops += [DropMeta(BINDING_KEY + b.ident()) for b in self.table.all_bindings()]
        self.table.clear()
        for e in data.get("exchanges", ()):
            ops.extend(self.apply(PutExchange(e)))
        for b in data.get("bindings", ()):
            ops.extend(self.apply(SetBinding(b, True)))
        return ops

    # -- changes asked for on this member -----------------------------------------------------------

    async def declare(self, rec: ExchangeRecord, hops: int = 0) -> bool:
        """Declare an exchange for the whole group; True if it is new.  ExchangeExistsError for
        one of that name with another type or alternate; InvalidArgumentError for a bad name or
        type, or an alternate that does not exist."""
        check_exchange(rec)

        def check() -> list[WriteOp]:
            have = self.table.exchanges.get(rec.name)
            if have is not None:
                if have != rec:
                    raise ExchangeExistsError(
                        f"exchange {rec.name!r} exists as type {have.type}, alternate {have.alternate or 'none'} "
                        f"(asked: type {rec.type}, alternate {rec.alternate or 'none'})")
                return []
            if rec.alternate is not None and rec.alternate not in self.table.exchanges:
                raise InvalidArgumentError(f"alternate exchange {rec.alternate!r}: no such exchange (declare it first: "
                                           f"a message sent there would have nowhere to go)")
            return [PutExchange(rec)]

        return await self._change(f"declare exchange {rec.name}", check, hops,
                                  TopologyFwd(hops + 1, "declare", _pack(_exchange_out(rec) | {"name": rec.name})))

    async def delete(self, name: str, if_unused: bool, hops: int = 0) -> bool:
        check_name(name)

        def check() -> list[WriteOp]:
            if name not in self.table.exchanges:
                raise ExchangeNotFoundError(f"no exchange {name!r}")
            if if_unused and self.table.bindings.get(name):
                raise InvalidArgumentError(f"exchange {name!r} is in use ({len(self.table.bindings[name])} bindings)")
            users = sorted(e.name for e in self.table.exchanges.values() if e.alternate == name)
            if users:
                raise InvalidArgumentError(f"exchange {name!r} is the alternate exchange of {', '.join(users)}: delete "
                                           f"{'those' if len(users) > 1 else 'it'} first")
            return [DropExchange(name)]

        return await self._change(f"delete exchange {name}", check, hops,
                           TopologyFwd(hops + 1, "delete", _pack({"name": name, "if_unused": if_unused})))

    async def bind(self, b: BindingRecord, bound: bool, hops: int = 0) -> bool:
        """Add (``bound``) or remove a binding for the whole group.  Binding what is bound, or
        unbinding what is not, changes nothing."""
        check_name(b.source, "source exchange")
        check_name(b.destination, "destination exchange" if b.to_exchange else "destination queue")

        def check() -> list[WriteOp]:
            source = self.table.exchanges.get(b.source)
            if source is None:
                raise ExchangeNotFoundError(f"no exchange {b.source!r}")
            check_binding(b, source.type)
            if b.to_exchange and b.destination not in self.table.exchanges:
                raise ExchangeNotFoundError(f"no exchange {b.destination!r}")
            if not b.to_exchange:
                refuse_client_write(b.destination, "bind")  # (the group alone writes the quarantine)
                if b.destination not in self.queues():
                    raise QueueNotFoundError(f"no queue {b.destination!r}")
            have = b in self.table.bindings.get(b.source, ())
            return [SetBinding(b, bound)] if have != bound else []

        verb = "bind" if bound else "unbind"
        return await self._change(f"{verb} {b.destination} to {b.source}", check, hops,
                           TopologyFwd(hops + 1, verb, _pack(_binding_out(b))))

    async def _change(self, what: str, check: Callable[[], list[WriteOp]], hops: int, fwd: TopologyFwd) -> bool:
        """Check and commit a change where the group decides it (this node, or the catalogue's
        active, which ``fwd`` goes to); returns once it is applied here, with whether it changed
        anything."""
        node = self.catalogue
        refusal = node.refusal()
        if refusal is not None:
            raise refusal
        commit = node.commit
        if not commit.catalogue_log:
            ops = check()
            store = [s for op in ops for s in self.stored(op)]  # type: ignore[arg-type]
            if ops and self.levels.level < TOPOLOGY_LEVEL and not self.shared():
                # a single node raises its own level: an older build then refuses its store
                # instead of reading it without its exchanges
                store += self.levels.apply(SetFeatureLevel(TOPOLOGY_LEVEL))
            if store:
                await commit_catalogue(node, store)
            for op in ops:
                self.apply(op)  # type: ignore[arg-type]
            return bool(ops)
        node.require_level(TOPOLOGY_LEVEL, "exchanges and bindings need")
        who = await commit.wait_active(CATALOGUE, node.election_wait)
        if who != node.config.name:
            if hops >= MAX_HOPS:
                raise UnavailableError(f"{what}: forwarded too many times while the group elects: retry")
            upto, changed = decode_reply(await node.forward(who, fwd))
        else:
            ops = check()
            if ops:
                await commit_catalogue(node, ops)
            upto, changed = node.catalogue_commit(), bool(ops)
        await node.applied(what, lambda: node.catalogue_applied() >= int(upto))
        return bool(changed)

    async def forwarded(self, req: TopologyFwd) -> bytes:
        """A member forwarded a change here (this node is the catalogue's active)."""
        try:
            f = msgpack.unpackb(req.record, raw=False)
            if type(f) is not dict:
                raise ValueError("not a map")
            hops = max(1, req.hops)
            if req.change == "declare":
                changed = await self.declare(_exchange_in(str(f["name"]), f), hops)
            elif req.change == "delete":
                changed = await self.delete(str(f["name"]), bool(f.get("if_unused")), hops)
            elif req.change in ("bind", "unbind"):
                changed = await self.bind(_binding_in(f), req.change == "bind", hops)
            else:
                raise InvalidArgumentError(f"forwarded topology change {req.change!r}: unknown")
        except TandemError:
            raise
        except Exception as exc:
            raise InvalidArgumentError(f"forwarded topology change: malformed record ({exc})") from None
        return pack_reply([self.catalogue.catalogue_commit(), changed])


def _pack(v: Any) -> bytes:
    return msgpack.packb(v, use_bin_type=True)


def _name(e: ExchangeRecord) -> str:
    return e.name


def _exchange_out(e: ExchangeRecord) -> dict[str, Any]:
    return {"type": e.type, "alternate": e.alternate}


def _exchange_in(name: str, f: Mapping[str, Any]) -> ExchangeRecord:
    alt = f.get("alternate")
    if not isinstance(f.get("type"), str) or not (alt is None or isinstance(alt, str)):
        raise InvalidArgumentError("exchange record: type must be a string, alternate a string or none")
    return ExchangeRecord(name=name, type=f["type"], alternate=alt)


def _binding_out(b: BindingRecord) -> dict[str, Any]:
    return {"source": b.source, "destination": b.destination, "to_exchange": b.to_exchange,
            "routing_key": b.routing_key, "arguments": [list(a) for a in b.arguments]}


def _binding_in(f: Any) -> BindingRecord:
    if not isinstance(f, Mapping):
        raise InvalidArgumentError("binding record: not a map")
    args = f.get("arguments") or []
    if isinstance(args, Mapping):
        args = list(args.items())
    pairs = tuple(sorted((str(k), str(v)) for k, v in args))
    src, dst, key = f.get("source"), f.get("destination"), f.get("routing_key", "")
    if not isinstance(src, str) or not isinstance(dst, str) or not isinstance(key, str):
        raise InvalidArgumentError("binding record: source, destination and routing_key must be strings")
    return BindingRecord(source=src, destination=dst, to_exchange=bool(f.get("to_exchange")), routing_key=key,
                         arguments=pairs)
