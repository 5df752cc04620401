"""Frame codec: bytes <-> frames, with hard limits.  No I/O.

Byte layout of one frame::

    offset  size  field
    0       4     length N of the payload, unsigned big-endian (N >= 1)
    4       N     payload: a msgpack map {"op": uint, <field>: <value>, ...}

Field values are msgpack nil/bool/int/float/str/bin/array/map as annotated on
the frame classes in :mod:`client.protocol.frames`; records are arrays whose
items follow the record's declared field order (trailing defaulted items may
be omitted).  Unknown extra map keys are ignored (whatever they hold), so a
newer peer may add optional fields without a version bump.  msgpack ext
types are refused in every field the frame declares.  Integers are never
negative and never above ``MAX_INT`` (2**63 - 1: what the stores keep in a signed 64-bit
column).

A frame whose declared length exceeds ``max_frame_size`` is fatal: the stream
cannot be resynchronised, so the connection must close.  Any other defect
(payload that is not msgpack, unknown op, missing or mistyped field) is
contained by the length prefix: the frame is rejected with an error naming the
request id when it could be read, and the connection can go on.
"""

from __future__ import annotations

import dataclasses
import struct
import typing
from collections.abc import Callable
from types import NoneType, UnionType
from typing import Any

import msgpack

from client.errors import (
    FrameTooLargeError,
    InvalidFieldError,
    MalformedFrameError,
    RemoteProtocolError,
    UnknownOpError,
)
from client.protocol.frames import FRAME_TYPES, Frame, Op, Record

HEADER = struct.Struct(">I")
MAX_INT = (1 << 63) - 1
DEFAULT_MAX_FRAME_SIZE = 16 * 1024 * 1024
DEFAULT_MAX_MESSAGE_SIZE = 5 * 1024 * 1024
#: the largest frame a node takes before the other side has completed its handshake (a
#: ``Hello`` or a peer's proof is a few hundred bytes): a connection without credentials
#: never makes the node hold more than this
HANDSHAKE_MAX_FRAME = 64 * 1024


class FrameError(RemoteProtocolError):
    """A bad frame from the peer.  ``rid`` is its request id when it could be read;
    ``fatal`` is true when the byte stream can no longer be trusted."""

    def __init__(self, cause: RemoteProtocolError, *, rid: int = 0, fatal: bool = False):
        super().__init__(cause.message, code=cause.code)
        self.cause = cause
        self.rid = rid
        self.fatal = fatal


Checker = Callable[[Any, str], Any]


def _fail(path: str, expected: str, value: Any) -> InvalidFieldError:
    return InvalidFieldError(f"field {path!r}: expected {expected}, got {type(value).__name__}")


def _scalar(tp: type) -> Checker:
    name = tp.__name__

    if tp is int:
        def check_int(v: Any, path: str) -> Any:
            if type(v) is not int:
                raise _fail(path, name, v)
            if not 0 <= v <= MAX_INT:
                raise InvalidFieldError(f"field {path!r}: must be 0 .. 2**63-1, got {v}")
            return v
        return check_int
    if tp is float:
        def check_float(v: Any, path: str) -> Any:
            if type(v) is float or type(v) is int:
                return float(v)
            raise _fail(path, name, v)
        return check_float

    def check(v: Any, path: str) -> Any:
        if type(v) is not tp:
            raise _fail(path, name, v)
        return v
    return check


def _optional(inner: Checker) -> Checker:
    def check(v: Any, path: str) -> Any:
        return None if v is None else inner(v, path)
    return check


def _list_of(inner: Checker, simple: type | None) -> Checker:
    def check(v: Any, path: str) -> Any:
        if type(v) is not list:
            raise _fail(path, "array", v)
        if simple is not None:
            for item in v:
                if type(item) is not simple:
                    raise _fail(path + "[]", simple.__name__, item)
            if simple is int and v and (min(v) < 0 or max(v) > MAX_INT):
                raise InvalidFieldError(f"field {path!r}: must hold numbers 0 .. 2**63-1")
            return v
        return [inner(item, path + "[]") for item in v]
    return check


def _str_map(v: Any, path: str) -> Any:
    if type(v) is not dict:
        raise _fail(path, "map", v)
    for k, val in v.items():
        if type(k) is not str or type(val) is not str:
            raise InvalidFieldError(f"field {path!r}: expected map of str to str")
    return v


def _inline_check(tp: Any, var: str, slow: str, name: str) -> list[str]:
    """Source lines checking ``var`` fast; anything unusual goes to the generic checker
    ``slow`` (which converts or raises with a precise message)."""
    call = f"{var} = {slow}({var}, path + '.{name}')"
    if tp is int:
        return [f"if type({var}) is not int or not 0 <= {var} <= {MAX_INT}: {call}"]
    if tp in (str, bytes, bool, float):
        return [f"if type({var}) is not {tp.__name__}: {call}"]
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (UnionType, typing.Union) and len(args) == 2 and NoneType in args:
        inner = args[0] if args[1] is NoneType else args[1]
        if inner is int:  # in range, as a required int
            return [f"if {var} is not None and (type({var}) is not int or not 0 <= {var} <= {MAX_INT}): {call}"]
        if inner in (str, bytes, float, bool):
            return [f"if {var} is not None and type({var}) is not {inner.__name__}: {call}"]
    if typing.get_origin(tp) is dict:
        return [f"if type({var}) is not dict or {var}: {call}"]
    return [call]


def _record(cls: type[Record]) -> Checker:
    """A checker for one record type, generated as straight-line code.

    Records are the per-message hot path (a publish batch holds thousands), so
    the common case runs as one function with inline type tests and no
    per-field calls; only a surprising value takes the generic path, which
    converts it or raises with the field's name.
    """
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    hints = typing.get_type_hints(cls)
    required = sum(
        1 for f in fields
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    )
    n = len(fields)
    env: dict[str, Any] = {"cls": cls, "InvalidFieldError": InvalidFieldError}
    lines = [
        "def check(v, path):",
        f"    if type(v) is not list or not {required} <= len(v) <= {n}:",
        f"        raise InvalidFieldError(f\"field {{path!r}}: expected {cls.__name__} as an array of "
        f"{required}..{n} items\")",
        "    k = len(v)",
    ]
    for i, f in enumerate(fields):
        env[f"slow{i}"] = _compile(hints[f.name])
        body = _inline_check(hints[f.name], f"x{i}", f"slow{i}", f.name)
        if i < required:
            lines.append(f"    x{i} = v[{i}]")
            lines += [f"    {b}" for b in body]
        else:
            env[f"default{i}"] = f.default
            lines.append(f"    if k > {i}:")
            lines.append(f"        x{i} = v[{i}]")
            lines += [f"        {b}" for b in body]
            lines.append("    else:")
            lines.append(f"        x{i} = default{i}")
    lines.append(f"    return cls({', '.join(f'x{i}' for i in range(n))})")
    exec("\n".join(lines), env)  # noqa: S102  (generated from our own dataclass fields only)
    check: Checker = env["check"]
    return check


def _compile(tp: Any) -> Checker:
    origin = typing.get_origin(tp)
    if origin in (UnionType, typing.Union):
        args = [a for a in typing.get_args(tp) if a is not NoneType]
        if len(args) != 1:
            raise TypeError(f"unsupported union {tp}")
        return _optional(_compile(args[0]))
    if origin is list:
        (item,) = typing.get_args(tp)
        simple = item if item in (int, str, bytes) else None
        return _list_of(_compile(item), simple)
    if origin is dict:
        return _str_map
    if isinstance(tp, type) and issubclass(tp, Record):
        return _record(tp)
    if tp in (int, float, str, bytes, bool):
        return _scalar(tp)
    raise TypeError(f"unsupported field type {tp}")


@dataclasses.dataclass(frozen=True, slots=True)
class _Schema:
    cls: type[Frame]
    fields: tuple[tuple[str, Checker, bool], ...]  # name, checker, required


def _schema(cls: type[Frame]) -> _Schema:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        out.append((f.name, _compile(hints[f.name]), required))
    return _Schema(cls, tuple(out))


class _Schemas(dict[int, _Schema]):
    """Each frame type's schema by op, compiled the first time a frame of that type is encoded
    or decoded (a process uses a few of them; compiling all costs its start 0.1 s)."""

    def __missing__(self, op: int) -> _Schema:
        schema = self[op] = _schema(FRAME_TYPES[Op(op)])
        return schema

    def of(self, op: Any) -> _Schema | None:
        """The schema of ``op`` as read off the wire; None for anything that is no op."""
        if type(op) is not int:
            return None
        try:
            return self[op]
        except (KeyError, ValueError):
            return None


SCHEMAS = _Schemas()

# Record encoders: fields in declaration order, as a tuple (msgpack writes an array).
_RECORD_GETTERS: dict[type, Callable[[Any], tuple[Any, ...]]] = {}


def _record_getter(cls: type) -> Callable[[Any], tuple[Any, ...]]:
    getter = _RECORD_GETTERS.get(cls)
    if getter is None:
        import operator
        names = [f.name for f in dataclasses.fields(cls)]
        single = operator.attrgetter(*names)
        getter = single if len(names) > 1 else (lambda r: (single(r),))
        _RECORD_GETTERS[cls] = getter
    return getter


def _default(obj: Any) -> Any:
    if isinstance(obj, Record):
        return _record_getter(type(obj))(obj)
    raise TypeError(f"cannot encode {type(obj).__name__}")


_packer_default = _default


def encode(frame: Frame) -> bytes:
    """Serialise one frame: length prefix + msgpack map."""
    body: dict[str, Any] = {"op": int(frame.OP)}
    for name, _check, _req in SCHEMAS[int(frame.OP)].fields:
        body[name] = getattr(frame, name)
    payload = msgpack.packb(body, default=_packer_default, use_bin_type=True)
    return HEADER.pack(len(payload)) + payload


def _ext_hook(code: int, data: bytes) -> Any:
    raise MalformedFrameError("msgpack ext types are not part of the protocol")


def decode_payload(payload: bytes) -> Frame:
    """Turn one frame's payload into a Frame; raises FrameError (never fatal)."""
    try:
        obj = msgpack.unpackb(
            payload, raw=False, strict_map_key=True, ext_hook=_ext_hook, use_list=True
        )
    except MalformedFrameError as exc:
        raise FrameError(exc) from None
    except Exception as exc:  # msgpack raises several types (ValueError, ExtraData, ...)
        raise FrameError(MalformedFrameError(f"payload is not msgpack: {exc}")) from None
    if type(obj) is not dict:
        raise FrameError(MalformedFrameError("payload is not a msgpack map"))
    rid = obj.get("rid", 0)
    if type(rid) is not int or rid < 0:
        rid = 0
    op = obj.get("op")
    schema = SCHEMAS.of(op)
    if schema is None:
        raise FrameError(UnknownOpError(f"unknown op {op!r}"), rid=rid)
    kwargs: dict[str, Any] = {}
    try:
        for name, check, required in schema.fields:
            if name in obj:
                kwargs[name] = check(obj[name], name)
            elif required:
                raise InvalidFieldError(f"{schema.cls.__name__}: missing field {name!r}")
    except InvalidFieldError as exc:
        raise FrameError(exc, rid=rid) from None
    return schema.cls(**kwargs)


class FrameBuffer:
    """Accumulates bytes and cuts them into frame payloads.

    ``feed`` appends; ``next_payload`` returns a complete payload or None.  A
    declared length over ``max_frame_size`` (or zero) raises a fatal FrameError.
    """

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self.max_frame_size = max_frame_size
        self._buf = bytearray()
        self._pos = 0

    def feed(self, data: bytes) -> None:
        if self._pos and self._pos == len(self._buf):
            self._buf.clear()
            self._pos = 0
        self._buf += data

    def __len__(self) -> int:
        return len(self._buf) - self._pos

    def next_payload(self) -> bytes | None:
        avail = len(self._buf) - self._pos
        if avail < 4:
            return None
        (n,) = HEADER.unpack_from(self._buf, self._pos)
        if n == 0:
            raise FrameError(MalformedFrameError("empty frame (length 0)"), fatal=True)
        if n > self.max_frame_size:
            raise FrameError(
                FrameTooLargeError(f"frame of {n} bytes exceeds max_frame_size {self.max_frame_size}"),
                fatal=True,
            )
        if avail < 4 + n:
            return None
        start = self._pos + 4
        payload = bytes(self._buf[start:start + n])
        self._pos = start + n
        if self._pos > 1 << 20 and self._pos * 2 > len(self._buf):
            del self._buf[: self._pos]
            self._pos = 0
        return payload


def _ensure_ops_covered() -> None:
    missing = [op for op in Op if op not in FRAME_TYPES]
    if missing:
        raise RuntimeError(f"opcodes without a frame class: {missing}")


_ensure_ops_covered()
