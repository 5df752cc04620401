"""In-process clients of a harness group, and the ledger they keep.

* :class:`Producer`: publishes numbered messages with its producer id (idempotent producers),
  one batch at a time, at a live member of its choice (which forwards to the partition's
  active when it is not), and resends the batch, with the same sequence numbers, until it is
  confirmed: after an error, or after ``PUBLISH_TIMEOUT`` without an answer (the member was
  killed, or is cut off).
* :class:`Pipelined`: the plain SDK producer's way, several batches in flight and no resend of its
  own (the node resends a batch to a partition's new active); each batch at a live member of
  its choice, so batches also reach a partition by different routes.
* :class:`Consumer`: subscribed on every live member (each member delivers the partitions it
  is active for), as a client session is: a delivery counts (``Delivery.record_deliveries``),
  its delivered mark is committed before the application sees it, and a mark that fails to
  commit undoes the delivery (``broker.messaging.delivery.Delivery.undeliver``); the application acks
  each message after a while.  A killed member's subscription dies with it; the consumer
  subscribes again once the member is back.
* :class:`Ledger`: what was sent, confirmed and delivered, and :meth:`Ledger.violations`, the
  invariants a finished run must keep.

A message's body names its producer and sequence number (``p1:17``), so every delivery can
be traced to one send.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from broker.messaging.message import Msg
from broker.messaging.queues import Consumer as NodeConsumer
from client.errors import TandemError
from client.protocol.frames import PublishMessage
from tests.harness.group import Group, Member
from tests.harness.runtime import Life

PUBLISH_TIMEOUT = 2.0  # virtual seconds without an answer before a batch is sent again
RETRY_PAUSE = 0.1


@dataclass(frozen=True, slots=True)
class Delivered:
    consumer: str
    node: str
    partition: int
    offset: int
    key: str | None
    body: bytes
    dc: int  # the delivery count the node gave it (> 1: redelivered)


@dataclass
class Ledger:
    """Everything the clients of one run saw."""

    sent: dict[bytes, str | None] = field(default_factory=dict)  # body -> key, for every message sent
    confirmed: set[bytes] = field(default_factory=set)
    deliveries: list[Delivered] = field(default_factory=list)
    acked: set[tuple[int, int]] = field(default_factory=set)  # (partition, offset) acked at least once
    errors: Counter[str] = field(default_factory=Counter)  # publish errors by kind (expected ones: retried)
    unexpected: list[str] = field(default_factory=list)  # what a node raised that is no TandemError

    def unacked_confirmed(self) -> set[bytes]:
        """Confirmed messages not yet delivered and acked (what a drain waits for)."""
        done = {d.body for d in self.deliveries if (d.partition, d.offset) in self.acked}
        return self.confirmed - done

    def violations(self) -> list[str]:
        """What this run broke, in words (empty: nothing).  The invariants, over the whole queue:

        1. *no confirmed message lost*: every confirmed message was delivered at least once from
           where it stays: a delivery from a (partition, offset) that later held another message
           (a deposed active's log, overwritten) does not count;
        2. *stored once*: every message sent sits at one place, one (partition, offset), however
           often its batch was resent (idempotent producers);
        3. *redeliveries are marked*: a (partition, offset) delivered again has a delivery count
           above 1 (the node committed its delivered mark before the first delivery left), and
           the same message body each time;
        4. *nothing unexpected*: every delivery is of a message a producer sent, with its key, and
           a publish fails, if it does, with a :class:`client.errors.TandemError` (retried).

        At-least-once allows the rest: a message delivered again after a kill, a failover or a
        lost ack, and unconfirmed messages (their batch was resent until confirmed) delivered."""
        out: list[str] = list(self.unexpected)
        last = {(d.partition, d.offset): d.body for d in self.deliveries}
        kept = {d.body for d in self.deliveries if last[(d.partition, d.offset)] == d.body}
        lost = sorted(self.confirmed - kept)
        if lost:
            out.append(f"{len(lost)} confirmed message(s) lost (never delivered from where they stay): {_few(lost)}")
        places: dict[bytes, set[tuple[int, int]]] = {}
        first: dict[tuple[int, int], Delivered] = {}
        for d in self.deliveries:
            if d.body not in self.sent or self.sent[d.body] != d.key:
                out.append(f"unexpected delivery {d}")
                continue
            places.setdefault(d.body, set()).add((d.partition, d.offset))
            seen = first.get((d.partition, d.offset))
            if seen is None:
                first[(d.partition, d.offset)] = d
            elif seen.body != d.body:
                out.append(f"{d.partition}/{d.offset} delivered as {seen.body!r} and as {d.body!r}")
            elif d.dc < 2:
                out.append(f"{d.body!r} at {d.partition}/{d.offset} delivered again by {d.node} with delivery "
                           f"count {d.dc} (first by {seen.node}): a redelivery not marked as one")
        twice = sorted(b for b, at in places.items() if len(at) > 1)
        if twice:
            out.append(f"{len(twice)} message(s) stored more than once: "
                       + ", ".join(f"{b!r} at {sorted(places[b])}" for b in twice[:5]))
        return out

    def summary(self) -> str:
        redelivered = len(self.deliveries) - len({(d.partition, d.offset) for d in self.deliveries})
        return (f"sent {len(self.sent)}, confirmed {len(self.confirmed)}, delivered {len(self.deliveries)} "
                f"({redelivered} again), errors {dict(self.errors)}")


def _few(bodies: list[bytes]) -> str:
    return ", ".join(b.decode() for b in bodies[:8]) + (" ..." if len(bodies) > 8 else "")


class Producer:
    """Sends up to ``total`` messages in batches of 1..``max_batch``, pausing up to ``pause``
    virtual seconds between batches, until told to ``stop``; keys ``k0``..``k{keys-1}``.  Half
    of its batches go to a member that is active for a partition of the queue (as a durable
    connection sends to the actives), the others to any live member."""

    def __init__(self, group: Group, ledger: Ledger, queue: str, producer_id: str, rng: random.Random, *,
                 total: int, max_batch: int = 5, pause: float = 0.2, keys: int = 8) -> None:
        self.group, self.ledger, self.queue, self.id, self.rng = group, ledger, queue, producer_id, rng
        self.total, self.max_batch, self.pause, self.keys = total, max_batch, pause, keys
        self.next_seq = 0
        self.stop = False  # no new batch after this (the one under way is sent until confirmed)
        self.done = False

    async def run(self) -> None:
        clock = self.group.clock
        while self.next_seq < self.total and not self.stop:
            n = min(self.rng.randint(1, self.max_batch), self.total - self.next_seq)
            batch = []
            for seq in range(self.next_seq, self.next_seq + n):
                body = f"{self.id}:{seq}".encode()
                key = f"k{self.rng.randrange(self.keys)}"
                self.ledger.sent[body] = key
                batch.append(PublishMessage(key, {}, body, seq))
            await self._until_confirmed(batch)
            self.next_seq += n
            await clock.sleep(self.rng.uniform(0.0, self.pause))
        self.done = True

    async def _until_confirmed(self, batch: list[PublishMessage]) -> None:
        g, clock = self.group, self.group.clock
        while True:
            alive = g.alive()
            if not alive:
                await clock.sleep(RETRY_PAUSE)
                continue
            actives = [m for m in alive if self._active(m)]
            m = self.rng.choice(actives if actives and self.rng.random() < 0.5 else alive)
            try:
                outcome = g.publish(m, self.queue, self.id, batch)
                async with clock.timeout(PUBLISH_TIMEOUT):
                    await outcome
            except TandemError as exc:
                self.ledger.errors[type(exc).__name__] += 1
            except TimeoutError:
                self.ledger.errors["timeout"] += 1
            except Exception as exc:
                self.ledger.unexpected.append(f"a publish at {m.name} raised {exc!r}")
                raise
            else:
                self.ledger.confirmed.update(pm.body for pm in batch)
                return
            await clock.sleep(RETRY_PAUSE * (1 + self.rng.random()))


    def _active(self, m: Member) -> bool:
        """Whether ``m`` serves a partition of the queue."""
        node = m.node
        q = node.catalogue.queues.get(self.queue) if node is not None else None
        rep = node.ha.replication if node is not None else None
        return q is not None and rep is not None and any(rep.serving((q.meta.id, i)) for i in range(q.meta.partitions))


class Pipelined:
    """The plain SDK producer's way: up to ``in_flight`` batches out at once, each at a live member
    of its choice, with one sequence over all partitions, and no resend: a batch that fails stays
    unconfirmed (the node resends it to a partition's new active itself).  Keyless messages, so
    they spread by (producer id, seq)."""

    def __init__(self, group: Group, ledger: Ledger, queue: str, producer_id: str, rng: random.Random, *,
                 total: int, in_flight: int = 4, max_batch: int = 5, pause: float = 0.05) -> None:
        self.group, self.ledger, self.queue, self.id, self.rng = group, ledger, queue, producer_id, rng
        self.total, self.in_flight, self.max_batch, self.pause = total, in_flight, max_batch, pause
        self.stop = False
        self.done = False
        self._out: dict[int, float] = {}  # batches in flight: number -> when to stop waiting for it

    async def run(self) -> None:
        g, clock = self.group, self.group.clock
        seq = number = 0
        while (seq < self.total and not self.stop) or self._out:
            now = clock.monotonic()
            for k in [k for k, until in self._out.items() if until < now]:
                del self._out[k]  # (its member died or is cut off: it may still settle)
            alive = g.alive()
            if seq >= self.total or self.stop or not alive or len(self._out) >= self.in_flight:
                await clock.sleep(RETRY_PAUSE)
                continue
            n = min(self.rng.randint(1, self.max_batch), self.total - seq)
            batch = [PublishMessage(None, {}, f"{self.id}:{s}".encode(), s) for s in range(seq, seq + n)]
            seq += n
            for pm in batch:
                self.ledger.sent[pm.body] = None
            try:
                outcome = g.publish(self.rng.choice(alive), self.queue, self.id, batch)
            except TandemError as exc:
                self.ledger.errors[type(exc).__name__] += 1
            else:
                number += 1
                self._out[number] = now + PUBLISH_TIMEOUT
                outcome.add_done_callback(lambda o, b=batch, k=number: self._settled(o, b, k))
            await clock.sleep(self.rng.uniform(0.0, self.pause))
        self.done = True

    def _settled(self, outcome: Any, batch: list[PublishMessage], number: int) -> None:
        self._out.pop(number, None)
        exc = outcome.exception()
        if exc is None:
            self.ledger.confirmed.update(pm.body for pm in batch)
        elif isinstance(exc, TandemError):
            self.ledger.errors[type(exc).__name__] += 1
        else:
            self.ledger.unexpected.append(f"a pipelined publish raised {exc!r}")


class _Session:
    """The consumer's subscription on one life of one member: a
    :class:`broker.messaging.queues.Recipient`, as a client session is to the node."""

    def __init__(self, consumer: Consumer, member: Member, life: Life) -> None:
        self.consumer, self.member, self.life = consumer, member, life
        self.client_name = f"{consumer.name}@{member.name}"
        self.consumers: dict[int, NodeConsumer] = {}
        self.deliveries: dict[int, tuple[NodeConsumer, Msg]] = {}
        self._next_tag = 1

    @property
    def writable(self) -> bool:
        return not self.life.dead

    def deliver(self, c: NodeConsumer, msgs: list[Msg]) -> None:
        node = self.member.node
        assert node is not None
        delivery = node.delivery
        marks, marked = delivery.record_deliveries(c.queue, msgs)
        c.unacked += len(msgs)
        tags = []
        for m in msgs:
            tags.append(self._next_tag)
            self.deliveries[self._next_tag] = (c, m)
            self._next_tag += 1
        if not marks:
            self.consumer.received(self, tags)
            return

        def committed(err: BaseException | None) -> None:
            if err is None:
                marked()
                self.consumer.received(self, tags)
            else:
                delivery.undeliver(self, tags)

        node.services.write_later(marks, committed, lazy=False)

    def cancelled_by_broker(self, c: NodeConsumer, reason: str) -> None:
        self.consumers.pop(c.id, None)
        if self.member.node is not None:
            self.member.node.delivery.remove_consumer(c)


class Consumer:
    """Subscribed on every live member with ``prefetch``; acks each message after up to
    ``ack_delay`` virtual seconds."""

    def __init__(self, group: Group, ledger: Ledger, queue: str, name: str, rng: random.Random, *,
                 prefetch: int = 20, ack_delay: float = 0.1) -> None:
        self.group, self.ledger, self.queue, self.name, self.rng = group, ledger, queue, name, rng
        self.prefetch, self.ack_delay = prefetch, ack_delay
        self._sessions: dict[str, _Session] = {}  # member -> its session on the member's current life
        self._acks: list[tuple[float, _Session, int]] = []

    @property
    def pending(self) -> bool:
        """Acks the application has yet to send."""
        return bool(self._acks)

    def received(self, s: _Session, tags: list[int]) -> None:
        """The application gets these deliveries (their marks are committed)."""
        now = self.group.clock.monotonic()
        for tag in tags:
            _c, m = s.deliveries[tag]
            self.ledger.deliveries.append(Delivered(self.name, s.member.name, m.partition, m.offset, m.key, m.body,
                                                    m.dc))
            self._acks.append((now + self.rng.uniform(0.0, self.ack_delay), s, tag))

    async def run(self) -> None:
        """Subscribe where there is no live subscription, and ack what is due; runs until cancelled."""
        clock = self.group.clock
        while True:
            self._subscribe()
            self._ack_due(clock.monotonic())
            await clock.sleep(0.05)

    def _subscribe(self) -> None:
        for m in self.group.alive():
            s = self._sessions.get(m.name)
            if s is not None and s.life is m.life:
                continue
            node, life = m.node, m.life
            assert node is not None and life is not None
            if self.queue not in node.catalogue.queues:
                continue  # (not applied here yet)
            s = _Session(self, m, life)
            try:
                c = life.run(node.delivery.add_consumer, s, self.queue, self.prefetch)
            except TandemError:
                continue
            s.consumers[c.id] = c
            self._sessions[m.name] = s

    def _ack_due(self, now: float) -> None:
        due = [a for a in self._acks if a[0] <= now]
        if not due:
            return
        self._acks = [a for a in self._acks if a[0] > now]
        by_session: dict[_Session, list[tuple[NodeConsumer, Msg]]] = {}
        for _at, s, tag in due:
            held = s.deliveries.pop(tag, None)
            if held is None or s.life.dead:
                continue  # (its node died: the ack goes nowhere)
            by_session.setdefault(s, []).append(held)
            self.ledger.acked.add((held[1].partition, held[1].offset))
        for s, settled in by_session.items():
            node = s.member.node
            if node is not None and s.life is s.member.life:
                s.life.run(node.delivery.ack, settled)


def spawn_clients(*runs: Coroutine[Any, Any, None]) -> list[asyncio.Task[None]]:
    """The clients' loops as tasks of the test's own (no node's)."""
    return [asyncio.get_running_loop().create_task(r, name="harness-client") for r in runs]
