"""Discovery (broker.peers.discovery) with real node processes: a node that joins by one seed,
knowing no member's name, finds the group and every member's address (gossip: the seed
passes on the founders' addresses, which only their settings hold), links to each and takes
its share of the partitions; nothing confirmed is lost.  And what a seed tells a node that
is no member, or that does not prove the group secret: nothing.  (A member that comes back on
another peer port, found where it says it is: tests/harness/test_discovery.py.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import client
from broker.tools.certs import make_dev_certs
from broker.tools.checker import classify
from broker.tools.cluster import LocalCluster, NodeProcess
from tests.conftest import FAST, PASSWORD
from tests.helpers import drain_served, tandem, wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.timeout(300)]

QUEUE = "found"


async def _linked(cl: LocalCluster, names: tuple[str, ...]) -> bool:
    for name in names:
        st = await cl.status(name)
        if sorted(r.name for r in st.remotes if r.state == "Up") != sorted(n for n in names if n != name):
            return False
    return True


async def _all_once(url: str, bodies: list[bytes]) -> None:
    """Consumed at ``url``, the queue holds ``bodies``, each once (checker 0/0/0)."""
    consumed = await drain_served(url, QUEUE)
    v = classify(bodies, bodies, consumed)
    assert (v.lost, v.duplicated, v.unexpected) == (0, 0, 0), v


@pytest.mark.parametrize("auth", ["group-secret", "mutual-tls"])
async def test_a_node_joins_by_one_seed_and_links_to_every_member(tmp_path: Path, auth: str) -> None:
    """``a4`` sorts before the founders, so it is the one that dials each of them: it needs
    all three addresses and is given one seed (node3's peer port, no name).  Links proved by
    the group secret, or by certificates alone (mutual TLS, no secret: the seed's certificate
    names the member it says it is)."""
    tls = auth == "mutual-tls"
    cl = LocalCluster(tmp_path, console=False, nodes=3, base_port=0, password=PASSWORD, tls=tls, secret=not tls,
                      extra_args=[*FAST, "--replicas", "1", "--sync-replicas", "1"])
    if tls:  # (a4's certificate from the group's CA, made with the founders')
        make_dev_certs(cl.certs_dir, ["node1", "node2", "node3", "a4"], [cl.host])
    await cl.start()
    try:
        await cl.wait_ready()
        bodies = [f"m{i}".encode() for i in range(600)]
        async with await client.connect(cl.url) as conn:
            await conn.declare_queue(QUEUE, partitions=6)

            async def served() -> bool:
                return len(await cl.actives(QUEUE)) == 6

            await wait_until(served, timeout=30, what="an active for each partition")
            await conn.producer(QUEUE).send_many(bodies[:300])
        spec = cl.new_member("a4", seeds=["node3"])
        assert "--peer" not in cl.nodes["a4"].extra_args
        rc, out, err = await tandem("group", "add", spec, "--url", cl.url_of("node2"))
        assert rc == 0, err
        await cl.nodes["a4"].start(60)
        names = ("a4", "node1", "node2", "node3")
        await wait_until(lambda: _linked(cl, names), timeout=60, what="a4 linked to every founder and they to it")

        async def settled() -> bool:
            for n in names:
                st = await cl.status(n)
                if len(st.members) != 4 or st.group_change or st.moving:
                    return False
            return True

        await wait_until(settled, timeout=120, what="the partitions re-spread over four members")
        held = {p.partition for p in (await cl.status("a4")).partitions if p.queue == QUEUE}
        assert held, "a4 holds no copy after the re-spread"
        log = cl.nodes["a4"].log_text()
        assert "joining the group its seeds belong to: members node1, node2, node3" in log, log[-3000:]
        async with await client.connect(cl.url_of("a4")) as conn:
            await conn.producer(QUEUE).send_many(bodies[300:])
        await _all_once(cl.url_of("a4"), bodies)
        # a4 restarts knowing only its seed: the group's state it holds names the members, and
        # the founders' addresses, which it lacks, come from the seed
        await cl.nodes["a4"].kill()
        await cl.nodes["a4"].start(60)
        await wait_until(lambda: _linked(cl, names), timeout=60, what="a4 linked again after a restart")
        # and restarted with one founder as its only peer and no seed: that founder's PeerWelcome
        # passes the other addresses on (gossip)
        a4 = cl.nodes["a4"]
        args = a4.extra_args
        a4.extra_args = [a for i, a in enumerate(args) if a != "--seed" and (i == 0 or args[i - 1] != "--seed")]
        assert "--seed" not in a4.extra_args and "--peer" not in a4.extra_args
        a4.extra_args += ["--peer", f"node2={cl.hosts['node2']}:{cl.peer_ports['node2']}"]
        before = len(a4.log_text())
        await a4.kill()
        await a4.start(60)
        await wait_until(lambda: _linked(cl, names), timeout=60, what="a4 linked to every member by gossip")
        assert "member addresses found: node1=" in a4.log_text()[before:]
    finally:
        await cl.stop()


async def test_a_seed_tells_a_stranger_and_a_non_member_nothing(tmp_path: Path) -> None:
    """A node with another group secret asks a seed: refused as an intruder, counted, and it
    learns no address.  One with the secret that was never added: refused in plain words,
    and it learns no address either."""
    cl = LocalCluster(tmp_path, console=False, nodes=3, base_port=0, password=PASSWORD, extra_args=[*FAST])
    await cl.start()
    try:
        await cl.wait_ready()
        other = tmp_path / "other.secret"
        rc, _out, err = await tandem("secret", "new", str(other))
        assert rc == 0, err
        seed = f"{cl.hosts['node1']}:{cl.peer_ports['node1']}"
        said = {"stranger": "peer authentication failed", "outsider": "outsider is not a member of this group"}
        for name, secret in (("stranger", other), ("outsider", cl.secret_file)):
            assert secret is not None
            p = NodeProcess(tmp_path / name, name=name, port=0, password=PASSWORD, host=cl.host)
            p.extra_args = ["--cluster-secret-file", str(secret), "--peer-port", "0", "--join", "--seed", seed, *FAST]
            # (it serves no client before a seed has named the group's members: start never completes)
            starting = asyncio.ensure_future(p.start(120))
            try:
                await wait_until(lambda p=p: "gave no member addresses" in p.log_text(), timeout=30,
                                 what=f"{name} told it got nothing")
                text = p.log_text()
                assert said[name] in text, text[-2000:]
                assert "joining the group" not in text and "member addresses found" not in text
                assert "node2" not in text and "node3" not in text  # (the seed named no other member)
            finally:
                starting.cancel()
                await p.kill()
                await asyncio.gather(starting, return_exceptions=True)
        st1 = await cl.status("node1")
        refused = [e for e in st1.events if e.startswith("intruder ") and "stranger" in e]
        assert refused, st1.events
        assert "outsider is not a member of this group" in cl.nodes["node1"].log_text()
        assert await _linked(cl, ("node1", "node2", "node3"))
    finally:
        await cl.stop()
