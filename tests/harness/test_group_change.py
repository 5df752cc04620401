"""Group membership changes on the in-process group harness (broker/partitions/members.py):
a member added in a zone to a group that places copies by zone, the partitions re-spread
over four members with every partition's copies in distinct zones, and the member taken out
again, told so before the others let go of it; an add at any member's peer address refused,
asked of each member.

The CLI's and the console's refusals, a member added under load and a founder drained and
removed stay with real processes (tests/integration/test_group_change.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from client.errors import InvalidArgumentError
from tests.harness.group import BASE_PEER_PORT, Group
from tests.harness.repartition import all_active, ask, status
from tests.harness.replication import with_settings

pytestmark = pytest.mark.asyncio

QUEUE = "orders"
PARTITIONS = 6
FOUNDERS = ("n1", "n2", "n3")
ZONE = {"n1": "a", "n2": "b", "n3": "c", "n4": "a"}


def settled(g: Group, members: int) -> bool:
    """Every live member lists ``members`` members, no group change and no move under way."""
    for m in g.alive():
        st = status(m)
        if len(st.members) != members or st.group_change or st.moving:
            return False
    return True


def placement(g: Group) -> dict[int, set[str]]:
    """partition -> the members holding a copy of it, as each reports its own."""
    out: dict[int, set[str]] = {p: set() for p in range(PARTITIONS)}
    for m in g.alive():
        for p in status(m).partitions:
            if p.queue == QUEUE:
                out[p.partition].add(m.name)
    return out


async def test_a_member_added_in_a_zone_keeps_every_partitions_copies_in_distinct_zones(tmp_path: Path) -> None:
    founders_zones = tuple(f"{n}={ZONE[n]}" for n in FOUNDERS)
    async with Group(tmp_path, names=(*FOUNDERS, "n4"), replicas=1, sync_replicas=1) as g:
        # the founders know each other; n4, started after the add, joins by them
        for n in FOUNDERS:
            with_settings(g, n, peers=tuple(p for p in g[n].config.peers if not p.startswith("n4=")),
                          zones=founders_zones)
        with_settings(g, "n4", join=True, zones=(*founders_zones, "n4=a"))
        await g.start(*FOUNDERS)
        await g.declare(QUEUE, partitions=PARTITIONS)
        await g.until(lambda: all_active(g, QUEUE, PARTITIONS), 10.0, what="an active for each partition")
        n1 = g["n1"]
        assert n1.node is not None
        group = n1.node.ops.group
        refused = await ask(g, n1, group.add("n5", "127.0.0.1:1", "", "test"), "add n5")
        assert isinstance(refused, InvalidArgumentError) and \
            "this group places copies by zone: give n5's (--zone)" in refused.message, refused
        added = await ask(g, n1, group.add("n4", f"127.0.0.1:{BASE_PEER_PORT + 3}", "a", "test"), "add n4")
        assert not isinstance(added, BaseException), added
        await g.start("n4")
        await g.until(lambda: len(g.alive()) == 4 and settled(g, 4), 120.0, what="n4 added, partitions re-spread")
        held = placement(g)
        assert all(len({ZONE[n] for n in nodes}) == len(nodes) == 2 for nodes in held.values()), held
        assert any("n4" in nodes for nodes in held.values()), held
        assert dict(z.split("=") for z in status(g["n3"]).zones) == ZONE, status(g["n3"]).zones
        # n4 taken out again: the others dial it (the lower name dials), and it still learns of
        # its removal before they let go of it
        removed = await ask(g, n1, group.remove("n4", "test"), "remove n4")
        assert not isinstance(removed, BaseException), removed
        n4 = g["n4"]

        def told() -> bool:
            st4 = status(n4)
            return st4.members == list(FOUNDERS) and st4.remotes == []

        await g.until(lambda: all(status(g[n]).members == list(FOUNDERS) for n in FOUNDERS) and told(), 120.0,
                      what="n4 removed and told it is no longer a member")
        held = {p: nodes - {"n4"} for p, nodes in placement(g).items()}
        assert all(len({ZONE[n] for n in nodes}) == len(nodes) == 2 for nodes in held.values()), held


async def test_refusals_and_a_member_that_never_came_up_taken_out_again(tmp_path: Path) -> None:
    """The address-aliasing refusal, asked of each member in turn (the add is checked by the
    catalogue's active, whose own address is among those refused): an add at any member's peer
    address is refused, naming that member, and the member list stays as it was.  The CLI's
    and the console's refusals and the member that never came up stay with real processes
    (tests/integration/test_group_change.py)."""
    async with Group(tmp_path, replicas=1, sync_replicas=1) as g:
        await g.start()
        await g.declare(QUEUE, partitions=PARTITIONS)
        await g.until(lambda: all_active(g, QUEUE, PARTITIONS), 10.0, what="an active for each partition")
        for asked in FOUNDERS:
            m = g[asked]
            assert m.node is not None
            for i, owner in enumerate(FOUNDERS):
                address = f"127.0.0.1:{BASE_PEER_PORT + i}"
                refused = await ask(g, m, m.node.ops.group.add("n9", address, "", "test"), f"add n9 at {owner}'s")
                assert isinstance(refused, InvalidArgumentError) and \
                    refused.message == f"group add: {address} is {owner}'s peer address", (asked, owner, refused)
        assert all(status(g[n]).members == list(FOUNDERS) for n in FOUNDERS)
        assert settled(g, 3)
