"""Classify every message of a fault-injection run: what was sent, confirmed and consumed.

* ``ok``: confirmed and consumed;
* ``lost``: confirmed, never consumed (a broken promise);
* ``duplicated``: one sent message stored twice (its payload consumed under two
  different message ids: what idempotent producers forbid);
* ``redelivered``: the same message id consumed again (allowed after a failover, counted);
* ``unexpected``: consumed, never sent;
* ``recovered``: consumed though its send was not confirmed (no confirm came: the send failed
  or timed out, its outcome unknown; allowed: the confirm was lost, the message was not);
* ``reordered`` (:func:`reordered`): first deliveries that came to a consumer out of their
  producer's send order within a partition.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple


@dataclass(frozen=True, slots=True)
class Verdict:
    sent: int
    confirmed: int
    ok: int
    lost: int
    duplicated: int
    redelivered: int
    unexpected: int
    recovered: int
    reordered: int = 0

    @property
    def unconfirmed_delivered(self) -> int:
        """:attr:`recovered` by its older name (the drill's reports)."""
        return self.recovered

    @property
    def passed(self) -> bool:
        return self.lost == 0 and self.duplicated == 0 and self.unexpected == 0 and self.reordered == 0

    def as_dict(self) -> dict[str, int | bool]:
        return {**asdict(self), "passed": self.passed}


def classify(sent: Iterable[bytes], confirmed: Iterable[bytes], consumed: Iterable[tuple[bytes, str]],
             reordered: int = 0) -> Verdict:
    """``consumed``: (payload, message id) in the order received.  Payloads are unique per send.
    ``reordered``: what :func:`reordered` counted (0: not checked)."""
    sent_set, confirmed_set = set(sent), set(confirmed)
    ids_of: dict[bytes, set[str]] = {}
    deliveries = 0
    for body, mid in consumed:
        ids_of.setdefault(body, set()).add(mid)
        deliveries += 1
    seen = set(ids_of)
    return Verdict(
        sent=len(sent_set), confirmed=len(confirmed_set),
        ok=len(confirmed_set & seen),
        lost=len(confirmed_set - seen),
        duplicated=sum(1 for b, ids in ids_of.items() if len(ids) > 1 and b in sent_set),
        redelivered=deliveries - sum(len(ids) for ids in ids_of.values()),
        unexpected=len(seen - sent_set),
        recovered=len((seen & sent_set) - confirmed_set),
        reordered=reordered,
    )


class Delivery(NamedTuple):
    """One message as a consumer received it."""

    body: bytes
    consumer: int
    partition: int
    redelivered: bool  # the broker's flag: delivered before (and not acked)


def reordered(deliveries: Iterable[Delivery], origin: Mapping[bytes, tuple[str, int]]) -> int:
    """Per-producer order within a partition: how many first deliveries broke it.

    ``deliveries``: every delivery in the order received (each consumer's in the order it
    received them); ``origin``: payload -> (producer, its place in that producer's send order).

    A *first delivery* is a delivery of a payload no consumer received before and that the
    broker did not flag ``redelivered``.  Redeliveries are exempt: after a failover (or a
    consumer's link failing) the messages delivered and not acked come again, to whichever
    consumer, behind newer ones; that is at-least-once delivery, not disorder.  The rule: for
    every (producer, partition, consumer), the first deliveries come in the producer's send
    order.  A first delivery whose send came before that of one the same consumer already got
    from the same producer and partition is one violation.  Payloads nobody sent (``unexpected``)
    are left out."""
    seen: set[bytes] = set()
    last: dict[tuple[str, int, int], int] = {}
    bad = 0
    for d in deliveries:
        first = d.body not in seen and not d.redelivered
        seen.add(d.body)
        if not first or d.body not in origin:
            continue
        producer, order = origin[d.body]
        key = (producer, d.partition, d.consumer)
        if order < last.get(key, -1):
            bad += 1
        else:
            last[key] = order
    return bad


@dataclass(frozen=True, slots=True)
class Atomicity:
    """The transactions of a consume-transform-produce run, checked (:func:`atomicity`)."""

    transactions: int  # ended with an outcome the client learnt
    committed: int
    aborted: int
    partial: int  # a committed one missing an output, or an aborted one with an output visible
    acked_twice: int  # inputs acked by two committed transactions (the second's output has no input of its own)
    #: the first partial transactions: id, committed, outputs it published, outputs of it visible
    examples: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def atomicity(transactions: Mapping[str, tuple[bool, frozenset[bytes]]],
              outputs: Iterable[tuple[bytes, str]]) -> Atomicity:
    """Each transaction all or nothing.

    ``transactions``: transaction id -> (committed, the bodies it published, each the body of the
    input it acked); ``outputs``: (body, id of the transaction that published it) of every output
    a reader consumed.

    A committed transaction is partial when one of its outputs is not among ``outputs`` (its
    publish was lost, or only some of its writes took effect); an aborted one when any of its
    outputs is (a write of an aborted transaction became visible).  An input acked by two
    committed transactions was settled by the first; the second's ack changed nothing, and its
    output is one without its input acked (a duplicate)."""
    visible: dict[str, set[bytes]] = {}
    for body, txid in outputs:
        visible.setdefault(txid, set()).add(body)
    partial = committed = 0
    examples: list[str] = []
    times: dict[bytes, int] = {}
    for txid, (ok, bodies) in transactions.items():
        seen = visible.get(txid, set())
        committed += ok
        if ok:
            for b in bodies:
                times[b] = times.get(b, 0) + 1
        if (ok and not bodies <= seen) or (not ok and seen):
            partial += 1
            if len(examples) < 10:
                examples.append(f"{txid}: {'committed' if ok else 'aborted'}, {len(bodies)} published, "
                                f"{len(seen)} visible (e.g. {sorted(seen ^ bodies)[:3]!r})")
    twice = sum(1 for n in times.values() if n > 1)
    return Atomicity(len(transactions), committed, len(transactions) - committed, partial, twice, tuple(examples))
