"""The Tandem wire protocol: sans-IO, shared by the broker and the SDK."""

from client.protocol.codec import (
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_MAX_MESSAGE_SIZE,
    HANDSHAKE_MAX_FRAME,
    FrameBuffer,
    FrameError,
    decode_payload,
    encode,
)
from client.protocol.connection import (
    MAX_VERSION,
    MIN_VERSION,
    NEED_DATA,
    ConnectionEnded,
    ProtocolConnection,
    Role,
    State,
    choose_version,
)
from client.protocol.frames import *  # noqa: F401,F403  (the frame vocabulary)
from client.protocol.frames import FRAME_TYPES, Frame, Op, Record

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE", "DEFAULT_MAX_MESSAGE_SIZE", "HANDSHAKE_MAX_FRAME", "FrameBuffer", "FrameError",
    "decode_payload", "encode", "MAX_VERSION", "MIN_VERSION", "NEED_DATA", "ConnectionEnded",
    "ProtocolConnection", "Role", "State", "choose_version", "FRAME_TYPES", "Frame", "Op", "Record",
]
