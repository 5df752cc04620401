"""Peer authentication: the proofs a peer link's two ends exchange, and who may join.

Pure functions (no I/O, no clock): :mod:`broker.peers.peers` runs the handshake over the
socket and calls these.  The handshake (docs/security.md, "Peer authentication")::

    dialer                                       acceptor
      PeerHello   {node, store_stamp, nonce=Nd}  ->
                                                 <-  PeerChallenge {node, nonce=Na}
      PeerProof   {proof=P(dialer)}              ->
                                                 <-  PeerProof {proof=P(acceptor)}
                                                 <-  PeerWelcome {node, store_stamp}

``P(role) = HMAC-SHA256(secret, encode(LABEL, role, Nd, Na, prover, prover's store stamp,
verifier))``: both nonces (each end's own makes the proof fresh for it), the direction,
the prover's name and store stamp, and the name of the node it talks to.  The secret never
travels; a proof is good for one link, one direction and one pair of names only.  Each
field is length-prefixed, so no two different field lists encode to the same bytes.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from enum import Enum
from typing import Any

#: the domain of these proofs: an HMAC under the group secret made for anything else never matches
LABEL = b"tandem peer link proof v1"
NONCE_SIZE = 32
#: nonces outside these bounds are refused (a short one would let a proof be replayed)
MIN_NONCE, MAX_NONCE = 16, 64
#: the shortest group secret accepted (bytes of the file's text, whitespace stripped)
MIN_SECRET = 16


class Side(Enum):
    """Which end of the link makes the proof."""

    DIALER = "dialer"
    ACCEPTOR = "acceptor"


class Refusal(Enum):
    """Why a peer link was refused as an intruder (the ``reason`` label of
    ``tandem_intruders_total``)."""

    BAD_PROOF = "bad_proof"  # a proof that does not match: the wrong secret, or a forgery
    NO_PROOF = "no_proof"  # the handshake went on without a proof (no nonce, another frame, EOF)
    NOT_MEMBER = "not_member"  # a name that is not in this node's group
    NOT_PERMITTED = "not_permitted"  # a member's name, refused by permitted_nodes (name or address)
    WRONG_NAME = "wrong_name"  # the node dialled answered with another name
    GARBAGE = "garbage"  # bytes that are not a peer handshake
    TIMEOUT = "timeout"  # no complete handshake within the handshake timeout
    TLS = "tls"  # the TLS handshake failed: no certificate, one the group's CA did not sign, or not TLS


def new_nonce() -> bytes:
    """A fresh random nonce (``secrets``)."""
    return secrets.token_bytes(NONCE_SIZE)


def nonce_ok(nonce: bytes) -> bool:
    return MIN_NONCE <= len(nonce) <= MAX_NONCE


def _field(value: bytes) -> bytes:
    return len(value).to_bytes(4, "big") + value


def proof(secret: bytes, side: Side, *, dialer_nonce: bytes, acceptor_nonce: bytes, prover: str,
          prover_stamp: str, verifier: str) -> bytes:
    """The proof ``prover`` (at ``side`` of the link) sends ``verifier``."""
    if not secret:
        raise ValueError("peer proof: the group secret is empty")
    msg = b"".join(_field(v) for v in (LABEL, side.value.encode(), dialer_nonce, acceptor_nonce,
                                       prover.encode(), prover_stamp.encode(), verifier.encode()))
    return hmac.new(secret, msg, hashlib.sha256).digest()


def verify(secret: bytes, side: Side, received: bytes, *, dialer_nonce: bytes, acceptor_nonce: bytes,
           prover: str, prover_stamp: str, verifier: str) -> bool:
    """Whether ``received`` is the proof ``prover`` at ``side`` owes ``verifier`` (constant time)."""
    if not nonce_ok(dialer_nonce) or not nonce_ok(acceptor_nonce):
        return False
    expected = proof(secret, side, dialer_nonce=dialer_nonce, acceptor_nonce=acceptor_nonce, prover=prover,
                     prover_stamp=prover_stamp, verifier=verifier)
    return hmac.compare_digest(expected, received)


def permitted(name: str, host: str, permitted_nodes: tuple[str, ...], members: tuple[str, ...]) -> bool:
    """Whether node ``name``, connecting from address ``host``, may join.

    ``permitted_nodes`` holds ``"NAME"`` (from anywhere) or ``"NAME@HOST"`` (only from that
    address; several entries for one name allow several addresses).  Empty: every name in
    ``members`` (the group's peers), from anywhere.  A name outside ``members`` never joins:
    this node has no address for it and counts no vote of it.
    """
    if name not in members:
        return False
    if not permitted_nodes:
        return True
    for spec in permitted_nodes:
        who, at, where = spec.partition("@")
        if who == name and (not at or where == host):
            return True
    return False


def parse_secret(text: bytes) -> bytes:
    """The key a secret file holds: its text with surrounding whitespace stripped.
    ValueError (with what is wrong) when it is empty or too short."""
    key = text.strip()
    if not key:
        raise ValueError("it is empty")
    if len(key) < MIN_SECRET:
        raise ValueError(f"it holds {len(key)} bytes; at least {MIN_SECRET} are needed")
    return key


def certificate_names(cert: dict[str, Any]) -> set[str]:
    """The names a peer certificate (``ssl.SSLSocket.getpeercert()``'s dict) is issued to: its
    subjectAltName DNS entries, else its subject's commonName (as RFC 6125 has it)."""
    names = {value for kind, value in cert.get("subjectAltName", ()) if kind == "DNS"}
    if names:
        return names
    return {value for rdn in cert.get("subject", ()) for key, value in rdn if key == "commonName"}
