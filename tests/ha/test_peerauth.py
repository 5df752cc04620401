"""The proofs of peer authentication (ha.peerauth): pure functions, checked field by field."""

from __future__ import annotations

import dataclasses

import pytest

from ha.peerauth import (
    MIN_SECRET,
    Side,
    certificate_names,
    new_nonce,
    nonce_ok,
    parse_secret,
    permitted,
    proof,
    verify,
)

SECRET = b"0123456789abcdef0123456789abcdef"


@dataclasses.dataclass(frozen=True)
class Args:
    dialer_nonce: bytes = b"d" * 32
    acceptor_nonce: bytes = b"a" * 32
    prover: str = "node1"
    prover_stamp: str = "18c-1a2b3c4d"
    verifier: str = "node2"


def make(side: Side = Side.DIALER, secret: bytes = SECRET, **kw: object) -> bytes:
    return proof(secret, side, **dataclasses.asdict(dataclasses.replace(Args(), **kw)))  # type: ignore[arg-type]


def check(received: bytes, side: Side = Side.DIALER, secret: bytes = SECRET, **kw: object) -> bool:
    return verify(secret, side, received, **dataclasses.asdict(dataclasses.replace(Args(), **kw)))  # type: ignore[arg-type]


def test_a_proof_verifies_under_the_same_secret_and_fields() -> None:
    p = make()
    assert len(p) == 32  # HMAC-SHA256
    assert check(p)
    assert SECRET not in p


@pytest.mark.parametrize("change", [
    {"secret": b"another secret, just as long!!"},
    {"side": Side.ACCEPTOR},
    {"dialer_nonce": b"D" * 32},
    {"acceptor_nonce": b"A" * 32},
    {"prover": "node3"},
    {"prover_stamp": "18c-00000000"},
    {"verifier": "node3"},
])
def test_every_bound_field_changes_the_proof(change: dict[str, object]) -> None:
    assert not check(make(), **change)  # type: ignore[arg-type]


def test_the_two_directions_never_share_a_proof() -> None:
    """A dialer's proof replayed as the acceptor's (or back) does not verify."""
    assert not check(make(Side.DIALER), Side.ACCEPTOR)
    assert not check(make(Side.ACCEPTOR), Side.DIALER)


def test_fields_are_length_prefixed() -> None:
    """Moving bytes from one field to the next makes another proof."""
    assert make(prover="node1", prover_stamp="2x") != make(prover="node12", prover_stamp="x")


def test_short_or_long_nonces_never_verify() -> None:
    for n in (b"", b"x" * 15, b"x" * 65):
        assert not nonce_ok(n)
        assert not check(make(dialer_nonce=n), dialer_nonce=n)
        assert not check(make(acceptor_nonce=n), acceptor_nonce=n)
    assert nonce_ok(new_nonce()) and new_nonce() != new_nonce()


def test_a_wrong_length_proof_is_refused() -> None:
    assert not check(b"")
    assert not check(make()[:16])


def test_an_empty_secret_makes_no_proof() -> None:
    with pytest.raises(ValueError, match="empty"):
        make(secret=b"")


def test_permitted_nodes() -> None:
    members = ("node1", "node2", "node3")
    assert permitted("node2", "10.0.0.2", (), members)  # empty: the peers, from anywhere
    assert not permitted("node9", "10.0.0.9", (), members)  # never a non-member
    assert not permitted("node9", "10.0.0.9", ("node9",), members)
    rules = ("node1", "node2@10.0.0.2", "node2@10.0.0.22")
    assert permitted("node1", "192.0.2.1", rules, members)
    assert permitted("node2", "10.0.0.2", rules, members) and permitted("node2", "10.0.0.22", rules, members)
    assert not permitted("node2", "10.0.0.3", rules, members)
    assert not permitted("node3", "10.0.0.3", rules, members)  # a member left out of the list


def test_parse_secret() -> None:
    assert parse_secret(b"  " + SECRET + b"\n") == SECRET
    with pytest.raises(ValueError, match="empty"):
        parse_secret(b" \n")
    with pytest.raises(ValueError, match=f"at least {MIN_SECRET}"):
        parse_secret(b"short")


def test_certificate_names() -> None:
    cert = {"subject": ((("commonName", "node1"),),), "subjectAltName": (("DNS", "node1"), ("IP Address", "10.0.0.1"))}
    assert certificate_names(cert) == {"node1"}
    assert certificate_names({"subject": ((("commonName", "node2"),),)}) == {"node2"}
    assert certificate_names({}) == set()
