"""A node whose peer packets a packet filter dropped, real node processes: back, it sees its
peers Up within seconds, and it raised no term meanwhile (pre-vote).  (A node cut off by
closed links, its terms, the actives and its peers after the heal: the group harness,
tests/harness/test_healed_node.py.)"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from broker.tools.cluster import LocalCluster
from client.clock import SYSTEM_CLOCK
from client.protocol.frames import StatusOk
from tests.helpers import wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.timeout(240)]

Key = tuple[str, int]  # (queue, partition); queue "" is the group's catalogue


def _partitions(st: StatusOk) -> dict[Key, tuple[str, int, str]]:
    """(queue, partition) -> (this node's role, term, the active it knows of)."""
    return {(p.queue, p.partition): (p.role, p.term, p.active) for p in st.partitions}


async def _status(cl: LocalCluster, name: str) -> StatusOk | None:
    return next((st for n, st in await cl._statuses() if n == name), None)


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
    cl = LocalCluster(tmp_path, console=False, nodes=3, base_port=0, password="test-password")
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
