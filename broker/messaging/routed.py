"""A publish to an exchange: each message to every queue the exchange routes it to, confirmed
once every queue has it.

1. **route**: each message through the exchange (:class:`~broker.messaging.exchanges.ExchangeTable`,
   the group's copy on this member); a message no binding takes is *unroutable*: with
   ``mandatory`` the whole batch is refused before anything is stored, else it is dropped and
   counted.
2. **map**: each queue's messages to its partitions, by the queue's own data mapper (a keyless
   message of an idempotent producer by its (producer id, seq), as a publish to the queue
   would: a resend meets the first send in the same partition).
3. **store**: the parts whose partition is active here through the publish path
   (:class:`~broker.messaging.publish.Publisher`), the others in **one request per member**
   (``RoutedFwd``) that holds every queue's part active there: a fan-out to 100 queues costs
   one round trip to each member, not one per queue.  A member that finds a partition no longer
   its own forwards that part on, as a publish to the queue would.
4. **confirm**: once every part is stored; if any part failed, the client gets that error.
   Nothing is undone: the parts that were stored stay, and an idempotent producer's resend
   (the SDK's) is dropped by the partitions that hold it, so each queue ends with the message
   once.  A producer without an id may store a message twice in a queue on such a resend.

In a transaction (``tx``) every part is a prepared write of it (the forwarded request carries
the id): the parts that were stored are settled by the transaction's outcome, so a failed part
leaves nothing behind once the client aborts.  A stream among the queues refuses the batch
before anything is stored.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgpack

from broker.messaging.exchanges import MAX_ROUTING_KEY, ExchangeTable
from broker.messaging.forward import Forwarding, RoutedFwd, decode_reply, pack_reply
from broker.messaging.outcome import Outcome, Reply
from broker.messaging.publish import Publisher, PublishRequest, PublishResult, sum_parts
from broker.messaging.queues import Queue
from client.errors import ExchangeNotFoundError, InvalidArgumentError, NotActiveError, UnavailableError, \
    UnroutableError
from client.protocol.codec import decode_payload, encode
from client.protocol.frames import Publish, PublishMessage, expect


@dataclass(frozen=True, slots=True)
class RoutedRequest:
    exchange: str
    routing_key: str
    producer_id: str | None
    messages: list[PublishMessage]
    mandatory: bool = False
    #: each message's own routing key (empty: ``routing_key`` for every one)
    routing_keys: list[str] = field(default_factory=list)
    #: the transaction it is part of ("": none): each queue's part is held aside until its outcome
    tx: str = ""

    def keys(self) -> list[str]:
        """Each message's routing key; InvalidArgumentError for a list that does not fit."""
        keys = self.routing_keys or [self.routing_key] * len(self.messages)
        if len(keys) != len(self.messages):
            raise InvalidArgumentError(f"routing_keys: {len(keys)} for {len(self.messages)} messages (one each, "
                                       "or none)")
        if any(len(k) > MAX_ROUTING_KEY for k in keys):
            raise InvalidArgumentError(f"routing key: at most {MAX_ROUTING_KEY} characters")
        return keys


class RouterHost(Forwarding, Protocol):
    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...

    @property
    def queues(self) -> Mapping[str, Queue]:
        """The queues declared, by name."""
        ...


class Router:
    """Publishes to exchanges, through ``table()`` (the topology's routing table)."""

    def __init__(self, node: RouterHost, publisher: Publisher, table: Callable[[], ExchangeTable]) -> None:
        self.node, self.publisher, self.table = node, publisher, table

    def publish_to(self, req: RoutedRequest, reply: Reply[PublishResult]) -> set[tuple[str, int]]:
        """Raises at once what refuses the batch before anything is stored (no such exchange,
        an unroutable message of a mandatory batch, a stream in a transaction); ``reply`` gets
        the rest.  The (queue, partition) parts it stores to."""
        table, queues = self.table(), self.node.queues
        if req.exchange and req.exchange not in table.exchanges:
            raise ExchangeNotFoundError(f"no exchange {req.exchange!r}")
        per_queue: dict[str, list[PublishMessage]] = {}
        unroutable, nowhere = 0, ""
        for m, rk in zip(req.messages, req.keys()):
            routed = table.route(req.exchange, rk, m.headers, queues.__contains__)
            if not routed:
                unroutable += 1
                nowhere = rk
            for name in routed:
                if name in queues:
                    per_queue.setdefault(name, []).append(m)
        if unroutable and req.mandatory:
            raise UnroutableError(
                f"{unroutable} of {len(req.messages)} messages published to exchange {req.exchange!r} (routing key "
                f"{nowhere!r}{' and others' if unroutable > 1 else ''}) are routed to no queue (mandatory): nothing of "
                f"the batch was stored")
        if req.tx:
            streams = sorted(name for name in per_queue if queues[name].stream)
            if streams:
                raise InvalidArgumentError(
                    f"exchange {req.exchange!r} routes to stream {streams[0]!r}: a transaction may not publish to "
                    f"one (its readers read by offset, with no outcome to wait for); nothing of the batch was stored")
        written: set[tuple[str, int]] = set()
        parts: list[Outcome[PublishResult] | Coroutine[Any, Any, PublishResult]] = []
        remote: dict[str, list[tuple[Queue, int, list[PublishMessage]]]] = {}
        commit = self.node.commit
        for name, msgs in per_queue.items():
            q = queues[name]
            for pidx, pm in _by_partition(q, req.producer_id, msgs).items():
                written.add((name, pidx))
                key = (q.meta.id, pidx)
                who = None if commit.serving(key) else commit.active_of(key)
                if who is None or who == self.node.config.name:
                    parts.append(self._here(PublishRequest(name, req.producer_id, pm, partition=pidx, tx=req.tx)))
                else:
                    remote.setdefault(who, []).append((q, pidx, pm))
        for who, items in remote.items():
            parts.append(self._there(who, req.producer_id, items, req.tx))
        outcome: Outcome[PublishResult] = Outcome()
        named = sorted(per_queue) if req.tx else []  # (the client's commit names them)
        outcome.add_done_callback(lambda o: _settle(o, reply, unroutable, named))
        if all(isinstance(p, Outcome) for p in parts):
            _sum_settled(parts, outcome)  # (all here: confirmed in the commit's own callback)
        else:
            self.node.spawn(sum_parts(parts, outcome))
        return written

    def _here(self, req: PublishRequest) -> Outcome[PublishResult]:
        try:
            return self.publisher.publish(req)  # (a partition active elsewhere by now: forwarded there)
        except Exception as exc:
            return Outcome.failed(exc)

    async def _there(self, who: str, producer_id: str | None, items: list[tuple[Queue, int, list[PublishMessage]]],
                     tx: str) -> PublishResult:
        """One request to member ``who`` for every part active there, each message in it once
        however many of its queues are there; where the link fails, each part goes its own way
        (the publish path waits for its partition's active)."""
        index: dict[int, int] = {}
        msgs: list[PublishMessage] = []
        parts = []
        for q, pidx, pm in items:
            for m in pm:
                if id(m) not in index:
                    index[id(m)] = len(msgs)
                    msgs.append(m)
            parts.append([q.name, pidx, [index[id(m)] for m in pm]])
        frame = encode(Publish(rid=0, queue="", messages=msgs, producer_id=producer_id, tx=tx))[4:]
        try:
            stored, duplicates = decode_reply(await self.node.forward(
                who, RoutedFwd(1, producer_id or "", frame, msgpack.packb(parts, use_bin_type=True))))
            return PublishResult(int(stored), int(duplicates))
        except (UnavailableError, NotActiveError):
            if producer_id is None:
                raise
        total = PublishResult(0, 0)
        for q, pidx, pm in items:  # (a resend: what reached the partitions is dropped there)
            r = await self.publisher.publish(PublishRequest(q.name, producer_id, pm, partition=pidx, hops=1, tx=tx))
            total = PublishResult(total.stored + r.stored, total.duplicates + r.duplicates)
        return total

    async def forwarded(self, req: RoutedFwd) -> bytes:
        """Another member's parts of a routed publish, for partitions active here."""
        try:
            publish = expect(decode_payload(req.frame), Publish)
            msgs = publish.messages
            parts = msgpack.unpackb(req.parts, raw=False)
            if type(parts) is not list:
                raise ValueError("parts is not an array")
            reqs = []
            for part in parts:
                if type(part) is not list or len(part) != 3 or type(part[0]) is not str or type(part[1]) is not int \
                        or type(part[2]) is not list or not all(type(i) is int for i in part[2]):
                    raise ValueError("a part is not [queue, partition, [message index, ...]]")
                reqs.append(PublishRequest(part[0], req.producer_id or None, [msgs[i] for i in part[2]],
                                           partition=part[1], hops=max(1, req.hops), tx=publish.tx))
        except InvalidArgumentError:
            raise
        except Exception as exc:
            raise InvalidArgumentError(f"forwarded PUBLISH_ROUTED: {exc}") from None
        out: Outcome[PublishResult] = Outcome()
        await sum_parts([self._here(r) for r in reqs], out)
        r = await out
        return pack_reply([r.stored, r.duplicates])


def _by_partition(q: Queue, producer_id: str | None, msgs: list[PublishMessage]) -> dict[int, list[PublishMessage]]:
    out: dict[int, list[PublishMessage]] = {}
    for m, pidx in zip(msgs, Publisher.route(q, PublishRequest(q.name, producer_id, msgs))):
        out.setdefault(pidx, []).append(m)
    return out


def _sum_settled(parts: list[Any], out: Outcome[PublishResult]) -> None:
    """Every part is an Outcome: settle ``out`` in the call that settles the last of them."""
    left = [len(parts)]

    def one(_o: Outcome[PublishResult]) -> None:
        left[0] -= 1
        if left[0]:
            return
        error = next((p.exception() for p in parts if p.exception() is not None), None)
        if error is not None:
            out.set_exception(error)
        else:
            out.set_result(PublishResult(sum(p.result().stored for p in parts),
                                         sum(p.result().duplicates for p in parts)))

    if not parts:
        out.set_result(PublishResult(0, 0))
    for p in parts:
        p.add_done_callback(one)


def _settle(o: Outcome[PublishResult], reply: Reply[PublishResult], unroutable: int, routed: list[str]) -> None:
    if reply.done():
        return
    err = o.exception()
    if err is not None:
        reply.set_exception(err)
    else:
        r = o.result()
        reply.set_result(PublishResult(r.stored, r.duplicates, unroutable=unroutable, queues=routed))
