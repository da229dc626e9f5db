"""Request parameters no query may carry: a NUL character in a query parameter or a header.

PostgreSQL's text cannot hold NUL (0x00): a parameter that carries one to a query is refused by the
database driver, a 500 if let through (``GET /v1/batches?after=a%00b``). Every route that takes a key
checks its request here, once, before the route runs (``api_gateway.deps.AuthenticatedRoute``), so
no such string reaches a service, whatever the route does with it: the request is 422
``invalid_request`` naming the parameter, as a body's NUL is. The OpenAPI document says so with a
``pattern`` on each string parameter (``api_gateway.openapi``).

A path parameter is an id: each service checks an id's shape (``api_gateway.ids``) before it reads
anything, so an id holding NUL, like any other garbage id, is a 404.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from api_gateway.errors import ApiError

__all__ = ["NUL_MESSAGE", "check_parameters"]

NUL_MESSAGE = "must not contain NUL characters"
"""The ``msg`` of the detail that refuses a parameter holding NUL (the same as a body string's)."""


def check_parameters(request: Request) -> None:
    """Refuse the request when a query parameter's value or a header's value holds a NUL character.

    Reads the request's query string and headers (not its body).

    Raises:
        ApiError: 422 ``invalid_request``; one detail per such parameter, ``loc`` ``["query", name]``
            or ``["header", name]``.
    """
    problems: list[dict[str, Any]] = [
        _problem("query", name) for name, value in request.query_params.multi_items() if "\x00" in value
    ]
    problems += [_problem("header", name) for name, value in request.headers.items() if "\x00" in value]
    if problems:
        where = ".".join(problems[0]["loc"])
        raise ApiError(422, "invalid_request", f"{where}: {NUL_MESSAGE}", problems)


def _problem(where: str, name: str) -> dict[str, Any]:
    # A name is the client's text too: NUL in it is shown escaped (JSON would carry it, a log line would not).
    shown = name.replace("\x00", "\\x00")
    return {"loc": [where, shown], "msg": NUL_MESSAGE, "type": "value_error"}
