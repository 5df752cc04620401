"""What a node tells about itself: ``tandem status``, the console's views, forwarded stats.

Pure functions of the node's state, shared by the client protocol's ``Status`` request, the
requests other members forward (:mod:`broker.forwarded`) and the console (``webconsole``),
which imports them from here.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgpack

from broker import __version__
from broker.catalogue import Catalogue
from broker.config import NodeConfig
from broker.peers import PeerManager
from broker.queues import Queue
from broker.replication import Replication
from client.errors import InvalidArgumentError, UnavailableError
from client.protocol.frames import RemoteNode, StatusOk


class HasUrl(Protocol):
    @property
    def url(self) -> str: ...


class StatusSource(Protocol):
    config: NodeConfig
    store_stamp: str
    priority: int
    peers: PeerManager | None
    replication: Replication | None
    catalogue: Catalogue

    @property
    def console(self) -> HasUrl | None: ...

    @property
    def queues(self) -> dict[str, Queue]: ...

    def serves(self, q: Queue, pidx: int) -> bool: ...

    def set_quorum_override(self, nodes: int | None, *, by: str) -> None: ...

    def set_option(self, name: str, value: int, *, by: str) -> None: ...


def status_of(node: StatusSource, rid: int) -> StatusOk:
    """The node's view of itself and its group, for ``tandem status``."""
    cfg = node.config
    remotes: list[RemoteNode] = []
    if node.peers is None:
        quorum, override = "Active", None
    else:
        m = node.peers.membership
        quorum, override = m.quorum_state.value, m.quorum_override
        for name, (host, port) in sorted(node.peers.addresses.items()):
            ident = m.identity(name)
            remotes.append(RemoteNode(name, m.state(name).value, f"{host}:{port}",
                                      ident.priority if ident else 0, ident.votes if ident else 0,
                                      ident.store_stamp if ident else "",
                                      node.peers.client_addresses.get(name, "")))
    partitions, events, discarded, dp, dmsgs = [], [], 0, False, 0
    rep = node.replication
    if rep is not None:
        partitions = rep.partition_infos()
        events = [f"{e.kind} {e.partition}: {e.text}" for e in rep.events]
        discarded, dp = rep.discarded_total, rep.designated_primary is not None
        dmsgs = rep.discarded_messages
    console = node.console
    return StatusOk(rid=rid, node=cfg.name, version=__version__, store_stamp=node.store_stamp,
                    priority=node.priority, votes=cfg.votes, quorum_state=quorum, quorum_policy=cfg.quorum_policy,
                    quorum_override=override, remotes=remotes, partitions=partitions, events=events,
                    discarded=discarded, designated_primary=dp, discarded_messages=dmsgs,
                    console=console.url if console is not None else "")


def apply_option(node: StatusSource, option: str, value: int, by: str) -> None:
    """An operator setting on this node (from the console here or forwarded by a member)."""
    if option == "quorum_override":
        node.set_quorum_override(None if value < 0 else value, by=by)
    elif option in ("priority", "designated_primary"):
        node.set_option(option, value, by=by)
    else:
        raise InvalidArgumentError(f"unknown option {option!r}")


def local_pstats(node: StatusSource, q: Queue, pidx: int) -> dict[str, Any]:
    """A partition served here: ready, unacked, depth, active, next offset."""
    part = q.partitions[pidx]
    depth = node.catalogue.partition_depth(q, pidx)
    ready = len(part.ready)
    return {"ready": ready, "unacked": depth - ready, "depth": depth, "active": node.config.name,
            "next_offset": part.next_offset}


def queue_counters(node: StatusSource) -> dict[str, list[int]]:
    """What this node counted, per queue: [published, delivered, acked]."""
    return {name: [q.published, q.delivered, q.acked] for name, q in node.queues.items()}


def pstats_payload(node: StatusSource, qname: str, pidx: int) -> bytes:
    """The forwarded partition-stats request: a partition this node is active for."""
    q = node.catalogue.queue(qname)
    if not 0 <= pidx < q.meta.partitions:
        raise InvalidArgumentError(f"queue {qname!r} has no partition {pidx}")
    if not node.serves(q, pidx):
        raise UnavailableError(f"partition {qname}/{pidx} is not active on {node.config.name}")
    return msgpack.packb(local_pstats(node, q, pidx))
