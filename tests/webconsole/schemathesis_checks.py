"""A schemathesis check for runs without credentials (loaded with SCHEMATHESIS_HOOKS).

``refused_without_login``: an operation that the OpenAPI document does not mark public
(``security: []``) must answer 401 or 403 to a request without a login, whatever its
parameters and body, or 429 once the made-up credentials schemathesis sends have tripped the
failed-login throttle; a public one anything but a 5xx (``not_a_server_error`` checks that).
"""

from __future__ import annotations

from typing import Any

import schemathesis


@schemathesis.check
def refused_without_login(ctx: Any, response: Any, case: Any) -> bool | None:
    raw = case.operation.definition.raw
    if raw.get("security") == []:
        return None  # public
    if response.status_code not in (401, 403, 429):
        raise AssertionError(f"{case.method} {case.formatted_path}: {response.status_code} without a login "
                             f"(expected 401, 403, or 429 from the failed-login throttle)")
    return None
