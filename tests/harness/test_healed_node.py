"""A member cut off from its peers for many election timeouts, then healed, on the group
harness (its links reset and every new one held, as a fault proxy that drops its connections
and refuses new ones).  Pre-vote: the cut-off member raises no partition's term while cut,
and back, it deposes no active; the peer links: it and its peers see each other Up again once
healed.  (The same after dropped packets, with real processes and TCP's retransmissions:
tests/integration/test_healed_node.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from ha.membership import RemoteState
from ha.replica import Role
from tests.harness.group import Group, Member

pytestmark = pytest.mark.asyncio

PARTITIONS = 4
CUT_FOR = 12.0  # virtual seconds: 24 election timeouts (non_response_timeout 0.5 s)

Key = tuple[int, int]  # (queue id, partition); (0, 0) is the group's catalogue


def _view(m: Member) -> dict[Key, tuple[Role, int, str | None]]:
    """key -> (this member's role, term, the active it knows of)."""
    rep = m.node.ha.replication if m.node is not None else None
    assert rep is not None
    return {k: (plog.replica.role, plog.replica.term, plog.replica.leader) for k, plog in rep.logs.items()}


def _agreed(g: Group, names: list[str], keys: int) -> dict[Key, tuple[str, int]] | None:
    """key -> (active, term) where ``names`` agree on one active (among them) and one term for
    each of ``keys`` partitions; else None."""
    views = [_view(g[n]) for n in names]
    found: dict[Key, tuple[str, int]] = {}
    for key in views[0]:
        seen = {(v[key][2], v[key][1]) for v in views if key in v}
        roles = [v[key][0] for v in views if key in v]
        if len(seen) != 1 or roles.count(Role.LEADER) != 1:
            return None
        (active, term), = seen
        if active not in names:
            return None
        found[key] = (active, term)
    return found if len(found) == keys else None


async def _settled(g: Group, names: list[str], keys: int) -> dict[Key, tuple[str, int]]:
    await g.until(lambda: _agreed(g, names, keys) is not None, 60.0,
                  what=f"{', '.join(names)} agreeing on an active for every partition")
    found = _agreed(g, names, keys)
    assert found is not None
    return found


def _peers_up(g: Group) -> bool:
    for m in g.alive():
        assert m.node is not None and m.node.ha.peers is not None
        membership = m.node.ha.peers.membership
        if any(membership.state(o) is not RemoteState.UP for o in g.members if o != m.name):
            return False
    return True


@pytest.mark.parametrize("victim", ["follower", "active"])
async def test_a_healed_node_raises_no_term_deposes_no_active_and_sees_its_peers_up(
        tmp_path: Path, victim: str) -> None:
    # (no failback: a placed active taking its partition back after the heal is right, and
    # would look like the heal moving an active)
    async with Group(tmp_path, failback_after=0) as g:
        await g.start()
        await g.declare("q", partitions=PARTITIONS)
        names = sorted(g.members)
        before = await _settled(g, names, PARTITIONS + 1)
        catalogue = before[(0, 0)][0]
        # "follower": a member that is active for no partition if there is one (else the one
        # active for the fewest); "active": the catalogue's active
        load = {n: sum(a == n for a, _t in before.values()) for n in names}
        cut = catalogue if victim == "active" else min(names, key=lambda n: (load[n], n))
        healthy = [n for n in names if n != cut]
        terms_before = {k: t for k, (_r, t, _a) in _view(g[cut]).items()}

        g.net.isolate(cut, healthy)
        for o in healthy:
            g.net.drop(cut, o)
        # The healthy members carry on (electing anew where the cut member was active) ...
        during = await _settled(g, healthy, PARTITIONS + 1)
        # ... and the cut-off member raises no term, watched at every tenth of a second.
        end = g.clock.monotonic() + CUT_FOR
        while g.clock.monotonic() < end:
            await g.run_for(0.1)
            grown = {k: (terms_before.get(k), t) for k, (_r, t, _a) in _view(g[cut]).items()
                     if t > terms_before.get(k, 0)}
            assert not grown, f"{cut} raised terms while cut off (before, now): {grown}"
        g.net.heal()

        await g.until(lambda: _peers_up(g), 30.0, what=f"{cut} and its peers seeing each other Up after the heal")
        after = await _settled(g, names, PARTITIONS + 1)
        assert after == during, f"the heal moved an active or a term: {during} -> {after}"
        for key, (active, term) in before.items():
            if active != cut:
                assert during[key] == (active, term), f"{key}: the cut moved an active of a healthy member"
