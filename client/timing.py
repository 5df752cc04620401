"""The headers that time a message (the broker's ``broker.messaging.timing``): a producer's
``delay``, ``deliver_at`` and ``ttl`` as the headers the broker reads, in milliseconds.

* ``delay`` (seconds): ready that long after the broker stores it (``x-delay``);
* ``deliver_at`` (seconds since the epoch): ready at that time, by the broker's clock (``x-deliver-at``);
* ``ttl`` (seconds): gone, never delivered, that long after the broker stores it (``expiration``),
  dead-lettered with ``x-death-reason: expired`` where the queue has a dead-letter queue.

A message is delivered no earlier than its time; each is at most 2**32-1 ms (49.7 days) away.
In a replication group they need feature level 3 (docs/upgrades.md)."""

from __future__ import annotations

from collections.abc import Mapping

from client.errors import InvalidArgumentError


def timed_headers(headers: Mapping[str, str] | None, *, delay: float | None = None,
                  deliver_at: float | None = None, ttl: float | None = None) -> Mapping[str, str] | None:
    """``headers`` with the timing headers of ``delay``, ``deliver_at`` and ``ttl`` added."""
    if delay is None and deliver_at is None and ttl is None:
        return headers
    out = dict(headers or {})
    for name, value in (("x-delay", delay), ("x-deliver-at", deliver_at), ("expiration", ttl)):
        if value is None:
            continue
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise InvalidArgumentError(f"{name}: a number of seconds >= 0, not {value!r}")
        out[name] = str(round(value * 1000))
    return out
