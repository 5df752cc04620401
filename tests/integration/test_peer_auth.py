"""Peer authentication against real node processes: an intruder on the peer port, a member
with the wrong secret, permitted_nodes, and a group member without a secret.

The intruder test runs once per :data:`VARIANTS` entry: the nodes' extra arguments and how
the intruder reaches a peer port.  A TLS variant adds its node arguments (certificates) and
a ``connect`` that wraps the socket (without a certificate the group trusts).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import secrets
import ssl
import stat
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

import client
from broker.messaging.forward import DeleteFwd, OptionFwd, PurgeFwd
from broker.peers.codec import CATALOGUE, encode_message, encode_replicate
from broker.security.secret import new_secret
from broker.tools.cluster import LocalCluster, free_ports
from broker.tools.pair import HaSetup
from client.clock import SYSTEM_CLOCK
from client.errors import TandemError
from client.protocol.codec import FrameBuffer, encode
from client.protocol.frames import (
    Forward,
    ForwardOk,
    Frame,
    PeerChallenge,
    PeerHello,
    PeerProof,
    PeerWelcome,
    Replicate,
    StatusOk,
)
from ha.messages import RequestVote, TimeoutNow
from tests.conftest import FAST, PASSWORD
from tests.helpers import read_frame, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

QUEUE = "orders"
MESSAGES = 300

Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def plain_connect(host: str, port: int) -> Streams:
    return await asyncio.open_connection(host, port)


@dataclass(frozen=True)
class Variant:
    """How the group runs (extra node arguments, given the test's directory) and how the
    intruder reaches a peer port."""

    id: str
    node_args: Callable[[Path], list[str]] = field(default=lambda _tmp: [])
    connect: Callable[[str, int], Awaitable[Streams]] = plain_connect
    #: TLS on every link (LocalCluster(tls=True)): the intruder speaks TLS, trusting the group's
    #: CA but holding no certificate it signed, so the TLS handshake refuses it first
    tls: bool = False


VARIANTS = [Variant("group-secret"), Variant("tls", tls=True)]


def tls_connect(ca: Path) -> Callable[[str, int], Awaitable[Streams]]:
    """Connect over TLS, checking the node against ``ca``, presenting no certificate."""
    ctx = ssl.create_default_context(cafile=str(ca))

    async def connect(host: str, port: int) -> Streams:
        return await asyncio.open_connection(host, port, ssl=ctx, server_hostname=host)

    return connect


# -- the intruder --------------------------------------------------------------------------------


@dataclass
class Attempt:
    """What an intruder's connection got back, frame by frame, until the node closed it."""

    frames: list[Frame] = field(default_factory=list)
    closed: bool = False


async def intrude(connect: Callable[[str, int], Awaitable[Streams]], host: str, port: int,
                  frames: list[Frame], *, read_first: bool = True) -> Attempt:
    """Connect to a peer port, send ``frames`` (after reading the node's first answer when
    ``read_first``), and read what comes back until the node closes the connection."""
    got = Attempt()
    try:
        reader, writer = await connect(host, port)
    except OSError:  # (ssl.SSLError among them) refused by the TLS handshake
        got.closed = True
        return got
    buf = FrameBuffer(64 * 1024 * 1024)

    async def next_frame() -> Frame | None:
        f = await read_frame(reader, buf)
        got.closed = f is None
        return f

    try:
        async with SYSTEM_CLOCK.timeout(20):
            first, rest = frames[0], frames[1:]
            writer.write(encode(first))
            if read_first:
                f = await next_frame()
                if f is not None:
                    got.frames.append(f)
            for f in rest:
                if writer.is_closing():
                    break
                writer.write(encode(f))
                try:
                    await writer.drain()
                except OSError:
                    break  # the node closed the connection: what it sent is still to be read
            while not got.closed:
                f = await next_frame()
                if f is not None:
                    got.frames.append(f)
    except OSError:
        got.closed = True  # reset by the node
    finally:
        writer.close()
    return got


def hello(name: str) -> PeerHello:
    """A PeerHello with a member's name and a store stamp made up (the attacker knows no stamp)."""
    return PeerHello(min_version=1, max_version=1, node=name, store_stamp="forged-" + secrets.token_hex(4),
                     priority=3, votes=1, client_address="127.0.0.1:1", nonce=secrets.token_bytes(32))


def damage(name: str) -> list[Frame]:
    """Requests that would change the group's state if a node acted on them."""
    vote = encode_message(RequestVote(term=10**6, candidate=name, last_index=10**9, last_term=10**6, priority=3))
    takeover = encode_message(TimeoutNow(term=10**6, leader=name, rank=0))
    return [Forward(rid=1, kind=int(DeleteFwd.KIND), payload=DeleteFwd(hops=0, queue=QUEUE, if_empty=False).pack()),
            Forward(rid=2, kind=int(PurgeFwd.KIND), payload=PurgeFwd(queue=QUEUE, partition=0).pack()),
            Forward(rid=3, kind=int(OptionFwd.KIND), payload=OptionFwd(option="priority", value=0, by=name).pack()),
            Replicate(payload=encode_replicate([[CATALOGUE[0], CATALOGUE[1], vote],
                                                [CATALOGUE[0], CATALOGUE[1], takeover]]))]


# -- the group ---------------------------------------------------------------------------------


@asynccontextmanager
async def group(tmp_path: Path, *, extra: list[str] | None = None,
                node_args: dict[str, list[str]] | None = None, tls: bool = False) -> AsyncIterator[LocalCluster]:
    cl = LocalCluster(tmp_path, nodes=3, base_port=0, password=PASSWORD, extra_args=[*FAST, *(extra or [])],
                      node_args=node_args, tls=tls)
    try:
        await cl.start()
        yield cl
    finally:
        await cl.stop()


async def statuses(cl: LocalCluster) -> dict[str, StatusOk]:
    return {n: await cl.status(n) for n in cl.nodes}


async def all_up(cl: LocalCluster, names: tuple[str, ...] | None = None) -> bool:
    names = names or tuple(cl.nodes)
    for n in names:
        try:
            st = await cl.status(n)
        except (TandemError, OSError):
            return False
        if any(r.state != "Up" for r in st.remotes if r.name in names):
            return False
    return True


async def console_get(cl: LocalCluster, name: str, path: str) -> str:
    auth = {"Authorization": "Basic " + base64.b64encode(f"admin:{PASSWORD}".encode()).decode()}
    tls = ssl.create_default_context(cafile=str(cl.certs_dir / "ca.crt")) if cl.tls else None
    async with aiohttp.ClientSession() as http:
        async with http.get(cl.console_url(name) + path, headers=auth, ssl=tls) as r:
            assert r.status == 200, (name, path, r.status)
            return await r.text()


async def metrics(cl: LocalCluster, name: str) -> dict[str, float]:
    """The node's tandem_intruders_total samples, by reason."""
    text = await console_get(cl, name, "metrics")
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "tandem_intruders_total":
                out[s.labels["reason"]] = s.value
    return out


async def depth(cl: LocalCluster) -> int:
    """The queue's ready and unacked messages: each member counts the partitions it is active
    for (broker/tools/totals.py); -1 when a member no longer knows the queue."""
    total = 0
    for n in cl.nodes:
        async with await client.connect_link(cl.url_of(n)) as conn:
            q = next((q for q in await conn.list_queues() if q.name == QUEUE), None)
        if q is None:
            return -1
        total += q.ready + q.unacked
    return total


async def knows_queue(cl: LocalCluster) -> bool:
    return await depth(cl) != -1


def intruder_events(st: StatusOk) -> list[str]:
    return [e for e in st.events if e.startswith("intruder ")]


# -- tests ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.id)
@pytest.mark.asyncio
async def test_an_intruder_with_a_members_name_changes_nothing(tmp_path: Path, variant: Variant) -> None:
    async with group(tmp_path, extra=variant.node_args(tmp_path), tls=variant.tls) as cl:
        connect = tls_connect(cl.certs_dir / "ca.crt") if variant.tls else variant.connect
        await cl.wait_ready()
        async with await client.connect_link(cl.url) as conn:
            await conn.declare_queue(QUEUE, partitions=3)
            await conn.producer(QUEUE).send_many([f"m{i}".encode() for i in range(MESSAGES)])
        await wait_until(lambda: all_up(cl), what="every member Up")
        await wait_until(lambda: knows_queue(cl), what="every member has applied the declare")

        async def settled() -> bool:
            # every partition served by an active that has loaded it, and every member at its
            # term (a replica learns it with the active's next entry or keep-alive)
            if await depth(cl) != MESSAGES:
                return False
            terms: dict[tuple[str, int], set[int]] = {}
            for st in (await statuses(cl)).values():
                for p in st.partitions:
                    terms.setdefault((p.queue, p.partition), set()).add(p.term)
            return all(len(t) == 1 for t in terms.values())

        await wait_until(settled, what=f"the {MESSAGES} messages counted by the partitions' actives, "
                                       "every member at each partition's term")
        before = await statuses(cl)

        logged = {n: len(p.log_text()) for n, p in cl.nodes.items()}
        attempts: list[tuple[str, str, Attempt]] = []
        for target in cl.nodes:
            port = cl.peer_ports[target]
            for name in [n for n in cl.nodes if n != target]:
                # the handshake's first step, then straight to the damage
                attempts.append((target, name, await intrude(connect, "127.0.0.1", port,
                                                             [hello(name), *damage(name)])))
                # a made-up proof, then the damage
                attempts.append((target, name, await intrude(
                    connect, "127.0.0.1", port,
                    [hello(name), PeerProof(proof=secrets.token_bytes(32)), *damage(name)])))
                # no handshake at all (and, against TLS, not even TLS)
                attempts.append((target, name, await intrude(variant.connect, "127.0.0.1", port, damage(name),
                                                             read_first=False)))
            # a name that is no member's, made to forge a log line
            forged = "evil\n2026-01-01 00:00:00,000 WARNING tandem.ha all is well" + "x" * 1000
            attempts.append((target, "evil", await intrude(connect, "127.0.0.1", port,
                                                           [hello(forged), *damage("evil")])))
        for target, name, got in attempts:
            kinds = [type(f).__name__ for f in got.frames]
            assert not any(isinstance(f, (PeerWelcome, ForwardOk)) for f in got.frames), (target, name, kinds)
            assert got.closed, (target, name, kinds)
            assert all(isinstance(f, PeerChallenge) or type(f).__name__ in ("Error", "Close") for f in got.frames), \
                (target, name, kinds)

        # nothing changed: the queue, the members' identities, the terms, the priorities
        assert await depth(cl) == MESSAGES
        after = await statuses(cl)
        for n in cl.nodes:
            assert {(r.name, r.store_stamp, r.priority) for r in after[n].remotes} == \
                {(r.name, r.store_stamp, r.priority) for r in before[n].remotes}, n
            assert after[n].priority == before[n].priority
            terms = {(p.queue, p.partition): p.term for p in before[n].partitions}
            assert {(p.queue, p.partition): p.term for p in after[n].partitions} == terms, n
        for n, p in cl.nodes.items():  # no live link was dropped or replaced: no member went Down
            during = p.log_text()[logged[n]:]
            assert "-> Down" not in during and "Partial" not in during, during
        # each node says so: an event per refused link, the metric, a WARNING line in its log
        for n in cl.nodes:
            events = intruder_events(after[n])
            assert len(events) >= 3 * (len(cl.nodes) - 1), (n, after[n].events)
            if variant.tls:  # refused by the TLS handshake, before any frame is read
                assert all("refused (tls)" in e for e in events), events
                assert (await metrics(cl, n))["tls"] >= 3 * (len(cl.nodes) - 1) + 1
                assert re.search(r"WARNING .*intruder: peer link from 127\.0\.0\.1:\d+ claiming to be \? refused "
                                 r"\(tls\): TLS handshake failed", cl.nodes[n].log_text())
                continue
            assert any("claiming to be" in e and "(no_proof)" in e for e in events), events
            assert any("(bad_proof)" in e for e in events), events
            assert any("(garbage)" in e for e in events), events
            counts = await metrics(cl, n)
            assert counts["no_proof"] >= 2 and counts["bad_proof"] >= 2 and counts["garbage"] >= 2, counts
            assert counts["not_member"] >= 1, counts
            log = cl.nodes[n].log_text()
            assert re.search(r"WARNING .*intruder: peer link from 127\.0\.0\.1:\d+ claiming to be node\d", log)
            assert "claiming to be 'evil\\n2026-01-01" in log and "\n2026-01-01 00:00:00,000 WARNING" not in log
            assert "x" * 100 not in log
        assert "Traceback" not in "".join(p.log_text() for p in cl.nodes.values())
        # the console shows them among the group's events, and so does `tandem status`
        events = json.loads(await console_get(cl, "node1", "api/v1/events"))
        assert {e["node"] for e in events if e["kind"] == "intruder"} == set(cl.nodes), events
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "broker.cli", "status", "--url", cl.url_of("node2"),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
        assert proc.returncode == 0, err
        claimed = r"\?" if variant.tls else r"node\d"
        assert re.search(rf"intruder 127\.0\.0\.1:\d+: node2: link claiming to be {claimed} refused", out.decode())
        # still a healthy group: every member Up, and it serves
        assert await all_up(cl)
        async with await client.connect_link(cl.url) as conn:
            await conn.producer(QUEUE).send(b"after")
        assert await depth(cl) == MESSAGES + 1


@pytest.mark.asyncio
async def test_a_member_with_the_wrong_secret_is_refused_and_the_right_one_admitted(tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.secret"
    wrong.write_text(secrets.token_hex(32) + "\n")
    wrong.chmod(0o600)
    # node1 dials node2 and node3 (the lower name dials): they refuse its proof
    async with group(tmp_path, node_args={"node1": ["--cluster-secret-file", str(wrong)]}) as cl:
        await cl.wait_ready()  # node2 and node3 are a quorum
        await wait_until(lambda: all_up(cl, ("node2", "node3")), what="node2 and node3 linked")

        async def refused_on(name: str) -> bool:
            st = await cl.status(name)
            return any("claiming to be node1" in e and "(bad_proof)" in e for e in intruder_events(st))

        await wait_until(lambda: refused_on("node2"), what="node2 to refuse node1")
        await wait_until(lambda: refused_on("node3"), what="node3 to refuse node1")
        for n in ("node2", "node3"):
            st = await cl.status(n)
            assert {r.name: r.state for r in st.remotes}["node1"] != "Up", st.remotes
            assert (await metrics(cl, n)).get("bad_proof", 0) >= 1
            assert re.search(r"WARNING .*intruder: peer link from \S+ claiming to be node1 refused \(bad_proof\)",
                             cl.nodes[n].log_text())
        assert "refused this node: peer authentication failed" in cl.nodes["node1"].log_text()

        # node1 again, with the group's secret: admitted everywhere
        p = cl.nodes["node1"]
        await p.stop()
        assert p.extra_args[-2:] == ["--cluster-secret-file", str(wrong)]
        p.extra_args = p.extra_args[:-2]
        await p.start()
        await wait_until(lambda: all_up(cl), what="node1 admitted by node2 and node3")


@pytest.mark.asyncio
async def test_mutual_tls_alone_admits_members_by_their_certificates(tmp_path: Path) -> None:
    """No group secret: a member's certificate (signed by tls_ca) must name it.  node3 presents
    node1's certificate (a good one, of another member): the members refuse it, the other two
    serve."""
    certs = tmp_path / "certs"  # LocalCluster makes the group's CA and certificates here
    impostor = {"node3": ["--tls-cert", str(certs / "node1.crt"), "--tls-key", str(certs / "node1.key")]}
    cl = LocalCluster(tmp_path, console=False, nodes=3, base_port=0, password=PASSWORD, extra_args=FAST,
                      node_args=impostor, tls=True, secret=False)
    try:
        await cl.start()
        await cl.wait_ready()  # node1 and node2 are a quorum
        assert "authentication=mutual TLS" in cl.nodes["node1"].log_text()
        await wait_until(lambda: all_up(cl, ("node1", "node2")), what="node1 and node2 linked")

        async def refused_on(name: str) -> bool:
            return any("claiming to be node3" in e and "certificate names" in e
                       for e in intruder_events(await cl.status(name)))

        await wait_until(lambda: refused_on("node1"), what="node1 to refuse node3's certificate")
        for n in ("node1", "node2"):
            st = await cl.status(n)
            assert {r.name: r.state for r in st.remotes}["node3"] != "Up", st.remotes
        async with await client.connect(cl.url) as conn:  # the two serve
            await conn.declare_queue(QUEUE)
            await conn.producer(QUEUE).send(b"over TLS")

        # node3 with its own certificate: admitted
        p = cl.nodes["node3"]
        await p.stop()
        p.extra_args = p.extra_args[:-4]
        await p.start()
        await wait_until(lambda: all_up(cl), what="node3 admitted by its own certificate")
    finally:
        await cl.stop()


@pytest.mark.asyncio
async def test_permitted_nodes_refuses_a_member_from_elsewhere(tmp_path: Path) -> None:
    # node3 admits node2 from anywhere and node1 only from an address it does not come from
    args = {"node3": ["--permitted-node", "node1@192.0.2.1", "--permitted-node", "node2"]}
    async with group(tmp_path, node_args=args) as cl:
        await cl.wait_ready()
        await wait_until(lambda: all_up(cl, ("node1", "node2")), what="node1 and node2 linked")
        await wait_until(lambda: all_up(cl, ("node2", "node3")), what="node2 and node3 linked")

        async def refused() -> bool:
            return (await metrics(cl, "node3")).get("not_permitted", 0) >= 1

        await wait_until(refused, what="node3 to refuse node1")
        st = await cl.status("node3")
        assert {r.name: r.state for r in st.remotes}["node1"] != "Up"
        assert any("claiming to be node1" in e and "(not_permitted)" in e and "from 127.0.0.1" in e
                   for e in intruder_events(st)), st.events
        assert re.search(r"WARNING .*intruder: .*claiming to be node1 refused \(not_permitted\)",
                         cl.nodes["node3"].log_text())


# -- start-up without a secret, and tandem secret new ------------------------------------------------


def tandem(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "broker.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "TANDEM_ADMIN_PASSWORD": PASSWORD})


def test_a_group_member_without_a_secret_does_not_start(tmp_path: Path) -> None:
    port, peer_port, other = free_ports(3)
    out = tandem("broker", "start", "--name", "node1", "--data-dir", str(tmp_path / "node1"), "--port", str(port),
                 "--peer-port", str(peer_port), "--peer", f"node2=127.0.0.1:{other}")
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert "tandem: error: node node1 is a member of a replication group and has no group secret" in out.stderr
    assert "tandem secret new PATH" in out.stderr and "--cluster-secret-file" in out.stderr
    assert not (tmp_path / "node1" / "tandem.db").exists()  # refused before anything was made

    w = tandem("witness", "start", "--name", "w1", "--peer-port", str(peer_port), "--data-dir", str(tmp_path / "w1"),
               "--peers", f"node1=127.0.0.1:{port},node2=127.0.0.1:{other}")
    assert w.returncode == 2 and "Traceback" not in w.stderr, w.stderr
    assert "node w1 is a member of a replication group and has no group secret" in w.stderr


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ("", "it is empty"),
    ("short\n", "at least 16"),
])
def test_a_bad_secret_file_is_a_clear_error(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "cluster.secret"
    if content is not None:
        path.write_text(content)
    port, peer_port, other = free_ports(3)
    out = tandem("broker", "start", "--data-dir", str(tmp_path / "n"), "--port", str(port), "--peer-port",
                 str(peer_port), "--peer", f"node2=127.0.0.1:{other}", "--cluster-secret-file", str(path))
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert f"tandem: error: cluster_secret_file {path}: " in out.stderr and message in out.stderr


def test_secret_new_writes_a_private_secret_and_keeps_an_existing_one(tmp_path: Path) -> None:
    path = tmp_path / "cluster.secret"
    out = tandem("secret", "new", str(path))
    assert out.returncode == 0, out.stderr
    assert str(path) in out.stdout
    first = path.read_text()
    assert re.fullmatch(r"[0-9a-f]{64}\n", first)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600

    again = tandem("secret", "new", str(path))
    assert again.returncode == 2 and "Traceback" not in again.stderr
    assert again.stderr.strip() == (f"tandem: error: {path} exists already: it may be the secret a running group "
                                    "uses. Use --force to replace it (then every member needs the new file)")
    assert path.read_text() == first

    path.chmod(0o644)
    forced = tandem("secret", "new", str(path), "--force")
    assert forced.returncode == 0, forced.stderr
    assert path.read_text() != first and re.fullmatch(r"[0-9a-f]{64}\n", path.read_text())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600

    missing = tandem("secret", "new", str(tmp_path / "no-such-dir" / "s"))
    assert missing.returncode == 2 and "cannot create it" in missing.stderr and "Traceback" not in missing.stderr

    helped = tandem("secret", "new", "--help")
    assert helped.returncode == 0
    for words in ("0600", "--cluster-secret-file", "--force", "never crosses the network"):
        assert words in helped.stdout.replace("\n", " "), words


@pytest.mark.asyncio
async def test_a_witness_with_the_wrong_secret_is_refused_and_the_right_one_admitted(tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.secret"
    new_secret(wrong)
    cl = LocalCluster(tmp_path, console=False, nodes=2, base_port=0, password=PASSWORD, extra_args=FAST,
                      ha=HaSetup(arbiter="witness"))
    w = cl.witness
    assert w is not None
    right = list(w.extra_args)
    w.extra_args = [*right, "--cluster-secret-file", str(wrong)]
    try:
        await cl.start()
        await cl.wait_ready()  # the two data nodes are a majority of three

        def refused() -> bool:  # the data nodes dial the witness: it refuses their proofs
            log = w.log_text()
            return all(re.search(rf"intruder: peer link from \S+ claiming to be {n} refused \(bad_proof\)", log)
                       is not None for n in cl.nodes)

        await wait_until(refused, what="the witness to refuse both data nodes")
        for n in cl.nodes:
            st = await cl.status(n)
            assert {r.name: r.state for r in st.remotes}["w1"] != "Up"
            assert "peer w1 at" in cl.nodes[n].log_text()

        await w.stop()
        w.extra_args = right
        await w.start()
        async def witness_up() -> bool:
            for n in cl.nodes:
                if {r.name: r.state for r in (await cl.status(n)).remotes}.get("w1") != "Up":
                    return False
            return True

        await wait_until(witness_up, what="the witness admitted by both data nodes")
    finally:
        await cl.stop()
