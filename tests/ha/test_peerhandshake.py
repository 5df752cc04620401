"""The peer link handshake (ha.peerhandshake) driven in-process: a dialer and an acceptor
machine handed each other's messages, time passed in, no socket and no clock."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from ha.errors import IllegalTransition
from ha.membership import NodeIdentity
from ha.peerauth import Refusal, Side, proof
from ha.peerhandshake import (
    Accepted,
    Challenge,
    Dropped,
    GaveUp,
    Hello,
    Intruder,
    Other,
    Outcome,
    PeerHandshake,
    Proof,
    Received,
    Refuse,
    Refused,
    RefusedBy,
    State,
    Step,
    Welcome,
)

SECRET = b"0123456789abcdef0123456789abcdef"
OTHER_SECRET = b"another secret, just as long as!"
NODE1 = NodeIdentity(name="node1", store_stamp="18c-00000001")
NODE2 = NodeIdentity(name="node2", store_stamp="18c-00000002")
TIMEOUT = 5.0


def dialer(secret: bytes | None = SECRET, *, me: NodeIdentity = NODE1, peer: str | None = "node2",
           nonce: bytes = b"d" * 32, now: float = 0.0, **kw: Any) -> PeerHandshake:
    return PeerHandshake.dialer(me, secret=secret, nonce=nonce, peer=peer, remote="10.0.0.2:7771", now=now,
                                timeout=TIMEOUT, **kw)


def acceptor(secret: bytes | None = SECRET, *, me: NodeIdentity = NODE2, members: tuple[str, ...] = ("node1",),
             host: str = "10.0.0.1", permitted: tuple[str, ...] = (), mtls: bool = False, nonce: bytes = b"a" * 32,
             now: float = 0.0, **kw: Any) -> PeerHandshake:
    return PeerHandshake.acceptor(me, secret=secret, mtls=mtls, nonce=nonce, members=members, host=host,
                                  permitted_nodes=permitted, permitted_as_set=permitted, now=now, timeout=TIMEOUT, **kw)


def welcome_for(hs: PeerHandshake) -> Welcome:
    return Welcome(hs.me.name, hs.me.store_stamp)


@dataclass
class Pair:
    """The two ends, each message handed over as it is sent; the acceptor's Proof and Welcome
    follow its Accepted (the shell sends them once it has admitted the dialer)."""

    d: PeerHandshake
    a: PeerHandshake
    now: float = 0.0
    wire: list[tuple[str, object]] = field(default_factory=list)  # (sender, message), in order

    def run(self) -> tuple[Outcome | None, Outcome | None]:
        to_acceptor = list(self.d.start().send)
        dialer_out: Outcome | None = None
        acceptor_out: Outcome | None = None
        while to_acceptor and acceptor_out is None:
            msg = to_acceptor.pop(0)
            self.wire.append(("dialer", msg))
            step = self.a.receive(msg, self.now)
            acceptor_out = step.outcome
            replies: list[Received] = list(step.send)
            if isinstance(acceptor_out, Accepted):
                if acceptor_out.proof is not None:
                    replies.append(Proof(acceptor_out.proof))
                replies.append(welcome_for(self.a))
            elif isinstance(acceptor_out, Refuse):
                replies.append(Refused(acceptor_out.why))
            for reply in replies:
                if dialer_out is not None:
                    break
                self.wire.append(("acceptor", reply))
                dstep = self.d.receive(reply, self.now)
                dialer_out = dstep.outcome
                to_acceptor.extend(dstep.send)
        return dialer_out, acceptor_out


# -- the handshake as it should go ----------------------------------------------------------------


def test_two_members_with_the_secret_accept_each_other() -> None:
    p = Pair(dialer(), acceptor())
    d, a = p.run()
    assert isinstance(a, Accepted) and a.node == "node1" and a.proof is not None
    assert d == Accepted("node2")
    assert [type(m).__name__ for _who, m in p.wire] == ["Hello", "Challenge", "Proof", "Proof", "Welcome"]
    assert p.d.state is State.DONE and p.a.state is State.DONE
    assert all(SECRET.decode() not in repr(m) for _who, m in p.wire)


def test_a_seed_is_accepted_as_the_member_it_proves_to_be() -> None:
    p = Pair(dialer(peer=None), acceptor())
    d, _a = p.run()
    assert d == Accepted("node2") and p.d.peer == "node2"


def test_mutual_tls_without_a_secret_checks_the_certificates_names() -> None:
    cert1 = {"subjectAltName": (("DNS", "node1"),)}
    cert2 = {"subject": ((("commonName", "node2"),),)}
    p = Pair(dialer(None, tls=True, cert=cert2), acceptor(None, mtls=True, tls=True, cert=cert1))
    d, a = p.run()
    assert a == Accepted("node1", None) and d == Accepted("node2")
    assert [type(m).__name__ for _who, m in p.wire] == ["Hello", "Welcome"]


# -- refusals -------------------------------------------------------------------------------------


def test_a_dialer_with_the_wrong_secret_is_an_intruder_and_learns_nothing() -> None:
    p = Pair(dialer(OTHER_SECRET), acceptor())
    d, a = p.run()
    assert a == Intruder(Refusal.BAD_PROOF, "its proof does not match: it holds another group secret, or none")
    assert d is None  # the shell closes the link: the dialer sees it end
    assert not any(isinstance(m, Welcome | Proof) for who, m in p.wire if who == "acceptor")


def test_an_acceptor_with_the_wrong_secret_is_an_intruder_to_the_dialer() -> None:
    d = dialer()
    d.start()
    d.receive(Challenge("node2", b"a" * 32), 0.0)
    forged = proof(OTHER_SECRET, Side.ACCEPTOR, dialer_nonce=b"d" * 32, acceptor_nonce=b"a" * 32, prover="node2",
                   prover_stamp=NODE2.store_stamp, verifier="node1")
    assert d.receive(Proof(forged), 0.0) == Step()
    assert d.receive(welcome_for(acceptor()), 0.0).outcome == Intruder(
        Refusal.BAD_PROOF, "its proof does not match: it holds another group secret, or none")


def test_a_replayed_proof_fails_on_a_link_with_another_nonce() -> None:
    first = Pair(dialer(), acceptor(nonce=b"a" * 32))
    first.run()
    recorded = next(m for who, m in first.wire if who == "dialer" and isinstance(m, Proof))
    hello = next(m for who, m in first.wire if who == "dialer" and isinstance(m, Hello))
    a = acceptor(nonce=b"A" * 32)  # a fresh nonce on the new link
    assert a.receive(hello, 0.0).send == (Challenge("node2", b"A" * 32),)
    assert a.receive(recorded, 0.0).outcome == Intruder(
        Refusal.BAD_PROOF, "its proof does not match: it holds another group secret, or none")


def test_an_unknown_name_is_a_not_member_intruder_without_the_secret() -> None:
    p = Pair(dialer(OTHER_SECRET, me=NodeIdentity("stranger", "s")), acceptor())
    _d, a = p.run()
    assert a == Intruder(Refusal.NOT_MEMBER, "not a member of this group (its proof does not match: it holds "
                                             "another group secret, or none)")


def test_a_removed_member_with_the_secret_is_told_why() -> None:
    p = Pair(dialer(me=NodeIdentity("node3", "s3")), acceptor(members=("node1",)))
    d, a = p.run()
    assert isinstance(a, Refuse) and a.why.startswith("node3 is not a member of this group (removed with")
    assert isinstance(d, RefusedBy) and d.message == a.why


def test_permitted_nodes_refuse_a_member_from_another_address() -> None:
    a = acceptor(permitted=("node1@10.0.0.9",), host="10.0.0.1")
    assert a.receive(Hello("node1", "s", b"d" * 32), 0.0).outcome == Intruder(
        Refusal.NOT_PERMITTED, "not permitted from 10.0.0.1 (permitted_nodes: node1@10.0.0.9)")
    a = acceptor(permitted=("node1@10.0.0.1",), host="10.0.0.1")
    assert a.receive(Hello("node1", "s", b"d" * 32), 0.0).send == (Challenge("node2", b"a" * 32),)


def test_a_dialer_with_this_nodes_name_is_refused_as_a_duplicate() -> None:
    out = acceptor().receive(Hello("node2", "other", b"d" * 32), 0.0).outcome
    assert isinstance(out, Refuse) and out.why.startswith("duplicate location: a node named 'node2'")


def test_an_acceptor_without_secret_or_mutual_tls_admits_nobody() -> None:
    out = acceptor(None).receive(Hello("node1", "s"), 0.0).outcome
    assert out == Refuse("node2 has no group secret and no mutual TLS: it admits no peer")


@pytest.mark.parametrize("tls, cert, why", [
    (False, None, "the link is not TLS, and this node authenticates peers by their certificates"),
    (True, None, "it presented no certificate"),
    (True, {"subjectAltName": (("DNS", "node9"),)}, "its certificate names node9, not node1"),
])
def test_mutual_tls_refuses_a_certificate_that_is_not_the_named_nodes(tls: bool, cert: dict[str, Any] | None,
                                                                     why: str) -> None:
    out = acceptor(None, mtls=True, tls=tls, cert=cert).receive(Hello("node1", "s"), 0.0).outcome
    assert out == Intruder(Refusal.BAD_PROOF, why)


def test_a_hello_without_a_nonce_proves_nothing() -> None:
    out = acceptor().receive(Hello("node1", "s", b""), 0.0).outcome
    assert out == Intruder(Refusal.NO_PROOF, "its PeerHello has no nonce: it does not prove the group secret")


def test_the_dialer_refuses_an_acceptor_with_another_name_or_a_short_nonce() -> None:
    d = dialer()
    d.start()
    assert d.receive(Challenge("node3", b"a" * 32), 0.0).outcome == Intruder(
        Refusal.WRONG_NAME, "the node at 10.0.0.2:7771 says it is node3, not node2")
    d = dialer()
    d.start()
    assert d.receive(Challenge("node2", b"a" * 4), 0.0).outcome == Intruder(
        Refusal.GARBAGE, "a challenge nonce of 4 bytes")


def test_the_dialer_learns_it_was_refused_and_without_a_secret_drops_a_challenge() -> None:
    d = dialer()
    d.start()
    assert d.receive(Refused("refused as MismatchedSettings: ..."), 0.0).outcome == RefusedBy(
        "refused as MismatchedSettings: ...")
    d = dialer(None)
    assert d.start().send == (Hello("node1", NODE1.store_stamp, b""),)
    assert isinstance(d.receive(Challenge("node2", b"a" * 32), 0.0).outcome, Dropped)


# -- out of order, garbage, the end of the link, time --------------------------------------------


def test_frames_out_of_order_fail_the_handshake() -> None:
    assert acceptor().receive(Proof(b"x" * 32), 0.0).outcome == Intruder(
        Refusal.GARBAGE, "expected PeerHello, got PeerProof")
    a = acceptor()
    a.receive(Hello("node1", "s", b"d" * 32), 0.0)
    assert a.receive(Other("Replicate"), 0.0).outcome == Intruder(Refusal.NO_PROOF, "sent Replicate instead of its proof")
    d = dialer()
    d.start()
    assert d.receive(welcome_for(acceptor()), 0.0).outcome == Intruder(
        Refusal.NO_PROOF, "answered PeerWelcome without a challenge: it does not prove the group secret")
    d = dialer()
    d.start()
    d.receive(Challenge("node2", b"a" * 32), 0.0)
    d.receive(Proof(b"p" * 32), 0.0)
    assert d.receive(Refused("no"), 0.0).outcome == Intruder(Refusal.GARBAGE, "expected PeerWelcome, got Error")


def test_garbage_before_and_after_the_challenge() -> None:
    assert acceptor().garbage("frame too large").outcome == Intruder(Refusal.GARBAGE, "frame too large")
    a = acceptor()
    a.receive(Hello("node1", "s", b"d" * 32), 0.0)
    assert a.garbage("unexpected Heartbeat").outcome == Intruder(
        Refusal.NO_PROOF, "unexpected Heartbeat: no proof of the group secret")
    d = dialer()
    d.start()
    assert d.garbage("bad bytes").outcome == Intruder(Refusal.GARBAGE, "bad bytes")


def test_a_link_that_ends_without_a_word_is_nobodys_fault_after_a_hello_it_is() -> None:
    assert isinstance(acceptor().closed().outcome, GaveUp)  # a port probe
    a = acceptor()
    a.receive(Hello("node1", "s", b"d" * 32), 0.0)
    assert a.closed().outcome == Intruder(Refusal.NO_PROOF, "the connection closed before the handshake completed")
    a = acceptor()
    a.receive(Hello("stranger", "s", b"d" * 32), 0.0)
    assert a.closed().outcome == Intruder(
        Refusal.NOT_MEMBER, "not a member of this group (the connection closed before the handshake completed)")
    d = dialer()
    d.start()
    assert isinstance(d.closed().outcome, GaveUp)


def test_the_deadline_is_the_time_passed_in() -> None:
    a = acceptor(now=100.0)
    a.receive(Hello("node1", "s", b"d" * 32), 101.0)
    assert a.tick(104.9) == Step() and a.state is State.AWAIT_PROOF
    assert a.tick(105.0).outcome == Intruder(Refusal.TIMEOUT, "no complete handshake within 5 s")
    late = acceptor(now=100.0)
    assert late.receive(Hello("node1", "s", b"d" * 32), 106.0).outcome == Intruder(
        Refusal.TIMEOUT, "no complete handshake within 5 s")
    d = dialer(now=100.0)
    d.start()
    assert d.tick(105.0).outcome == GaveUp("no complete handshake within 5 s")  # not an intruder


def test_a_finished_handshake_takes_nothing_more() -> None:
    a = acceptor()
    a.receive(Proof(b"x"), 0.0)
    with pytest.raises(IllegalTransition):
        a.receive(Hello("node1", "s", b"d" * 32), 0.0)
    with pytest.raises(IllegalTransition):
        a.closed()
    assert a.tick(1e9) == Step()
    with pytest.raises(IllegalTransition):
        acceptor().start()
    d = dialer()
    with pytest.raises(IllegalTransition):
        d.receive(Challenge("node2", b"a" * 32), 0.0)  # before its Hello
