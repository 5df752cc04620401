"""The requests other members forward here: one handler per :class:`~broker.messaging.forward.ForwardKind`.

:meth:`ForwardHandlers.handle` decodes the typed request (:func:`broker.messaging.forward.decode_request`)
and calls the handler the table names; each handler's reply is the ``ForwardOk`` payload the
request's docstring in :mod:`broker.messaging.forward` describes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from broker.peers.links import Link
from broker.sessions import status
from broker.sessions.relay import Relays
from broker.messaging.catalogue import Catalogue
from broker.node.parts import PartitionOps
from broker.partitions.members import GroupMembers
from broker.security.security import Security
from broker.messaging.offsets import fetch_offset, store_offset
from broker.messaging.streams import StreamHost, produced, read_stream
from broker.messaging.forward import (CatalogueFwd, DeclareFwd, DeleteFwd, DepthFwd, DrainFwd, ForwardKind, ForwardRequest,
                            GroupFwd, MoveFwd, OptionFwd, RemapFwd, AuditFwd, PartitionStatsFwd, PublishFwd, PurgeFwd,
                            OffsetFwd, ProducedFwd, ReadFwd, RELAY_KINDS, RestoreFwd, UpgradeFwd, decode_request, pack_reply)
from broker.messaging.publish import Publisher, PublishRequest
from broker.messaging.routed import Router
from broker.messaging.declare import validate_declare
from client.protocol.codec import decode_payload, encode
from client.protocol.frames import Declare, Publish, ReadOk, expect


class ForwardedHost(Protocol):
    """What the forwarded requests read of their node itself.  The catalogue and the group's
    members are read at each request: the node makes them anew (shared mode's lock taken, a
    join by seeds alone)."""

    @property
    def catalogue(self) -> Catalogue: ...

    @property
    def group(self) -> GroupMembers: ...

    def catalogue_commit(self) -> int: ...


Handler = Callable[[Any], Awaitable[bytes]]


class ForwardHandlers:
    """The forwarded requests' handlers, each handed the part of the node that serves it: the
    status helpers read it through :mod:`broker.sessions.status`'s protocols, stream reads
    through ``streams`` (broker.messaging.streams), the group operations are their own parts'."""

    def __init__(self, node: ForwardedHost, *, state: status.NodeState, options: status.Options,
                 report: status.NodeReport, changes: status.GroupChanges, streams: StreamHost, publisher: Publisher,
                 security: Security, ops: PartitionOps, router: Router, relays: Relays,
                 book: Callable[[], list[str]]) -> None:
        self.node, self.relays, self.router, self.topology = node, relays, router, ops.topology
        #: "name=host:port" of every member whose peer address this node knows (broker.peers.discovery)
        self.book = book
        self.state, self.options, self.report, self.changes = state, options, report, changes
        self.streams, self.publisher, self.security = streams, publisher, security
        self.drains, self.moves, self.remaps, self.restores = ops.drains, ops.moves, ops.remaps, ops.restores
        self.levels, self.transactions = ops.levels, ops.transactions
        self.table: dict[ForwardKind, Handler] = {
            ForwardKind.PUBLISH: self._publish,
            ForwardKind.DECLARE: self._declare,
            ForwardKind.DELETE: self._delete,
            ForwardKind.CATALOGUE: self._catalogue,
            ForwardKind.STATUS: self._status,
            ForwardKind.PARTITION_STATS: self._partition_stats,
            ForwardKind.QUEUE_STATS: self._queue_stats,
            ForwardKind.OPTION: self._option,
            ForwardKind.READ: self._read,
            ForwardKind.DEPTH: self._depth,
            ForwardKind.PURGE: self._purge,
            ForwardKind.USER_PUT: self._security,
            ForwardKind.USER_DROP: self._security,
            ForwardKind.ACL_GRANT: self._security,
            ForwardKind.ACL_REVOKE: self._security,
            ForwardKind.DRAIN: self._drain,
            ForwardKind.MOVE: self._move,
            ForwardKind.GROUP: self._group,
            ForwardKind.REMAP: self._remap,
            ForwardKind.AUDIT: self._audit,
            ForwardKind.MEMBERS: self._members,
            ForwardKind.RESTORE: self._restore,
            ForwardKind.PRODUCED: self._produced,
            ForwardKind.OFFSET: self._offset,
            ForwardKind.UPGRADE: self._upgrade,
            ForwardKind.TOPOLOGY: lambda req: self.topology.forwarded(req),
            ForwardKind.PUBLISH_ROUTED: lambda req: self.router.forwarded(req),
            ForwardKind.TX: lambda req: self.transactions.forwarded(req),
            ForwardKind.TX_RESOLVE: lambda req: self.transactions.forwarded(req),
        }

    async def handle(self, link: Link, kind: int, payload: bytes) -> bytes:
        req: ForwardRequest = decode_request(kind, payload)
        if req.KIND in RELAY_KINDS:  # (bound to the link they came over: broker.sessions.relay)
            return await self.relays.handle(link, req)
        return await self.table[req.KIND](req)

    async def _publish(self, req: PublishFwd) -> bytes:
        frame = expect(decode_payload(req.frame), Publish)
        r = await self.publisher.publish(PublishRequest(
            frame.queue, frame.producer_id, frame.messages, partition=req.partition,
            dense=frame.partition is not None, hops=max(1, req.hops), tx=frame.tx))
        return pack_reply([r.stored, r.duplicates, r.last_seq])

    async def _declare(self, req: DeclareFwd) -> bytes:
        decl = expect(decode_payload(req.frame), Declare)
        validate_declare(decl)
        _info, created = await self.node.catalogue.declare(decl, max(1, req.hops), owner=req.owner or None)
        return pack_reply(created)

    async def _delete(self, req: DeleteFwd) -> bytes:
        await self.node.catalogue.delete(req.queue, req.if_empty, max(1, req.hops), req.ready_only)
        return b""

    async def _security(self, req: ForwardRequest) -> bytes:
        return await self.security.forwarded(req)

    async def _drain(self, req: DrainFwd) -> bytes:
        return await self.drains.forwarded(req)

    async def _upgrade(self, req: UpgradeFwd) -> bytes:
        return await self.levels.forwarded(req)

    async def _move(self, req: MoveFwd) -> bytes:
        return await self.moves.forwarded(req)

    async def _group(self, req: GroupFwd) -> bytes:
        return await self.node.group.forwarded(req)

    async def _remap(self, req: RemapFwd) -> bytes:
        return await self.remaps.forwarded(req)

    async def _audit(self, req: AuditFwd) -> bytes:
        return pack_reply(self.remaps.view(req.queue))

    async def _restore(self, req: RestoreFwd) -> bytes:
        return await self.restores.forwarded(req)

    async def _produced(self, req: ProducedFwd) -> bytes:
        return (await produced(self.streams, req.queue, req.partition, req.producer, req.offset,
                               hops=max(1, req.hops))).pack()

    async def _offset(self, req: OffsetFwd) -> bytes:
        hops = max(1, req.hops)
        if req.store:
            await store_offset(self.streams, req.queue, req.partition, req.consumer, req.offset, hops=hops)
            return pack_reply([True, req.offset])
        offset = await fetch_offset(self.streams, req.queue, req.partition, req.consumer, hops=hops)
        return pack_reply([offset is not None, offset or 0])

    async def _members(self, _req: Any) -> bytes:
        return pack_reply(self.book())

    async def _catalogue(self, req: CatalogueFwd) -> bytes:
        return pack_reply(self.node.catalogue_commit())

    async def _status(self, _req: Any) -> bytes:
        return encode(status.status_of(self.report, self.changes, 0))[4:]

    async def _partition_stats(self, req: PartitionStatsFwd) -> bytes:
        return status.pstats_payload(self.state, req.queue, req.partition)

    async def _queue_stats(self, _req: Any) -> bytes:
        return pack_reply(status.queue_counters(self.state))

    async def _option(self, req: OptionFwd) -> bytes:
        status.apply_option(self.options, req.option, req.value, f"{req.by} via a member")
        return b""

    async def _read(self, req: ReadFwd) -> bytes:
        msgs, nxt, end = await read_stream(self.streams, req.queue, req.partition, req.offset, req.max_messages,
                                           start=req.start, timestamp=req.timestamp, hops=max(1, req.hops))
        return encode(ReadOk(rid=0, messages=msgs, next_offset=nxt, end_offset=end))[4:]

    async def _depth(self, req: DepthFwd) -> bytes:
        cat = self.node.catalogue
        return pack_reply(cat.partition_depth(cat.served(req.queue, req.partition), req.partition, req.ready_only))

    async def _purge(self, req: PurgeFwd) -> bytes:
        cat = self.node.catalogue
        return pack_reply(await cat.purge_partition(cat.served(req.queue, req.partition), req.partition))
