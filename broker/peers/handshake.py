"""The peer handshake over a link: :class:`ha.peerhandshake.PeerHandshake` fed the link's
frames and the clock, its answers sent as frames.

The machine decides; this module only translates (``PeerHello`` <-> :class:`Hello`, ``Error``
-> :class:`Refused`, bytes that are no frame -> :meth:`PeerHandshake.garbage`, the end of the
link -> :meth:`PeerHandshake.closed`, the deadline -> :meth:`PeerHandshake.tick`).  An outcome
of :class:`GaveUp` (nobody to blame) leaves the link's own error (ConnectionResetError,
TimeoutError) to the caller, as any failed link.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from broker.peers.links import Link
from client.clock import Clock
from client.errors import TandemError
from client.protocol.frames import Error, Frame, PeerChallenge, PeerHello, PeerProof, PeerWelcome
from ha.peerhandshake import (
    Challenge,
    GaveUp,
    Hello,
    Other,
    Outcome,
    PeerHandshake,
    Proof,
    Received,
    Refused,
    Sent,
    Step,
    Welcome,
)


@dataclass(frozen=True, slots=True)
class Done:
    """A handshake's outcome, and the frames of it the shell reads further: the dialer's
    PeerHello (as an acceptor received it), the acceptor's PeerWelcome (as a dialer did)."""

    outcome: Outcome
    hello: PeerHello | None = None
    welcome: PeerWelcome | None = None


def received(frame: Frame) -> Received:
    """The handshake's view of a frame from the other end."""
    if isinstance(frame, PeerHello):
        return Hello(frame.node, frame.store_stamp, frame.nonce)
    if isinstance(frame, PeerChallenge):
        return Challenge(frame.node, frame.nonce)
    if isinstance(frame, PeerProof):
        return Proof(frame.proof)
    if isinstance(frame, PeerWelcome):
        return Welcome(frame.node, frame.store_stamp)
    if isinstance(frame, Error):
        return Refused(frame.message)
    return Other(type(frame).__name__)


def frame_of(msg: Sent, hello: Callable[[Hello], PeerHello] | None) -> Frame:
    """The frame that carries ``msg``; a Hello as ``hello`` completes it (the dialer's identity,
    versions, placement, addresses)."""
    if isinstance(msg, Hello):
        if hello is None:
            raise TypeError("a dialer's handshake needs the PeerHello it completes")
        return hello(msg)
    if isinstance(msg, Challenge):
        return PeerChallenge(node=msg.node, nonce=msg.nonce)
    return PeerProof(proof=msg.proof)


async def run(link: Link, hs: PeerHandshake, clock: Clock, step: Step = Step(),
              hello: Callable[[Hello], PeerHello] | None = None) -> Done:
    """Send what ``step`` says, then feed ``hs`` the link's frames and send its answers until it
    reaches an outcome (at its deadline at the latest).  ``step``: the dialer's first
    (:meth:`PeerHandshake.start`), an empty one for an acceptor."""
    seen: dict[type[Frame], Frame] = {}
    try:
        async with clock.timeout(max(0.0, hs.deadline - clock.monotonic())):
            while True:
                for msg in step.send:
                    link.send(frame_of(msg, hello))
                if step.outcome is not None:
                    break
                step = await _next(link, hs, clock, seen)
    except TimeoutError:
        step = hs.tick(max(clock.monotonic(), hs.deadline))
        if step.outcome is None or isinstance(step.outcome, GaveUp):
            raise
    got_hello, got_welcome = seen.get(PeerHello), seen.get(PeerWelcome)
    return Done(step.outcome, got_hello if isinstance(got_hello, PeerHello) else None,
                got_welcome if isinstance(got_welcome, PeerWelcome) else None)


async def _next(link: Link, hs: PeerHandshake, clock: Clock, seen: dict[type[Frame], Frame]) -> Step:
    """What the machine makes of the link's next frame (or of its end, or of bytes that are none)."""
    try:
        frame = await link.next_frame()
    except TandemError as exc:  # a frame out of turn, or bytes that are no frame
        return hs.garbage(exc.message)
    except ConnectionResetError:
        step = hs.closed()
        if isinstance(step.outcome, GaveUp):
            raise
        return step
    seen[type(frame)] = frame
    return hs.receive(received(frame), clock.monotonic())
