"""Which partition map a durable connection routes by, sans-IO.

A node answers the partition-map request (``Metadata``) from what it knows, and says
whether it has node quorum (``MetadataOk.quorum``).  A node without quorum serves no
partition and names no active it can vouch for: its partitions are Unavailable there,
and the group's majority may have elected actives it does not know about.  So when the
primary link's node answers without quorum, the connection asks the other nodes too and
routes by what the nodes with quorum say; requests that are about no partition (and
partitions without a known active, which the primary's node forwards) move to a node with
quorum.  :func:`ask_others` says when to ask, :func:`merge` what to route by,
:func:`serving_node` where the primary link should be; :func:`settled` says when enough
answers are in.  The I/O is :meth:`client.durable.links.DurableLinks.partition_map`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from client.protocol.frames import PartitionMap


@dataclass(frozen=True, slots=True)
class MapAnswer:
    """One node's answer to the partition-map request."""

    node: str  # the node that answered
    map: PartitionMap
    quorum: bool  # it has node quorum: its actives are to be trusted


def ask_others(answer: MapAnswer) -> bool:
    """The primary's ``answer`` is not enough to route by: its node has no quorum."""
    return not answer.quorum


def _trusted(answers: Sequence[MapAnswer]) -> list[MapAnswer]:
    """The answers to route by: those of nodes with quorum, or all if no node has it."""
    return [a for a in answers if a.quorum] or list(answers)


def merge(answers: Sequence[MapAnswer]) -> PartitionMap:
    """The map to route by, from ``answers`` (the primary's first, then in arrival order):
    each partition's active as the first trusted answer naming one gives it ("" if none
    does), every address any answer gives.  Answers of nodes without quorum count only
    when no node with quorum answered."""
    if not answers:
        raise ValueError("no partition map to merge")
    trusted = _trusted(answers)
    base = trusted[0].map
    actives = list(base.actives)
    for p, active in enumerate(actives):
        if not active:
            actives[p] = next((a.map.actives[p] for a in trusted[1:]
                               if p < len(a.map.actives) and a.map.actives[p]), "")
    addresses: dict[str, str] = {}
    for a in (*trusted, *answers):
        for name, addr in a.map.addresses.items():
            addresses.setdefault(name, addr)
    return PartitionMap(base.queue, actives, addresses)


def settled(answers: Sequence[MapAnswer]) -> bool:
    """No more answers are needed: a node with quorum answered, and every partition has an
    active in what the nodes with quorum say."""
    if not any(a.quorum for a in answers):
        return False
    return all(merge(answers).actives)


def serving_node(answers: Sequence[MapAnswer], primary: str) -> str:
    """Where requests that are about no partition should go: ``primary`` if its node has
    quorum (or no node answered with quorum), else the first node that answered with it."""
    by_node = {a.node: a for a in answers}
    mine = by_node.get(primary)
    if mine is not None and mine.quorum:
        return primary
    return next((a.node for a in answers if a.quorum), primary)
