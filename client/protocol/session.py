"""Frames of a session itself: the handshake, errors, close and keep-alives.

The handshake is Hello, SCRAM's challenge and response, and Welcome; Ok is the plain
reply.  Heartbeat and Error travel on peer links too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from client.protocol.base import Frame, Op


@dataclass(frozen=True, slots=True, kw_only=True)
class Hello(Frame):
    """The client introduces itself and starts authenticating: ``mechanism`` names how
    (``SCRAM-SHA-256``, the only one) and ``auth`` carries its first message (SCRAM's
    client-first-message, :mod:`client.scram`).  No password travels on the wire."""

    OP: ClassVar[Op] = Op.HELLO
    min_version: int
    max_version: int
    client_name: str
    user: str
    mechanism: str = ""
    auth: str = ""
    heartbeat: float = 10.0
    #: a monitoring session (``tandem status``): a node that serves nothing (a shared-mode
    #: passive) accepts it for Status alone instead of refusing the connection
    observe: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class AuthChallenge(Frame):
    """Node -> client after Hello: SCRAM's server-first-message (nonce, salt, iterations)."""

    OP: ClassVar[Op] = Op.AUTH_CHALLENGE
    data: str


@dataclass(frozen=True, slots=True, kw_only=True)
class AuthResponse(Frame):
    """Client -> node: SCRAM's client-final-message (with the client's proof)."""

    OP: ClassVar[Op] = Op.AUTH_RESPONSE
    data: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Welcome(Frame):
    """The handshake succeeded.  ``auth``: SCRAM's server-final-message (the node's
    signature), which the client checks before it trusts the node."""

    OP: ClassVar[Op] = Op.WELCOME
    version: int
    node: str
    heartbeat: float
    max_frame_size: int
    max_message_size: int
    auth: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Error(Frame):
    """An error, for request ``rid`` (0: for the connection)."""

    OP: ClassVar[Op] = Op.ERROR
    rid: int
    code: int
    message: str
    active_hint: str | None = None
    next_seq: int | None = None  # OutOfOrderSequence: the seq the partition expects next


@dataclass(frozen=True, slots=True, kw_only=True)
class Close(Frame):
    OP: ClassVar[Op] = Op.CLOSE
    code: int = 0
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat(Frame):
    """A keep-alive.  On a peer link of a LockFile pair it also carries the sender's lock
    epoch and HA state, and is sent at once on every change of that state (with the state
    before it); elsewhere the fields keep their defaults."""

    OP: ClassVar[Op] = Op.HEARTBEAT
    epoch: int = 0  # the latest lock epoch the sender has seen (0: none, or no LockFile)
    ha_state: str = ""  # the sender's HA state (ha.lockfile.HaState), "" without one
    ha_previous: str = ""  # its state before the change this frame reports ("" if none)
    #: the partitions the sender serves, [queue id, partition, term, ...], in a group with more
    #: members than copies (broker.peers.foreign); empty elsewhere
    actives: list[int] = field(default_factory=list)
    #: the availability zone whose lost quorum keeps the sender's HA services off ("" none):
    #: its peers rank it as drained while it is (broker.peers.peers)
    ha_off: str = ""
    #: on a peer link: the group's feature level as the sender applied it (0: a first-release
    #: build, which does not say; ha.upgrade)
    level: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Ok(Frame):
    OP: ClassVar[Op] = Op.OK
    rid: int
