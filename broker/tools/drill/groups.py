"""The group a drill runs against, and the states it waits for there.

A spawned group is a :class:`~broker.tools.cluster.LocalCluster`; a group the drill did not
start is an :class:`ExistingGroup`, reached through its URL, its faults injected by the
operator's commands.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
from typing import Any

import client
from broker.tools.cluster import LocalCluster
from broker.tools.pair import reported_setup, serving_actives
from broker.tools.drill.model import QUEUE
from client.clock import Clock
from client.errors import NotActiveError, TandemError, UnavailableError
from client.url import format_url, parse_url

log = logging.getLogger("tandem.drill")


class ExistingGroup:
    """A group the drill did not start: reached through its URL, faults by the operator's
    commands."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.params = parse_url(url)

    def _link_urls(self) -> list[str]:
        p = self.params
        return [format_url(p, f"{h}:{port}") for h, port in p.hosts]

    async def _statuses(self) -> list[tuple[str, Any]]:
        out = []
        for u in self._link_urls():
            try:
                async with await client.connect_link(u, client_name="tandem-drill", observe=True) as link:
                    st = await link.status()
                    out.append((st.node, st))
            except (TandemError, OSError):
                continue  # down or refusing: the caller looks again
        return out

    async def actives(self, queue: str, partitions: int | None = None) -> dict[int, str]:
        """As :meth:`LocalCluster.actives`, for the setup the nodes report (mode, arbiter)."""
        statuses = await self._statuses()
        return serving_actives(reported_setup(statuses), statuses, queue, partitions)

    async def wait_ready(self) -> None:
        return None  # the operator's group: the drill only waits for its queue's actives

    async def queue_empty(self, queue: str) -> bool:
        for u in self._link_urls():
            try:
                async with await client.connect_link(u, client_name="tandem-drill") as link:
                    for q in await link.list_queues():
                        if q.name == queue and q.ready + q.unacked:
                            return False
            except (TandemError, OSError):
                continue
        return True

    async def run_command(self, what: str, cmd: str, target: str) -> None:
        line = cmd.replace("{node}", shlex.quote(target))
        log.warning("drill: %s: %s", what, line)
        proc = await asyncio.create_subprocess_shell(line)
        code = await proc.wait()
        if code != 0:
            raise UnavailableError(f"--{what} command exited with status {code}: {line}")


async def empty_everywhere(cl: Any, queue: str) -> bool:
    """No live node holds a ready or unacked message of the drill queue (each reports the
    partitions it is active for)."""
    if isinstance(cl, ExistingGroup):
        return await cl.queue_empty(queue)
    for name, p in cl.nodes.items():
        if p.proc is None or p.proc.returncode is not None:
            continue
        try:
            async with await client.connect_link(cl.url_of(name), client_name="drill-check") as link:
                for q in await link.list_queues():
                    if q.name == queue and q.ready + q.unacked:
                        return False
        except NotActiveError:
            continue  # a shared-mode passive: it holds nothing, the active answers for the database
        except (TandemError, OSError):
            return False
    return True


async def all_active(cl: Any, partitions: int, deadline: float, clock: Clock,
                      queue: str = QUEUE) -> dict[int, str]:
    while True:
        found = await cl.actives(queue, partitions)
        if len(found) == partitions:
            return found
        if clock.monotonic() > deadline:
            raise UnavailableError(f"only {len(found)} of {partitions} partitions have an active")
        await clock.sleep(0.05)  # polling real processes, bounded by the deadline


async def caught_up(cl: LocalCluster, partitions: int, deadline: float, clock: Clock) -> None:
    """Every partition has an active whose replicas all match its log."""
    while clock.monotonic() < deadline:
        ok = 0
        for _name, st in await cl._statuses():
            for part in st.partitions:
                if part.queue == QUEUE and part.role == "active" and part.replicas and \
                        all(r.lag == 0 for r in part.replicas) and len(part.replicas) >= len(cl.nodes) - 1:
                    ok += 1
        if ok >= partitions:
            return
        await clock.sleep(0.1)  # polling real processes, bounded by the deadline
    raise UnavailableError("replicas did not catch up in time")


async def caught_up_past(cl: LocalCluster, partitions: int, deadline: float, clock: Clock) -> None:
    """Every partition has an active whose replicas all hold its log up to the commit index it
    had when this was called: under a steady load a replica is rarely at lag 0 at the moment it
    is asked, but it has caught up once it holds everything committed before."""
    marks: dict[int, int] = {}
    while clock.monotonic() < deadline:
        ok = 0
        for _name, st in await cl._statuses():
            for part in st.partitions:
                if part.queue != QUEUE or part.role != "active" or len(part.replicas) < len(cl.nodes) - 1:
                    continue
                mark = marks.setdefault(part.partition, part.commit)
                if all(r.match >= mark for r in part.replicas):
                    ok += 1
        if ok >= partitions:
            return
        await clock.sleep(0.1)  # polling real processes, bounded by the deadline
    raise UnavailableError("replicas did not catch up in time")


async def ha_events(group: Any) -> list[str]:
    """The HA-1014 events the group's live nodes report."""
    return sorted({e for _n, st in await group._statuses() for e in st.events if "HA-1014" in e})


def target_of(actives: dict[int, str]) -> str:
    counts: dict[str, int] = {}
    for n in actives.values():
        counts[n] = counts.get(n, 0) + 1
    return max(sorted(counts), key=lambda n: counts[n])


