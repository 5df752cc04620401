"""The one error tree of Tandem, shared by the broker and the SDK.

Every error that can cross the wire has a stable :class:`ErrorCode`; the broker
sends ``Error(code, message)`` frames and the SDK turns them back into the same
exception class with :func:`for_code`.  ``retriable`` tells a caller whether the
same request may succeed if sent again (to this node later, or to another).

What the SDK's clients (the durable connection and the blocking client alike) do
with a failed request is a rule of the error class too: :attr:`TandemError.retry`
says whether to fail it to the caller, send it again to the same node, or send it
again elsewhere (ask who is active, use another node, open a new link).
"""

from __future__ import annotations

from enum import Enum, IntEnum
from typing import ClassVar


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
    LOGIN_THROTTLED = 202
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
    OUT_OF_ORDER_SEQUENCE = 309
    TOO_MANY_CONNECTIONS = 310
    PREFETCH_TOO_LARGE = 311
    EXCHANGE_NOT_FOUND = 312
    EXCHANGE_EXISTS_DIFFERENT = 313
    NO_ROUTE = 314
    PRODUCER_FENCED = 315
    TRANSACTION_ABORTED = 316
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


class Retry(Enum):
    """What a client does with a request that failed with an error (``TandemError.retry``)."""

    #: the caller hears it at once
    FAIL = "fail"
    #: send it again after a backoff; the same node may take it (a store that failed, a
    #: sequence to settle first, an answer that did not come in time)
    SAME_NODE = "same_node"
    #: this node is not the partition's (or the catalogue's) active: ask who is, send it there
    ASK_ACTIVE = "ask_active"
    #: this node serves nothing now (no quorum, shutting down): another node may
    OTHER_NODE = "other_node"
    #: the link is gone: send it again on a new one, to whichever node answers
    NEW_LINK = "new_link"


class TandemError(Exception):
    """Root of every error Tandem raises."""

    code: ErrorCode = ErrorCode.INTERNAL_ERROR
    retriable: bool = False
    #: what the SDK's clients do with a request that failed with it (only a retriable
    #: error is ever sent again)
    retry: ClassVar[Retry] = Retry.FAIL
    #: a subscription that ends with it cannot come back (resubscribing is pointless)
    ends_subscription: ClassVar[bool] = False

    def __init__(self, message: str = "", *, code: ErrorCode | None = None) -> None:
        super().__init__(message or self.__class__.__name__)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self.args[0])

    @property
    def should_retry(self) -> bool:
        """A client rides through it: the request goes again (after a backoff, maybe elsewhere)."""
        return self.retry is not Retry.FAIL

    @property
    def reroutes(self) -> bool:
        """The node that should serve the request may be another one now: ask the group
        again who is active (the partition map) before sending it again."""
        return self.retry in (Retry.ASK_ACTIVE, Retry.OTHER_NODE, Retry.NEW_LINK)

    @property
    def redelivers(self) -> bool:
        """A settlement (ack, nack, reject) that failed with it was not applied: the broker
        delivers the message again."""
        return self.retriable


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
    retry = Retry.NEW_LINK


# -- auth --------------------------------------------------------------------


class AuthError(TandemError):
    code = ErrorCode.AUTHENTICATION_FAILED


class AccessRefusedError(AuthError):
    code = ErrorCode.ACCESS_REFUSED
    ends_subscription = True


class LoginThrottledError(AuthError):
    """Too many failed logins from this client address lately: the node refuses its logins
    until a backoff has passed (the message says how long)."""

    code = ErrorCode.LOGIN_THROTTLED


# -- requests ------------------------------------------------------------------


class QueueNotFoundError(TandemError):
    code = ErrorCode.QUEUE_NOT_FOUND
    ends_subscription = True


class QueueExistsError(TandemError):
    """A queue of that name exists with other settings."""

    code = ErrorCode.QUEUE_EXISTS_DIFFERENT


class ExchangeNotFoundError(TandemError):
    code = ErrorCode.EXCHANGE_NOT_FOUND


class ExchangeExistsError(TandemError):
    """An exchange of that name exists with another type or alternate exchange."""

    code = ErrorCode.EXCHANGE_EXISTS_DIFFERENT


class UnroutableError(TandemError):
    """A ``mandatory`` publish to an exchange held a message no binding routes to a queue:
    nothing of the batch was stored."""

    code = ErrorCode.NO_ROUTE


class LimitError(TandemError):
    """A configured limit was hit."""


class MessageTooLargeError(LimitError):
    code = ErrorCode.MESSAGE_TOO_LARGE


class TooManyConnectionsError(LimitError):
    """The user holds ``max_connections_per_user`` connections on this node already."""

    code = ErrorCode.TOO_MANY_CONNECTIONS


class PrefetchTooLargeError(LimitError):
    """A Subscribe asked for a prefetch above the node's ``max_prefetch``."""

    code = ErrorCode.PREFETCH_TOO_LARGE
    ends_subscription = True


class QueueFullError(LimitError):
    """Retriable on the wire, but the SDK's clients fail it to the caller at once: a full
    queue is the application's to hear (back-pressure), not something to wait out."""

    code = ErrorCode.QUEUE_FULL
    retriable = True


class UnknownDeliveryTagError(TandemError):
    """An ack/nack/reject named a delivery this connection does not hold.

    After a reconnect, acks for deliveries of the old connection raise this;
    the broker redelivers those messages, so an application may ignore it.
    """

    code = ErrorCode.UNKNOWN_DELIVERY_TAG

    @property
    def redelivers(self) -> bool:
        return True


class InvalidArgumentError(TandemError):
    code = ErrorCode.INVALID_ARGUMENT
    ends_subscription = True  # (a subscription refused for what it asks, a stream's, is refused again)


class PartitionNotFoundError(TandemError):
    code = ErrorCode.PARTITION_NOT_FOUND


class ConsumerNotFoundError(TandemError):
    code = ErrorCode.CONSUMER_NOT_FOUND


class OutOfOrderSequenceError(TandemError):
    """A partition-addressed publish would leave a gap in the producer's sequence (an
    earlier batch is not stored, or the node lost it): nothing of it was stored.  The
    durable producer resends from ``next_seq``."""

    code = ErrorCode.OUT_OF_ORDER_SEQUENCE
    retriable = True
    retry = Retry.SAME_NODE

    def __init__(self, message: str = "", *, next_seq: int = 0) -> None:
        super().__init__(message)
        self.next_seq = next_seq


class ProducerFencedError(TandemError):
    """A transactional producer's commit was refused: another instance with the same
    transactional id started since (its epoch is newer).  What the transaction prepared is
    aborted; this instance should stop."""

    code = ErrorCode.PRODUCER_FENCED


class TransactionAbortedError(TandemError):
    """A commit found its transaction aborted (it outlived ``transaction_timeout``, or a link
    it used closed before the commit): none of its publishes and acks took effect.  Run it
    again."""

    code = ErrorCode.TRANSACTION_ABORTED


class ConsumerCancelledError(TandemError):
    """The broker ended this consumer (its queue was deleted)."""

    code = ErrorCode.CONSUMER_CANCELLED
    ends_subscription = True


# -- storage -------------------------------------------------------------------


class StorageError(TandemError):
    """A store operation failed; ``orig`` is the engine's own exception."""

    code = ErrorCode.STORAGE_ERROR
    retriable = True
    retry = Retry.SAME_NODE

    def __init__(self, message: str = "", *, orig: BaseException | None = None) -> None:
        super().__init__(message)
        self.orig = orig


# -- availability --------------------------------------------------------------


class NotActiveError(TandemError):
    """This node is not active for the request; ``active_hint`` names one that may be."""

    code = ErrorCode.NOT_ACTIVE
    retriable = True
    retry = Retry.ASK_ACTIVE

    def __init__(self, message: str = "", *, active_hint: str | None = None) -> None:
        super().__init__(message)
        self.active_hint = active_hint


class ShuttingDownError(TandemError):
    code = ErrorCode.SHUTTING_DOWN
    retriable = True
    retry = Retry.OTHER_NODE


class UnavailableError(TandemError):
    code = ErrorCode.UNAVAILABLE
    retriable = True
    retry = Retry.OTHER_NODE


class ConnectionClosedError(TandemError):
    code = ErrorCode.CONNECTION_CLOSED
    retriable = True
    retry = Retry.NEW_LINK


class TimeoutError_(TandemError):
    code = ErrorCode.TIMEOUT
    retriable = True
    retry = Retry.SAME_NODE


RequestTimeoutError = TimeoutError_


# -- durable connections (raised by the SDK itself, never sent on the wire) ---------


class StaleDeliveryError(TandemError):
    """A settlement of a message that came on a link which has since failed (or whose
    partition moved to another node).  Nothing was applied: the broker delivers the
    message again, marked ``redelivered``.  Safe to ignore."""

    code = ErrorCode.CONNECTION_CLOSED
    retriable = False


class BufferFull(TandemError):
    """The durable connection's local send buffer holds ``buffer_max_bytes``: this
    message was not taken."""

    code = ErrorCode.QUEUE_FULL
    retriable = True


class ConfirmedMessagesLost(TandemError):
    """After a failover, a partition holds fewer of this producer's messages than were
    confirmed: ``count`` confirmed messages (sequences ``first_seq`` ..) are gone,
    which only weak durability policies allow.  Reported as a connection event."""

    code = ErrorCode.STORAGE_ERROR
    retriable = False

    def __init__(self, message: str = "", *, queue: str = "", partition: int = 0, producer_id: str = "",
                 first_seq: int = 0, count: int = 0) -> None:
        super().__init__(message)
        self.queue, self.partition, self.producer_id = queue, partition, producer_id
        self.first_seq, self.count = first_seq, count


_BY_CODE: dict[int, type[TandemError]] = {}
_cls: type[TandemError]
for _cls in [
    ProtocolError, FrameTooLargeError, MalformedFrameError, UnknownOpError, InvalidFieldError,
    UnsupportedProtocolError, HeartbeatTimeoutError, AuthError, AccessRefusedError, LoginThrottledError,
    QueueNotFoundError, QueueExistsError, MessageTooLargeError, QueueFullError, TooManyConnectionsError,
    PrefetchTooLargeError, ExchangeNotFoundError, ExchangeExistsError, UnroutableError,
    UnknownDeliveryTagError, InvalidArgumentError, PartitionNotFoundError, ProducerFencedError,
    TransactionAbortedError, ConsumerNotFoundError, ConsumerCancelledError, OutOfOrderSequenceError, StorageError, NotActiveError, ShuttingDownError,
    UnavailableError, ConnectionClosedError, TimeoutError_,
]:
    _BY_CODE[int(_cls.code)] = _cls


def for_code(code: int, message: str, *, active_hint: str | None = None,
             next_seq: int | None = None) -> TandemError:
    """Build the exception a wire error code stands for (unknown codes: TandemError)."""
    cls = _BY_CODE.get(code)
    if cls is None:
        err = TandemError(message)
        if code in ErrorCode._value2member_map_:  # a code this build knows but has no class for
            err.code = ErrorCode(code)
        return err
    if cls is NotActiveError:
        return NotActiveError(message, active_hint=active_hint)
    if cls is OutOfOrderSequenceError:
        return OutOfOrderSequenceError(message, next_seq=next_seq or 0)
    return cls(message)
