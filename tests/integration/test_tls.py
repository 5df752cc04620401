"""TLS on every link, with real node processes and sockets: a three-node group started with
certificates (``LocalCluster(tls=True)``, as ``tandem cluster up --tls``) serves durable,
blocking and CLI clients over ``tandems://``; its peer ports speak mutual TLS only; a plaintext
client against a TLS port and a TLS client against a plaintext port get a clear error at once;
``tandem certs dev`` makes certificates a node starts with; bad certificate files stop a node
at start with one clear line."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
import stat
import struct
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

import client
from broker.security.tls import peer_cert_names
from broker.tools.cluster import LocalCluster, free_ports
from broker.tools.pair import HaSetup
from broker.tools.process import NodeProcess
from client import blocking
from client.errors import ConnectionClosedError
from client.tls import TlsError
from tests.conftest import FAST, PASSWORD, running_group
from tests.helpers import free_base_port, tandem, wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.integration, pytest.mark.timeout(240)]


@pytest_asyncio.fixture
async def tls_trio(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    async with running_group(tmp_path, tls=True, console=True) as cl:
        yield cl


def _plain(url: str) -> str:
    """The same node(s) over tandem:// (no TLS, no ca)."""
    return url.replace("tandems://", "tandem://").split("/?", 1)[0]


async def test_a_group_with_tls_on_every_link(tls_trio: LocalCluster) -> None:
    cl = tls_trio
    assert cl.url.startswith("tandems://") and "?ca=" in cl.url
    # the durable connection (and the siblings it opens) over TLS: publish, consume, all of it
    async with await client.connect(cl.url) as conn:
        await conn.declare_queue("orders", partitions=3)
        await conn.producer("orders").send_many([(f"o{i}".encode(), f"k{i}") for i in range(60)])
        got = set()
        async with conn.consumer("orders") as c:
            while len(got) < 60:
                m = await c.next(30)
                assert m is not None
                got.add(m.body)
                await m.ack()
        assert got == {f"o{i}".encode() for i in range(60)}
        st = await conn.status()
        assert st.console.startswith("https://"), st.console
        assert [r.state for r in st.remotes] == ["Up", "Up"], st.remotes  # peer links up: over mutual TLS

    # the blocking client over TLS
    def blocking_round_trip() -> bytes:
        with blocking.connect(cl.url) as bc:
            bc.declare_queue("b", partitions=1)
            bc.producer("b").send(b"over tls")
            m = bc.consumer("b").next()
            m.ack()
            return m.body

    assert await asyncio.to_thread(blocking_round_trip) == b"over tls"

    # the CLI's client commands take tandems:// URLs
    rc, out, err = await tandem("produce", "cli", "one", "two", "--declare", "1", "--url", cl.url, "--json")
    assert rc == 0, err
    assert json.loads(out)["confirmed"] == 2
    queues, consumed, console = await asyncio.gather(
        tandem("queues", "--url", cl.url, "--json"), tandem("consume", "cli", "-n", "2", "--url", cl.url, "--json"),
        tandem("console", "--url", cl.url_of("node2")))
    rc, out, err = queues
    assert rc == 0, err
    assert {q["name"] for q in json.loads(out)} >= {"orders", "b", "cli"}
    rc, out, err = consumed
    assert rc == 0, err
    assert sorted(json.loads(line)["body"] for line in out.splitlines()) == ["one", "two"]
    rc, out, err = console
    assert rc == 0 and "https://" in out, (out, err)

    # a plaintext client against the TLS-only client port: a clear error, not a hang
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(ConnectionClosedError, match=r"closed the connection during the handshake: .*tandems://"):
        await client.connect_link(_plain(cl.url_of("node1")))
    assert loop.time() - t0 < 5
    rc, _, err = await tandem("status", "--url", _plain(cl.url_of("node1")))
    assert rc != 0 and "expect TLS (use tandems://)" in err and "Traceback" not in err, err
    # ... and a TLS client that does not trust the nodes' CA
    with pytest.raises(TlsError, match="certificate is not accepted"):
        await client.connect_link(cl.url_of("node1").split("/?", 1)[0])
    # ... or one that gives its own context
    ctx = ssl.create_default_context(cafile=str(cl.certs_dir / "ca.crt"))
    async with await client.connect_link(cl.url_of("node1").split("/?", 1)[0], ssl_context=ctx) as link:
        assert link.node == "node1"

    # the peer port speaks mutual TLS only: plaintext gets nothing (not even a refusal frame) ...
    peer = ("127.0.0.1", cl.peer_ports["node1"])
    reader, writer = await asyncio.open_connection(*peer)
    writer.write(struct.pack(">I", 12) + b"\x00" * 12)  # whatever a plaintext peer would say first
    assert await asyncio.wait_for(reader.read(1024), 10) == b""
    writer.close()
    # ... a TLS client without a member certificate is refused ...
    no_cert = ssl.create_default_context(cafile=str(cl.certs_dir / "ca.crt"))
    with pytest.raises((ssl.SSLError, ConnectionError)):
        reader, writer = await asyncio.open_connection(*peer, ssl=no_cert)
        writer.write(b"\x00" * 16)
        await writer.drain()
        assert await asyncio.wait_for(reader.read(1024), 10) == b""  # TLS 1.3: the refusal comes on the read
        raise ConnectionError("closed")
    # ... and one with a member's certificate gets through TLS, its names readable both ways
    member = ssl.create_default_context(cafile=str(cl.certs_dir / "ca.crt"))
    member.load_cert_chain(cl.certs_dir / "node3.crt", cl.certs_dir / "node3.key")
    reader, writer = await asyncio.open_connection(*peer, ssl=member, server_hostname="127.0.0.1")
    assert peer_cert_names(writer) == {"node1", "localhost"}
    writer.close()

    # the console over HTTPS (and not over HTTP)
    async with aiohttp.ClientSession() as http:
        async with http.get(cl.console_url("node1") + "api/v1/health", ssl=ctx) as r:
            assert r.status in (200, 401, 404)
        with pytest.raises(aiohttp.ClientError):
            async with http.get(cl.console_url("node1").replace("https://", "http://")) as r:
                await r.read()


async def test_a_tls_client_against_a_plaintext_node(tmp_path: Path) -> None:
    node = await NodeProcess(tmp_path / "n", password=PASSWORD, port=free_ports(1)[0]).start()
    try:
        assert node.url.startswith("tandem://")
        url = node.url.replace("tandem://", "tandems://")
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(TlsError, match=r"does not speak TLS \(use tandem://\)"):
            await client.connect_link(url)
        with pytest.raises(TlsError, match="does not speak TLS"):
            await asyncio.to_thread(blocking.connect, url)
        assert loop.time() - t0 < 5
        rc, _, err = await tandem("queues", "--url", url)
        assert rc != 0 and "does not speak TLS (use tandem://)" in err and "Traceback" not in err, err
        await wait_until(lambda: "a TLS handshake on the plaintext client port" in node.log_text(), timeout=10,
                         what="the node to log the TLS client")
    finally:
        await node.stop()


async def test_certs_dev_makes_what_a_node_starts_with(tmp_path: Path) -> None:
    d = tmp_path / "certs"
    rc, out, err = await tandem("certs", "dev", str(d), "--nodes", "alpha,beta", "--hosts", "tandem.test,10.9.8.7")
    assert rc == 0, err
    assert "alpha" in out and "ca.crt" in out
    for f in ("ca.key", "alpha.key", "beta.key"):
        assert stat.S_IMODE(os.stat(d / f).st_mode) == 0o600, f
    node = NodeProcess(tmp_path / "alpha", name="alpha", password=PASSWORD, port=free_ports(1)[0], ca=d / "ca.crt",
                       extra_args=["--tls-cert", str(d / "alpha.crt"), "--tls-key", str(d / "alpha.key")])
    await node.start()
    try:
        assert node.url.startswith("tandems://")
        for host in ("127.0.0.1", "localhost"):  # both named in the certificate
            url = f"tandems://admin:{PASSWORD}@{host}:{node.address[1]}/?ca={d / 'ca.crt'}"
            async with await client.connect_link(url) as link:
                assert link.node == "alpha"
        # a name the certificate does not carry fails the host name check
        ctx = ssl.create_default_context(cafile=str(d / "ca.crt"))
        with pytest.raises(ssl.SSLCertVerificationError):
            await asyncio.open_connection("127.0.0.1", node.address[1], ssl=ctx, server_hostname="elsewhere.test")
    finally:
        await node.stop()


async def test_bad_certificate_files_stop_the_node_with_one_clear_line(tmp_path: Path) -> None:
    d = tmp_path / "certs"
    rc, _, err = await tandem("certs", "dev", str(d), "--nodes", "node1,node2")
    assert rc == 0, err
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key((d / "node1.key").read_bytes(), password=None)
    (d / "encrypted.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                        serialization.BestAvailableEncryption(b"a-passphrase")))
    cases = [
        (["--tls-cert", str(d / "node1.crt"), "--tls-key", str(d / "encrypted.key")], "is encrypted"),
        (["--tls-cert", str(d / "missing.crt"), "--tls-key", str(d / "node1.key")], f"tls_cert {d}/missing.crt: no such file"),
        (["--tls-cert", str(d / "node1.crt"), "--tls-key", str(d / "node2.key")], "is not the key of the certificate"),
        (["--tls-cert", str(d / "node1.key"), "--tls-key", str(d / "node1.key")], "not a PEM certificate"),
        (["--tls-cert", str(d / "node1.crt")], "tls_cert and tls_key: give both"),
        (["--tls-cert", str(d / "node1.crt"), "--tls-key", str(d / "node1.key"), "--peer-port", "0"],
         "TLS on peer links needs tls_ca"),
        (["--tls-cert", str(d / "node1.crt"), "--tls-key", str(d / "node1.key"), "--tls-ca", str(d / "nope.crt")],
         "tls_ca"),
    ]
    # each case a node that stops at start, in a data directory of its own: all at once
    answers = await asyncio.gather(*(tandem("broker", "start", "--data-dir", str(tmp_path / f"n{i}"), "--port", "0",
                                            *args) for i, (args, _says) in enumerate(cases)))
    for (args, says), (rc, out, err) in zip(cases, answers):
        assert rc != 0, (args, out, err)
        assert says in err and "Traceback" not in err, (args, err)


async def test_peer_tls_off_is_plaintext_with_a_warning(tmp_path: Path) -> None:
    d = tmp_path / "certs"
    rc, _, err = await tandem("certs", "dev", str(d), "--nodes", "node1")
    assert rc == 0, err
    peer_port = free_ports(1)[0]
    node = NodeProcess(tmp_path / "n", password=PASSWORD, port=free_ports(1)[0], ca=d / "ca.crt",
                       extra_args=["--tls-cert", str(d / "node1.crt"), "--tls-key", str(d / "node1.key"),
                                   "--peer-port", str(peer_port), "--peer-tls", "off"])
    await node.start()
    try:
        assert "peer_tls = \"off\": the peer links of node1 are plaintext" in node.log_text()
        async with await client.connect_link(node.url) as link:  # clients: still TLS
            assert link.node == "node1"
        # the peer port does not speak TLS: a member's TLS handshake there fails
        member = ssl.create_default_context(cafile=str(d / "ca.crt"))
        member.load_cert_chain(d / "node1.crt", d / "node1.key")
        with pytest.raises((ssl.SSLError, ConnectionError)):
            await asyncio.wait_for(asyncio.open_connection("127.0.0.1", peer_port, ssl=member), 10)
    finally:
        await node.stop()


async def test_a_witnessed_pair_with_tls(tmp_path: Path) -> None:
    """The witness's peer links are mutual TLS too: the pair counts its vote (node quorum with
    both data nodes' links and the witness's up) and serves over tandems://."""
    cl = LocalCluster(tmp_path, console=False, nodes=2, base_port=0, password=PASSWORD, extra_args=FAST, tls=True,
                      ha=HaSetup(arbiter="witness"))
    await cl.start()
    try:
        await cl.wait_ready()
        assert cl.witness is not None and "--tls-cert" in cl.witness.extra_args

        async def both_up() -> bool:  # (a quorum is two of the three: node2's link may come a moment later)
            st = await cl.status("node1")
            return sorted((r.name, r.state) for r in st.remotes) == [("node2", "Up"), ("w1", "Up")]

        await wait_until(both_up, what="node1 linked to node2 and the witness over TLS")
        async with await client.connect(cl.url) as conn:
            await conn.declare_queue("pair", partitions=1)
            await conn.producer("pair").send(b"witnessed")
    finally:
        await cl.stop()


async def test_bench_tls_measures_plaintext_and_tls_in_one_run() -> None:
    rc, out, err = await tandem("bench", "--spawn", "--tls", "--messages", "2000", "--latency-rate", "0", "--json")
    assert rc == 0, err[-3000:]
    report = json.loads(out)
    assert [r["mode"] for r in report["runs"]] == ["single node", "single node, TLS"]
    for r in report["runs"]:
        assert r["error"] is None and (r["lost"], r["duplicated"], r["unexpected"]) == (0, 0, 0), r
        assert r["confirmed"] == r["consumed"] == 2000
    assert set(report["tls_cost"]) == {"publish_per_s", "consume_per_s"}
    assert report["tls_cost"]["publish_per_s"] is not None
    rc, _, err = await tandem("bench", "--url", "tandem://admin@127.0.0.1:1", "--tls")
    assert rc == 2 and "--tls compares a spawned group" in err, err


async def test_cluster_up_tls_prints_a_tandems_url_that_works(tmp_path: Path) -> None:
    base = free_base_port(nodes=1)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "broker.cli", "cluster", "up", "--tls", "--nodes", "1", "--base-port", str(base),
        "--data-dir", str(tmp_path / "g"), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "TANDEM_ADMIN_PASSWORD": PASSWORD})
    lines: list[str] = []

    async def read() -> None:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            lines.append(line.decode(errors="replace"))

    reader = asyncio.create_task(read())
    try:
        await wait_until(lambda: any("client URL" in x for x in lines) or proc.returncode is not None, timeout=90,
                         what="cluster up to print its URL")
        await wait_until(lambda: any("console" in x for x in lines), timeout=10, what="the console line")
        (url_line,) = [x for x in lines if "client URL" in x]
        url = url_line.split(":", 1)[1].strip()
        assert url.startswith("tandems://admin@") and f"?ca={tmp_path / 'g' / 'certs' / 'ca.crt'}" in url, url
        assert any("https://127.0.0.1:" in x for x in lines if "console" in x), lines
        rc, out, err = await tandem("status", "--url", url.replace("admin@", f"admin:{PASSWORD}@"))
        assert rc == 0 and "node node1" in out, err
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
            await wait_until(lambda: proc.returncode is not None, timeout=60, what="cluster up to stop")
        await reader
