"""The operator settings a node applies at runtime: a quorum override, its priority, designated primary.

:class:`RuntimeOptions` is what ``tandem admin`` (:mod:`broker.sessions.admin`), the console and a
member's console (:func:`broker.sessions.status.apply_option`) change on a node: each change is
effective at once and logged loudly.  The node's settings, its group's member list, its replication
and its peer links are made during the start: the options read them through the callables they are
given, never a copy.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from broker.config import NodeConfig
from broker.modes.replicated import Replication
from broker.partitions.members import GroupMembers
from broker.peers.peers import PeerManager
from broker.security.acl import AclTable
from client.errors import InvalidArgumentError

log = logging.getLogger("tandem.broker")


class RuntimeOptions:
    """This node's runtime settings; ``acls`` and ``group`` say who may change them and the members."""

    def __init__(self, config: Callable[[], NodeConfig], *, acls: AclTable, group: Callable[[], GroupMembers],
                 replication: Callable[[], Replication | None], peers: Callable[[], PeerManager | None]) -> None:
        self._config, self._group, self._replication, self._peers = config, group, replication, peers
        self.acls = acls
        self.priority: int = config().priority  # changeable at runtime (tandem admin set-priority)

    @property
    def config(self) -> NodeConfig:
        return self._config()

    @property
    def group(self) -> GroupMembers:
        return self._group()

    def _in_group(self, why: str) -> tuple[Replication, PeerManager]:
        rep, peers = self._replication(), self._peers()
        if rep is None or peers is None:
            raise InvalidArgumentError(f"this node is not in a replication group: {why}")
        return rep, peers

    def set_quorum_override(self, nodes: int | None, *, by: str) -> None:
        peers = self._peers()
        if peers is None:
            raise InvalidArgumentError("this node is not in a replication group: there is no quorum to override")
        try:
            changes = peers.membership.set_quorum_override(nodes)
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from None
        log.warning("QUORUM OVERRIDE %s by %s on node %s: %s", "SET" if nodes is not None else "CLEARED", by,
                    self.config.name, f"at least {nodes} node(s) up" if nodes is not None else
                    f"back to policy {self.config.quorum_policy}")
        peers.report(changes)
        rep = self._replication()
        if rep is not None:
            rep.quorum_override = nodes
            rep.reconfigure()

    def set_option(self, name: str, value: int, *, by: str) -> None:
        """Runtime ``priority`` or ``designated_primary``: effective at once, logged loudly."""
        rep, peers = self._in_group(f"{name} has no effect")
        cfg = self.config
        if name == "priority":
            if not 0 <= value <= 3:
                raise InvalidArgumentError(f"priority {value}: 0 (never active), 1, 2 or 3 (highest)")
            old, self.priority = self.priority, value
            rep.priority = value
            log.warning("PRIORITY SET by %s on node %s: %d -> %d", by, cfg.name, old, value)
        elif name == "designated_primary":
            if cfg.arbiter != "majority":
                raise InvalidArgumentError(f"designated_primary: not with arbiter = \"{cfg.arbiter}\" "
                                           "(the arbiter decides who goes on alone)")
            if value not in (0, 1):
                raise InvalidArgumentError("designated_primary: 1 (on) or 0 (off)")
            if value and len(rep.members) != 2:
                raise InvalidArgumentError(f"designated_primary: only in a two-node group (this one has "
                                           f"{len(rep.members)} members)")
            rep.designated_primary = cfg.name if value else None
            peers.report(peers.membership.set_designated_primary(bool(value)))
            log.warning("DESIGNATED PRIMARY %s by %s on node %s", "SET" if value else "CLEARED", by, cfg.name)
        else:
            raise InvalidArgumentError(f"unknown setting {name!r}: priority or designated_primary")
        rep.reconfigure()
