"""What a node recovers from its store at start (or at a shared-mode activation): queues,
partitions, users, grants and the group's state; and what it says of an unclean stop."""

from __future__ import annotations

import logging

from broker.config import NodeConfig
from broker.messaging.catalogue import Catalogue
from broker.partitions.drain import Drains
from broker.partitions.members import GroupMembers
from broker.partitions.moves import Moves
from broker.partitions.remap import Remaps
from broker.partitions.topology import Topology
from broker.partitions.upgrade import FeatureLevels
from broker.peers.codec import CATALOGUE
from broker.security.acl import AclTable
from broker.security.security import SEEDED_KEY, Security
from broker.security.users import UserRegistry
from broker.sessions.status import NodeEvent
from client.errors import StorageError
from storage.base import DurabilityPolicy, Recovered

log = logging.getLogger("tandem.broker")


def load(rec: Recovered, *, catalogue: Catalogue, users: UserRegistry, acls: AclTable, security: Security,
         drains: Drains, moves: Moves, remaps: Remaps, group: GroupMembers, levels: FeatureLevels,
         topology: Topology, messages: bool = True) -> None:
    """Queues, partitions, users and grants, and the group's state from the store (StoreRefusedError
    first if its feature level is past this build's).
    ``messages`` False (a group member): a partition's messages are loaded only when this
    node becomes its active (``partition_loaded``)."""
    levels.load(rec.meta)  # (first: a store this build is too old for is refused before any of it is read)
    if rec.row_damage:
        raise StorageError(f"{'; '.join(rec.row_damage)}: this node does not start (the group cannot repair a "
                           f"catalogue row or a partition's term and vote: docs/reliability.md says what to do)")
    if messages and rec.store_damage:  # (a group member's partition is rebuilt from its active instead)
        raise StorageError(f"{'; '.join(rec.store_damage.values())}: this node does not start, and serves none of it "
                           f"(no group to repair it from: restore the data directory from a backup)")
    for meta in rec.queues:
        catalogue.add(meta)
    catalogue.next_id = max(catalogue.next_id, int(rec.meta.get("queue_id_hwm", "0")) + 1)
    for (qid, pidx), st in rec.partitions.items():
        q = catalogue.by_id(qid)
        if q is None or pidx >= len(q.partitions):
            log.warning("recovery ignored rows of unknown queue_id=%d partition=%d", qid, pidx)
            continue
        q.load_partition(pidx, st, messages=messages)
    for u in rec.users:
        users.put(u)
    acls.replace(rec.acls)
    security.seeded = rec.meta.get(SEEDED_KEY) == "group"
    drains.load(rec.meta)
    queue_ids = {m.id for m in rec.queues}
    moves.load(rec.meta, queue_ids)
    remaps.load(rec.meta, queue_ids)
    for qid, parts in remaps.pending.items():
        q = catalogue.by_id(qid)
        if q is not None:
            q.paused = parts
    group.load(rec.meta)
    topology.load(rec.meta)


def log_damaged(rec: Recovered, now: float) -> NodeEvent | None:
    """The replication log was found damaged at open (storage.segments): which partitions catch
    up from the group (broker.modes.replicated.reconcile), said once (log, and ``tandem status``
    events); None if it was not."""
    if not rec.log_damage:
        return None
    hit = sorted(f"{k[0]}/{k[1]}" if k != CATALOGUE else "catalogue" for k, st in rec.logs.items() if st.damaged)
    text = (f"replication log damaged ({'; '.join(rec.log_damage)}): "
            + (f"the partitions it may have taken entries of ({_listed(hit)}) go on from the store and catch up "
               f"from their actives before they vote or stand" if hit else "every partition keeps its entries (the "
               f"damage took none that one still needs)")
            + (f"; the others ({len(rec.logs) - len(hit)}) keep their entries" if hit and len(hit) < len(rec.logs)
               else ""))
    log.warning("store: %s", text)
    return NodeEvent(now, "log-damaged", "-", text)


def set_aside_log(engine: object) -> None:
    """The damaged log's segments go aside, so a restart does not find the damage again (the
    partitions it may have touched are marked under repair in the store)."""
    set_aside = getattr(engine, "set_aside_log", None)
    if set_aside is not None:
        set_aside()


def _listed(names: list[str], most: int = 10) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def unclean_stop(cfg: NodeConfig, now: float) -> NodeEvent | None:
    """The store was not closed when it was last open.  Under a policy that confirms
    before an fsync, what was confirmed since the last one is gone if the machine went
    down (power, OS crash); a process that was only killed left it with the OS.  Said
    once at start (log, and ``tandem status`` events); a clean stop says nothing (None)."""
    weak = sorted({p.value for p in ((cfg.sync, cfg.remote_sync) if cfg.peer_port is not None else (cfg.sync,))
                   if p is not DurabilityPolicy.SYNC})
    if not weak:
        return None
    group = " (the group's other nodes hold what they confirmed: HA-1014 reports what this node " \
            "discards on rejoin)" if cfg.peer_port is not None else ""
    text = (f"{cfg.name} did not stop cleanly (killed, or the machine went down) and writes under "
            f"{' and '.join(weak)} without an fsync: if the machine went down (power cut, OS crash), "
            f"writes confirmed since the last fsync may be lost; how many is not known here{group}")
    log.warning("store: %s", text)
    return NodeEvent(now, "unclean-stop", "-", text)
