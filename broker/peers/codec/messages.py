"""The replication messages between replicas (:class:`MessageKind`) and the ``Replicate``
frame that carries them.

``Replicate`` frame payload (one per peer per turn of the event loop)::

    array of items, each
      [0] queue_id    int   the partition's queue (0 with partition 0: the catalogue)
      [1] partition   int
      [2] message     array  [kind, field...], kind a :class:`MessageKind`:

    kind                    fields after the kind
    0 REQUEST_VOTE          term int, candidate str, last_index int, last_term int, priority int
    1 VOTE_REPLY            term int, voter str, granted bool
    2 APPEND_ENTRIES        term int, leader str, prev_index int, prev_term int,
                            prev_origin str, entries array of Entry, commit int
    3 APPEND_REPLY          term int, replica str, success bool, match_index int
    4 INSTALL_SNAPSHOT      term int, leader str, index int, last_term int,
                            last_origin str, data bin (a snapshot: codec.snapshots),
                            [members: [[voter str, ...], [learner str, ...]] | nil]
                            (the partition's members as of index, ha.members),
                            [weak bool] (the state ends in entries of a weak active no
                            majority is known to hold: ha.messages.InstallSnapshot.weak;
                            SNAPSHOT_CHUNK carries it too, after its data)
    5 TIMEOUT_NOW           term int, leader str, rank int
    6 ALIVE                 term int, replica str
    7 PRE_VOTE              as REQUEST_VOTE: would the voter vote for the candidate in
                            term (it raises its own term only with a quorum of yeses)
    8 PRE_VOTE_REPLY        as VOTE_REPLY: the answer to a PRE_VOTE (granted: term is
                            the one asked about; refused: the voter's own)
    9 SNAPSHOT_CHUNK        term int, leader str, index int, seq int, data bin (an array of
                            snapshot messages: codec.snapshots): part seq of a streamed snapshot
                            as of index, ended by an INSTALL_SNAPSHOT whose data is the
                            streamed form (drivers only: the core never sees a part)
    10 SNAPSHOT_ACK         term int, replica str, index int, seq int: part seq of the
                            snapshot as of index is written (drivers only)

    Entry:  [term int, index int, data nil|bin (a log entry payload: codec.ops; nil: an
            active's no-op), origin str, weak bool]
"""

from __future__ import annotations

from collections.abc import Callable
from enum import IntEnum
from typing import Any

import msgpack

from broker.peers.codec.base import (
    MalformedReplicationError,
    _array,
    _bin,
    _bool,
    _opt_bin,
    _str,
    _uint,
    _unpack,
)
from ha.members import Members
from ha.messages import (
    Alive,
    AppendEntries,
    AppendReply,
    Entry,
    InstallSnapshot,
    Message,
    RequestVote,
    SnapshotAck,
    SnapshotChunk,
    TimeoutNow,
    VoteReply,
)


class MessageKind(IntEnum):
    """The first element of a replication message."""

    REQUEST_VOTE = 0
    VOTE_REPLY = 1
    APPEND_ENTRIES = 2
    APPEND_REPLY = 3
    INSTALL_SNAPSHOT = 4
    TIMEOUT_NOW = 5
    ALIVE = 6
    PRE_VOTE = 7
    PRE_VOTE_REPLY = 8
    SNAPSHOT_CHUNK = 9
    SNAPSHOT_ACK = 10


class UnknownMessageKind(MalformedReplicationError):
    """A replication message of a kind this build does not know (a newer build's)."""

    def __init__(self, kind: Any) -> None:
        super().__init__(f"unknown replication message kind {kind!r}")
        self.kind = kind


def _entry_out(e: Entry) -> list[Any]:
    return [e.term, e.index, e.data, e.origin, e.weak]


def _entry_in(a: Any) -> Entry:
    a = _array(a, 5, "log entry")
    return Entry(_uint(a[0], "entry term"), _uint(a[1], "entry index"), _opt_bin(a[2], "entry data"),
                 _str(a[3], "entry origin"), _bool(a[4], "entry weak"))


def _snapshot_tail(m: InstallSnapshot) -> list[Any]:
    """A snapshot's optional fields: its members (nil: none), then whether it is weak."""
    members = None if m.members is None else [list(m.members.voters), list(m.members.learners)]
    if m.weak:
        return [members, True]
    return [] if members is None else [members]


def _members_in(v: Any) -> Members | None:
    """A snapshot's members (ha.members): [[voter, ...], [learner, ...]], or nil."""
    if v is None:
        return None
    a = _array(v, 2, "snapshot members")
    voters, learners = a[0], a[1]
    if type(voters) is not list or type(learners) is not list:
        raise MalformedReplicationError("snapshot members: expected two arrays of names")
    try:
        return Members(tuple(_str(n, "member") for n in voters), tuple(_str(n, "member") for n in learners))
    except ValueError as exc:
        raise MalformedReplicationError(f"snapshot members: {exc}") from None


def _entries_in(v: Any) -> tuple[Entry, ...]:
    if type(v) is not list:
        raise MalformedReplicationError("AppendEntries: entries are not an array")
    return tuple(_entry_in(e) for e in v)


_ENCODERS: dict[type[Any], Callable[[Any], list[Any]]] = {
    RequestVote: lambda m: [MessageKind.PRE_VOTE if m.pre else MessageKind.REQUEST_VOTE, m.term, m.candidate,
                            m.last_index, m.last_term, m.priority],
    VoteReply: lambda m: [MessageKind.PRE_VOTE_REPLY if m.pre else MessageKind.VOTE_REPLY, m.term, m.voter,
                          m.granted],
    AppendEntries: lambda m: [MessageKind.APPEND_ENTRIES, m.term, m.leader, m.prev_index, m.prev_term,
                              m.prev_origin, [_entry_out(e) for e in m.entries], m.commit],
    AppendReply: lambda m: [MessageKind.APPEND_REPLY, m.term, m.replica, m.success, m.match_index],
    InstallSnapshot: lambda m: [MessageKind.INSTALL_SNAPSHOT, m.term, m.leader, m.index, m.last_term,
                                m.last_origin, m.data, *_snapshot_tail(m)],
    TimeoutNow: lambda m: [MessageKind.TIMEOUT_NOW, m.term, m.leader, m.rank],
    Alive: lambda m: [MessageKind.ALIVE, m.term, m.replica],
    SnapshotChunk: lambda m: [MessageKind.SNAPSHOT_CHUNK, m.term, m.leader, m.index, m.seq, m.data,
                              *((True,) if m.weak else ())],
    SnapshotAck: lambda m: [MessageKind.SNAPSHOT_ACK, m.term, m.replica, m.index, m.seq],
}

_DECODERS: dict[MessageKind, Callable[[list[Any]], Message | SnapshotChunk | SnapshotAck]] = {
    MessageKind.REQUEST_VOTE: lambda a: RequestVote(_uint(a[1], "term"), _str(a[2], "candidate"),
                                                    _uint(a[3], "last_index"), _uint(a[4], "last_term"),
                                                    _uint(a[5], "priority")),
    MessageKind.VOTE_REPLY: lambda a: VoteReply(_uint(a[1], "term"), _str(a[2], "voter"), _bool(a[3], "granted")),
    MessageKind.APPEND_ENTRIES: lambda a: AppendEntries(_uint(a[1], "term"), _str(a[2], "leader"),
                                                        _uint(a[3], "prev_index"), _uint(a[4], "prev_term"),
                                                        _str(a[5], "prev_origin"), _entries_in(a[6]),
                                                        _uint(a[7], "commit")),
    MessageKind.APPEND_REPLY: lambda a: AppendReply(_uint(a[1], "term"), _str(a[2], "replica"),
                                                    _bool(a[3], "success"), _uint(a[4], "match_index")),
    MessageKind.INSTALL_SNAPSHOT: lambda a: InstallSnapshot(_uint(a[1], "term"), _str(a[2], "leader"),
                                                            _uint(a[3], "index"), _uint(a[4], "last_term"),
                                                            _str(a[5], "last_origin"), _opt_bin(a[6], "data"),
                                                            _members_in(a[7]) if len(a) > 7 else None,
                                                            _bool(a[8], "weak") if len(a) > 8 else False),
    MessageKind.TIMEOUT_NOW: lambda a: TimeoutNow(_uint(a[1], "term"), _str(a[2], "leader"), _uint(a[3], "rank")),
    MessageKind.ALIVE: lambda a: Alive(_uint(a[1], "term"), _str(a[2], "replica")),
    MessageKind.PRE_VOTE: lambda a: RequestVote(_uint(a[1], "term"), _str(a[2], "candidate"),
                                                _uint(a[3], "last_index"), _uint(a[4], "last_term"),
                                                _uint(a[5], "priority"), pre=True),
    MessageKind.PRE_VOTE_REPLY: lambda a: VoteReply(_uint(a[1], "term"), _str(a[2], "voter"),
                                                    _bool(a[3], "granted"), pre=True),
    MessageKind.SNAPSHOT_CHUNK: lambda a: SnapshotChunk(_uint(a[1], "term"), _str(a[2], "leader"),
                                                        _uint(a[3], "index"), _uint(a[4], "seq"), _bin(a[5], "data"),
                                                        _bool(a[6], "weak") if len(a) > 6 else False),
    MessageKind.SNAPSHOT_ACK: lambda a: SnapshotAck(_uint(a[1], "term"), _str(a[2], "replica"), _uint(a[3], "index"),
                                                    _uint(a[4], "seq")),
}

#: items per message kind, the kind included
_LENGTHS: dict[MessageKind, int] = {
    MessageKind.REQUEST_VOTE: 6, MessageKind.VOTE_REPLY: 4, MessageKind.APPEND_ENTRIES: 8,
    MessageKind.APPEND_REPLY: 5, MessageKind.INSTALL_SNAPSHOT: 7, MessageKind.TIMEOUT_NOW: 4, MessageKind.ALIVE: 3,
    MessageKind.PRE_VOTE: 6, MessageKind.PRE_VOTE_REPLY: 4, MessageKind.SNAPSHOT_CHUNK: 6,
    MessageKind.SNAPSHOT_ACK: 5,
}


def encode_message(m: Message | SnapshotChunk | SnapshotAck) -> list[Any]:
    """``m`` as the array a ``Replicate`` item carries (packed with the whole payload)."""
    encode = _ENCODERS.get(type(m))
    if encode is None:
        raise TypeError(f"{type(m).__name__} is not a replication message")
    return encode(m)


def decode_message(a: Any) -> Message | SnapshotChunk | SnapshotAck:
    """The message of a ``Replicate`` item; UnknownMessageKind for a kind this build lacks,
    MalformedReplicationError for one that does not fit its layout."""
    a = _array(a, 1, "replication message")
    if type(a[0]) is not int:
        raise MalformedReplicationError(f"replication message: kind is a {type(a[0]).__name__}, not an int")
    try:
        kind = MessageKind(a[0])
    except ValueError:
        raise UnknownMessageKind(a[0]) from None
    _array(a, _LENGTHS[kind], kind.name)
    return _DECODERS[kind](a)


def encode_replicate(items: list[list[Any]]) -> bytes:
    """A ``Replicate`` payload: ``[queue_id, partition, encode_message(m)]`` items."""
    return msgpack.packb(items, use_bin_type=True)


def decode_replicate(payload: bytes) -> list[tuple[int, int, Any]]:
    """The items of a ``Replicate`` payload, messages still undecoded (decode_message);
    MalformedReplicationError if the payload is not an array of such items."""
    items = _unpack(payload, "Replicate payload")
    if type(items) is not list:
        raise MalformedReplicationError("Replicate payload: expected an array")
    out = []
    for item in items:
        if type(item) is not list or len(item) != 3:
            raise MalformedReplicationError("Replicate payload: an item is not [queue_id, partition, message]")
        out.append((_uint(item[0], "queue_id"), _uint(item[1], "partition"), item[2]))
    return out
