"""Replication messages survive the wire: every kind encodes and decodes to itself, and an
unknown kind (a newer build's) is refused with UnknownMessageKind (which
``Replication.receive`` logs once per peer and kind, and drops)."""

from __future__ import annotations

import msgpack
import pytest

from broker.replication import UnknownMessageKind, decode_message, encode_message
from ha.messages import (
    Alive,
    AppendEntries,
    AppendReply,
    Entry,
    InstallSnapshot,
    Message,
    RequestVote,
    TimeoutNow,
    VoteReply,
)

MESSAGES: list[Message] = [
    RequestVote(3, "node1", 10, 2, 1),
    VoteReply(3, "node2", True),
    AppendEntries(3, "node1", 9, 2, "node1", (Entry(3, 10, b"ops", "node1", False),), 8),
    AppendReply(3, "node2", True, 10),
    InstallSnapshot(3, "node1", 10, 2, "node1", b"state"),
    TimeoutNow(3, "node1", 4),
    Alive(3, "node3"),
]


@pytest.mark.parametrize("m", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_kind_round_trips_through_msgpack(m: Message) -> None:
    wire = msgpack.packb(encode_message(m), use_bin_type=True)
    assert decode_message(msgpack.unpackb(wire, raw=False)) == m


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(UnknownMessageKind, match="unknown replication message kind 99") as exc:
        decode_message([99, 3, "node1"])
    assert exc.value.kind == 99 and isinstance(exc.value, ValueError)  # (receive drops it)
