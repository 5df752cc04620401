"""Type exchange, sans-IO: the persistent and replicated record types of a build, each with a
version and a CRC of its definition; what two members learn of each other's when a link is
made; and the conversions between two versions of one type.

Each member sends the CRCs of its types (``name -> "version:crc"``) on its link's hello or
welcome.  Where they are equal there is nothing more to say.  Where they differ (or a type is
on one side only) the member sends the full definitions of those types, and each side keeps,
per member, a *mismatch*: the type, both versions, and which side converts.  The member with
the newer definition converts in both directions ("most current version makes right"): what
it sends the older member goes down to the older version, what it receives from it comes up.
The older member converts nothing; a record it cannot read is a conversion error, logged and
counted by its caller (:meth:`TypeTable.receive`), never raised into the path that read it
("do no harm").

A definition is the type's fields in their order, each ``name:type``, separated by "; "; its CRC is CRC-32 of
the canonical text.  A change to a definition without a new version shows as a CRC that
differs at the same version: the mismatch says so (``same version, other definition``), and
the CRCs pinned in the tests catch it before a build ships.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: a record as the converters see it: its fields' values in definition order
Fields = list[Any]


class ConversionError(Exception):
    """A record that could not be converted between two versions of its type."""


@dataclass(frozen=True, slots=True)
class RecordType:
    """One version of one record type: its fields in order, each (name, type)."""

    name: str  # e.g. "log.PUT_QUEUE", "store.queues", "snapshot.catalogue"
    version: int
    fields: tuple[tuple[str, str], ...]

    @property
    def definition(self) -> str:
        """The canonical text of the definition (what is exchanged, and what the CRC is of)."""
        return f"{self.name} v{self.version}: " + "; ".join(f"{n}:{t}" for n, t in self.fields)

    @property
    def crc(self) -> int:
        return zlib.crc32(self.definition.encode())

    @property
    def stamp(self) -> str:
        """``"version:crc"``, as a link's hello carries it."""
        return f"{self.version}:{self.crc:08x}"

    @classmethod
    def parse(cls, text: str) -> RecordType:
        """The type a definition's text names; ValueError if the text is not one."""
        head, sep, body = text.partition(": ")
        name, _, v = head.rpartition(" v")
        if not sep or not name or not v.isdigit():
            raise ValueError(f"not a record type definition: {text[:80]!r}")
        fields = tuple(tuple(f.split(":", 1)) for f in body.split("; ")) if body else ()
        if any(len(f) != 2 for f in fields):
            raise ValueError(f"a field without a type in {text[:80]!r}")
        return cls(name, int(v), fields)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Converter:
    """Between versions ``older`` and ``older + 1`` of type ``name``: ``up`` and ``down``."""

    name: str
    older: int
    up: Callable[[Fields], Fields]
    down: Callable[[Fields], Fields]


@dataclass(frozen=True, slots=True)
class Mismatch:
    """A record type this node and a member define differently."""

    member: str
    name: str
    ours: int  # our version (0: we have no such type)
    theirs: int  # theirs (0: they have none)
    #: "here" (ours is newer: this node converts both ways), "there" (the member converts),
    #: "none" (the same version defined two ways, or a side without the type: nothing converts)
    converts: str
    convertible: bool  # the newer side has a converter for every version step between them


@dataclass
class TypeTable:
    """This build's record types and converters, and what each member's build defines."""

    types: Mapping[str, RecordType]
    converters: Mapping[tuple[str, int], Converter] = field(default_factory=dict)
    #: member -> type name -> their definition, for the types whose CRC differs from ours
    theirs: dict[str, dict[str, RecordType]] = field(default_factory=dict)
    mismatches: dict[str, dict[str, Mismatch]] = field(default_factory=dict)
    errors: int = 0  # records (and definitions) from members this node could not read or convert, since start
    #: member -> the types whose stamps differ, as its hello said (their definitions to come)
    _differ: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, types: Iterable[RecordType], converters: Iterable[Converter] = ()) -> TypeTable:
        return cls({t.name: t for t in types}, {(c.name, c.older): c for c in converters})

    def stamps(self) -> dict[str, str]:
        """``name -> "version:crc"`` of every type: what this node's hello says."""
        return {name: t.stamp for name, t in sorted(self.types.items())}

    def differing(self, stamps: Mapping[str, str]) -> list[str]:
        """The types whose stamp a member said differs from ours (or that one side lacks)."""
        return sorted(n for n in set(self.types) | set(stamps) if self.types.get(n, _NONE).stamp != stamps.get(n))

    def definitions(self, names: Iterable[str]) -> dict[str, str]:
        """Our full definitions of ``names`` (those we have)."""
        return {n: self.types[n].definition for n in names if n in self.types}

    def heard_stamps(self, member: str, stamps: Mapping[str, str]) -> list[str]:
        """A member's hello said its stamps: the types whose definitions to send it (empty:
        every type alike; its earlier mismatches are forgotten)."""
        self.forget(member)
        self._differ[member] = names = self.differing(stamps)
        return names

    def forget(self, member: str) -> list[str]:
        """A member whose build exchanges no types (a first-release build): what was known of
        its types goes; nothing to send it."""
        self.theirs.pop(member, None)
        self.mismatches.pop(member, None)
        self._differ.pop(member, None)
        return []

    def learn(self, member: str, definitions: Mapping[str, str]) -> list[Mismatch]:
        """A member sent its definitions of the types whose stamps differ: the mismatches, kept
        for ``member``.  A definition that does not parse, or names another type, is counted
        as an error and taken as missing."""
        got: dict[str, RecordType] = {}
        for name, text in definitions.items():
            try:
                t = RecordType.parse(text)
            except ValueError:
                self.errors += 1
                continue
            if t.name == name:
                got[name] = t
            else:
                self.errors += 1
        self.theirs[member] = got
        names = sorted(set(self._differ.get(member, ())) | set(got))
        table = {n: self._mismatch(member, n, self.types.get(n), got.get(n)) for n in names}
        self.mismatches[member] = table
        return list(table.values())

    def _mismatch(self, member: str, name: str, ours: RecordType | None, theirs: RecordType | None) -> Mismatch:
        ov, tv = ours.version if ours else 0, theirs.version if theirs else 0
        if ov and tv and ov != tv:
            lo, hi = min(ov, tv), max(ov, tv)
            return Mismatch(member, name, ov, tv, "here" if ov > tv else "there",
                            ov < tv or all((name, v) in self.converters for v in range(lo, hi)))
        return Mismatch(member, name, ov, tv, "none", False)

    # -- records on a link (the newer side converts both ways) ------------------------------------

    def to_member(self, member: str, name: str, record: Fields) -> Fields:
        """``record`` (of our version of ``name``) as ``member`` reads it: converted down where
        ours is newer; ConversionError where no converter covers the step."""
        m = self.mismatches.get(member, {}).get(name)
        if m is None or m.converts != "here":
            return record
        for v in range(m.ours - 1, m.theirs - 1, -1):
            record = self._step(name, v).down(record)
        return record

    def from_member(self, member: str, name: str, record: Fields) -> Fields:
        """``record`` as ``member`` sent it, in our version of ``name``: converted up where
        ours is newer; ConversionError where no converter covers the step."""
        m = self.mismatches.get(member, {}).get(name)
        if m is None or m.converts != "here":
            return record
        for v in range(m.theirs, m.ours):
            record = self._step(name, v).up(record)
        return record

    def _step(self, name: str, older: int) -> Converter:
        c = self.converters.get((name, older))
        if c is None:
            raise ConversionError(f"no converter of {name} between versions {older} and {older + 1}")
        return c

    def receive(self, member: str, name: str, record: Fields, read: Callable[[Fields], Any],
                errors: list[str]) -> Any:
        """Read a record ``member`` sent (``read``: this node's reader of ``name``), converted up
        first where this node is the newer; a record that cannot be converted or read is
        counted and described in ``errors`` (for the caller to log), and None is returned:
        the error goes no further."""
        try:
            return read(self.from_member(member, name, record))
        except (ConversionError, ValueError, TypeError, IndexError, KeyError) as exc:
            self.errors += 1
            errors.append(f"a {name} record from {member} could not be read: {exc}")
            return None


_NONE = RecordType("", 0, ())
