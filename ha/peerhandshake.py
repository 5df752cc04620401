"""The peer link handshake as a state machine: what each end checks, sends and decides.

Sans-IO: :class:`PeerHandshake` is fed what arrives on the link (:meth:`~PeerHandshake.receive`,
:meth:`~PeerHandshake.garbage`, :meth:`~PeerHandshake.closed`) and the time
(:meth:`~PeerHandshake.tick`), and returns a :class:`Step`: what to send, and once it is
decided, the outcome.  It reads no socket and no clock; :mod:`broker.peers.handshake` moves
the frames.  The messages below carry the handshake's fields only; the shell adds the rest of
each frame (versions, priority, placement, addresses).

With a group secret (``ha.peerauth`` has the proofs)::

    dialer                                       acceptor
      Hello     {node, store_stamp, nonce=Nd}  ->                       AWAIT_HELLO
      (AWAIT_CHALLENGE)                          <-  Challenge {node, nonce=Na}
      Proof     {P(dialer)}                    ->                       AWAIT_PROOF
      (AWAIT_PROOF)                                  Accepted: the shell admits the dialer, then
                                                 <-  Proof {P(acceptor)}
      (AWAIT_WELCOME)                            <-  Welcome {node, store_stamp}
      Accepted

Without one (mutual TLS), the acceptor checks the dialer's certificate on its Hello and the
dialer the acceptor's on its Welcome; no challenge, no proofs.  An acceptor with neither
refuses every dialer.

Outcomes: :class:`Accepted`; :class:`Refuse` (the acceptor tells a node it cannot admit as it
is configured why: not an intruder); :class:`Intruder` (the other end did not prove who it
claimed to be: a :class:`ha.peerauth.Refusal`); :class:`RefusedBy` and :class:`Dropped` (the
dialer was refused, or asked for a secret it lacks); :class:`GaveUp` (the link ended or the
time ran out with nothing to hold against anyone: a dialer's timeout, a port probe).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar

from ha.errors import IllegalTransition
from ha.membership import NodeIdentity
from ha.peerauth import Refusal, Side, certificate_names, nonce_ok, permitted, proof, verify

# -- what travels ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello:
    """The dialer introduces itself (``PeerHello``); ``nonce`` empty without a group secret."""

    KIND: ClassVar[str] = "PeerHello"
    node: str
    store_stamp: str
    nonce: bytes = b""


@dataclass(frozen=True, slots=True)
class Challenge:
    """The acceptor's answer to a Hello when the group has a secret (``PeerChallenge``)."""

    KIND: ClassVar[str] = "PeerChallenge"
    node: str
    nonce: bytes


@dataclass(frozen=True, slots=True)
class Proof:
    """One end's proof of the group secret (``PeerProof``)."""

    KIND: ClassVar[str] = "PeerProof"
    proof: bytes


@dataclass(frozen=True, slots=True)
class Welcome:
    """The acceptor admits the dialer (``PeerWelcome``)."""

    KIND: ClassVar[str] = "PeerWelcome"
    node: str
    store_stamp: str


@dataclass(frozen=True, slots=True)
class Refused:
    """The acceptor refused the dialer, in words (an ``Error`` frame)."""

    KIND: ClassVar[str] = "Error"
    message: str


@dataclass(frozen=True, slots=True)
class Other:
    """Any other frame, by the name of its type."""

    kind: str


Received = Hello | Challenge | Proof | Welcome | Refused | Other
Sent = Hello | Challenge | Proof

# -- outcomes --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Accepted:
    """The other end is ``node``, proved.  For an acceptor, ``proof``: its own, to send just
    before its Welcome once the shell has admitted the dialer (None: no group secret)."""

    node: str
    proof: bytes | None = None


@dataclass(frozen=True, slots=True)
class Refuse:
    """The acceptor refuses a node it cannot admit as things are (this node's own name, no way
    to authenticate, a proved node that is no member), and tells it ``why``."""

    why: str


@dataclass(frozen=True, slots=True)
class Intruder:
    """Authentication failed: logged, counted per ``reason`` and kept among the events."""

    reason: Refusal
    why: str


@dataclass(frozen=True, slots=True)
class RefusedBy:
    """The dialer: the acceptor refused this node, in its ``message``."""

    message: str


@dataclass(frozen=True, slots=True)
class Dropped:
    """The dialer: the acceptor asks for a group secret this node does not have."""

    why: str


@dataclass(frozen=True, slots=True)
class GaveUp:
    """The link ended, or the time ran out, and nobody is to blame for it (a dialer's peer that
    does not answer, a connection to the acceptor that closed before a word)."""

    why: str


Outcome = Accepted | Refuse | Intruder | RefusedBy | Dropped | GaveUp


@dataclass(frozen=True, slots=True)
class Step:
    """What the shell sends now, in order, and the outcome once there is one."""

    send: tuple[Sent, ...] = ()
    outcome: Outcome | None = None


# -- the machine -----------------------------------------------------------------------------------


class State(Enum):
    START = "start"  # a dialer that has sent nothing yet
    AWAIT_HELLO = "await_hello"  # an acceptor
    AWAIT_CHALLENGE = "await_challenge"  # a dialer: its Hello sent (without a secret, the Welcome is due)
    AWAIT_PROOF = "await_proof"  # an acceptor that challenged, or a dialer that sent its proof
    AWAIT_WELCOME = "await_welcome"  # a dialer that has the acceptor's proof
    DONE = "done"  # an outcome reached: nothing more is taken


#: state -> the states it may move to; any other move is a bug (IllegalTransition)
TRANSITIONS: dict[State, frozenset[State]] = {
    State.START: frozenset({State.AWAIT_CHALLENGE}),
    State.AWAIT_HELLO: frozenset({State.AWAIT_PROOF, State.DONE}),
    State.AWAIT_CHALLENGE: frozenset({State.AWAIT_PROOF, State.DONE}),
    State.AWAIT_PROOF: frozenset({State.AWAIT_WELCOME, State.DONE}),
    State.AWAIT_WELCOME: frozenset({State.DONE}),
    State.DONE: frozenset(),
}

def _kind(m: Received) -> str:
    """The name of the frame ``m`` came in (for the refusals' words)."""
    return m.kind if isinstance(m, Other) else m.KIND


def certificate_refusal(tls: bool, cert: Mapping[str, Any] | None, name: str) -> str | None:
    """Mutual TLS without a group secret: why the other end's certificate (``getpeercert()``'s
    dict; ``tls`` False: the link is not TLS) does not authenticate it as node ``name`` (None:
    it does).  The TLS layer has verified the chain; this checks the certificate is the named
    node's (its subjectAltName DNS names, else its commonName, hold ``name``)."""
    if not tls:
        return "the link is not TLS, and this node authenticates peers by their certificates"
    if not cert:
        return "it presented no certificate"
    names = certificate_names(dict(cert))
    if name not in names:
        return f"its certificate names {', '.join(sorted(names)) or 'nothing'}, not {name}"
    return None


class PeerHandshake:
    """One end of one link's handshake.  Build it with :meth:`dialer` or :meth:`acceptor`; a
    dialer's first :class:`Step` comes from :meth:`start`.  Once a step has an outcome the
    machine is DONE, and feeding it more raises IllegalTransition."""

    def __init__(self, side: Side, me: NodeIdentity, *, secret: bytes | None, nonce: bytes, now: float,
                 timeout: float, tls: bool, cert: Mapping[str, Any] | None) -> None:
        self.side, self.me, self.secret, self.nonce = side, me, secret, nonce
        self.timeout = timeout
        #: when the handshake must be complete (on the clock ``now`` was read from)
        self.deadline = now + timeout
        self.tls, self.cert = tls, cert
        self.state = State.START if side is Side.DIALER else State.AWAIT_HELLO
        #: an acceptor: the name the dialer's Hello claims ("" before it)
        self.claimed = ""
        #: a dialer: the name it expects (None: a seed, whichever member answers); then the one proved
        self.peer: str | None = None
        self.remote = ""
        self.members: Collection[str] = ()
        self.host = ""
        self.permitted_nodes: tuple[str, ...] = ()
        self.permitted_as_set: tuple[str, ...] = ()
        self.mtls = False
        self._hello: Hello | None = None
        self._theirs = b""  # the other end's nonce
        self._their_proof = b""

    @classmethod
    def dialer(cls, me: NodeIdentity, *, secret: bytes | None, nonce: bytes, peer: str | None, remote: str,
               now: float, timeout: float, tls: bool = False, cert: Mapping[str, Any] | None = None) -> PeerHandshake:
        """The dialing end: to prove ``peer`` (None: a seed) at ``remote`` ("host:port", for the
        refusals' words) is who it says; ``nonce`` this end's (empty without a secret);
        ``tls``/``cert`` the link's, checked without a secret."""
        hs = cls(Side.DIALER, me, secret=secret, nonce=nonce if secret is not None else b"", now=now,
                 timeout=timeout, tls=tls, cert=cert)
        hs.peer, hs.remote = peer, remote
        return hs

    @classmethod
    def acceptor(cls, me: NodeIdentity, *, secret: bytes | None, mtls: bool, nonce: bytes, members: Collection[str],
                 host: str, permitted_nodes: tuple[str, ...], permitted_as_set: tuple[str, ...], now: float,
                 timeout: float, tls: bool = False, cert: Mapping[str, Any] | None = None) -> PeerHandshake:
        """The accepting end, for a link from address ``host``.  ``members``: the group's other
        members, read as the handshake goes (the shell's live view: a member removed meanwhile
        is refused); ``permitted_nodes`` as resolved (NAME@ADDRESS), ``permitted_as_set`` as the
        settings say them (for the refusal's words)."""
        hs = cls(Side.ACCEPTOR, me, secret=secret, nonce=nonce, now=now, timeout=timeout, tls=tls, cert=cert)
        hs.mtls, hs.members, hs.host = mtls, members, host
        hs.permitted_nodes, hs.permitted_as_set = permitted_nodes, permitted_as_set
        return hs

    # -- the events -------------------------------------------------------------------------------

    def start(self) -> Step:
        """The dialer's Hello."""
        if self.side is not Side.DIALER:
            raise IllegalTransition("only a dialer starts a handshake")
        self._to(State.AWAIT_CHALLENGE)
        return Step(send=(Hello(self.me.name, self.me.store_stamp, self.nonce),))

    def receive(self, msg: Received, now: float) -> Step:
        """A message from the other end, received at ``now``."""
        late = self.tick(now)
        if late.outcome is not None:
            return late
        handler = _HANDLERS.get((self.side, self.state))
        if handler is None:
            raise IllegalTransition(f"a {self.side.value} in {self.state.value} takes no message")
        return handler(self, msg)

    def garbage(self, message: str) -> Step:
        """Bytes that are no frame, or a frame the link's protocol forbids now (its words)."""
        if self.side is Side.ACCEPTOR and self.state is State.AWAIT_PROOF:
            return self._intruder(Refusal.NO_PROOF, f"{message}: no proof of the group secret")
        return self._intruder(Refusal.GARBAGE, message)

    def closed(self) -> Step:
        """The link ended before an outcome."""
        if self.side is Side.ACCEPTOR and self.claimed:
            return self._intruder(Refusal.NO_PROOF, "the connection closed before the handshake completed")
        # a dialer's peer that went away is no intruder; an acceptor's caller that went without a
        # word (a port probe) claimed nothing
        return self._done(GaveUp("peer link closed"))

    def tick(self, now: float) -> Step:
        """The time is ``now``: past the deadline, the handshake fails."""
        if self.state is State.DONE or now < self.deadline:
            return Step()
        why = f"no complete handshake within {self.timeout:g} s"
        if self.side is Side.DIALER:
            return self._done(GaveUp(why))  # a member that does not answer (a paused one, say): not an intruder
        return self._intruder(Refusal.TIMEOUT, why)

    # -- the acceptor -------------------------------------------------------------------------------

    def _on_hello(self, m: Received) -> Step:
        if not isinstance(m, Hello):
            return self._intruder(Refusal.GARBAGE, f"expected PeerHello, got {_kind(m)}")
        self.claimed = m.node
        self._hello = m
        if m.node == self.me.name:
            return self._done(Refuse(f"duplicate location: a node named {m.node!r} (location code "
                                     f"{self.me.location_code:#x}) is this node"))
        member = m.node in self.members
        if member and not permitted(m.node, self.host, self.permitted_nodes, tuple(self.members)):
            return self._intruder(Refusal.NOT_PERMITTED, f"not permitted from {self.host} (permitted_nodes: "
                                                         f"{', '.join(self.permitted_as_set)})")
        if self.secret is None and not self.mtls:
            return self._done(Refuse(f"{self.me.name} has no group secret and no mutual TLS: it admits no peer"))
        # the proof first: a stranger learns nothing of the members
        if self.secret is None:
            why = certificate_refusal(self.tls, self.cert, m.node)
            if why is not None:
                return self._intruder(Refusal.BAD_PROOF, why)
            return self._proved(m)
        if not nonce_ok(m.nonce):
            return self._intruder(Refusal.NO_PROOF, "its PeerHello has no nonce: it does not prove the group secret")
        self._to(State.AWAIT_PROOF)
        return Step(send=(Challenge(self.me.name, self.nonce),))

    def _on_dialer_proof(self, m: Received) -> Step:
        hello = self._hello
        if hello is None or self.secret is None:
            raise IllegalTransition("a proof is due only after a challenge")
        if not isinstance(m, Proof):
            return self._intruder(Refusal.NO_PROOF, f"sent {_kind(m)} instead of its proof")
        if not verify(self.secret, Side.DIALER, m.proof, dialer_nonce=hello.nonce, acceptor_nonce=self.nonce,
                      prover=hello.node, prover_stamp=hello.store_stamp, verifier=self.me.name):
            return self._intruder(Refusal.BAD_PROOF, "its proof does not match: it holds another group secret, or none")
        return self._proved(hello)

    def _proved(self, hello: Hello) -> Step:
        """The dialer proved it is ``hello.node``: accepted if it is a member; else told why, in plain
        words (it holds the group's secret or certificate: a member removed from the group, most
        likely, that was down when it was told)."""
        if hello.node not in self.members:
            return self._done(Refuse(f"{hello.node} is not a member of this group (removed with tandem group "
                                     f"remove, or never added): it links to no member; stop it, or add it again "
                                     f"with tandem group add"))
        mine = None
        if self.secret is not None:
            mine = proof(self.secret, Side.ACCEPTOR, dialer_nonce=hello.nonce, acceptor_nonce=self.nonce,
                         prover=self.me.name, prover_stamp=self.me.store_stamp, verifier=hello.node)
        return self._done(Accepted(hello.node, mine))

    # -- the dialer ---------------------------------------------------------------------------------

    def _on_answer(self, m: Received) -> Step:
        """The acceptor's answer to the Hello: a challenge (a Welcome without a secret)."""
        if isinstance(m, Refused):
            return self._done(RefusedBy(m.message))
        if self.secret is None:
            if isinstance(m, Challenge):
                return self._done(Dropped("asks for the group secret and this node has none (cluster_secret_file)"))
            return self._on_welcome(m)
        if not isinstance(m, Challenge):
            return self._intruder(Refusal.NO_PROOF, f"answered {_kind(m)} without a challenge: it does not prove the "
                                                    f"group secret")
        name = self.peer or m.node  # (a seed: it proves below that it is the member it names)
        if m.node != name:
            return self._wrong_name(m.node, name)
        if not nonce_ok(m.nonce):
            return self._intruder(Refusal.GARBAGE, f"a challenge nonce of {len(m.nonce)} bytes")
        self.peer, self._theirs = name, m.nonce
        self._to(State.AWAIT_PROOF)
        return Step(send=(Proof(proof(self.secret, Side.DIALER, dialer_nonce=self.nonce, acceptor_nonce=m.nonce,
                                      prover=self.me.name, prover_stamp=self.me.store_stamp, verifier=name)),))

    def _on_acceptor_proof(self, m: Received) -> Step:
        if isinstance(m, Refused):
            return self._done(RefusedBy(m.message))
        if not isinstance(m, Proof):
            return self._intruder(Refusal.NO_PROOF, f"sent {_kind(m)} instead of its proof")
        self._their_proof = m.proof
        self._to(State.AWAIT_WELCOME)
        return Step()

    def _on_welcome(self, m: Received) -> Step:
        if not isinstance(m, Welcome):
            return self._intruder(Refusal.GARBAGE, f"expected PeerWelcome, got {_kind(m)}")
        name = self.peer or m.node
        if m.node != name:
            return self._wrong_name(m.node, name)
        if self.secret is None:
            why = certificate_refusal(self.tls, self.cert, name)
            if why is not None:
                return self._intruder(Refusal.BAD_PROOF, why)
        elif not verify(self.secret, Side.ACCEPTOR, self._their_proof, dialer_nonce=self.nonce,
                        acceptor_nonce=self._theirs, prover=name, prover_stamp=m.store_stamp, verifier=self.me.name):
            return self._intruder(Refusal.BAD_PROOF, "its proof does not match: it holds another group secret, or none")
        self.peer = name
        return self._done(Accepted(name))

    def _wrong_name(self, said: str, expected: str) -> Step:
        return self._intruder(Refusal.WRONG_NAME, f"the node at {self.remote} says it is {said}, not {expected}")

    # -- moves ----------------------------------------------------------------------------------------

    def _intruder(self, reason: Refusal, why: str) -> Step:
        if self.side is Side.ACCEPTOR and self.claimed and self.claimed not in self.members \
                and reason is not Refusal.NOT_MEMBER:
            # a name that is no member's, and no proof: counted as such (it learns only that it failed)
            reason, why = Refusal.NOT_MEMBER, f"not a member of this group ({why})"
        return self._done(Intruder(reason, why))

    def _done(self, outcome: Outcome) -> Step:
        self._to(State.DONE)
        return Step(outcome=outcome)

    def _to(self, state: State) -> None:
        if state not in TRANSITIONS[self.state]:
            raise IllegalTransition(f"peer handshake: {self.state.value} -> {state.value}")
        self.state = state


#: (side, state) -> what a received message does there; a pair not listed takes no message
_HANDLERS: dict[tuple[Side, State], Callable[[PeerHandshake, Received], Step]] = {
    (Side.ACCEPTOR, State.AWAIT_HELLO): PeerHandshake._on_hello,
    (Side.ACCEPTOR, State.AWAIT_PROOF): PeerHandshake._on_dialer_proof,
    (Side.DIALER, State.AWAIT_CHALLENGE): PeerHandshake._on_answer,
    (Side.DIALER, State.AWAIT_PROOF): PeerHandshake._on_acceptor_proof,
    (Side.DIALER, State.AWAIT_WELCOME): PeerHandshake._on_welcome,
}
