"""Forwarded requests: every kind round-trips, and a payload that does not fit its kind is
refused with InvalidArgumentError (a peer's bad frame costs one request, never the node)."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest

from broker.messaging.forward import (REQUESTS, AclGrantFwd, AclRevokeFwd, CatalogueFwd, DeclareFwd, DeleteFwd, DepthFwd,
                            ForwardKind, OptionFwd, PartitionStatsFwd, PublishFwd, PurgeFwd, QueueStatsFwd, ReadFwd,
                            DrainFwd, GroupFwd, MoveFwd, StatusFwd, UserDropFwd, UserPutFwd, RemapFwd, AuditFwd,
                            MembersFwd, ProducedFwd, RestoreFwd, UpgradeFwd, RelayCancelFwd, RelayDeliverFwd,
                            RelayGetFwd, RelayReleaseFwd, RelaySettleFwd, RelayTxAckFwd, RelaySubscribeFwd, RoutedFwd,
                            TopologyFwd, OffsetFwd, TxFwd, TxResolveFwd, decode_request)
from client.errors import InvalidArgumentError

EXAMPLES = [
    PublishFwd(1, 2, b"\x81\xa2op\x01"), DeclareFwd(2, b"frame"), DeclareFwd(2, b"frame", "alice"),
    DeleteFwd(1, "orders", True), CatalogueFwd(),
    StatusFwd(), PartitionStatsFwd("orders", 3), QueueStatsFwd(), OptionFwd("priority", 2, "admin"),
    ReadFwd(1, "orders", 0, 100, 500), DepthFwd("orders", 1), PurgeFwd("orders", 0),
    UserPutFwd(0, b"\x80", "create"), UserDropFwd(1, "bob"), AclGrantFwd(0, "bob", "orders.*", "consume"),
    AclRevokeFwd(2, "bob", "*", "produce,browse"), DrainFwd(1, "node3", 1, "admin"), UpgradeFwd(1, 2, "admin"),
    MoveFwd(1, 4, 0, "node3,node1", 1, "admin"), GroupFwd(1, "add", "node4", "10.0.0.4:7781", "", "admin"),
    RemapFwd(1, "add", 4, 2, "", "node1,node2;node2,node1", 0, "admin"), AuditFwd("orders"), MembersFwd(),
    RestoreFwd(1, "node3", "orders", "2"), ProducedFwd(1, "orders", 2, "p1", 17),
    RelaySubscribeFwd(3, 7, "orders", 256), RelayDeliverFwd(3, 7, b"\x82\xa2op\x11"),
    RelaySettleFwd(3, "ack", b"\x92\x01\x02"), RelayCancelFwd(3, 7), RelayReleaseFwd(3),
    RelayGetFwd(3, "orders", False),
    TopologyFwd(1, "bind", b"\x80"),
    RoutedFwd(1, "p1", b"\x90", b"\x90"),
    ReadFwd(1, "orders", 0, 100, 500, "last"), ReadFwd(1, "orders", 0, 0, 10, "", 1_700_000_000_000),
    OffsetFwd(1, "orders", 2, "billing", True, 17), OffsetFwd(2, "orders", 0, "billing", False, 0),
    TxFwd(1, 1, "app~0123456789abcdef"), TxFwd(2, 2, "app~0123456789abcdef/3/7", 1, 5),
    TxResolveFwd(1, "orders", 2, "app~0123456789abcdef/3/7", 1),
    RelayTxAckFwd(3, "amqp.node1/1/4", b"\x92\x01\x02"),
]


def test_every_kind_has_one_request_type_and_an_example() -> None:
    assert set(REQUESTS) == set(ForwardKind)
    assert {type(e).KIND for e in EXAMPLES} == set(ForwardKind)


@pytest.mark.parametrize("req", EXAMPLES, ids=lambda r: type(r).__name__)
def test_round_trip(req: object) -> None:
    assert decode_request(int(type(req).KIND), req.pack()) == req  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind, payload, what", [
    (99, b"", "unknown forwarded request kind 99"),
    (int(ForwardKind.DELETE), b"\xc1", "not msgpack"),
    (int(ForwardKind.DELETE), msgpack.packb({"queue": "q"}), "expected 4 fields"),
    (int(ForwardKind.DELETE), msgpack.packb([1, "q"]), "expected 4 fields"),
    (int(ForwardKind.DELETE), msgpack.packb([1, "q", 1]), "field if_empty is not bool"),
    (int(ForwardKind.DEPTH), msgpack.packb(["q", True]), "field partition is not an int in 0 .. 2\\*\\*63-1"),
    # ints are 0 .. 2**63-1: a negative or oversized partition or offset never reaches a handler
    (int(ForwardKind.DEPTH), msgpack.packb(["q", -1]), "field partition is not an int in 0 .. 2\\*\\*63-1"),
    (int(ForwardKind.READ), msgpack.packb([0, "q", 0, -5, 10]), "field offset is not an int in 0"),
    (int(ForwardKind.READ), msgpack.packb([0, "q", 0, 2**64 - 1, 10]), "field offset is not an int in 0"),
    (int(ForwardKind.PUBLISH), msgpack.packb([1, 0, "not bytes"]), "field frame is not bytes"),
    (int(ForwardKind.STATUS), msgpack.packb([1]), "expected 0 fields"),
])
def test_a_payload_that_does_not_fit_is_refused(kind: int, payload: bytes, what: str) -> None:
    with pytest.raises(InvalidArgumentError, match=what):
        decode_request(kind, payload)


def test_fields_are_packed_in_declaration_order() -> None:
    req = ReadFwd(1, "orders", 2, 3, 4, "first", 5)
    assert msgpack.unpackb(req.pack()) == [getattr(req, f.name) for f in dataclasses.fields(req)]
    assert msgpack.unpackb(req.pack()) == [1, "orders", 2, 3, 4, "first", 5]


def test_trailing_fields_at_their_defaults_are_left_out() -> None:
    """An older build, which knows only the first fields, reads the request."""
    assert msgpack.unpackb(ReadFwd(1, "orders", 2, 3, 4).pack()) == [1, "orders", 2, 3, 4]
    assert msgpack.unpackb(ReadFwd(1, "orders", 2, 3, 4, "", 9).pack()) == [1, "orders", 2, 3, 4, "", 9]
