"""Whole-queue figures for ``tandem queues``, gathered from every member of a group.

A node reports the ready and unacked messages of the partitions it is active for, and the
messages it published, delivered and acked as their active: the sum over the members is the
whole queue, whichever member the client reached first.  Consumers are counted per member
(a group consumer subscribes on each), so the figure shown is the largest member's.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field

import client
from client.clock import SYSTEM_CLOCK, Clock
from client.errors import TandemError
from client.protocol.frames import QueueInfo
from client.url import ConnectParams, format_url, parse_url

#: seconds a member has to answer before its figures are left out
MEMBER_TIMEOUT = 5.0

_SUMMED = ("ready", "unacked", "published", "delivered", "acked")


@dataclass(frozen=True, slots=True)
class QueueTotals:
    queues: list[QueueInfo]
    answered: list[str]
    #: member -> why its figures are missing
    missing: dict[str, str] = field(default_factory=dict)


def member_url(params: ConnectParams, address: str) -> str:
    """A URL for one member at ``address`` (host:port), with ``params``' credentials."""
    return format_url(params, address)


def merge(per_member: list[list[QueueInfo]]) -> list[QueueInfo]:
    """One QueueInfo per queue: the members' figures summed (consumers: the largest)."""
    out: dict[str, QueueInfo] = {}
    for infos in per_member:
        for q in infos:
            have = out.get(q.name)
            if have is None:
                out[q.name] = q
                continue
            summed = {f: getattr(have, f) + getattr(q, f) for f in _SUMMED}
            out[q.name] = dataclasses.replace(have, consumers=max(have.consumers, q.consumers), **summed)
    return list(out.values())


async def queue_totals(url: str, *, client_name: str = "tandem-cli", clock: Clock = SYSTEM_CLOCK) -> QueueTotals:
    """Every queue with figures from every member the first reachable node of ``url`` knows."""
    params = parse_url(url)
    async with await client.connect_link(url, client_name=client_name, clock=clock) as first:
        async with clock.timeout(MEMBER_TIMEOUT):
            st = await first.status()
            mine = await first.list_queues()

    async def ask(address: str) -> list[QueueInfo] | str:
        if not address:
            return "its client address is not known yet"
        try:
            async with await client.connect_link(member_url(params, address), client_name=client_name,
                                                 clock=clock) as link:
                async with clock.timeout(MEMBER_TIMEOUT):
                    return await link.list_queues()
        except TimeoutError:
            return f"no answer within {MEMBER_TIMEOUT:g} s"
        except (TandemError, OSError) as exc:
            return str(exc) or type(exc).__name__

    names = [r.name for r in st.remotes]
    answers = await asyncio.gather(*(ask(r.client_address) for r in st.remotes))
    lists, answered, missing = [mine], [st.node], {}
    for name, a in zip(names, answers):
        if isinstance(a, str):
            missing[name] = a
        else:
            lists.append(a)
            answered.append(name)
    return QueueTotals(merge(lists), answered, missing)

