"""What a node reports about itself, for ``tandem status``, its console, its metrics and its peers.

:func:`status_of` is a node's view of itself and its group (the ``Status`` request, and the
forwarded status request the console sends every member).

The management console (``webconsole/``) shows the whole group: for each partition
it asks the member active for it (the forwarded ``pstats`` request), and it sums
the counters every member keeps of what it did as an active (``qstats``).  The
answers are computed here, on the node's own state, so that the broker answers
its peers without importing the console; ``apply_option`` applies an operator
setting sent by a member's console (forwarded ``option``).

The helpers read the node through small protocols of the few things each needs:
:class:`NodeState` (the queues it serves), :class:`Options` (the settings it applies),
:class:`NodeReport` and :class:`GroupChanges` (what the status says of the node and the group).
:class:`StatusRequests` answers a client session's ``Status`` and ``Metadata`` (a queue's
partition map: the session is told ``MapChanged`` from then on, whenever it may have changed).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import msgpack

from broker import __version__
from broker.config import NodeConfig
from broker.messaging import holders
from broker.messaging.holders import Holder
from broker.messaging.queues import Queue
from broker.security.acl import AclTable
from broker.sessions.requests import Handler, Requester
from client.errors import AccessRefusedError, InvalidArgumentError, UnavailableError
from client.protocol.frames import Frame, MemberBuild, Metadata, MetadataOk, PartitionInfo, PartitionMap, RemoteNode, \
    Status, StatusOk, TypeMismatch, ZoneInfo
from client.protocol.versions import MAX_VERSION, MIN_VERSION
from storage.base import UserRecord
from ha.membership import Membership, RemoteState
from ha.recordtypes import TypeTable
from ha.upgrade import LEVEL_MAX, LEVEL_MIN, Build


class NodeState(Protocol):
    """What the partition stats and the queue counters read on a node: the queues it serves."""

    @property
    def config(self) -> NodeConfig: ...

    @property
    def queues(self) -> Mapping[str, Queue]: ...

    @property
    def sessions(self) -> Collection[Holder]: ...

    @property
    def holders(self) -> Collection[Holder]:
        """Its client sessions, and the relays other members' sessions hold here."""
        ...

    def queue(self, name: str) -> Queue: ...

    def serves(self, q: Queue, pidx: int) -> bool: ...


class Options(Protocol):
    """The operator settings a node applies (``tandem admin``, the console, a member's console)."""

    def set_quorum_override(self, nodes: int | None, *, by: str) -> None: ...

    def set_option(self, name: str, value: int, *, by: str) -> None: ...


def partition_depth(node: NodeState, q: Queue, pidx: int) -> int:
    """Ready and delivered-but-unsettled messages of one partition served here."""
    return holders.partition_depth(node.holders, q, pidx)


def local_pstats(node: NodeState, q: Queue, pidx: int) -> dict[str, Any]:
    """ready, unacked, delayed, depth and next offset of a partition this node serves."""
    part = q.partitions[pidx]
    depth = partition_depth(node, q, pidx)
    ready, delayed = len(part.ready) + part.cold_count, len(part.delayed)
    return {"ready": ready, "unacked": depth - ready - delayed, "delayed": delayed, "depth": depth,
            "active": node.config.name, "next_offset": part.next_offset}


def pstats_payload(node: NodeState, qname: str, pidx: int) -> bytes:
    """The answer to a forwarded ``pstats`` request: a partition this node is active for."""
    q = node.queue(qname)
    if not 0 <= pidx < q.meta.partitions:
        raise InvalidArgumentError(f"queue {qname!r} has no partition {pidx}")
    if not node.serves(q, pidx):
        raise UnavailableError(f"partition {qname}/{pidx} is not active on {node.config.name}")
    return msgpack.packb(local_pstats(node, q, pidx))


def queue_counters(node: NodeState) -> dict[str, list[int]]:
    """What this node counted, per queue: [published, delivered, acked, expired, delayed, consumers,
    idle milliseconds] (broker.partitions.unused; a member of an older build sends the first three)."""
    return {name: [q.published, q.delivered, q.acked, q.expired, q.delayed_count, *q.usage()]
            for name, q in node.queues.items()}


def add_counters(total: dict[str, list[int]], counts: Mapping[str, list[int]]) -> None:
    """Add one member's :func:`queue_counters` into ``total`` (the whole group's)."""
    for qname, v in counts.items():
        acc = total.setdefault(qname, [0, 0, 0, 0, 0])
        for i in range(min(5, len(v))):
            acc[i] += v[i]


def apply_option(node: Options, option: str, value: int, by: str) -> None:
    """An operator setting on this node (from its console, or forwarded by a member).
    ``quorum_override`` below 0 clears the override."""
    if option == "quorum_override":
        node.set_quorum_override(None if value < 0 else value, by=by)
    elif option in ("priority", "designated_primary"):
        node.set_option(option, value, by=by)
    else:
        raise InvalidArgumentError(f"unknown option {option!r}")


class HasUrl(Protocol):
    @property
    def url(self) -> str: ...


class PeersState(Protocol):
    @property
    def addresses(self) -> Mapping[str, tuple[str, int]]: ...

    @property
    def client_addresses(self) -> Mapping[str, str]: ...

    @property
    def membership(self) -> Membership: ...

    @property
    def intruders(self) -> Collection[HaEventView]: ...  # refused peer links (broker.peers.peers.IntruderEvent)

    @property
    def intruder_counts(self) -> Mapping[str, int]: ...  # refused peer links per reason, since start

    @property
    def builds(self) -> BuildsView: ...  # the other members' builds (broker.peers.builds)


class BuildsView(Protocol):
    @property
    def said(self) -> Mapping[str, Build]: ...  # member -> what its build said on its latest link

    @property
    def types(self) -> TypeTable: ...  # the record types each member defines differently (ha.recordtypes)


class HaEventView(Protocol):
    @property
    def at(self) -> float: ...  # clock.time()

    @property
    def kind(self) -> str: ...

    @property
    def partition(self) -> str: ...

    @property
    def text(self) -> str: ...


class ReplicationState(Protocol):
    @property
    def events(self) -> Collection[HaEventView]: ...

    @property
    def discarded_total(self) -> int: ...

    @property
    def discarded_messages(self) -> int: ...

    @property
    def designated_primary(self) -> str | None: ...

    def partition_infos(self) -> list[PartitionInfo]: ...

    def foreign_infos(self) -> list[PartitionInfo]: ...


class HaReport(Protocol):
    """A node's HA arbiter as the status, the console and the metrics show it: the LockFile
    arbiter's driver, or shared mode's (``Node.ha.arbiter``; None under majority elections)."""

    @property
    def state(self) -> str: ...

    @property
    def states(self) -> list[str]: ...  # every state it can be in (the metrics list them all)

    @property
    def epoch(self) -> int: ...

    @property
    def lock_holder(self) -> str | None: ...

    @property
    def renewals(self) -> int: ...  # lock or lease renewals confirmed since start

    @property
    def fencing_refusals(self) -> int: ...  # writes or frames refused for a stale epoch

    @property
    def changes(self) -> int: ...  # state changes since start


@dataclass(frozen=True, slots=True)
class NodeEvent:
    """An event of the node itself (not of a partition): an unclean stop found at start."""

    at: float
    kind: str
    partition: str
    text: str


class DiskAlarmView(Protocol):
    """The node's disk alarm (broker/node/diskalarm.py) as the status and the metrics show it."""

    @property
    def events(self) -> Collection[HaEventView]: ...  # raised and cleared

    @property
    def raised(self) -> bool: ...

    @property
    def free(self) -> int | None: ...  # bytes free at the last check

    @property
    def limit(self) -> int: ...  # disk_free_limit

    @property
    def refusals(self) -> int: ...  # requests refused while raised


class NodeReport(Protocol):
    """What :func:`status_of` reads on a node about itself and its links to the group."""

    @property
    def config(self) -> NodeConfig: ...

    @property
    def node_events(self) -> Collection[HaEventView]: ...

    @property
    def disk_alarm(self) -> DiskAlarmView | None: ...

    @property
    def store_stamp(self) -> str: ...

    @property
    def priority(self) -> int: ...

    @property
    def console(self) -> HasUrl | None: ...

    @property
    def peers(self) -> PeersState | None: ...

    @property
    def replication(self) -> ReplicationState | None: ...

    @property
    def ha(self) -> HaReport | None: ...


class GroupChanges(Protocol):
    """What :func:`status_of` reads on a node about the group's changes under way."""

    @property
    def drained(self) -> frozenset[str]: ...  # the group's members drained for maintenance (broker.partitions.drain)

    def updates_under_way(self) -> list[str]:
        """"queue p,p,..." of every update under way (tandem partition update)."""
        ...

    def moves_under_way(self) -> list[str]:
        """The moves under way (broker.partitions.moves): "queue/partition node,node,..."."""
        ...

    def group_view(self) -> tuple[list[str], dict[str, str], str]:
        """The group's members, their zones, and the change under way ("" none)."""
        ...

    def feature_level(self) -> int:
        """The group's feature level as this node applied it (broker.partitions.upgrade)."""
        ...


def status_of(node: NodeReport, changes: GroupChanges, rid: int,
              may_see: Callable[[str], bool] | None = None) -> StatusOk:
    """The node's view of itself and its group, for ``tandem status``; with ``may_see``, only
    the queues it admits are named (a user's view: the queues its grants name)."""
    cfg = node.config
    remotes: list[RemoteNode] = []
    azones: list[ZoneInfo] = []
    builds: list[MemberBuild] = []
    mismatches: list[TypeMismatch] = []
    type_errors = 0
    peers = node.peers
    if peers is None:
        quorum, override = "Active", None
    else:
        m = peers.membership
        quorum, override = m.quorum_state.value, m.quorum_override
        azones = [ZoneInfo(zq.zone.name, zq.state.value, zq.up_votes, zq.total_votes, str(zq.zone.policy),
                          list(zq.members)) for zq in m.zone_quorums()]
        for name, (host, port) in sorted(peers.addresses.items()):
            ident = m.identity(name)
            remotes.append(RemoteNode(name, m.state(name).value, f"{host}:{port}",
                                      ident.priority if ident else 0, ident.votes if ident else 0,
                                      ident.store_stamp if ident else "",
                                      peers.client_addresses.get(name, "")))
        mismatches = [TypeMismatch(m.member, m.name, m.ours, m.theirs, m.converts, m.convertible)
                      for name, table in sorted(peers.builds.types.mismatches.items()) if name in peers.addresses
                      for m in table.values()]
        type_errors = peers.builds.types.errors
        builds = [MemberBuild(name, b.version, b.protocol[0], b.protocol[1], b.levels[0], b.levels[1], b.level,
                              m.state(name) is RemoteState.UP)
                  for name, b in sorted(peers.builds.said.items()) if name in peers.addresses]  # (members now)
    partitions: list[PartitionInfo] = []
    discarded, dp, dmsgs = 0, False, 0
    rep = node.replication
    happened: list[HaEventView] = list(peers.intruders) if peers is not None else []
    happened += node.node_events
    if node.disk_alarm is not None:
        happened += node.disk_alarm.events
    foreign: list[PartitionInfo] = []
    if rep is not None:
        partitions = rep.partition_infos()
        foreign = rep.foreign_infos()
        happened += rep.events
        discarded, dp = rep.discarded_total, rep.designated_primary is not None
        dmsgs = rep.discarded_messages
    events = [f"{e.kind} {e.partition}: {e.text}" for e in sorted(happened, key=lambda e: e.at)]
    console = node.console
    ha = node.ha
    mode = cfg.ha_mode
    members, zones, change = changes.group_view()
    moving, updating = changes.moves_under_way(), changes.updates_under_way()
    if may_see is not None:
        partitions = [p for p in partitions if not p.queue or may_see(p.queue)]
        foreign = [p for p in foreign if not p.queue or may_see(p.queue)]
        moving = [m for m in moving if may_see(m.partition("/")[0])]
        updating = [u for u in updating if may_see(u.partition(" ")[0])]
    return StatusOk(rid=rid, node=cfg.name, version=__version__, store_stamp=node.store_stamp,
                    priority=node.priority, votes=cfg.votes, quorum_state=quorum, quorum_policy=cfg.quorum_policy,
                    quorum_override=override, remotes=remotes, partitions=partitions, events=events,
                    discarded=discarded, designated_primary=dp, discarded_messages=dmsgs,
                    console=console.url if console is not None else "", mode=mode, arbiter=cfg.arbiter,
                    ha_state=ha.state if ha is not None else "", epoch=ha.epoch if ha is not None else 0,
                    lock_holder=(ha.lock_holder or "") if ha is not None else "", drained=sorted(changes.drained),
                    zones=[f"{n}={z}" for n, z in sorted(zones.items())], foreign=foreign,
                    moving=moving, members=members if peers is not None else [],
                    group_change=change,
                    updating=updating, availability_zones=azones, protocol=[MIN_VERSION, MAX_VERSION],
                    feature_levels=[LEVEL_MIN, LEVEL_MAX], feature_level=changes.feature_level(), builds=builds,
                    type_mismatches=mismatches, type_errors=type_errors)


# -- the status and partition-map requests of a client session -------------------------------------


class Maps(Protocol):
    """Where a node's partitions are active, and who may know it."""

    @property
    def acls(self) -> AclTable: ...

    @property
    def has_quorum(self) -> bool: ...

    def partition_map(self, name: str, session: Any = None) -> PartitionMap:
        """Where ``name``'s partitions are active; ``session`` is told MapChanged from now on."""
        ...


class StatusRequests:
    """The handlers of the read-only requests on the node: its status, a queue's partition map."""

    def __init__(self, report: NodeReport, changes: GroupChanges, maps: Maps) -> None:
        self.report, self.changes, self.maps = report, changes, maps

    def handlers(self) -> Mapping[type[Frame], Handler[Requester]]:
        return {Status: self.status, Metadata: self.metadata}

    async def status(self, s: Requester, user: UserRecord, f: Status) -> None:
        acls = self.maps.acls
        s.send(status_of(self.report, self.changes, f.rid, lambda q: acls.may_see(user, q)))

    async def metadata(self, s: Requester, user: UserRecord, f: Metadata) -> None:
        # read-only, like a stream read: any permission on the queue (a producer routes with it,
        # a monitor's Spark job reads with it), any node (a minority node answers with what it knows)
        if not self.maps.acls.may_see(user, f.queue):
            raise AccessRefusedError(f"access refused: user {user.name!r} (role {user.role}) has no permission "
                                     f"on queue {f.queue!r}")
        s.send(MetadataOk(rid=f.rid, map=self.maps.partition_map(f.queue, s), quorum=self.maps.has_quorum))
