"""The group secret file (broker.security.secret) and the peer handshake's place in the protocol's state table."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

import pytest

from broker.config import ConfigError, NodeConfig
from broker.security.secret import DECOY_KEY_FILE, decoy_key, ensure_secret, group_secret, load_secret, new_secret
from client.protocol import ProtocolConnection, Role
from client.protocol.codec import FrameError, encode
from client.protocol.connection import State
from client.protocol.frames import Forward, PeerChallenge, PeerHello, PeerProof, PeerWelcome, Replicate


def member(tmp_path: Path, **kw: object) -> NodeConfig:
    return NodeConfig(name="node1", data_dir=tmp_path / "node1", peer_port=0, peers=("node2=127.0.0.1:1",),
                      **kw)  # type: ignore[arg-type]


def test_new_secret_is_private_and_never_replaced_unless_forced(tmp_path: Path) -> None:
    path = tmp_path / "s"
    new_secret(path)
    first = path.read_bytes()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(first.strip()) == 64
    with pytest.raises(ConfigError, match="exists already"):
        new_secret(path)
    new_secret(path, force=True)
    assert path.read_bytes() != first
    assert ensure_secret(path) == path and path.read_bytes() != first  # kept, not remade


def test_load_secret_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file .*tandem secret new"):
        load_secret(tmp_path / "missing")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="empty: it is empty"):
        load_secret(tmp_path / "empty")
    with pytest.raises(ConfigError, match="not a regular file"):
        load_secret(tmp_path)


def test_a_secret_others_may_read_is_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "s"
    new_secret(path)
    with caplog.at_level(logging.WARNING, logger="tandem.ha"):
        load_secret(path)
        assert not caplog.records
        path.chmod(0o640)
        assert load_secret(path) == path.read_bytes().strip()
    assert "readable by other users (mode 640): chmod 600" in caplog.text


def test_who_needs_a_secret(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="member of a replication group and has no group secret"):
        group_secret(member(tmp_path))
    assert group_secret(NodeConfig(data_dir=tmp_path / "n")) is None  # a single node
    assert group_secret(NodeConfig(data_dir=tmp_path / "n", peer_port=0)) is None  # a group of one
    ca = tmp_path / "ca.pem"
    tls = {"tls_cert": tmp_path / "n.pem", "tls_key": tmp_path / "n.key", "tls_ca": ca}
    assert group_secret(member(tmp_path, **tls)) is None  # mutual TLS authenticates the links
    with pytest.raises(ConfigError, match="no group secret"):
        group_secret(member(tmp_path, peer_tls="off", **tls))
    new_secret(tmp_path / "s")
    assert group_secret(member(tmp_path, cluster_secret_file=tmp_path / "s")) == (tmp_path / "s").read_bytes().strip()


def test_without_a_group_secret_the_decoy_key_is_the_nodes_own_made_once(tmp_path: Path) -> None:
    key = decoy_key(None, tmp_path)
    path = tmp_path / DECOY_KEY_FILE
    assert path.read_bytes() == key and len(key) == 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert decoy_key(None, tmp_path) == key  # read again at the next start
    assert not list(tmp_path.glob(".*"))  # no temporary file left
    (tmp_path / "other").mkdir()
    assert decoy_key(None, tmp_path / "other") != key  # another node's data dir, another key
    secret = b"0123456789abcdef0123456789abcdef"
    assert decoy_key(secret, tmp_path) == decoy_key(secret, tmp_path / "elsewhere") != key  # the group's


def test_a_decoy_key_file_that_is_short_or_unreadable_stops_the_start(tmp_path: Path) -> None:
    path = tmp_path / DECOY_KEY_FILE
    path.write_bytes(b"short")
    with pytest.raises(ConfigError, match=r"decoy key .*decoy-key: it holds 5 bytes, not 32 \(remove it"):
        decoy_key(None, tmp_path)
    path.unlink()
    path.mkdir()
    with pytest.raises(ConfigError, match="decoy key .*decoy-key: cannot read it"):
        decoy_key(None, tmp_path)
    with pytest.raises(ConfigError, match="decoy key .*: cannot make it"):
        decoy_key(None, tmp_path / "no" / "such" / "dir")


def hello() -> PeerHello:
    return PeerHello(min_version=1, max_version=1, node="node1", store_stamp="s", priority=1, votes=1, nonce=b"n" * 32)


def test_the_acceptor_reads_nothing_but_the_proof_before_its_welcome() -> None:
    for early in (Forward(rid=1, kind=3, payload=b""), Replicate(payload=b""), hello()):
        server = ProtocolConnection(Role.SERVER)
        server.receive_data(encode(hello()))
        assert isinstance(server.next_event(), PeerHello)
        server.send(PeerChallenge(node="node2", nonce=b"a" * 32))
        server.receive_data(encode(early))
        with pytest.raises(FrameError, match="cannot be received in state HELLO_RECEIVED"):
            server.next_event()
        assert server.state is State.ERROR


def test_the_handshake_in_the_state_table() -> None:
    client, server = ProtocolConnection(Role.CLIENT), ProtocolConnection(Role.SERVER)
    server.receive_data(client.send(hello()))
    assert isinstance(server.next_event(), PeerHello)
    client.receive_data(server.send(PeerChallenge(node="node2", nonce=b"a" * 32)))
    assert isinstance(client.next_event(), PeerChallenge)
    server.receive_data(client.send(PeerProof(proof=b"p" * 32)))
    assert isinstance(server.next_event(), PeerProof)
    client.receive_data(server.send(PeerProof(proof=b"q" * 32)))
    client.receive_data(server.send(PeerWelcome(version=1, node="node2", store_stamp="t", priority=1, votes=1)))
    assert isinstance(client.next_event(), PeerProof) and isinstance(client.next_event(), PeerWelcome)
    assert client.state is State.OPEN and server.state is State.OPEN
    server.receive_data(encode(PeerProof(proof=b"late")))  # a proof once the link is open: out of turn
    with pytest.raises(FrameError):
        server.next_event()
