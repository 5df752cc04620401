"""The sans-IO protocol connection: bytes in, frames out; frames in, bytes out.

One object per connection end.  ``receive_data(b"...")`` feeds bytes (``b""``
is end of stream), ``next_event()`` returns a :class:`Frame`, :data:`NEED_DATA`
or :class:`ConnectionEnded`; ``send(frame)`` checks the frame is legal now and
returns its bytes.  Every state transition is in :data:`TRANSITIONS`.

The handshake (SCRAM-SHA-256, :mod:`client.scram`)::

    client                                   node
    Hello(versions, user, auth=client-first)  ->
                                             <-  AuthChallenge(server-first)
    AuthResponse(client-final)               ->
                                             <-  Welcome(version, limits, auth=server-final)

The node picks the highest common version (:mod:`client.protocol.versions`: the ranges, what
each version added; a frame a later version added is neither sent nor taken on a link at
an older one); it may answer ``Error`` then ``Close``
instead of AuthChallenge (no common version, a node that serves nothing, too many
failed logins) or instead of Welcome (wrong password, a limit).  A Welcome
straight after Hello is a protocol error: the client trusts a node only once it
has checked the server signature the Welcome carries.  Either side may send
``Close`` at any time; after sending it nothing but ``Close`` may follow.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, auto

from client.scram import MECHANISM
from client.errors import LocalProtocolError, RemoteProtocolError, UnsupportedProtocolError
from client.protocol.codec import (
    DEFAULT_MAX_FRAME_SIZE,
    FrameBuffer,
    FrameError,
    decode_payload,
    encode,
)
from client.protocol.frames import AuthResponse, Close, Frame, Hello, PeerHello, PeerWelcome, Welcome
from client.protocol.versions import MAX_VERSION, MIN_VERSION, choose_version, field_since, since


class Role(Enum):
    __hash__ = object.__hash__  # (see State)
    CLIENT = auto()
    SERVER = auto()


class State(Enum):
    __hash__ = object.__hash__  # members are singletons: identity, in C (Enum's own hashes the name in Python, per lookup)
    START = auto()
    HELLO_SENT = auto()  # client
    HELLO_RECEIVED = auto()  # server
    CHALLENGED = auto()  # client: AuthChallenge received, its AuthResponse not sent yet
    CHALLENGE_SENT = auto()  # server
    RESPONSE_SENT = auto()  # client: waiting for Welcome
    RESPONSE_RECEIVED = auto()  # server: checking the proof
    OPEN = auto()
    CLOSE_SENT = auto()
    CLOSED = auto()
    ERROR = auto()


class NeedData:
    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA = NeedData()


@dataclass(frozen=True, slots=True)
class ConnectionEnded:
    """The peer's byte stream ended (EOF)."""

    clean: bool  # a Close frame came first


_SEND, _RECV = "send", "recv"
_ANY = "*"

# (role, state, direction, frame class name or *) -> next state
TRANSITIONS: dict[tuple[Role, State, str, str], State] = {
    (Role.CLIENT, State.START, _SEND, "Hello"): State.HELLO_SENT,
    (Role.CLIENT, State.HELLO_SENT, _RECV, "AuthChallenge"): State.CHALLENGED,
    (Role.CLIENT, State.HELLO_SENT, _RECV, "Error"): State.HELLO_SENT,
    (Role.CLIENT, State.CHALLENGED, _SEND, "AuthResponse"): State.RESPONSE_SENT,
    (Role.CLIENT, State.RESPONSE_SENT, _RECV, "Welcome"): State.OPEN,
    (Role.CLIENT, State.RESPONSE_SENT, _RECV, "Error"): State.RESPONSE_SENT,
    (Role.SERVER, State.START, _RECV, "Hello"): State.HELLO_RECEIVED,
    (Role.SERVER, State.HELLO_RECEIVED, _SEND, "AuthChallenge"): State.CHALLENGE_SENT,
    (Role.SERVER, State.HELLO_RECEIVED, _SEND, "Error"): State.HELLO_RECEIVED,
    (Role.SERVER, State.CHALLENGE_SENT, _RECV, "AuthResponse"): State.RESPONSE_RECEIVED,
    (Role.SERVER, State.RESPONSE_RECEIVED, _SEND, "Welcome"): State.OPEN,
    (Role.SERVER, State.RESPONSE_RECEIVED, _SEND, "Error"): State.RESPONSE_RECEIVED,
    (Role.SERVER, State.START, _SEND, "Error"): State.START,
    # node <-> node links: the same handshake with the peer frames
    (Role.CLIENT, State.START, _SEND, "PeerHello"): State.HELLO_SENT,
    (Role.CLIENT, State.HELLO_SENT, _RECV, "PeerWelcome"): State.OPEN,
    (Role.SERVER, State.START, _RECV, "PeerHello"): State.HELLO_RECEIVED,
    (Role.SERVER, State.HELLO_RECEIVED, _SEND, "PeerWelcome"): State.OPEN,
    # peer authentication (ha.peerauth): the challenge and both proofs, all before the welcome;
    # nothing else is received from a dialer before it (HELLO_RECEIVED accepts no other frame)
    (Role.SERVER, State.HELLO_RECEIVED, _SEND, "PeerChallenge"): State.HELLO_RECEIVED,
    (Role.SERVER, State.HELLO_RECEIVED, _RECV, "PeerProof"): State.HELLO_RECEIVED,
    (Role.SERVER, State.HELLO_RECEIVED, _SEND, "PeerProof"): State.HELLO_RECEIVED,
    (Role.CLIENT, State.HELLO_SENT, _RECV, "PeerChallenge"): State.HELLO_SENT,
    (Role.CLIENT, State.HELLO_SENT, _SEND, "PeerProof"): State.HELLO_SENT,
    (Role.CLIENT, State.HELLO_SENT, _RECV, "PeerProof"): State.HELLO_SENT,
}
_BEFORE_OPEN = (State.START, State.HELLO_SENT, State.HELLO_RECEIVED, State.CHALLENGED, State.CHALLENGE_SENT,
                State.RESPONSE_SENT, State.RESPONSE_RECEIVED)
for _role in Role:
    for _st in (*_BEFORE_OPEN, State.OPEN):
        TRANSITIONS[(_role, _st, _SEND, "Close")] = State.CLOSE_SENT
        TRANSITIONS[(_role, _st, _RECV, "Close")] = State.CLOSED
    TRANSITIONS[(_role, State.CLOSE_SENT, _RECV, "Close")] = State.CLOSED
    TRANSITIONS[(_role, State.CLOSE_SENT, _RECV, _ANY)] = State.CLOSE_SENT
    TRANSITIONS[(_role, State.OPEN, _SEND, _ANY)] = State.OPEN
    # After a fatal error we may still tell the peer why, then close.
    TRANSITIONS[(_role, State.ERROR, _SEND, "Error")] = State.ERROR
    TRANSITIONS[(_role, State.ERROR, _SEND, "Close")] = State.ERROR
    TRANSITIONS[(_role, State.OPEN, _RECV, _ANY)] = State.OPEN
    # The side that received Close answers with Close.
    TRANSITIONS[(_role, State.CLOSED, _SEND, "Close")] = State.CLOSED
# Handshake frames already in flight when the other side gave up and sent Close.
TRANSITIONS[(Role.CLIENT, State.CLOSE_SENT, _RECV, "Welcome")] = State.CLOSE_SENT
TRANSITIONS[(Role.CLIENT, State.CLOSE_SENT, _RECV, "AuthChallenge")] = State.CLOSE_SENT
TRANSITIONS[(Role.SERVER, State.CLOSE_SENT, _RECV, "AuthResponse")] = State.CLOSE_SENT

_HANDSHAKE = {"Hello", "AuthChallenge", "AuthResponse", "Welcome", "PeerHello", "PeerWelcome", "PeerChallenge",
              "PeerProof"}


class ProtocolConnection:
    def __init__(self, role: Role, *, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self.role = role
        self.state = State.START
        self.version: int | None = None
        self._buffer = FrameBuffer(max_frame_size)
        self._eof = False
        self._ended: ConnectionEnded | None = None
        self._offered: tuple[int, int] | None = None

    @property
    def max_frame_size(self) -> int:
        return self._buffer.max_frame_size

    @max_frame_size.setter
    def max_frame_size(self, value: int) -> None:
        self._buffer.max_frame_size = value

    def _advance(self, direction: str, frame: Frame) -> None:
        name = type(frame).__name__
        if self.version is not None and self.version < MAX_VERSION and since(frame.OP) > self.version:
            msg = (f"{name} needs protocol version {since(frame.OP)}, and this link speaks {self.version} "
                   f"(the other end's build is older: see docs/upgrades.md)")
            if direction == _SEND:
                raise UnsupportedProtocolError(msg)  # (the caller's request, not a bug: refused in words)
            raise FrameError(RemoteProtocolError(msg, code=UnsupportedProtocolError.code), rid=getattr(frame, "rid", 0))
        if self.version is not None and self.version < MAX_VERSION and direction == _SEND:
            need, field = field_since(frame.OP, frame)
            if need > self.version:
                raise UnsupportedProtocolError(
                    f"{name}.{field} needs protocol version {need}, and this link speaks {self.version} (the "
                    f"other end's build is older and would ignore it: see docs/upgrades.md)")
        nxt = TRANSITIONS.get((self.role, self.state, direction, name))
        if nxt is None and name not in _HANDSHAKE:
            nxt = TRANSITIONS.get((self.role, self.state, direction, _ANY))
        if nxt is None:
            verb = "sent" if direction == _SEND else "received"
            msg = f"{name} cannot be {verb} in state {self.state.name}"
            if direction == _SEND:
                raise LocalProtocolError(msg)
            self.state = State.ERROR
            raise FrameError(RemoteProtocolError(msg), rid=getattr(frame, "rid", 0), fatal=True)
        if isinstance(frame, Welcome) and direction == _RECV and self.role is Role.CLIENT and nxt is State.OPEN:
            lo, hi = self._offered or (MIN_VERSION, MAX_VERSION)
            if not lo <= frame.version <= hi:
                self.state = State.ERROR
                raise FrameError(RemoteProtocolError(
                    f"unsupported protocol version: node chose {frame.version}, this client offered {lo}..{hi}",
                    code=UnsupportedProtocolError.code), fatal=True)
            self.version = frame.version
        elif isinstance(frame, (Welcome, PeerWelcome)):
            self.version = frame.version
        elif isinstance(frame, (Hello, PeerHello)) and direction == _SEND:
            self._offered = (frame.min_version, frame.max_version)
        self.state = nxt

    # -- outbound ----------------------------------------------------------------

    def send(self, frame: Frame) -> bytes:
        """Bytes for ``frame``; LocalProtocolError if the state forbids it or it cannot be encoded.

        The state changes only when the bytes exist.
        """
        if self.state is State.CLOSED and not isinstance(frame, Close):
            raise LocalProtocolError("connection is CLOSED")
        before = self.state
        self._advance(_SEND, frame)
        try:
            return encode(frame)
        except (TypeError, ValueError, OverflowError) as exc:  # msgpack's complaints about a value
            self.state = before
            raise LocalProtocolError(f"cannot encode {type(frame).__name__}: {exc}") from exc

    def hello(self, *, client_name: str, user: str, auth: str, heartbeat: float,
              observe: bool = False) -> bytes:
        """Hello opening a SCRAM-SHA-256 exchange; ``auth`` is the client-first-message."""
        return self.send(Hello(
            min_version=MIN_VERSION, max_version=MAX_VERSION, client_name=client_name,
            user=user, mechanism=MECHANISM, auth=auth, heartbeat=heartbeat, observe=observe,
        ))

    def auth_response(self, client_final: str) -> bytes:
        return self.send(AuthResponse(data=client_final))

    # -- inbound -----------------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        if not data:
            self._eof = True
        else:
            self._buffer.feed(data)

    def next_event(self) -> Frame | NeedData | ConnectionEnded:
        """The next frame, NEED_DATA, or ConnectionEnded.

        Raises FrameError for a bad frame; when ``exc.fatal`` the connection is
        in state ERROR and must be closed, otherwise it can go on.
        """
        if self.state is State.ERROR:
            raise LocalProtocolError("connection is in ERROR state")
        try:
            payload = self._buffer.next_payload()
        except FrameError:
            self.state = State.ERROR
            raise
        if payload is None:
            if self._eof:
                if self._ended is None:
                    self._ended = ConnectionEnded(clean=self.state is State.CLOSED)
                    self.state = State.CLOSED
                return self._ended
            return NEED_DATA
        try:
            frame = decode_payload(payload)
        except FrameError as exc:
            if self.state in _BEFORE_OPEN:
                # Nothing is trustworthy before the handshake completes.
                self.state = State.ERROR
                exc.fatal = True
            raise
        self._advance(_RECV, frame)
        return frame

    @property
    def closed(self) -> bool:
        return self.state in (State.CLOSED, State.ERROR)

