"""Errors of the admin API, and JSON in and out.

Every error is JSON ``{"code": <http status>, "error": <name>, "message": ...}``;
bad input is 400 with the field named.  A broker error keeps its code's name
(``queue_not_found``) and gets the HTTP status of :data:`STATUS_OF`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from aiohttp import web

from broker.logsafe import escape
from client.errors import (
    AccessRefusedError,
    AuthError,
    InvalidArgumentError,
    MessageTooLargeError,
    NotActiveError,
    PartitionNotFoundError,
    QueueExistsError,
    ExchangeExistsError,
    ExchangeNotFoundError,
    QueueNotFoundError,
    ShuttingDownError,
    TandemError,
    TimeoutError_,
    UnavailableError,
)

log = logging.getLogger("tandem.console")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ApiError(Exception):
    def __init__(self, status: int, error: str, message: str) -> None:
        super().__init__(message)
        self.status, self.error, self.message = status, error, message


def bad(field: str, why: str) -> ApiError:
    """400: the request's ``field`` is wrong, and ``why``."""
    return ApiError(400, "bad_request", f"{field}: {why}")


#: HTTP status of a broker error (first match; a subclass before its base)
STATUS_OF: tuple[tuple[type[TandemError], int], ...] = (
    (AccessRefusedError, 403), (AuthError, 401), (QueueNotFoundError, 404), (PartitionNotFoundError, 404),
    (QueueExistsError, 409), (ExchangeNotFoundError, 404), (ExchangeExistsError, 409), (InvalidArgumentError, 400), (MessageTooLargeError, 400),
    (UnavailableError, 503), (NotActiveError, 503), (ShuttingDownError, 503), (TimeoutError_, 503),
)


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Any error as JSON; a bug costs one request (500), never the node."""
    # A browser's own fetches (the console's pages say X-Tandem-Console) must not get a
    # Basic challenge: the browser would pop up its login dialog.
    challenge = "X-Tandem-Console" not in request.headers and request.path != "/login"
    try:
        return await handler(request)
    except ApiError as exc:
        return json_error(exc.status, exc.error, exc.message, unauth=exc.status == 401 and challenge)
    except TandemError as exc:
        status = next((s for cls, s in STATUS_OF if isinstance(exc, cls)), 503 if exc.retriable else 500)
        return json_error(status, exc.code.name.lower(), exc.message, unauth=status == 401 and challenge)
    except web.HTTPException:
        raise
    except Exception as exc:
        log.exception("console: %s %s failed", escape(request.method), escape(request.path))
        return json_error(500, "internal_error", f"internal error: {exc!r}")


async def json_body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object ({} without a body); 400 when it is not one."""
    if not request.can_read_body:
        return {}
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError, LookupError):  # (LookupError: an unknown charset)
        raise ApiError(400, "bad_request", "body: not JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "bad_request", "body: expected a JSON object")
    return body


def only(body: dict[str, Any], fields: Collection[str]) -> dict[str, Any]:
    """``body``, once it holds no field but ``fields``; 400 naming the first other one."""
    unknown = set(body) - set(fields)
    if unknown:
        raise bad(sorted(unknown)[0], "unknown field")
    return body


def json_error(status: int, error: str, message: str, *, unauth: bool = False) -> web.Response:
    resp = web.json_response({"code": status, "error": error, "message": message}, status=status)
    if unauth:
        resp.headers["WWW-Authenticate"] = 'Basic realm="tandem"'
    return resp
