"""broker.security.tls over real sockets: mutual TLS between two members' contexts, the names each end
reads from the other's certificate, a stranger's certificate refused, and which contexts a
configuration gets."""

from __future__ import annotations

import asyncio
import logging
import ssl
from pathlib import Path

import pytest

from broker.security import tls
from broker.config import ConfigError, NodeConfig
from broker.tools.certs import DevCerts, make_dev_certs


@pytest.fixture
def certs(tmp_path: Path) -> DevCerts:
    return make_dev_certs(tmp_path / "certs", ["node1", "node2"], ["peer.example"])


def _config(certs: DevCerts, name: str, **kw: object) -> NodeConfig:
    cert, key = certs.nodes[name]
    values: dict[str, object] = {"name": name, "tls_cert": cert, "tls_key": key, "tls_ca": certs.ca, "peer_port": 0}
    values.update(kw)
    return NodeConfig(**values)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_members_see_each_others_names(certs: DevCerts) -> None:
    server_cfg, client_cfg = _config(certs, "node1"), _config(certs, "node2")
    seen: asyncio.Future[frozenset[str]] = asyncio.get_running_loop().create_future()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.set_result(tls.peer_cert_names(writer))
        writer.write(await reader.readexactly(5))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(accept, "127.0.0.1", 0, ssl=tls.peer_server_context(server_cfg))
    port = server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, **tls.peer_dial_tls(client_cfg, "127.0.0.1"))
        assert tls.peer_cert_names(writer) == {"node1", "localhost", "peer.example"}
        writer.write(b"hello")
        assert await asyncio.wait_for(reader.readexactly(5), 10) == b"hello"
        assert await asyncio.wait_for(seen, 10) == {"node2", "localhost", "peer.example"}
        writer.close()

        # a certificate from another CA is refused by the peer port
        other = make_dev_certs(certs.dir.parent / "other", ["node2"])
        stranger = ssl.create_default_context(cafile=str(certs.ca))
        stranger.load_cert_chain(*other.nodes["node2"])
        with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=stranger,
                                                           server_hostname="127.0.0.1")
            writer.write(b"hello")
            await reader.readexactly(5)  # TLS 1.3: the refusal arrives on the first read
    finally:
        server.close()
        await server.wait_closed()


def test_which_contexts_a_configuration_gets(certs: DevCerts, caplog: pytest.LogCaptureFixture) -> None:
    plain = NodeConfig(peer_port=0)
    assert tls.client_server_context(plain) is None and tls.peer_server_context(plain) is None
    assert tls.peer_dial_tls(plain, "h") == {}
    full = _config(certs, "node1")
    assert tls.client_server_context(full) is not None and tls.console_context(full) is not None
    assert tls.peer_server_context(full) is not None
    assert tls.peer_server_context(full).verify_mode is ssl.CERT_REQUIRED  # type: ignore[union-attr]
    off = _config(certs, "node1", peer_tls="off")
    assert tls.peer_server_context(off) is None and tls.peer_dial_tls(off, "h") == {}
    with caplog.at_level(logging.WARNING, logger="tandem.broker"):
        tls.check(off)
    assert "peer_tls = \"off\": the peer links of node1 are plaintext" in caplog.text
    no_ca = _config(certs, "node1", tls_ca=None)
    assert tls.client_server_context(no_ca) is not None  # a single node needs no CA
    with pytest.raises(ConfigError, match="TLS on peer links needs tls_ca"):
        tls.check(no_ca)
