"""This build's record types (broker.peers.codec.recordtypes): every log op has one, and every
stamp is pinned.  A stamp that changed is a definition that changed: give the type a new
version in VERSIONS and a converter in CONVERTERS (ha.recordtypes), then pin the new stamp."""

from __future__ import annotations

from broker.peers.codec.ops import OpCode
from broker.peers.codec.recordtypes import LOG_OPS, record_types, type_table
from ha.recordtypes import RecordType

PINNED = {
    "log.APPEND": "1:9ae866a3",
    "log.DELIVERY_COUNTS": "1:653c8a1f",
    "log.DROP_PRODUCERS": "1:84b96a5c",
    "log.DROP_QUEUE": "1:436ec882",
    "log.DROP_USER": "1:f14db953",
    "log.GRANT_ACL": "1:7b7418d0",
    "log.MARK_DELIVERED": "1:04f065b1",
    "log.PUT_PRODUCER": "2:ebad2872",
    "log.PUT_QUEUE": "1:8c043553",
    "log.PUT_USER": "1:7a01d035",
    "log.REVOKE_ACL": "1:cf934de7",
    "log.SEED_ADMIN": "1:ebdb2b22",
    "log.SETTLE": "1:34119018",
    "log.SET_DRAINED": "1:bbe559f5",
    "log.SET_FEATURE_LEVEL": "1:4514ad75",
    "log.PUT_EXCHANGE": "1:a9032d71",
    "log.DROP_EXCHANGE": "1:dd4d8a7a",
    "log.SET_BINDING": "1:77522e74",
    "log.TRIM": "1:905a2e4f",
    "log.SET_GROUP": "1:3c0d096b",
    "log.SET_PLACEMENT": "1:f7e860eb",
    "log.SET_UPDATING": "1:597c2c27",
    "record.AclRecord": "1:a6109985",
    "record.QueueMeta": "4:9b95cfdb",
    "record.StoredMessage": "1:6179df01",
    "record.UserRecord": "1:e4eee2d9",
    "record.ExchangeRecord": "1:2abff80e",
    "record.BindingRecord": "1:266bc180",
    "snapshot.catalogue": "2:9277d49e",
    "snapshot.partition": "1:3611ea69",
    "store.acls": "2:f56f5c67",
    "store.chunks": "2:df55a00a",
    "store.counts": "2:375b51bb",
    "store.ha_log": "1:b04d702a",
    "store.ha_state": "2:38e26e5d",
    "store.meta": "2:65484475",
    "store.partitions": "2:2999755f",
    "store.producers": "2:fa734a73",
    "store.queues": "5:39eb00c2",
    "store.settled": "2:b2152915",
    "store.users": "2:c107b5b4",
}


def test_every_log_op_has_a_record_type() -> None:
    assert set(LOG_OPS) == {c.name for c in OpCode} - {"PACKED_APPEND"}


def test_every_stamp_is_pinned() -> None:
    assert {t.name: t.stamp for t in record_types()} == PINNED


def test_every_definition_round_trips_and_a_hello_says_every_stamp() -> None:
    for t in record_types():
        assert RecordType.parse(t.definition) == t
    assert type_table().stamps() == PINNED
