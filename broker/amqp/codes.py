"""The AMQP 0-9-1 reply code a client gets for each of the node's errors."""

from __future__ import annotations

from pamqp.base import Frame as AmqpMethod

from broker.amqp.wire import ReplyCode, reply_text
from client.errors import ErrorCode

#: the node's error code for a bug (client.errors.ErrorCode.INTERNAL_ERROR)
INTERNAL = ErrorCode.INTERNAL_ERROR

_OF = {
    ErrorCode.QUEUE_NOT_FOUND: ReplyCode.NOT_FOUND,
    ErrorCode.EXCHANGE_NOT_FOUND: ReplyCode.NOT_FOUND,
    ErrorCode.PARTITION_NOT_FOUND: ReplyCode.NOT_FOUND,
    ErrorCode.AUTHENTICATION_FAILED: ReplyCode.ACCESS_REFUSED,
    ErrorCode.ACCESS_REFUSED: ReplyCode.ACCESS_REFUSED,
    ErrorCode.LOGIN_THROTTLED: ReplyCode.ACCESS_REFUSED,
    ErrorCode.QUEUE_EXISTS_DIFFERENT: ReplyCode.PRECONDITION_FAILED,
    ErrorCode.EXCHANGE_EXISTS_DIFFERENT: ReplyCode.PRECONDITION_FAILED,
    ErrorCode.INVALID_ARGUMENT: ReplyCode.PRECONDITION_FAILED,
    ErrorCode.INVALID_FIELD: ReplyCode.PRECONDITION_FAILED,
    ErrorCode.PREFETCH_TOO_LARGE: ReplyCode.PRECONDITION_FAILED,
    ErrorCode.UNKNOWN_DELIVERY_TAG: ReplyCode.PRECONDITION_FAILED,
    ErrorCode.QUEUE_FULL: ReplyCode.PRECONDITION_FAILED,
    ErrorCode.MESSAGE_TOO_LARGE: ReplyCode.CONTENT_TOO_LARGE,
    ErrorCode.NO_ROUTE: ReplyCode.NO_ROUTE,
    ErrorCode.TOO_MANY_CONNECTIONS: ReplyCode.RESOURCE_ERROR,
    ErrorCode.NOT_ACTIVE: ReplyCode.CONNECTION_FORCED,
    ErrorCode.SHUTTING_DOWN: ReplyCode.CONNECTION_FORCED,
    ErrorCode.HEARTBEAT_TIMEOUT: ReplyCode.CONNECTION_FORCED,
    ErrorCode.UNAVAILABLE: ReplyCode.RESOURCE_ERROR,
    ErrorCode.STORAGE_ERROR: ReplyCode.RESOURCE_ERROR,
    ErrorCode.TIMEOUT: ReplyCode.RESOURCE_ERROR,
    ErrorCode.PROTOCOL_ERROR: ReplyCode.SYNTAX_ERROR,
    ErrorCode.FRAME_TOO_LARGE: ReplyCode.FRAME_ERROR,
    ErrorCode.INTERNAL_ERROR: ReplyCode.INTERNAL_ERROR,
}


def of(code: int) -> ReplyCode:
    """The AMQP reply code for the node's error ``code``."""
    try:
        return _OF.get(ErrorCode(code), ReplyCode.INTERNAL_ERROR)
    except ValueError:
        return ReplyCode.INTERNAL_ERROR


def text(reply_code: int, message: str) -> str:
    """A reply text as RabbitMQ words one: the code's name, then why."""
    return reply_text(ReplyCode(reply_code), message)


def ids(m: AmqpMethod) -> tuple[int, int]:
    """(class id, method id) of ``m``, for the close that names it."""
    index = getattr(m, "index", 0) or 0
    return index >> 16, index & 0xFFFF
