"""The whole group as the console shows it, gathered over the node's peer links.

Any node's console shows every node: it asks each member for its status
(forwarded ``status``), the member active for each partition for the partition's
stats (``pstats``), and every member for the counters it keeps as an active
(``qstats``), then sums.  A member that does not answer within
:data:`PEER_TIMEOUT` shows as unreachable, its figures as unknown (None).
Operator settings for another member go to it over its link (``option``).

Every request to a member goes out from here.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
from aiohttp import web

from broker.messaging.forward import ForwardRequest, OptionFwd, PartitionStatsFwd, QueueStatsFwd, StatusFwd
from broker.messaging.queues import Queue
from broker.sessions.status import GroupChanges, NodeState, Options, add_counters, apply_option, local_pstats, \
    queue_counters, status_of
from client.errors import TandemError
from client.protocol.codec import decode_payload
from client.protocol.frames import PartitionInfo, QueueInfo, StatusOk
from webconsole.errors import ApiError
from webconsole.nodeview import ConsoleHost, GroupReport


PEER_TIMEOUT = 1.5

#: (member, its status or None: it did not answer), this node's first
Statuses = list[tuple[str, StatusOk | None]]
#: queue -> [published, delivered, acked] summed over the members, and whether all answered
Counted = tuple[dict[str, list[int]], bool]


class Group:
    """The group's state from one node, and the per-second rates of its queue counters: the
    node's own from its views (webconsole.nodeview), the other members' over its peer links."""

    def __init__(self, node: ConsoleHost, *, report: GroupReport, changes: GroupChanges, state: NodeState,
                 options: Options) -> None:
        self.node, self.report, self.changes, self.state, self.options = node, report, changes, state, options
        self._rates: dict[tuple[str, str], tuple[float, int, float]] = {}  # (queue, counter) -> (t, n, rate)

    async def _ask(self, member: str, request: ForwardRequest) -> bytes | None:
        """Member's answer to a forwarded request; None if it fails or is late."""
        peers = self.report.peers
        if peers is None:
            return None
        try:
            async with self.node.clock.timeout(PEER_TIMEOUT):
                return await peers.forward(member, request)
        except (TandemError, TimeoutError):
            return None

    async def statuses(self) -> Statuses:
        """Every member's status, this node's first (None: it did not answer)."""
        mine = status_of(self.report, self.changes, 0)  # what ``tandem status`` shows here
        out: Statuses = [(mine.node, mine)]
        peers = self.report.peers
        if peers is None:
            return out

        async def ask(name: str) -> StatusOk | None:
            if name not in peers.links:
                return None
            answer = await self._ask(name, StatusFwd())
            if answer is None:
                return None
            frame = decode_payload(answer)
            return frame if isinstance(frame, StatusOk) else None

        names = [r.name for r in mine.remotes]
        answers = await asyncio.gather(*(ask(n) for n in names))
        out.extend(zip(names, answers))
        return out

    async def apply_on(self, member: str, option: str, value: int, by: str) -> None:
        """An operator setting on node ``member``: this one, or another over its peer link."""
        if member == self.node.config.name:
            apply_option(self.options, option, value, by)
            return
        peers = self.report.peers
        if peers is None or member not in peers.addresses:
            raise ApiError(404, "not_found", f"no node {member!r} in this group")
        await peers.forward(member, OptionFwd(option, value, by))

    # -- nodes, group, partitions, events ------------------------------------------------------

    def nodes_json(self, statuses: Statuses) -> list[dict[str, Any]]:
        mine = statuses[0][1]
        assert mine is not None  # this node's own status is always there
        remote_of = {r.name: r for r in mine.remotes}
        zone_of = dict(z.partition("=")[::2] for z in mine.zones)
        actives: dict[str, list[str]] = {}
        for p in partitions_json(statuses):
            if p["active"]:
                actives.setdefault(p["active"], []).append(f"{p['queue'] or '(catalogue)'}/{p['partition']}")
        out = []
        for name, st in statuses:
            r = remote_of.get(name)
            state = "Up" if st is not None and (name == mine.node or (r is not None and r.state == "Up")) else \
                (r.state if r is not None else "Down")
            if st is None and state == "Up":
                state = "Unreachable"
            out.append({
                "name": name, "state": state, "self": name == mine.node,
                "priority": st.priority if st else (r.priority if r else None),
                "votes": st.votes if st else (r.votes if r else None),
                "quorum_state": st.quorum_state if st else None,
                "availability_zones": [{"name": z.name, "state": z.state, "up_votes": z.up_votes,
                                        "total_votes": z.total_votes, "policy": z.policy, "members": list(z.members)}
                                       for z in st.availability_zones] if st else [],
                "version": st.version if st else None,
                "store_stamp": st.store_stamp if st else (r.store_stamp if r else ""),
                "peer_address": r.address if r else None,
                "client_address": r.client_address if r else self.node.client_address,
                "designated_primary": st.designated_primary if st else None,
                "drained": name in mine.drained,
                "zone": zone_of.get(name),
                "console": (st.console or None) if st else None,
                "ha_1014_discarded": st.discarded if st else None,
                **ha_json(st),
                "actives": sorted(actives.get(name, [])),
            })
        return out

    # -- queues ---------------------------------------------------------------------------------

    async def partition_stats(self, q: Queue, pidx: int) -> dict[str, Any]:
        """ready, unacked, depth of one partition, from the node active for it."""
        if self.state.serves(q, pidx):
            return local_pstats(self.state, q, pidx)
        rep = self.report.replication
        who = rep.active_of((q.meta.id, pidx)) if rep is not None else None
        if who is None or self.report.peers is None:
            return {"ready": None, "unacked": None, "depth": None, "active": None}
        answer = await self._ask(who, PartitionStatsFwd(q.name, pidx))
        if answer is None:
            return {"ready": None, "unacked": None, "depth": None, "active": who}
        stats: dict[str, Any] = msgpack.unpackb(answer)
        return stats

    async def counters(self) -> Counted:
        """queue -> [published, delivered, acked] summed over the members (each counts what
        it did as an active), and whether every member answered."""
        total = {name: list(v) for name, v in queue_counters(self.state).items()}
        peers = self.report.peers
        if peers is None:
            return total, True

        async def ask(name: str) -> dict[str, list[int]]:
            answer = await self._ask(name, QueueStatsFwd())
            counts: dict[str, list[int]] = msgpack.unpackb(answer) if answer is not None else {}
            return counts

        answers = await asyncio.gather(*(ask(n) for n in list(peers.links)))
        complete = all(answers) or not self.state.queues
        for counts in answers:
            add_counters(total, counts)
        return total, complete

    async def queue_json(self, q: Queue, with_partitions: bool, counted: Counted | None = None) -> dict[str, Any]:
        info: QueueInfo = q.info()
        counters, complete = counted if counted is not None else await self.counters()
        parts = await asyncio.gather(*(self.partition_stats(q, i) for i in range(q.meta.partitions)))
        known = [p for p in parts if p["ready"] is not None]
        published, delivered, acked, expired, delayed = (counters.get(info.name, []) + [0] * 5)[:5]
        out: dict[str, Any] = {
            "name": info.name, "partitions": info.partitions, "mapper": info.mapper,
            "max_deliveries": info.max_deliveries, "dead_letter_queue": info.dead_letter_queue,
            "max_length": info.max_length, "max_length_bytes": q.meta.max_length_bytes, "overflow": q.meta.overflow,
            "message_ttl": q.meta.message_ttl, "expires": q.meta.expires, "type": q.meta.type,
            "max_age": q.meta.max_age, "max_bytes": q.meta.max_bytes,
            "ready": sum(p["ready"] for p in known), "unacked": sum(p["unacked"] for p in known),
            "depth": sum(p["depth"] for p in known), "complete": len(known) == len(parts),
            "published": published, "delivered": delivered, "acked": acked, "expired": expired, "delayed": delayed,
        }
        for counter in ("published", "delivered", "acked"):
            out[f"{counter}_rate"] = self._rate(info.name, counter, out[counter], update=complete)
        if with_partitions:
            out["partition_stats"] = [{"partition": i, **p} for i, p in enumerate(parts)]
        return out

    async def queues_json(self) -> list[dict[str, Any]]:
        qs = sorted(self.state.queues.values(), key=lambda q: q.meta.name)
        counted = await self.counters()
        return list(await asyncio.gather(*(self.queue_json(q, False, counted) for q in qs)))

    def _rate(self, queue: str, counter: str, value: int, *, update: bool = True) -> float:
        """Per second, from the previous sample (at least a second old) of the same counter;
        a sum some member did not answer for (``update`` false) leaves the samples alone."""
        now = self.node.clock.monotonic()
        prev = self._rates.get((queue, counter))
        if not update:
            return prev[2] if prev is not None else 0.0
        if prev is None:
            self._rates[(queue, counter)] = (now, value, 0.0)
            return 0.0
        t, n, rate = prev
        if now - t >= 1.0:
            rate = max(0.0, (value - n) / (now - t))
            self._rates[(queue, counter)] = (now, value, rate)
        return round(rate, 1)


GROUP = web.AppKey("group", Group)


def ha_json(st: StatusOk | None) -> dict[str, Any]:
    """A member's HA arbiter as it reports it: its state, its epoch and the lock or lease holder
    it knows (None each under majority elections, or when it did not answer)."""
    if st is None or not st.ha_state:
        return {"ha_state": None, "epoch": None, "lock_holder": None}
    return {"ha_state": st.ha_state, "epoch": st.epoch, "lock_holder": st.lock_holder or None}


def group_json(statuses: Statuses) -> dict[str, Any]:
    """Members, quorum, and how the group decides its active: ``mode`` (replicated, shared or
    single), ``arbiter`` (majority, lockfile or witness), and the lock or lease holder with its
    epoch as the member that saw the latest epoch reports them (None under majority elections)."""
    mine = statuses[0][1]
    assert mine is not None  # this node's own status is always there
    reports = [st for _, st in statuses if st is not None and st.ha_state]
    latest = max(reports, key=lambda st: (st.epoch, bool(st.lock_holder)), default=None)
    return {"members": [n for n, _ in statuses], "quorum_policy": mine.quorum_policy,
            "quorum_state": mine.quorum_state, "quorum_override": mine.quorum_override,
            "designated_primary": [n for n, st in statuses if st is not None and st.designated_primary],
            "mode": mine.mode, "arbiter": mine.arbiter,
            "lock_holder": (latest.lock_holder or None) if latest is not None else None,
            "epoch": latest.epoch if latest is not None else None,
            "moving": list(mine.moving), "group_change": mine.group_change or None,
            "updating": list(mine.updating)}


def partitions_json(statuses: Statuses) -> list[dict[str, Any]]:
    """One row per partition: as its active reports it, else as the first node that knows it."""
    best: dict[tuple[str, int], tuple[str, PartitionInfo]] = {}
    for name, st in statuses:
        if st is None:
            continue
        for p in st.partitions:
            key = (p.queue, p.partition)
            if key not in best or (p.role == "active" and best[key][1].role != "active"):
                best[key] = (name, p)
    out = []
    for (_q, _i), (seen_by, p) in sorted(best.items()):
        out.append({"queue": p.queue, "partition": p.partition, "state": p.state, "active": p.active,
                    "term": p.term, "commit": p.commit, "last_index": p.last_index, "seen_by": seen_by,
                    "replicas": [{"node": r.node, "kind": r.kind, "match": r.match, "lag": r.lag,
                                  "lag_seconds": r.lag_seconds} for r in p.replicas]})
    return out


def events_json(statuses: Statuses) -> list[dict[str, str]]:
    """The HA events every member reports, each once."""
    seen: set[str] = set()
    out = []
    for name, st in statuses:
        if st is None:
            continue
        for e in st.events:
            if e not in seen:
                seen.add(e)
                out.append({"node": name, "text": e, "kind": e.split(" ", 1)[0]})
    return out
