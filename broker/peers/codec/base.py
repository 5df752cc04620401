"""What every part of the replication wire format shares: the partition key, the error
its decoders raise, and the msgpack checks they run on what they read.

A check refuses a value that does not fit its layout with :class:`MalformedReplicationError`:
an array of at least the listed items, each of the listed type; *int* items fit a signed
64-bit integer, and are never negative in a message, or in an op where they name a position.
"""

from __future__ import annotations

from typing import Any

import msgpack

from client.errors import MalformedFrameError
from client.protocol.codec import MAX_INT

Key = tuple[int, int]  # (queue id, partition)
CATALOGUE: Key = (0, 0)


class MalformedReplicationError(MalformedFrameError, ValueError):
    """Replication bytes that do not fit the layouts of :mod:`broker.peers.codec`: a
    ``Replicate`` payload, a message, a log entry payload or a snapshot.  (A ValueError too,
    for callers that treat every undecodable value alike.)"""

    def __init__(self, message: str) -> None:
        super().__init__(message)


def _unpack(data: Any, what: str) -> Any:
    if type(data) is not bytes:
        raise MalformedReplicationError(f"{what}: expected bin, got {type(data).__name__}")
    try:
        return msgpack.unpackb(data, raw=False)
    except Exception as exc:  # msgpack raises several types (ValueError, ExtraData, UnicodeDecodeError, ...)
        raise MalformedReplicationError(f"{what} is not msgpack: {exc}") from None


def _array(v: Any, n: int, what: str) -> list[Any]:
    """``v`` if it is an array of at least ``n`` items (a newer build may append some)."""
    if type(v) is not list or len(v) < n:
        raise MalformedReplicationError(f"{what}: expected an array of {n} items")
    return v


def _uint(v: Any, what: str) -> int:
    if type(v) is not int or not 0 <= v <= MAX_INT:
        raise MalformedReplicationError(f"{what}: expected an int in 0 .. 2**63-1, got {v!r:.40}")
    return v


def _int(v: Any, what: str) -> int:
    if type(v) is not int or not -MAX_INT - 1 <= v <= MAX_INT:
        raise MalformedReplicationError(f"{what}: expected a signed 64-bit int, got {v!r:.40}")
    return v


def _str(v: Any, what: str) -> str:
    if type(v) is not str:
        raise MalformedReplicationError(f"{what}: expected a str, got {type(v).__name__}")
    return v


def _opt_str(v: Any, what: str) -> str | None:
    return None if v is None else _str(v, what)


def _bool(v: Any, what: str) -> bool:
    if type(v) is not bool:
        raise MalformedReplicationError(f"{what}: expected a bool, got {type(v).__name__}")
    return v


def _bin(v: Any, what: str) -> bytes:
    if type(v) is not bytes:
        raise MalformedReplicationError(f"{what}: expected bin, got {type(v).__name__}")
    return v


def _opt_bin(v: Any, what: str) -> bytes | None:
    return None if v is None else _bin(v, what)


def _float(v: Any, what: str) -> float:
    if type(v) is float:
        return v
    if type(v) is int:
        return float(v)
    raise MalformedReplicationError(f"{what}: expected a float, got {type(v).__name__}")


def _list(v: Any, what: str) -> list[Any]:
    if type(v) is not list:
        raise MalformedReplicationError(f"{what}: expected an array")
    return v
