"""AMQP 0-9-1 reply codes, and the one a client gets for each of the node's errors."""

from __future__ import annotations

from pamqp.base import Frame as AmqpMethod

from client.errors import ErrorCode

SUCCESS = 200
CONTENT_TOO_LARGE = 311
NO_ROUTE = 312
NO_CONSUMERS = 313
CONNECTION_FORCED = 320
INVALID_PATH = 402
ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
FRAME_ERROR = 501
SYNTAX_ERROR = 502
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505
RESOURCE_ERROR = 506
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541

#: the node's error code for a bug (client.errors.ErrorCode.INTERNAL_ERROR)
INTERNAL = ErrorCode.INTERNAL_ERROR

_OF = {
    ErrorCode.QUEUE_NOT_FOUND: NOT_FOUND,
    ErrorCode.EXCHANGE_NOT_FOUND: NOT_FOUND,
    ErrorCode.PARTITION_NOT_FOUND: NOT_FOUND,
    ErrorCode.AUTHENTICATION_FAILED: ACCESS_REFUSED,
    ErrorCode.ACCESS_REFUSED: ACCESS_REFUSED,
    ErrorCode.LOGIN_THROTTLED: ACCESS_REFUSED,
    ErrorCode.QUEUE_EXISTS_DIFFERENT: PRECONDITION_FAILED,
    ErrorCode.EXCHANGE_EXISTS_DIFFERENT: PRECONDITION_FAILED,
    ErrorCode.INVALID_ARGUMENT: PRECONDITION_FAILED,
    ErrorCode.INVALID_FIELD: PRECONDITION_FAILED,
    ErrorCode.PREFETCH_TOO_LARGE: PRECONDITION_FAILED,
    ErrorCode.UNKNOWN_DELIVERY_TAG: PRECONDITION_FAILED,
    ErrorCode.QUEUE_FULL: PRECONDITION_FAILED,
    ErrorCode.MESSAGE_TOO_LARGE: CONTENT_TOO_LARGE,
    ErrorCode.NO_ROUTE: NO_ROUTE,
    ErrorCode.TOO_MANY_CONNECTIONS: RESOURCE_ERROR,
    ErrorCode.NOT_ACTIVE: CONNECTION_FORCED,
    ErrorCode.SHUTTING_DOWN: CONNECTION_FORCED,
    ErrorCode.HEARTBEAT_TIMEOUT: CONNECTION_FORCED,
    ErrorCode.UNAVAILABLE: RESOURCE_ERROR,
    ErrorCode.STORAGE_ERROR: RESOURCE_ERROR,
    ErrorCode.TIMEOUT: RESOURCE_ERROR,
    ErrorCode.PROTOCOL_ERROR: SYNTAX_ERROR,
    ErrorCode.FRAME_TOO_LARGE: FRAME_ERROR,
    ErrorCode.INTERNAL_ERROR: INTERNAL_ERROR,
}

#: the name RabbitMQ puts first in a reply text ("NOT_FOUND - no queue 'x' in vhost '/'")
NAMES = {NOT_FOUND: "NOT_FOUND", ACCESS_REFUSED: "ACCESS_REFUSED", PRECONDITION_FAILED: "PRECONDITION_FAILED",
         CONTENT_TOO_LARGE: "CONTENT_TOO_LARGE", NO_ROUTE: "NO_ROUTE", RESOURCE_ERROR: "RESOURCE_ERROR",
         CONNECTION_FORCED: "CONNECTION_FORCED", SYNTAX_ERROR: "SYNTAX_ERROR", FRAME_ERROR: "FRAME_ERROR",
         INTERNAL_ERROR: "INTERNAL_ERROR", NOT_IMPLEMENTED: "NOT_IMPLEMENTED", COMMAND_INVALID: "COMMAND_INVALID",
         NOT_ALLOWED: "NOT_ALLOWED", CHANNEL_ERROR: "CHANNEL_ERROR", RESOURCE_LOCKED: "RESOURCE_LOCKED"}


def of(code: int) -> int:
    """The AMQP reply code for the node's error ``code``."""
    try:
        return _OF.get(ErrorCode(code), INTERNAL_ERROR)
    except ValueError:
        return INTERNAL_ERROR


def text(reply_code: int, message: str) -> str:
    """A reply text as RabbitMQ words one: the code's name, then why."""
    return f"{NAMES.get(reply_code, 'ERROR')} - {message}"[:255]


def ids(m: AmqpMethod) -> tuple[int, int]:
    """(class id, method id) of ``m``, for the close that names it."""
    index = getattr(m, "index", 0) or 0
    return index >> 16, index & 0xFFFF
