"""The group's placement and membership as this node sees them, and the group's state it applies.

Where partitions go, the members and their addresses, the queues' definitions and the group's
state as the catalogue's log and snapshot carry them.

:class:`GroupPlacement` is what the group's parts read of the node: the member list
(:mod:`broker.partitions.members`), the moves (:mod:`broker.partitions.moves`), the drains
(:mod:`broker.partitions.drain`), the updates (:mod:`broker.partitions.remap`), the replication
driver (:mod:`broker.modes.replicated`), discovery (:mod:`broker.peers.discovery`) and the status
requests (:mod:`broker.sessions.status`).  The node's settings, its group's member list, its
replication and its peer links are made during the start (a node that joins by seeds alone takes
the settings its seeds give): the facet reads them through the callables it is given, never a
copy.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Collection, Mapping
from typing import Any

from broker.config import ConfigError, NodeConfig, placement_of
from broker.messaging.catalogue import Catalogue
from broker.messaging.delivery import Delivery
from broker.messaging.queues import Queue
from broker.modes.replicated import Replication
from broker.node.store import NodeStore
from broker.partitions.drain import Drains
from broker.partitions.members import GroupMembers
from broker.partitions.moves import Moves, check_nodes, without_leaving
from broker.partitions.remap import Remaps
from broker.partitions.topology import Topology
from broker.partitions.upgrade import FeatureLevels
from broker.peers.codec import group_out, placement_out, updating_out
from broker.peers.peers import PeerManager
from broker.peers.placement import placement_diff
from broker.security.security import Security
from broker.sessions.session import Session
from client.clock import Clock
from client.errors import InvalidArgumentError, NotActiveError
from ha.members import Members
from ha.membership import RemoteState
from ha.upgrade import Build
from ha.placement import DistributionPolicy, listed, place, spec_of, unsafe_to_replace
from storage.base import QueueMeta, SetFeatureLevel, SetGroup, SetPlacement, WriteOp
from storage.topology import DropExchange, PutExchange, SetBinding

log = logging.getLogger("tandem.broker")

#: ``Recovered.meta`` key: the placement settings the store's queues were placed under
PLACEMENT_KEY = "placement"


class GroupPlacement:
    """The group's placement, members and catalogued state, as this node applies them."""

    #: (set by :meth:`bind`: they are made with this facet)
    catalogue: Catalogue
    moves: Moves
    drains: Drains
    remaps: Remaps
    security: Security
    delivery: Delivery
    _store: NodeStore

    def __init__(self, config: Callable[[], NodeConfig], clock: Clock, *, group: Callable[[], GroupMembers],
                 replication: Callable[[], Replication | None], peers: Callable[[], PeerManager | None],
                 priority: Callable[[], int], refusal: Callable[[], NotActiveError | None],
                 map_changed: Callable[[], None], sessions: Collection[Session],
                 learned: dict[str, tuple[str, int]]) -> None:
        self._config, self.clock = config, clock
        self._group, self._replication, self._peers, self._priority = group, replication, peers, priority
        self._refusal, self._map_changed = refusal, map_changed
        self.sessions = sessions  # (their clients go elsewhere once this node leaves the group)
        #: peer addresses found by discovery for members that had none here
        self.learned = learned

    def bind(self, *, catalogue: Catalogue, moves: Moves, drains: Drains, remaps: Remaps, levels: FeatureLevels,
             security: Security, delivery: Delivery, store: NodeStore, topology: Topology) -> None:
        """The node's parts this one reads (made after it: some of them read it in turn)."""
        self.catalogue, self.moves, self.drains, self.remaps = catalogue, moves, drains, remaps
        self.levels, self.topology = levels, topology
        self.security, self.delivery, self._store = security, delivery, store

    @property
    def config(self) -> NodeConfig:
        return self._config()

    @property
    def group(self) -> GroupMembers:
        return self._group()

    @property
    def replication(self) -> Replication | None:
        return self._replication()

    @property
    def peers(self) -> PeerManager | None:
        return self._peers()

    @property
    def priority(self) -> int:
        return self._priority()

    async def check_placement(self, was: str | None) -> None:
        """The placement settings (members, replicas, zones) a store's queues were placed under
        are the ones it starts with: other ones would move partitions to nodes that hold no
        copy of them (and a majority of such nodes could elect one that has nothing).  Stored
        at the first start in a group, and again while the store holds no queue."""
        now = self.config.placement_settings()
        if was == now or self.group.changed():
            return  # (once the members changed while the group ran, the group's list is the one)
        if was is not None and self.catalogue.queues:
            unsafe = self._unsafe_moves(was)
            diff = placement_diff(now, was, "now", "then")
            if unsafe:
                raise ConfigError(
                    f"node {self.config.name} cannot start: its store's queues were placed under other group "
                    f"settings ({diff}), and under these {len(unsafe)} partition(s) would be on voters a majority "
                    f"of which may lack confirmed messages, e.g. {'; '.join(unsafe[:3])}; partitions are not "
                    f"copied when settings change, so start it with its former peers, replicas, sync_replicas and "
                    f"zones, or give a group of another shape a data directory of its own "
                    f"(tandem cluster up --data-dir)")
            log.warning("placement settings changed since the last start (%s): every partition's new voters "
                        "include enough of its former ones", diff)
        await asyncio.to_thread(self._store.engine.set_meta, PLACEMENT_KEY, now)

    def _unsafe_moves(self, was: str) -> list[str]:
        """The partitions whose node list under the settings ``was`` may not be replaced by the
        one under this node's (:func:`ha.placement.unsafe_to_replace`), as "queue/p: old -> new"."""
        old_members, old_policy = placement_of(was)
        new_members, new_policy = self.config.placement()
        out = []
        for q in sorted(self.catalogue.queues.values(), key=lambda q: q.meta.id):
            try:
                before = place(old_policy, q.meta.partitions, old_members)
            except ValueError:
                before = []  # (settings this build cannot place by: every list counts as new)
            after = place(new_policy, q.meta.partitions, new_members)
            for p, new in enumerate(after):
                old = before[p] if before else None
                if old is None or unsafe_to_replace(old, new):
                    out.append(f"{q.name}/{p}: {','.join(old.nodes) if old else '?'} -> {','.join(new.nodes)}")
        return out


    def queue_by_id(self, queue_id: int) -> Queue | None:
        return self.catalogue.by_id(queue_id)

    def catalogue_put(self, meta: QueueMeta) -> bool:
        had = self.catalogue.queues.get(meta.name)
        was = had.meta if had is not None else None
        applied = self.catalogue.apply_put(meta)
        if applied and was != meta:
            self.updating_changed(meta.id)  # (a queue a snapshot brings may be being updated)
            if was is not None:
                self._map_changed()  # (clients learn the new partitions and mapper)
        return applied

    def catalogue_drop(self, queue_id: int) -> None:
        self.catalogue.apply_drop(queue_id)
        self.moves.forget(queue_id)
        self.remaps.forget(queue_id)

    def topology_apply(self, op: PutExchange | DropExchange | SetBinding) -> list[WriteOp]:
        return self.topology.apply(op)

    def unbinding(self, queue: str) -> list[WriteOp]:
        return self.topology.unbinding(queue)

    def security_snapshot(self) -> dict[str, Any]:
        group = self.group.snapshot()
        return {**self.security.snapshot(), "drained": self.drains.snapshot(), **self.levels.snapshot(),
                **self.topology.snapshot(),
                "placed": [placement_out(op) for op in self.moves.snapshot()],
                "updating": [updating_out(op) for op in self.remaps.snapshot()],
                **({"group": group_out(group)} if group is not None else {})}

    def security_install(self, data: dict[str, Any]) -> list[WriteOp]:
        ops = self.security.install(data)
        ops.extend(self.levels.install(data))
        ops.extend(self.topology.install(data))
        if "group" in data:  # (before the placements: their nodes are members)
            ops.extend(self.group.install(data["group"]))
        if "drained" in data:
            ops.extend(self.drains.install(data["drained"]))
        if "placed" in data:
            ops.extend(self.moves.install(data["placed"]))
        if "updating" in data:
            ops.extend(self.remaps.install(data["updating"]))
        return ops

    def updates_under_way(self) -> list[str]:
        return self.remaps.under_way({q.meta.id: q.name for q in self.catalogue.queues.values()})

    def moves_under_way(self) -> list[str]:
        out = []
        m = self.moves
        for key in sorted(m.moving | set(m.forcing)):
            q = self.catalogue.by_id(key[0])
            if q is not None:
                forcing = f" (forced replication: {m.forcing[key]})" if key in m.forcing else ""
                out.append(f"{q.name}/{key[1]} {','.join(m.placed.get(key) or self.nodes_of(key))}{forcing}")
        return out

    @property
    def moving(self) -> Collection[tuple[int, int]]:
        return self.moves.moving

    def move_refusal(self) -> str | None:
        refusal = self.drain_refusal()
        return refusal.replace("node drain", "partition move") if refusal else None

    def queue_meta(self, name: str) -> QueueMeta | None:
        q = self.catalogue.queues.get(name)
        return q.meta if q is not None else None

    def queue_meta_of(self, queue_id: int) -> QueueMeta | None:
        q = self.catalogue.by_id(queue_id)
        return q.meta if q is not None else None

    def nodes_of(self, key: tuple[int, int]) -> tuple[str, ...]:
        q = self.catalogue.by_id(key[0])
        if self.replication is None or q is None:
            return ()
        return spec_of(self.replication.placed(key, q.meta.partitions))

    def spec_of(self, nodes: tuple[str, ...]) -> tuple[str, ...]:
        if self.replication is None:
            return nodes
        return spec_of(listed(self.replication.policy, nodes))

    def placement_changed(self, key: tuple[int, int]) -> None:
        if self.replication is not None:
            self.replication.placement_changed(key)

    def static_lists(self, queue_id: int) -> tuple[tuple[str, ...], ...] | None:
        q = self.catalogue.by_id(queue_id)
        if q is None or (queue_id, 0) not in self.moves.static:
            return None
        return tuple(self.nodes_of((queue_id, p)) for p in range(q.meta.partitions))

    def static_placement(self, meta: QueueMeta, lists: tuple[tuple[str, ...], ...],
                         first: int = 0) -> list[WriteOp]:
        refusal = self.drain_refusal()
        if refusal:
            raise InvalidArgumentError(refusal.replace("node drain", "placement"))
        members, policy = self.placement()
        out: list[WriteOp] = []
        for p, nodes in enumerate(lists, first):
            check_nodes(f"placement: partition {p}", nodes, members)
            placed = listed(policy, nodes)
            if all(self._priority_of(n) == 0 for n in placed.voters):
                raise InvalidArgumentError(f"placement: partition {p}: every voter of {','.join(nodes)} has priority "
                                           f"0 (never active): it could never have an active")
            out.append(SetPlacement(meta.id, p, spec_of(placed), False, True))
        return out

    def _priority_of(self, name: str) -> int | None:
        """A member's priority as its handshake gave it (None: not known here now)."""
        if name == self.config.name:
            return self.priority
        ident = self.peers.membership.identity(name) if self.peers is not None else None
        return ident.priority if ident is not None else None

    @property
    def drained(self) -> frozenset[str]:
        return self.drains.drained | self.group.leaving  # (a leaving member's actives move off it too)

    def group_members(self) -> tuple[str, ...]:
        return tuple(self.replication.members) if self.replication is not None else ()


    def placement(self) -> tuple[list[str], DistributionPolicy]:
        """The members partitions are placed on, and the policy (with the members' zones)."""
        members, policy = self.config.placement()
        if not self.group.changed():
            return members, policy
        placing = list(self.group.placing)
        zones = tuple((n, z) for n, z in sorted(self.group.zones.items()) if n in placing)
        return placing, dataclasses.replace(policy, zones=zones)

    def placement_text(self) -> str:
        """What the peer handshake says this node places partitions by: the settings', or,
        once the members changed while the group ran, the parts that are still settings
        (members and zones are the group's state then, the same on every member that has it)."""
        if not self.group.changed():
            return self.config.placement_settings()
        return f"group=changed replicas={self.config.replicas} sync_replicas={self.config.sync_replicas}"

    def member_addresses(self) -> dict[str, tuple[str, int]]:
        """Every other member's peer address (the witness, under that arbiter, included)."""
        founding = self.config.peer_addresses()
        added = self.group.addresses
        out = {}
        for n in self.group.members:
            if n == self.config.name:
                continue
            addr = added.get(n) or founding.get(n) or self.learned.get(n)
            if addr is None:
                log.warning("group member %s: its peer address is in neither this node's peers nor the group's "
                            "state: not linking to it until a member or a seed gives it (broker.peers.discovery)", n)
                continue
            out[n] = addr
        witness = self.config.witness_address()
        if witness is not None:
            out[witness[0]] = witness[1]
        return out


    def joining(self) -> bool:
        """A node that joins and has not got the group's state yet."""
        return self.config.join and not self.group.changed()


    def missing_addresses(self) -> list[str]:
        peers = self.peers
        if peers is None:
            return []
        if self.joining():
            return [] if peers.addresses else ["*"]
        return [n for n in self.group.members if n != self.config.name and n not in peers.addresses]

    def learn_addresses(self, found: dict[str, tuple[str, int]]) -> None:
        peers = self.peers
        if peers is None:
            return
        joining = self.joining()
        new = {n: a for n, a in found.items()
               if n != self.config.name and n not in peers.addresses and n not in self.learned
               and (joining or n in self.group.members)}
        if not new:
            return
        self.learned.update(new)
        log.info("member addresses found: %s", ", ".join(f"{n}={h}:{p}" for n, (h, p) in sorted(new.items())))
        if joining:  # (the members it finds the group by, as peers would name them)
            peers.set_members({**peers.addresses, **new}, self.placement_text())
        else:
            self.members_changed()

    def member_book(self) -> list[str]:
        return self.peers.book() if self.peers is not None else []

    def group_apply(self, op: SetGroup) -> list[WriteOp]:
        out: list[WriteOp] = []
        for qid, p, nodes in op.pins:
            if (qid, p) not in self.moves.placed:
                out.extend(self.moves.apply(SetPlacement(qid, p, nodes, False)))
        out.extend(self.group.apply(op))
        return out

    def members_changed(self) -> None:
        out = self.config.name not in self.group.members
        if out:
            log.warning("this node, %s, is no longer a member of the group: it links to none of them; stop it "
                        "(its copies are on the other members now)", self.config.name)
        if self.peers is not None:
            self.peers.set_members({} if out else self.member_addresses(), self.placement_text())
        refusal = self._refusal()
        if out and refusal is not None:
            for session in list(self.sessions):
                if not session.observer:
                    session.shutdown(refusal)  # durable clients go on at another member
        if self.replication is not None:
            self.replication.set_members(*self.placement())

    def group_refusal(self) -> str | None:
        if self.replication is None:
            return "group: this node is not in a replication group (a single node, or shared mode)"
        if self.config.arbiter != "majority":
            return f'group: not with arbiter = "{self.config.arbiter}" (a two-node group\'s members are fixed)'
        return None

    def founding_address(self, name: str) -> str | None:
        """host:port of member ``name`` as the settings give it: the others' from ``peers``,
        this node's own where its peer links listen (``peers`` lists the others only)."""
        cfg = self.config
        if name == cfg.name:
            peers = self.peers
            port = peers.address[1] if peers is not None and peers.address is not None else cfg.peer_port
            return f"{cfg.host}:{port}" if port else None
        addr = cfg.peer_addresses().get(name)
        return f"{addr[0]}:{addr[1]}" if addr is not None else None

    def unplaced(self) -> list[tuple[int, int, tuple[str, ...]]]:
        out = []
        for q in sorted(self.catalogue.queues.values(), key=lambda q: q.meta.id):
            for p in range(q.meta.partitions):
                if (q.meta.id, p) not in self.moves.placed:
                    out.append((q.meta.id, p, self.nodes_of((q.meta.id, p))))
        return out

    def feasible(self, members: tuple[str, ...], zones: Mapping[str, str]) -> str | None:
        _members, policy = self.placement()
        try:
            place(dataclasses.replace(policy, zones=tuple(sorted(zones.items()))), 1, list(members))
        except ValueError as exc:
            return str(exc)
        return None

    def policy_targets(self) -> dict[tuple[int, int], tuple[str, ...]]:
        """Where the policy places every partition over the members (not leaving), as
        ``name:sync`` / ``name:async`` lists: what a re-spread moves them to."""
        if self.replication is None:
            return {}
        members, policy = self.placement()
        out = {}
        for q in self.catalogue.queues.values():
            for p, nodes in enumerate(place(policy, q.meta.partitions, members)):
                key = (q.meta.id, p)
                out[key] = spec_of(nodes) if key not in self.moves.static else \
                    without_leaving(self.nodes_of(key), members, self.group.zones)
        return out

    def catalogue_target(self) -> Members | None:
        """The catalogue log's members once the group's list changed: the members not
        leaving vote, the leaving ones learn (None: the settings' members, as opened)."""
        if not self.group.changed():
            return None
        return Members(self.group.placing, tuple(sorted(self.group.leaving)))

    def group_view(self) -> tuple[list[str], dict[str, str], str]:
        g = self.group
        change = ""
        if g.respread:
            what = f"{', '.join(sorted(g.leaving))} leaving" if g.leaving else "a member added"
            change = f"{what}: partitions re-spreading over {', '.join(g.placing)}"
        return list(g.members), g.zones, change


    def drain_refusal(self) -> str | None:
        if self.replication is None:
            return "node drain: this node is not in a replication group (a single node, or shared mode)"
        if self.config.arbiter == "lockfile":
            return 'node drain: not with arbiter = "lockfile" (the lock, not the placement, decides the active)'
        return None

    # -- the group's feature level (broker.partitions.upgrade) -----------------------------------------

    def feature_level(self) -> int:
        return self.levels.level

    def level_apply(self, op: SetFeatureLevel) -> list[WriteOp]:
        return self.levels.apply(op)

    def finalize_mode_refusal(self) -> str | None:
        if self.config.mode == "shared":
            return ("upgrade finalize: shared mode has no feature level to raise (its nodes share one database "
                    "and its schema): upgrade the nodes one at a time, the passive first")
        return None

    def member_builds(self) -> tuple[Collection[str], Mapping[str, Build], Collection[str]]:
        peers = self.peers
        if peers is None:
            return (), {}, ()
        linked = [n for n in peers.addresses if peers.membership.state(n) is RemoteState.UP]
        return tuple(peers.addresses), dict(peers.builds.said), linked

    def level_changed(self, level: int) -> None:
        peers = self.peers
        if peers is not None:
            peers.builds.level = level

    def drained_changed(self) -> None:
        if self.replication is not None:
            self.replication.reconfigure()


    def remap_refusal(self) -> str | None:
        return None


    def updating_changed(self, queue_id: int) -> None:
        q = self.queue_by_id(queue_id)
        if q is not None:
            q.paused = self.remaps.paused(queue_id)
            self.delivery.schedule(q)

