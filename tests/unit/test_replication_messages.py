"""Replication messages survive the wire: every kind encodes and decodes to itself, and an
unknown kind (a newer build's) is refused with UnknownMessageKind (which
``Replication.receive`` logs once per peer and kind, and drops).

The wire format is pinned to exact bytes: a node of this build talks to a node of the
previous build, so every message kind, every log op code, both snapshot encodings and
the ``Replicate`` payload must encode to (and decode from) the bytes below."""

from __future__ import annotations

import dataclasses
import random

import msgpack
import pytest

from broker.modes.replicated import (
    MalformedReplicationError,
    MessageKind,
    OpCode,
    UnknownMessageKind,
    decode_message,
    decode_ops,
    encode_message,
    encode_ops,
    encode_snapshot,
    snapshot_ops,
)
from broker.peers.codec import (
    chunk_ops,
    encode_chunk,
    encode_streamed,
    streamed_parts,
    decode_catalogue_snapshot,
    decode_replicate,
    encode_catalogue_snapshot,
    encode_replicate,
)
from broker.peers.codec.recordtypes import CONVERTERS
from broker.modes.replicated.apply import apply_entries, messages_in
from broker.modes.replicated.partlog import open_log
from ha.members import Members
from ha.members import encode as encode_members
from ha.placement import NodeList, ReplicaKind
from ha.replica_config import ReplicaConfig
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
from storage.topology import BindingRecord, DropExchange, ExchangeRecord, PutExchange, SetBinding
from storage.base import (
    Trim,
    SetUpdating,
    SetFeatureLevel,
    LogState,
    PutApplied,
    AclRecord,
    Append,
    DropProducers,
    DropQueue,
    DropUser,
    GrantAcl,
    RevokeAcl,
    SeedAdmin,
    SetDrained,
    SetGroup,
    SetPlacement,
    PutUser,
    UserRecord,
    user_fields,
    MarkDelivered,
    PackedRun,
    PartitionState,
    PutProducer,
    PutQueue,
    QueueMeta,
    ResetPartition,
    SetDeliveryCount,
    Settle,
    StoredMessage,
    WriteOp,
)

MESSAGES: list[Message] = [
    RequestVote(3, "node1", 10, 2, 1),
    VoteReply(3, "node2", True),
    AppendEntries(3, "node1", 9, 2, "node1", (Entry(3, 10, b"ops", "node1", False),), 8),
    AppendReply(3, "node2", True, 10),
    InstallSnapshot(3, "node1", 10, 2, "node1", b"state"),
    InstallSnapshot(3, "node1", 10, 2, "node1", b"state", Members(("node1", "node2", "node4"), ("node3",))),
    InstallSnapshot(3, "node1", 10, 2, "node1", b"state", None, True),
    InstallSnapshot(3, "node1", 10, 2, "node1", b"state", Members(("node1", "node2"), ()), True),
    TimeoutNow(3, "node1", 4),
    Alive(3, "node3"),
    RequestVote(3, "node1", 10, 2, 1, pre=True),
    VoteReply(3, "node2", False, pre=True),
]


@pytest.mark.parametrize("m", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_kind_round_trips_through_msgpack(m: Message) -> None:
    wire = msgpack.packb(encode_message(m), use_bin_type=True)
    assert decode_message(msgpack.unpackb(wire, raw=False)) == m


def test_a_snapshots_members_are_checked() -> None:
    base = msgpack.unpackb(msgpack.packb(encode_message(InstallSnapshot(3, "node1", 10, 2, "node1", b"state")),
                                         use_bin_type=True), raw=False)
    assert decode_message([*base, None]).members is None  # nil: the receiver keeps its own
    for bad in ([["node1"]], [["node1"], "node2"], [[1], []], [[], []], [["node1"], ["node1"]]):
        with pytest.raises(MalformedReplicationError, match="snapshot members"):
            decode_message([*base, bad])


def test_membership_entries_are_not_applied_or_counted_as_messages() -> None:
    change = encode_members(Members(("node1", "node2", "node3"), ("node4",)))
    assert messages_in((1, 0), (change, None)) == 0
    plog = open_log((1, 0), NodeList(("node1", "node2", "node3"), (ReplicaKind.SYNC,) * 3), LogState(),
                    ReplicaConfig(node="node1", voters=("node1", "node2", "node3")), rng=random.Random(0), now=0.0)
    ops = apply_entries(plog, [Entry(2, 5, change, "node1", False)], [], lambda ops: ops)
    assert ops == [PutApplied(1, 0, 5, 2, "node1")]


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(UnknownMessageKind, match="unknown replication message kind 99") as exc:
        decode_message([99, 3, "node1"])
    assert exc.value.kind == 99 and isinstance(exc.value, ValueError)  # (receive drops it)


# -- the exact bytes -------------------------------------------------------------------------------

PINNED_MESSAGES: list[tuple[Message, str]] = [
    (RequestVote(3, "node1", 10, 2, 1), "960003a56e6f6465310a0201"),
    (VoteReply(3, "node2", True), "940103a56e6f646532c3"),
    (AppendEntries(3, "node1", 9, 2, "node1", (Entry(3, 10, b"ops", "node1", False),
                                                Entry(3, 11, None, "node1", True)), 8),
     "980203a56e6f6465310902a56e6f6465319295030ac4036f7073a56e6f646531c295030bc0a56e6f646531c308"),
    (AppendReply(3, "node2", True, 10), "950303a56e6f646532c30a"),
    (InstallSnapshot(3, "node1", 10, 2, "node1", b"state"), "970403a56e6f6465310a02a56e6f646531c4057374617465"),
    (TimeoutNow(3, "node1", 4), "940503a56e6f64653104"),
    (RequestVote(3, "node1", 10, 2, 1, pre=True), "960703a56e6f6465310a0201"),
    (VoteReply(3, "node2", True, pre=True), "940803a56e6f646532c3"),
    (Alive(3, "node3"), "930603a56e6f646533"),
    (SnapshotChunk(3, "node1", 10, 2, b"part"), "960903a56e6f6465310a02c40470617274"),
    (SnapshotAck(3, "node4", 10, 2), "950a03a56e6f6465340a02"),
]


def test_a_streamed_snapshot_writes_its_parts_then_the_state_without_resetting_them() -> None:
    """Parts carry messages with their stored delivery counts; the InstallSnapshot that ends
    the stream (the streamed form) sets the next offset, the delivered mark and the producers
    and leaves the messages the parts wrote (no ResetPartition)."""
    m1 = StoredMessage(3, "k", b"", b"one", "p1", 4, 1.5, 2)
    m2 = StoredMessage(7, None, b"", b"two", None, None, 2.5, 0)
    ops = chunk_ops((1, 0), encode_chunk([m1, m2]))
    assert ops == [Append(1, 0, [StoredMessage(3, "k", b"", b"one", "p1", 4, 1.5),
                                 StoredMessage(7, None, b"", b"two", None, None, 2.5)], 8),
                   SetDeliveryCount(1, 0, [(3, 2)])]
    data = encode_streamed(PartitionState(next_offset=9, delivered_upto=4, producers={"p1": 4}), 3)
    assert streamed_parts(data) == 3
    assert snapshot_ops((1, 0), data) == [Append(1, 0, [], 9), MarkDelivered(1, 0, 4), PutProducer(1, 0, "p1", 4)]
    whole = encode_snapshot(PartitionState(next_offset=9))
    assert streamed_parts(whole) == 0 and snapshot_ops((1, 0), whole)[0] == ResetPartition(1, 0)
    with pytest.raises(MalformedReplicationError):
        streamed_parts(msgpack.packb([9, 4, {}, [[1]], 3]))


@pytest.mark.parametrize(("m", "wire"), PINNED_MESSAGES, ids=lambda v: type(v).__name__)
def test_every_kind_encodes_to_the_pinned_bytes(m: Message, wire: str) -> None:
    assert msgpack.packb(encode_message(m), use_bin_type=True).hex() == wire
    assert decode_message(msgpack.unpackb(bytes.fromhex(wire), raw=False)) == m


M1 = StoredMessage(5, "k", b"\x80", b"body", "p1", 7, 1.5)
M2 = StoredMessage(6, None, b"\x80", b"b2", None, None, 2.0)
M3 = StoredMessage(9, None, b"\x80", b"b3", None, None, 3.0)
META = QueueMeta(id=4, name="orders", partitions=2, mapper="hash", ring_size=0, max_deliveries=5,
                 dead_letter_queue="dlq", max_length=100)

USER = UserRecord(name="bob", salt=b"\x01", hash=b"\x02", role="user", params="scrypt")
ACL = AclRecord(user="bob", pattern="orders.*", permissions=("consume",))

PINNED_OPS: list[tuple[str, WriteOp, str]] = [
    ("C", Append(1, 0, [M1, M2], 7),  # consecutive offsets: one packed chunk
     "9195a143070502c42e9296a16bc40180c404626f6479a2703107cb3ff800000000000096c0c40180c4026232c0c0cb4000000000000000"),
    ("A", Append(1, 0, [M1, M3], 10),  # a gap: message by message
     "9193a1410a929705a16bc40180c404626f6479a2703107cb3ff80000000000009709c0c40180c4026233c0c0cb4008000000000000"),
    ("S", Settle(1, 0, [5, 6]), "9192a153920506"),
    ("M", MarkDelivered(1, 0, 6), "9192a14d06"),
    ("D", SetDeliveryCount(1, 0, [(5, 2)]), "9192a14491920502"),
    ("P", PutProducer(1, 0, "p1", 7), "9193a150a2703107"),
    ("R", DropProducers(1, 0, ["p1", "p2"]), "9192a15292a27031a27032"),
    ("Q", PutQueue(META), "9192a1519804a66f726465727302a4686173680005a3646c7164"),
    ("X", DropQueue(4), "9192a15804"),
    ("U", PutUser(USER), "9192a15585a46e616d65a3626f62a473616c74c40101a468617368c40102a4726f6c65a475736572a6706172616d73"
                         "a6736372797074"),
    ("V", DropUser("bob"), "9192a156a3626f62"),
    ("G", GrantAcl(ACL), "9194a147a3626f62a86f72646572732e2a91a7636f6e73756d65"),
    ("K", RevokeAcl(ACL), "9194a14ba3626f62a86f72646572732e2a91a7636f6e73756d65"),
    ("B", SeedAdmin(USER, "node1"), "9193a14285a46e616d65a3626f62a473616c74c40101a468617368c40102a4726f6c65a475736572"
                                    "a6706172616d73a6736372797074a56e6f646531"),
    ("N", SetDrained("node3", True), "9193a14ea56e6f646533c3"),
    ("L", SetPlacement(4, 1, ("node3", "node1"), True), "9195a14c040192a56e6f646533a56e6f646531c3"),
    ("W", SetGroup(("node1", "node4"), ("node4=10.0.0.4:7781",), (), ("node1",), True, ((1, 0, ("node1:sync",)),)),
     "9197a15792a56e6f646531a56e6f64653491b36e6f6465343d31302e302e302e343a373738319091a56e6f646531c3919301009"
     "1aa6e6f6465313a73796e63"),
    ("Y", SetUpdating(4, (0, 1, 2)), "9194a159049300010290"),
    ("F", SetFeatureLevel(2), "9192a14602"),
    ("E", PutExchange(ExchangeRecord(name="x", type="topic", alternate="alt")), "9194a145a178a5746f706963a3616c74"),
    ("I", DropExchange("x"), "9192a149a178"),
    ("J", SetBinding(BindingRecord(source="x", destination="q", routing_key="a.*", arguments=(("x-match", "any"),)),
                     True), "9197a14aa178a171c2a3612e2a9192a7782d6d61746368a3616e79c3"),
    ("Z", Trim(1, 0, 42), "9192a15a2a"),
]


def _plain(op: WriteOp) -> WriteOp:
    """``op`` with a packed run of messages unpacked (a PackedRun compares by identity)."""
    if isinstance(op, Append) and type(op.messages) is PackedRun:
        return Append(op.queue_id, op.partition, list(op.messages), op.next_offset)
    return op


@pytest.mark.parametrize(("code", "op", "wire"), PINNED_OPS, ids=[c for c, _o, _w in PINNED_OPS])
def test_every_op_code_encodes_to_the_pinned_bytes(code: str, op: WriteOp, wire: str) -> None:
    data, _applied = encode_ops([op])
    assert data.hex() == wire
    assert msgpack.unpackb(data, raw=False)[0][0] == code
    (back,) = decode_ops((1, 0), bytes.fromhex(wire))
    assert _plain(back) == op


def test_a_queue_with_an_owner_is_nine_items_and_one_without_the_eight_of_older_builds() -> None:
    """The user who declared a queue travels as a ninth item; a queue without one (the node's
    own) is the eight items an older build sends and reads, and those read as no owner."""
    owned = dataclasses.replace(META, owner="alice")
    wire = "9192a1519904a66f726465727302a4686173680005a3646c7164a5616c696365"
    data, _applied = encode_ops([PutQueue(owned)])
    assert data.hex() == wire and len(msgpack.unpackb(data)[0][1]) == 9
    assert decode_ops((0, 0), data) == [PutQueue(owned)]
    eight = next(w for c, _o, w in PINNED_OPS if c == "Q")
    assert len(msgpack.unpackb(bytes.fromhex(eight))[0][1]) == 8
    assert decode_ops((0, 0), bytes.fromhex(eight)) == [PutQueue(META)] and META.owner is None
    # (an older build reads the nine as the eight it knows: arrays may grow at the end)
    assert msgpack.unpackb(data)[0][1][:8] == msgpack.unpackb(bytes.fromhex(eight))[0][1]
    with pytest.raises(ValueError, match="owner"):
        decode_ops((0, 0), msgpack.packb([["Q", [4, "orders", 2, "hash", 0, 5, "dlq", 100, 7]]]))


def test_a_queues_dead_letter_exchange_travels_last_and_a_queue_without_one_is_as_before() -> None:
    """Items 17 and 18: the exchange and routing key its dead letters go to (left out when
    unset, so a queue without them is what a build without them sends); a version-3 reader
    (record types: ha.recordtypes) has them cut off by the converter."""
    dlx = dataclasses.replace(META, dead_letter_queue=None, owner="alice", dead_letter_exchange="dlx",
                              dead_letter_routing_key="dead")
    data, _applied = encode_ops([PutQueue(dlx)])
    items = msgpack.unpackb(data, raw=False)[0][1]
    assert len(items) == 18 and items[16:] == ["dlx", "dead"]
    assert decode_ops((0, 0), data) == [PutQueue(dlx)]
    keyless = dataclasses.replace(dlx, dead_letter_routing_key=None)
    assert len(msgpack.unpackb(encode_ops([PutQueue(keyless)])[0], raw=False)[0][1]) == 17
    assert decode_ops((0, 0), encode_ops([PutQueue(keyless)])[0]) == [PutQueue(keyless)]
    assert len(msgpack.unpackb(encode_ops([PutQueue(dataclasses.replace(META, owner="alice"))])[0])[0][1]) == 9
    down = next(c for c in CONVERTERS if c.name == "record.QueueMeta" and c.older == 3)
    assert down.down(items) == items[:16] and down.up(items[:16]) == [*items[:16], None, None]
    with pytest.raises(ValueError, match="dead_letter_exchange"):
        decode_ops((0, 0), msgpack.packb([["Q", [*items[:16], 7]]]))


def test_a_catalogue_snapshot_carries_each_queues_owner() -> None:
    owned = dataclasses.replace(META, name="mine", id=5, owner="alice")
    data = encode_catalogue_snapshot([META, owned], {"seeded": True})
    assert decode_catalogue_snapshot(data)[0] == [META, owned]


def test_a_producers_seqs_travel_as_a_fourth_item_that_older_builds_ignore() -> None:
    """The seqs a batch took: the first, then the steps between them; a PUT_PRODUCER of three
    items (a batch numbered per partition, or an older build's) reads as no seqs."""
    op = PutProducer(1, 0, "p1", 12, (3, 6, 12, 9))
    data, _applied = encode_ops([op])
    assert data.hex() == "9194a150a270310c9403030303"  # ["P", "p1", 12, [3, 3, 3, 3]]
    assert decode_ops((1, 0), data) == [PutProducer(1, 0, "p1", 12, (3, 6, 9, 12))]
    three = msgpack.packb([msgpack.unpackb(data)[0][:3]])
    assert decode_ops((1, 0), three) == [PutProducer(1, 0, "p1", 12)]


@pytest.mark.parametrize("seqs", [[3, -1], ["3"], 7, [0, 2**63]])
def test_a_producers_seqs_that_do_not_fit_are_refused(seqs: object) -> None:
    with pytest.raises(MalformedReplicationError):
        decode_ops((1, 0), msgpack.packb([["P", "p1", 7, seqs]]))


def test_a_list_of_messages_is_read() -> None:
    """``A`` is what a log holds for an append whose offsets have a gap."""
    (back,) = decode_ops((1, 0), bytes.fromhex(PINNED_OPS[1][2]))
    assert isinstance(back, Append) and list(back.messages) == [M1, M3] and back.next_offset == 10


def test_an_unknown_op_code_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown log op 'z'"):
        decode_ops((1, 0), msgpack.packb([["z", 1]]))


SNAPSHOT = PartitionState(next_offset=10, delivered_upto=6, producers={"p1": 7},
                          messages=[StoredMessage(5, "k", b"\x80", b"body", "p1", 7, 1.5, 2)])
SNAPSHOT_WIRE = "940a0681a2703107919805a16bc40180c404626f6479a2703107cb3ff800000000000002"


def test_a_partition_snapshot_encodes_to_the_pinned_bytes() -> None:
    assert encode_snapshot(SNAPSHOT).hex() == SNAPSHOT_WIRE
    assert snapshot_ops((1, 0), bytes.fromhex(SNAPSHOT_WIRE)) == [
        ResetPartition(1, 0),
        Append(1, 0, [StoredMessage(5, "k", b"\x80", b"body", "p1", 7, 1.5)], 10),
        MarkDelivered(1, 0, 6),
        SetDeliveryCount(1, 0, [(5, 1)]),  # (the delivered mark adds one back on load)
        PutProducer(1, 0, "p1", 7),
    ]


def test_a_catalogue_snapshot_encodes_to_the_pinned_bytes() -> None:
    security = {"users": [user_fields(USER)], "acls": [["bob", "orders.*", ["consume"]]], "seeded": True}
    wire = ("84a6717565756573919804a66f726465727302a4686173680005a3646c7164a575736572739185a46e616d65a3626f62a473616c"
            "74c40101a468617368c40102a4726f6c65a475736572a6706172616d73a6736372797074a461636c739193a3626f62a86f726465"
            "72732e2a91a7636f6e73756d65a6736565646564c3")
    assert encode_catalogue_snapshot([META], security).hex() == wire
    assert decode_catalogue_snapshot(bytes.fromhex(wire)) == ([META], security)


def test_a_catalogue_snapshot_carries_the_drained_members() -> None:
    """Decoded as sent; a snapshot without them (a build without the drain) has no key."""
    security = {"users": [], "acls": [], "seeded": True, "drained": ["node2"]}
    data = encode_catalogue_snapshot([META], security)
    assert decode_catalogue_snapshot(data) == ([META], security)
    assert "drained" not in decode_catalogue_snapshot(encode_catalogue_snapshot([META], {"seeded": True}))[1]
    with pytest.raises(ValueError, match="drained node"):
        decode_catalogue_snapshot(encode_catalogue_snapshot([META], {"drained": [3]}))


def test_a_catalogue_snapshot_of_queues_alone_still_decodes() -> None:
    """What a build without users in the catalogue sends: the array of queues."""
    assert decode_catalogue_snapshot(bytes.fromhex("919804a66f726465727302a4686173680005a3646c7164")) == ([META], None)


def test_a_replicate_payload_encodes_to_the_pinned_bytes() -> None:
    """Items of (queue id, partition, message), the catalogue's (0, 0) among them."""
    items = [[1, 0, encode_message(Alive(3, "node3"))], [0, 0, encode_message(VoteReply(3, "node2", True))]]
    wire = "92930100930603a56e6f646533930000940103a56e6f646532c3"
    assert encode_replicate(items).hex() == wire
    assert [(q, p, decode_message(raw)) for q, p, raw in decode_replicate(bytes.fromhex(wire))] == [
        (1, 0, Alive(3, "node3")), (0, 0, VoteReply(3, "node2", True))]


def test_the_kinds_and_codes_are_the_wire_values() -> None:
    assert [(k.name, int(k)) for k in MessageKind] == [
        ("REQUEST_VOTE", 0), ("VOTE_REPLY", 1), ("APPEND_ENTRIES", 2), ("APPEND_REPLY", 3),
        ("INSTALL_SNAPSHOT", 4), ("TIMEOUT_NOW", 5), ("ALIVE", 6), ("PRE_VOTE", 7),
        ("PRE_VOTE_REPLY", 8), ("SNAPSHOT_CHUNK", 9), ("SNAPSHOT_ACK", 10)]
    assert [str(c) for c in OpCode] == [code for code, _op, _wire in PINNED_OPS]


@pytest.mark.parametrize(("fields", "why"), [
    ([["n1", "n2"], ["n4=10.0.0.4:7781"], [], [], True, []], "address 'n4=10.0.0.4:7781'"),  # not a member
    ([["n1", "n2"], ["n2=10.0.0.2"], [], [], True, []], "address 'n2=10.0.0.2'"),  # no port
    ([["n1", "n2"], ["n2=10.0.0.2:99999"], [], [], True, []], "address"),
    ([["n1", "n2"], [], ["n3=a"], [], True, []], "zone"),
    ([["n1", "n2"], [], ["n1="], [], True, []], "zone"),
    ([["n1", "n2"], [], [], ["n3"], True, []], "leaving node"),
    ([["n1", "n1"], [], [], [], True, []], "distinct"),
    ([["n1", "n2"], [], [], [], True, [[1, 0, []]]], "placement"),
])
def test_a_group_entry_that_does_not_fit_is_refused(fields: list[object], why: str) -> None:
    """A SetGroup from a peer is checked before anything acts on it: addresses and zones of
    members, leaving nodes among them, pins with nodes."""
    with pytest.raises(MalformedReplicationError, match=why):
        decode_ops((0, 0), msgpack.packb([["W", *fields]]))


def test_a_static_placement_carries_its_mark_and_an_unmarked_one_keeps_four_items() -> None:
    op = SetPlacement(4, 1, ("node3:sync", "node1:async"), False, True)
    data, _applied = encode_ops([op])
    assert data.hex() == "9196a14c040192aa6e6f6465333a73796e63ab6e6f6465313a6173796e63c2c3"
    assert decode_ops((0, 0), data) == [op]
    assert len(msgpack.unpackb(encode_ops([SetPlacement(4, 1, ("node3",), False)])[0])[0]) == 5


@pytest.mark.parametrize("nodes", [["n1:sync", "n1:async"], [":sync"], []])
def test_a_placement_that_names_a_node_twice_or_none_is_refused(nodes: list[str]) -> None:
    with pytest.raises(MalformedReplicationError, match="placement: nodes must be distinct"):
        decode_ops((0, 0), msgpack.packb([["L", 4, 1, nodes, False, True]]))


def test_a_partition_done_with_an_update_is_its_own_op() -> None:
    op = SetUpdating(4, (), (1,))
    data, _applied = encode_ops([op])
    assert data.hex() == "9194a15904909101" and decode_ops((0, 0), data) == [op]
    with pytest.raises(MalformedReplicationError, match="update: a partition is named twice"):
        decode_ops((0, 0), msgpack.packb([["Y", 4, [1, 1], []]]))
