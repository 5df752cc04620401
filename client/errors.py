"""The one error tree of Tandem, shared by the broker and the SDK.

Every error that can cross the wire has a stable :class:`ErrorCode`; the broker
sends ``Error(code, message)`` frames and the SDK turns them back into the same
exception class with :func:`for_code`.  ``retriable`` tells a caller whether the
same request may succeed if sent again (to this node later, or to another).
"""

from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    """Stable wire codes. Never renumber: clients of older versions read these."""

    # 1xx: protocol
    PROTOCOL_ERROR = 100
    FRAME_TOO_LARGE = 101
    MALFORMED_FRAME = 102
    UNKNOWN_OP = 103
    INVALID_FIELD = 104
    UNSUPPORTED_PROTOCOL_VERSION = 105
    HEARTBEAT_TIMEOUT = 106
    # 2xx: auth
    AUTHENTICATION_FAILED = 200
    ACCESS_REFUSED = 201
    # 3xx: resources and requests
    QUEUE_NOT_FOUND = 300
    QUEUE_EXISTS_DIFFERENT = 301
    MESSAGE_TOO_LARGE = 302
    QUEUE_FULL = 303
    UNKNOWN_DELIVERY_TAG = 304
    INVALID_ARGUMENT = 305
    PARTITION_NOT_FOUND = 306
    CONSUMER_NOT_FOUND = 307
    CONSUMER_CANCELLED = 308
    # 4xx: storage
    STORAGE_ERROR = 400
    # 5xx: availability / HA
    NOT_ACTIVE = 500
    SHUTTING_DOWN = 501
    UNAVAILABLE = 502
    # 9xx: other
    INTERNAL_ERROR = 900
    CONNECTION_CLOSED = 901
    TIMEOUT = 902


class TandemError(Exception):
    """Root of every error Tandem raises."""

    code: ErrorCode = ErrorCode.INTERNAL_ERROR
    retriable: bool = False

    def __init__(self, message: str = "", *, code: ErrorCode | None = None) -> None:
        super().__init__(message or self.__class__.__name__)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self.args[0])


# -- protocol ---------------------------------------------------------------


class ProtocolError(TandemError):
    code = ErrorCode.PROTOCOL_ERROR


class LocalProtocolError(ProtocolError):
    """We were about to send something the protocol forbids (a bug on our side)."""


class RemoteProtocolError(ProtocolError):
    """The peer sent something the protocol forbids."""


class FrameTooLargeError(RemoteProtocolError):
    code = ErrorCode.FRAME_TOO_LARGE


class MalformedFrameError(RemoteProtocolError):
    code = ErrorCode.MALFORMED_FRAME


class UnknownOpError(RemoteProtocolError):
    code = ErrorCode.UNKNOWN_OP


class InvalidFieldError(RemoteProtocolError):
    code = ErrorCode.INVALID_FIELD


class UnsupportedProtocolError(ProtocolError):
    code = ErrorCode.UNSUPPORTED_PROTOCOL_VERSION


class HeartbeatTimeoutError(ProtocolError):
    code = ErrorCode.HEARTBEAT_TIMEOUT
    retriable = True


# -- auth --------------------------------------------------------------------


class AuthError(TandemError):
    code = ErrorCode.AUTHENTICATION_FAILED


class AccessRefusedError(AuthError):
    code = ErrorCode.ACCESS_REFUSED


# -- requests ------------------------------------------------------------------


class QueueNotFoundError(TandemError):
    code = ErrorCode.QUEUE_NOT_FOUND


class QueueExistsError(TandemError):
    """A queue of that name exists with other settings."""

    code = ErrorCode.QUEUE_EXISTS_DIFFERENT


class LimitError(TandemError):
    """A configured limit was hit."""


class MessageTooLargeError(LimitError):
    code = ErrorCode.MESSAGE_TOO_LARGE


class QueueFullError(LimitError):
    code = ErrorCode.QUEUE_FULL
    retriable = True


class UnknownDeliveryTagError(TandemError):
    """An ack/nack/reject named a delivery this connection does not hold.

    After a reconnect, acks for deliveries of the old connection raise this;
    the broker redelivers those messages, so an application may ignore it.
    """

    code = ErrorCode.UNKNOWN_DELIVERY_TAG


class InvalidArgumentError(TandemError):
    code = ErrorCode.INVALID_ARGUMENT


class PartitionNotFoundError(TandemError):
    code = ErrorCode.PARTITION_NOT_FOUND


class ConsumerNotFoundError(TandemError):
    code = ErrorCode.CONSUMER_NOT_FOUND


class ConsumerCancelledError(TandemError):
    """The broker ended this consumer (its queue was deleted)."""

    code = ErrorCode.CONSUMER_CANCELLED


# -- storage -------------------------------------------------------------------


class StorageError(TandemError):
    """A store operation failed; ``orig`` is the engine's own exception."""

    code = ErrorCode.STORAGE_ERROR
    retriable = True

    def __init__(self, message: str = "", *, orig: BaseException | None = None) -> None:
        super().__init__(message)
        self.orig = orig


# -- availability --------------------------------------------------------------


class NotActiveError(TandemError):
    """This node is not active for the request; ``active_hint`` names one that may be."""

    code = ErrorCode.NOT_ACTIVE
    retriable = True

    def __init__(self, message: str = "", *, active_hint: str | None = None) -> None:
        super().__init__(message)
        self.active_hint = active_hint


class ShuttingDownError(TandemError):
    code = ErrorCode.SHUTTING_DOWN
    retriable = True


class UnavailableError(TandemError):
    code = ErrorCode.UNAVAILABLE
    retriable = True


class ConnectionClosedError(TandemError):
    code = ErrorCode.CONNECTION_CLOSED
    retriable = True


class TimeoutError_(TandemError):
    code = ErrorCode.TIMEOUT
    retriable = True


RequestTimeoutError = TimeoutError_


_BY_CODE: dict[int, type[TandemError]] = {}
_cls: type[TandemError]
for _cls in [
    ProtocolError, FrameTooLargeError, MalformedFrameError, UnknownOpError, InvalidFieldError,
    UnsupportedProtocolError, HeartbeatTimeoutError, AuthError, AccessRefusedError,
    QueueNotFoundError, QueueExistsError, MessageTooLargeError, QueueFullError,
    UnknownDeliveryTagError, InvalidArgumentError, PartitionNotFoundError,
    ConsumerNotFoundError, ConsumerCancelledError, StorageError, NotActiveError, ShuttingDownError,
    UnavailableError, ConnectionClosedError, TimeoutError_,
]:
    _BY_CODE[int(_cls.code)] = _cls


def for_code(code: int, message: str, *, active_hint: str | None = None) -> TandemError:
    """Build the exception a wire error code stands for (unknown codes: TandemError)."""
    cls = _BY_CODE.get(code)
    if cls is None:
        err = TandemError(message)
        if code in ErrorCode._value2member_map_:  # a code this build knows but has no class for
            err.code = ErrorCode(code)
        return err
    if cls is NotActiveError:
        return NotActiveError(message, active_hint=active_hint)
    return cls(message)
