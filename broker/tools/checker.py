"""Classify every message of a fault-injection run: what was sent, confirmed and consumed.

* ``ok``: confirmed and consumed;
* ``lost``: confirmed, never consumed (a broken promise);
* ``duplicated``: one sent message stored twice (its payload consumed under two
  different message ids: what idempotent producers forbid);
* ``redelivered``: the same message id consumed again (allowed after a failover, counted);
* ``unexpected``: consumed, never sent;
* ``unconfirmed_delivered``: consumed though its send was not confirmed (allowed: the
  confirm was lost, the message was not).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class Verdict:
    sent: int
    confirmed: int
    ok: int
    lost: int
    duplicated: int
    redelivered: int
    unexpected: int
    unconfirmed_delivered: int

    @property
    def passed(self) -> bool:
        return self.lost == 0 and self.duplicated == 0 and self.unexpected == 0

    def as_dict(self) -> dict[str, int | bool]:
        return {**asdict(self), "passed": self.passed}


def classify(sent: Iterable[bytes], confirmed: Iterable[bytes], consumed: Iterable[tuple[bytes, str]]) -> Verdict:
    """``consumed``: (payload, message id) in the order received.  Payloads are unique per send."""
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
        unconfirmed_delivered=len((seen & sent_set) - confirmed_set),
    )
