"""broker.partitions.drain: what a member does with a committed drain or undrain and with the
catalogue snapshot's drained set (what goes to its store, when it reconfigures its logs),
what it recovers from its store, and the requests it refuses before anything is proposed."""

from __future__ import annotations

import pytest

from broker.partitions.drain import DRAINED_KEY, Drains
from client.errors import InvalidArgumentError
from storage.base import PutMeta, SetDrained


class Member:
    """What Drains reads of its node here (the checks before a proposal, the reconfiguration)."""

    def __init__(self, members: tuple[str, ...] = ("node1", "node2", "node3"), refusal: str | None = None) -> None:
        self.members, self.refusal_text = members, refusal
        self.reconfigured = 0

    def group_members(self) -> tuple[str, ...]:
        return self.members

    def drain_refusal(self) -> str | None:
        return self.refusal_text

    def drained_changed(self) -> None:
        self.reconfigured += 1


def drains(**kw: object) -> tuple[Drains, Member]:
    m = Member(**kw)  # type: ignore[arg-type]
    return Drains(None, m), m  # type: ignore[arg-type]  # only the calls above are used (no proposal)


def test_a_committed_drain_is_applied_stored_and_reconfigures_once() -> None:
    d, m = drains()
    assert d.apply(SetDrained("node2", True)) == [PutMeta(DRAINED_KEY + "node2", "1")]
    assert d.drained == {"node2"} and m.reconfigured == 1
    assert d.apply(SetDrained("node2", True)) == [PutMeta("drained.node2", "1")]  # (stored again: harmless)
    assert m.reconfigured == 1  # nothing changed: the logs stay as they are
    assert d.apply(SetDrained("node2", False)) == [PutMeta("drained.node2", "0")]
    assert d.drained == frozenset() and m.reconfigured == 2


def test_the_set_is_recovered_from_the_store() -> None:
    d, _m = drains()
    d.load({"drained.node1": "1", "drained.node3": "0", "store_stamp": "x", "users": "group"})
    assert d.drained == {"node1"}


def test_a_snapshot_replaces_the_set_and_stores_what_changed() -> None:
    d, m = drains()
    d.apply(SetDrained("node1", True))
    assert d.install(["node2"]) == [PutMeta("drained.node1", "0"), PutMeta("drained.node2", "1")]
    assert d.drained == {"node2"} and m.reconfigured == 2
    assert d.install(["node2"]) == [] and m.reconfigured == 2
    assert d.snapshot() == ["node2"]


@pytest.mark.asyncio
async def test_requests_refused_before_anything_is_proposed() -> None:
    d, _m = drains()
    with pytest.raises(InvalidArgumentError, match=r"^no node 'node9' in this group \(members: node1, node2, node3\)$"):
        await d.set("node9", True, "admin")
    d, _m = drains(members=(), refusal="node drain: this node is not in a replication group")
    with pytest.raises(InvalidArgumentError, match="not in a replication group"):
        await d.set("node1", True, "admin")
