"""Failback on the in-process group harness (docs/replication.md, "failback"): the placed
active of a partition, back after a kill, caught up and answering for ``failback_after``, is
handed its partition again, with producers and a consumer running through both moves; and a
placed first node of priority 0, asked once, declines, and the writes held meanwhile go on
after the hold, none failed, every ack in the log."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.group import Group
from tests.harness.replication import Traffic, active, events, key_of, only_retriable, placed_first, with_settings

pytestmark = pytest.mark.asyncio

PARTITIONS = 3


async def test_failback_the_placed_active_takes_its_partition_back_and_no_message_is_lost(tmp_path: Path) -> None:
    """kill -9 of the active of partition 0 while producers send, then a restart: back,
    caught up and answering for ``failback_after``, it is handed its partition again (a
    `failback` event on the node that had it), writes to partition 0 go on after it, and
    every confirmed message is delivered from where it stays, stored once; a publish fails
    only with an error a client retries."""
    async with Group(tmp_path, failback_after=1.0) as g:
        await g.start()
        await g.declare("orders", partitions=PARTITIONS)
        key = key_of(g, "orders")
        victim = g[placed_first(g, key, PARTITIONS)]
        await g.until(lambda: active(g, key) is victim, 10.0, what=f"{victim.name} active for partition 0")
        t = Traffic(g, "orders")
        await g.until(lambda: t.confirmed_on(PARTITIONS, 0) >= 50, 30.0, what="50 confirms on partition 0")
        await g.kill(victim.name)
        await g.until(lambda: active(g, key) not in (None, victim), 10.0, what="partition 0 failed over")
        holder = active(g, key)
        assert holder is not None
        await g.restart(victim.name)
        await g.until(lambda: active(g, key) is victim, 30.0, what=f"partition 0 handed back to {victim.name}")
        mark = t.confirmed_on(PARTITIONS, 0)
        await g.until(lambda: t.confirmed_on(PARTITIONS, 0) >= mark + 50, 30.0,
                      what="writes to partition 0 after the failback")
        await t.drain()
        await t.stop()
        handed = [e for e in events(holder, "failback") if e.partition.endswith("/0") and victim.name in e.text]
        assert handed, events(holder)
        assert t.ledger.violations() == [], t.ledger.violations()
        assert only_retriable(t.ledger) == [], t.ledger.errors


async def test_a_declined_failback_holds_writes_once_and_fails_none(tmp_path: Path) -> None:
    """The placement's first node of partition 0 has priority 0: the active asks it once to
    take over, it declines, and the writes go on after the hold: no publish fails (not even
    with an error a client would retry), none is lost or stored twice, no acked message is
    delivered again after the holder dies; the priority-0 node never becomes active."""
    async with Group(tmp_path, failback_after=1.0) as g:
        # which node the placement puts first for partition 0 does not depend on priorities:
        # a first start finds it, the real one gives that node priority 0
        first = await _placed_first_of_0(tmp_path / "probe")
        with_settings(g, first, priority=0)
        await g.start()
        await g.declare("orders", partitions=PARTITIONS)
        key = key_of(g, "orders")
        assert placed_first(g, key, PARTITIONS) == first
        await g.until(lambda: active(g, key) is not None, 10.0, what="an active for partition 0")
        holder = active(g, key)
        assert holder is not None and holder.name != first
        t = Traffic(g, "orders", prefetch=1)  # a slow consumer: acks all along, through the hold

        def asked() -> list[str]:
            return [e.text for e in events(holder, "failback") if e.partition.endswith("/0")]

        await g.until(lambda: bool(asked()), 30.0, what=f"{holder.name} asking {first} to take partition 0")
        mark = t.confirmed_on(PARTITIONS, 0)  # the hold (an election timeout) is under way
        await g.until(lambda: t.confirmed_on(PARTITIONS, 0) >= mark + 50, 30.0,
                      what="writes to partition 0 through and after the hold")
        await t.drain()
        assert asked() == [f"{holder.name}: handing over to {first} in term {_term(asked()[0])}"], asked()
        assert all(active(g, key_of(g, "orders", p)) not in (None, g[first]) for p in range(PARTITIONS))
        assert not t.ledger.errors, f"publishes failed during the hold: {dict(t.ledger.errors)}"
        assert t.ledger.violations() == [], t.ledger.violations()
        # Every ack is in the log: the holder's successor (from the log) delivers none again.
        # (An ack is committed with its partition's next entry, or alone after ack_linger:
        # the last ones are, a moment after the drain.)
        await g.run_for(1.0)
        delivered = len(t.ledger.deliveries)
        await g.kill(holder.name)
        await g.until(lambda: all(active(g, key_of(g, "orders", p)) is not None for p in range(PARTITIONS)),
                      10.0, what="every partition active on the survivors")
        await g.run_for(2.0)
        again = t.ledger.deliveries[delivered:]
        assert not again, f"acked messages delivered again after {holder.name} died: {again[:5]}"
        assert all(active(g, key_of(g, "orders", p)) is not g[first] for p in range(PARTITIONS))
        await t.stop()


def _term(text: str) -> int:
    return int(text.rsplit(" ", 1)[1])


async def _placed_first_of_0(tmp_path: Path) -> str:
    """The placement's first node for partition 0 of a first queue of PARTITIONS partitions."""
    async with Group(tmp_path) as g:
        await g.start()
        await g.declare("orders", partitions=PARTITIONS)
        return placed_first(g, key_of(g, "orders"), PARTITIONS)
