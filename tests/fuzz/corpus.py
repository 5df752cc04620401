"""Seed inputs for the fuzzer: well-formed bytes of everything a client or a peer can send.

Every frame type is built from its own annotations (:func:`sample_frame`), so a frame type
added to :mod:`client.protocol.frames` is in the corpus without an edit here.  The peer
payloads (``Forward`` requests by kind, ``Replicate`` messages of every kind, log entries,
snapshots) are built with the project's own encoders.  The fuzzer mutates these; the live
phase sends them and their mutants over real sockets.
"""

from __future__ import annotations

import dataclasses
import typing
from types import NoneType, UnionType
from typing import Any

import msgpack
from pamqp import body, commands, frame, header, heartbeat

from broker.messaging.forward import REQUESTS, ForwardRequest
from broker.peers.codec import (
    encode_catalogue_snapshot,
    encode_message,
    encode_ops,
    encode_replicate,
    encode_snapshot,
)
from client.protocol import FRAME_TYPES, Frame, Record, encode
from client.protocol.connection import MAX_VERSION, MIN_VERSION
from client.scram import MECHANISM, ScramClient
from client.protocol.frames import (
    Ack,
    Close,
    Declare,
    Deliver,
    Delivery,
    Forward,
    Get,
    Heartbeat,
    Hello,
    ListQueues,
    Metadata,
    PeerHello,
    Publish,
    PublishMessage,
    Read,
    Replicate,
    Status,
    Subscribe,
    Welcome,
)
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
from broker.security.users import make_user
from storage.base import (
    AclRecord,
    Append,
    DropUser,
    GrantAcl,
    PutUser,
    RevokeAcl,
    SeedAdmin,
    SetDrained,
    UserRecord,
    user_fields,
    DropProducers,
    DropQueue,
    MarkDelivered,
    PartitionState,
    PutProducer,
    PutQueue,
    QueueMeta,
    SetDeliveryCount,
    Settle,
    StoredMessage,
    WriteOp,
)

QUEUE = "fuzz"


def _sample(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (UnionType, typing.Union):
        return _sample(next(a for a in typing.get_args(tp) if a is not NoneType))
    if origin is list:
        return [_sample(typing.get_args(tp)[0])]
    if origin is dict:
        return {"h": "v"}
    if isinstance(tp, type) and issubclass(tp, Record):
        return _build(tp)
    return {int: 1, float: 1.5, str: QUEUE, bytes: b"body", bool: True}[tp]


def _build(cls: type) -> Any:
    hints = typing.get_type_hints(cls)
    return cls(**{f.name: _sample(hints[f.name]) for f in dataclasses.fields(cls)})


def sample_frame(cls: type[Frame]) -> Frame:
    """A frame of type ``cls`` with a plausible value in every field."""
    frame: Frame = _build(cls)
    return frame


def hello() -> Hello:
    return Hello(min_version=MIN_VERSION, max_version=MAX_VERSION, client_name="fuzz", user="admin",
                 mechanism=MECHANISM, auth=ScramClient("admin", "fuzz-password").first, heartbeat=10.0)


def welcome() -> Welcome:
    return Welcome(version=MAX_VERSION, node="node1", heartbeat=10.0, max_frame_size=1 << 20,
                   max_message_size=1 << 16)


def peer_hello() -> PeerHello:
    return PeerHello(min_version=MIN_VERSION, max_version=MAX_VERSION, node="node2", store_stamp="stamp",
                     priority=1, votes=1, client_address="127.0.0.1:1")


def client_requests() -> list[Frame]:
    """What a logged-in client sends: realistic requests, plus one of every frame type."""
    frames: list[Frame] = [
        Declare(rid=1, queue=QUEUE, partitions=2),
        Publish(rid=2, queue=QUEUE, messages=[PublishMessage("k", {"h": "v"}, b"m", 0)], producer_id="p"),
        Publish(rid=3, queue=QUEUE, messages=[PublishMessage(None, {}, b"x" * 40)], partition=0),
        Subscribe(rid=4, queue=QUEUE, prefetch=10),
        Ack(rid=5, tags=[1, 2], multiple=True),
        Get(rid=6, queue=QUEUE),
        Read(rid=7, queue=QUEUE, partition=0, offset=0, max_messages=5),
        Metadata(rid=8, queue=QUEUE),
        ListQueues(rid=9),
        Status(rid=10),
        Heartbeat(),
        Close(code=0, reason="bye"),
    ]
    frames += [sample_frame(cls) for cls in FRAME_TYPES.values()]
    return frames


# -- peer payloads ---------------------------------------------------------------------------------


def forward_requests() -> list[ForwardRequest]:
    out: list[ForwardRequest] = []
    for cls in REQUESTS.values():
        hints = typing.get_type_hints(cls)
        values = {f.name: _sample(hints[f.name]) for f in dataclasses.fields(cls)}
        if "frame" in values:
            inner: Frame = Declare(rid=0, queue=QUEUE, partitions=2)
            if cls.__name__ == "PublishFwd":
                inner = Publish(rid=0, queue=QUEUE, messages=[PublishMessage("k", {}, b"m", 1)], producer_id="p")
            elif cls.__name__ == "RelayDeliverFwd":
                inner = Deliver(consumer=1, messages=[Delivery(1, 0, 5, "k", {"h": "v"}, b"m", False, 1, 1.0, "0-5")])
            values["frame"] = encode(inner)[4:]
        if cls.__name__ == "RelaySettleFwd":
            values.update(action="ack", tags=msgpack.packb([1, 2]))
        out.append(cls(**values))
    return out


def _messages() -> list[StoredMessage]:
    blob = msgpack.packb({"h": "v"})
    return [StoredMessage(5, "k", blob, b"body", "p", 1, 1.0), StoredMessage(6, None, blob, b"", None, None, 2.0)]


def log_entries() -> list[bytes]:
    """Log entry payloads with every op code."""
    msgs = _messages()
    meta = QueueMeta(id=3, name=QUEUE, partitions=2, mapper="consistent_hash", ring_size=64, max_deliveries=0,
                     dead_letter_queue=None, max_length=0)
    gap = [msgs[0], StoredMessage(9, "k", msgs[0].headers_blob, b"b", None, None, 3.0)]
    ops: list[WriteOp] = [Append(3, 0, msgs, 7), Append(3, 0, gap, 10), Settle(3, 0, [5, 6]), MarkDelivered(3, 0, 6),
           SetDeliveryCount(3, 0, [(5, 2)]), PutProducer(3, 0, "p", 4), DropProducers(3, 0, ["p"]),
           PutQueue(meta), DropQueue(3), PutUser(_user()), DropUser("bob"),
           GrantAcl(AclRecord(user="bob", pattern="fuzz.*", permissions=("consume", "browse"))),
           RevokeAcl(AclRecord(user="bob", pattern="fuzz.*", permissions=("browse",))), SeedAdmin(_user(), "node1"),
           SetDrained("node2", True)]
    return [encode_ops([op])[0] for op in ops] + [encode_ops(ops)[0]]


def _user() -> UserRecord:
    return make_user("bob", "fuzz-password", "user")


def snapshots() -> list[bytes]:
    meta = QueueMeta(id=3, name=QUEUE, partitions=2, mapper="round_robin", ring_size=64, max_deliveries=3,
                     dead_letter_queue="dlq", max_length=10)
    msgs = _messages()
    msgs[0].dc = 2
    return [encode_snapshot(PartitionState(next_offset=7, delivered_upto=6, messages=msgs, producers={"p": 1})),
            encode_catalogue_snapshot([meta], {"users": [user_fields(_user())], "acls": [["bob", "fuzz.*", ["consume"]]],
                                               "seeded": True})]


def replicate_payloads() -> list[bytes]:
    """``Replicate`` payloads: one per message kind, and one with every kind."""
    entries = tuple(Entry(2, i + 1, data, "node1", False) for i, data in enumerate(log_entries()))
    messages: list[Message] = [
        RequestVote(3, "node1", 10, 2, 2),
        VoteReply(3, "node2", True),
        AppendEntries(2, "node1", 0, 0, "", entries + (Entry(2, 11, None, "node1", True),), 4),
        AppendEntries(2, "node1", 4, 2, "node1", (), 4),
        AppendReply(2, "node2", True, 11),
        InstallSnapshot(2, "node1", 9, 2, "node1", snapshots()[0]),
        InstallSnapshot(2, "node1", 9, 2, "node1", snapshots()[1]),
        TimeoutNow(2, "node1", 1),
        Alive(2, "node2"),
    ]
    # the catalogue (0, 0), the first queue's partition (1, 0) (both exist on a live node), another
    keys = [(0, 0), (1, 0), (3, 0)]
    items = [[*keys[i % len(keys)], encode_message(m)] for i, m in enumerate(messages)]
    return [encode_replicate([item]) for item in items] + [encode_replicate(items + [[0, 0, encode_message(
        AppendReply(1, "node2", False, 0))]])]


def peer_frames() -> list[Frame]:
    """What a member sends on its peer link once it is welcomed."""
    frames: list[Frame] = [Heartbeat(epoch=1, ha_state="ACTIVE", ha_previous="WAITING")]
    frames += [Replicate(payload=p, epoch=1) for p in replicate_payloads()]
    frames += [Forward(rid=i + 1, kind=int(r.KIND), payload=r.pack()) for i, r in enumerate(forward_requests())]
    return frames


def streams() -> dict[str, list[bytes]]:
    """Seed byte streams per fuzz target (see :mod:`tests.fuzz.targets`)."""
    hs = encode(hello())
    reqs = [encode(f) for f in client_requests()]
    peer = [encode(f) for f in peer_frames()]
    server = [encode(welcome())] + [encode(sample_frame(cls)) for cls in FRAME_TYPES.values()]
    return {
        "client-stream": [b"\x00" + hs + r for r in reqs] + [b"\x01" + r for r in reqs] + [b"\x00" + hs],
        "server-stream": [b"\x00" + s for s in server] + [b"\x01" + s for s in server[1:]],
        "peer-stream": [b"\x00" + encode(peer_hello()) + p for p in peer] + [b"\x01" + p for p in peer],
        "forward": [bytes([int(r.KIND)]) + r.pack() for r in forward_requests()],
        "replicate": replicate_payloads(),
        "replica": [bytes([mode]) + p for p in replicate_payloads() for mode in (0, 1, 2, 3)],
        "log-entry": log_entries(),
        "snapshot": [b"\x00" + snapshots()[0], b"\x01" + snapshots()[1]],
        "amqp-stream": [b"\x01" + s for s in amqp_streams()] + [b"\x00" + AMQP_HEADER + amqp_streams()[0]],
    }


AMQP_HEADER = b"AMQP\x00\x00\x09\x01"


def amqp_login(password: str = "secret") -> list[bytes]:
    """An AMQP client's login after the protocol header: start-ok (PLAIN), tune-ok, open."""
    return [frame.marshal(commands.Connection.StartOk(client_properties={"product": "fuzz"}, mechanism="PLAIN",
                                                      response=f"\x00admin\x00{password}", locale="en_US"), 0),
            frame.marshal(commands.Connection.TuneOk(channel_max=10, frame_max=4096, heartbeat=0), 0),
            frame.marshal(commands.Connection.Open(virtual_host="/"), 0)]


def amqp_frames() -> list[bytes]:
    """An AMQP client's frames once logged in: channels, declares, a publish in three frames,
    acks, a transaction (pamqp's own framing)."""
    props = commands.Basic.Properties(content_type="text/plain", headers={"n": 1, "s": "x", "l": [1, "a"]},
                                      delivery_mode=2, expiration="60000", message_id="m1")
    return [frame.marshal(commands.Channel.Open(), 1),
            frame.marshal(commands.Queue.Declare(queue="q", arguments={"x-message-ttl": 1000}), 1),
            frame.marshal(commands.Exchange.Declare(exchange="x", exchange_type="topic"), 1),
            frame.marshal(commands.Queue.Bind(queue="q", exchange="x", routing_key="a.#"), 1),
            frame.marshal(commands.Confirm.Select(), 1),
            frame.marshal(commands.Basic.Publish(exchange="x", routing_key="a.b", mandatory=True), 1),
            frame.marshal(header.ContentHeader(0, 5, props), 1),
            frame.marshal(body.ContentBody(b"hello"), 1),
            frame.marshal(commands.Basic.Qos(prefetch_count=10), 1),
            frame.marshal(commands.Basic.Consume(queue="q", consumer_tag="c"), 1),
            frame.marshal(commands.Basic.Ack(delivery_tag=1, multiple=True), 1),
            frame.marshal(commands.Tx.Select(), 1),
            frame.marshal(commands.Tx.Commit(), 1),
            frame.marshal(heartbeat.Heartbeat(), 0),
            frame.marshal(commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0), 1)]


def amqp_streams() -> list[bytes]:
    """What an AMQP client sends after the protocol header, as whole byte streams."""
    login, work = amqp_login(), amqp_frames()
    return [b"".join(login + work), b"".join(work), b"".join(login)]
