"""A node cut off from its peers for many election timeouts, then healed, real node processes
(``LocalCluster(proxied=True)``: every peer link through a fault proxy; only the cut
node's peer proxies are cut, its clients' proxy stays, so its status can be read
throughout).  Pre-vote: the cut-off node raises no partition's term while cut, and back,
it deposes no active; the peer links: it sees its peers Up again once healed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

import client
from broker.tools.cluster import LocalCluster
from client.clock import SYSTEM_CLOCK
from client.protocol.frames import StatusOk
from tests.conftest import FAST
from tests.helpers import wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.timeout(240)]

PARTITIONS = 4
CUT_FOR = 12.0  # seconds: 24 election timeouts under FAST (non_response_timeout 0.5 s)

Key = tuple[str, int]  # (queue, partition); queue "" is the group's catalogue


def _partitions(st: StatusOk) -> dict[Key, tuple[str, int, str]]:
    """(queue, partition) -> (this node's role, term, the active it knows of)."""
    return {(p.queue, p.partition): (p.role, p.term, p.active) for p in st.partitions}


async def _status(cl: LocalCluster, name: str) -> StatusOk | None:
    return next((st for n, st in await cl._statuses() if n == name), None)


async def _settled(cl: LocalCluster, names: list[str], keys: int) -> dict[Key, tuple[str, int]]:
    """Once ``names`` agree on one active (among them) and one term for each of ``keys``
    partitions: key -> (active, term)."""
    found: dict[Key, tuple[str, int]] = {}

    async def agreed() -> bool:
        nonlocal found
        views = {n: _partitions(st) for n, st in await cl._statuses() if n in names}
        if len(views) != len(names):
            return False
        found = {}
        for key in next(iter(views.values())):
            seen = {(v[key][2], v[key][1]) for v in views.values() if key in v}
            roles = [v[key][0] for v in views.values() if key in v]
            if len(seen) != 1 or roles.count("active") != 1:
                return False
            (active, term), = seen
            if active not in names:
                return False
            found[key] = (active, term)
        return len(found) == keys

    await wait_until(agreed, timeout=60, what=f"{', '.join(names)} agreeing on an active for every partition")
    return found


@pytest.mark.parametrize("victim", ["follower", "active"])
async def test_a_healed_node_raises_no_term_deposes_no_active_and_sees_its_peers_up(
        tmp_path: Path, victim: str) -> None:
    # (no failback: a placed active taking its partition back after the heal is right, and
    # would look like the heal moving an active)
    cl = LocalCluster(tmp_path, nodes=3, base_port=0, password="test-password",
                      extra_args=[*FAST, "--failback-after", "0"], proxied=True)
    await cl.start()
    try:
        await cl.wait_ready()
        async with await client.connect(cl.url_of("node1")) as conn:
            await conn.declare_queue("q", partitions=PARTITIONS)
        names = sorted(cl.nodes)
        before = await _settled(cl, names, PARTITIONS + 1)
        catalogue = before[("", 0)][0]
        # "follower": a node that is active for no partition if there is one (else the one
        # active for the fewest); "active": the catalogue's active
        load = {n: sum(a == n for a, _t in before.values()) for n in names}
        cut = catalogue if victim == "active" else min(names, key=lambda n: (load[n], n))
        healthy = [n for n in names if n != cut]
        st = await _status(cl, cut)
        assert st is not None
        terms_before = {k: t for k, (_r, t, _a) in _partitions(st).items()}

        client_proxy = cl._client_proxies[cut]
        peer_proxies = [px for px in cl.proxies[cut] if px is not client_proxy]
        for px in peer_proxies:
            px.cut()
        try:
            # The healthy nodes carry on (electing anew where the cut node was active) ...
            during = await _settled(cl, healthy, PARTITIONS + 1)
            # ... and the cut-off node, watched through its clients' proxy, raises no term.
            end = SYSTEM_CLOCK.monotonic() + CUT_FOR
            while SYSTEM_CLOCK.monotonic() < end:
                st = await _status(cl, cut)
                if st is not None:
                    grown = {k: (terms_before.get(k), t) for k, (_r, t, _a) in _partitions(st).items()
                             if t > terms_before.get(k, 0)}
                    assert not grown, f"{cut} raised terms while cut off (before, now): {grown}"
                await SYSTEM_CLOCK.sleep(0.5)  # the cut's length is the point: watched, not waited on
        finally:
            for px in peer_proxies:
                px.heal()

        async def peers_up() -> bool:
            views = dict(await cl._statuses())
            if len(views) != len(names):
                return False
            return all(r.state == "Up" for st in views.values() for r in st.remotes)

        await wait_until(peers_up, timeout=30, what=f"{cut} and its peers seeing each other Up after the heal")
        after = await _settled(cl, names, PARTITIONS + 1)
        assert after == during, f"the heal moved an active or a term: {during} -> {after}"
        for key, (active, term) in before.items():
            if active != cut:
                assert during[key] == (active, term), f"{key}: the cut moved an active of a healthy node"
    finally:
        await cl.stop()


def _iptables(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["iptables", "-w", *args], capture_output=True, text=True)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("iptables") is None, reason="needs root and iptables")
@pytest.mark.xdist_group("netns")  # (the host's packet filter: not beside the network-namespace drills)
async def test_a_node_whose_packets_were_dropped_sees_its_peers_up_soon_after_the_heal(tmp_path: Path) -> None:
    """A packet filter drops everything to and from node3's peer port (both its links: node1
    and node2 dial it) for 15 s: connections hang rather than close.  Once the rules go, node3
    sees its peers Up within a few seconds (measured: 0.6-0.7 s, however long the cut): the
    links to a Down peer were dropped and are dialled again, with short connect attempts, not
    left waiting for TCP's backed-off retransmissions (which took 7 s after a 20 s cut, 47 s
    after 60 s: a retransmission timeout of about 0.21 s doubling, tries at 13.3 s, 26.7 s
    and 53.5 s into the cut, so after a 15 s cut the next is 12 s away, past the 5 s this
    allows).  And node3 raised no term meanwhile (pre-vote)."""
    cl = LocalCluster(tmp_path, nodes=3, base_port=0, password="test-password")
    await cl.start()
    rules: list[list[str]] = []
    try:
        await cl.wait_ready()

        async def linked() -> bool:  # (ready is a quorum: node3 may not have heard node1 yet)
            st = await _status(cl, "node3")
            return st is not None and len(st.remotes) == 2 and all(r.state == "Up" for r in st.remotes)

        await wait_until(linked, timeout=30, what="node3 seeing both peers Up before the cut")
        st = await _status(cl, "node3")
        assert st is not None
        terms_before = {k: t for k, (_r, t, _a) in _partitions(st).items()}
        port = str(cl.peer_ports["node3"])
        for r in (["INPUT", "-i", "lo", "-p", "tcp", "--dport", port, "-j", "DROP"],
                  ["INPUT", "-i", "lo", "-p", "tcp", "--sport", port, "-j", "DROP"]):
            out = _iptables("-I", *r)
            assert out.returncode == 0, out.stderr
            rules.append(r)

        seen: list[object] = []

        async def down() -> bool:
            st = await _status(cl, "node3")
            seen[:] = [None if st is None else [(r.name, r.state) for r in st.remotes]]
            return st is not None and all(r.state == "Down" for r in st.remotes)

        try:
            await wait_until(down, timeout=30, what="node3 seeing its peers Down")
        except AssertionError as e:
            raise AssertionError(f"{e} (node3's peers as it last saw them: {seen})") from None
        end = SYSTEM_CLOCK.monotonic() + 15.0
        while SYSTEM_CLOCK.monotonic() < end:
            st = await _status(cl, "node3")
            if st is not None:
                grown = {k: t for k, (_r, t, _a) in _partitions(st).items() if t > terms_before.get(k, 0)}
                assert not grown, f"node3 raised terms while cut off: {grown}"
            await SYSTEM_CLOCK.sleep(0.5)  # the cut's length is the point: watched, not waited on
        for r in rules:
            _iptables("-D", *r)
        rules.clear()

        async def up() -> bool:
            views = dict(await cl._statuses())
            return len(views) == 3 and all(r.state == "Up" for st in views.values() for r in st.remotes)

        await wait_until(up, timeout=5, what="node3 and its peers Up again, 5 s after the heal")
    finally:
        for r in rules:
            _iptables("-D", *r)
        await cl.stop()
