"""Type exchange (ha.recordtypes) between two builds that define one record type in two
versions: equal CRCs exchange nothing; differing ones exchange definitions, the newer side
converts both ways, and the older side counts what it cannot read and is not harmed."""

from __future__ import annotations

from typing import Any

import pytest

from ha.recordtypes import ConversionError, Converter, RecordType, TypeTable

QUEUE_V1 = RecordType("catalogue.queue", 1, (("id", "int"), ("name", "str"), ("partitions", "int")))
QUEUE_V2 = RecordType("catalogue.queue", 2, (("id", "int"), ("name", "str"), ("partitions", "int"), ("ttl", "int")))
USER = RecordType("catalogue.user", 1, (("name", "str"), ("role", "str")))
#: v1 -> v2 adds ttl 0 (no TTL); v2 -> v1 drops it
TTL = Converter("catalogue.queue", 1, up=lambda r: [*r, 0], down=lambda r: r[:3])


def _exchange(a: TypeTable, a_name: str, b: TypeTable, b_name: str) -> tuple[list[str], list[str]]:
    """A link between ``a`` and ``b``: each hears the other's stamps, sends its definitions of
    the types that differ, and learns the other's; the names each sent."""
    a_sends, b_sends = a.heard_stamps(b_name, b.stamps()), b.heard_stamps(a_name, a.stamps())
    if b_sends:
        a.learn(b_name, b.definitions(b_sends))
    if a_sends:
        b.learn(a_name, a.definitions(a_sends))
    return a_sends, b_sends


def test_a_definition_round_trips_and_its_crc_follows_every_field() -> None:
    assert RecordType.parse(QUEUE_V2.definition) == QUEUE_V2
    assert QUEUE_V2.definition == "catalogue.queue v2: id:int; name:str; partitions:int; ttl:int"
    renamed = RecordType("catalogue.queue", 2, (("id", "int"), ("name", "str"), ("parts", "int"), ("ttl", "int")))
    assert len({QUEUE_V1.crc, QUEUE_V2.crc, renamed.crc}) == 3
    with pytest.raises(ValueError):
        RecordType.parse("catalogue.queue: id:int")


def test_equal_crcs_exchange_nothing() -> None:
    a, b = TypeTable.of([QUEUE_V1, USER]), TypeTable.of([QUEUE_V1, USER])
    assert _exchange(a, "n1", b, "n2") == ([], [])
    assert a.mismatches == b.mismatches == {}


def test_differing_crcs_exchange_definitions_and_the_newer_side_converts_both_ways() -> None:
    new, old = TypeTable.of([QUEUE_V2, USER], [TTL]), TypeTable.of([QUEUE_V1, USER])
    assert _exchange(new, "new", old, "old") == (["catalogue.queue"], ["catalogue.queue"])  # only what differs
    (m,) = new.mismatches["old"].values()
    assert (m.name, m.ours, m.theirs, m.converts, m.convertible) == ("catalogue.queue", 2, 1, "here", True)
    (o,) = old.mismatches["new"].values()
    assert (o.ours, o.theirs, o.converts) == (1, 2, "there")
    assert old.theirs["new"]["catalogue.queue"] == QUEUE_V2
    # the newer side: down to the older version on the way out, up from it on the way in
    assert new.to_member("old", "catalogue.queue", [7, "orders", 4, 60]) == [7, "orders", 4]
    assert new.from_member("old", "catalogue.queue", [7, "orders", 4]) == [7, "orders", 4, 0]
    assert new.to_member("old", "catalogue.user", ["bob", "user"]) == ["bob", "user"]  # (alike: as it is)
    # the older side converts nothing: what it gets is already its version
    assert old.to_member("new", "catalogue.queue", [7, "orders", 4]) == [7, "orders", 4]


def test_a_conversion_error_on_the_older_side_is_counted_and_harms_nothing() -> None:
    new, old = TypeTable.of([QUEUE_V2, USER]), TypeTable.of([QUEUE_V1, USER])  # (no converter on the newer side)
    _exchange(new, "new", old, "old")
    assert not new.mismatches["old"]["catalogue.queue"].convertible
    with pytest.raises(ConversionError, match="no converter of catalogue.queue between versions 1 and 2"):
        new.to_member("old", "catalogue.queue", [7, "orders", 4, 60])
    applied: list[Any] = []

    def read_v1(r: list[Any]) -> list[Any]:
        id_, name, partitions = r  # (a v2 record has one item more: not a v1 queue)
        applied.append((id_, name, partitions))
        return r

    errors: list[str] = []
    assert old.receive("new", "catalogue.queue", [7, "orders", 4, 60], read_v1, errors) is None
    assert old.errors == 1 and errors == ["a catalogue.queue record from new could not be read: too many values "
                                          "to unpack (expected 3)"]
    assert old.receive("new", "catalogue.queue", [8, "audit", 2], read_v1, errors) == [8, "audit", 2]
    assert applied == [(8, "audit", 2)] and old.errors == 1  # the next record read as before


def test_a_definition_changed_without_a_new_version_is_a_mismatch_nobody_converts() -> None:
    other = RecordType("catalogue.user", 1, (("name", "str"), ("role", "str"), ("salt", "bin")))
    a, b = TypeTable.of([USER]), TypeTable.of([other])
    _exchange(a, "a", b, "b")
    m = a.mismatches["b"]["catalogue.user"]
    assert (m.ours, m.theirs, m.converts, m.convertible) == (1, 1, "none", False)


def test_a_garbled_definition_is_counted_not_raised() -> None:
    a = TypeTable.of([QUEUE_V1])
    a.heard_stamps("b", {"catalogue.queue": "9:00000000"})
    assert a.learn("b", {"catalogue.queue": "nonsense"})[0].theirs == 0 and a.errors == 1
