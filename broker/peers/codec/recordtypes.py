"""This build's persistent and replicated record types, for the type exchange on peer links
(ha.recordtypes): each log op, the records inside them, the catalogue's and a partition's
snapshots, and the store's tables, with their versions.

A definition is read off the code that writes the record: the op and record dataclasses of
:mod:`storage.base` (their fields and annotations, in order), the snapshot layouts of
:mod:`broker.peers.codec.snapshots`, and the SQLite store's tables as its DDL makes them.  Every
type is at version 1, the first release's layout, unless :data:`VERSIONS` says otherwise.  A change to a definition changes its CRC:
give the type a new version in :data:`VERSIONS` and a converter (ha.recordtypes.Converter) in
:data:`CONVERTERS`; tests/unit/test_record_types.py pins every stamp.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from functools import cache

from ha.recordtypes import Converter, Fields, RecordType, TypeTable
from storage.base import (
    AclRecord, Append, DropProducers, DropQueue, DropUser, GrantAcl, MarkDelivered, PutProducer, PutQueue, PutUser,
    QueueMeta, RevokeAcl, SeedAdmin, SetDeliveryCount, SetDrained, SetFeatureLevel, SetGroup, SetPlacement,
    SetUpdating, Settle, StoredMessage, Trim, UserRecord,
)
from storage.topology import BindingRecord, DropExchange, ExchangeRecord, PutExchange, SetBinding
from storage.sqlite.schema import ADDED_COLUMNS, DDL

#: the log ops by their OpCode's name (broker.peers.codec.ops; PACKED_APPEND is APPEND's other encoding)
LOG_OPS: dict[str, type] = {
    "APPEND": Append, "SETTLE": Settle, "MARK_DELIVERED": MarkDelivered, "DELIVERY_COUNTS": SetDeliveryCount,
    "PUT_PRODUCER": PutProducer, "DROP_PRODUCERS": DropProducers, "PUT_QUEUE": PutQueue, "DROP_QUEUE": DropQueue,
    "PUT_USER": PutUser, "DROP_USER": DropUser, "GRANT_ACL": GrantAcl, "REVOKE_ACL": RevokeAcl,
    "SEED_ADMIN": SeedAdmin, "SET_DRAINED": SetDrained, "SET_PLACEMENT": SetPlacement, "SET_GROUP": SetGroup,
    "SET_UPDATING": SetUpdating, "SET_FEATURE_LEVEL": SetFeatureLevel, "PUT_EXCHANGE": PutExchange,
    "DROP_EXCHANGE": DropExchange, "SET_BINDING": SetBinding, "TRIM": Trim,
}
#: the records inside the ops and snapshots
RECORDS: dict[str, type] = {"QueueMeta": QueueMeta, "StoredMessage": StoredMessage, "UserRecord": UserRecord,
                            "AclRecord": AclRecord, "ExchangeRecord": ExchangeRecord, "BindingRecord": BindingRecord}
#: the snapshots' layouts (broker.peers.codec.snapshots)
SNAPSHOTS: dict[str, tuple[tuple[str, str], ...]] = {
    "catalogue": (("queues", "array QueueMeta"), ("users", "array UserFields"), ("acls", "array Grant"),
                  ("seeded", "bool"), ("drained", "array str"), ("placed", "array Placement"),
                  ("group", "Group"), ("updating", "array Update"), ("level", "int"), ("exchanges", "array Exchange"),
                  ("bindings", "array Binding")),
    "partition": (("next_offset", "int"), ("delivered_upto", "int"), ("producers", "map str int"),
                  ("messages", "array Message"), ("parts", "int")),
}
#: types at a version past the first release's: version 2 of a queue's record and row adds its
#: overflow (``max_length_bytes``, ``overflow``), its messages' time to live (``message_ttl``) and
#: its own when unused (``expires``; feature level 3); version 2 of the catalogue's snapshot adds
#: the exchanges and bindings (feature level 4); version 2 of ``PUT_PRODUCER`` adds the seqs its
#: batch took (a trailing item a version-1 reader ignores, at any level: it changes nothing stored);
#: version 3 of a queue's record and row adds its type and a stream's retention (``type``,
#: ``max_age``, ``max_bytes``; feature level 5, as is the ``TRIM`` op); version 4 of a queue's
#: record and row adds where its dead letters are published (``dead_letter_exchange``,
#: ``dead_letter_routing_key``; feature level 8); version 2 of the store's chunks adds each one's
#: CRC-32 (a column an older build neither reads nor writes: local to each store, at any level);
#: the next version of the store's settled, counts, producers, queues, users, acls and ha_state
#: tables adds each row's checksums (storage.sqlite.rowsums: written from feature level 9 on, as
#: an older build updates rows without them; local to each store); version 2 of the store's
#: partitions and meta tables adds each row's checksum (written at any level: a trigger clears the
#: checksum of a row an older build changes, storage.sqlite.schema.TRIGGERS; local to each store)
#: and, in partitions, the digest of the partition's chunks (written from feature level 10 on; covering its
#: applied position too from level 11, and its settled ranges and delivery counts from level 12, the same column)
VERSIONS: dict[str, int] = {"record.QueueMeta": 4, "store.queues": 5, "snapshot.catalogue": 2, "log.PUT_PRODUCER": 2,
                            "store.chunks": 2, "store.settled": 2, "store.counts": 2, "store.producers": 2,
                            "store.users": 2, "store.acls": 2, "store.ha_state": 2, "store.partitions": 2,
                            "store.meta": 2}


def _overflow_up(fields: Fields) -> Fields:
    """A version-1 queue (record or row) as version 2 reads it: no byte bound, publishes past
    ``max_length`` refused, no time to live, never deleted unused."""
    return [*fields, 0, "reject-publish", 0, 0]


def _overflow_down(fields: Fields) -> Fields:
    """A version-2 queue as version 1 has it: without its overflow (written only at feature
    level 3, which a version-1 build cannot join)."""
    return list(fields[:-4])


def _stream_up(fields: Fields) -> Fields:
    """A version-2 queue (record or row) as version 3 reads it: a classic queue."""
    return [*fields, "classic", 0, 0]


def _stream_down(fields: Fields) -> Fields:
    """A version-3 queue as version 2 has it: without its type and retention (a stream is
    declared only at feature level 5, which a version-2 build cannot join)."""
    return list(fields[:-3])


def _dlx_up(fields: Fields) -> Fields:
    """A version-3 queue (record or row) as version 4 reads it: no dead-letter exchange."""
    return [*fields, None, None]


def _dlx_down(fields: Fields) -> Fields:
    """A version-4 queue as version 3 has it: without its dead-letter exchange (set only at
    feature level 8, which a version-3 build cannot join)."""
    return list(fields[:-2])


def _crc_up(fields: Fields) -> Fields:
    """A version-1 chunk row as version 2 reads it: no checksum (read unchecked)."""
    return [*fields, None]


def _crc_down(fields: Fields) -> Fields:
    """A version-2 chunk row as version 1 has it: without its checksum."""
    return list(fields[:-1])


def _sums_up(fields: Fields) -> Fields:
    """A row written without its checksum as the next version reads it: unchecked."""
    return [*fields, None]


def _sums_down(fields: Fields) -> Fields:
    """A row with its checksum as the version before has it: without."""
    return list(fields[:-1])


def _digest_up(fields: Fields) -> Fields:
    """A version-1 ``partitions`` row as version 2 reads it: no digest of its chunks, no checksum."""
    return [*fields, None, None]


def _digest_down(fields: Fields) -> Fields:
    """A version-2 ``partitions`` row as version 1 has it: without its digest and checksum."""
    return list(fields[:-2])


def _state_sums_up(fields: Fields) -> Fields:
    """A version-1 ``ha_state`` row as version 2 reads it: its three checksums absent (unchecked)."""
    return [*fields, None, None, None]


def _state_sums_down(fields: Fields) -> Fields:
    """A version-2 ``ha_state`` row as version 1 has it: without its checksums."""
    return list(fields[:-3])


def _topology_up(fields: Fields) -> Fields:
    """A version-1 catalogue snapshot as version 2 reads it: no exchanges, no bindings."""
    return [*fields, [], []]


def _topology_down(fields: Fields) -> Fields:
    """A version-2 catalogue snapshot as version 1 has it (it has exchanges only at feature
    level 4, which a version-1 build cannot join)."""
    return list(fields[:-2])


def _seqs_up(fields: Fields) -> Fields:
    """A version-1 ``PUT_PRODUCER`` as version 2 reads it: no seqs (the replicas learn none)."""
    return [*fields, ()]


def _seqs_down(fields: Fields) -> Fields:
    """A version-2 ``PUT_PRODUCER`` as version 1 has it: without its seqs."""
    return list(fields[:-1])


#: the converters between a type's versions
CONVERTERS: tuple[Converter, ...] = (
    Converter("record.QueueMeta", 1, _overflow_up, _overflow_down),
    Converter("store.queues", 1, _overflow_up, _overflow_down),
    Converter("record.QueueMeta", 2, _stream_up, _stream_down),
    Converter("store.queues", 2, _stream_up, _stream_down),
    Converter("record.QueueMeta", 3, _dlx_up, _dlx_down),
    Converter("store.queues", 3, _dlx_up, _dlx_down),
    Converter("snapshot.catalogue", 1, _topology_up, _topology_down),
    Converter("log.PUT_PRODUCER", 1, _seqs_up, _seqs_down),
    Converter("store.chunks", 1, _crc_up, _crc_down),
    Converter("store.queues", 4, _sums_up, _sums_down),
    *(Converter(f"store.{t}", 1, _sums_up, _sums_down)
      for t in ("settled", "counts", "producers", "users", "acls", "meta")),
    Converter("store.partitions", 1, _digest_up, _digest_down),
    Converter("store.ha_state", 1, _state_sums_up, _state_sums_down),
)


def _fields(cls: type) -> tuple[tuple[str, str], ...]:
    return tuple((f.name, str(f.type)) for f in dataclasses.fields(cls))


def _tables() -> dict[str, tuple[tuple[str, str], ...]]:
    """The store's tables, as its DDL (and the columns added since) make them: each column's
    name and declared type, in order."""
    db = sqlite3.connect(":memory:")
    try:
        for ddl in DDL:
            db.execute(ddl)
        for table, column, decl in ADDED_COLUMNS:  # (as storage.sqlite.schema.create_schema adds them)
            if column not in {r[1] for r in db.execute(f"PRAGMA table_info({table})")}:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
        names = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        return {t: tuple((r[1], r[2]) for r in db.execute(f"PRAGMA table_info({t})")) for t in names}
    finally:
        db.close()


@cache
def record_types() -> tuple[RecordType, ...]:
    """Every record type of this build (made once)."""
    defs = {f"log.{name}": _fields(cls) for name, cls in LOG_OPS.items()}
    defs.update({f"record.{name}": _fields(cls) for name, cls in RECORDS.items()})
    defs.update({f"snapshot.{name}": layout for name, layout in SNAPSHOTS.items()})
    defs.update({f"store.{name}": cols for name, cols in _tables().items()})
    return tuple(RecordType(name, VERSIONS.get(name, 1), fields) for name, fields in sorted(defs.items()))


def type_table() -> TypeTable:
    """A fresh table of this build's types and converters (one per peer manager)."""
    return TypeTable.of(record_types(), CONVERTERS)
