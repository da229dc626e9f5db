"""The one place that builds the HTTP error body ``{"error": {"code", "message", "details"}}``.

Routes and dependencies raise :class:`ApiError` for what only HTTP knows (a missing key, a body
that is not JSON); the services raise ``ServiceError``s, which :data:`SERVICE_ERROR_STATUS` maps
to a status.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from kombu.exceptions import OperationalError as BrokerError
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, ProgrammingError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import BaseRoute, Match

from api_gateway.openai.errors import is_openai_path, openai_error_body, openai_status
from api_gateway.services.errors import Conflict, InvalidRequest, Limited, NotFound, ServiceError, Unavailable
from shared.redis_clients import FAILOVER_ERRORS, is_refused_for_replicas
from shared.redis_cluster import CLUSTER_TRANSIENT_ERRORS

__all__ = [
    "CLIENT_CLOSED_REQUEST",
    "RETRY_AFTER_SECONDS",
    "SERVICE_ERROR_STATUS",
    "UNAVAILABLE_ERRORS",
    "ApiError",
    "error_response",
    "install_error_handlers",
    "schema_missing",
    "service_error_status",
]

logger = logging.getLogger(__name__)

UNAVAILABLE_ERRORS: tuple[type[Exception], ...] = (
    OperationalError,
    InterfaceError,
    PoolTimeout,
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.BusyLoadingError,
    *FAILOVER_ERRORS,
    BrokerError,
    *CLUSTER_TRANSIENT_ERRORS,
)
"""A dependency (database, Redis, broker) did not answer: 503 ``unavailable``, never 500."""
RETRY_AFTER_SECONDS = 2
CLIENT_CLOSED_REQUEST = 499
"""The status a request gets in the access log and metrics when its client went away before its body
arrived in full (nginx's 499): nothing is sent, since nobody is there to read it."""
SERVICE_ERROR_STATUS: dict[type[ServiceError], int] = {
    NotFound: 404,
    Conflict: 409,
    InvalidRequest: 422,
    Limited: 429,
    Unavailable: 503,
}
"""The HTTP status of each kind of service error."""

_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "request_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    503: "unavailable",
}


class ApiError(Exception):
    """An HTTP error with a stable code, raised by routes and dependencies."""

    def __init__(self, status_code: int, code: str, message: str, details: Any = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.code = code
        self.message = message
        self.details = details


def error_response(
    status_code: int,
    code: str,
    message: str,
    details: Any = None,
    headers: Mapping[str, str] | None = None,
    *,
    path: str = "",
) -> JSONResponse:
    """The error body as a response (with ``headers``, such as the ``Allow`` of a 405).

    Under ``/openai/v1`` (``path``) the body is OpenAI's instead, and a refused body is a 400
    (``api_gateway.openai.errors``).
    """
    extra = dict(headers or {})
    if status_code == 401:
        extra.setdefault("WWW-Authenticate", "Bearer")
    if status_code in (429, 503):
        extra.setdefault("Retry-After", str(RETRY_AFTER_SECONDS))
    if is_openai_path(path):
        status_code = openai_status(status_code, code)
        content = openai_error_body(status_code, code, message, details)
    else:
        content = {"error": {"code": code, "message": message, "details": details}}
    return JSONResponse(status_code=status_code, content=content, headers=extra or None)


def install_error_handlers(app: FastAPI) -> None:
    """Route every error the app can raise through :func:`error_response`."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status_code, exc.code, exc.message, exc.details, path=request.url.path)

    @app.exception_handler(ServiceError)
    async def _refused(request: Request, exc: ServiceError) -> JSONResponse:
        headers = {"Retry-After": str(exc.retry_after)} if isinstance(exc, Limited) else None
        return error_response(
            service_error_status(exc), exc.code, exc.message, exc.details, headers, path=request.url.path
        )

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        details = [
            {
                "loc": [_text(part) if isinstance(part, str) else part for part in error.get("loc", ())],
                "msg": _text(str(error.get("msg", ""))),
                "type": str(error.get("type", "")),
            }
            for error in exc.errors()
        ]
        first = details[0] if details else {"loc": [], "msg": "invalid request"}
        where = ".".join(str(part) for part in first["loc"])
        message = f"{where}: {first['msg']}" if where else str(first["msg"])
        return error_response(422, "invalid_request", message, details, path=request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(exc.status_code, "error")
        headers = exc.headers
        if exc.status_code == 405:
            # Starlette's Allow names the methods of the first route that matched the path; a path served
            # by several routes (GET and POST /v1/batches) takes them all.
            headers = {**(headers or {}), "Allow": _allowed(request)}
        return error_response(exc.status_code, code, str(exc.detail), headers=headers, path=request.url.path)

    async def _unavailable(request: Request, exc: Exception) -> JSONResponse:
        if schema_missing(exc):
            return _schema_response(exc, path=request.url.path)
        logger.warning("a dependency is unavailable: %s: %s", type(exc).__name__, str(exc).splitlines()[0][:200])
        return error_response(
            503,
            "unavailable",
            "a dependency of the gateway (database, Redis or broker) is unavailable; retry shortly "
            "(with the same idempotency_key, a retried POST /v1/turns cannot create the turn twice)",
            path=request.url.path,
        )

    for error in UNAVAILABLE_ERRORS:
        app.add_exception_handler(error, _unavailable)

    @app.exception_handler(ClientDisconnect)
    async def _gone(_request: Request, _exc: ClientDisconnect) -> Response:
        # Not the gateway's failure, and nobody to answer: no traceback, no 500; the access line says 499.
        return Response(status_code=CLIENT_CLOSED_REQUEST)

    @app.exception_handler(ProgrammingError)
    async def _programming(request: Request, exc: ProgrammingError) -> JSONResponse:
        if schema_missing(exc):
            return _schema_response(exc, path=request.url.path)
        return await _unexpected(request, exc)

    @app.exception_handler(redis.ResponseError)
    async def _redis_reply(request: Request, exc: redis.ResponseError) -> JSONResponse:
        if is_refused_for_replicas(exc):  # min-replicas-to-write: a replica is down or resyncing
            return await _unavailable(request, exc)
        return await _unexpected(request, exc)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error in the gateway")
        return error_response(500, "internal_error", "the gateway failed to handle the request", path=request.url.path)


def schema_missing(exc: Exception) -> bool:
    """Whether ``exc`` says a table or column this code needs does not exist: the schema is not migrated.

    PostgreSQL says so with SQLSTATE 42P01 (undefined table) or 42703 (undefined column), SQLite with
    "no such table" / "no such column".
    """
    if not isinstance(exc, DBAPIError):
        return False
    if getattr(exc.orig, "sqlstate", None) in _UNDEFINED_SQLSTATES:
        return True
    text = str(exc.orig)
    return text.startswith(("no such table", "no such column"))


def _schema_response(exc: Exception, *, path: str) -> JSONResponse:
    logger.error("the database schema is not migrated (%s): run `aptix db upgrade`", str(exc).splitlines()[0][:200])
    return error_response(
        503,
        "unavailable",
        "the database schema is missing or behind this gateway's: run `aptix db upgrade` (GET /readyz says which)",
        path=path,
    )


_UNDEFINED_SQLSTATES = frozenset({"42P01", "42703"})


def service_error_status(exc: ServiceError) -> int:
    """The HTTP status of ``exc``: that of the nearest kind in :data:`SERVICE_ERROR_STATUS` (500 if none)."""
    for kind in type(exc).__mro__:
        if kind in SERVICE_ERROR_STATUS:
            return SERVICE_ERROR_STATUS[kind]
    return 500


def _allowed(request: Request) -> str:
    """Every method some route of the app takes at the request's path, as an ``Allow`` header."""
    return ", ".join(sorted(_methods(request.app.router.routes, dict(request.scope))))


def _methods(routes: list[BaseRoute], scope: dict[str, Any]) -> set[str]:
    methods: set[str] = set()
    for route in routes:
        # FastAPI keeps an included router whole (its routes carry their full paths): look inside.
        included = getattr(route, "original_router", None)
        if included is not None:
            methods |= _methods(included.routes, scope)
        elif route.matches(scope)[0] is not Match.NONE:
            methods.update(getattr(route, "methods", None) or ())
    return methods


def _text(value: str) -> str:
    # A field name or message can echo the client's lone surrogates, which UTF-8 cannot encode.
    return value.encode("utf-8", "backslashreplace").decode("utf-8")
